//! The decoder skeleton every architecture shares: token embedding, pre-norm residual blocks
//! (attention, then the feed-forward part), the final norm and a tied or separate head, with the
//! tensor- and pipeline-parallel hooks. An architecture file supplies what differs through
//! [`Arch`]: its attention and feed-forward layers, its masks and its caches.
use super::{check_caches, default_caches, Model};
use crate::cache::KvCache;
use crate::error::{EngineError, Result};
use crate::nn::moe::{Ffn, Router};
use crate::nn::{Embedding, Linear, QuantConfig, RmsNorm};
use crate::pipeline::Stage;
use checkpoint::{Vb, Weights};
use mlx::distributed::Group;
use mlx::Array;

/// A layer's attention or feed-forward part, as tensor parallel and memory accounting see it.
pub(crate) trait Part: Clone {
    /// Every weight array.
    fn arrays(&self) -> Vec<&Array>;
    /// This rank's share for tensor parallel over `group` (mlx-lm's `shard`).
    fn shard(&self, group: &Group) -> Result<Self>;
}

/// The feed-forward part of a block: x (B, L, hidden) -> (B, L, hidden).
pub(crate) trait FeedForward: Part {
    fn forward(&self, x: &Array) -> Result<Array>;
}

impl<R: Router> Part for Ffn<R> {
    fn arrays(&self) -> Vec<&Array> {
        Ffn::arrays(self)
    }

    fn shard(&self, group: &Group) -> Result<Ffn<R>> {
        Ffn::shard(self, group)
    }
}

impl<R: Router> FeedForward for Ffn<R> {
    fn forward(&self, x: &Array) -> Result<Array> {
        Ffn::forward(self, x)
    }
}

/// What one architecture adds to the skeleton.
pub(crate) trait Arch: 'static {
    type Attn: Part;
    type Ffn: FeedForward;
    /// What a forward pass computes once for all its layers (the attention masks).
    type Masks;
    fn model_type(&self) -> &str;
    fn vocab_size(&self) -> i32;
    /// Whether mlx-lm's class has `shard` (tensor parallel); the skeleton refuses it otherwise.
    fn can_shard(&self) -> bool {
        true
    }
    /// Whether mlx-lm's `shard` also splits an untied head's vocabulary across the ranks (each
    /// rank's logits gathered back, qwen3_5.py); otherwise every rank keeps the whole head.
    fn shards_vocab(&self) -> bool {
        false
    }
    /// Whether mlx-lm runs the class as a pipeline; the skeleton refuses it otherwise.
    fn can_pipeline(&self) -> bool {
        true
    }
    /// Whether a layer queues many more kernels than a plain attention block (a linear-attention
    /// layer's recurrence and convolution), so that its decode step is the host's whatever the
    /// size of its weights ([`Stack`]'s device-bound rule does not apply).
    fn host_heavy_layers(&self) -> bool {
        false
    }
    /// The masks for `n` new positions; `first_layer` is the model index of `cache[0]`.
    fn masks(&self, n: i32, first_layer: usize, cache: &[Box<dyn KvCache>]) -> Result<Self::Masks>;
    /// Attention of model layer `layer` over its normed input x (B, L, hidden) -> (B, L, hidden).
    fn attend(&self, attn: &Self::Attn, x: &Array, layer: usize, masks: &Self::Masks, cache: &mut dyn KvCache) -> Result<Array>;
    /// One fresh cache for each of the `n` layers from model layer `first_layer` on.
    fn make_cache(&self, first_layer: usize, n: usize) -> Vec<Box<dyn KvCache>> {
        let _ = first_layer;
        default_caches(n, None)
    }
    /// mlx-lm's `make_prompt_cache` (see [`Model::make_prompt_cache`]).
    fn make_prompt_cache(&self, first_layer: usize, n: usize, max_kv_size: Option<i32>) -> Vec<Box<dyn KvCache>> {
        let _ = first_layer;
        default_caches(n, max_kv_size)
    }
}

/// One pre-norm residual block: `h + attn(norm(h))`, then `+ mlp(norm(.))`.
#[derive(Clone)]
pub(crate) struct Block<A, F> {
    self_attn: A,
    mlp: F,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl<A: Part, F: FeedForward> Block<A, F> {
    /// The two parts with the block's norms read from `layer` (`model.layers.N`).
    pub fn load(layer: &Vb<'_>, self_attn: A, mlp: F, hidden: i32, eps: f64) -> Result<Block<A, F>> {
        Ok(Block {
            self_attn,
            mlp,
            input_layernorm: RmsNorm::load(&layer.pp("input_layernorm"), hidden, eps)?,
            post_attention_layernorm: RmsNorm::load(&layer.pp("post_attention_layernorm"), hidden, eps)?,
        })
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut v = self.self_attn.arrays();
        v.extend(self.mlp.arrays());
        v.extend(self.input_layernorm.arrays());
        v.extend(self.post_attention_layernorm.arrays());
        v
    }
}

/// The whole model: `arch` around the shared skeleton.
pub(crate) struct Stack<T: Arch> {
    arch: T,
    embed_tokens: Embedding,
    /// The layers this process runs: all of them, or a pipeline stage's.
    layers: Vec<Block<T::Attn, T::Ffn>>,
    /// The model index of `layers[0]` (0 unless this is a later pipeline stage).
    first_layer: usize,
    stage: Option<Stage>,
    norm: RmsNorm,
    /// `None`: the head is the embedding (tied).
    lm_head: Option<Linear>,
    /// Tensor parallel with the head's vocabulary split ([`Arch::shards_vocab`]): the group its
    /// logits are gathered over.
    vocab_group: Option<Group>,
    /// [`Stack::device_bound`], decided at the first forward pass (after any shard or stage).
    device_bound: std::sync::OnceLock<bool>,
}

/// The dense weight bytes a layer from which a decode step is taken to be the device's: MLX's
/// CUDA matrix-vector product reads about 1 byte a nanosecond (H100, H200), so a layer of 96 MiB
/// takes it about 100 us, what the host takes to build and queue a layer (BENCHMARKS.md).
/// Qwen2.5-7B (4-bit) has 131 MB a layer, Llama-3.2-3B 56 MB.
const DEVICE_BOUND_LAYER_BYTES: usize = 96 << 20;

/// The sizes the skeleton's own tensors need.
pub(crate) struct StackDims {
    pub vocab_size: i32,
    pub hidden: i32,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
}

impl<T: Arch> Stack<T> {
    /// `model.embed_tokens`, `model.norm` and `lm_head` (unless tied) around the loaded `layers`.
    pub fn load(arch: T, layers: Vec<Block<T::Attn, T::Ffn>>, d: StackDims, weights: &Weights, q: &QuantConfig) -> Result<Stack<T>> {
        Self::load_named(arch, layers, d, "lm_head", weights, q)
    }

    /// As [`Stack::load`], with the untied head named `head` (`output` in llama4_text.py).
    pub fn load_named(
        arch: T,
        layers: Vec<Block<T::Attn, T::Ffn>>,
        d: StackDims,
        head: &str,
        weights: &Weights,
        q: &QuantConfig,
    ) -> Result<Stack<T>> {
        let vb = weights.view("model");
        let lm_head = match d.tie_word_embeddings {
            true => None,
            false => Some(Linear::load(&weights.view(head), d.hidden, d.vocab_size, false, q)?),
        };
        Ok(Stack {
            arch,
            embed_tokens: Embedding::load(&vb.pp("embed_tokens"), d.vocab_size, d.hidden, q)?,
            layers,
            first_layer: weights.first_layer() as usize,
            stage: None,
            norm: RmsNorm::load(&vb.pp("norm"), d.hidden, d.rms_norm_eps)?,
            lm_head,
            vocab_group: None,
            device_bound: std::sync::OnceLock::new(),
        })
    }

    /// Whether this model's decode step is the device's rather than the host's: its layers hold on
    /// average at least [`DEVICE_BOUND_LAYER_BYTES`] of dense weights (stacked experts, of which a
    /// token reads a few, do not count) and none queues many more kernels than an attention block
    /// ([`Arch::host_heavy_layers`]). Then the quantized products of every weight take our few-row
    /// kernel ([`crate::nn::with_device_bound_decode`]), whose device time is about half
    /// MLX's; elsewhere only the large weights do (the small ones gain nothing).
    fn device_bound(&self) -> bool {
        *self.device_bound.get_or_init(|| {
            let dense: usize = self.layers.iter().flat_map(|l| l.arrays()).filter(|a| a.ndim() <= 2).map(mlx::Array::nbytes).sum();
            !self.arch.host_heavy_layers() && !self.layers.is_empty() && dense / self.layers.len() >= DEVICE_BOUND_LAYER_BYTES
        })
    }
}

impl<T: Arch> Model for Stack<T> {
    fn model_type(&self) -> &str {
        self.arch.model_type()
    }

    fn vocab_size(&self) -> i32 {
        self.arch.vocab_size()
    }

    fn parameters(&self) -> Vec<&Array> {
        let mut v = self.embed_tokens.arrays();
        v.extend(self.layers.iter().flat_map(|l| l.arrays()));
        v.extend(self.norm.arrays());
        v.extend(self.lm_head.iter().flat_map(|h| h.arrays()));
        v
    }

    fn make_cache(&self) -> Vec<Box<dyn KvCache>> {
        self.arch.make_cache(self.first_layer, self.layers.len())
    }

    fn make_prompt_cache(&self, max_kv_size: Option<i32>) -> Vec<Box<dyn KvCache>> {
        self.arch.make_prompt_cache(self.first_layer, self.layers.len(), max_kv_size)
    }

    fn shard(&mut self, group: &Group) -> Result<()> {
        if !self.arch.can_shard() {
            return Err(EngineError::Config(format!(
                "tensor parallel is not supported for model_type {} (mlx-lm's model has no shard either)",
                self.arch.model_type()
            )));
        }
        // Each rank computes a slice of the vocabulary (before the layers, as mlx-lm's order).
        if let (true, Some(head)) = (self.arch.shards_vocab(), &self.lm_head) {
            crate::shard::check_divides("the vocabulary", self.arch.vocab_size(), group.size())?;
            self.lm_head = Some(head.shard(crate::shard::ShardMode::AllToSharded, &[head.out_dims()], group)?);
            self.vocab_group = Some(group.clone());
        }
        for layer in &mut self.layers {
            layer.self_attn = layer.self_attn.shard(group)?;
            layer.mlp = layer.mlp.shard(group)?;
        }
        Ok(())
    }

    fn pipeline(&mut self, stage: Stage) -> Result<()> {
        if !self.arch.can_pipeline() {
            return Err(EngineError::Config(format!(
                "pipeline parallel is not supported for model_type {} (mlx-lm's model has no pipeline either)",
                self.arch.model_type()
            )));
        }
        stage.check_loaded(self.layers.len())?;
        self.stage = Some(stage);
        Ok(())
    }

    fn forward(&self, tokens: &Array, cache: &mut [Box<dyn KvCache>]) -> Result<Array> {
        crate::nn::with_device_bound_decode(self.device_bound(), || self.forward_layers(tokens, cache))
    }
}

impl<T: Arch> Stack<T> {
    /// [`Model::forward`]'s body.
    fn forward_layers(&self, tokens: &Array, cache: &mut [Box<dyn KvCache>]) -> Result<Array> {
        check_caches(cache, self.layers.len())?;
        let mut h = self.embed_tokens.forward(tokens)?; // (B, L, hidden)
        let masks = self.arch.masks(tokens.dim(1), self.first_layer, cache)?;
        // A pipeline stage starts from the previous stage's output (mlx-lm's order).
        if let Some(s) = &self.stage {
            h = s.receive(&h)?;
        }
        let mut lookahead = crate::prefill::Lookahead::new(tokens.dim(1));
        // Each residual add is taken with the norm after it (RmsNorm::add_forward): the layer's
        // feed-forward output with the next layer's input norm, the last layer's with the final
        // norm (unless a pipeline stage hands its residual stream on first).
        let mut x = match self.layers.first() {
            Some(layer) => layer.input_layernorm.forward(&h)?,
            None => h.clone(),
        };
        let mut normed = None;
        for (i, (layer, c)) in self.layers.iter().zip(cache.iter_mut()).enumerate() {
            let r = self.arch.attend(&layer.self_attn, &x, self.first_layer + i, &masks, c.as_mut())?;
            let (h1, x2) = layer.post_attention_layernorm.add_forward(&h, &r)?;
            let r = layer.mlp.forward(&x2)?;
            (h, x) = match (self.layers.get(i + 1), &self.stage) {
                (Some(next), _) => next.input_layernorm.add_forward(&h1, &r)?,
                (None, None) => {
                    let (h2, n) = self.norm.add_forward(&h1, &r)?;
                    normed = Some(n);
                    (h2, x)
                }
                (None, Some(_)) => (h1.add(&r)?, x),
            };
            lookahead.layer_done(&h)?;
        }
        if let Some(s) = &self.stage {
            h = s.pass_on(&h)?;
        }
        let h = match normed {
            Some(n) => n,
            None => self.norm.forward(&h)?,
        };
        match (&self.lm_head, &self.vocab_group) {
            (Some(head), Some(g)) => crate::shard::gather_last_axis(&head.forward(&h)?, g), // (B, L, vocab / N) gathered
            (Some(head), None) => head.forward(&h),
            (None, _) => self.embed_tokens.as_linear(&h),
        } // (B, L, vocab)
    }
}
