//! mlx-lm's `ChunkedKVCache` (models/cache.py, used by llama4.py's chunked local attention): a
//! growing buffer that keeps at most the last `chunk_size` positions from one forward pass to the
//! next (`maybe_trim_front`), with the chunk mask of llama4.py's `LlamaModel`.
use super::{CacheMask, KvCache, StateNode};
use crate::error::{EngineError, Result};
use mlx::{ops, Array, Dtype};

pub struct ChunkedCache {
    keys: Option<Array>,   // (B, kv_heads, capacity, k_dim), position `start_position` first
    values: Option<Array>, // (B, kv_heads, capacity, v_dim)
    offset: i32,
    chunk_size: i32,
    start_position: i32,
}

impl ChunkedCache {
    pub fn new(chunk_size: i32) -> ChunkedCache {
        ChunkedCache { keys: None, values: None, offset: 0, chunk_size, start_position: 0 }
    }

    /// From a saved `ChunkedKVCache` state.
    pub fn from_state(keys: Option<Array>, values: Option<Array>, offset: i32, chunk_size: i32, start_position: i32) -> Result<Self> {
        let filled = offset - start_position;
        if keys.is_some() != values.is_some()
            || chunk_size <= 0
            || filled < 0
            || keys.as_ref().is_some_and(|k| k.ndim() != 4 || k.dim(2) < filled)
        {
            return Err(EngineError::Invalid("inconsistent ChunkedKVCache state".into()));
        }
        Ok(ChunkedCache { keys, values, offset, chunk_size, start_position })
    }

    /// The first position the next forward pass keeps: `start_position` after `maybe_trim_front`.
    fn front(&self) -> i32 {
        let valid = self.offset - self.start_position;
        match self.keys {
            Some(_) if valid > self.chunk_size => self.offset - self.chunk_size,
            _ => self.start_position,
        }
    }

    /// `maybe_trim_front`, which mlx-lm runs on every chunked layer at the start of a forward pass:
    /// run here at the layer's own update, before anything else of the pass reads the buffers.
    fn maybe_trim_front(&mut self) -> Result<()> {
        let front = self.front();
        if front == self.start_position {
            return Ok(());
        }
        let (trim, valid) = (front - self.start_position, self.offset - self.start_position);
        self.start_position = front;
        self.keys = self.keys.take().map(|k| k.slice_axis(2, trim, valid)).transpose()?;
        self.values = self.values.take().map(|v| v.slice_axis(2, trim, valid)).transpose()?;
        Ok(())
    }
}

impl KvCache for ChunkedCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        self.maybe_trim_front()?;
        let filled = self.offset - self.start_position;
        let (k, v) = super::growing::write_in_steps(&mut self.keys, &mut self.values, filled, keys, values)?;
        self.offset += keys.dim(2);
        let end = self.offset - self.start_position;
        Ok((k.slice_axis(2, 0, end)?, v.slice_axis(2, 0, end)?))
    }

    fn first_position(&self) -> i32 {
        self.start_position
    }

    fn trim(&mut self, n: i32) -> Result<i32> {
        let n = n.min(self.offset - self.start_position).max(0);
        self.offset -= n;
        Ok(n)
    }

    /// llama4.py's `chunk_mask` for `n` new positions: (n, offset + n - start) booleans, query `q`
    /// seeing key `k` iff both lie in the same chunk and `k <= q` (an array even for one position).
    fn make_mask(&self, n: i32, _window_size: Option<i32>) -> Result<CacheMask> {
        let (start, end) = (self.front(), self.offset + n);
        let linds = ops::arange(f64::from(start), f64::from(end), 1.0, Dtype::I32)?;
        let rinds = ops::arange(f64::from(self.offset), f64::from(end), 1.0, Dtype::I32)?.expand_dims(&[1])?;
        let cs = f64::from(self.chunk_size);
        let block_pos = linds.floor_divide_scalar(cs)?.sub(&rinds.floor_divide_scalar(cs)?)?.abs()?;
        let token_pos = linds.le(&rinds)?;
        Ok(CacheMask::Array(block_pos.eq_scalar(0.0)?.logical_and(&token_pos)?))
    }

    fn state(&self) -> Vec<Array> {
        self.keys.iter().chain(self.values.iter()).cloned().collect()
    }

    fn nbytes(&self) -> usize {
        self.state().iter().map(Array::nbytes).sum()
    }

    fn saved_state(&self) -> Result<(&'static str, Vec<StateNode>)> {
        let arr = |a: &Option<Array>| a.clone().map_or(StateNode::None, StateNode::Array);
        let int = |x: i32| StateNode::Int(i64::from(x));
        Ok((
            "ChunkedKVCache",
            vec![arr(&self.keys), arr(&self.values), int(self.offset), int(self.chunk_size), int(self.start_position)],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(len: i32, fill: f32) -> Array {
        ops::full(&[1, 1, len, 2], f64::from(fill), Dtype::F32).unwrap()
    }

    fn mask(c: &ChunkedCache, n: i32) -> (Vec<i32>, Vec<i32>) {
        match c.make_mask(n, None).unwrap() {
            CacheMask::Array(m) => (m.shape(), m.astype(Dtype::I32).unwrap().to_vec::<i32>().unwrap()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn keeps_the_last_chunk_and_masks_within_chunks() {
        let mut c = ChunkedCache::new(4);
        // Six positions at once: queries 0..6 over keys 0..6, chunks {0..4} and {4..6}.
        let (shape, m) = mask(&c, 6);
        assert_eq!(shape, vec![6, 6]);
        assert_eq!(&m[4 * 6..5 * 6], &[0, 0, 0, 0, 1, 0]);
        assert_eq!(&m[3 * 6..4 * 6], &[1, 1, 1, 1, 0, 0]);
        c.update_and_fetch(&kv(6, 1.0), &kv(6, 1.0)).unwrap();
        // The next pass keeps positions 2..6 (chunk_size of them), then appends position 6.
        let (shape, m) = mask(&c, 1);
        assert_eq!((shape, m), (vec![1, 5], vec![0, 0, 1, 1, 1]));
        let (k, _) = c.update_and_fetch(&kv(1, 2.0), &kv(1, 2.0)).unwrap();
        assert_eq!((k.dim(2), c.start_position, c.offset), (5, 2, 7));
        assert_eq!(k.to_vec::<f32>().unwrap()[8..], [2.0, 2.0]);
        assert_eq!(c.trim(3).unwrap(), 3);
        assert_eq!(c.offset(), 4);
    }
}
