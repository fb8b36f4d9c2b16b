//! mlx-lm's `ArraysCache`: the state of a recurrent layer (a gated DeltaNet's convolution tail
//! and its recurrent matrix) rather than keys and values. It cannot be trimmed (the state before a
//! position is gone once it is folded in); [`KvCache::offset`] counts the positions folded in so
//! far, which mlx-lm's class does not keep (a prompt-cache file takes it from the model's KV
//! caches, see `file.rs`).
use super::{CacheMask, KvCache, StateNode};
use crate::error::{EngineError, Result};
use mlx::Array;

#[derive(Clone, Debug)]
pub struct ArraysCache {
    /// `cache[i]` of mlx-lm's class; `None` until the layer first writes it.
    slots: Vec<Option<Array>>,
    offset: i32,
    /// Sequences (batch rows): 1 but in a batch made by [`ArraysCache::batch`].
    rows: usize,
}

impl ArraysCache {
    /// `ArraysCache(size)`: `size` empty slots.
    pub fn new(size: usize) -> ArraysCache {
        ArraysCache { slots: vec![None; size], offset: 0, rows: 1 }
    }

    /// From a saved state (`cache` of mlx-lm's class) after `offset` positions.
    pub fn from_state(slots: Vec<Option<Array>>, offset: i32) -> ArraysCache {
        let rows = slots.iter().flatten().next().map_or(1, |a| a.dim(0).max(0) as usize);
        ArraysCache { slots, offset, rows }
    }

    pub fn get(&self, i: usize) -> Option<&Array> {
        self.slots.get(i).and_then(Option::as_ref)
    }

    /// `cache[i] = value`.
    pub fn set(&mut self, i: usize, value: Array) -> Result<()> {
        let n = self.slots.len();
        let slot = self.slots.get_mut(i).ok_or_else(|| EngineError::Invalid(format!("state slot {i} of an ArraysCache of {n}")))?;
        *slot = Some(value);
        Ok(())
    }

    /// `cache.advance(n)`: `n` more positions folded into the state.
    pub fn advance(&mut self, n: i32) {
        self.offset += n;
    }

    /// Whether nothing has been written yet (mlx-lm's `empty`).
    pub fn is_empty(&self) -> bool {
        self.slots.first().is_none_or(Option::is_none)
    }

    /// The recurrent layers' states of `cache` (`None` for its other layers), or `None` when it has
    /// no recurrent layer. Cheap: the arrays are shared, and a layer replaces its state rather
    /// than writing into it.
    pub fn snapshot(cache: &[Box<dyn KvCache>]) -> Option<Vec<Option<ArraysCache>>> {
        cache.iter().any(|c| c.as_arrays().is_some()).then(|| cache.iter().map(|c| c.as_arrays().cloned()).collect())
    }

    /// Puts the states of a [`ArraysCache::snapshot`] back into `cache` (the other layers as they are).
    pub fn restore(cache: &mut [Box<dyn KvCache>], snapshot: &[Option<ArraysCache>]) {
        for (c, s) in cache.iter_mut().zip(snapshot) {
            if let Some(s) = s {
                *c = Box::new(s.clone());
            }
        }
    }

    /// mlx-lm's `extend`: `other`'s rows after this cache's (a batch of sequences, one row each).
    pub fn extend(&mut self, other: &ArraysCache) -> Result<()> {
        if self.slots.len() != other.slots.len() {
            return Err(EngineError::Invalid("ArraysCaches of different sizes cannot be merged".into()));
        }
        for (a, b) in self.slots.iter_mut().zip(&other.slots) {
            *a = match (a.take(), b) {
                (Some(a), Some(b)) => Some(mlx::ops::concatenate(&[&a, b], 0)?),
                (a, None) => a,
                (None, Some(b)) if self.rows == 0 => Some(b.clone()),
                (None, Some(_)) => return Err(EngineError::Invalid("a batch row without a recurrent state".into())),
            };
        }
        self.rows += other.rows;
        Ok(())
    }

    /// mlx-lm's `filter`: only the rows `keep`, in that order.
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        let idx: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
        let idx = Array::from_slice(&idx, &[idx.len() as i32])?;
        for s in self.slots.iter_mut().flatten() {
            *s = s.take(&idx, 0)?;
        }
        self.rows = keep.len();
        Ok(())
    }

    /// An empty batch (no rows yet) of `size` slots, to [`ArraysCache::extend`].
    pub fn batch(size: usize) -> ArraysCache {
        ArraysCache { slots: vec![None; size], offset: 0, rows: 0 }
    }

    /// Sets the position count (a state loaded from a file, where mlx-lm keeps none).
    pub(super) fn set_offset(&mut self, offset: i32) {
        self.offset = offset;
    }
}

impl KvCache for ArraysCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn as_arrays(&self) -> Option<&ArraysCache> {
        Some(self)
    }

    fn as_arrays_mut(&mut self) -> Option<&mut ArraysCache> {
        Some(self)
    }

    fn update_and_fetch(&mut self, _keys: &Array, _values: &Array) -> Result<(Array, Array)> {
        Err(EngineError::Invalid("a recurrent layer's state (ArraysCache) holds no keys and values".into()))
    }

    fn is_trimmable(&self) -> bool {
        false
    }

    fn checkpoint(&self, _upcoming: i32) -> Option<Box<dyn KvCache>> {
        Some(Box::new(self.clone()))
    }

    fn trim(&mut self, n: i32) -> Result<i32> {
        if n <= 0 {
            return Ok(0);
        }
        Err(EngineError::Invalid(
            "the state of a recurrent (linear-attention) layer cannot be trimmed: it holds no positions to drop".into(),
        ))
    }

    /// mlx-lm's `ArraysCache.make_mask` without left padding or lengths: no mask.
    fn make_mask(&self, _n: i32, _window_size: Option<i32>) -> Result<CacheMask> {
        Ok(CacheMask::None)
    }

    fn state(&self) -> Vec<Array> {
        self.slots.iter().flatten().cloned().collect()
    }

    fn nbytes(&self) -> usize {
        self.slots.iter().flatten().map(Array::nbytes).sum()
    }

    /// `(cache, left_padding, lengths)`, the last two `None` outside a batch.
    fn saved_state(&self) -> Result<(&'static str, Vec<StateNode>)> {
        let slots = self.slots.iter().map(|s| s.clone().map_or(StateNode::None, StateNode::Array)).collect();
        Ok(("ArraysCache", vec![StateNode::List(slots), StateNode::None, StateNode::None]))
    }
}
