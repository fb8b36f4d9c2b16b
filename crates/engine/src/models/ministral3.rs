//! `ministral3` (Ministral 3, and the text model of Mistral Small 3.x / `mistral3` checkpoints), as
//! mlx-lm's `models/ministral3.py`: Llama's decoder with the queries of every layer scaled by the
//! llama-4 attention scale `1 + beta * log(1 + floor(position / original_max_position_embeddings))`,
//! RoPE (default, linear, llama3 or YaRN) from `rope_parameters`, and per-layer sliding windows
//! from `layer_types` (rotating caches of `sliding_window` positions on those layers).
use super::transformer::{self, CacheLayout, DecoderSpec, QueryScale, Variant};
use super::Model;
use crate::error::{EngineError, Result};
use crate::nn::{AttentionSpec, QuantConfig, Rope, RopeScaling};
use checkpoint::Weights;
use mlx::Array;
use serde::Deserialize;
use std::collections::BTreeMap;

/// `ModelArgs` of mlx-lm's ministral3.py, with its defaults.
#[derive(Debug, Deserialize)]
pub struct Config {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    #[serde(default)]
    pub head_dim: Option<i32>,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    /// Read as mlx-lm reads it: `rope_theta`, `llama_4_scaling_beta`,
    /// `original_max_position_embeddings`, and the RoPE scaling fields.
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    #[serde(default = "super::default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub sliding_window: Option<i32>,
}

/// A number of `rope_parameters` that ministral3.py indexes (a KeyError there when missing).
fn rope_param(params: Option<&serde_json::Value>, key: &str) -> Result<f64> {
    params
        .and_then(|p| p.get(key))
        .and_then(serde_json::Value::as_f64)
        .ok_or_else(|| EngineError::Config(format!("ministral3 needs rope_parameters.{key} in its config")))
}

/// The decoder spec and RoPE of a `ministral3` config.
fn spec(c: Config) -> Result<(DecoderSpec, Rope)> {
    let params = c.rope_parameters.as_ref();
    let theta = rope_param(params, "rope_theta")?;
    let query_scale = QueryScale::Llama4 {
        beta: rope_param(params, "llama_4_scaling_beta")?,
        max_position: rope_param(params, "original_max_position_embeddings")?,
    };
    let scaling: Option<RopeScaling> =
        params.map(|p| serde_json::from_value(p.clone()).map_err(|e| EngineError::Config(format!("rope_parameters: {e}")))).transpose()?;
    let n_heads = c.num_attention_heads;
    let head_dim = c.head_dim.unwrap_or(c.hidden_size / n_heads.max(1));
    let rope = Rope::new(head_dim, theta, false, scaling.as_ref())?;
    let layers = super::llama::layer_kinds(c.layer_types.as_deref(), c.num_hidden_layers, c.sliding_window)?;
    let spec = DecoderSpec {
        model_type: c.model_type,
        vocab_size: c.vocab_size,
        num_layers: c.num_hidden_layers,
        intermediate_size: c.intermediate_size,
        rms_norm_eps: c.rms_norm_eps,
        mlp_bias: false,
        tie_word_embeddings: c.tie_word_embeddings,
        cache_layout: CacheLayout::PerLayer,
        attention: AttentionSpec {
            hidden: c.hidden_size,
            n_heads,
            n_kv_heads: c.num_key_value_heads.unwrap_or(n_heads),
            head_dim,
            qkv_bias: false,
            o_bias: false,
            qk_norm_eps: None,
        },
        layers,
        variant: Variant { query_scale: Some(query_scale), ..Variant::default() },
    };
    Ok((spec, rope))
}

/// ministral3.py's `sanitize`: no precomputed rotary frequencies, no `lm_head` when tied, and
/// FP8 weights multiplied by their `weight_scale_inv` (their `activation_scale`s dropped).
pub fn sanitize(config: &serde_json::Value, weights: &mut BTreeMap<String, Array>) -> Result<()> {
    let tie = config.get("tie_word_embeddings").and_then(serde_json::Value::as_bool).unwrap_or(true);
    weights.retain(|k, _| !k.contains("self_attn.rotary_emb.inv_freq"));
    if tie {
        weights.remove("lm_head.weight");
    }
    weights.retain(|k, _| !k.contains("activation_scale"));
    let scaled: Vec<String> = weights.keys().filter(|k| k.contains("weight_scale_inv")).cloned().collect();
    for k in scaled {
        let wk = k.replace("_scale_inv", "");
        let scale_inv = weights.remove(&k).expect("listed above");
        let weight = weights.get(&wk).ok_or_else(|| EngineError::missing_tensor(wk.clone()))?;
        let w = weight.mul(&scale_inv)?;
        weights.insert(wk, w);
    }
    Ok(())
}

pub fn load(config: &serde_json::Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    let (spec, rope) = spec(super::parse_config(config)?)?;
    super::sanitize_weights(weights, |w| sanitize(config, w))?;
    Ok(Box::new(transformer::load(spec, rope, weights, q)?))
}
