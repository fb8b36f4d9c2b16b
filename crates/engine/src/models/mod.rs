//! The model trait and the registry from config.json's `model_type` to an architecture file.
pub mod deepseek_v2;
pub mod deepseek_v3;
pub mod deepseek_v32;
pub mod deepseek_v41;
mod hf_quant;
pub mod llama;
pub mod mistral4;
pub mod mixtral;
pub mod llama4;
pub mod llama4_text;
pub mod ministral3;
pub mod mistral3;
pub mod qwen2;
pub mod qwen2_moe;
pub mod qwen3;
pub mod qwen3_moe;
pub mod qwen3_next;
pub mod qwen3_5;
pub mod qwen3_5_moe;
mod stack;
mod transformer;

pub use transformer::CacheLayout;

use crate::cache::{GrowingCache, KvCache, RotatingCache};
use crate::error::{EngineError, Result};
use crate::nn::QuantConfig;
use checkpoint::Weights;
use mlx::Array;
use std::collections::{BTreeMap, HashMap};

/// A loaded language model.
pub trait Model {
    fn model_type(&self) -> &str;
    fn vocab_size(&self) -> i32;
    /// Every weight array, for evaluation at load and memory accounting.
    fn parameters(&self) -> Vec<&Array>;
    /// One fresh cache per layer.
    fn make_cache(&self) -> Vec<Box<dyn KvCache>>;
    /// mlx-lm's `make_prompt_cache(model, max_kv_size)`: rotating caches (keep 4) of `max_kv_size`
    /// positions unless the model makes its own caches.
    fn make_prompt_cache(&self, max_kv_size: Option<i32>) -> Vec<Box<dyn KvCache>> {
        let _ = max_kv_size;
        self.make_cache()
    }
    /// Keeps only this rank's part of the weights for tensor parallel over `group` (see
    /// [`crate::shard`]); architectures without it refuse.
    fn shard(&mut self, group: &mlx::distributed::Group) -> Result<()> {
        Err(EngineError::Config(format!(
            "tensor parallel over {} ranks is not supported for model_type {} yet",
            group.size(),
            self.model_type()
        )))
    }
    /// Runs as pipeline stage `stage` (see [`crate::pipeline`]): the model was built from weights
    /// restricted to the stage's layers ([`Weights::keep_layers`]) and holds only those, one cache
    /// each; architectures without it refuse.
    fn pipeline(&mut self, stage: crate::pipeline::Stage) -> Result<()> {
        let _ = stage;
        Err(EngineError::Config(format!("pipeline parallel is not supported for model_type {} yet", self.model_type())))
    }
    /// tokens (B, L) -> logits (B, L, vocab), appending to `cache`.
    fn forward(&self, tokens: &Array, cache: &mut [Box<dyn KvCache>]) -> Result<Array>;
}

/// mlx-lm's `make_prompt_cache` for a model without `make_cache`.
pub(crate) fn default_caches(n: usize, max_kv_size: Option<i32>) -> Vec<Box<dyn KvCache>> {
    (0..n)
        .map(|_| match max_kv_size {
            Some(m) => Box::new(RotatingCache::new(m, 4)) as Box<dyn KvCache>,
            None => Box::new(GrowingCache::new()) as Box<dyn KvCache>,
        })
        .collect()
}

pub(crate) fn check_caches(cache: &[Box<dyn KvCache>], layers: usize) -> Result<()> {
    if cache.len() != layers {
        return Err(EngineError::Invalid(format!("{} caches for {layers} layers", cache.len())));
    }
    Ok(())
}

/// An architecture's config struct from config.json, as an error naming the bad field.
pub(crate) fn parse_config<T: serde::de::DeserializeOwned>(config: &serde_json::Value) -> Result<T> {
    serde_json::from_value(config.clone()).map_err(|e| EngineError::Config(e.to_string()))
}

/// `#[serde(default = "crate::models::default_true")]`: Hugging Face fields that default to true.
pub(crate) fn default_true() -> bool {
    true
}

/// Python truthiness of a config value (`if x:`).
pub(crate) fn truthy(v: &serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

type Loader = fn(&serde_json::Value, &mut Weights, &QuantConfig) -> Result<Box<dyn Model>>;

/// `model_type` -> loader; aliases as in mlx-lm (`mistral` is llama).
const REGISTRY: &[(&str, Loader)] = &[
    ("llama", llama::load),
    ("mistral", llama::load),
    ("qwen2", qwen2::load),
    ("qwen3", qwen3::load),
    ("deepseek_v2", deepseek_v2::load),
    ("deepseek_v3", deepseek_v3::load),
    ("deepseek_v32", deepseek_v32::load),
    ("deepseek_v41", deepseek_v41::load),
    ("qwen2_moe", qwen2_moe::load),
    ("qwen3_moe", qwen3_moe::load),
    ("mixtral", mixtral::load),
    ("mistral4", mistral4::load),
    ("ministral3", ministral3::load),
    ("mistral3", mistral3::load),
    ("llama4_text", llama4_text::load),
    ("llama4", llama4::load),
    ("qwen3_next", qwen3_next::load),
    ("qwen3_5", qwen3_5::load),
    ("qwen3_5_moe", qwen3_5_moe::load),
];

/// mlx-lm's `Model.sanitize` for a Hugging Face float checkpoint of `model_type`, as `mlx-gen
/// convert` applies it before writing (the CLI hands it to `formats::convert` as its `ModelRules`).
pub fn sanitize(model_type: &str, config: &serde_json::Map<String, serde_json::Value>, weights: &mut BTreeMap<String, Array>) -> Result<()> {
    // The mixture-of-experts files' own `sanitize`, which also stacks the experts.
    type Sanitize = fn(&serde_json::Value, &mut Weights) -> Result<()>;
    let own: Option<Sanitize> = match model_type {
        "qwen2_moe" => Some(qwen2_moe::sanitize),
        "qwen3_moe" => Some(qwen3_moe::sanitize),
        "mixtral" => Some(mixtral::sanitize),
        "mistral4" => Some(mistral4::sanitize),
        "deepseek_v32" => Some(deepseek_v32::sanitize),
        "deepseek_v41" => Some(deepseek_v41::sanitize),
        "qwen3_next" => Some(qwen3_next::sanitize),
        _ => None,
    };
    if let Some(f) = own {
        let mut w = Weights::from_map(std::mem::take(weights).into_iter().collect());
        f(&serde_json::Value::Object(config.clone()), &mut w)?;
        *weights = w.into_map().into_iter().collect();
        return Ok(());
    }
    let whole = || serde_json::Value::Object(config.clone());
    // Whether the head is tied when config.json does not say (the architecture's default).
    let tie_default = match model_type {
        "ministral3" => return ministral3::sanitize(&whole(), weights),
        "mistral3" => return mistral3::sanitize(&whole(), weights),
        "llama4" => return llama4::sanitize(&whole(), weights),
        "qwen3_5" => return qwen3_5::sanitize(weights),
        "qwen3_5_moe" => return qwen3_5_moe::sanitize(weights),
        "llama4_text" => return Ok(()), // llama4_text.py has no sanitize
        "llama" | "mistral" | "qwen2" => Some(true),
        "qwen3" => None,
        other => {
            return Err(EngineError::UnsupportedModel {
                found: other.to_owned(),
                supported: "llama, mistral, qwen2, qwen3, qwen2_moe, qwen3_moe, mixtral, mistral4, deepseek_v32, deepseek_v41, ministral3, mistral3, llama4, llama4_text, qwen3_next, qwen3_5, qwen3_5_moe".into(),
            })
        }
    };
    let tie = config.get("tie_word_embeddings").and_then(serde_json::Value::as_bool).or(tie_default).ok_or_else(|| {
        EngineError::Config(format!("{model_type} config.json needs tie_word_embeddings"))
    })?;
    if model_type != "qwen3" {
        weights.retain(|k, _| !k.contains("self_attn.rotary_emb.inv_freq"));
    }
    if tie {
        weights.remove("lm_head.weight");
    }
    Ok(())
}

/// The architecture's own quantization of the layer at `path` when converting (mlx-lm's
/// per-model `quant_predicate`); `None`: the conversion's.
pub fn quant_override(model_type: &str, path: &str) -> Option<mlx::ops::QuantSpec> {
    match model_type {
        "qwen3_moe" => qwen3_moe::quant_override(path),
        "qwen3_next" | "qwen3_5" | "qwen3_5_moe" => qwen3_next::quant_override(path),
        _ => None,
    }
}

/// Whether mlx-lm quantizes `model_type`'s `{layer}.weight` when converting: not DeepSeek's router
/// (`MoEGate` / `Router` hold a plain matrix, not a Linear).
pub fn quantizable(model_type: &str, layer: &str) -> bool {
    !(matches!(model_type, "deepseek_v32" | "deepseek_v41") && layer.ends_with(".mlp.gate"))
}

/// Whether `model_type`'s mlx-lm class keeps the parameter `name` in its own dtype when
/// converting (its `cast_predicate` says no cast), e.g. DeepSeek's float32 router bias.
pub fn keeps_dtype(model_type: &str, name: &str) -> bool {
    match model_type {
        "deepseek_v32" => name.contains("e_score_correction_bias"),
        // The reference runtime keeps these in float32.
        "deepseek_v41" => ["attn_hc.", "ffn_hc.", "sinks", "e_score_correction_bias", "compressor."].iter().any(|k| name.contains(k)),
        "qwen3_5" | "qwen3_5_moe" => name.ends_with("A_log"),
        _ => false,
    }
}

/// What `model_type`'s mlx-lm config class writes into the config dict itself, so that
/// `mlx_lm.convert` saves it (the CLI hands it to `formats::convert` with [`sanitize`]).
pub fn update_config(model_type: &str, config: &mut serde_json::Map<String, serde_json::Value>) {
    match model_type {
        "mistral3" => mistral3::update_config(config),
        "qwen3_5" | "qwen3_5_moe" => qwen3_5::update_config(config),
        _ => {}
    }
}

/// A checkpoint's tensor shapes by name as `model_type`'s `sanitize` leaves them (for
/// `--seed`'s count of the draws mlx-lm makes at load): DeepSeek's multi-token-prediction layers
/// (index >= num_hidden_layers) dropped, V4.1's published names mapped; else unchanged.
pub fn sanitized_shapes(config: &serde_json::Value, mut shapes: HashMap<String, Vec<i64>>) -> HashMap<String, Vec<i64>> {
    match config.get("model_type").and_then(|t| t.as_str()) {
        Some("deepseek_v41") => deepseek_v41::sanitized_shapes(shapes),
        Some("deepseek_v3" | "deepseek_v32") => {
            let n = config.get("num_hidden_layers").and_then(serde_json::Value::as_i64).unwrap_or(i64::MAX);
            shapes.retain(|k, _| {
                let parts: Vec<&str> = k.split('.').collect();
                !(parts.len() >= 3 && parts[1] == "layers" && parts[2].parse::<i64>().is_ok_and(|i| i >= n))
            });
            shapes
        }
        _ => shapes,
    }
}

/// How many randomly initialised modules `model_type`'s mlx-lm class makes for the checkpoint
/// tensor `{base}.weight` of `rank` dimensions (see `sample::seed`): by default one for a matrix
/// or a quantized layer, none for norms and other vectors (ones or zeros).
pub fn init_modules(model_type: &str, base: &str, rank: usize, quantized: bool) -> usize {
    match model_type {
        "deepseek_v3" | "deepseek_v32" if rank == 2 || quantized => deepseek_v3::init_modules(base),
        // Its routers start as zeros; o_a_proj and the experts are SwitchLinears (3-D).
        "deepseek_v41" if base.ends_with(".mlp.gate") => 0,
        "deepseek_v41" => usize::from(rank >= 2 || quantized),
        _ => usize::from(rank == 2 || quantized),
    }
}

/// Every `model_type` the registry loads.
pub fn supported_model_types() -> Vec<&'static str> {
    REGISTRY.iter().map(|(name, _)| *name).collect()
}

/// The architecture `model_type` from `config` (a wrapper's text model, say), not yet checked for
/// unused tensors.
pub(crate) fn load_as(model_type: &str, config: &serde_json::Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    let (_, loader) = REGISTRY.iter().find(|(name, _)| *name == model_type).ok_or_else(|| {
        EngineError::UnsupportedModel { found: model_type.to_owned(), supported: supported_model_types().join(", ") }
    })?;
    loader(config, weights, q)
}

/// Runs a `sanitize` written over a name -> tensor map (as `convert` calls it) on the checkpoint.
pub(crate) fn sanitize_weights(weights: &mut Weights, f: impl FnOnce(&mut BTreeMap<String, Array>) -> Result<()>) -> Result<()> {
    let mut map = BTreeMap::new();
    for name in weights.names() {
        if let Some(a) = weights.remove(&name) {
            map.insert(name, a);
        }
    }
    f(&mut map)?;
    for (name, a) in map {
        weights.insert(name, a);
    }
    Ok(())
}

/// Builds the architecture named by `config["model_type"]` from the checkpoint, strictly: every
/// expected tensor must be present with its shape, and every tensor present must be used.
pub fn build(config: &serde_json::Value, mut weights: Weights) -> Result<Box<dyn Model>> {
    let model_type = config
        .get("model_type")
        .and_then(|t| t.as_str())
        .ok_or_else(|| EngineError::Config("no model_type".into()))?;
    let q = QuantConfig::from_config(config)?;
    let model = load_as(model_type, config, &mut weights, &q)?;
    weights.finish()?;
    Ok(model)
}
