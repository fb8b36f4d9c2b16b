//! Attention for a few query positions at a time on the GPU, composed of plain operations.
//!
//! MLX's CUDA backend runs a multi-position `scaled_dot_product_attention` through cuDNN, building
//! (and caching) one cuDNN graph per distinct query/key shape. Speculative verification (K+1
//! positions over a cache one round longer each time) and a server's prefill of prompts of every
//! length meet a new shape almost every call, and a graph build costs far more than the attention
//! itself: measured on the H200 (Qwen3-0.6B shape, prompt lookup with 9 positions per round),
//! 34 tok/s with cuDNN against 438 with `MLX_CUDA_USE_CUDNN_SDPA=0`. Up to [`composed_max`] query
//! positions we therefore compute what MLX's own fallback computes (scaled q kᵀ, the mask,
//! a precise softmax, times v; grouped query heads folded into the query positions rather than
//! k and v broadcast over them), whose kernels need no per-shape preparation; also for one position
//! with an array mask (a continuous batch's padded rows), which MLX would send to cuDNN too. One
//! position without a mask (single-stream decode), a single sequence's prompt prefill
//! ([`with_fused_attention`]) and the CPU keep MLX's fused kernels, so their results are mlx-lm's.
use crate::error::Result;
use mlx::fast::{self, Mask};
use mlx::{ops, Array, Dtype};
use std::sync::atomic::{AtomicI32, Ordering};

/// Score elements (B x Hq x L x S) up to which attention may be composed: 0.5 GiB in bfloat16,
/// as much again for the softmax.
const COMPOSED_MAX_SCORES: i64 = 1 << 28;

/// Query positions up to which the GPU uses the composed attention; 0 until the GPU is chosen.
static COMPOSED_MAX: AtomicI32 = AtomicI32::new(0);

/// Query positions (more than one) up to which attention is composed of plain operations (GPU).
pub fn set_composed_max(n: i32) {
    COMPOSED_MAX.store(n, Ordering::Relaxed);
}

pub fn composed_max() -> i32 {
    COMPOSED_MAX.load(Ordering::Relaxed)
}

thread_local! {
    /// Inside [`with_fused_attention`]: MLX's own kernels whatever `composed_max` says.
    static FUSED_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every attention through MLX's `scaled_dot_product_attention`, as mlx-lm computes
/// it: a single sequence's prompt prefill (one shape per prompt, so no graph build per call to
/// avoid), whose short prompts would otherwise take the composed path and so part from mlx-lm's
/// GPU tokens by a bf16 rounding now and then.
pub fn with_fused_attention<T>(f: impl FnOnce() -> T) -> T {
    let before = FUSED_ONLY.with(|c| c.replace(true));
    let out = f();
    FUSED_ONLY.with(|c| c.set(before));
    out
}

/// Query positions up to which the composed attention may run as [`fast::sdpa_few`] on CUDA: a
/// batch decode step (1) and a speculative verification (K+1). A newcomers' prefill chunk (hundreds
/// of positions) stays composed: the kernel scans every key once a query on CUDA cores, where
/// cuBLAS's products use the tensor cores.
const FEW_MAX_POSITIONS: i32 = 16;

/// Whether the few-position attention the GPU composes runs as one CUDA kernel of ours instead
/// ([`fast::sdpa_few`]: one kernel a layer where the composed path has five and two cuBLAS
/// products): `MLX_GEN_ATTN_KERNEL=1`. Off by default: measured (BENCHMARKS.md, 2026-12-06c)
/// a Qwen3-0.6B batch step of 2 / 4 rows is 1.3-1.4x faster with it, but the server at 8
/// and 32 streams was 0.82-0.92x on the H100 (1.11x at 32 on the H200) and a verification of 9
/// positions slower (Llama-3.2-3B shape 11.5 against 9.8 ms a round), then through MLX's
/// custom-kernel API; now launched by the shim's own primitive (jit.cpp), to be measured again.
fn few_kernel() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLX_GEN_ATTN_KERNEL").is_ok_and(|v| v == "1"))
}

/// Whether this thread is inside [`with_fused_attention`] (a single sequence's prompt prefill): MLX's
/// own kernels there, attention and quantized products alike (see [`crate::nn::quant`]).
pub fn mlx_kernels_only() -> bool {
    FUSED_ONLY.with(std::cell::Cell::get)
}

/// softmax(q kᵀ · scale + mask) v for q (B, Hq, L, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv).
pub fn sdpa(q: &Array, k: &Array, v: &Array, scale: f32, mask: Mask<'_>) -> Result<Array> {
    let max = if mlx_kernels_only() { 0 } else { composed_max() };
    let l = q.dim(2);
    // One position with an array mask (a batch of rows of different lengths) would also go to
    // cuDNN, with a graph per cache length, i.e. per step; one position without one takes MLX's
    // vector kernel, which needs nothing per shape.
    // The composed attention holds its scores (B, Hq, L, S) and their softmax; past
    // COMPOSED_MAX_SCORES (a server's 2048-position chunk deep into a long prompt) MLX's own kernel
    // takes it, graph build and all, rather than gigabytes of scores per layer.
    let scores = i64::from(q.dim(0)) * i64::from(q.dim(1)) * i64::from(l) * i64::from(k.dim(2));
    let composed = scores <= COMPOSED_MAX_SCORES
        && match mask {
            Mask::Array(_) => l <= max,
            _ => l > 1 && l <= max,
        };
    if !composed {
        return Ok(fast::sdpa(q, k, v, scale, mask)?);
    }
    if l <= FEW_MAX_POSITIONS && few_kernel() && fast::sdpa_few_available(q, k, v) {
        return Ok(fast::sdpa_few(q, k, v, scale, mask)?);
    }
    composed_attention(q, k, v, scale, mask)
}

/// Key positions the composed attention pads its keys to a multiple of (0: no padding), from
/// `MLX_GEN_KEY_BUCKET` (off until measured on the GPU). MLX's CUDA matmul builds a cuBLAS plan per
/// call and its CUDA graphs are keyed by the kernels they hold, so attention over a cache one
/// position longer each call (a verification per round, a batch's decode step) meets a new shape
/// every time; padded keys (zeros, masked out) keep the shape for a whole bucket.
fn key_bucket() -> i32 {
    static BUCKET: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *BUCKET.get_or_init(|| std::env::var("MLX_GEN_KEY_BUCKET").ok().and_then(|v| v.parse().ok()).filter(|&n: &i32| n > 1).unwrap_or(0))
}

/// MLX's fallback attention (no sinks), operation for operation; with [`key_bucket`], over keys
/// padded to the bucket.
fn composed_attention(q: &Array, k: &Array, v: &Array, scale: f32, mask: Mask<'_>) -> Result<Array> {
    composed_attention_in(q, k, v, scale, mask, key_bucket())
}

fn composed_attention_in(q: &Array, k: &Array, v: &Array, scale: f32, mask: Mask<'_>, bucket: i32) -> Result<Array> {
    let (b, hq, hkv, s, l) = (q.dim(0), q.dim(1), k.dim(1), k.dim(2), q.dim(2));
    let rep = hq / hkv;
    let q = q.mul(&Array::scalar(f64::from(scale), q.dtype())?)?;
    let (mut k, mut v) = (k.clone(), v.clone());
    // Keys (and values) padded with zeros to the bucket: (B, Hkv, S + pad, D); the padded columns
    // are masked below.
    let pad = if bucket > 1 { (s + bucket - 1) / bucket * bucket - s } else { 0 };
    let padded_mask;
    let mask = if pad > 0 {
        k = k.pad(&[(0, 0), (0, 0), (0, pad), (0, 0)], 0.0)?;
        v = v.pad(&[(0, 0), (0, 0), (0, pad), (0, 0)], 0.0)?;
        let widths = |m: &Array| -> Vec<(i32, i32)> { (0..m.ndim()).map(|i| if i + 1 == m.ndim() { (0, pad) } else { (0, 0) }).collect() };
        match mask {
            // Causal: query i sees keys up to s - l + i, so the padded keys are masked already.
            Mask::Causal => Mask::Causal,
            Mask::None => {
                padded_mask = ops::arange(0.0, f64::from(s + pad), 1.0, Dtype::I32)?.lt_scalar(f64::from(s))?; // (S + pad,)
                Mask::Array(&padded_mask)
            }
            Mask::Array(m) if m.dtype() == Dtype::Bool => {
                padded_mask = m.pad(&widths(m), 0.0)?;
                Mask::Array(&padded_mask)
            }
            Mask::Array(m) => {
                padded_mask = m.pad(&widths(m), m.dtype().finfo_min())?;
                Mask::Array(&padded_mask)
            }
        }
    } else {
        mask
    };
    let (real, s) = (s, s + pad);
    // Grouped query heads against their key/value head. MLX's fallback broadcasts k and v over a
    // group axis, (B, Hkv, rep, L, D) against (B, Hkv, 1, S, D), and MLX's CUDA matmul cannot
    // collapse that batch: unless it takes its matrix-vector kernel (one query position against
    // keys of a multiple of 32 dims: q kᵀ of a decode step), it launches one cuBLAS product per
    // row and key/value head (7k launches a step for 32 rows of a 28-layer model). So the group is
    // folded into the query positions, (B, Hkv, rep * L, D) against (B, Hkv, S, D), one batched
    // product, wherever the broadcast would not be one launch anyway. The same dot products.
    let d = q.dim(-1);
    let mut scores = if rep > 1 && l == 1 && d % 32 == 0 {
        q.reshape(&[b, hkv, rep, l, d])?.matmul(&k.expand_dims(&[2])?.swapaxes(-1, -2)?)? // (B, Hkv, rep, L, S)
    } else if rep > 1 {
        q.reshape(&[b, hkv, rep * l, d])?.matmul(&k.swapaxes(-1, -2)?)?.reshape(&[b, hkv, rep, l, s])? // (B, Hkv, rep, L, S)
    } else {
        q.matmul(&k.swapaxes(-1, -2)?)? // (B, H, L, S)
    };
    let min = Array::scalar(scores.dtype().finfo_min(), scores.dtype())?;
    let as_scores = |m: Array| -> Result<Array> {
        // A (B|1, Hq|1, L, S) mask against (B, Hkv, rep, L, S) scores.
        if rep > 1 && m.ndim() >= 3 {
            if m.dim(-3) == 1 {
                return Ok(m.expand_dims(&[-3])?);
            }
            let mut shape = m.shape();
            let n = shape.len();
            shape.splice(n - 3..n - 2, [hkv, rep]);
            return Ok(m.reshape(&shape)?);
        }
        Ok(m)
    };
    match mask {
        Mask::None => {}
        Mask::Causal => scores = ops::where_(&causal_keep(real, l, s)?, &scores, &min)?,
        Mask::Array(m) if m.dtype() == Dtype::Bool => scores = ops::where_(&as_scores(m.clone())?, &scores, &min)?,
        Mask::Array(m) => scores = scores.add(&as_scores(m.astype(scores.dtype())?)?)?,
    }
    let probs = scores.softmax(&[-1], true)?;
    let probs = if rep > 1 { probs.reshape(&[b, hkv, rep * l, s])? } else { probs };
    let out = probs.matmul(&v)?; // (B, Hkv, rep * L, Dv)
    Ok(if rep > 1 { out.reshape(&[b, hq, l, -1])? } else { out })
}

/// A causal mask built by [`causal_keep`]: its (keys, queries, columns) and the mask.
type CausalMask = ((i32, i32, i32), Array);

thread_local! {
    /// The last causal mask built.
    static CAUSAL: std::cell::RefCell<Option<CausalMask>> = const { std::cell::RefCell::new(None) };
}

/// The causal mask (L, S) of `l` queries ending at key `real` over `s` key columns: query i sees
/// the keys up to real - l + i (never a padded one). Every layer of a forward pass asks the same,
/// so the last one built is handed out again: one array (three kernels) a pass instead of a layer.
fn causal_keep(real: i32, l: i32, s: i32) -> Result<Array> {
    let key = (real, l, s);
    if let Some(m) = CAUSAL.with(|c| c.borrow().as_ref().filter(|(k, _)| *k == key).map(|(_, m)| m.clone())) {
        return Ok(m);
    }
    let qi = ops::arange(f64::from(real - l), f64::from(real), 1.0, Dtype::I32)?.expand_dims(&[1])?;
    let ki = ops::arange(0.0, f64::from(s), 1.0, Dtype::I32)?.expand_dims(&[0])?;
    let m = qi.ge(&ki)?; // (L, S)
    CAUSAL.with(|c| *c.borrow_mut() = Some((key, m.clone())));
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(shape: &[i32], key: u64) -> Array {
        let k = mlx::random::key(key).unwrap();
        mlx::random::uniform_with_key(shape, Dtype::F32, &k).unwrap().sub(&Array::scalar(0.5, Dtype::F32).unwrap()).unwrap()
    }

    #[test]
    fn composed_attention_equals_mlx_s() {
        // (query heads, kv heads, query positions, keys, head dims): 32 dims and one position take
        // the broadcast scores (MLX's matrix-vector kernel on CUDA), the others the folded ones.
        let cases = [(4, 4, 5, 5, 16), (4, 2, 3, 11, 16), (6, 2, 8, 8, 16), (4, 1, 2, 40, 16), (4, 2, 1, 9, 16), (12, 4, 1, 7, 32), (6, 2, 1, 9, 32), (6, 2, 5, 9, 32)];
        for (hq, hkv, l, s, d) in cases {
            let (q, k, v) = (rand(&[2, hq, l, d], 1), rand(&[2, hkv, s, d], 2), rand(&[2, hkv, s, 8], 3));
            let bool_mask = rand(&[2, 1, l, s], 4).gt_scalar(-0.3).unwrap();
            let add_mask = rand(&[1, hq, l, s], 5);
            for mask in [Mask::None, Mask::Causal, Mask::Array(&bool_mask), Mask::Array(&add_mask)] {
                let want = fast::sdpa(&q, &k, &v, 0.25, mask).unwrap().to_vec::<f32>().unwrap();
                // Unpadded, and with the keys padded to buckets of 4 and 16 positions.
                for bucket in [0, 4, 16] {
                    let got = composed_attention_in(&q, &k, &v, 0.25, mask, bucket).unwrap();
                    assert_eq!(got.shape(), vec![2, hq, l, 8]);
                    let got = got.to_vec::<f32>().unwrap();
                    let diff = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                    assert!(diff < 1e-6, "hq {hq} hkv {hkv} l {l} s {s} {mask:?} bucket {bucket}: max diff {diff}");
                }
            }
        }
    }
}
