//! `qwen2_moe` (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B), as mlx-lm's `models/qwen2_moe.py`: Qwen2's
//! attention (q/k/v biases, plain RoPE) and in every layer a sparse block: softmax router, top-k
//! routed experts (not renormalised) plus one shared expert weighted by
//! `sigmoid(shared_expert_gate(x))`. The head is always separate (`lm_head`), as in mlx-lm.
use super::transformer::{self, CacheLayout, DecoderSpec, LayerKind, Variant};
use super::Model;
use crate::error::{EngineError, Result};
use crate::nn::moe::{stack_experts, Ffn, Gate, GluMlp, Routing, SwitchGlu};
use crate::nn::{AttentionSpec, QuantConfig, Rope};
use checkpoint::Weights;
use serde::Deserialize;

/// `ModelArgs` of mlx-lm's qwen2_moe.py, with its defaults.
#[derive(Debug, Deserialize)]
pub struct Config {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_experts_per_tok: i32,
    pub num_experts: i32,
    pub moe_intermediate_size: i32,
    pub shared_expert_intermediate_size: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_traditional: bool,
    /// Checked as `__post_init__` checks it (a `linear` type and a factor); the file's RoPE never
    /// applies it, so neither does this one.
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Map<String, serde_json::Value>>,
}

fn default_theta() -> f64 {
    1_000_000.0
}

fn parse(config: &serde_json::Value) -> Result<Config> {
    let c: Config = super::parse_config(config)?;
    if let Some(s) = c.rope_scaling.as_ref().filter(|s| !s.is_empty()) {
        if !(s.contains_key("factor") && s.contains_key("type")) {
            return Err(EngineError::Config("rope_scaling must contain keys factor and type".into()));
        }
        if s.get("type").and_then(|t| t.as_str()) != Some("linear") {
            return Err(EngineError::Config("rope_scaling 'type' currently only supports 'linear'".into()));
        }
    }
    Ok(c)
}

/// mlx-lm's `sanitize`: per-expert projections (Hugging Face layout, float or quantized) are
/// stacked into `switch_mlp` (in each layer that has them: a pipeline stage lacks layer 0).
pub fn sanitize(config: &serde_json::Value, weights: &mut Weights) -> Result<()> {
    let c = parse(config)?;
    for i in 0..c.num_hidden_layers {
        stack_experts(weights, &format!("model.layers.{i}.mlp"), c.num_experts)?;
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
        intermediate_size: c.moe_intermediate_size,
        rms_norm_eps: c.rms_norm_eps,
        mlp_bias: false,
        tie_word_embeddings: false,
        cache_layout: CacheLayout::Default,
        layers: LayerKind::all_full(c.num_hidden_layers),
        variant: Variant::default(),
        attention: AttentionSpec {
            hidden: c.hidden_size,
            n_heads,
            n_kv_heads: c.num_key_value_heads.unwrap_or(n_heads),
            head_dim,
            qkv_bias: true,
            o_bias: false,
            qk_norm_eps: None,
        },
    };
    // Qwen2MoeSparseMoeBlock: softmax (precise), `argpartition(-gates, kth=k-1)[..., :k]`, the
    // chosen probabilities as they are, plus the gated shared expert.
    let routing = Routing::softmax_top_k(c.num_experts_per_tok);
    let (e, hidden) = (c.num_experts, c.moe_intermediate_size);
    let d = spec.attention.hidden;
    let model = transformer::load_with(spec, rope, weights, q, |_, l| {
        let m = l.pp("mlp");
        Ok(Ffn::Moe {
            gate: Gate::load(&m, d, e, routing.clone(), true, q)?,
            switch_mlp: SwitchGlu::load(&m.pp("switch_mlp"), d, hidden, e, q)?,
            shared_experts: Some(GluMlp::load(&m.pp("shared_expert"), d, c.shared_expert_intermediate_size, q)?),
            reduce: None,
        })
    })?;
    Ok(Box::new(model))
}
