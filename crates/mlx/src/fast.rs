//! MLX's fused kernels (`mlx::core::fast`): RMS norm, layer norm, RoPE and attention.
use crate::array::Array;
use crate::error::{ctx, Result};
use mlx_sys as sys;

/// `silu(gate) * up` as one fused kernel (mlx-lm's compiled `swiglu`).
#[track_caller]
pub fn swiglu(gate: &Array, up: &Array) -> Result<Array> {
    ctx("swiglu", sys::swiglu(gate.handle(), up.handle())).map(Array::from_handle)
}

#[track_caller]
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
    ctx("rms_norm", sys::rms_norm(x.handle(), weight.map(Array::handle), eps)).map(Array::from_handle)
}

#[track_caller]
pub fn layer_norm(x: &Array, weight: Option<&Array>, bias: Option<&Array>, eps: f32) -> Result<Array> {
    ctx("layer_norm", sys::layer_norm(x.handle(), weight.map(Array::handle), bias.map(Array::handle), eps))
        .map(Array::from_handle)
}

/// Rotary embedding of the first `dims` features of `x` (..., seq, head_dim) at positions
/// `offset..`: frequencies from `base` or given explicitly as `freqs` (then `base` is None).
#[track_caller]
pub fn rope(
    x: &Array,
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    offset: i32,
    freqs: Option<&Array>,
) -> Result<Array> {
    ctx("rope", sys::rope(x.handle(), dims, traditional, base, scale, sys::RopeOffset::Same(offset), freqs.map(Array::handle)))
        .map(Array::from_handle)
}

/// [`rope`] with one position offset per batch row: `offsets` (B,) int32 for `x` (B, ..., seq, head_dim).
#[track_caller]
pub fn rope_rows(
    x: &Array,
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    offsets: &Array,
    freqs: Option<&Array>,
) -> Result<Array> {
    let offsets = sys::RopeOffset::Rows(offsets.handle());
    ctx("rope", sys::rope(x.handle(), dims, traditional, base, scale, offsets, freqs.map(Array::handle)))
        .map(Array::from_handle)
}

/// The attention mask argument of [`sdpa`].
#[derive(Clone, Debug)]
pub enum Mask<'a> {
    None,
    /// Causal, aligned to the end of the keys (queries are the last positions).
    Causal,
    /// A boolean (keep) or additive mask broadcastable to (batch, heads, q_len, k_len).
    Array(&'a Array),
}

/// softmax(q kᵀ · scale + mask) v for q (B, Hq, L, D), k and v (B, Hkv, S, D), grouped-query aware.
#[track_caller]
pub fn sdpa(q: &Array, k: &Array, v: &Array, scale: f32, mask: Mask<'_>) -> Result<Array> {
    let (mode, arr) = match mask {
        Mask::None => ("", None),
        Mask::Causal => ("causal", None),
        Mask::Array(a) => ("array", Some(a.handle())),
    };
    ctx("scaled_dot_product_attention", sys::sdpa(q.handle(), k.handle(), v.handle(), scale, mode, arr, None))
        .map(Array::from_handle)
}

/// [`sdpa`] with a boolean `mask` and per-head attention `sinks` (Hq,): each head's softmax also
/// counts one extra logit of that value, which attends to nothing.
#[track_caller]
pub fn sdpa_sinks(q: &Array, k: &Array, v: &Array, scale: f32, mask: &Array, sinks: &Array) -> Result<Array> {
    ctx("scaled_dot_product_attention", sys::sdpa(q.handle(), k.handle(), v.handle(), scale, "array", Some(mask.handle()), Some(sinks.handle())))
        .map(Array::from_handle)
}
