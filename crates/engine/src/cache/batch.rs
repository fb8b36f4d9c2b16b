//! The KV cache of a running batch of sequences of different lengths, as mlx-lm's `BatchKVCache`:
//! one (B, kv_heads, capacity, D) buffer per layer, rows right-aligned (every row's newest position
//! is the same column) with per-row left padding that the attention mask hides. Rows join
//! ([`BatchCache::extend`]) and leave ([`BatchCache::filter`]) between steps; leaving rows give up
//! the padding all remaining rows share.
use super::{create_attention_mask, CacheMask, KvCache};
use crate::error::{EngineError, Result};
use mlx::{ops, Array, Dtype};


#[derive(Default)]
pub struct BatchCache {
    keys: Option<Array>,   // (B, kv_heads, capacity, k_dim)
    values: Option<Array>, // (B, kv_heads, capacity, v_dim)
    /// Filled columns (the same for every row).
    idx: i32,
    /// Per row: leading columns that hold no position of that row.
    left_pad: Vec<i32>,
    /// Per row: the position of the next key, `idx - left_pad` as a (B,) int32 array, made once
    /// per change (every layer's RoPE of queries and keys reads it).
    offsets: Option<Array>,
}

impl BatchCache {
    pub fn new() -> BatchCache {
        BatchCache::default()
    }

    /// Recomputes `offsets` after `idx` or `left_pad` changed.
    fn refresh_offsets(&mut self) -> Result<()> {
        let offsets: Vec<i32> = self.left_pad.iter().map(|p| self.idx - p).collect();
        self.offsets = if offsets.is_empty() { None } else { Some(Array::from_slice(&offsets, &[offsets.len() as i32])?) };
        Ok(())
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.left_pad.len()
    }

    /// Positions row `row` holds.
    pub fn row_len(&self, row: usize) -> i32 {
        self.idx - self.left_pad[row]
    }

    /// Adds one row per sequence of `keys`/`values` ((1, kv_heads, L, D) each: a single sequence's
    /// filled cache), aligning the newest positions of old and new rows.
    pub fn extend(&mut self, keys: &Array, values: &Array) -> Result<()> {
        if keys.dim(0) != 1 || values.dim(0) != 1 || keys.dim(2) != values.dim(2) {
            return Err(EngineError::Invalid("a batch cache takes one sequence's keys and values at a time".into()));
        }
        let len = keys.dim(2);
        let Some((k, v)) = self.keys.take().zip(self.values.take()) else {
            self.keys = Some(keys.clone());
            self.values = Some(values.clone());
            self.idx = len;
            self.left_pad = vec![0];
            self.refresh_offsets()?;
            return Ok(());
        };
        let (k, v) = (k.slice_axis(2, 0, self.idx)?, v.slice_axis(2, 0, self.idx)?);
        let new_idx = self.idx.max(len);
        let pad = |a: &Array, n: i32| -> Result<Array> {
            if n == 0 {
                return Ok(a.clone());
            }
            let mut shape = a.shape();
            shape[2] = n;
            Ok(ops::concatenate(&[&ops::zeros(&shape, a.dtype())?, a], 2)?)
        };
        let grow = new_idx - self.idx;
        let (k, v) = (pad(&k, grow)?, pad(&v, grow)?);
        let (nk, nv) = (pad(keys, new_idx - len)?, pad(values, new_idx - len)?);
        self.keys = Some(ops::concatenate(&[&k, &nk], 0)?);
        self.values = Some(ops::concatenate(&[&v, &nv], 0)?);
        for p in &mut self.left_pad {
            *p += grow;
        }
        self.left_pad.push(new_idx - len);
        self.idx = new_idx;
        self.refresh_offsets()?;
        Ok(())
    }

    /// Keeps only the rows `keep` (in that order); drops padding every kept row has.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        if keep.is_empty() {
            *self = BatchCache::default();
            return Ok(());
        }
        if keep.iter().any(|&r| r >= self.rows()) {
            return Err(EngineError::Invalid("batch cache row out of range".into()));
        }
        let ids: Vec<i32> = keep.iter().map(|&r| r as i32).collect();
        let idx = Array::from_slice(&ids, &[ids.len() as i32])?;
        self.left_pad = keep.iter().map(|&r| self.left_pad[r]).collect();
        let shift = self.left_pad.iter().copied().min().unwrap_or(0);
        let (start, stop) = (shift, self.idx);
        let cut = |a: Array| -> Result<Array> {
            let a = a.take(&idx, 0)?;
            Ok(if shift > 0 { a.slice_axis(2, start, stop)? } else { a })
        };
        self.keys = self.keys.take().map(cut).transpose()?;
        self.values = self.values.take().map(cut).transpose()?;
        for p in &mut self.left_pad {
            *p -= shift;
        }
        self.idx -= shift;
        self.refresh_offsets()?;
        Ok(())
    }

    /// Row `row`'s positions: keys and values (1, kv_heads, len, D).
    pub fn row(&self, row: usize) -> Result<(Array, Array)> {
        let (k, v) = self.keys.as_ref().zip(self.values.as_ref()).ok_or_else(|| EngineError::Invalid("empty batch cache".into()))?;
        let r = row as i32;
        let one = |a: &Array| -> Result<Array> { Ok(a.slice_axis(0, r, r + 1)?.slice_axis(2, self.left_pad[row], self.idx)?) };
        Ok((one(k)?, one(v)?))
    }
}

impl KvCache for BatchCache {
    /// The shared column count; each row's own position is in [`KvCache::row_offsets`].
    fn offset(&self) -> i32 {
        self.idx
    }

    fn as_batch(&self) -> Option<&BatchCache> {
        Some(self)
    }

    fn as_batch_mut(&mut self) -> Option<&mut BatchCache> {
        Some(self)
    }

    fn row_offsets(&self) -> Option<Array> {
        self.offsets.clone()
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        if keys.dim(0) as usize != self.rows() {
            return Err(EngineError::Invalid(format!("{} rows of keys for a batch of {}", keys.dim(0), self.rows())));
        }
        let (k, v) = super::growing::write_in_steps(&mut self.keys, &mut self.values, self.idx, keys, values)?;
        self.idx += keys.dim(2);
        let out = (k.slice_axis(2, 0, self.idx)?, v.slice_axis(2, 0, self.idx)?);
        self.refresh_offsets()?;
        Ok(out)
    }

    fn trim(&mut self, n: i32) -> Result<i32> {
        let n = n.min(self.idx - self.left_pad.iter().copied().max().unwrap_or(0)).max(0);
        self.idx -= n;
        self.refresh_offsets()?;
        Ok(n)
    }

    /// mlx-lm's `create_causal_mask(N, offset=idx, left_padding=...)`: (B, 1, n, idx + n); no
    /// array while no row is padded.
    fn make_mask(&self, n: i32, window_size: Option<i32>) -> Result<CacheMask> {
        if self.left_pad.iter().all(|&p| p == 0) {
            return create_attention_mask(n, self.idx, false, window_size);
        }
        let causal = super::create_causal_mask(n, self.idx, window_size)?; // (n, idx + n)
        let b = self.rows() as i32;
        let pads = Array::from_slice(&self.left_pad, &[b, 1, 1, 1])?;
        let cols = ops::arange(0.0, f64::from(self.idx + n), 1.0, Dtype::I32)?;
        Ok(CacheMask::Array(causal.logical_and(&pads.le(&cols)?)?))
    }

    fn state(&self) -> Vec<Array> {
        self.keys.iter().chain(self.values.iter()).cloned().collect()
    }

    fn nbytes(&self) -> usize {
        self.state().iter().map(Array::nbytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(len: i32, fill: f32) -> Array {
        ops::full(&[1, 2, len, 4], f64::from(fill), Dtype::F32).unwrap()
    }

    #[test]
    fn rows_align_filter_and_extract() {
        let mut c = BatchCache::new();
        c.extend(&seq(3, 1.0), &seq(3, 1.0)).unwrap();
        c.extend(&seq(5, 2.0), &seq(5, 2.0)).unwrap();
        c.extend(&seq(2, 3.0), &seq(2, 3.0)).unwrap();
        assert_eq!((c.offset(), c.left_pad.clone()), (5, vec![2, 0, 3]));
        assert_eq!(c.row_offsets().unwrap().to_vec::<i32>().unwrap(), vec![3, 5, 2]);
        let (k, _) = c.update_and_fetch(&ops::full(&[3, 2, 1, 4], 9.0, Dtype::F32).unwrap(), &ops::full(&[3, 2, 1, 4], 9.0, Dtype::F32).unwrap()).unwrap();
        assert_eq!(k.shape(), vec![3, 2, 6, 4]);
        let (row2, _) = c.row(2).unwrap();
        assert_eq!(row2.shape(), vec![1, 2, 3, 4]);
        let v = row2.to_vec::<f32>().unwrap();
        assert!(v[..8].iter().all(|&x| x == 3.0) && v[8..12].iter().all(|&x| x == 9.0));
        // Dropping the longest row frees the padding the others share.
        c.filter(&[2, 0]).unwrap();
        assert_eq!((c.offset(), c.left_pad.clone(), c.row_len(0), c.row_len(1)), (4, vec![1, 0], 3, 4));
        let (row0, _) = c.row(1).unwrap();
        assert_eq!(row0.to_vec::<f32>().unwrap()[..4], [1.0; 4]);
        match c.make_mask(1, None).unwrap() {
            CacheMask::Array(m) => {
                assert_eq!(m.astype(Dtype::I32).unwrap().to_vec::<i32>().unwrap(), vec![0, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
            }
            other => panic!("{other:?}"),
        }
        c.filter(&[]).unwrap();
        assert_eq!(c.rows(), 0);
    }
}
