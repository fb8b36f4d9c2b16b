//! mlx-lm's `RotatingKVCache`: the first `keep` positions plus a sliding window of `max_size`;
//! single positions are written in place in a ring, several at once go through a concatenation
//! in temporal order (keeping `max_size - 1` old positions so each new one sees a full window).
use super::{create_attention_mask, create_causal_mask, CacheMask, KvCache, StateNode};
use crate::error::{EngineError, Result};
use mlx::ops::{self, QuantSpec};
use mlx::{Array, Dtype};

const STEP: i32 = 256;

#[derive(Clone)]
pub struct RotatingCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
    keep: i32,
    max_size: i32,
    idx: i32,
}

impl RotatingCache {
    pub fn new(max_size: i32, keep: i32) -> Self {
        RotatingCache { keys: None, values: None, offset: 0, keep, max_size, idx: 0 }
    }

    /// From a saved `RotatingKVCache` state.
    pub fn from_state(keys: Option<Array>, values: Option<Array>, offset: i32, keep: i32, max_size: i32, idx: i32) -> Result<Self> {
        if keys.is_some() != values.is_some() || max_size <= 0 || keep < 0 {
            return Err(EngineError::Invalid("inconsistent RotatingKVCache state".into()));
        }
        Ok(RotatingCache { keys, values, offset, keep, max_size, idx })
    }

    pub fn max_size(&self) -> i32 {
        self.max_size
    }

    fn trim_buf(&self, trim_size: i32, v: &Array, append: Option<&Array>) -> Result<Array> {
        trim_buf(v, trim_size, self.keep, append)
    }

    fn temporal_order(&self, v: &Array) -> Result<Array> {
        temporal_order(v, self.keep, self.idx, self.offset)
    }

    fn update_concat(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        match (self.keys.take(), self.values.take()) {
            (Some(k), Some(v)) => {
                let k = self.temporal_order(&k)?;
                let v = self.temporal_order(&v)?;
                self.idx = k.dim(2);
                let trim_size = self.idx - self.max_size + 1;
                self.keys = Some(self.trim_buf(trim_size, &k, Some(keys))?);
                self.values = Some(self.trim_buf(trim_size, &v, Some(values))?);
            }
            _ => {
                self.keys = Some(keys.clone());
                self.values = Some(values.clone());
            }
        }
        self.offset += keys.dim(2);
        let (k, v) = (self.keys.clone().unwrap_or_else(|| keys.clone()), self.values.clone().unwrap_or_else(|| values.clone()));
        self.idx = k.dim(2);
        Ok((k, v))
    }

    fn update_in_place(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let (b, heads, s, k_dim) = (keys.dim(0), keys.dim(1), keys.dim(2), keys.dim(3));
        let prev = self.offset;
        let grow = match &self.keys {
            None => true,
            Some(k) => prev >= k.dim(2) && k.dim(2) < self.max_size,
        };
        if grow {
            let new_size = STEP.min(self.max_size - prev);
            let new_k = ops::zeros(&[b, heads, new_size, k_dim], keys.dtype())?;
            let new_v = ops::zeros(&[b, heads, new_size, values.dim(3)], values.dtype())?;
            match (self.keys.take(), self.values.take()) {
                (Some(k), Some(v)) => {
                    self.keys = Some(ops::concatenate(&[&k, &new_k], 2)?);
                    self.values = Some(ops::concatenate(&[&v, &new_v], 2)?);
                }
                _ => {
                    self.keys = Some(new_k);
                    self.values = Some(new_v);
                }
            }
            self.idx = prev;
        }
        let (mut k, mut v) = match (self.keys.take(), self.values.take()) {
            (Some(k), Some(v)) => (k, v),
            _ => return Err(EngineError::Invalid("rotating cache lost its buffers".into())),
        };
        let trim_size = k.dim(2) - self.max_size;
        if trim_size > 0 {
            k = self.trim_buf(trim_size, &k, None)?;
            v = self.trim_buf(trim_size, &v, None)?;
            self.idx = self.max_size;
        }
        if self.idx == self.max_size {
            self.idx = self.keep;
        }
        let start = [0, 0, self.idx, 0];
        k = k.slice_update(keys, &start, &[k.dim(0), k.dim(1), self.idx + s, k.dim(3)])?;
        v = v.slice_update(values, &start, &[v.dim(0), v.dim(1), self.idx + s, v.dim(3)])?;
        self.offset += s;
        self.idx += s;
        let out = if self.offset < k.dim(2) {
            (k.slice_axis(2, 0, self.offset)?, v.slice_axis(2, 0, self.offset)?)
        } else {
            (k.clone(), v.clone())
        };
        self.keys = Some(k);
        self.values = Some(v);
        Ok(out)
    }
}

/// `_trim`: drops `trim_size` positions after the first `keep` of buffer `v` (B, H, S, D) and
/// appends `append`.
pub(crate) fn trim_buf(v: &Array, trim_size: i32, keep: i32, append: Option<&Array>) -> Result<Array> {
    let mut parts = Vec::new();
    if trim_size > 0 {
        parts.push(v.slice_axis(2, 0, keep)?);
        parts.push(v.slice_axis(2, trim_size + keep, i32::MAX)?);
    } else {
        parts.push(v.clone());
    }
    if let Some(a) = append {
        parts.push(a.clone());
    }
    Ok(ops::concatenate(&parts.iter().collect::<Vec<_>>(), 2)?)
}

/// `_temporal_order`: buffer `v` (B, H, S, D) with ring index `idx` after `offset` positions, in
/// temporal order and cut to its used part.
pub(crate) fn temporal_order(v: &Array, keep: i32, idx: i32, offset: i32) -> Result<Array> {
    if idx == v.dim(2) {
        Ok(v.clone())
    } else if idx < offset {
        let parts = [v.slice_axis(2, 0, keep)?, v.slice_axis(2, idx, i32::MAX)?, v.slice_axis(2, keep, idx)?];
        Ok(ops::concatenate(&parts.iter().collect::<Vec<_>>(), 2)?)
    } else {
        Ok(v.slice_axis(2, 0, idx)?)
    }
}

/// `mx.roll` of a 1-D array.
fn roll(x: &Array, shift: i32) -> Result<Array> {
    let n = x.dim(0);
    let s = shift.rem_euclid(n.max(1));
    if s == 0 {
        return Ok(x.clone());
    }
    Ok(ops::concatenate(&[&x.slice_axis(0, n - s, n)?, &x.slice_axis(0, 0, n - s)?], 0)?)
}

/// `trim` of a rotating window (mlx-lm's `RotatingKVCache.trim`), an error once it has wrapped.
pub(crate) fn rotating_trim(n: i32, offset: &mut i32, idx: &mut i32, max_size: i32) -> Result<i32> {
    if *offset >= max_size {
        return Err(EngineError::Invalid(format!(
            "a rotating KV cache that has seen {offset} positions (window {max_size}) cannot be trimmed"
        )));
    }
    let n = n.min(*offset).max(0);
    *offset -= n;
    *idx -= n;
    Ok(n)
}

/// `RotatingKVCache.make_mask` for a cache at `offset` with ring index `idx` (shared with the
/// paged ring, which keeps the same layout).
pub(crate) fn rotating_mask(n: i32, window_size: Option<i32>, offset: i32, max_size: i32, idx: i32) -> Result<CacheMask> {
    if n > 1 {
        let window = window_size.unwrap_or(max_size);
        let offset = (max_size - 1).min(offset);
        if offset + n > window {
            return Ok(CacheMask::Array(create_causal_mask(n, offset, Some(window))?));
        }
        return create_attention_mask(n, offset, false, None);
    }
    let Some(window) = window_size else { return Ok(CacheMask::None) };
    if offset >= window && max_size > window {
        let idx = if idx >= max_size { 0 } else { idx };
        let mask_size = if offset < max_size { offset + 1 } else { max_size };
        let mask = ops::arange(0.0, f64::from(mask_size), 1.0, Dtype::I32)?.ge_scalar(f64::from(mask_size - window))?;
        return Ok(CacheMask::Array(roll(&mask, idx + 1)?));
    }
    Ok(CacheMask::None)
}

impl KvCache for RotatingCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        if keys.dim(2) == 1 {
            self.update_in_place(keys, values)
        } else {
            self.update_concat(keys, values)
        }
    }

    fn is_trimmable(&self) -> bool {
        self.offset < self.max_size
    }

    /// Past its window after `upcoming` more positions, the ring can no longer be trimmed back.
    fn checkpoint(&self, upcoming: i32) -> Option<Box<dyn KvCache>> {
        (self.offset.saturating_add(upcoming) >= self.max_size).then(|| Box::new(self.clone()) as Box<dyn KvCache>)
    }

    fn trim(&mut self, n: i32) -> Result<i32> {
        rotating_trim(n, &mut self.offset, &mut self.idx, self.max_size)
    }

    fn make_mask(&self, n: i32, window_size: Option<i32>) -> Result<CacheMask> {
        rotating_mask(n, window_size, self.offset, self.max_size, self.idx)
    }

    fn window(&self) -> Option<(i32, i32)> {
        Some((self.max_size, self.keep))
    }

    fn state(&self) -> Vec<Array> {
        self.keys.iter().chain(self.values.iter()).cloned().collect()
    }

    fn nbytes(&self) -> usize {
        self.state().iter().map(Array::nbytes).sum()
    }

    fn to_quantized(&self, _spec: QuantSpec) -> Result<Option<Box<dyn KvCache>>> {
        Err(EngineError::Invalid(
            "a rotating KV cache (--max-kv-size or sliding-window layers) cannot be quantized (--kv-bits), as in mlx-lm".into(),
        ))
    }

    fn saved_state(&self) -> Result<(&'static str, Vec<StateNode>)> {
        let arr = |a: &Option<Array>| a.clone().map_or(StateNode::None, StateNode::Array);
        let int = |x: i32| StateNode::Int(i64::from(x));
        Ok((
            "RotatingKVCache",
            vec![arr(&self.keys), arr(&self.values), int(self.offset), int(self.keep), int(self.max_size), int(self.idx)],
        ))
    }
}
