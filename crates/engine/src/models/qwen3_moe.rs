//! `qwen3_moe` (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B), as mlx-lm's
//! `models/qwen3_moe.py`: Qwen3's attention (q/k RMS norms, no biases, plain RoPE) and, in every
//! `decoder_sparse_step`-th layer not listed in `mlp_only_layers`, a sparse block of routed experts
//! (softmax router, top-k, optionally renormalised); the other layers keep a dense SwiGLU MLP.
use super::transformer::{self, CacheLayout, DecoderSpec, LayerKind, Variant};
use super::Model;
use crate::error::{EngineError, Result};
use crate::nn::moe::{stack_experts, Ffn, Gate, GluMlp, Routing};
use crate::nn::{AttentionSpec, QuantConfig, Rope};
use checkpoint::Weights;
use mlx::ops::QuantSpec;
use serde::Deserialize;

/// `ModelArgs` of mlx-lm's qwen3_moe.py (every field required there but `rope_scaling`, which
/// the file never reads: its RoPE is unscaled).
#[derive(Debug, Deserialize)]
pub struct Config {
    pub model_type: String,
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    pub decoder_sparse_step: i32,
    pub mlp_only_layers: Vec<i32>,
    pub moe_intermediate_size: i32,
    pub rms_norm_eps: f64,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    pub norm_topk_prob: bool,
}

impl Config {
    /// `Qwen3MoeDecoderLayer`'s choice: experts unless the layer is MLP-only.
    fn is_moe(&self, layer: i32) -> bool {
        !self.mlp_only_layers.contains(&layer) && self.num_experts > 0 && (layer + 1) % self.decoder_sparse_step == 0
    }
}

fn parse(config: &serde_json::Value) -> Result<Config> {
    let c: Config = super::parse_config(config)?;
    if c.decoder_sparse_step <= 0 {
        return Err(EngineError::Config(format!("decoder_sparse_step {} must be positive", c.decoder_sparse_step)));
    }
    Ok(c)
}

/// mlx-lm's `sanitize`: a tied model drops `lm_head.weight`; each MoE layer's per-expert
/// projections (Hugging Face layout) are stacked into `switch_mlp`.
pub fn sanitize(config: &serde_json::Value, weights: &mut Weights) -> Result<()> {
    let c = parse(config)?;
    if c.tie_word_embeddings {
        weights.drop_where(|n| n == "lm_head.weight");
    }
    for i in 0..c.num_hidden_layers {
        if weights.contains(&format!("model.layers.{i}.mlp.experts.0.up_proj.weight")) {
            stack_experts(weights, &format!("model.layers.{i}.mlp"), c.num_experts)?;
        }
    }
    Ok(())
}

/// The model's `quant_predicate` for `mlx_lm.convert -q`: each router (`mlp.gate`) in 8 bits,
/// group 64; every other layer as asked.
pub fn quant_override(path: &str) -> Option<QuantSpec> {
    path.ends_with("mlp.gate").then_some(QuantSpec::affine(64, 8))
}

pub fn load(config: &serde_json::Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    sanitize(config, weights)?;
    let c = parse(config)?;
    // nn.RoPE(head_dim, traditional=False, base=rope_theta)
    let rope = Rope::new(c.head_dim, c.rope_theta, false, None)?;
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
            n_heads: c.num_attention_heads,
            n_kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            qkv_bias: false,
            o_bias: false,
            qk_norm_eps: Some(c.rms_norm_eps),
        },
    };
    // Qwen3MoeSparseMoeBlock: softmax (precise), `argpartition(gates, kth=-k)[..., -k:]`, the
    // chosen weights renormalised with norm_topk_prob; no shared experts, no scaling.
    let routing = Routing { select_from_top: true, normalize: c.norm_topk_prob, ..Routing::softmax_top_k(c.num_experts_per_tok) };
    let d = spec.attention.hidden;
    let model = transformer::load_with(spec, rope, weights, q, |i, l| {
        let m = l.pp("mlp");
        Ok(if c.is_moe(i) {
            let gate = Gate::load(&m, d, c.num_experts, routing.clone(), false, q)?;
            Ffn::moe(&m, gate, d, c.moe_intermediate_size, c.num_experts, None, q)?
        } else {
            Ffn::Dense(GluMlp::load(&m, d, c.intermediate_size, q)?)
        })
    })?;
    Ok(Box::new(model))
}
