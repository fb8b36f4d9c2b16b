//! `qwen2` (Qwen2, Qwen2.5, Qwen2.5-Coder, DeepSeek-R1-Distill-Qwen), as mlx-lm's `models/qwen2.py`:
//! the Llama block with biases on the q/k/v projections.
use super::transformer::{self, CacheLayout, DecoderSpec};
use super::Model;
use crate::error::{EngineError, Result};
use crate::nn::{AttentionSpec, QuantConfig, Rope, RopeScaling};
use checkpoint::Weights;
use serde::Deserialize;

/// `ModelArgs` of mlx-lm's qwen2.py, with its defaults.
#[derive(Debug, Deserialize)]
pub struct Config {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: Option<i32>,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    #[serde(default = "super::default_true")]
    pub tie_word_embeddings: bool,
}

fn default_theta() -> f64 {
    1_000_000.0
}

pub fn load(config: &serde_json::Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    let c: Config = super::parse_config(config)?;
    let n_kv_heads = c
        .num_key_value_heads
        .ok_or_else(|| EngineError::Config("qwen2 needs num_key_value_heads".into()))?;
    let head_dim = c.hidden_size / c.num_attention_heads.max(1);
    let rope = Rope::new(head_dim, c.rope_theta, c.rope_traditional, c.rope_scaling.as_ref())?;
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
            n_kv_heads,
            head_dim,
            qkv_bias: true,
            o_bias: false,
            qk_norm_eps: None,
        },
    };
    weights.drop_where(|n| n.contains("self_attn.rotary_emb.inv_freq") || (spec.tie_word_embeddings && n == "lm_head.weight"));
    Ok(Box::new(transformer::load(spec, rope, weights, q)?))
}
