//! KV caches behind one trait, chosen per layer by the model. Keys and values are stored after
//! RoPE, shaped (B, kv_heads, positions, head_dim).
mod growing;

pub use growing::GrowingCache;

use crate::error::Result;
use mlx::Array;

pub trait KvCache: Send {
    /// Number of positions processed so far (the RoPE offset of the next token).
    fn offset(&self) -> i32;
    /// Appends keys/values (B, kv_heads, L, D) and returns all cached ones to attend over.
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)>;
    /// Forgets the last `n` positions; returns how many were dropped.
    fn trim(&mut self, n: i32) -> i32;
    /// The arrays to evaluate to materialise the cache.
    fn state(&self) -> Vec<Array>;
    /// Bytes held by the cache buffers.
    fn nbytes(&self) -> usize;
}
