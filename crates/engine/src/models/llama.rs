//! `llama` (Llama 2, 3, 3.1, 3.2 and SmolLM) and `mistral`, as mlx-lm's `models/llama.py`:
//! optional attention/MLP biases, explicit `head_dim`, rope scaling `linear` or `llama3`.
use super::transformer::{self, CacheLayout, DecoderSpec};
use super::Model;
use crate::error::{EngineError, Result};
use crate::nn::{AttentionSpec, QuantConfig, Rope, RopeScaling};
use checkpoint::Weights;
use serde::Deserialize;

/// `ModelArgs` of mlx-lm's llama.py, with its defaults.
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
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    #[serde(default = "super::default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub sliding_window: Option<i32>,
}

fn default_theta() -> f64 {
    10000.0
}

pub fn load(config: &serde_json::Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    let c: Config = super::parse_config(config)?;
    // As mlx-lm's llama.py: `layer_types` (default all full attention) picks a rotating cache of
    // `sliding_window` positions for each sliding layer, and the model makes its own caches.
    let layer_types = c.layer_types.clone().unwrap_or_else(|| vec!["full_attention".into(); c.num_hidden_layers.max(0) as usize]);
    if let Some(t) = layer_types.iter().find(|t| *t != "full_attention" && *t != "sliding_attention") {
        return Err(EngineError::Config(format!("layer type {t:?} is not supported (full_attention, sliding_attention)")));
    }
    if layer_types.len() != c.num_hidden_layers.max(0) as usize {
        return Err(EngineError::Config(format!("{} layer_types for {} layers", layer_types.len(), c.num_hidden_layers)));
    }
    if !layer_types.iter().any(|t| t == "full_attention") {
        return Err(EngineError::Config("layer_types has no full_attention layer (mlx-lm needs one)".into()));
    }
    let sliding: Vec<bool> = layer_types.iter().map(|t| t == "sliding_attention").collect();
    let sliding_window = c.sliding_window.filter(|&w| w > 0);
    if sliding.iter().any(|&s| s) && sliding_window.is_none() {
        return Err(EngineError::Config("sliding_attention layers need a positive sliding_window".into()));
    }
    let n_heads = c.num_attention_heads;
    let head_dim = c.head_dim.unwrap_or(c.hidden_size / n_heads.max(1));
    let rope = Rope::new(head_dim, c.rope_theta, c.rope_traditional, c.rope_scaling.as_ref())?;
    let spec = DecoderSpec {
        model_type: c.model_type,
        vocab_size: c.vocab_size,
        num_layers: c.num_hidden_layers,
        intermediate_size: c.intermediate_size,
        rms_norm_eps: c.rms_norm_eps,
        mlp_bias: c.mlp_bias,
        tie_word_embeddings: c.tie_word_embeddings,
        cache_layout: CacheLayout::PerLayer { sliding, sliding_window },
        attention: AttentionSpec {
            hidden: c.hidden_size,
            n_heads,
            n_kv_heads: c.num_key_value_heads.unwrap_or(n_heads),
            head_dim,
            qkv_bias: c.attention_bias,
            o_bias: c.attention_bias,
            qk_norm_eps: None,
        },
    };
    // sanitize: precomputed rotary frequencies are unused; a tied model ignores lm_head.
    weights.drop_where(|n| n.contains("self_attn.rotary_emb.inv_freq") || (spec.tie_word_embeddings && n == "lm_head.weight"));
    Ok(Box::new(transformer::load(spec, rope, weights, q)?))
}
