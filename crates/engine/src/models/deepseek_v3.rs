//! `deepseek_v3` (DeepSeek-V3, R1, and Kimi-K2-style checkpoints) as mlx-lm's `models/deepseek_v3.py`.
//!
//! Multi-head latent attention in absorbed form: the cache holds the normalised compressed latent
//! (as keys, one shared head) and the RoPE key (as values), as mlx-lm's does; `kv_b_proj` is split
//! at load into per-head `embed_q` / `unembed_out` matrices. Sigmoid routing with
//! `e_score_correction_bias`, group-limited top-k, normalised weights and shared experts.
use super::deepseek_v2::{is_moe, mla_spec, parse, stack_dims, Config as V2Config};
use super::stack::{Arch, Block, Part, Stack};
use std::marker::PhantomData;
use super::Model;
use crate::cache::{create_causal_mask, CacheMask, KvCache};
use crate::error::{EngineError, Result};
use crate::nn::mla::{MlaInputs, MlaProjections, MlaSpec, MultiLinear};
use crate::nn::moe::{stack_experts, Ffn, Gate, GluMlp, GroupScore, Routing, Scoring};
use crate::nn::{QuantConfig, Rope, RopeScaling};
use checkpoint::{Vb, Weights};
use mlx::distributed::Group;
use mlx::fast::Mask;
use mlx::ops::{self, QuantSpec};
use mlx::Array;
use serde::Deserialize;

/// The fields of deepseek_v3.py's `ModelArgs` that V2's lacks (the rest read as [`V2Config`]).
#[derive(Debug, Deserialize)]
pub(super) struct V3Fields {
    norm_topk_prob: bool,
    n_group: i32,
    topk_group: i32,
    num_experts_per_tok: i32,
    topk_method: String,
}

/// deepseek_v3.py's defaults where they differ from deepseek_v2.py's.
pub(super) fn v3_defaults() -> serde_json::Value {
    serde_json::json!({
        "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true,
        "n_group": 1, "topk_group": 1, "num_experts_per_tok": 1,
    })
}

#[derive(Clone)]
pub(super) struct Attention {
    proj: MlaProjections,
    embed_q: MultiLinear,     // (heads, kv_lora_rank, qk_nope_head_dim)
    unembed_out: MultiLinear, // (heads, v_head_dim, kv_lora_rank)
    scale: f64,
    rope: Rope,
}

impl Attention {
    /// This rank's heads (mlx-lm's `shard`): the query rows, the heads' `embed_q`/`unembed_out`,
    /// and `o_proj` columns summed over the group.
    fn shard(&self, group: &Group) -> Result<Attention> {
        Ok(Attention {
            proj: self.proj.shard(group)?,
            embed_q: self.embed_q.shard_heads(group)?,
            unembed_out: self.unembed_out.shard_heads(group)?,
            ..self.clone()
        })
    }

    /// The projections, RoPE at the cache's positions and the cache update: the inputs with
    /// `q_pe` rotated, and every cached latent (B, 1, S, kv_lora_rank) and RoPE key (B, 1, S, rope).
    pub(super) fn project_and_cache(&self, x: &Array, cache: &mut dyn KvCache) -> Result<(MlaInputs, Array, Array)> {
        let p = self.proj.project(x)?;
        let q_pe = self.rope.forward_cached(&p.q_pe, cache)?;
        let k_pe = self.rope.forward_cached(&p.k_pe, cache)?;
        let kv_latent = p.kv_latent.expand_dims(&[1])?; // (B, 1, L, kv_lora_rank)
        if cache.quantization().is_some() {
            return Err(EngineError::Invalid(
                "deepseek_v3 attention reads its cached latent directly: a quantized KV cache (--kv-bits) \
                 is not supported (mlx-lm cannot run it either)"
                    .into(),
            ));
        }
        let (kv_latent, k_pe) = cache.update_and_fetch(&kv_latent, &k_pe)?;
        Ok((MlaInputs { q_pe, ..p }, kv_latent, k_pe))
    }

    /// Absorbed attention of `q_nope` / `q_pe` (B, H, L, .) over the latents `kv_latent`
    /// (B, 1, S, kv_lora_rank) and RoPE keys `k_pe` (B, 1, S, rope), with the boolean `mask`
    /// ((L, S) or (B, 1, L, S); `None`: all); -> (B, L, hidden).
    pub(super) fn attend(&self, q_nope: &Array, q_pe: &Array, kv_latent: &Array, k_pe: &Array, mask: Option<&Array>) -> Result<Array> {
        let (b, l) = (q_nope.dim(0), q_nope.dim(2));
        let pe_scores = q_pe.mul_scalar(self.scale)?.matmul(&k_pe.swapaxes(-1, -2)?)?; // (B, H, L, S)
        let pe_scores = match mask {
            Some(m) => {
                let dt = pe_scores.dtype();
                ops::where_(m, &pe_scores, &Array::scalar(dt.finfo_min(), dt)?)?
            }
            None => pe_scores,
        };
        let scale = self.scale as f32;
        let out = if l == 1 {
            let q_nope = self.embed_q.forward(q_nope, true)?; // (B, H, 1, kv_lora_rank)
            let out = crate::nn::sdpa::sdpa(&q_nope, kv_latent, kv_latent, scale, Mask::Array(&pe_scores))?;
            self.unembed_out.forward(&out, true)?
        } else {
            let k = self.embed_q.forward(kv_latent, false)?;
            let v = self.unembed_out.forward(kv_latent, true)?;
            crate::nn::sdpa::sdpa(q_nope, &k, &v, scale, Mask::Array(&pe_scores))?
        };
        self.proj.o_proj.forward(&out.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
    }

    /// `mask`: the boolean causal mask (mlx-lm's `return_array=True`), `None` for one position.
    fn forward(&self, x: &Array, mask: Option<&Array>, cache: &mut dyn KvCache) -> Result<Array> {
        let (p, kv_latent, k_pe) = self.project_and_cache(x, cache)?;
        self.attend(&p.q_nope, &p.q_pe, &kv_latent, &k_pe, mask)
    }
}

impl Part for Attention {
    fn arrays(&self) -> Vec<&Array> {
        let mut v = self.proj.arrays();
        v.extend(self.embed_q.arrays());
        v.extend(self.unembed_out.arrays());
        v
    }

    fn shard(&self, group: &Group) -> Result<Attention> {
        Attention::shard(self, group)
    }
}

/// The attention of a DeepSeek-V3-style layer: V3's own, or deepseek_v32's sparse one over it.
pub(super) trait LatentAttention: Part + 'static {
    /// `mask`: the boolean causal mask (mlx-lm's `return_array=True`), `None` for one position.
    fn forward(&self, x: &Array, mask: Option<&Array>, cache: &mut dyn KvCache) -> Result<Array>;
    /// The layer's own cache (the model's `make_cache`), `None`: mlx-lm's default caches.
    fn own_cache() -> Option<Box<dyn KvCache>> {
        None
    }
}

impl LatentAttention for Attention {
    fn forward(&self, x: &Array, mask: Option<&Array>, cache: &mut dyn KvCache) -> Result<Array> {
        Attention::forward(self, x, mask, cache)
    }
}

/// deepseek_v3's part of the model (see [`super::stack::Arch`]), with attention `A`: the boolean
/// mask of the first cache (`create_attention_mask(h, cache[0], return_array=True)`).
pub(super) struct DeepseekV3<A> {
    model_type: String,
    vocab_size: i32,
    attn: PhantomData<fn() -> A>,
}

impl<A: LatentAttention> Arch for DeepseekV3<A> {
    type Attn = A;
    type Ffn = Ffn<Gate>;
    type Masks = Option<Array>;

    fn model_type(&self) -> &str {
        &self.model_type
    }

    fn vocab_size(&self) -> i32 {
        self.vocab_size
    }

    /// "causal" comes back as its array.
    fn masks(&self, n: i32, _first_layer: usize, cache: &[Box<dyn KvCache>]) -> Result<Option<Array>> {
        Ok(match cache[0].make_mask(n, None)? {
            CacheMask::None => None,
            CacheMask::Causal => Some(create_causal_mask(n, cache[0].offset(), None)?),
            CacheMask::Array(a) => Some(a),
        })
    }

    fn attend(&self, attn: &A, x: &Array, _layer: usize, mask: &Option<Array>, cache: &mut dyn KvCache) -> Result<Array> {
        attn.forward(x, mask.as_ref(), cache)
    }

    fn make_cache(&self, first_layer: usize, n: usize) -> Vec<Box<dyn KvCache>> {
        self.make_prompt_cache(first_layer, n, None)
    }

    fn make_prompt_cache(&self, _first_layer: usize, n: usize, max_kv_size: Option<i32>) -> Vec<Box<dyn KvCache>> {
        match A::own_cache() {
            Some(_) => (0..n).filter_map(|_| A::own_cache()).collect(),
            None => super::default_caches(n, max_kv_size),
        }
    }
}

/// sanitize's `kv_b_proj` split: per head, the no-RoPE key rows transposed into `embed_q` and the
/// value rows into `unembed_out` (dequantized first and quantized again alike when quantized).
/// Also mistral4's.
pub(super) fn split_kv_b(weights: &mut Weights, prefix: &str, c: &MlaSpec) -> Result<()> {
    let Some(mut v) = weights.remove(&format!("{prefix}.kv_b_proj.weight")) else { return Ok(()) };
    let mut spec = None;
    if weights.contains(&format!("{prefix}.kv_b_proj.scales")) {
        let missing = |n: &str| EngineError::missing_tensor(format!("{prefix}.kv_b_proj.{n}"));
        let scales = weights.remove(&format!("{prefix}.kv_b_proj.scales")).ok_or_else(|| missing("scales"))?;
        let biases = weights.remove(&format!("{prefix}.kv_b_proj.biases")).ok_or_else(|| missing("biases"))?;
        let dims = c.kv_lora_rank;
        let q = QuantSpec::affine(dims / scales.dim(-1).max(1), v.dim(-1) * 32 / dims);
        v = ops::dequantize(&v, &scales, Some(&biases), q)?;
        spec = Some(q);
    }
    let nope = c.qk_nope_head_dim;
    let v = v.reshape(&[c.n_heads, nope + c.v_head_dim, -1])?;
    let wk = v.slice_axis(1, 0, nope)?.swapaxes(-1, -2)?.contiguous()?;
    let wv = v.slice_axis(1, nope, i32::MAX)?.contiguous()?;
    for (name, w) in [("embed_q", wk), ("unembed_out", wv)] {
        match spec {
            Some(q) => {
                let (w, s, b) = ops::quantize_affine(&w, q)?;
                weights.insert(format!("{prefix}.{name}.weight"), w);
                weights.insert(format!("{prefix}.{name}.scales"), s);
                weights.insert(format!("{prefix}.{name}.biases"), b);
            }
            None => weights.insert(format!("{prefix}.{name}.weight"), w),
        }
    }
    Ok(())
}

/// Layer `i`'s feed-forward part: dense, or (`is_moe`) V3's routed + shared experts.
pub(super) fn load_ffn(l: &Vb<'_>, i: i32, c: &V2Config, r: &V3Fields, q: &QuantConfig) -> Result<Ffn<Gate>> {
    let (m, d) = (l.pp("mlp"), c.hidden_size);
    if !is_moe(c.n_routed_experts, c.first_k_dense_replace, c.moe_layer_freq, i) {
        return Ok(Ffn::Dense(GluMlp::load(&m, d, c.intermediate_size, q)?));
    }
    let experts = c.n_routed_experts.unwrap_or(0);
    // MoEGate and the compiled group_expert_select: sigmoid scores in float32 plus the
    // correction bias choose (group-limited), the uncorrected scores weigh, normalised, scaled.
    let k = r.num_experts_per_tok;
    let routing = Routing {
        scoring: Scoring::Sigmoid,
        float32: true,
        groups: (r.n_group > 1).then_some((r.n_group, r.topk_group, GroupScore::TopTwoSum)),
        normalize: k > 1 && r.norm_topk_prob,
        scaling: Some(c.routed_scaling_factor),
        ..Routing::softmax_top_k(k)
    };
    let gate = Gate::load_float(&m, d, experts, routing, true)?;
    Ffn::moe(&m, gate, d, c.moe_intermediate_size, experts, c.n_shared_experts, q)
}

impl Attention {
    /// `self_attn` of a layer (`a`), its `kv_b_proj` already split by [`split_kv_b`]; the rope
    /// and the softmax scale as [`load_as`] makes them.
    pub(super) fn load(a: &Vb<'_>, c: &V2Config, spec: &MlaSpec, rope: &Rope, scale: f64, q: &QuantConfig) -> Result<Attention> {
        let h = c.num_attention_heads;
        Ok(Attention {
            proj: MlaProjections::load(a, spec, q)?,
            embed_q: MultiLinear::load(&a.pp("embed_q"), c.qk_nope_head_dim, c.kv_lora_rank, h, q)?,
            unembed_out: MultiLinear::load(&a.pp("unembed_out"), c.kv_lora_rank, c.v_head_dim, h, q)?,
            scale,
            rope: rope.clone(),
        })
    }
}

/// `initialize_rope(dims, base, traditional=True, scaling_config)` for the kinds DeepSeek uses.
fn rope_for(dims: i32, base: f64, scaling: Option<&RopeScaling>) -> Result<Rope> {
    let kind = scaling.and_then(|s| s.kind.clone().or_else(|| s.rope_type.clone()));
    match (kind.as_deref(), scaling) {
        (Some("yarn" | "deepseek_yarn" | "telechat3-yarn"), Some(s)) => Rope::yarn(dims, base, true, s),
        _ => Rope::new(dims, base, true, scaling),
    }
}

/// How many randomly initialised modules deepseek_v3.py's (and deepseek_v32.py's) classes make
/// for the checkpoint tensor `{base}.weight` (`--seed` counts mlx-lm's draws at load): none for the
/// router (`MoEGate.weight` starts as zeros) and for experts after the first (stacked into one
/// `SwitchLinear`), two for `kv_b_proj` (`embed_q` and `unembed_out`).
pub fn init_modules(base: &str) -> usize {
    let expert = base.split_once(".experts.").and_then(|(_, rest)| rest.split('.').next()?.parse::<u32>().ok());
    match expert {
        Some(e) if e > 0 => 0,
        _ if base.ends_with(".mlp.gate") => 0,
        _ if base.ends_with(".kv_b_proj") => 2,
        _ => 1,
    }
}

/// The config as deepseek_v3.py reads it (V2's fields and V3's own) over `defaults` (V3's, or a
/// V3 variant's), `topk_method` checked.
pub(super) fn parse_v3(config: &serde_json::Value, defaults: serde_json::Value) -> Result<(V2Config, V3Fields)> {
    let c: V2Config = parse(config, defaults.clone())?;
    let r: V3Fields = parse(config, defaults)?;
    if r.topk_method != "noaux_tc" {
        return Err(EngineError::Config(format!("topk_method {:?} is not supported (mlx-lm: noaux_tc)", r.topk_method)));
    }
    Ok((c, r))
}

/// The layers this process loads, each `Block(attn(layer weights, rope, scale), load_ffn)`, in
/// the skeleton with attention `A`: the weights already sanitized.
pub(super) fn load_as<A: LatentAttention>(
    c: &V2Config,
    r: &V3Fields,
    weights: &Weights,
    q: &QuantConfig,
    attn: impl Fn(&Vb<'_>, &Rope, f64) -> Result<A>,
) -> Result<Box<dyn Model>> {
    let spec = mla_spec(c);
    let rope = rope_for(c.qk_rope_head_dim, c.rope_theta, c.rope_scaling.as_ref())?;
    let scale = spec.scale(c.rope_scaling.as_ref());
    let vb = weights.view("model");
    let mut layers = Vec::new();
    for i in (0..c.num_hidden_layers).filter(|&i| weights.loads_layer(i)) {
        let l = vb.pp("layers").pp(i);
        let self_attn = attn(&l.pp("self_attn"), &rope, scale)?;
        layers.push(Block::load(&l, self_attn, load_ffn(&l, i, c, r, q)?, c.hidden_size, c.rms_norm_eps)?);
    }
    let arch = DeepseekV3 { model_type: c.model_type.clone(), vocab_size: c.vocab_size, attn: PhantomData };
    Ok(Box::new(Stack::load(arch, layers, stack_dims(c), weights, q)?))
}

pub fn load(config: &serde_json::Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    let (c, r) = parse_v3(config, v3_defaults())?;
    let spec = mla_spec(&c);
    // sanitize: int4 and FP8 checkpoints as published, stack experts, split kv_b_proj, drop the
    // multi-token-prediction layer (61) and precomputed rotary frequencies.
    super::hf_quant::sanitize(weights)?;
    for i in 0..c.num_hidden_layers {
        stack_experts(weights, &format!("model.layers.{i}.mlp"), c.n_routed_experts.unwrap_or(0))?;
        split_kv_b(weights, &format!("model.layers.{i}.self_attn"), &spec)?;
    }
    weights.drop_where(|n| n.starts_with("model.layers.61") || n.contains("rotary_emb.inv_freq"));
    load_as(&c, &r, weights, q, |a, rope, scale| Attention::load(a, &c, &spec, rope, scale, q))
}
