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
    /// `left_pad` as a (B, 1, 1, 1) int32 array for the attention mask, made once per change.
    pads: Option<Array>,
}

impl BatchCache {
    pub fn new() -> BatchCache {
        BatchCache::default()
    }

    /// Recomputes `offsets` after `idx` or `left_pad` changed.
    fn refresh_offsets(&mut self) -> Result<()> {
        let offsets: Vec<i32> = self.left_pad.iter().map(|p| self.idx - p).collect();
        self.offsets = if offsets.is_empty() { None } else { Some(Array::from_slice(&offsets, &[offsets.len() as i32])?) };
        let b = self.left_pad.len() as i32;
        self.pads = if self.left_pad.iter().all(|&p| p == 0) { None } else { Some(Array::from_slice(&self.left_pad, &[b, 1, 1, 1])?) };
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
        self.extend_batch(BatchCache::merge(&[Some((keys.clone(), values.clone()))])?)
    }

    /// A batch of single sequences' filled keys and values ((1, kv_heads, L_i, D) each; `None`: a
    /// row with no position yet), right-aligned with left padding (mlx-lm's `BatchKVCache.merge`).
    pub fn merge(rows: &[Option<(Array, Array)>]) -> Result<BatchCache> {
        let lens: Vec<i32> = rows.iter().map(|r| r.as_ref().map_or(0, |(k, _)| k.dim(2))).collect();
        let idx = lens.iter().copied().max().unwrap_or(0);
        let mut cache = BatchCache { left_pad: lens.iter().map(|l| idx - l).collect(), ..BatchCache::default() };
        if let Some((k0, v0)) = rows.iter().flatten().find(|(k, _)| k.dim(2) > 0).filter(|_| idx > 0) {
            // Left padding of `n` columns in the shape and dtype of `like`.
            let pad = |a: Option<&Array>, like: &Array, n: i32| -> Result<Array> {
                let zeros = ops::zeros(&[1, like.dim(1), n, like.dim(3)], like.dtype())?;
                Ok(match a {
                    Some(a) if n == 0 => a.clone(),
                    Some(a) => ops::concatenate(&[&zeros, a], 2)?,
                    None => zeros,
                })
            };
            let (mut ks, mut vs) = (Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()));
            for (row, &p) in rows.iter().zip(&cache.left_pad) {
                let (k, v) = row.as_ref().filter(|(k, _)| k.dim(2) > 0).map(|(k, v)| (Some(k), Some(v))).unwrap_or((None, None));
                ks.push(pad(k, k0, p)?);
                vs.push(pad(v, v0, p)?);
            }
            cache.keys = Some(ops::concatenate(&ks.iter().collect::<Vec<_>>(), 0)?);
            cache.values = Some(ops::concatenate(&vs.iter().collect::<Vec<_>>(), 0)?);
            cache.idx = idx;
        } else {
            cache.left_pad = vec![0; rows.len()];
        }
        cache.refresh_offsets()?;
        Ok(cache)
    }

    /// Appends the rows of `other`, aligning the newest positions of old and new rows.
    pub fn extend_batch(&mut self, other: BatchCache) -> Result<()> {
        if self.rows() == 0 {
            *self = other;
            return Ok(());
        }
        let new_idx = self.idx.max(other.idx);
        // Every row's filled columns, `n` more columns of left padding in front.
        let aligned = |a: Option<Array>, idx: i32, n: i32| -> Result<Option<Array>> {
            let Some(a) = a else { return Ok(None) };
            let a = a.slice_axis(2, 0, idx)?;
            if n == 0 {
                return Ok(Some(a));
            }
            let mut shape = a.shape();
            shape[2] = n;
            Ok(Some(ops::concatenate(&[&ops::zeros(&shape, a.dtype())?, &a], 2)?))
        };
        let (grow, other_grow) = (new_idx - self.idx, new_idx - other.idx);
        let both = |a: Option<Array>, b: Option<Array>| -> Result<Option<Array>> {
            Ok(match (a, b) {
                (Some(a), Some(b)) => Some(ops::concatenate(&[&a, &b], 0)?),
                (None, None) => None,
                _ => return Err(EngineError::Invalid("a batch row without keys and values joins rows that have them".into())),
            })
        };
        self.keys = both(aligned(self.keys.take(), self.idx, grow)?, aligned(other.keys, other.idx, other_grow)?)?;
        self.values = both(aligned(self.values.take(), self.idx, grow)?, aligned(other.values, other.idx, other_grow)?)?;
        for p in &mut self.left_pad {
            *p += grow;
        }
        self.left_pad.extend(other.left_pad.iter().map(|p| p + other_grow));
        self.idx = new_idx;
        self.refresh_offsets()?;
        Ok(())
    }

    /// After a prefill of right-padded prompts (row `r`'s last `shift[r]` columns padding), moves
    /// each row right by its padding, so that every row's newest position is the last column; the
    /// padding comes round to the front as left padding (mlx-lm's `BatchKVCache.finalize`).
    /// `index` is [`BatchCache::roll_index`] of `shift`, shared by every layer.
    pub fn roll_right(&mut self, shift: &[i32], index: &Array) -> Result<()> {
        if shift.len() != self.rows() {
            return Err(EngineError::Invalid(format!("{} shifts for a batch of {}", shift.len(), self.rows())));
        }
        let idx = self.idx;
        let roll = |a: Option<Array>| -> Result<Option<Array>> { a.map(|a| Ok(a.slice_axis(2, 0, idx)?.take_along_axis(index, 2)?)).transpose() };
        self.keys = roll(self.keys.take())?;
        self.values = roll(self.values.take())?;
        for (p, s) in self.left_pad.iter_mut().zip(shift) {
            *p += s;
        }
        self.refresh_offsets()?;
        Ok(())
    }

    /// The gather indices (rows, 1, columns, 1) int32 of [`BatchCache::roll_right`]: column `c` of
    /// row `r` takes column `(c - shift[r]) mod columns`.
    pub fn roll_index(shift: &[i32], columns: i32) -> Result<Array> {
        let ids: Vec<i32> = shift.iter().flat_map(|&s| (0..columns).map(move |c| (c - s).rem_euclid(columns))).collect();
        Ok(Array::from_slice(&ids, &[shift.len() as i32, 1, columns, 1])?)
    }

    /// Sets the per-row RoPE offsets to `offsets` (B,): another layer's, equal by construction,
    /// so that one array serves every layer of a step.
    pub fn share_offsets(&mut self, offsets: &Array) {
        self.offsets = Some(offsets.clone());
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
        // On the device, not uploaded: every row moved on by the same count.
        self.offsets = self.offsets.take().map(|o| o.add_scalar(f64::from(keys.dim(2)))).transpose()?;
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
        let Some(pads) = self.pads.as_ref() else {
            return create_attention_mask(n, self.idx, false, window_size);
        };
        let causal = super::create_causal_mask(n, self.idx, window_size)?; // (n, idx + n)
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
