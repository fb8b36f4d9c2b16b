//! `mixtral` (Mixtral-8x7B, 8x22B), as mlx-lm's `models/mixtral.py`: Mistral's grouped-query
//! attention with plain RoPE, and in every layer a sparse block (`block_sparse_moe`) whose router
//! picks the top-k logits and softmaxes over those alone.
use super::transformer::{self, CacheLayout, DecoderSpec, LayerKind, Variant};
use super::Model;
use crate::error::Result;
use crate::nn::moe::{stack_experts_as, Ffn, Gate, Routing};
use crate::nn::{AttentionSpec, QuantConfig, Rope};
use checkpoint::Weights;
use serde::Deserialize;

/// `ModelArgs` of mlx-lm's mixtral.py, with its defaults (its `rope_scaling` is never read: the
/// RoPE is unscaled, so it is not read here either).
#[derive(Debug, Deserialize)]
#[serde(default)]
pub struct Config {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_experts_per_tok: i32,
    pub num_key_value_heads: Option<i32>,
    pub num_local_experts: i32,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_traditional: bool,
    pub tie_word_embeddings: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            model_type: String::new(),
            vocab_size: 32000,
            hidden_size: 4096,
            intermediate_size: 14336,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_experts_per_tok: 2,
            num_key_value_heads: Some(8),
            num_local_experts: 8,
            rms_norm_eps: 1e-5,
            rope_theta: 1e6,
            rope_traditional: false,
            tie_word_embeddings: false,
        }
    }
}

fn parse(config: &serde_json::Value) -> Result<Config> {
    let c: Config = super::parse_config(config)?;
    if config.get("model_type").and_then(|t| t.as_str()).is_none() {
        return Err(crate::error::EngineError::Config("missing field `model_type`".into()));
    }
    Ok(c)
}

/// mlx-lm's `sanitize`: a tied model drops `lm_head.weight`; the experts' `w1`/`w2`/`w3`
/// (Hugging Face layout, float or quantized) become the stacked `switch_mlp` gate/down/up, in
/// each layer that has them (a pipeline stage lacks layer 0).
pub fn sanitize(config: &serde_json::Value, weights: &mut Weights) -> Result<()> {
    let c = parse(config)?;
    if c.tie_word_embeddings {
        weights.drop_where(|n| n == "lm_head.weight");
    }
    let names = [("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")];
    for i in 0..c.num_hidden_layers {
        stack_experts_as(weights, &format!("model.layers.{i}.block_sparse_moe"), c.num_local_experts, &names)?;
    }
    Ok(())
}

pub fn load(config: &serde_json::Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    sanitize(config, weights)?;
    let c = parse(config)?;
    let n_heads = c.num_attention_heads;
    let head_dim = c.hidden_size / n_heads.max(1);
    let rope = Rope::new(head_dim, c.rope_theta, c.rope_traditional, None)?;
    let spec = DecoderSpec {
        model_type: c.model_type.clone(),
        vocab_size: c.vocab_size,
        num_layers: c.num_hidden_layers,
        intermediate_size: c.intermediate_size,
        rms_norm_eps: c.rms_norm_eps,
        mlp_bias: false,
        tie_word_embeddings: c.tie_word_embeddings,
        cache_layout: CacheLayout::Default,
        layers: LayerKind::all_full(c.num_hidden_layers),
        variant: Variant::default(),
        attention: AttentionSpec {
            hidden: c.hidden_size,
            n_heads,
            n_kv_heads: c.num_key_value_heads.unwrap_or(n_heads),
            head_dim,
            qkv_bias: false,
            o_bias: false,
            qk_norm_eps: None,
        },
    };
    // MixtralSparseMoeBlock: `argpartition(-gates, kth=k-1)[..., :k]` on the logits, then a
    // precise softmax over the chosen ones.
    let routing = Routing { score_after_select: true, ..Routing::softmax_top_k(c.num_experts_per_tok) };
    let (e, ff) = (c.num_local_experts, c.intermediate_size);
    let d = spec.attention.hidden;
    let model = transformer::load_with(spec, rope, weights, q, |_, l| {
        let m = l.pp("block_sparse_moe");
        Ffn::moe(&m, Gate::load(&m, d, e, routing.clone(), false, q)?, d, ff, e, None, q)
    })?;
    Ok(Box::new(model))
}
