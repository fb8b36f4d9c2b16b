//! `bench --memory`: where one single-sequence generation's memory goes. One extra trial measures
//! the model's resident bytes before it, then prefill and decode separately: each phase's peak,
//! the KV cache's bytes at its end, and the transient rest (activations, attention scores, logits,
//! the sampling chain's arrays): peak - model - KV cache. All in MLX's accounting plus the weights
//! it uses in place in mapped files (see `mlx::runtime::peak_memory`), i.e. what mlx-lm's peak
//! would count.
use anyhow::Result;
use engine::{GenerateConfig, Generator, LoadedModel};
use serde::Serialize;

/// Bytes, as the report gives them.
#[derive(Serialize, Clone, Copy, Default)]
pub struct Phase {
    /// MLX's peak during the phase (with the in-place weights).
    pub peak_bytes: u64,
    /// The KV cache's buffers at the end of the phase.
    pub kv_cache_bytes: u64,
    /// peak - model - KV cache: the phase's largest transient.
    pub transient_bytes: u64,
}

#[derive(Serialize)]
pub struct Breakdown {
    /// Bytes of tensor data in the checkpoint's files.
    pub weights_file_bytes: u64,
    /// MLX's active memory plus the in-place weights before the trial: the model as resident
    /// (fused projections, dequantized or converted tensors and constants included).
    pub model_bytes: u64,
    pub prefill: Phase,
    pub decode: Phase,
}

fn kv_bytes(cache: &[Box<dyn engine::cache::KvCache>]) -> u64 {
    cache.iter().map(|c| c.nbytes() as u64).sum()
}

fn phase(model: u64, kv: u64) -> Phase {
    let peak = mlx::runtime::peak_memory() as u64;
    Phase { peak_bytes: peak, kv_cache_bytes: kv, transient_bytes: peak.saturating_sub(model + kv) }
}

/// One generation of `config`'s tokens over `prompt` in `cache`, measured phase by phase.
pub fn breakdown(loaded: &LoadedModel, prompt: &[u32], cache: Vec<Box<dyn engine::cache::KvCache>>, config: GenerateConfig) -> Result<Breakdown> {
    mlx::runtime::synchronize()?;
    mlx::runtime::clear_cache();
    let model = (mlx::runtime::active_memory() + mlx::runtime::external_memory()) as u64;
    mlx::runtime::reset_peak_memory();
    let mut generator = Generator::new(loaded.model.as_ref(), prompt, cache, config)?;
    // The first token: prefill and the first sample, evaluated.
    let first = generator.next().transpose()?;
    mlx::runtime::synchronize()?;
    let prefill = phase(model, kv_bytes(generator.cache()));
    mlx::runtime::reset_peak_memory();
    if first.is_some() {
        for step in generator.by_ref() {
            step?;
        }
    }
    mlx::runtime::synchronize()?;
    let decode = phase(model, kv_bytes(generator.cache()));
    Ok(Breakdown { weights_file_bytes: loaded.weights.bytes, model_bytes: model, prefill, decode })
}

/// The table line: `Memory: model=… MB (file …), prefill peak=… (KV …, transient …), decode peak=…`.
pub fn line(b: &Breakdown) -> String {
    let mb = |x: u64| x as f64 / 1e6;
    format!(
        "Memory: model={:.1} MB (weights in files {:.1} MB), prefill peak={:.1} MB (KV cache {:.1}, transient {:.1}), decode peak={:.1} MB (KV cache {:.1}, transient {:.1})",
        mb(b.model_bytes),
        mb(b.weights_file_bytes),
        mb(b.prefill.peak_bytes),
        mb(b.prefill.kv_cache_bytes),
        mb(b.prefill.transient_bytes),
        mb(b.decode.peak_bytes),
        mb(b.decode.kv_cache_bytes),
        mb(b.decode.transient_bytes)
    )
}
