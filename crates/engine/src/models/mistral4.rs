//! `mistral4` (Mistral-Small-4), as mlx-lm's `models/mistral4.py`: DeepSeek-V3's multi-head latent
//! attention in absorbed form (the cache holds the normalised latent as keys and the RoPE key as
//! values) with Llama-4's position-dependent query scale, and DeepSeek-V3's layers: the first
//! `first_k_dense_replace` dense, then routed experts with a float32 softmax router (group-limited,
//! renormalised with an epsilon, scaled) plus shared experts.
use super::deepseek_v3::split_kv_b;
use super::stack::{Arch, Block, Part, Stack, StackDims};
use super::Model;
use crate::cache::{CacheMask, KvCache};
use crate::error::{EngineError, Result};
use crate::nn::mla::{MlaProjections, MlaSpec, MultiLinear};
use crate::nn::moe::{stack_experts, Ffn, Gate, GluMlp, GroupScore, Routing};
use crate::nn::sdpa::sdpa;
use crate::nn::{QuantConfig, Rope, RopeScaling};
use checkpoint::Weights;
use mlx::distributed::Group;
use mlx::fast::Mask;
use mlx::{ops, Array, Dtype};
use serde::Deserialize;

/// `ModelArgs` of mlx-lm's mistral4.py (`q_lora_rank`, `n_shared_experts` and `n_routed_experts`
/// may be null there).
#[derive(Debug, Deserialize)]
pub struct Config {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub moe_intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub n_shared_experts: Option<i32>,
    pub n_routed_experts: Option<i32>,
    pub routed_scaling_factor: f64,
    pub kv_lora_rank: i32,
    pub q_lora_rank: Option<i32>,
    pub norm_topk_prob: bool,
    pub rms_norm_eps: f64,
    pub topk_group: i32,
    pub num_experts_per_tok: i32,
    pub first_k_dense_replace: i32,
    pub n_group: i32,
    pub qk_rope_head_dim: i32,
    pub qk_nope_head_dim: i32,
    pub v_head_dim: i32,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub rope_interleave: Option<bool>,
    #[serde(default)]
    pub attention_bias: bool,
    /// Required in practice: the Llama-4 query scale reads `llama_4_scaling_beta` and
    /// `original_max_position_embeddings` from it, and it replaces `rope_theta`.
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
}

fn spec(c: &Config) -> MlaSpec {
    MlaSpec {
        hidden: c.hidden_size,
        n_heads: c.num_attention_heads,
        q_lora_rank: c.q_lora_rank,
        kv_lora_rank: c.kv_lora_rank,
        qk_nope_head_dim: c.qk_nope_head_dim,
        qk_rope_head_dim: c.qk_rope_head_dim,
        v_head_dim: c.v_head_dim,
        attention_bias: c.attention_bias,
    }
}

#[derive(Clone)]
struct Attention {
    proj: MlaProjections,
    embed_q: MultiLinear,     // (heads, kv_lora_rank, qk_nope_head_dim)
    unembed_out: MultiLinear, // (heads, v_head_dim, kv_lora_rank)
    scale: f64,
    rope: Rope,
}

impl Part for Attention {
    fn arrays(&self) -> Vec<&Array> {
        [self.proj.arrays(), self.embed_q.arrays(), self.unembed_out.arrays()].concat()
    }

    /// This rank's heads (mlx-lm's `shard`): query rows, the heads' `embed_q`/`unembed_out`,
    /// `o_proj` columns summed over the group.
    fn shard(&self, group: &Group) -> Result<Attention> {
        Ok(Attention {
            proj: self.proj.shard(group)?,
            embed_q: self.embed_q.shard_heads(group)?,
            unembed_out: self.unembed_out.shard_heads(group)?,
            ..self.clone()
        })
    }
}

impl Attention {
    /// x (B, L, hidden), `attn_scale` (L, 1) or (B, 1, L, 1) in float32 -> (B, L, hidden).
    fn forward(&self, x: &Array, attn_scale: &Array, mask: &CacheMask, cache: &mut dyn KvCache) -> Result<Array> {
        let (b, l) = (x.dim(0), x.dim(1));
        if cache.quantization().is_some() {
            return Err(EngineError::Invalid(
                "mistral4 attention reads its cached latent directly: a quantized KV cache (--kv-bits) is not \
                 supported (mlx-lm cannot run it either)"
                    .into(),
            ));
        }
        let p = self.proj.project(x)?;
        let kv_latent = p.kv_latent.expand_dims(&[1])?; // (B, 1, L, kv_lora_rank)
        let q_rope = self.rope.forward_cached(&p.q_pe, cache)?; // (B, H, L, rope)
        let k_rope = self.rope.forward_cached(&p.k_pe, cache)?; // (B, 1, L, rope)
        // The Llama-4 scale applies to the whole query (astype(h.dtype) in the model).
        let attn_scale = attn_scale.astype(x.dtype())?;
        let q_nope = p.q_nope.mul(&attn_scale)?;
        let q_rope = q_rope.mul(&attn_scale)?;
        let (kv_latent, k_rope) = cache.update_and_fetch(&kv_latent, &k_rope)?;
        let scale = self.scale as f32;
        let out = if l == 1 {
            // Decode: attend to the latent directly, the RoPE part as an additive mask.
            let pe_scores = q_rope.mul_scalar(self.scale)?.matmul(&k_rope.swapaxes(-1, -2)?)?; // (B, H, 1, S)
            let pe_scores = match mask {
                CacheMask::Array(m) => {
                    let dt = pe_scores.dtype();
                    ops::where_(m, &pe_scores, &Array::scalar(dt.finfo_min(), dt)?)?
                }
                _ => pe_scores,
            };
            let q = self.embed_q.forward(&q_nope, true)?; // (B, H, 1, kv_lora_rank)
            let out = sdpa(&q, &kv_latent, &kv_latent, scale, Mask::Array(&pe_scores))?;
            self.unembed_out.forward(&out, true)?
        } else {
            let k_nope = self.embed_q.forward(&kv_latent, false)?; // (B, H, S, nope)
            let v = self.unembed_out.forward(&kv_latent, true)?; // (B, H, S, v_head_dim)
            let k_rope = k_rope.broadcast_to(&[k_nope.dim(0), k_nope.dim(1), k_rope.dim(2), k_rope.dim(3)])?; // (B, H, S, rope)
            let q = ops::concatenate(&[&q_nope, &q_rope], -1)?;
            let k = ops::concatenate(&[&k_nope, &k_rope], -1)?;
            sdpa(&q, &k, &v, scale, mask.as_mask())?
        };
        self.proj.o_proj.forward(&out.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
    }
}

/// mistral4's part of the model: the first cache's mask and `_get_llama_4_attn_scale`.
struct Mistral4 {
    model_type: String,
    vocab_size: i32,
    beta: f64,
    original_max: f64,
}

impl Arch for Mistral4 {
    type Attn = Attention;
    type Ffn = Ffn<Gate>;
    type Masks = (CacheMask, Array);

    fn model_type(&self) -> &str {
        &self.model_type
    }

    fn vocab_size(&self) -> i32 {
        self.vocab_size
    }

    /// `1 + beta * log(1 + floor((arange(L) + offset) / original_max))`, (L, 1), or (B, 1, L, 1)
    /// for a batch with one offset per row.
    fn masks(&self, n: i32, _first_layer: usize, cache: &[Box<dyn KvCache>]) -> Result<Self::Masks> {
        let pos = ops::arange(0.0, f64::from(n), 1.0, Dtype::I32)?;
        let pos = match cache[0].row_offsets() {
            Some(rows) => pos.add(&rows.expand_dims(&[1])?)?, // (B, L)
            None => pos.add_scalar(f64::from(cache[0].offset()))?,
        };
        let s = pos.astype(Dtype::F32)?.div_scalar(self.original_max)?.floor()?.add_scalar(1.0)?.log()?;
        let s = s.mul_scalar(self.beta)?.add_scalar(1.0)?;
        let s = if s.ndim() == 2 { s.expand_dims(&[1, 3])? } else { s.expand_dims(&[1])? };
        Ok((cache[0].make_mask(n, None)?, s))
    }

    fn attend(&self, attn: &Attention, x: &Array, _layer: usize, m: &Self::Masks, cache: &mut dyn KvCache) -> Result<Array> {
        attn.forward(x, &m.1, &m.0, cache)
    }
}

/// mlx-lm's `sanitize`: compressed-tensors int4 as MLX affine, FP8 dequantized to bfloat16
/// (block, per-tensor or per-expert scales); the experts fused
/// (`experts.gate_up_proj`, `experts.down_proj`) or per expert stacked into `switch_mlp`;
/// `kv_b_proj` absorbed into `embed_q` / `unembed_out`; rotary frequencies dropped.
pub fn sanitize(config: &serde_json::Value, weights: &mut Weights) -> Result<()> {
    let c: Config = super::parse_config(config)?;
    super::hf_quant::remap_packed_int4(weights)?;
    super::hf_quant::dequantize_fp8_broadcasting(weights)?;
    let spec = spec(&c);
    for i in 0..c.num_hidden_layers {
        let p = format!("model.layers.{i}.mlp");
        if let Some(gate_up) = weights.remove(&format!("{p}.experts.gate_up_proj")) {
            let half = gate_up.dim(1) / 2;
            weights.insert(format!("{p}.switch_mlp.gate_proj.weight"), gate_up.slice_axis(1, 0, half)?);
            weights.insert(format!("{p}.switch_mlp.up_proj.weight"), gate_up.slice_axis(1, half, i32::MAX)?);
        }
        if let Some(down) = weights.remove(&format!("{p}.experts.down_proj")) {
            weights.insert(format!("{p}.switch_mlp.down_proj.weight"), down);
        }
        stack_experts(weights, &p, c.n_routed_experts.unwrap_or(0))?;
        split_kv_b(weights, &format!("model.layers.{i}.self_attn"), &spec)?;
    }
    weights.drop_where(|k| k.contains("rotary_emb.inv_freq"));
    Ok(())
}

pub fn load(config: &serde_json::Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    let c: Config = super::parse_config(config)?;
    let params = c.rope_parameters.clone().ok_or_else(|| {
        EngineError::Config("mistral4 needs rope_parameters (llama_4_scaling_beta, original_max_position_embeddings)".into())
    })?;
    let num = |k: &str| params.get(k).and_then(|v| v.as_f64());
    let need = |k: &str| num(k).ok_or_else(|| EngineError::Config(format!("rope_parameters needs {k}")));
    let (beta, original_max) = (need("llama_4_scaling_beta")?, need("original_max_position_embeddings")?);
    let theta = num("rope_theta").unwrap_or(100000.0);
    let scaling: RopeScaling = serde_json::from_value(params).map_err(|e| EngineError::Config(format!("rope_parameters: {e}")))?;
    let kind = scaling.kind.clone().or_else(|| scaling.rope_type.clone()).unwrap_or_else(|| "default".into());
    let spec = spec(&c);
    // initialize_rope(qk_rope_head_dim, rope_theta, rope_interleave (default True), rope_parameters)
    let traditional = c.rope_interleave.unwrap_or(true);
    let rope = match kind.as_str() {
        "yarn" | "deepseek_yarn" | "telechat3-yarn" => Rope::yarn(c.qk_rope_head_dim, theta, traditional, &scaling)?,
        _ => Rope::new(c.qk_rope_head_dim, theta, traditional, Some(&scaling))?,
    };
    // apply_yarn_mscale(q_head_dim ** -0.5, rope_parameters)
    let scale = spec.scale((kind != "default").then_some(&scaling));
    sanitize(config, weights)?;
    let k = c.num_experts_per_tok;
    // mistral4_expert_select: float32 softmax, group-limited by the two best scores, top-k,
    // normalised with + 1e-20, scaled.
    let routing = Routing {
        float32: true,
        groups: (c.n_group > 1).then_some((c.n_group, c.topk_group, GroupScore::TopTwoSum)),
        normalize: c.norm_topk_prob,
        normalize_eps: Some(1e-20),
        scaling: Some(c.routed_scaling_factor),
        ..Routing::softmax_top_k(k)
    };
    let (d, h) = (c.hidden_size, c.num_attention_heads);
    let vb = weights.view("model");
    let mut layers = Vec::new();
    for i in (0..c.num_hidden_layers).filter(|&i| weights.loads_layer(i)) {
        let l = vb.pp("layers").pp(i);
        let (a, m) = (l.pp("self_attn"), l.pp("mlp"));
        let mlp = match c.n_routed_experts {
            Some(e) if i >= c.first_k_dense_replace => {
                let gate = Gate::load(&m, d, e, routing.clone(), false, q)?;
                Ffn::moe(&m, gate, d, c.moe_intermediate_size, e, c.n_shared_experts, q)?
            }
            _ => Ffn::Dense(GluMlp::load(&m, d, c.intermediate_size, q)?),
        };
        let self_attn = Attention {
            proj: MlaProjections::load(&a, &spec, q)?,
            embed_q: MultiLinear::load(&a.pp("embed_q"), c.qk_nope_head_dim, c.kv_lora_rank, h, q)?,
            unembed_out: MultiLinear::load(&a.pp("unembed_out"), c.kv_lora_rank, c.v_head_dim, h, q)?,
            scale,
            rope: rope.clone(),
        };
        layers.push(Block::load(&l, self_attn, mlp, d, c.rms_norm_eps)?);
    }
    let arch = Mistral4 { model_type: c.model_type.clone(), vocab_size: c.vocab_size, beta, original_max };
    let dims = StackDims { vocab_size: c.vocab_size, hidden: d, rms_norm_eps: c.rms_norm_eps, tie_word_embeddings: c.tie_word_embeddings };
    Ok(Box::new(Stack::load(arch, layers, dims, weights, q)?))
}
