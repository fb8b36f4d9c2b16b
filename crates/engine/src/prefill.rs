//! The one prefill loop, mlx-lm's `_prefill` / `generate_step` prologue: every prompt position but
//! the last runs through the model in chunks of at most `prefill_step_size`; after each chunk the
//! caches are quantized if `--kv-bits` asks, evaluated, and MLX's buffer cache is cleared. The last
//! position is left to the caller, whose forward pass over it gives the first token's logits.
//! Used by the generator, speculative decoding (target and draft) and `bench`'s batched trial;
//! the batch engine's newcomers queue their chunks without waiting ([`queue_chunk`]).
use crate::cache::{maybe_quantize_kv_cache, KvCache, KvQuantConfig};
use crate::error::{EngineError, Result};
use crate::models::Model;
use mlx::Array;

/// One prefill forward pass of `chunk` (B, n) into `cache`: quantized when `kv_quant` says so,
/// evaluated, then MLX's buffer cache cleared (as mlx-lm after each chunk).
pub fn prefill_chunk(model: &dyn Model, cache: &mut [Box<dyn KvCache>], chunk: &Array, kv_quant: Option<&KvQuantConfig>) -> Result<()> {
    // MLX's own attention, as mlx-lm's prefill (see nn::sdpa::with_fused_attention).
    crate::nn::sdpa::with_fused_attention(|| model.forward(chunk, cache))?;
    maybe_quantize_kv_cache(cache, kv_quant)?;
    let state: Vec<Array> = cache.iter().flat_map(|c| c.state()).collect();
    mlx::eval(&state.iter().collect::<Vec<_>>())?;
    clear_buffer_cache();
    Ok(())
}

/// MLX's buffer cache cleared where the engine clears it (as mlx-lm: after each prefill chunk,
/// every 256 decoded tokens, speculative rounds or batch steps; the batch engine also every
/// [`BATCH_CLEAR_POSITIONS`] prefilled positions). `MLX_GEN_CLEAR_CACHE` is a measurement knob for
/// the GPU, where a cleared cache hands its memory back to CUDA (`cudaFreeAsync`, then the pool
/// trimmed) and the next forward pass allocates every buffer again (`cudaMallocAsync`), on the
/// host's path: `0` never clears, a byte count (`1073741824`, or with a suffix: `512m`, `1g`)
/// clears only when the cache holds more than that. Values are unchanged either way; only memory
/// held between steps is.
pub fn clear_buffer_cache() {
    static POLICY: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let bound = *POLICY.get_or_init(|| clear_policy(std::env::var("MLX_GEN_CLEAR_CACHE").ok().as_deref()));
    if let Some(bound) = bound {
        if bound == 0 || mlx::runtime::cache_memory() > bound {
            mlx::runtime::clear_cache();
        }
    }
}

/// `MLX_GEN_CLEAR_CACHE`'s value as the cached bytes past which [`clear_buffer_cache`] clears:
/// `Some(0)` (always) when unset, empty or unreadable, `None` (never) for `0`.
fn clear_policy(value: Option<&str>) -> Option<usize> {
    let v = value.map(str::trim).unwrap_or("").to_ascii_lowercase();
    if v == "0" {
        return None;
    }
    let (digits, scale) = match v.char_indices().last() {
        Some((i, 'k')) => (&v[..i], 1usize << 10),
        Some((i, 'm')) => (&v[..i], 1 << 20),
        Some((i, 'g')) => (&v[..i], 1 << 30),
        _ => (v.as_str(), 1),
    };
    Some(digits.parse::<usize>().ok().and_then(|n| n.checked_mul(scale)).unwrap_or(0))
}

/// [`prefill_chunk`] for the batch engine's groups of newcomers: the caches are queued
/// (`async_eval`), not waited for, so that the device runs the chunk while the host builds the next
/// step, and MLX's buffer cache is left alone (the engine clears it every
/// [`BATCH_CLEAR_POSITIONS`] positions: after each of a server's small chunks, as mlx-lm clears,
/// the GPU allocated every buffer of the next chunk again).
pub fn queue_chunk(model: &dyn Model, cache: &mut [Box<dyn KvCache>], chunk: &Array, kv_quant: Option<&KvQuantConfig>) -> Result<()> {
    model.forward(chunk, cache)?;
    maybe_quantize_kv_cache(cache, kv_quant)?;
    let state: Vec<Array> = cache.iter().flat_map(|c| c.state()).collect();
    mlx::async_eval(&state.iter().collect::<Vec<_>>())?;
    Ok(())
}

/// Layers a long forward pass (a prefill chunk of at least 256 positions) may queue ahead of the
/// device before it waits for the oldest: `MLX_GEN_PREFILL_LOOKAHEAD` (0: no bound), else the
/// default [`set_default_lookahead`] gave (none: the whole chunk is queued at once, as mlx-lm
/// does). MLX's CUDA backend keeps each queued kernel's arrays until the kernel has run, so a host
/// that queues a whole 2048-position chunk while the device works on its first layers holds many
/// layers' activations at once: on the H100 a bound of 2 took the Llama-3.2-3B shape's prompt-4096
/// peak from 9.29 to 3.77 GB (mlx-lm 6.85) and prefill from 20.0-20.4k to 21.3k tok/s (issue 22
/// item 4). Waiting changes no value, only when the host queues.
fn lookahead_layers(positions: i32) -> Option<usize> {
    static ENV: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let env = *ENV.get_or_init(|| std::env::var("MLX_GEN_PREFILL_LOOKAHEAD").ok().and_then(|v| v.trim().parse().ok()));
    let layers = env.unwrap_or_else(|| DEFAULT_LOOKAHEAD.load(std::sync::atomic::Ordering::Relaxed));
    (layers > 0 && positions >= 256).then_some(layers)
}

/// [`lookahead_layers`]' bound where `MLX_GEN_PREFILL_LOOKAHEAD` is unset; 0 (the default): none.
static DEFAULT_LOOKAHEAD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Sets the prefill's lookahead bound in layers (0: none) for when `MLX_GEN_PREFILL_LOOKAHEAD` is
/// unset (the CLI: 2 on CUDA).
pub fn set_default_lookahead(layers: usize) {
    DEFAULT_LOOKAHEAD.store(layers, std::sync::atomic::Ordering::Relaxed);
}

/// The bound of [`lookahead_layers`] over one forward pass: each layer's output is queued, and once
/// more than `layers` are in flight the oldest is waited for.
pub struct Lookahead {
    layers: Option<usize>,
    queued: std::collections::VecDeque<Array>,
}

impl Lookahead {
    /// For a forward pass over `positions` positions a row.
    pub fn new(positions: i32) -> Lookahead {
        Lookahead { layers: lookahead_layers(positions), queued: std::collections::VecDeque::new() }
    }

    /// After a layer: `h` (its output) queued; the device waited for while more than the bound are
    /// queued. Nothing without a bound.
    pub fn layer_done(&mut self, h: &Array) -> Result<()> {
        let Some(n) = self.layers else { return Ok(()) };
        mlx::async_eval(&[h])?;
        self.queued.push_back(h.clone());
        while self.queued.len() > n {
            let oldest = self.queued.pop_front().expect("more than n > 0 queued");
            mlx::eval(&[&oldest])?;
        }
        Ok(())
    }
}

/// Prompt positions the batch engine prefills between two clearings of MLX's buffer cache.
pub const BATCH_CLEAR_POSITIONS: usize = 2048;

/// Prefills every position of `prompt` (B, L) but the last into `cache`, in chunks of at most
/// `step` positions; `each` sees each chunk (B, n) after it ran (the token history of the logits
/// processors). Returns the last position, (B, 1), not yet in the cache.
pub fn prefill(
    model: &dyn Model,
    cache: &mut [Box<dyn KvCache>],
    prompt: &Array,
    step: usize,
    kv_quant: Option<&KvQuantConfig>,
    mut each: impl FnMut(&Array) -> Result<()>,
) -> Result<Array> {
    if step == 0 {
        return Err(EngineError::Invalid("prefill step size must be at least 1".into()));
    }
    let len = prompt.dim(1);
    if len < 1 {
        return Err(EngineError::Invalid("the prompt is empty: there is nothing to continue".into()));
    }
    let (t0, waits) = (std::time::Instant::now(), mlx::host_waits());
    let (mut start, mut chunks) = (0, 0);
    while len - start > 1 {
        let n = (step.min(i32::MAX as usize) as i32).min(len - 1 - start);
        let chunk = prompt.slice_axis(1, start, start + n)?; // (B, n)
        prefill_chunk(model, cache, &chunk, kv_quant)?;
        each(&chunk)?;
        start += n;
        chunks += 1;
    }
    if chunks > 0 && std::env::var_os("MLX_GEN_TRACE").is_some() {
        eprintln!(
            "trace: prefill {start} positions in {chunks} chunks, {:.1} ms, {} device waits",
            1e3 * t0.elapsed().as_secs_f64(),
            mlx::host_waits() - waits
        );
    }
    Ok(prompt.slice_axis(1, start, len)?) // (B, 1)
}

#[cfg(test)]
mod tests {
    use super::clear_policy;

    #[test]
    fn clear_policy_reads_never_always_and_byte_bounds() {
        assert_eq!(clear_policy(None), Some(0));
        assert_eq!(clear_policy(Some("")), Some(0));
        assert_eq!(clear_policy(Some("0")), None);
        assert_eq!(clear_policy(Some(" 0 ")), None);
        assert_eq!(clear_policy(Some("1")), Some(1));
        assert_eq!(clear_policy(Some("4096")), Some(4096));
        assert_eq!(clear_policy(Some("512m")), Some(512 << 20));
        assert_eq!(clear_policy(Some("1G")), Some(1 << 30));
        assert_eq!(clear_policy(Some("8k")), Some(8 << 10));
        assert_eq!(clear_policy(Some("lots")), Some(0));
    }
}
