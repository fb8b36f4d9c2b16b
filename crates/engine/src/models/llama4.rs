//! `llama4` (Llama 4 Scout / Maverick text model under `language_model.`), as mlx-lm's
//! `models/llama4.py`: three of every four layers use RoPE (traditional, `rope_scaling`) with
//! chunked local attention (mlx-lm's `ChunkedKVCache`, `attention_chunk_size` positions) and
//! optional weightless q/k norms after RoPE; every fourth layer attends globally without RoPE, its
//! queries scaled by the attention temperature tuning. Every `interleave_moe_layer_step`-th layer's
//! feed-forward part is a mixture of experts (one expert per token, sigmoid gate applied to the
//! input) plus a shared expert; the others are a SwiGLU MLP of `intermediate_size_mlp` units.
use super::stack::{FeedForward, Part};
use super::transformer::{self, AttnKind, CacheLayout, DecoderSpec, LayerKind, Mlp, QueryScale, Variant};
use super::Model;
use crate::error::{EngineError, Result};
use crate::nn::moe::{GluMlp, Router, SwitchGlu};
use crate::nn::{AttentionSpec, Linear, PlainQkNorm, QuantConfig, Rope, RopeScaling};
use checkpoint::Weights;
use mlx::distributed::Group;
use mlx::{Array, Dtype};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// `TextArgs` of mlx-lm's llama4.py, with its defaults.
#[derive(Debug, Deserialize)]
pub struct TextConfig {
    pub attention_bias: bool,
    pub attention_chunk_size: i32,
    pub head_dim: Option<i32>,
    pub hidden_size: i32,
    pub interleave_moe_layer_step: i32,
    pub intermediate_size: i32,
    pub intermediate_size_mlp: i32,
    pub max_position_embeddings: i32,
    pub model_type: String,
    pub num_attention_heads: i32,
    pub num_experts_per_tok: i32,
    pub num_hidden_layers: i32,
    pub num_key_value_heads: i32,
    pub num_local_experts: i32,
    pub rms_norm_eps: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub rope_theta: f64,
    pub use_qk_norm: bool,
    pub vocab_size: i32,
    /// Python truthiness (an int in mlx-lm's defaults, a bool in transformers' configs).
    #[serde(default = "default_temperature_tuning")]
    pub attn_temperature_tuning: Value,
    #[serde(default = "default_floor_scale")]
    pub floor_scale: f64,
    #[serde(default = "default_attn_scale")]
    pub attn_scale: f64,
}

fn default_temperature_tuning() -> Value {
    Value::from(4)
}
fn default_floor_scale() -> f64 {
    8192.0
}
fn default_attn_scale() -> f64 {
    0.1
}

/// `MoE.router` and its top-1 choice: (indices, sigmoid scores), each (B, L, 1).
#[derive(Clone)]
struct TopOne {
    router: Linear,
}

impl Router for TopOne {
    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let logits = self.router.forward(x)?; // (B, L, experts)
        let indices = logits.neg()?.argpartition(0, -1)?.slice_axis(-1, 0, 1)?;
        let scores = logits.take_along_axis(&indices, -1)?;
        let scores = scores.astype(Dtype::F32)?.sigmoid()?.astype(x.dtype())?;
        Ok((indices, scores))
    }

    fn arrays(&self) -> Vec<&Array> {
        self.router.arrays()
    }
}

/// A layer's feed-forward part: llama4.py's `MLP` or `MoE`.
#[derive(Clone)]
enum Ffn {
    Dense(Mlp),
    Moe { router: TopOne, experts: SwitchGlu, shared_expert: GluMlp },
}

impl Part for Ffn {
    fn arrays(&self) -> Vec<&Array> {
        match self {
            Ffn::Dense(m) => Part::arrays(m),
            Ffn::Moe { router, experts, shared_expert } => [router.arrays(), experts.arrays(), shared_expert.arrays()].concat(),
        }
    }

    /// Never called: llama4.py has no `shard`, so the skeleton refuses tensor parallel first.
    fn shard(&self, _group: &Group) -> Result<Ffn> {
        Err(EngineError::Config("tensor parallel is not supported for model_type llama4".into()))
    }
}

impl FeedForward for Ffn {
    fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Ffn::Dense(m) => FeedForward::forward(m, x),
            Ffn::Moe { router, experts, shared_expert } => {
                let (indices, scores) = router.route(x)?;
                let out = experts.forward(&x.mul(&scores)?, &indices)?.squeeze(&[2])?; // (B, L, hidden)
                Ok(out.add(&shared_expert.forward(x)?)?)
            }
        }
    }
}

/// llama4.py's `sanitize`: no vision weights; Hugging Face's fused expert tensors
/// `experts.gate_up_proj` (E, hidden, 2 I) and `experts.down_proj` (E, I, hidden) become the
/// `SwitchGLU` weights `experts.{gate,up,down}_proj.weight` (E, out, in).
pub fn sanitize(config: &Value, weights: &mut BTreeMap<String, Array>) -> Result<()> {
    let layers = config.get("text_config").and_then(|t| t.get("num_hidden_layers")).and_then(Value::as_i64).unwrap_or(0);
    weights.retain(|k, _| !k.contains("vision_model") && !k.contains("multi_modal_projector"));
    for l in 0..layers {
        let prefix = format!("language_model.model.layers.{l}.feed_forward.experts");
        if let Some(v) = weights.remove(&format!("{prefix}.gate_up_proj")) {
            let half = v.dim(-1) / 2;
            weights.insert(format!("{prefix}.gate_proj.weight"), v.slice_axis(-1, 0, half)?.swapaxes(1, 2)?);
            weights.insert(format!("{prefix}.up_proj.weight"), v.slice_axis(-1, half, 2 * half)?.swapaxes(1, 2)?);
        }
        if let Some(down) = weights.remove(&format!("{prefix}.down_proj")) {
            weights.insert(format!("{prefix}.down_proj.weight"), down.swapaxes(1, 2)?);
        }
    }
    Ok(())
}

pub fn load(config: &Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    let text = config.get("text_config").cloned().ok_or_else(|| EngineError::Config("llama4 needs a text_config".into()))?;
    let c: TextConfig = super::parse_config(&text)?;
    if c.num_experts_per_tok != 1 {
        return Err(EngineError::Config(format!("llama4 supports 1 expert per token (mlx-lm too), not {}", c.num_experts_per_tok)));
    }
    // The global mask comes from the fourth layer's cache (mlx-lm indexes cache[3]).
    if c.num_hidden_layers < 4 || c.interleave_moe_layer_step <= 0 || c.attention_chunk_size <= 0 {
        return Err(EngineError::Config(
            "llama4 needs at least 4 layers, a positive interleave_moe_layer_step and attention_chunk_size".into(),
        ));
    }
    super::sanitize_weights(weights, |w| {
        sanitize(config, w)?;
        let old = std::mem::take(w);
        w.extend(old.into_iter().map(|(k, v)| (k.strip_prefix("language_model.").map(str::to_owned).unwrap_or(k), v)));
        Ok(())
    })?;
    let overrides = q.overrides.iter().filter_map(|(k, v)| k.strip_prefix("language_model.").map(|k| (k.to_owned(), *v)));
    let q = &QuantConfig { default: q.default, overrides: overrides.collect() };

    let head_dim = c.head_dim.filter(|&d| d != 0).unwrap_or(c.hidden_size / c.num_attention_heads.max(1));
    let rope = Rope::new(head_dim, c.rope_theta, true, c.rope_scaling.as_ref())?;
    let layers = (0..c.num_hidden_layers)
        .map(|i| match (i + 1) % 4 != 0 {
            true => LayerKind { attn: AttnKind::Chunked(c.attention_chunk_size), rope: true },
            false => LayerKind { attn: AttnKind::Full, rope: false },
        })
        .collect();
    let spec = DecoderSpec {
        model_type: config.get("model_type").and_then(Value::as_str).unwrap_or("llama4").to_owned(),
        vocab_size: c.vocab_size,
        num_layers: c.num_hidden_layers,
        intermediate_size: c.intermediate_size_mlp,
        rms_norm_eps: c.rms_norm_eps,
        mlp_bias: false,
        tie_word_embeddings: false,
        cache_layout: CacheLayout::PerLayer,
        attention: AttentionSpec {
            hidden: c.hidden_size,
            n_heads: c.num_attention_heads,
            n_kv_heads: c.num_key_value_heads,
            head_dim,
            qkv_bias: c.attention_bias,
            o_bias: c.attention_bias,
            qk_norm_eps: None,
        },
        layers,
        variant: Variant {
            query_scale: super::truthy(&c.attn_temperature_tuning)
                .then_some(QueryScale::Temperature { floor_scale: c.floor_scale, attn_scale: c.attn_scale }),
            plain_qk_norm: c.use_qk_norm.then_some((PlainQkNorm { eps: 1e-6, after_rope: true }, true)),
            no_tensor_parallel: true,
            no_pipeline: true,
            ..Variant::default()
        },
    };
    let (d, step) = (c.hidden_size, c.interleave_moe_layer_step);
    let model = transformer::load_with(spec, rope, weights, q, |i, l| {
        let f = l.pp("feed_forward");
        Ok(match i % step == step - 1 {
            true => Ffn::Moe {
                router: TopOne { router: Linear::load(&f.pp("router"), d, c.num_local_experts, false, q)? },
                experts: SwitchGlu::load(&f.pp("experts"), d, c.intermediate_size, c.num_local_experts, q)?,
                shared_expert: GluMlp::load(&f.pp("shared_expert"), d, c.intermediate_size, q)?,
            },
            false => Ffn::Dense(Mlp::load(&f, d, c.intermediate_size_mlp, false, q)?),
        })
    })?;
    Ok(Box::new(model))
}
