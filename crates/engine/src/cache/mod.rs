//! KV caches behind one trait, chosen per layer by the model. Keys and values are stored after
//! RoPE, shaped (B, kv_heads, positions, head_dim); a recurrent layer's state ([`ArraysCache`])
//! sits behind the same trait.
mod arrays;
mod batch;
mod chunked;
mod file;
mod growing;
mod list;
mod mask;
pub mod paged;
mod quantized;
mod rotating;
mod states;
#[cfg(test)]
mod tests;

pub use arrays::ArraysCache;
pub use batch::BatchCache;
pub use chunked::ChunkedCache;
pub use file::{load_prompt_cache, save_prompt_cache, PromptCacheFile};
pub use growing::GrowingCache;
pub use list::ListCache;
pub use mask::{create_attention_mask, create_causal_mask, CacheMask};
pub use paged::{BlockAllocator, PagedCache, PagedPool, StoredSeq};
pub use quantized::{quantized_sdpa, QuantizedCache};
pub use rotating::RotatingCache;
pub use states::StatePrefixCache;

use crate::error::{EngineError, Result};
use mlx::ops::QuantSpec;
use mlx::Array;

/// mlx-lm's `DEFAULT_QUANTIZED_KV_START`.
pub const DEFAULT_QUANTIZED_KV_START: usize = 5000;

/// One cache per layer of a model (or of a pipeline stage).
pub type Caches = Vec<Box<dyn KvCache>>;

/// A quantized tensor as `mx.quantize` returns it: packed uint32 data, scales, biases.
pub type QuantTriple = [Array; 3];

/// One node of a cache's `state` tree, as mlx-lm's `save_prompt_cache` flattens it.
#[derive(Clone, Debug)]
pub enum StateNode {
    Array(Array),
    Int(i64),
    /// A string (saved as its character codes, mlx-lm's "string" scalar).
    Str(String),
    None,
    List(Vec<StateNode>),
}

pub trait KvCache {
    /// Number of positions processed so far (the RoPE offset of the next token).
    fn offset(&self) -> i32;
    /// This cache as a batch cache, when it is one.
    fn as_batch(&self) -> Option<&BatchCache> {
        None
    }
    fn as_batch_mut(&mut self) -> Option<&mut BatchCache> {
        None
    }
    /// This cache as a recurrent layer's state, when it is one.
    fn as_arrays(&self) -> Option<&ArraysCache> {
        None
    }
    fn as_arrays_mut(&mut self) -> Option<&mut ArraysCache> {
        None
    }
    /// A batch cache's per-row RoPE offsets (B,) int32; `None` when every row is at `offset()`.
    fn row_offsets(&self) -> Option<Array> {
        None
    }
    /// Appends keys/values (B, kv_heads, L, D) and returns all cached ones to attend over.
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)>;
    /// `Some` when the cache stores quantized keys/values (then use `update_and_fetch_quantized`).
    fn quantization(&self) -> Option<QuantSpec> {
        None
    }
    /// Appends keys/values and returns the quantized ones to attend over (quantized caches only).
    fn update_and_fetch_quantized(&mut self, _keys: &Array, _values: &Array) -> Result<(QuantTriple, QuantTriple)> {
        Err(EngineError::Invalid("this KV cache is not quantized".into()))
    }
    /// `(max_size, keep)` for a rotating window (mlx-lm's `RotatingKVCache`), `None` otherwise.
    fn window(&self) -> Option<(i32, i32)> {
        None
    }
    /// Whether `trim` can work (mlx-lm's `is_trimmable`).
    fn is_trimmable(&self) -> bool {
        true
    }
    /// The first position the cache still holds: 0 unless it drops old positions from its front
    /// (a chunked cache past its chunk; a rotating one says so through [`KvCache::window`]).
    fn first_position(&self) -> i32 {
        0
    }
    /// Forgets the last `n` positions; returns how many were dropped. Errors where it cannot work.
    fn trim(&mut self, n: i32) -> Result<i32>;
    /// The attention mask for the next `n` positions (mlx-lm's `cache.make_mask`).
    fn make_mask(&self, n: i32, window_size: Option<i32>) -> Result<CacheMask> {
        create_attention_mask(n, self.offset(), false, window_size)
    }
    /// The arrays to evaluate to materialise the cache.
    fn state(&self) -> Vec<Array>;
    /// Bytes held by the cache buffers.
    fn nbytes(&self) -> usize;
    /// mlx-lm's `to_quantized`: `Ok(None)` when the cache has none (it stays as it is).
    fn to_quantized(&self, _spec: QuantSpec) -> Result<Option<Box<dyn KvCache>>> {
        Ok(None)
    }
    /// mlx-lm's class name and `state` tree, for prompt-cache files.
    fn saved_state(&self) -> Result<(&'static str, Vec<StateNode>)> {
        Err(EngineError::Invalid("this KV cache cannot be saved to a prompt-cache file".into()))
    }
    /// The parts of a cache list (mlx-lm's `CacheList`), each updated by the layer that owns it.
    fn parts_mut(&mut self) -> Option<&mut [Box<dyn KvCache>]> {
        None
    }
    fn parts(&self) -> Option<&[Box<dyn KvCache>]> {
        None
    }
    /// A copy of the cache as it is now (arrays shared, not copied), to put back after a forward
    /// pass of up to `upcoming` positions that may be rejected in part, where a trim could not take
    /// them back: a recurrent state, a rotating window that will have wrapped. `None` where a
    /// trim will do, or where the cache cannot be copied.
    fn checkpoint(&self, _upcoming: i32) -> Option<Box<dyn KvCache>> {
        None
    }
    /// The cache as its own type, for a model whose layers keep their own kind of state.
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }
}

/// `--kv-bits`, `--kv-group-size`, `--quantized-kv-start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvQuantConfig {
    pub bits: i32,
    pub group_size: i32,
    pub start: usize,
}

impl KvQuantConfig {
    pub fn validate(&self) -> Result<()> {
        if ![2, 3, 4, 5, 6, 8].contains(&self.bits) {
            return Err(EngineError::Invalid(format!("--kv-bits {} is not one of 2, 3, 4, 5, 6, 8", self.bits)));
        }
        if ![32, 64, 128].contains(&self.group_size) {
            return Err(EngineError::Invalid(format!("--kv-group-size {} is not one of 32, 64, 128", self.group_size)));
        }
        Ok(())
    }
}

/// mlx-lm's `maybe_quantize_kv_cache`: each cache that has `to_quantized` and holds at least
/// `start` positions is replaced by its quantized copy.
pub fn maybe_quantize_kv_cache(cache: &mut [Box<dyn KvCache>], q: Option<&KvQuantConfig>) -> Result<()> {
    let Some(q) = q else { return Ok(()) };
    for c in cache.iter_mut() {
        if c.offset() as usize >= q.start {
            if let Some(new) = c.to_quantized(QuantSpec::affine(q.group_size, q.bits))? {
                *c = new;
            }
        }
    }
    Ok(())
}

/// mlx-lm's `can_trim_prompt_cache`.
pub fn can_trim_prompt_cache(cache: &[Box<dyn KvCache>]) -> bool {
    cache.iter().all(|c| c.is_trimmable())
}

/// mlx-lm's `trim_prompt_cache`, but with an error (not a silent 0) when some cache cannot be trimmed.
pub fn trim_prompt_cache(cache: &mut [Box<dyn KvCache>], n: i32) -> Result<i32> {
    if !can_trim_prompt_cache(cache) {
        let why = match cache.iter().any(|c| c.as_arrays().is_some()) {
            true => "the model's recurrent (linear-attention) layer states",
            false => "a rotating cache that has wrapped around its window",
        };
        return Err(EngineError::Invalid(format!("the KV cache cannot be trimmed ({why})")));
    }
    let mut first = 0;
    for (i, c) in cache.iter_mut().enumerate() {
        let t = c.trim(n)?;
        if i == 0 {
            first = t;
        }
    }
    Ok(first)
}
