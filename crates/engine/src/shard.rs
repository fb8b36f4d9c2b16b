//! Tensor parallelism as mlx-lm's `shard` does it: each rank keeps a slice of every projection.
//!
//! "All-to-sharded" layers (q/k/v, gate/up) keep a contiguous block of output rows per rank, and
//! "sharded-to-all" layers (o, down) the matching block of input columns, their partial products
//! summed over the group (one `all_sum` per attention and per MLP) before the bias. Heads divide
//! by the group size, so every rank attends over its own heads and its KV cache holds only those.
//! Embeddings and norms are replicated, and so is the head, except where mlx-lm splits its
//! vocabulary (qwen3_5: each rank's logits gathered back, [`gather_last_axis`]). Fused layers
//! (q|k|v, gate|up) split each part; with fewer key/value heads than ranks each is repeated first.
use crate::error::{EngineError, Result};
use mlx::distributed::Group;
use mlx::{ops, Array};

/// Which side of a projection is split across the ranks (mlx-lm's `shard_linear` modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardMode {
    /// Replicated input, this rank's block of outputs.
    AllToSharded,
    /// This rank's block of inputs, outputs summed over the group.
    ShardedToAll,
}

/// `(rank, size)` of `group`.
pub(crate) fn place(group: &Group) -> (i32, i32) {
    (group.rank(), group.size())
}

pub(crate) fn check_divides(what: &str, n: i32, size: i32) -> Result<i32> {
    if size <= 0 || n % size != 0 {
        return Err(EngineError::Config(format!(
            "tensor parallel over {size} ranks: {what} ({n}) does not divide by {size}"
        )));
    }
    Ok(n / size)
}

/// This rank's rows of `a` (axis 0), where the rows are `segments` laid end to end (one segment for
/// a plain layer; q, k, v for a fused one) and each segment is split evenly; copied so that the
/// full tensor can be freed.
pub(crate) fn rows(a: &Array, segments: &[i32], rank: i32, size: i32) -> Result<Array> {
    rows_at(a, 0, segments, rank, size)
}

/// As [`rows`] along axis `axis` (stacked experts' output rows: -2).
pub(crate) fn rows_at(a: &Array, axis: i32, segments: &[i32], rank: i32, size: i32) -> Result<Array> {
    let total: i32 = segments.iter().sum();
    if a.dim(axis) != total {
        return Err(EngineError::Invalid(format!("{} rows, expected {total} to shard", a.dim(axis))));
    }
    let mut parts = Vec::with_capacity(segments.len());
    let mut start = 0;
    for &len in segments {
        let part = check_divides("a projection's output size", len, size)?;
        parts.push(a.slice_axis(axis, start + rank * part, start + (rank + 1) * part)?);
        start += len;
    }
    let joined = if parts.len() == 1 { parts.pop().expect("one part") } else { ops::concatenate(&parts.iter().collect::<Vec<_>>(), axis)? };
    Ok(joined.contiguous()?)
}

/// mlx-lm's `repeat_kv_layer_inplace`: the rows of `a` (axis 0) as `heads` blocks, each block
/// `times` times in a row, so that more ranks than key/value heads each keep one whole head.
pub(crate) fn repeat_heads(a: &Array, heads: i32, times: i32) -> Result<Array> {
    let shape = a.shape();
    check_divides("a projection's rows per key/value head", shape[0], heads)?;
    let mut by_head = vec![heads, shape[0] / heads];
    by_head.extend(&shape[1..]);
    let mut back = vec![-1];
    back.extend(&shape[1..]);
    Ok(a.reshape(&by_head)?.repeat(times, 0)?.reshape(&back)?) // (heads * times * rows per head, ...)
}

/// mlx-lm's `gather_last_axis`: the last axis of `x`, split across `group` (a vocabulary-sharded
/// head's logits), gathered whole on every rank in rank order.
pub(crate) fn gather_last_axis(x: &Array, group: &Group) -> Result<Array> {
    let size = x.dim(-1);
    let parts = group.all_gather(&x.reshape(&[-1, size])?)?; // (ranks * rows, size)
    ranks_to_last_axis(&parts, group.size(), &x.shape())
}

/// Rows gathered from `n` ranks (ranks * rows, size), each rank's rows shaped `shape`, to `shape`
/// with the ranks' blocks side by side on the last axis (rows, ranks * size).
fn ranks_to_last_axis(parts: &Array, n: i32, shape: &[i32]) -> Result<Array> {
    let size = parts.dim(-1);
    let mut whole = shape.to_vec();
    *whole.last_mut().ok_or_else(|| EngineError::Invalid("gathering the last axis of a scalar".into()))? = n * size;
    Ok(parts.reshape(&[n, -1, size])?.transpose(&[1, 0, 2])?.reshape(&whole)?)
}

/// This rank's block of the last axis of `a` (a sharded-to-all layer's inputs).
pub(crate) fn cols(a: &Array, rank: i32, size: i32) -> Result<Array> {
    block(a, -1, rank, size)
}

/// This rank's block of axis `axis` of `a`, copied (stacked experts' rows: axis -2; heads: 0).
pub(crate) fn block(a: &Array, axis: i32, rank: i32, size: i32) -> Result<Array> {
    let part = check_divides(&format!("axis {axis} of a sharded weight"), a.dim(axis), size)?;
    Ok(a.slice_axis(axis, rank * part, (rank + 1) * part)?.contiguous()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_split_each_fused_segment_and_cols_split_inputs() {
        // 6 rows: a segment of 4 (q) and one of 2 (k); one column per row holding its index.
        let a = Array::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[6, 1]).unwrap();
        assert_eq!(rows(&a, &[4, 2], 0, 2).unwrap().to_vec::<f32>().unwrap(), vec![0.0, 1.0, 4.0]);
        assert_eq!(rows(&a, &[4, 2], 1, 2).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 3.0, 5.0]);
        assert!(rows(&a, &[3, 3], 0, 2).is_err(), "3 rows do not split in 2");
        let b = Array::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0], &[2, 4]).unwrap();
        assert_eq!(cols(&b, 1, 2).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 3.0, 12.0, 13.0]);
        assert!(cols(&b, 0, 3).is_err());
    }

    #[test]
    fn repeated_heads_give_each_rank_a_whole_head() {
        // 2 heads of 2 rows (one column holding the row index), each repeated twice: 4 ranks keep
        // heads 0, 0, 1, 1.
        let a = Array::from_slice(&[0.0f32, 1.0, 2.0, 3.0], &[4, 1]).unwrap();
        let r = repeat_heads(&a, 2, 2).unwrap();
        assert_eq!(r.shape(), vec![8, 1]);
        assert_eq!(r.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 0.0, 1.0, 2.0, 3.0, 2.0, 3.0]);
        assert_eq!(rows(&r, &[8], 1, 4).unwrap().to_vec::<f32>().unwrap(), vec![0.0, 1.0]);
        assert_eq!(rows(&r, &[8], 2, 4).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
        assert!(repeat_heads(&a, 3, 2).is_err(), "4 rows are not 3 heads");
    }

    #[test]
    fn gathered_rows_go_side_by_side_in_rank_order() {
        // 2 ranks, each with logits (1, 2, 3): rank 0's entries 0..6, rank 1's 10..16.
        let r0: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let r1: Vec<f32> = (10..16).map(|v| v as f32).collect();
        let parts = Array::from_slice(&[r0, r1].concat(), &[4, 3]).unwrap();
        let whole = ranks_to_last_axis(&parts, 2, &[1, 2, 3]).unwrap();
        assert_eq!(whole.shape(), vec![1, 2, 6]);
        let want = [0.0, 1.0, 2.0, 10.0, 11.0, 12.0, 3.0, 4.0, 5.0, 13.0, 14.0, 15.0];
        assert_eq!(whole.to_vec::<f32>().unwrap(), want.to_vec());
    }

    /// A quantized row-parallel layer: the two ranks' column blocks (packed weight, scales,
    /// biases), each times its half of the input, sum to the whole layer's product.
    #[test]
    fn quantized_column_blocks_sum_to_the_whole_product() {
        use mlx::ops::{quantize_affine, quantized_matmul, QuantSpec};
        use mlx::Dtype;
        let q = QuantSpec::affine(32, 4);
        let w = mlx::random::uniform(&[8, 128], Dtype::F32).unwrap();
        let x = mlx::random::uniform(&[3, 128], Dtype::F32).unwrap();
        let (qw, s, b) = quantize_affine(&w, q).unwrap();
        let whole = quantized_matmul(&x, &qw, &s, Some(&b), true, q).unwrap().to_vec::<f32>().unwrap();
        let mut sum = vec![0f32; whole.len()];
        for r in 0..2 {
            let xr = cols(&x, r, 2).unwrap();
            let (w, s, b) = (cols(&qw, r, 2).unwrap(), cols(&s, r, 2).unwrap(), cols(&b, r, 2).unwrap());
            let y = quantized_matmul(&xr, &w, &s, Some(&b), true, q).unwrap().to_vec::<f32>().unwrap();
            sum.iter_mut().zip(y).for_each(|(a, y)| *a += y);
        }
        for (a, b) in whole.iter().zip(&sum) {
            assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0), "{a} vs {b}");
        }
    }
}
