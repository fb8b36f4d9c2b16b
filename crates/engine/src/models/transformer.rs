//! The decoder-only transformer that Llama, Mistral, Qwen2, Qwen3, Ministral 3 and Llama 4 share:
//! embedding, pre-norm blocks (attention + a feed-forward part, residuals), final norm and a tied
//! or separate head. Each layer has its attention kind (full, sliding window, chunked; with or
//! without RoPE) and the cache mlx-lm's `make_cache` gives it; an architecture file reads its
//! config into a [`DecoderSpec`] (and may bring its own feed-forward parts: qwen2_moe's, qwen3_moe's
//! and mixtral's experts, llama4's); the skeleton is [`super::stack`]'s.
use super::stack::{Arch, Block, FeedForward, Part, Stack, StackDims};
use crate::cache::{CacheMask, ChunkedCache, GrowingCache, KvCache, RotatingCache};
use crate::error::{EngineError, Result};
use crate::nn::{Attention, AttentionSpec, GateUp, Linear, PlainQkNorm, QuantConfig, Rope};
use crate::shard::ShardMode;
use checkpoint::{Vb, Weights};
use mlx::distributed::Group;
use mlx::{ops, Array, Dtype};
use std::marker::PhantomData;

/// Everything that distinguishes one dense architecture from another.
#[derive(Clone, Debug)]
pub struct DecoderSpec {
    pub model_type: String,
    pub vocab_size: i32,
    pub num_layers: i32,
    pub intermediate_size: i32,
    pub rms_norm_eps: f64,
    pub mlp_bias: bool,
    pub tie_word_embeddings: bool,
    pub cache_layout: CacheLayout,
    pub attention: AttentionSpec,
    /// One entry per layer: its attention kind and whether it applies RoPE.
    pub layers: Vec<LayerKind>,
    pub variant: Variant,
}

/// How the model makes its KV caches, as its mlx-lm class does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheLayout {
    /// No `make_cache` in mlx-lm: growing caches, or rotating ones (keep 4) with `--max-kv-size`.
    Default,
    /// mlx-lm's `make_cache`: per layer a rotating cache of the window (sliding), a chunked cache
    /// (chunked) or a growing one (full); `--max-kv-size` does not apply (as in mlx-lm).
    PerLayer,
}

/// A layer's attention, as the model's config describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnKind {
    /// Causal attention over every earlier position.
    Full,
    /// Causal attention over the last `window` positions (`sliding_attention` layers).
    Sliding(i32),
    /// Causal attention within chunks of this many positions (llama4.py's local attention).
    Chunked(i32),
}

/// One layer's attention kind, and whether it rotates queries and keys (RoPE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerKind {
    pub attn: AttnKind,
    pub rope: bool,
}

impl LayerKind {
    /// `n` full-attention RoPE layers (Llama, Qwen).
    pub fn all_full(n: i32) -> Vec<LayerKind> {
        vec![LayerKind { attn: AttnKind::Full, rope: true }; n.max(0) as usize]
    }
}

/// A per-position factor on the queries, after RoPE.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum QueryScale {
    /// ministral3.py's `_get_llama_4_attn_scale` on every layer:
    /// `1 + beta * log(1 + floor(position / max_position))`, cast to the activations' dtype.
    Llama4 { beta: f64, max_position: f64 },
    /// llama4.py's attention temperature tuning on the layers without RoPE:
    /// `log(floor((position + 1) / floor_scale) + 1) * attn_scale + 1`, in float32.
    Temperature { floor_scale: f64, attn_scale: f64 },
}

/// What some architectures change in the shared decoder (all off for Llama and Qwen).
#[derive(Clone, Debug, Default)]
pub struct Variant {
    pub query_scale: Option<QueryScale>,
    /// A weightless RMS norm over each head's queries and keys: on every layer, or (`rope_only`)
    /// only on the layers with RoPE.
    pub plain_qk_norm: Option<(PlainQkNorm, bool)>,
    /// The feed-forward part's name in a layer (`mlp` unless set) and the untied head's name
    /// (`lm_head` unless set).
    pub mlp_name: Option<&'static str>,
    pub head_name: Option<&'static str>,
    /// mlx-lm's class has no `shard` / no pipeline support: the skeleton refuses them.
    pub no_tensor_parallel: bool,
    pub no_pipeline: bool,
}

#[derive(Clone)]
pub(crate) struct Mlp {
    gate_up: GateUp<Linear>,
    down_proj: Linear,
}

impl Mlp {
    pub(crate) fn load(vb: &Vb<'_>, d: i32, ff: i32, bias: bool, q: &QuantConfig) -> Result<Mlp> {
        let gate = Linear::load(&vb.pp("gate_proj"), d, ff, bias, q)?;
        let up = Linear::load(&vb.pp("up_proj"), d, ff, bias, q)?;
        Ok(Mlp {
            gate_up: GateUp::new(gate, up, ff)?,
            down_proj: Linear::load(&vb.pp("down_proj"), ff, d, bias, q)?,
        })
    }

    /// gate/up keep this rank's block of the hidden units, down the matching columns.
    fn shard(&self, group: &Group) -> Result<Mlp> {
        let gate_up = self.gate_up.shard(group, "the MLP hidden size")?;
        Ok(Mlp { gate_up, down_proj: self.down_proj.shard(ShardMode::ShardedToAll, &[], group)? })
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut v = self.gate_up.arrays();
        v.extend(self.down_proj.arrays());
        v
    }

    /// down(silu(gate(x)) * up(x))
    fn forward(&self, x: &Array) -> Result<Array> {
        let (up, gate) = self.gate_up.up_gate(|p| p.forward(x))?; // (B, L, ff) each
        self.down_proj.forward(&mlx::fast::swiglu(&gate, &up)?)
    }
}

/// The decoder's part of the model (see [`super::stack::Arch`]), with feed-forward parts `F`
/// (the SwiGLU [`Mlp`] unless an architecture brings its own, e.g. mixture-of-experts layers).
pub(crate) struct Dense<F = Mlp> {
    spec: DecoderSpec,
    ffn: PhantomData<fn() -> F>,
}

impl Part for Attention {
    fn arrays(&self) -> Vec<&Array> {
        Attention::arrays(self)
    }

    fn shard(&self, group: &Group) -> Result<Attention> {
        Attention::shard(self, group)
    }
}

impl Part for Mlp {
    fn arrays(&self) -> Vec<&Array> {
        Mlp::arrays(self)
    }

    fn shard(&self, group: &Group) -> Result<Mlp> {
        Mlp::shard(self, group)
    }
}

impl FeedForward for Mlp {
    fn forward(&self, x: &Array) -> Result<Array> {
        Mlp::forward(self, x)
    }
}

/// Loads the weights named as in Hugging Face / mlx-lm checkpoints (`model.layers.N...`).
pub(crate) fn load(spec: DecoderSpec, rope: Rope, weights: &Weights, q: &QuantConfig) -> Result<Stack<Dense>> {
    let (d, ff, bias) = (spec.attention.hidden, spec.intermediate_size, spec.mlp_bias);
    let name = spec.variant.mlp_name.unwrap_or("mlp");
    load_with(spec, rope, weights, q, |_, l| Mlp::load(&l.pp(name), d, ff, bias, q))
}

/// As [`load`], with each layer's feed-forward part from `ffn(layer index, layer weights)`.
pub(crate) fn load_with<F: FeedForward + 'static>(
    spec: DecoderSpec,
    rope: Rope,
    weights: &Weights,
    q: &QuantConfig,
    mut ffn: impl FnMut(i32, &Vb<'_>) -> Result<F>,
) -> Result<Stack<Dense<F>>> {
    let a = &spec.attention;
    if a.n_heads <= 0 || a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0 || a.head_dim <= 0 {
        return Err(EngineError::Config(format!(
            "{} attention heads, {} key/value heads and head_dim {} do not fit together",
            a.n_heads, a.n_kv_heads, a.head_dim
        )));
    }
    if spec.layers.len() != spec.num_layers.max(0) as usize {
        return Err(EngineError::Config(format!("{} layer kinds for {} layers", spec.layers.len(), spec.num_layers)));
    }
    let chunked = spec.layers.iter().any(|k| matches!(k.attn, AttnKind::Chunked(_)));
    if chunked && spec.cache_layout != CacheLayout::PerLayer {
        return Err(EngineError::Config("chunked attention needs the model's own (chunked) caches".into()));
    }
    let vb = weights.view("model");
    let mut layers = Vec::with_capacity(spec.num_layers.max(0) as usize);
    for i in (0..spec.num_layers).filter(|&i| weights.loads_layer(i)) {
        let l = vb.pp("layers").pp(i);
        let kind = spec.layers[i as usize];
        let mut self_attn = Attention::load(&l.pp("self_attn"), a, rope.clone(), q)?;
        if !kind.rope {
            self_attn = self_attn.without_rope();
        }
        match spec.variant.plain_qk_norm {
            Some((norm, rope_only)) if kind.rope || !rope_only => self_attn = self_attn.with_plain_qk_norm(norm),
            _ => {}
        }
        let mlp = ffn(i, &l)?;
        layers.push(Block::load(&l, self_attn, mlp, a.hidden, spec.rms_norm_eps)?);
    }
    let dims = StackDims {
        vocab_size: spec.vocab_size,
        hidden: a.hidden,
        rms_norm_eps: spec.rms_norm_eps,
        tie_word_embeddings: spec.tie_word_embeddings,
    };
    let head = spec.variant.head_name.unwrap_or("lm_head");
    Stack::load_named(Dense { spec, ffn: PhantomData }, layers, dims, head, weights, q)
}

/// The masks of one forward pass (each from the first layer of its kind, as mlx-lm) and the
/// query scale, if the model has one.
pub(crate) struct Masks {
    full: CacheMask,
    sliding: CacheMask,
    chunked: CacheMask,
    /// (L, 1), or (B, 1, L, 1) for a batch of rows at different positions; float32.
    query_scale: Option<Array>,
}

/// Positions `offset..offset + n` of each row: (n,) int32, or (B, n) for a batch cache.
fn positions(n: i32, cache: &dyn KvCache, from: i32) -> Result<Array> {
    let steps = ops::arange(f64::from(from), f64::from(from + n), 1.0, Dtype::I32)?;
    Ok(match cache.row_offsets() {
        Some(rows) => rows.expand_dims(&[1])?.add(&steps)?, // offset[:, None] + arange
        None => steps.add_scalar(f64::from(cache.offset()))?,
    })
}

impl QueryScale {
    /// The scale for `n` new positions of the layers whose caches are like `cache`.
    fn compute(&self, n: i32, cache: &dyn KvCache) -> Result<Array> {
        let s = match *self {
            QueryScale::Llama4 { beta, max_position } => {
                // 1 + beta * log(1 + floor((arange(L) + offset) / max_position_embeddings))
                let p = positions(n, cache, 0)?;
                // An int divisor is a weak int (int32 / int32 divides in float32); a float one a float.
                let p = if max_position.fract() == 0.0 { p } else { p.astype(Dtype::F32)? };
                let p = p.div_scalar(max_position)?;
                p.floor()?.add_scalar(1.0)?.log()?.mul_scalar(beta)?.add_scalar(1.0)?
            }
            QueryScale::Temperature { floor_scale, attn_scale } => {
                if cache.row_offsets().is_some() {
                    return Err(EngineError::Invalid(
                        "attention temperature tuning needs one position per step for all rows (mlx-lm's cannot batch it either)".into(),
                    ));
                }
                // log(floor(arange(offset + 1, offset + L + 1) / floor_scale) + 1.0) * attn_scale + 1.0
                let p = positions(n, cache, 1)?;
                let p = if floor_scale.fract() == 0.0 { p } else { p.astype(Dtype::F32)? };
                let p = p.div_scalar(floor_scale)?;
                p.floor()?.add_scalar(1.0)?.log()?.mul_scalar(attn_scale)?.add_scalar(1.0)?
            }
        };
        Ok(match s.ndim() {
            2 => s.reshape(&[s.dim(0), 1, n, 1])?, // scaling[:, None, :, None]
            _ => s.expand_dims(&[1])?,             // scaling[:, None]
        })
    }
}

impl<F: FeedForward + 'static> Arch for Dense<F> {
    type Attn = Attention;
    type Ffn = F;
    type Masks = Masks;

    fn model_type(&self) -> &str {
        &self.spec.model_type
    }

    fn vocab_size(&self) -> i32 {
        self.spec.vocab_size
    }

    fn can_shard(&self) -> bool {
        !self.spec.variant.no_tensor_parallel
    }

    fn can_pipeline(&self) -> bool {
        !self.spec.variant.no_pipeline
    }

    fn make_cache(&self, first_layer: usize, n: usize) -> Vec<Box<dyn KvCache>> {
        self.spec.layers[first_layer..first_layer + n]
            .iter()
            .map(|k| match (self.spec.cache_layout, k.attn) {
                (CacheLayout::PerLayer, AttnKind::Sliding(w)) => Box::new(RotatingCache::new(w, 0)) as Box<dyn KvCache>,
                (CacheLayout::PerLayer, AttnKind::Chunked(c)) => Box::new(ChunkedCache::new(c)) as Box<dyn KvCache>,
                _ => Box::new(GrowingCache::new()) as Box<dyn KvCache>,
            })
            .collect()
    }

    fn make_prompt_cache(&self, first_layer: usize, n: usize, max_kv_size: Option<i32>) -> Vec<Box<dyn KvCache>> {
        match (self.spec.cache_layout, max_kv_size) {
            (CacheLayout::Default, Some(_)) => super::default_caches(n, max_kv_size),
            _ => self.make_cache(first_layer, n),
        }
    }

    /// As mlx-lm: each mask comes from the first cache of a layer of its kind (the sliding one
    /// with the window); the query scale from the first cache (Llama 4 scaling) or the first
    /// no-RoPE layer's (temperature tuning).
    fn masks(&self, n: i32, first_layer: usize, cache: &[Box<dyn KvCache>]) -> Result<Masks> {
        let kinds = &self.spec.layers[first_layer..first_layer + cache.len()];
        let first = |pick: &dyn Fn(&LayerKind) -> bool| kinds.iter().position(pick);
        let full = match first(&|k| k.attn == AttnKind::Full) {
            Some(i) => cache[i].make_mask(n, None)?,
            None => CacheMask::None,
        };
        let sliding = match first(&|k| matches!(k.attn, AttnKind::Sliding(_))).map(|i| (i, kinds[i].attn)) {
            Some((i, AttnKind::Sliding(w))) => cache[i].make_mask(n, Some(w))?,
            _ => CacheMask::None,
        };
        let chunked = match first(&|k| matches!(k.attn, AttnKind::Chunked(_))) {
            Some(i) => cache[i].make_mask(n, None)?,
            None => CacheMask::None,
        };
        let query_scale = match self.spec.variant.query_scale {
            Some(s @ QueryScale::Llama4 { .. }) if !cache.is_empty() => Some(s.compute(n, cache[0].as_ref())?),
            Some(s @ QueryScale::Temperature { .. }) => match first(&|k| !k.rope) {
                Some(i) => Some(s.compute(n, cache[i].as_ref())?),
                None => None,
            },
            _ => None,
        };
        Ok(Masks { full, sliding, chunked, query_scale })
    }

    fn attend(&self, attn: &Attention, x: &Array, layer: usize, masks: &Masks, cache: &mut dyn KvCache) -> Result<Array> {
        let kind = self.spec.layers[layer];
        let mask = match kind.attn {
            AttnKind::Full => &masks.full,
            AttnKind::Sliding(_) => &masks.sliding,
            AttnKind::Chunked(_) => &masks.chunked,
        };
        let scale = match (self.spec.variant.query_scale, &masks.query_scale) {
            // `.astype(h.dtype)` before the product, as ministral3.py.
            (Some(QueryScale::Llama4 { .. }), Some(s)) => Some(s.astype(x.dtype())?),
            (Some(QueryScale::Temperature { .. }), Some(s)) if !kind.rope => Some(s.clone()),
            _ => None,
        };
        attn.forward_scaled(x, mask.as_mask(), cache, scale.as_ref())
    }
}
