//! The dense decoder-only transformer that Llama, Mistral, Qwen2 and Qwen3 share: embedding,
//! pre-norm blocks (attention + SwiGLU MLP, residuals), final norm and a tied or separate head.
//! Each architecture file only reads its config into a [`DecoderSpec`]; the skeleton is
//! [`super::stack`]'s.
use super::stack::{Arch, Block, FeedForward, Part, Stack, StackDims};
use crate::cache::{CacheMask, GrowingCache, KvCache, RotatingCache};
use crate::error::{EngineError, Result};
use crate::nn::{Attention, AttentionSpec, Linear, QuantConfig, Rope};
use crate::shard::ShardMode;
use checkpoint::Weights;
use mlx::distributed::Group;
use mlx::Array;

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
}

/// How the model makes its KV caches, as its mlx-lm class does.
#[derive(Clone, Debug)]
pub enum CacheLayout {
    /// No `make_cache` in mlx-lm: growing caches, or rotating ones (keep 4) with `--max-kv-size`.
    Default,
    /// mlx-lm's `make_cache` (llama.py): a rotating cache of `sliding_window` positions for each
    /// sliding layer, a growing one otherwise; `--max-kv-size` does not apply (as in mlx-lm).
    PerLayer { sliding: Vec<bool>, sliding_window: Option<i32> },
}

impl CacheLayout {
    fn is_sliding(&self, layer: usize) -> bool {
        matches!(self, CacheLayout::PerLayer { sliding, .. } if sliding.get(layer).copied().unwrap_or(false))
    }
}

#[derive(Clone)]
enum GateUp {
    Separate { gate: Linear, up: Linear },
    /// Rows: gate, then up (see `nn::set_fused_projections`).
    Fused(Linear, i32),
}

#[derive(Clone)]
pub(crate) struct Mlp {
    gate_up: GateUp,
    down_proj: Linear,
}

impl Mlp {
    fn load(vb: &checkpoint::Vb<'_>, d: i32, ff: i32, bias: bool, q: &QuantConfig) -> Result<Mlp> {
        let gate = Linear::load(&vb.pp("gate_proj"), d, ff, bias, q)?;
        let up = Linear::load(&vb.pp("up_proj"), d, ff, bias, q)?;
        let fused = if crate::nn::fused_projections() { Linear::fuse(&[&gate, &up])? } else { None };
        Ok(Mlp {
            gate_up: match fused {
                Some(f) => GateUp::Fused(f, ff),
                None => GateUp::Separate { gate, up },
            },
            down_proj: Linear::load(&vb.pp("down_proj"), ff, d, bias, q)?,
        })
    }

    /// gate/up keep this rank's block of the hidden units, down the matching columns.
    fn shard(&self, group: &Group) -> Result<Mlp> {
        let gate_up = match &self.gate_up {
            GateUp::Separate { gate, up } => GateUp::Separate {
                gate: gate.shard(ShardMode::AllToSharded, &[gate.out_dims()], group)?,
                up: up.shard(ShardMode::AllToSharded, &[up.out_dims()], group)?,
            },
            GateUp::Fused(f, ff) => GateUp::Fused(
                f.shard(ShardMode::AllToSharded, &[*ff, *ff], group)?,
                crate::shard::check_divides("the MLP hidden size", *ff, group.size())?,
            ),
        };
        Ok(Mlp { gate_up, down_proj: self.down_proj.shard(ShardMode::ShardedToAll, &[], group)? })
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut v = match &self.gate_up {
            GateUp::Separate { gate, up } => [gate.arrays(), up.arrays()].concat(),
            GateUp::Fused(f, _) => f.arrays(),
        };
        v.extend(self.down_proj.arrays());
        v
    }

    /// down(silu(gate(x)) * up(x))
    fn forward(&self, x: &Array) -> Result<Array> {
        let h = match &self.gate_up {
            GateUp::Separate { gate, up } => mlx::fast::swiglu(&gate.forward(x)?, &up.forward(x)?)?,
            GateUp::Fused(f, ff) => {
                let y = f.forward(x)?; // (B, L, 2 ff)
                mlx::fast::swiglu(&y.slice_axis(-1, 0, *ff)?, &y.slice_axis(-1, *ff, 2 * ff)?)?
            }
        };
        self.down_proj.forward(&h)
    }
}

/// The dense architecture's part of the model (see [`super::stack::Arch`]).
pub(crate) struct Dense {
    spec: DecoderSpec,
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
    let a = &spec.attention;
    if a.n_heads <= 0 || a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0 || a.head_dim <= 0 {
        return Err(EngineError::Config(format!(
            "{} attention heads, {} key/value heads and head_dim {} do not fit together",
            a.n_heads, a.n_kv_heads, a.head_dim
        )));
    }
    let vb = weights.view("model");
    let (d, ff) = (a.hidden, spec.intermediate_size);
    let mut layers = Vec::with_capacity(spec.num_layers.max(0) as usize);
    for i in (0..spec.num_layers).filter(|&i| weights.loads_layer(i)) {
        let l = vb.pp("layers").pp(i);
        let self_attn = Attention::load(&l.pp("self_attn"), a, rope.clone(), q)?;
        let mlp = Mlp::load(&l.pp("mlp"), d, ff, spec.mlp_bias, q)?;
        layers.push(Block::load(&l, self_attn, mlp, d, spec.rms_norm_eps)?);
    }
    let dims = StackDims { vocab_size: spec.vocab_size, hidden: d, rms_norm_eps: spec.rms_norm_eps, tie_word_embeddings: spec.tie_word_embeddings };
    Stack::load(Dense { spec }, layers, dims, weights, q)
}

impl Arch for Dense {
    type Attn = Attention;
    type Ffn = Mlp;
    /// The full-attention mask and the sliding-window one.
    type Masks = (CacheMask, CacheMask);

    fn model_type(&self) -> &str {
        &self.spec.model_type
    }

    fn vocab_size(&self) -> i32 {
        self.spec.vocab_size
    }

    fn make_cache(&self, first_layer: usize, n: usize) -> Vec<Box<dyn KvCache>> {
        (first_layer..first_layer + n)
            .map(|i| match &self.spec.cache_layout {
                CacheLayout::PerLayer { sliding_window: Some(w), .. } if self.spec.cache_layout.is_sliding(i) => {
                    Box::new(RotatingCache::new(*w, 0)) as Box<dyn KvCache>
                }
                _ => Box::new(GrowingCache::new()) as Box<dyn KvCache>,
            })
            .collect()
    }

    fn make_prompt_cache(&self, first_layer: usize, n: usize, max_kv_size: Option<i32>) -> Vec<Box<dyn KvCache>> {
        match (&self.spec.cache_layout, max_kv_size) {
            (CacheLayout::Default, Some(_)) => super::default_caches(n, max_kv_size),
            _ => self.make_cache(first_layer, n),
        }
    }

    /// As mlx-lm: the mask comes from the first full-attention layer's cache, and the sliding one
    /// from the first sliding layer's cache with the window.
    fn masks(&self, n: i32, first_layer: usize, cache: &[Box<dyn KvCache>]) -> Result<Self::Masks> {
        let layout = &self.spec.cache_layout;
        let sliding = |i: usize| layout.is_sliding(first_layer + i);
        let fa = (0..cache.len()).find(|&i| !sliding(i)).unwrap_or(0);
        let fa_mask = cache[fa].make_mask(n, None)?;
        let swa_mask = match layout {
            CacheLayout::PerLayer { sliding_window, .. } => match (0..cache.len()).find(|&i| sliding(i)) {
                Some(i) => cache[i].make_mask(n, *sliding_window)?,
                None => CacheMask::None,
            },
            CacheLayout::Default => CacheMask::None,
        };
        Ok((fa_mask, swa_mask))
    }

    fn attend(&self, attn: &Attention, x: &Array, layer: usize, masks: &Self::Masks, cache: &mut dyn KvCache) -> Result<Array> {
        let mask = if self.spec.cache_layout.is_sliding(layer) { masks.1.as_mask() } else { masks.0.as_mask() };
        attn.forward(x, mask, cache)
    }
}
