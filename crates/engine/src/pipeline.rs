//! Pipeline parallelism as mlx-lm's `PipelineMixin` (models/pipeline.py): each rank runs one
//! contiguous range of layers and passes its activations on with `send`/`recv`.
//!
//! The split is mlx-lm's: even, the low ranks taking the extra layers, and in reverse, so that the
//! last rank runs the first layers and rank 0 (the one that prints) the last ones. Every rank keeps
//! the embedding, the final norm and the head: after the last stage, `all_gather` hands its output
//! to every rank, which all compute the same logits and so sample the same tokens. A rank loads only
//! its own layers' tensors (see [`checkpoint::Weights::keep_layers`]).
use crate::error::{EngineError, Result};
use mlx::distributed::Group;
use mlx::Array;
use std::ops::Range;

/// mlx-lm's default split of `layers` over `size` ranks: even, the low ranks getting the extra.
pub fn even_split(layers: i32, size: i32) -> Vec<i32> {
    let (base, extra) = (layers / size.max(1), layers % size.max(1));
    (0..size).map(|r| base + i32::from(r < extra)).collect()
}

/// The layers that `rank` of `size` runs: after the layers of ranks `rank + 1 .. size`.
pub fn stage_layers(layers: i32, rank: i32, size: i32) -> Result<Range<i32>> {
    if size < 1 || rank < 0 || rank >= size {
        return Err(EngineError::Invalid(format!("rank {rank} is not in a group of {size}")));
    }
    if layers < size {
        return Err(EngineError::Config(format!(
            "pipeline parallel over {size} ranks needs at least one layer per rank; the model has {layers}"
        )));
    }
    let split = even_split(layers, size);
    let start: i32 = split[(rank + 1) as usize..].iter().sum();
    Ok(start..start + split[rank as usize])
}

/// This process's stage of a pipeline over a group.
#[derive(Clone, Debug)]
pub struct Stage {
    group: Group,
    layers: Range<i32>,
    total: i32,
}

impl Stage {
    /// The stage of this rank of `group` for a model of `total` layers.
    pub fn new(group: &Group, total: i32) -> Result<Stage> {
        Ok(Stage { group: group.clone(), layers: stage_layers(total, group.rank(), group.size())?, total })
    }

    /// The model layers this stage runs.
    pub fn layers(&self) -> Range<i32> {
        self.layers.clone()
    }

    /// The number of layers of the whole model.
    pub fn total_layers(&self) -> i32 {
        self.total
    }

    /// Checks that a model built for this stage holds exactly its layers.
    pub fn check_loaded(&self, loaded: usize) -> Result<()> {
        if loaded != self.layers.len() {
            return Err(EngineError::Invalid(format!(
                "pipeline stage {}: the model holds {loaded} layers, the stage runs {} ({}..{})",
                self.group.rank(),
                self.layers.len(),
                self.layers.start,
                self.layers.end
            )));
        }
        Ok(())
    }

    /// Whether this stage runs after another (every rank but the last, which runs the first layers).
    pub fn receives(&self) -> bool {
        self.group.rank() < self.group.size() - 1
    }

    /// Whether a later stage runs after this one (every rank but 0).
    pub fn sends(&self) -> bool {
        self.group.rank() != 0
    }

    /// An array shaped and typed as `like` from the previous stage.
    pub fn recv_like(&self, like: &Array) -> Result<Array> {
        Ok(self.group.recv_like(like, self.group.rank() + 1)?)
    }

    /// `x` to the next stage, the send queued at once (see [`Stage::pass_on`]).
    pub fn send(&self, x: &Array) -> Result<Array> {
        let sent = self.group.send(x, self.group.rank() - 1)?;
        mlx::async_eval(&[&sent])?;
        Ok(sent)
    }

    /// The last stage's `h` (B, ...) on every rank (`all_gather(h)[:B]`); `h` itself on one rank.
    pub fn gather(&self, h: &Array) -> Result<Array> {
        if self.group.size() == 1 {
            return Ok(h.clone());
        }
        Ok(self.group.all_gather(h)?.slice_axis(0, 0, h.dim(0))?)
    }

    /// The stage's input: the previous stage's output in place of `h` (B, L, hidden), except on the
    /// first stage (the last rank), which starts from `h` itself.
    pub fn receive(&self, h: &Array) -> Result<Array> {
        let (rank, size) = (self.group.rank(), self.group.size());
        if rank < size - 1 {
            return Ok(self.group.recv_like(h, rank + 1)?);
        }
        Ok(h.clone())
    }

    /// Passes this stage's output `h` (B, L, hidden) on, and returns the last stage's output on
    /// every rank. The send is queued at once, so that it happens whatever the caller evaluates
    /// (a prefill chunk evaluates only the caches; mlx-lm ties the send to the last cache instead).
    pub fn pass_on(&self, h: &Array) -> Result<Array> {
        let (rank, size) = (self.group.rank(), self.group.size());
        let mut h = h.clone();
        if rank != 0 {
            h = self.group.send(&h, rank - 1)?;
            mlx::async_eval(&[&h])?;
        }
        if size == 1 {
            return Ok(h);
        }
        // All ranks' outputs stacked, then rank 0's rows: keeps the broadcast in the graph.
        let b = h.dim(0);
        Ok(self.group.all_gather(&h)?.slice_axis(0, 0, b)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_even_low_ranks_first_and_reversed() {
        assert_eq!(even_split(7, 3), vec![3, 2, 2]);
        assert_eq!(even_split(4, 2), vec![2, 2]);
        // Rank 0 runs the last layers, the last rank the first ones (mlx-lm's order).
        assert_eq!(stage_layers(7, 0, 3).unwrap(), 4..7);
        assert_eq!(stage_layers(7, 1, 3).unwrap(), 2..4);
        assert_eq!(stage_layers(7, 2, 3).unwrap(), 0..2);
        assert_eq!(stage_layers(3, 0, 2).unwrap(), 1..3);
        assert_eq!(stage_layers(3, 1, 2).unwrap(), 0..1);
        assert_eq!(stage_layers(5, 0, 1).unwrap(), 0..5);
        assert!(stage_layers(1, 0, 2).unwrap_err().to_string().contains("at least one layer per rank"));
        assert!(stage_layers(4, 2, 2).is_err());
    }

    #[test]
    fn a_group_of_one_is_the_whole_model() {
        let g = Group::init(mlx::distributed::Backend::Any, false).unwrap();
        let s = Stage::new(&g, 3).unwrap();
        assert_eq!(s.layers(), 0..3);
        let h = Array::from_slice(&[1.0f32, 2.0], &[1, 1, 2]).unwrap();
        assert_eq!(s.receive(&h).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
        assert_eq!(s.pass_on(&h).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
        assert!(s.check_loaded(2).is_err());
    }
}
