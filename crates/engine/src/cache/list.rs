//! mlx-lm's `CacheList`: one layer's several caches behind the one cache interface (deepseek_v32's
//! latent KV cache beside its indexer's key cache). The first part gives the offset and the mask;
//! trimming trims every part; a prompt-cache file holds each part's state with its class name.
use super::{CacheMask, KvCache, StateNode};
use crate::error::{EngineError, Result};
use mlx::Array;

pub struct ListCache {
    parts: Vec<Box<dyn KvCache>>,
}

impl ListCache {
    /// At least one part (mlx-lm's `CacheList(*caches)`).
    pub fn new(parts: Vec<Box<dyn KvCache>>) -> Result<ListCache> {
        if parts.is_empty() {
            return Err(EngineError::Invalid("a cache list needs at least one cache".into()));
        }
        Ok(ListCache { parts })
    }
}

impl KvCache for ListCache {
    fn offset(&self) -> i32 {
        self.parts[0].offset()
    }

    /// The parts are updated one by one, by the layer that owns them.
    fn update_and_fetch(&mut self, _keys: &Array, _values: &Array) -> Result<(Array, Array)> {
        Err(EngineError::Invalid("a cache list is updated through its parts, not as one KV cache".into()))
    }

    fn parts_mut(&mut self) -> Option<&mut [Box<dyn KvCache>]> {
        Some(&mut self.parts)
    }

    fn parts(&self) -> Option<&[Box<dyn KvCache>]> {
        Some(&self.parts)
    }

    fn row_offsets(&self) -> Option<Array> {
        self.parts[0].row_offsets()
    }

    fn is_trimmable(&self) -> bool {
        self.parts.iter().all(|c| c.is_trimmable())
    }

    /// Trims every part; returns the last part's count, as mlx-lm's `trim`.
    fn trim(&mut self, n: i32) -> Result<i32> {
        let mut m = 0;
        for c in &mut self.parts {
            m = c.trim(n)?;
        }
        Ok(m)
    }

    fn make_mask(&self, n: i32, window_size: Option<i32>) -> Result<CacheMask> {
        self.parts[0].make_mask(n, window_size)
    }

    fn state(&self) -> Vec<Array> {
        self.parts.iter().flat_map(|c| c.state()).collect()
    }

    fn nbytes(&self) -> usize {
        self.parts.iter().map(|c| c.nbytes()).sum()
    }

    /// `[(part.state, class name), ...]`, as mlx-lm's `CacheList.state`.
    fn saved_state(&self) -> Result<(&'static str, Vec<StateNode>)> {
        let parts = self
            .parts
            .iter()
            .map(|c| {
                let (class, state) = c.saved_state()?;
                Ok(StateNode::List(vec![StateNode::List(state), StateNode::Str(class.to_owned())]))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(("CacheList", parts))
    }
}
