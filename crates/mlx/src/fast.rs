//! MLX's fused kernels (`mlx::core::fast`): RMS norm, layer norm, RoPE and attention.
use crate::array::Array;
use crate::error::{ctx, Result};
use mlx_sys as sys;

/// `silu(gate) * up` as one fused kernel (mlx-lm's compiled `swiglu`).
#[track_caller]
pub fn swiglu(gate: &Array, up: &Array) -> Result<Array> {
    ctx("swiglu", sys::swiglu(gate.handle(), up.handle())).map(Array::from_handle)
}

/// mlx-lm's compiled `precise_swiglu(h, gate, x)`: `silu(gate) * x` in float32, cast to `h`'s dtype.
#[track_caller]
pub fn precise_swiglu(h: &Array, gate: &Array, x: &Array) -> Result<Array> {
    ctx("precise_swiglu", sys::precise_swiglu(h.handle(), gate.handle(), x.handle())).map(Array::from_handle)
}

/// gated_delta.py's compiled `compute_g`: `exp(-exp(A_log in float32) * softplus(a + dt_bias))`.
#[track_caller]
pub fn gated_delta_g(a_log: &Array, a: &Array, dt_bias: &Array) -> Result<Array> {
    ctx("gated_delta_g", sys::gated_delta_g(a_log.handle(), a.handle(), dt_bias.handle())).map(Array::from_handle)
}

pub use sys::GatedDelta;

/// The gated-delta recurrence, as `how` says:
/// - [`GatedDelta::Step`], gated_delta.py's compiled `_gated_delta_step_ops`: q, k (B, H, Dk),
///   v (B, H, Dv), g and beta (B, H), state (B, H, Dv, Dk), mask (B,) bool -> y (B, H, Dv) in q's
///   dtype and the new state (the old one where the mask is false);
/// - [`GatedDelta::Kernel`], a whole prompt as one GPU kernel (mlx-lm's Metal kernel, also on
///   CUDA; see [`gated_delta_kernel_available`]): q, k (B, T, Hk, Dk) per key head, v (B, T, Hv,
///   Dv), g and beta (B, T, Hv), state (B, Hv, Dv, Dk), mask (B, T) bool -> y (B, T, Hv, Dv) and
///   the new state. Its sums over Dk run in another order than the step's (float32 rounding apart).
#[track_caller]
#[allow(clippy::too_many_arguments)]
pub fn gated_delta(
    how: GatedDelta,
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: &Array,
    mask: Option<&Array>,
) -> Result<(Array, Array)> {
    let name = if how == GatedDelta::Kernel { "gated_delta_kernel" } else { "gated_delta_step" };
    let (y, s) = ctx(name, sys::gated_delta(how, q.handle(), k.handle(), v.handle(), g.handle(), beta.handle(), state.handle(), mask.map(Array::handle)))?;
    Ok((Array::from_handle(y), Array::from_handle(s)))
}

/// Whether [`GatedDelta::Kernel`] runs here (the default device is a CUDA or Metal GPU).
pub fn gated_delta_kernel_available() -> bool {
    sys::gated_delta_kernel_available()
}

/// `h = x + y` and `rms_norm(h, w, eps)`; with `kernel`, as one GPU kernel (rounding as MLX's two
/// kernels do on CUDA) where the default device is a CUDA or Metal GPU and the inputs suit it
/// (same shape and dtype, a floating dtype, w of the last axis's length), else as MLX's two
/// operations.
#[track_caller]
pub fn add_rms_norm(x: &Array, y: &Array, w: &Array, eps: f32, kernel: bool) -> Result<(Array, Array)> {
    let (h, out) = ctx("add_rms_norm", sys::add_rms_norm(x.handle(), y.handle(), w.handle(), eps, kernel))?;
    Ok((Array::from_handle(h), Array::from_handle(out)))
}

/// logits (rows, vocab) with every token whose bit is clear in its row's packed `words` (rows x
/// ceil(vocab / 32) words, bit t % 32 of word t / 32) set to -inf, as one CUDA kernel that reads the
/// words from page-locked host memory; `None` where that kernel does not run (the caller composes
/// the mask of MLX operations).
#[track_caller]
pub fn mask_tokens(logits: &Array, words: &[u32]) -> Result<Option<Array>> {
    Ok(ctx("mask_tokens", sys::mask_tokens(logits.handle(), words))?.map(Array::from_handle))
}

/// A mixture-of-experts router's choice from its logits (..., E) as one CUDA kernel: (expert
/// indices (..., k) uint32, weights (..., k) in the logits' dtype), rounding as MLX's kernels for
/// mlx-lm's operations do (route.cpp). `select_first` (mixtral): the k largest logits in
/// `argpartition(-g, kth=k-1)[..., :k]`'s order, then `softmax(precise=True)` over them. Otherwise
/// (qwen3_moe, qwen2_moe): `softmax(g, precise=True)`, the k largest in `argpartition(g,
/// kth=-k)[..., -k:]`'s order where `from_top`, else in `argpartition(-g, kth=k-1)[..., :k]`'s,
/// then with `normalize` each row divided by its sum; then each weight times `scale` in the
/// logits' dtype (`scores * routed_scaling_factor`; 1.0 for none). `None` where the kernel does not run (not a
/// CUDA GPU, other dtypes, more than 4096 experts or 32 chosen): the caller composes MLX's
/// operations.
#[track_caller]
pub fn moe_route(logits: &Array, k: i32, select_first: bool, from_top: bool, normalize: bool, scale: f32) -> Result<Option<(Array, Array)>> {
    Ok(ctx("moe_route", sys::moe_route(logits.handle(), k, select_first, from_top, normalize, scale))?
        .map(|(i, w)| (Array::from_handle(i), Array::from_handle(w))))
}

/// `x @ dequantize(w)ᵀ` for x (M, K) or (1, M, K): on a CUDA GPU, for 1 <= M <= 7 rows of bfloat16 or float16
/// and affine 4- or 8-bit weights in groups of 32, 64 or 128, one kernel of ours that reads each
/// weight once for all rows in 16-byte packs (MLX's reads it once a row up to 7 rows with a
/// matrix-vector kernel); it sums in another order than MLX's kernels. Anything else, 8 rows and
/// more among it (MLX's tiled product is faster there), is [`crate::ops::quantized_matmul`] with
/// the transpose.
#[track_caller]
pub fn qmm_rows(x: &Array, w: &Array, scales: &Array, biases: Option<&Array>, q: crate::ops::QuantSpec) -> Result<Array> {
    ctx("qmm_rows", sys::qmm_rows(x.handle(), w.handle(), scales.handle(), biases.map(Array::handle), q.group_size, q.bits, q.mode.name()))
        .map(Array::from_handle)
}

/// `x @ dequantize(w)ᵀ` for x (M, K) or (1, M, K) of 8-256 rows: on a CUDA GPU (sm_80 and later), for
/// bfloat16 or float16 x and affine 4-bit weights in groups of 32, 64 or 128 with K a multiple of 64,
/// one kernel of ours on the tensor cores that reads each weight once for all rows (MLX's tiled
/// product of 8-64 rows reads a 4-bit weight at about 100 GB/s on an H100); the weight dequantized to
/// x's type, float32 sums in another order than MLX's. Anything else is
/// [`crate::ops::quantized_matmul`] with the transpose.
#[track_caller]
pub fn qmm_mma(x: &Array, w: &Array, scales: &Array, biases: Option<&Array>, q: crate::ops::QuantSpec) -> Result<Array> {
    ctx("qmm_mma", sys::qmm_mma(x.handle(), w.handle(), scales.handle(), biases.map(Array::handle), q.group_size, q.bits, q.mode.name()))
        .map(Array::from_handle)
}

/// mlx-lm's `SwitchLinear` for a few tokens: (T, k, N) where slot (t, j) is x's row for it times
/// `dequantize(w[indices[t, j]])ᵀ`; x (T, K) (a token's row for each of its k experts) or
/// (T * k, K) (a row a slot), w the experts stacked (E, N, K packed), indices (T, k) uint32. On a
/// CUDA GPU, where [`qmm_rows`]'s kernel takes the weights, one kernel of the same design (a
/// block row a slot, each reading only its expert's weight); elsewhere MLX's `gather_qmm`.
#[track_caller]
pub fn gather_qmm_rows(x: &Array, w: &Array, scales: &Array, biases: Option<&Array>, indices: &Array, q: crate::ops::QuantSpec) -> Result<Array> {
    ctx(
        "gather_qmm_rows",
        sys::gather_qmm_rows(x.handle(), w.handle(), scales.handle(), biases.map(Array::handle), indices.handle(), q.group_size, q.bits, q.mode.name()),
    )
    .map(Array::from_handle)
}

/// Whether [`qmm_rows`] runs its kernel here (the default device is a CUDA GPU) for the products
/// it takes; elsewhere it is MLX's product.
pub fn qmm_rows_available() -> bool {
    sys::qmm_rows_available()
}

/// The value (address relative to the load base) of function `name` in the symbol table of the ELF
/// file at `path`, 0 where it has none: how the shim finds MLX's device allocator, a function
/// local to libmlx, for its kernels' outputs (unless `MLX_GEN_JIT_DEVICE_MEMORY=0`).
pub fn elf_function_value(path: &str, name: &str) -> Result<u64> {
    ctx("elf_function_value", sys::elf_function_value(path, name))
}

/// Compiles representative variants of the engine's own CUDA kernels (the few-row and gathered
/// quantized products, the residual add with the RMS norm, attention of a few positions, the
/// gated-delta recurrence; written without headers, as the GPU compiles them at first use) with the
/// NVRTC library at `nvrtc_library` for `sm_<arch>`: a check that needs no GPU. Returns how many
/// compiled; an error names the first that does not, with NVRTC's log.
pub fn check_kernel_sources(nvrtc_library: &str, arch: &str) -> Result<usize> {
    ctx("check_kernel_sources", sys::jit_check(nvrtc_library, arch))
}

/// Whether [`sdpa_few`] runs for q (B, Hq, L, D), k, v (B, Hkv, S, D): a CUDA GPU, 16- or 32-bit
/// floats, head dims a multiple of 32 up to 256.
pub fn sdpa_few_available(q: &Array, k: &Array, v: &Array) -> bool {
    sys::sdpa_few_available(q.handle(), k.handle(), v.handle())
}

/// softmax(q kᵀ · scale + mask) v for a few query positions as one CUDA kernel of ours (k and v
/// read in place through their strides; float32 scores and softmax): what a batch decode step and a
/// speculative verification compute in each layer, where MLX's CUDA backend would build a cuDNN
/// graph per shape. [`Mask::Array`] is boolean (keep) or additive, broadcastable to (B, Hq, L, S).
/// An error where [`sdpa_few_available`] is false.
#[track_caller]
pub fn sdpa_few(q: &Array, k: &Array, v: &Array, scale: f32, mask: Mask<'_>) -> Result<Array> {
    let (arr, causal) = match mask {
        Mask::None => (None, false),
        Mask::Causal => (None, true),
        Mask::Array(m) => (Some(m.handle()), false),
    };
    ctx("sdpa_few", sys::sdpa_few(q.handle(), k.handle(), v.handle(), scale, arr, causal)).map(Array::from_handle)
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
#[derive(Clone, Copy, Debug)]
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
