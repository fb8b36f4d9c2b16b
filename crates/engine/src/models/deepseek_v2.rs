//! `deepseek_v2` (DeepSeek-V2, V2-Lite, Coder-V2) as mlx-lm's `models/deepseek_v2.py`.
//!
//! Multi-head latent attention whose cache holds, per head, the decompressed keys (no-RoPE part and
//! the shared RoPE key) and values, as mlx-lm's; YaRN rope; the first `first_k_dense_replace`
//! layers dense, then mixture-of-experts layers (softmax routing, optionally group-limited, plus
//! shared experts).
use super::stack::{Arch, Block, Part, Stack, StackDims};
use super::Model;
use crate::cache::{quantized_sdpa, CacheMask, KvCache};
use crate::error::{EngineError, Result};
use crate::nn::mla::{MlaProjections, MlaSpec};
use crate::nn::moe::{stack_experts, Ffn, Gate, GluMlp, GroupScore, Routing};
use crate::nn::{Linear, QuantConfig, Rope, RopeScaling};
use crate::shard::ShardMode;
use checkpoint::{Vb, Weights};
use mlx::distributed::Group;
use mlx::fast::Mask;
use mlx::{ops, Array};
use serde::Deserialize;

/// `ModelArgs` of mlx-lm's deepseek_v2.py (defaults in [`defaults`]).
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
    pub qk_rope_head_dim: i32,
    pub v_head_dim: i32,
    pub qk_nope_head_dim: i32,
    pub topk_method: String,
    pub n_group: Option<i32>,
    pub topk_group: Option<i32>,
    pub num_experts_per_tok: Option<i32>,
    pub moe_layer_freq: i32,
    pub first_k_dense_replace: i32,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub attention_bias: bool,
}

/// The dataclass defaults shared by deepseek_v2.py and deepseek_v3.py.
fn defaults() -> serde_json::Value {
    serde_json::json!({
        "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 11008,
        "moe_intermediate_size": 1407, "num_hidden_layers": 30, "num_attention_heads": 32,
        "n_shared_experts": null, "n_routed_experts": null, "routed_scaling_factor": 1.0,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "qk_nope_head_dim": 128, "moe_layer_freq": 1, "first_k_dense_replace": 0,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": null, "attention_bias": false,
        "topk_method": "gready", "n_group": null, "topk_group": null, "num_experts_per_tok": null,
    })
}

/// config.json over the dataclass defaults, then `overrides` (V3's own defaults) under config.json.
pub(super) fn parse<T: serde::de::DeserializeOwned>(config: &serde_json::Value, overrides: serde_json::Value) -> Result<T> {
    let mut merged = defaults();
    for source in [overrides, config.clone()] {
        if let (Some(m), Some(src)) = (merged.as_object_mut(), source.as_object()) {
            for (k, v) in src {
                m.insert(k.clone(), v.clone());
            }
        }
    }
    serde_json::from_value(merged).map_err(|e| EngineError::Config(e.to_string()))
}

pub(super) fn mla_spec(c: &Config) -> MlaSpec {
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

/// Whether layer `i` is a mixture-of-experts layer (else dense), as both files decide.
pub(super) fn is_moe(n_routed: Option<i32>, first_dense: i32, freq: i32, i: i32) -> bool {
    n_routed.is_some() && i >= first_dense && freq != 0 && i % freq == 0
}

#[derive(Clone)]
struct Attention {
    proj: MlaProjections,
    kv_b_proj: Linear,
    spec: MlaSpec,
    scale: f32,
    rope: Rope,
}

impl Attention {
    /// This rank's heads: the query and `kv_b_proj` rows, `o_proj` columns (mlx-lm's `shard`).
    fn shard(&self, group: &Group) -> Result<Attention> {
        let proj = self.proj.shard(group)?;
        let kv_b_proj = self.kv_b_proj.shard(ShardMode::AllToSharded, &[self.kv_b_proj.out_dims()], group)?;
        Ok(Attention { spec: proj.spec().clone(), proj, kv_b_proj, ..self.clone() })
    }

    fn forward(&self, x: &Array, mask: Mask<'_>, cache: &mut dyn KvCache) -> Result<Array> {
        let (b, l, h, nope) = (x.dim(0), x.dim(1), self.spec.n_heads, self.spec.qk_nope_head_dim);
        let p = self.proj.project(x)?;
        let kv = self.kv_b_proj.forward(&p.kv_latent)?.reshape(&[b, l, h, -1])?.transpose(&[0, 2, 1, 3])?;
        let (k_nope, values) = (kv.slice_axis(-1, 0, nope)?, kv.slice_axis(-1, nope, i32::MAX)?);
        let q_pe = self.rope.forward_cached(&p.q_pe, cache)?;
        let k_pe = self.rope.forward_cached(&p.k_pe, cache)?;
        // mx.repeat(k_pe, heads, axis=1): one copy (a concatenation of h copies would be h kernels on CUDA).
        let k_pe = k_pe.repeat(h, 1)?;
        let keys = ops::concatenate(&[&k_nope, &k_pe], -1)?;
        let queries = ops::concatenate(&[&p.q_nope, &q_pe], -1)?;
        let out = match cache.quantization() {
            Some(spec) => {
                let (k, v) = cache.update_and_fetch_quantized(&keys, &values)?;
                quantized_sdpa(&queries, &k, &v, self.scale, mask, spec)?
            }
            None => {
                let (k, v) = cache.update_and_fetch(&keys, &values)?;
                crate::nn::sdpa::sdpa(&queries, &k, &v, self.scale, mask)?
            }
        };
        self.proj.o_proj.forward(&out.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
    }
}

impl Part for Attention {
    fn arrays(&self) -> Vec<&Array> {
        let mut v = self.proj.arrays();
        v.extend(self.kv_b_proj.arrays());
        v
    }

    fn shard(&self, group: &Group) -> Result<Attention> {
        Attention::shard(self, group)
    }
}

/// deepseek_v2's part of the model (see [`super::stack::Arch`]): the mask of the first cache.
struct DeepseekV2 {
    model_type: String,
    vocab_size: i32,
}

impl Arch for DeepseekV2 {
    type Attn = Attention;
    type Ffn = Ffn<Gate>;
    type Masks = CacheMask;

    fn model_type(&self) -> &str {
        &self.model_type
    }

    fn vocab_size(&self) -> i32 {
        self.vocab_size
    }

    fn masks(&self, n: i32, _first_layer: usize, cache: &[Box<dyn KvCache>]) -> Result<CacheMask> {
        cache[0].make_mask(n, None)
    }

    fn attend(&self, attn: &Attention, x: &Array, _layer: usize, mask: &CacheMask, cache: &mut dyn KvCache) -> Result<Array> {
        attn.forward(x, mask.as_mask(), cache)
    }
}

fn load_moe(vb: &Vb<'_>, c: &Config, q: &QuantConfig) -> Result<Ffn<Gate>> {
    let experts = c.n_routed_experts.unwrap_or(0);
    let top_k = c.num_experts_per_tok.ok_or_else(|| EngineError::Config("num_experts_per_tok is missing".into()))?;
    let groups = if c.topk_method == "group_limited_greedy" {
        match (c.n_group, c.topk_group) {
            (Some(g), Some(t)) if g > 0 && experts % g == 0 => Some((g, t, GroupScore::Max)),
            _ => return Err(EngineError::Config("group_limited_greedy needs n_group dividing the experts and topk_group".into())),
        }
    } else {
        None
    };
    // MoEGate: softmax scores, optionally group-limited, top-k, scaled.
    let routing = Routing { groups, scaling: Some(c.routed_scaling_factor), ..Routing::softmax_top_k(top_k) };
    let gate = Gate::load_float(vb, c.hidden_size, experts, routing, false)?;
    Ffn::moe(vb, gate, c.hidden_size, c.moe_intermediate_size, experts, c.n_shared_experts, q)
}

pub fn load(config: &serde_json::Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    let c: Config = parse(config, serde_json::json!({}))?;
    let scaling = c.rope_scaling.clone().ok_or_else(|| EngineError::Config("deepseek_v2 needs rope_scaling (mlx-lm reads its factor)".into()))?;
    let spec = mla_spec(&c);
    // DeepseekV2YarnRotaryEmbedding: YaRN whatever the type says, traditional.
    let rope = Rope::yarn(c.qk_rope_head_dim, c.rope_theta, true, &scaling)?;
    let scale = spec.scale(Some(&scaling)) as f32;
    // sanitize: stack the experts; nothing is dropped.
    for i in 0..c.num_hidden_layers {
        stack_experts(weights, &format!("model.layers.{i}.mlp"), c.n_routed_experts.unwrap_or(0))?;
    }
    let vb = weights.view("model");
    let mut layers = Vec::with_capacity(c.num_hidden_layers.max(0) as usize);
    for i in (0..c.num_hidden_layers).filter(|&i| weights.loads_layer(i)) {
        let l = vb.pp("layers").pp(i);
        let a = l.pp("self_attn");
        let kv_b_out = c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim);
        let mlp = if is_moe(c.n_routed_experts, c.first_k_dense_replace, c.moe_layer_freq, i) {
            load_moe(&l.pp("mlp"), &c, q)?
        } else {
            Ffn::Dense(GluMlp::load(&l.pp("mlp"), c.hidden_size, c.intermediate_size, q)?)
        };
        let self_attn = Attention {
            proj: MlaProjections::load(&a, &spec, q)?,
            kv_b_proj: Linear::load(&a.pp("kv_b_proj"), c.kv_lora_rank, kv_b_out, false, q)?,
            spec: spec.clone(),
            scale,
            rope: rope.clone(),
        };
        layers.push(Block::load(&l, self_attn, mlp, c.hidden_size, c.rms_norm_eps)?);
    }
    let arch = DeepseekV2 { model_type: c.model_type.clone(), vocab_size: c.vocab_size };
    Ok(Box::new(Stack::load(arch, layers, stack_dims(&c), weights, q)?))
}

/// The skeleton's sizes: both DeepSeek files have a separate head.
pub(super) fn stack_dims(c: &Config) -> StackDims {
    StackDims { vocab_size: c.vocab_size, hidden: c.hidden_size, rms_norm_eps: c.rms_norm_eps, tie_word_embeddings: false }
}
