//! MLX's random numbers. Without an explicit key each call splits MLX's global key, exactly as
//! Python's `mx.random` does, so the same seed gives the same draws in both.
use crate::array::{Array, Dtype};
use crate::error::{ctx, Result};
use mlx_sys as sys;

/// Seeds MLX's global key (`mx.random.seed`).
#[track_caller]
pub fn seed(seed: u64) -> Result<()> {
    ctx("random.seed", sys::random_seed(seed))
}

/// Samples indices from unnormalised log-probabilities along `axis` (`mx.random.categorical`).
#[track_caller]
pub fn categorical(logits: &Array, axis: i32) -> Result<Array> {
    ctx("random.categorical", sys::random_categorical(logits.handle(), axis, None)).map(Array::from_handle)
}

/// Uniform draws in [0, 1) (`mx.random.uniform`).
#[track_caller]
pub fn uniform(shape: &[i32], dtype: Dtype) -> Result<Array> {
    ctx("random.uniform", sys::random_uniform(shape, dtype.code(), None)).map(Array::from_handle)
}

/// Integers in [low, high) (`mx.random.randint`).
#[track_caller]
pub fn randint(low: i64, high: i64, shape: &[i32], dtype: Dtype) -> Result<Array> {
    ctx("random.randint", sys::random_randint(low, high, shape, dtype.code(), None)).map(Array::from_handle)
}

/// A key for explicit-key draws (`mx.random.key(seed)`).
#[track_caller]
pub fn key(seed: u64) -> Result<Array> {
    ctx("random.key", sys::random_key(seed)).map(Array::from_handle)
}

/// Two new keys from `key` (`mx.random.split(key)`).
#[track_caller]
pub fn split(key: &Array) -> Result<(Array, Array)> {
    ctx("random.split", sys::random_split(key.handle())).map(|(a, b)| (Array::from_handle(a), Array::from_handle(b)))
}

/// [`categorical`] drawn with `key` instead of the global key.
#[track_caller]
pub fn categorical_with_key(logits: &Array, axis: i32, key: &Array) -> Result<Array> {
    ctx("random.categorical", sys::random_categorical(logits.handle(), axis, Some(key.handle()))).map(Array::from_handle)
}

/// [`uniform`] drawn with `key` instead of the global key.
#[track_caller]
pub fn uniform_with_key(shape: &[i32], dtype: Dtype, key: &Array) -> Result<Array> {
    ctx("random.uniform", sys::random_uniform(shape, dtype.code(), Some(key.handle()))).map(Array::from_handle)
}

/// An explicit key sequence that draws exactly as MLX's global one (`KeySequence`): each draw
/// splits the key, keeps the first half and draws with the second. Seeded alike, it gives the
/// global sequence's draws, so independent streams (one per request) can each match a seeded run.
#[derive(Clone)]
pub struct KeySeq {
    key: Array,
}

impl KeySeq {
    /// `mx.random.seed(seed)`'s starting key.
    pub fn new(seed: u64) -> Result<KeySeq> {
        Ok(KeySeq { key: key(seed)? })
    }

    /// The key for the next draw.
    pub fn next_key(&mut self) -> Result<Array> {
        let (keep, draw) = split(&self.key)?;
        self.key = keep;
        Ok(draw)
    }

    /// The current state, to evaluate with the step that used it (keeps the graph short).
    pub fn state(&self) -> &Array {
        &self.key
    }
}
