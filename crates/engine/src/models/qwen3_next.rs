//! `qwen3_next` (Qwen3-Next-80B-A3B), as mlx-lm's `models/qwen3_next.py`: gated DeltaNet
//! linear-attention layers ([`crate::nn::gated_delta`], each with an `ArraysCache`) and, every
//! `full_attention_interval`-th layer, gated full attention (queries and an output gate from one
//! `q_proj`, q/k RMS norms, partial RoPE, `o_proj(out * sigmoid(gate))`, a KV cache); the
//! feed-forward part a dense SwiGLU MLP or a sparse block of routed experts with a sigmoid-gated
//! shared expert. qwen3_5.py builds on the same layers ([`Hybrid`] is shared with it), and only
//! its `shard` exists: tensor parallel splits qwen3_5's heads, experts' hidden units and head
//! vocabulary as that `shard` does, and qwen3_next's is refused as mlx-lm has none.
use super::stack::{Arch, Block, Part, Stack, StackDims};
use super::Model;
use crate::cache::{ArraysCache, CacheMask, GrowingCache, KvCache};
use crate::error::{EngineError, Result};
use crate::nn::gated_delta::{DeltaNetLayout, DeltaNetSpec, GatedDeltaNet};
use crate::nn::moe::{stack_experts, Ffn, Gate, GluMlp, Routing, SwitchGlu};
use crate::nn::{QuantConfig, Rope, RopeScaling};
use checkpoint::Weights;
use mlx::distributed::Group;
use mlx::ops::QuantSpec;
use mlx::Array;
use serde::Deserialize;

/// `ModelArgs` of mlx-lm's qwen3_next.py.
#[derive(Debug, Deserialize)]
struct Config {
    model_type: String,
    hidden_size: i32,
    num_hidden_layers: i32,
    intermediate_size: i32,
    num_attention_heads: i32,
    #[serde(flatten)]
    linear: LinearConfig,
    num_experts: i32,
    num_experts_per_tok: i32,
    decoder_sparse_step: i32,
    shared_expert_intermediate_size: i32,
    mlp_only_layers: Vec<i32>,
    moe_intermediate_size: i32,
    rms_norm_eps: f64,
    vocab_size: i32,
    num_key_value_heads: i32,
    rope_theta: f64,
    partial_rotary_factor: f64,
    head_dim: i32,
    #[serde(default)]
    norm_topk_prob: bool,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    rope_scaling: Option<RopeScaling>,
    #[serde(default = "default_interval")]
    full_attention_interval: i32,
}

fn default_interval() -> i32 {
    4
}

/// The linear-attention fields of config.json (qwen3_5.py's defaults where one is missing).
#[derive(Debug, Deserialize)]
#[serde(default)]
pub(crate) struct LinearConfig {
    linear_num_value_heads: i32,
    linear_num_key_heads: i32,
    linear_key_head_dim: i32,
    linear_value_head_dim: i32,
    linear_conv_kernel_dim: i32,
}

impl Default for LinearConfig {
    fn default() -> LinearConfig {
        LinearConfig { linear_num_value_heads: 64, linear_num_key_heads: 16, linear_key_head_dim: 192, linear_value_head_dim: 128, linear_conv_kernel_dim: 4 }
    }
}

impl LinearConfig {
    pub(crate) fn spec(&self, hidden: i32, eps: f64) -> DeltaNetSpec {
        DeltaNetSpec {
            hidden,
            num_v_heads: self.linear_num_value_heads,
            num_k_heads: self.linear_num_key_heads,
            head_k_dim: self.linear_key_head_dim,
            head_v_dim: self.linear_value_head_dim,
            conv_kernel: self.linear_conv_kernel_dim,
            eps,
        }
    }
}

/// A hybrid model as data: the shapes of its layers and, per layer, its kinds.
pub(crate) struct HybridSpec {
    pub model_type: String,
    pub vocab_size: i32,
    pub hidden: i32,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub attention_bias: bool,
    pub rope: Rope,
    pub delta: DeltaNetSpec,
    pub layout: DeltaNetLayout,
    pub intermediate_size: i32,
    /// `(experts, top_k, moe_intermediate_size, shared_expert_intermediate_size, norm_topk_prob)`.
    pub experts: (i32, i32, i32, i32, bool),
    /// Per layer: (linear attention, routed experts).
    pub layers: Vec<(bool, bool)>,
}

mod attention;
pub(crate) use attention::GatedAttention;

/// A layer's token mixer: linear attention or gated full attention.
#[derive(Clone)]
pub(crate) enum Mixer {
    Linear(Box<GatedDeltaNet>),
    Full(Box<GatedAttention>),
}

impl Part for Mixer {
    fn arrays(&self) -> Vec<&Array> {
        match self {
            Mixer::Linear(l) => l.arrays(),
            Mixer::Full(a) => a.arrays(),
        }
    }

    fn shard(&self, group: &Group) -> Result<Mixer> {
        Ok(match self {
            Mixer::Linear(l) => Mixer::Linear(Box::new(l.shard(group)?)),
            Mixer::Full(a) => Mixer::Full(Box::new(a.shard(group)?)),
        })
    }
}

/// The hybrid decoder's part of the model (see [`super::stack::Arch`]).
pub(crate) struct Hybrid {
    model_type: String,
    vocab_size: i32,
    /// Per model layer: whether it is a linear-attention layer.
    linear: Vec<bool>,
    /// Whether mlx-lm's class has `shard`: qwen3_5.py's (separate projections) has, qwen3_next.py's not.
    can_shard: bool,
}

/// The full-attention mask and the linear layers' mask of one forward pass.
pub(crate) struct HybridMasks {
    fa: CacheMask,
    ssm: Option<Array>,
}

impl Arch for Hybrid {
    type Attn = Mixer;
    type Ffn = Ffn<Gate>;
    type Masks = HybridMasks;

    fn model_type(&self) -> &str {
        &self.model_type
    }

    fn vocab_size(&self) -> i32 {
        self.vocab_size
    }

    fn can_shard(&self) -> bool {
        self.can_shard
    }

    /// The gated-delta layers queue about twice an attention block's kernels: Qwen3.5-9B (4-bit,
    /// 5 GB) decoded 11% slower with every weight through the few-row kernel (BENCHMARKS.md).
    fn host_heavy_layers(&self) -> bool {
        true
    }

    /// qwen3_5.py's `shard` splits an untied head's vocabulary.
    fn shards_vocab(&self) -> bool {
        true
    }

    /// mlx-lm's `make_cache`: an ArraysCache(2) per linear layer, a KVCache per full one (also
    /// with `--max-kv-size`, which these models do not take).
    fn make_cache(&self, first_layer: usize, n: usize) -> Vec<Box<dyn KvCache>> {
        self.linear[first_layer..first_layer + n]
            .iter()
            .map(|&lin| if lin { Box::new(ArraysCache::new(2)) as Box<dyn KvCache> } else { Box::new(GrowingCache::new()) })
            .collect()
    }

    fn make_prompt_cache(&self, first_layer: usize, n: usize, _max_kv_size: Option<i32>) -> Vec<Box<dyn KvCache>> {
        self.make_cache(first_layer, n)
    }

    /// `create_attention_mask` from the first full layer's cache, `create_ssm_mask` from the
    /// first linear layer's.
    fn masks(&self, n: i32, first_layer: usize, cache: &[Box<dyn KvCache>]) -> Result<HybridMasks> {
        let kinds = &self.linear[first_layer..first_layer + cache.len()];
        let fa = match kinds.iter().position(|l| !l) {
            Some(i) => cache[i].make_mask(n, None)?,
            None => CacheMask::None,
        };
        let ssm = match kinds.iter().position(|l| *l).map(|i| cache[i].make_mask(n, None)).transpose()? {
            Some(CacheMask::Array(a)) => Some(a),
            _ => None,
        };
        Ok(HybridMasks { fa, ssm })
    }

    fn attend(&self, attn: &Mixer, x: &Array, _layer: usize, masks: &HybridMasks, cache: &mut dyn KvCache) -> Result<Array> {
        match attn {
            Mixer::Full(a) => a.forward(x, &masks.fa, cache),
            Mixer::Linear(l) => {
                let state = cache.as_arrays_mut().ok_or_else(|| EngineError::Invalid("a linear-attention layer needs its ArraysCache".into()))?;
                l.forward(x, masks.ssm.as_ref(), state)
            }
        }
    }
}

/// Builds the model of `s` from `weights` (named `model.layers.N...`, `lm_head`).
pub(crate) fn build(s: HybridSpec, weights: &Weights, q: &QuantConfig) -> Result<Stack<Hybrid>> {
    if s.heads <= 0 || s.kv_heads <= 0 || s.heads % s.kv_heads != 0 || s.head_dim <= 0 {
        return Err(EngineError::Config(format!("{} attention heads and {} key/value heads do not fit together", s.heads, s.kv_heads)));
    }
    let (d, (experts, top_k, moe_inter, shared_inter, norm_topk)) = (s.hidden, s.experts);
    // Qwen3NextSparseMoeBlock: softmax (precise), `argpartition(gates, kth=-k)[..., -k:]`,
    // renormalised with norm_topk_prob, plus the sigmoid-gated shared expert.
    let routing = Routing { select_from_top: true, normalize: norm_topk, ..Routing::softmax_top_k(top_k) };
    let vb = weights.view("model");
    let mut layers = Vec::new();
    for (i, &(linear, moe)) in s.layers.iter().enumerate().filter(|(i, _)| weights.loads_layer(*i as i32)) {
        let l = vb.pp("layers").pp(i);
        let mixer = match linear {
            true => Mixer::Linear(Box::new(GatedDeltaNet::load(&l.pp("linear_attn"), s.delta, s.layout, q)?)),
            false => Mixer::Full(Box::new(GatedAttention::load(&l.pp("self_attn"), &s, q)?)),
        };
        let m = l.pp("mlp");
        let mlp = match moe {
            true => Ffn::Moe {
                gate: Gate::load(&m, d, experts, routing.clone(), true, q)?,
                switch_mlp: SwitchGlu::load(&m.pp("switch_mlp"), d, moe_inter, experts, q)?,
                shared_experts: Some(GluMlp::load(&m.pp("shared_expert"), d, shared_inter, q)?),
                reduce: None,
            },
            false => Ffn::Dense(GluMlp::load(&m, d, s.intermediate_size, q)?),
        };
        layers.push(Block::load(&l, mixer, mlp, d, s.rms_norm_eps)?);
    }
    let dims = StackDims { vocab_size: s.vocab_size, hidden: d, rms_norm_eps: s.rms_norm_eps, tie_word_embeddings: s.tie_word_embeddings };
    let linear = s.layers.iter().map(|l| l.0).collect();
    let arch = Hybrid { model_type: s.model_type, vocab_size: s.vocab_size, linear, can_shard: s.layout == DeltaNetLayout::Separate };
    Stack::load(arch, layers, dims, weights, q)
}

/// Whether layer `i` is a linear-attention layer (`(i + 1) % full_attention_interval != 0`).
pub(crate) fn is_linear(i: i32, interval: i32) -> Result<bool> {
    if interval <= 0 {
        return Err(EngineError::Config(format!("full_attention_interval {interval} must be positive")));
    }
    Ok((i + 1) % interval != 0)
}

/// The models' `quant_predicate`: routers and shared-expert gates in 8 bits, group 64.
pub fn quant_override(path: &str) -> Option<QuantSpec> {
    (path.ends_with("mlp.gate") || path.ends_with("shared_expert_gate")).then_some(QuantSpec::affine(64, 8))
}

/// mlx-lm's `sanitize`, which does nothing unless per-expert tensors are present (a Hugging Face
/// checkpoint): then no `mtp.` tensors, a tied head dropped, the experts stacked into
/// `switch_mlp`, the convolution weights moved to (C, K, 1), and 1 added to the 1-d RMS norm
/// weights (Hugging Face stores them as offsets from 1).
pub fn sanitize(config: &serde_json::Value, weights: &mut Weights) -> Result<()> {
    let c: Config = super::parse_config(config)?;
    let moe_layers: Vec<i32> = (0..c.num_hidden_layers).filter(|i| weights.contains(&format!("model.layers.{i}.mlp.experts.0.up_proj.weight"))).collect();
    if moe_layers.is_empty() {
        return Ok(());
    }
    weights.drop_where(|k| k.contains("mtp."));
    if c.tie_word_embeddings {
        weights.drop_where(|k| k == "lm_head.weight");
    }
    for l in moe_layers {
        stack_experts(weights, &format!("model.layers.{l}.mlp"), c.num_experts)?;
    }
    super::sanitize_weights(weights, |w| fix_conv_and_norms(w, true))
}

/// The conv1d weights (C, 1, K) -> (C, K, 1); with `norms`, 1 + each 1-d RMS norm weight.
pub(crate) fn fix_conv_and_norms(w: &mut std::collections::BTreeMap<String, Array>, norms: bool) -> Result<()> {
    const NORMS: [&str; 5] = [".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight", ".q_norm.weight", ".k_norm.weight"];
    for (k, v) in w.iter_mut() {
        if k.contains("conv1d.weight") && v.ndim() == 3 && v.dim(-1) != 1 {
            *v = v.swapaxes(1, 2)?; // moveaxis(2, 1) of a 3-d array
        }
        if norms && NORMS.iter().any(|s| k.ends_with(s)) && v.ndim() == 1 {
            *v = v.add_scalar(1.0)?;
        }
    }
    Ok(())
}

pub fn load(config: &serde_json::Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    sanitize(config, weights)?;
    let c: Config = super::parse_config(config)?;
    if c.decoder_sparse_step <= 0 {
        return Err(EngineError::Config(format!("decoder_sparse_step {} must be positive", c.decoder_sparse_step)));
    }
    let rope_dims = (f64::from(c.head_dim) * c.partial_rotary_factor) as i32;
    let layers = (0..c.num_hidden_layers)
        .map(|i| {
            let moe = !c.mlp_only_layers.contains(&i) && c.num_experts > 0 && (i + 1) % c.decoder_sparse_step == 0;
            Ok((is_linear(i, c.full_attention_interval)?, moe))
        })
        .collect::<Result<Vec<_>>>()?;
    let spec = HybridSpec {
        model_type: c.model_type.clone(),
        vocab_size: c.vocab_size,
        hidden: c.hidden_size,
        rms_norm_eps: c.rms_norm_eps,
        tie_word_embeddings: c.tie_word_embeddings,
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
        attention_bias: c.attention_bias,
        rope: Rope::new(rope_dims, c.rope_theta, false, c.rope_scaling.as_ref())?,
        delta: c.linear.spec(c.hidden_size, c.rms_norm_eps),
        layout: DeltaNetLayout::Fused,
        intermediate_size: c.intermediate_size,
        experts: (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.shared_expert_intermediate_size, c.norm_topk_prob),
        layers,
    };
    Ok(Box::new(build(spec, weights, q)?))
}
