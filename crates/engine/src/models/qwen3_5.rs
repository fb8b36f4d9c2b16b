//! `qwen3_5` (Qwen3.5 dense, and through [`super::qwen3_5_moe`] the MoE ones), as mlx-lm's
//! `models/qwen3_5.py`: the text model of `text_config` (or of the whole config when it has none),
//! with qwen3_next's hybrid layers ([`super::qwen3_next`]): gated DeltaNet layers with separate
//! `in_proj_qkv` / `in_proj_z` / `in_proj_b` / `in_proj_a` projections, gated full attention
//! every `full_attention_interval`-th layer with RoPE from `rope_parameters`, and routed experts
//! with a shared expert on every layer when `num_experts > 0`. Weights sit under
//! `language_model.` (mlx-community folders) or `model.language_model.` (Hugging Face); the vision
//! tower is dropped. Tensor parallel is its `shard` (heads, hidden units and the head's vocabulary
//! split; see [`super::qwen3_next`] and [`crate::nn::gated_delta`]).
use super::qwen3_next::{self, HybridSpec, LinearConfig};
use super::Model;
use crate::error::{EngineError, Result};
use crate::nn::gated_delta::DeltaNetLayout;
use crate::nn::{QuantConfig, Rope, RopeScaling};
use checkpoint::Weights;
use mlx::Array;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// `TextModelArgs` of qwen3_5.py, with its defaults.
#[derive(Debug, Deserialize)]
#[serde(default)]
struct TextConfig {
    hidden_size: i32,
    intermediate_size: i32,
    num_hidden_layers: i32,
    num_attention_heads: i32,
    rms_norm_eps: f64,
    vocab_size: i32,
    num_key_value_heads: i32,
    #[serde(flatten)]
    linear: LinearConfig,
    tie_word_embeddings: bool,
    attention_bias: bool,
    head_dim: Option<i32>,
    full_attention_interval: i32,
    num_experts: i32,
    num_experts_per_tok: i32,
    shared_expert_intermediate_size: i32,
    moe_intermediate_size: i32,
    norm_topk_prob: bool,
    rope_parameters: Option<serde_json::Map<String, Value>>,
    partial_rotary_factor: f64,
    rope_theta: f64,
    rope_scaling: Option<RopeScaling>,
}

impl Default for TextConfig {
    fn default() -> TextConfig {
        let rope: Value = serde_json::json!({"type": "default", "mrope_section": [11, 11, 10], "rope_theta": 100000,
            "partial_rotary_factor": 0.25});
        TextConfig {
            hidden_size: 4096,
            intermediate_size: 14336,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            rms_norm_eps: 1e-6,
            vocab_size: 151936,
            num_key_value_heads: 8,
            linear: LinearConfig::default(),
            tie_word_embeddings: false,
            attention_bias: false,
            head_dim: None,
            full_attention_interval: 4,
            num_experts: 0,
            num_experts_per_tok: 0,
            shared_expert_intermediate_size: 0,
            moe_intermediate_size: 0,
            norm_topk_prob: true,
            rope_parameters: rope.as_object().cloned(),
            partial_rotary_factor: 0.25,
            rope_theta: 100000.0,
            rope_scaling: None,
        }
    }
}

/// `ModelArgs.from_dict`: `text_config`, or the whole config when there is none.
fn text_config(config: &Value) -> Result<TextConfig> {
    let text = match config.get("text_config") {
        Some(t) if t.is_object() => t,
        Some(_) => return Err(EngineError::Config("text_config must be an object".into())),
        None => config,
    };
    let mut c: TextConfig = super::parse_config(text)?;
    // __post_init__: rope_parameters (with `rope_type` read as `type`) decide the RoPE.
    if let Some(p) = c.rope_parameters.as_mut().filter(|p| !p.is_empty()) {
        if !p.contains_key("type") {
            if let Some(t) = p.remove("rope_type") {
                p.insert("type".into(), t);
            }
        }
        c.partial_rotary_factor = p.get("partial_rotary_factor").and_then(Value::as_f64).unwrap_or(0.25);
        c.rope_theta = p.get("rope_theta").and_then(Value::as_f64).unwrap_or(100000.0);
        c.rope_scaling = Some(super::parse_config(&Value::Object(p.clone()))?);
    }
    Ok(c)
}

/// `TextModelArgs.__post_init__` renames `rope_parameters.rope_type` to `type` in the config dict
/// itself (`text_config`'s, or the whole config's), so `mlx_lm.convert` saves it: the same for `convert`.
pub fn update_config(config: &mut serde_json::Map<String, Value>) {
    let rename = |text: &mut serde_json::Map<String, Value>| {
        if let Some(Value::Object(p)) = text.get_mut("rope_parameters") {
            if !p.contains_key("type") {
                if let Some(t) = p.remove("rope_type") {
                    p.insert("type".into(), t);
                }
            }
        }
    };
    match config.get_mut("text_config") {
        Some(Value::Object(text)) => rename(text),
        _ => rename(config),
    }
}

/// The first half of qwen3_5.py's `Model.sanitize`, in the text model's own names: no vision
/// tensors, `model.language_model.X` -> `model.X`, `language_model.X` -> `X`.
fn text_weights(weights: &mut BTreeMap<String, Array>) {
    let old = std::mem::take(weights);
    for (key, value) in old {
        if key.starts_with("vision_tower") || key.starts_with("model.visual") {
            continue;
        }
        let key = match key.strip_prefix("model.language_model.") {
            Some(rest) => format!("model.{rest}"),
            None => key.strip_prefix("language_model.").map(str::to_owned).unwrap_or(key),
        };
        weights.insert(key, value);
    }
}

/// `TextModel.sanitize`: no `mtp.` tensors; a Hugging Face checkpoint (conv1d weights as (C, 1, K))
/// gets them moved to (C, K, 1) and 1 added to its 1-d RMS norm weights. (Its `lm_head.weight`
/// pop looks for the name without `language_model.`, which never matches there: a tied head
/// present in the checkpoint stays, and strict loading refuses it, as in mlx-lm.)
fn text_sanitize(weights: &mut BTreeMap<String, Array>) -> Result<()> {
    let unsanitized = weights.iter().any(|(k, v)| k.contains("conv1d.weight") && v.dim(-1) != 1);
    weights.retain(|k, _| !k.contains("mtp."));
    qwen3_next::fix_conv_and_norms(weights, unsanitized)
}

/// Loads the text model whose weights `weights` holds in its own names (already sanitized).
fn load_text(config: &Value, weights: &Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or("qwen3_5").to_owned();
    let c = text_config(config)?;
    let head_dim = match c.head_dim {
        Some(h) => h,
        None if c.num_attention_heads > 0 => c.hidden_size / c.num_attention_heads,
        None => return Err(EngineError::Config("num_attention_heads must be positive".into())),
    };
    let rope_dims = (f64::from(head_dim) * c.partial_rotary_factor) as i32;
    let moe = c.num_experts > 0;
    let layers = (0..c.num_hidden_layers)
        .map(|i| Ok((qwen3_next::is_linear(i, c.full_attention_interval)?, moe)))
        .collect::<Result<Vec<_>>>()?;
    let spec = HybridSpec {
        model_type,
        vocab_size: c.vocab_size,
        hidden: c.hidden_size,
        rms_norm_eps: c.rms_norm_eps,
        tie_word_embeddings: c.tie_word_embeddings,
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim,
        attention_bias: c.attention_bias,
        rope: Rope::new(rope_dims, c.rope_theta, false, c.rope_scaling.as_ref())?,
        delta: c.linear.spec(c.hidden_size, c.rms_norm_eps),
        layout: DeltaNetLayout::Separate,
        intermediate_size: c.intermediate_size,
        experts: (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.shared_expert_intermediate_size, c.norm_topk_prob),
        layers,
    };
    Ok(Box::new(qwen3_next::build(spec, weights, &text_quant(q))?))
}

/// Per-layer quantization entries name the layers under `language_model.`: in the text model's names.
fn text_quant(q: &QuantConfig) -> QuantConfig {
    let overrides = q.overrides.iter().map(|(k, v)| (k.strip_prefix("language_model.").unwrap_or(k).to_owned(), *v));
    QuantConfig { default: q.default, overrides: overrides.collect() }
}

/// What a variant's `sanitize` does to the text model's tensors first (qwen3_5_moe's experts).
pub(crate) type Extra = fn(&mut BTreeMap<String, Array>) -> Result<()>;

fn sanitize_text(weights: &mut BTreeMap<String, Array>, extra: Option<Extra>) -> Result<()> {
    text_weights(weights);
    if let Some(f) = extra {
        f(weights)?;
    }
    text_sanitize(weights)
}

/// mlx-lm's `sanitize` for `convert`: the text model's tensors sanitized, under `language_model.`.
pub(crate) fn sanitize_as(weights: &mut BTreeMap<String, Array>, extra: Option<Extra>) -> Result<()> {
    sanitize_text(weights, extra)?;
    let old = std::mem::take(weights);
    weights.extend(old.into_iter().map(|(k, v)| (format!("language_model.{k}"), v)));
    Ok(())
}

pub fn sanitize(weights: &mut BTreeMap<String, Array>) -> Result<()> {
    sanitize_as(weights, None)
}

pub(crate) fn load_as(config: &Value, weights: &mut Weights, q: &QuantConfig, extra: Option<Extra>) -> Result<Box<dyn Model>> {
    super::sanitize_weights(weights, |w| sanitize_text(w, extra))?;
    load_text(config, weights, q)
}

pub fn load(config: &Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    load_as(config, weights, q, None)
}
