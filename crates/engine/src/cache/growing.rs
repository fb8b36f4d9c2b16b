//! The default cache, mlx-lm's `KVCache`: buffers grown in steps of 256 positions, written in place
//! with slice updates, read back as the filled prefix.
use super::{KvCache, QuantizedCache, StateNode};
use crate::error::{EngineError, Result};
use mlx::ops::QuantSpec;
use mlx::{ops, Array};

const STEP: i32 = 256;

/// mlx-lm's `KVCache` write, shared by the growing, chunked and batch caches: `keys` / `values`
/// (B, heads, n, D) go into the buffers (B, heads, capacity, D) at position `filled`; when they do
/// not fit, the buffers grow by whole steps of 256 positions, a partly filled old buffer first cut
/// to its filled part (`prev % step != 0`). Returns the buffers after the write.
pub(super) fn write_in_steps(
    key_buf: &mut Option<Array>,
    value_buf: &mut Option<Array>,
    filled: i32,
    keys: &Array,
    values: &Array,
) -> Result<(Array, Array)> {
    let n = keys.dim(2);
    let (k, v) = match (key_buf.take(), value_buf.take()) {
        (Some(k), Some(v)) if filled + n <= k.dim(2) => (k, v),
        (old_k, old_v) => {
            let (b, heads, k_dim, v_dim) = (keys.dim(0), keys.dim(1), keys.dim(3), values.dim(3));
            let n_steps = (STEP + n - 1) / STEP;
            let new_k = ops::zeros(&[b, heads, n_steps * STEP, k_dim], keys.dtype())?;
            let new_v = ops::zeros(&[b, heads, n_steps * STEP, v_dim], values.dtype())?;
            match (old_k, old_v) {
                (Some(mut k), Some(mut v)) => {
                    if filled % STEP != 0 {
                        k = k.slice_axis(2, 0, filled)?;
                        v = v.slice_axis(2, 0, filled)?;
                    }
                    (ops::concatenate(&[&k, &new_k], 2)?, ops::concatenate(&[&v, &new_v], 2)?)
                }
                _ => (new_k, new_v),
            }
        }
    };
    let (start, end) = ([0, 0, filled, 0], filled + n);
    let k = k.slice_update(keys, &start, &[k.dim(0), k.dim(1), end, k.dim(3)])?;
    let v = v.slice_update(values, &start, &[v.dim(0), v.dim(1), end, v.dim(3)])?;
    *key_buf = Some(k.clone());
    *value_buf = Some(v.clone());
    Ok((k, v))
}

#[derive(Default)]
pub struct GrowingCache {
    keys: Option<Array>,   // (B, kv_heads, capacity, k_dim)
    values: Option<Array>, // (B, kv_heads, capacity, v_dim)
    offset: i32,
}

impl GrowingCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// From a saved `KVCache` state: full buffers and the filled length.
    pub fn from_state(keys: Option<Array>, values: Option<Array>, offset: i32) -> Result<Self> {
        if keys.is_some() != values.is_some() || keys.as_ref().is_some_and(|k| k.ndim() != 4 || k.dim(2) < offset) {
            return Err(EngineError::Invalid("inconsistent KVCache state".into()));
        }
        Ok(GrowingCache { keys, values, offset })
    }
}

impl GrowingCache {
    /// The filled positions: keys and values (B, kv_heads, offset, D); `None` while empty.
    pub fn filled(&self) -> Result<Option<(Array, Array)>> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) if self.offset > 0 => Ok(Some((k.slice_axis(2, 0, self.offset)?, v.slice_axis(2, 0, self.offset)?))),
            _ => Ok(None),
        }
    }
}

impl KvCache for GrowingCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let (k, v) = write_in_steps(&mut self.keys, &mut self.values, self.offset, keys, values)?;
        self.offset += keys.dim(2);
        Ok(if self.offset < k.dim(2) {
            (k.slice_axis(2, 0, self.offset)?, v.slice_axis(2, 0, self.offset)?)
        } else {
            (k.clone(), v.clone())
        })
    }

    fn trim(&mut self, n: i32) -> Result<i32> {
        let n = n.min(self.offset).max(0);
        self.offset -= n;
        Ok(n)
    }

    fn state(&self) -> Vec<Array> {
        self.keys.iter().chain(self.values.iter()).cloned().collect()
    }

    fn nbytes(&self) -> usize {
        self.state().iter().map(Array::nbytes).sum()
    }

    fn to_quantized(&self, spec: QuantSpec) -> Result<Option<Box<dyn KvCache>>> {
        Ok(Some(Box::new(QuantizedCache::from_growing(self.keys.as_ref(), self.values.as_ref(), self.offset, spec)?)))
    }

    fn saved_state(&self) -> Result<(&'static str, Vec<StateNode>)> {
        let arr = |a: &Option<Array>| a.clone().map_or(StateNode::None, StateNode::Array);
        Ok(("KVCache", vec![arr(&self.keys), arr(&self.values), StateNode::Int(i64::from(self.offset))]))
    }
}
