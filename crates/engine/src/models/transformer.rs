//! The dense decoder-only transformer that Llama, Mistral, Qwen2 and Qwen3 share: embedding,
//! pre-norm blocks (attention + SwiGLU MLP, residuals), final norm and a tied or separate head.
//! Each architecture file only reads its config into a [`DecoderSpec`].
use super::Model;
use crate::cache::{CacheMask, GrowingCache, KvCache, RotatingCache};
use crate::error::{EngineError, Result};
use crate::nn::{Attention, AttentionSpec, Embedding, Linear, QuantConfig, RmsNorm, Rope};
use crate::pipeline::Stage;
use crate::shard::ShardMode;
use crate::weights::Weights;
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
struct Mlp {
    gate_up: GateUp,
    down_proj: Linear,
}

impl Mlp {
    fn load(vb: &crate::weights::Vb<'_>, d: i32, ff: i32, bias: bool, q: &QuantConfig) -> Result<Mlp> {
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

#[derive(Clone)]
struct Block {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

pub struct Decoder {
    spec: DecoderSpec,
    embed_tokens: Embedding,
    /// The layers this process runs: all of them, or a pipeline stage's.
    layers: Vec<Block>,
    /// The model index of `layers[0]` (0 unless this is a later pipeline stage).
    first_layer: usize,
    stage: Option<Stage>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
}

impl Decoder {
    /// Loads the weights named as in Hugging Face / mlx-lm checkpoints (`model.layers.N...`).
    pub fn load(spec: DecoderSpec, rope: Rope, weights: &Weights, q: &QuantConfig) -> Result<Decoder> {
        let a = &spec.attention;
        if a.n_heads <= 0 || a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0 || a.head_dim <= 0 {
            return Err(EngineError::Config(format!(
                "{} attention heads, {} key/value heads and head_dim {} do not fit together",
                a.n_heads, a.n_kv_heads, a.head_dim
            )));
        }
        let vb = weights.view("model");
        let (d, ff) = (a.hidden, spec.intermediate_size);
        let mut layers = Vec::with_capacity(spec.num_layers as usize);
        for i in (0..spec.num_layers).filter(|&i| weights.loads_layer(i)) {
            let l = vb.pp("layers").pp(i);
            layers.push(Block {
                self_attn: Attention::load(&l.pp("self_attn"), a, rope.clone(), q)?,
                mlp: Mlp::load(&l.pp("mlp"), d, ff, spec.mlp_bias, q)?,
                input_layernorm: RmsNorm::load(&l.pp("input_layernorm"), d, spec.rms_norm_eps)?,
                post_attention_layernorm: RmsNorm::load(&l.pp("post_attention_layernorm"), d, spec.rms_norm_eps)?,
            });
        }
        let embed_tokens = Embedding::load(&vb.pp("embed_tokens"), spec.vocab_size, d, q)?;
        let norm = RmsNorm::load(&vb.pp("norm"), d, spec.rms_norm_eps)?;
        let lm_head = if spec.tie_word_embeddings {
            None
        } else {
            Some(Linear::load(&weights.view("lm_head"), d, spec.vocab_size, false, q)?)
        };
        let first_layer = weights.first_layer() as usize;
        Ok(Decoder { spec, embed_tokens, layers, first_layer, stage: None, norm, lm_head })
    }
}

impl Model for Decoder {
    fn model_type(&self) -> &str {
        &self.spec.model_type
    }

    fn shard(&mut self, group: &Group) -> Result<()> {
        for layer in &mut self.layers {
            layer.self_attn = layer.self_attn.shard(group)?;
            layer.mlp = layer.mlp.shard(group)?;
        }
        Ok(())
    }

    fn pipeline(&mut self, stage: Stage) -> Result<()> {
        stage.check_loaded(self.layers.len())?;
        self.stage = Some(stage);
        Ok(())
    }

    fn vocab_size(&self) -> i32 {
        self.spec.vocab_size
    }

    fn parameters(&self) -> Vec<&Array> {
        let mut v = self.embed_tokens.arrays();
        for l in &self.layers {
            v.extend(l.self_attn.arrays());
            v.extend(l.mlp.arrays());
            v.extend(l.input_layernorm.arrays());
            v.extend(l.post_attention_layernorm.arrays());
        }
        v.extend(self.norm.arrays());
        v.extend(self.lm_head.iter().flat_map(|h| h.arrays()));
        v
    }

    fn make_cache(&self) -> Vec<Box<dyn KvCache>> {
        (self.first_layer..self.first_layer + self.layers.len())
            .map(|i| match &self.spec.cache_layout {
                CacheLayout::PerLayer { sliding_window: Some(w), .. } if self.spec.cache_layout.is_sliding(i) => {
                    Box::new(RotatingCache::new(*w, 0)) as Box<dyn KvCache>
                }
                _ => Box::new(GrowingCache::new()) as Box<dyn KvCache>,
            })
            .collect()
    }

    fn make_prompt_cache(&self, max_kv_size: Option<i32>) -> Vec<Box<dyn KvCache>> {
        match (&self.spec.cache_layout, max_kv_size) {
            (CacheLayout::Default, Some(_)) => super::default_caches(self.layers.len(), max_kv_size),
            _ => self.make_cache(),
        }
    }

    fn forward(&self, tokens: &Array, cache: &mut [Box<dyn KvCache>]) -> Result<Array> {
        super::check_caches(cache, self.layers.len())?;
        let mut h = self.embed_tokens.forward(tokens)?; // (B, L, hidden)
        // As mlx-lm: the mask comes from the first full-attention layer's cache, and the sliding
        // one from the first sliding layer's cache with the window.
        let n = tokens.dim(1);
        let layout = &self.spec.cache_layout;
        // Model layer index of local layer i (a pipeline stage runs a later range).
        let sliding = |i: usize| layout.is_sliding(self.first_layer + i);
        let fa = (0..cache.len()).find(|&i| !sliding(i)).unwrap_or(0);
        let fa_mask = cache[fa].make_mask(n, None)?;
        let swa_mask = match layout {
            CacheLayout::PerLayer { sliding_window, .. } => match (0..cache.len()).find(|&i| sliding(i)) {
                Some(i) => cache[i].make_mask(n, *sliding_window)?,
                None => CacheMask::None,
            },
            CacheLayout::Default => CacheMask::None,
        };
        // A pipeline stage starts from the previous stage's output (mlx-lm's qwen2.py order).
        if let Some(s) = &self.stage {
            h = s.receive(&h)?;
        }
        for (i, (layer, c)) in self.layers.iter().zip(cache.iter_mut()).enumerate() {
            let mask = if sliding(i) { swa_mask.as_mask() } else { fa_mask.as_mask() };
            let r = layer.self_attn.forward(&layer.input_layernorm.forward(&h)?, mask, c.as_mut())?;
            let h1 = h.add(&r)?;
            let r = layer.mlp.forward(&layer.post_attention_layernorm.forward(&h1)?)?;
            h = h1.add(&r)?;
        }
        if let Some(s) = &self.stage {
            h = s.pass_on(&h)?;
        }
        let h = self.norm.forward(&h)?;
        match &self.lm_head {
            Some(head) => head.forward(&h),
            None => self.embed_tokens.as_linear(&h),
        } // (B, L, vocab)
    }
}
