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
