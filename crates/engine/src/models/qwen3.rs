//! `qwen3` (dense Qwen3), as mlx-lm's `models/qwen3.py`: no projection biases, RMS norms over each
//! head's queries and keys before RoPE, explicit `head_dim`.
use super::transformer::{self, CacheLayout, DecoderSpec};
use super::Model;
use crate::error::{EngineError, Result};
use crate::nn::{AttentionSpec, QuantConfig, Rope, RopeScaling};
use checkpoint::Weights;
use serde::Deserialize;

/// `ModelArgs` of mlx-lm's qwen3.py (transformers >= 5 may nest rope settings in `rope_parameters`).
#[derive(Debug, Deserialize)]
pub struct Config {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
}

pub fn load(config: &serde_json::Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    let c: Config = super::parse_config(config)?;
    let params = c.rope_parameters.as_ref();
    let theta = c
        .rope_theta
        .or_else(|| params.and_then(|p| p.get("rope_theta")).and_then(|t| t.as_f64()))
        .ok_or_else(|| EngineError::Config("rope_theta is missing from the model config".into()))?;
    let scaling = match (c.rope_scaling, params) {
        (Some(s), _) => Some(s),
        (None, Some(p)) => Some(serde_json::from_value(p.clone()).map_err(|e| EngineError::Config(e.to_string()))?),
        (None, None) => None,
    };
    let rope = Rope::new(c.head_dim, theta, false, scaling.as_ref())?;
    let spec = DecoderSpec {
        model_type: c.model_type,
        vocab_size: c.vocab_size,
        num_layers: c.num_hidden_layers,
        intermediate_size: c.intermediate_size,
        rms_norm_eps: c.rms_norm_eps,
        mlp_bias: false,
        tie_word_embeddings: c.tie_word_embeddings,
        cache_layout: CacheLayout::Default,
        attention: AttentionSpec {
            hidden: c.hidden_size,
            n_heads: c.num_attention_heads,
            n_kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            qkv_bias: false,
            o_bias: false,
            qk_norm_eps: Some(c.rms_norm_eps),
        },
    };
    if spec.tie_word_embeddings {
        weights.drop_where(|n| n == "lm_head.weight");
    }
    Ok(Box::new(transformer::load(spec, rope, weights, q)?))
}
