//! `llama4_text` (a dense Llama-4-style text model), as mlx-lm's `models/llama4_text.py`: full
//! attention on every layer, RoPE (traditional, no scaling) only where `no_rope_layers[i]` is set,
//! weightless RMS norms over each head's queries and keys before RoPE (`use_qk_norm`), the SwiGLU
//! MLP of `intermediate_size_mlp` units under `feed_forward`, and the untied head named `output`.
use super::transformer::{self, CacheLayout, DecoderSpec, LayerKind, Variant};
use super::Model;
use crate::error::{EngineError, Result};
use crate::nn::{AttentionSpec, PlainQkNorm, QuantConfig, Rope};
use checkpoint::Weights;
use serde::Deserialize;
use serde_json::Value;

/// `ModelArgs` of mlx-lm's llama4_text.py (every field required, as there).
#[derive(Debug, Deserialize)]
pub struct Config {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_attention_heads: i32,
    pub num_hidden_layers: i32,
    pub vocab_size: i32,
    pub intermediate_size: i32,
    pub intermediate_size_mlp: i32,
    pub num_key_value_heads: i32,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub head_dim: i32,
    pub tie_word_embeddings: bool,
    /// Per layer, truthy where the layer uses RoPE (mlx-lm passes it as `use_rope`).
    pub no_rope_layers: Vec<Value>,
    pub use_qk_norm: bool,
}

pub fn load(config: &Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    let c: Config = super::parse_config(config)?;
    let n = c.num_hidden_layers.max(0) as usize;
    if c.no_rope_layers.len() < n {
        return Err(EngineError::Config(format!("no_rope_layers has {} entries for {n} layers", c.no_rope_layers.len())));
    }
    // `h @ embed_tokens.weight.T` in llama4_text.py: with a quantized embedding mlx-lm would
    // multiply by the packed integers, so refuse rather than compute something else.
    if c.tie_word_embeddings && weights.contains("model.embed_tokens.scales") {
        return Err(EngineError::Config(
            "llama4_text with tied, quantized embeddings is not supported (mlx-lm multiplies by the packed weight)".into(),
        ));
    }
    let layers = c.no_rope_layers[..n].iter().map(|r| LayerKind { rope: super::truthy(r), ..LayerKind::all_full(1)[0] }).collect();
    let rope = Rope::new(c.head_dim, c.rope_theta, true, None)?;
    let norm = PlainQkNorm { eps: c.rms_norm_eps as f32, after_rope: false };
    let spec = DecoderSpec {
        model_type: c.model_type,
        vocab_size: c.vocab_size,
        num_layers: c.num_hidden_layers,
        intermediate_size: c.intermediate_size_mlp,
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
            qk_norm_eps: None,
        },
        layers,
        variant: Variant {
            plain_qk_norm: c.use_qk_norm.then_some((norm, false)),
            mlp_name: Some("feed_forward"),
            head_name: Some("output"),
            no_tensor_parallel: true,
            no_pipeline: true,
            ..Variant::default()
        },
    };
    Ok(Box::new(transformer::load(spec, rope, weights, q)?))
}
