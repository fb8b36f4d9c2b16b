//! Attention masks as mlx-lm builds them: `create_causal_mask` (models/base.py) and the caches'
//! `create_attention_mask` (models/cache.py).
use crate::error::Result;
use mlx::fast::Mask;
use mlx::{ops, Array, Dtype};

/// What `cache.make_mask` returns: nothing, the string "causal", or a boolean array.
#[derive(Clone, Debug)]
pub enum CacheMask {
    None,
    Causal,
    Array(Array),
}

impl CacheMask {
    pub fn as_mask(&self) -> Mask<'_> {
        match self {
            CacheMask::None => Mask::None,
            CacheMask::Causal => Mask::Causal,
            CacheMask::Array(a) => Mask::Array(a),
        }
    }
}

/// (n, offset + n) booleans: query `offset + i` may see key `j` (within `window_size` if given).
pub fn create_causal_mask(n: i32, offset: i32, window_size: Option<i32>) -> Result<Array> {
    let rinds = ops::arange(0.0, f64::from(offset + n), 1.0, Dtype::I32)?;
    let linds = if offset != 0 { ops::arange(f64::from(offset), f64::from(offset + n), 1.0, Dtype::I32)? } else { rinds.clone() };
    let linds = linds.expand_dims(&[1])?;
    let rinds = rinds.expand_dims(&[0])?;
    let mut mask = linds.ge(&rinds)?;
    if let Some(w) = window_size {
        mask = mask.logical_and(&linds.lt(&rinds.add_scalar(f64::from(w))?)?)?;
    }
    Ok(mask)
}

/// models/cache.py's `create_attention_mask(N, offset, return_array, window_size)`.
pub fn create_attention_mask(n: i32, offset: i32, return_array: bool, window_size: Option<i32>) -> Result<CacheMask> {
    if window_size.is_some() {
        Ok(CacheMask::Array(create_causal_mask(n, offset, window_size)?))
    } else if n == 1 {
        Ok(CacheMask::None)
    } else if return_array {
        Ok(CacheMask::Array(create_causal_mask(n, offset, None)?))
    } else {
        Ok(CacheMask::Causal)
    }
}
