//! deepseek_v41's per-layer cache (mlx-lm's `LayerCache`): the sliding window of latents, the
//! compressed groups, the indexer's keys and the open group's rows; it cannot be trimmed, so
//! speculative decoding puts a checkpoint back instead.
use crate::cache::KvCache;
use crate::error::{EngineError, Result};
use mlx::{ops, Array};

/// One decoder layer's cache (mlx-lm's `LayerCache`): rows are (B, n, dim).
#[derive(Clone)]
pub struct LayerCache {
    pub(super) window_size: i32,
    pub(super) offset: i32,
    pub(super) window: Option<Array>,
    pub(super) compress_kv: Option<Array>,
    pub(super) index_k: Option<Array>,
    pub(super) pending_kv: Option<Array>,
    pub(super) pending_gate: Option<Array>,
}

/// `_append`: `new` after `cached` along the rows.
pub(super) fn append(cached: &Option<Array>, new: &Array) -> Result<Array> {
    Ok(match cached {
        Some(c) => ops::concatenate(&[c, new], 1)?,
        None => new.clone(),
    })
}

impl LayerCache {
    pub(super) fn new(window_size: i32) -> LayerCache {
        LayerCache { window_size, offset: 0, window: None, compress_kv: None, index_k: None, pending_kv: None, pending_gate: None }
    }

    /// The window with `kv` appended (returned whole), keeping its last `window_size` rows.
    pub(super) fn update_window(&mut self, kv: &Array) -> Result<Array> {
        let window = append(&self.window, kv)?;
        let n = window.dim(1);
        self.window = Some(window.slice_axis(1, (n - self.window_size).max(0), n)?);
        self.offset += kv.dim(1);
        Ok(window)
    }

    fn arrays(&self) -> impl Iterator<Item = &Array> {
        [&self.window, &self.compress_kv, &self.index_k, &self.pending_kv, &self.pending_gate].into_iter().flatten()
    }
}

impl KvCache for LayerCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn update_and_fetch(&mut self, _keys: &Array, _values: &Array) -> Result<(Array, Array)> {
        Err(EngineError::Invalid("a deepseek_v41 layer cache holds its window and compressed groups, not keys and values".into()))
    }

    /// Evicted window rows and closed compressed groups cannot be restored.
    fn is_trimmable(&self) -> bool {
        false
    }

    fn trim(&mut self, _n: i32) -> Result<i32> {
        Err(EngineError::Invalid("a deepseek_v41 layer cache cannot be trimmed (mlx-lm's cannot either)".into()))
    }

    /// Speculative decoding puts the whole cache back after a rejection instead.
    fn checkpoint(&self, _upcoming: i32) -> Option<Box<dyn KvCache>> {
        Some(Box::new(self.clone()))
    }

    fn state(&self) -> Vec<Array> {
        self.arrays().cloned().collect()
    }

    fn nbytes(&self) -> usize {
        self.arrays().map(Array::nbytes).sum()
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
}
