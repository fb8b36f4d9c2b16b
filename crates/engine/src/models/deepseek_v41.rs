//! `deepseek_v41` (DeepSeek-V4.1 text model) as mlx-lm's `models/deepseek_v41.py`: `hc_mult`
//! hyper-connection streams mixed around each attention and MoE block (Sinkhorn-normalised
//! mixing), attention over a sliding window of single-head latents plus, on compressing layers,
//! the top-k of the compressed groups the indexer picks (with per-head sinks and the FP8 / FP4
//! rounding the reference applies), a grouped low-rank output, and clamped-SwiGLU experts with
//! `sqrtsoftplus` routing. Each layer keeps its own [`LayerCache`] (window, compressed groups,
//! index keys, the open group's rows), which cannot be trimmed, as mlx-lm's.
use super::Model;
use crate::cache::KvCache;
use crate::error::{EngineError, Result};
use crate::nn::moe::SwitchGlu;
use crate::pipeline::Stage;
use crate::shard::ShardMode;
use crate::nn::{Embedding, Linear, QuantConfig, RmsNorm, Rope, RopeScaling};
use checkpoint::{Vb, Weights};
use mlx::distributed::Group;
use mlx::{fast, ops, Array, Dtype};
use serde::Deserialize;

/// `ModelArgs` of deepseek_v41.py (defaults in [`defaults`]).
#[derive(Clone, Debug, Deserialize)]
struct Config {
    vocab_size: i32,
    hidden_size: i32,
    num_hidden_layers: i32,
    num_attention_heads: i32,
    head_dim: i32,
    q_lora_rank: i32,
    qk_rope_head_dim: i32,
    o_groups: i32,
    o_lora_rank: i32,
    moe_intermediate_size: i32,
    n_routed_experts: i32,
    num_experts_per_tok: i32,
    scoring_func: String,
    gate_temp: f64,
    norm_topk_prob: bool,
    routed_scaling_factor: f64,
    swiglu_limit: f64,
    rms_norm_eps: f64,
    sliding_window: i32,
    compress_ratios: Vec<i32>,
    kv_source_layer_ids: Vec<i32>,
    index_source_layer_ids: Vec<i32>,
    compress_rope_theta: f64,
    candidate_source_layer_id: i32,
    candidate_topk_blocks: i32,
    candidate_block_size: i32,
    index_n_heads: i32,
    index_head_dim: i32,
    index_topk: i32,
    rope_theta: f64,
    rope_scaling: Option<RopeScaling>,
    max_position_embeddings: f64,
    hc_mult: i32,
    hc_sinkhorn_iters: i32,
    hc_eps: f64,
    engram_layer_ids: Vec<i32>,
}

fn defaults() -> serde_json::Value {
    serde_json::json!({
        "vocab_size": 129280, "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 64,
        "head_dim": 512, "q_lora_rank": 1280, "qk_rope_head_dim": 64, "o_groups": 8, "o_lora_rank": 1024,
        "moe_intermediate_size": 2304, "n_routed_experts": 384, "num_experts_per_tok": 6,
        "scoring_func": "sqrtsoftplus", "gate_temp": 1.0, "norm_topk_prob": true, "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0, "rms_norm_eps": 1e-20, "sliding_window": 128, "compress_ratios": [],
        "kv_source_layer_ids": [], "index_source_layer_ids": [], "compress_rope_theta": 160000.0,
        "candidate_source_layer_id": -1, "candidate_topk_blocks": 2048, "candidate_block_size": 8,
        "index_n_heads": 32, "index_head_dim": 128, "index_topk": 512, "rope_theta": 10000.0,
        "rope_scaling": null, "max_position_embeddings": 1048576, "hc_mult": 4, "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6, "engram_layer_ids": [],
    })
}

/// `ModelArgs.from_dict`: a `text_config` (with the top-level model_type) over the defaults.
fn parse(config: &serde_json::Value) -> Result<Config> {
    let params = config.get("text_config").unwrap_or(config);
    let mut merged = defaults();
    if let (Some(m), Some(p)) = (merged.as_object_mut(), params.as_object()) {
        m.extend(p.clone());
    }
    let c: Config = serde_json::from_value(merged).map_err(|e| EngineError::Config(e.to_string()))?;
    let positive = [
        ("hc_mult", c.hc_mult),
        ("o_groups", c.o_groups),
        ("sliding_window", c.sliding_window),
        ("candidate_block_size", c.candidate_block_size),
        ("num_experts_per_tok", c.num_experts_per_tok),
        ("index_topk", c.index_topk),
        ("hc_sinkhorn_iters", c.hc_sinkhorn_iters),
    ];
    if let Some((name, v)) = positive.iter().find(|(_, v)| *v <= 0) {
        return Err(EngineError::Config(format!("deepseek_v41 needs a positive {name}, not {v}")));
    }
    if (c.num_attention_heads * c.head_dim) % c.o_groups != 0 || c.num_experts_per_tok > c.n_routed_experts {
        return Err(EngineError::Config(format!(
            "deepseek_v41: o_groups {} must divide heads x head_dim ({}), and num_experts_per_tok {} be at most n_routed_experts {}",
            c.o_groups,
            c.num_attention_heads * c.head_dim,
            c.num_experts_per_tok,
            c.n_routed_experts
        )));
    }
    if !c.engram_layer_ids.is_empty() {
        return Err(EngineError::Config(format!(
            "layers {:?} use engram memory, which deepseek_v41 does not have (nor does mlx-lm)",
            c.engram_layer_ids
        )));
    }
    Ok(c)
}

/// One decoder layer's cache (mlx-lm's `LayerCache`): rows are (B, n, dim).
#[derive(Clone)]
pub struct LayerCache {
    window_size: i32,
    offset: i32,
    window: Option<Array>,
    compress_kv: Option<Array>,
    index_k: Option<Array>,
    pending_kv: Option<Array>,
    pending_gate: Option<Array>,
}

/// `_append`: `new` after `cached` along the rows.
fn append(cached: &Option<Array>, new: &Array) -> Result<Array> {
    Ok(match cached {
        Some(c) => ops::concatenate(&[c, new], 1)?,
        None => new.clone(),
    })
}

impl LayerCache {
    fn new(window_size: i32) -> LayerCache {
        LayerCache { window_size, offset: 0, window: None, compress_kv: None, index_k: None, pending_kv: None, pending_gate: None }
    }

    /// The window with `kv` appended (returned whole), keeping its last `window_size` rows.
    fn update_window(&mut self, kv: &Array) -> Result<Array> {
        let window = append(&self.window, kv)?;
        let n = window.dim(1);
        self.window = Some(window.slice_axis(1, (n - self.window_size).max(0), n)?);
        self.offset += kv.dim(1);
        Ok(window)
    }

    fn arrays(&self) -> impl Iterator<Item = &Array> {
        [&self.window, &self.compress_kv, &self.index_k, &self.pending_kv, &self.pending_gate].into_iter().flatten()
    }
}

impl KvCache for LayerCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn update_and_fetch(&mut self, _keys: &Array, _values: &Array) -> Result<(Array, Array)> {
        Err(EngineError::Invalid("a deepseek_v41 layer cache holds its window and compressed groups, not keys and values".into()))
    }

    /// Evicted window rows and closed compressed groups cannot be restored.
    fn is_trimmable(&self) -> bool {
        false
    }

    fn trim(&mut self, _n: i32) -> Result<i32> {
        Err(EngineError::Invalid("a deepseek_v41 layer cache cannot be trimmed (mlx-lm's cannot either)".into()))
    }

    /// Speculative decoding puts the whole cache back after a rejection instead.
    fn checkpoint(&self, _upcoming: i32) -> Option<Box<dyn KvCache>> {
        Some(Box::new(self.clone()))
    }

    fn state(&self) -> Vec<Array> {
        self.arrays().cloned().collect()
    }

    fn nbytes(&self) -> usize {
        self.arrays().map(Array::nbytes).sum()
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
}

/// The interleaved YaRN rope (`YarnRoPE(traditional=True)`) on the trailing `dims` features of
/// x (B, L, H, D) or (B, L, D), in float32, positions `offset..` times `scale`; `inverse` rotates back.
#[derive(Clone)]
struct TailRope {
    rope: Rope,
    dims: i32,
}

impl TailRope {
    fn apply(&self, x: &Array, offset: i32, scale: f32, inverse: bool) -> Result<Array> {
        if self.dims == 0 {
            return Ok(x.clone());
        }
        let d = x.dim(-1);
        let head = x.slice_axis(-1, 0, d - self.dims)?;
        let tail = x.slice_axis(-1, d - self.dims, d)?.astype(Dtype::F32)?;
        let tail = if x.ndim() == 4 {
            let t = self.rope.forward_scaled(&tail.transpose(&[0, 2, 1, 3])?, offset, scale, inverse)?;
            t.transpose(&[0, 2, 1, 3])?
        } else {
            self.rope.forward_scaled(&tail, offset, scale, inverse)?
        };
        Ok(ops::concatenate(&[&head, &tail.astype(x.dtype())?], -1)?)
    }
}

/// `x` (..., n) split into blocks of `block` as float32 (..., n / block, block); `None` when
/// `block` does not divide n (the value stays as it is).
fn blocks(x: &Array, block: i32) -> Result<Option<Array>> {
    if x.dim(-1) % block != 0 {
        return Ok(None);
    }
    let mut shape = x.shape();
    shape.pop();
    shape.extend([-1, block]);
    Ok(Some(x.astype(Dtype::F32)?.reshape(&shape)?))
}

/// `_fake_quant_fp8`: a round trip through FP8 e4m3 with power-of-two block scales.
fn fake_quant_fp8(x: &Array, block: i32) -> Result<Array> {
    let Some(b) = blocks(x, block)? else { return Ok(x.clone()) };
    let amax = b.abs()?.max(&[-1], true)?.maximum_scalar(1e-4)?;
    let scale = Array::scalar(2.0, Dtype::F32)?.power(&amax.div_scalar(448.0)?.log2()?.ceil()?)?;
    let q = b.div(&scale)?.maximum_scalar(-448.0)?.minimum_scalar(448.0)?;
    Ok(q.to_fp8()?.from_fp8(Dtype::F32)?.mul(&scale)?.reshape(&x.shape())?.astype(x.dtype())?)
}

/// `_fake_quant_fp4`: each value rounded to the nearest FP4 (e2m1) level of its block's scale
/// (an e4m3-rounded one, or a power of two).
fn fake_quant_fp4(x: &Array, block: i32, e4m3_scale: bool) -> Result<Array> {
    let Some(b) = blocks(x, block)? else { return Ok(x.clone()) };
    let floor = if e4m3_scale { 6.0 * 2f64.powi(-9) } else { 6.0 * 2f64.powi(-126) };
    let amax = b.abs()?.max(&[-1], true)?.maximum_scalar(floor)?;
    let scale = if e4m3_scale {
        amax.div_scalar(6.0)?.to_fp8()?.from_fp8(Dtype::F32)?
    } else {
        Array::scalar(2.0, Dtype::F32)?.power(&amax.div_scalar(6.0)?.log2()?.ceil()?)?
    };
    let v = b.div(&scale)?.maximum_scalar(-6.0)?.minimum_scalar(6.0)?;
    // _round_fp4: the level index from the midpoints (ties to even), then its signed value.
    let mag = v.abs()?;
    let mut idx = ops::zeros(&mag.shape(), Dtype::I32)?;
    for t in [0.25, 1.25, 2.5, 5.0] {
        idx = idx.add(&mag.gt_scalar(t)?.astype(Dtype::I32)?)?;
    }
    for t in [0.75, 1.75, 3.5] {
        idx = idx.add(&mag.ge_scalar(t)?.astype(Dtype::I32)?)?;
    }
    let lut = Array::from_slice(&[0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], &[8])?;
    let q = v.sign()?.mul(&lut.take(&idx, 0)?)?.mul(&scale)?;
    Ok(q.reshape(&x.shape())?.astype(x.dtype())?)
}

/// The hyper-connection mixer (`attn_hc` / `ffn_hc`).
#[derive(Clone)]
struct HyperConnection {
    fn_: Array,  // (mix, hc * hidden) f32
    base: Array, // (mix,) f32
    scale: Array, // (3,) f32, taken per mix column
    scale_ids: Array,
    eps: Array, // (1,) f32
    hc: i32,
    iters: i32,
    hc_eps: f64,
    norm_eps: f32,
}

impl HyperConnection {
    fn load(vb: &Vb<'_>, c: &Config) -> Result<HyperConnection> {
        let hc = c.hc_mult;
        let mix = (2 + hc) * hc;
        let ids: Vec<i32> = (0..mix).map(|i| if i < hc { 0 } else if i < 2 * hc { 1 } else { 2 }).collect();
        Ok(HyperConnection {
            fn_: vb.get("fn", &[mix, hc * c.hidden_size])?,
            base: vb.get("base", &[mix])?,
            scale: vb.get("scale", &[3])?,
            scale_ids: Array::from_slice(&ids, &[mix])?,
            eps: Array::from_slice(&[c.hc_eps as f32], &[1])?,
            hc,
            iters: c.hc_sinkhorn_iters,
            hc_eps: c.hc_eps,
            norm_eps: c.rms_norm_eps as f32,
        })
    }

    fn arrays(&self) -> Vec<&Array> {
        vec![&self.fn_, &self.base, &self.scale]
    }

    /// streams (B, L, hc, D) -> (pre (B, L, hc), post (B, L, hc), comb (B, L, hc, hc)), float32.
    fn forward(&self, streams: &Array) -> Result<(Array, Array, Array)> {
        let (b, l, hc) = (streams.dim(0), streams.dim(1), self.hc);
        let flat = fast::rms_norm(&streams.reshape(&[b, l, -1])?.astype(Dtype::F32)?, None, self.norm_eps)?;
        let mix = flat.matmul(&self.fn_.t()?)?.mul(&self.scale.take(&self.scale_ids, 0)?)?.add(&self.base)?;
        let pre = mix.slice_axis(-1, 0, hc)?.sigmoid()?.add_scalar(self.hc_eps)?;
        let post = mix.slice_axis(-1, hc, 2 * hc)?.sigmoid()?.mul_scalar(2.0)?;
        let comb = mix.slice_axis(-1, 2 * hc, i32::MAX)?.reshape(&[b, l, hc, hc])?;
        let comb = comb.softmax(&[-1], false)?.add_scalar(self.hc_eps)?;
        // _sinkhorn: the columns, then rows and columns iters - 1 more times.
        let norm = |c: &Array, axis: i32| -> Result<Array> { Ok(c.div(&c.sum(&[axis], true)?.add(&self.eps)?)?) };
        let mut comb = norm(&comb, -2)?;
        for _ in 0..self.iters - 1 {
            comb = norm(&norm(&comb, -1)?, -2)?;
        }
        Ok((pre, post, comb))
    }
}

/// `_collapse`: streams (B, L, hc, D) weighed by mix (B, L, hc) -> (B, L, D).
fn collapse(streams: &Array, mix: &Array) -> Result<Array> {
    let s = mix.expand_dims(&[-1])?.mul(&streams.astype(Dtype::F32)?)?.sum(&[2], false)?;
    Ok(s.astype(streams.dtype())?)
}

/// `_expand`: the block output x (B, L, D) into the streams, `post`-weighed, plus the residual
/// streams mixed by `comb`.
fn expand(x: &Array, residual: &Array, post: &Array, comb: &Array) -> Result<Array> {
    let mixed = comb.expand_dims(&[-1])?.mul(&residual.expand_dims(&[-2])?)?.sum(&[2], false)?;
    let out = post.expand_dims(&[-1])?.mul(&x.expand_dims(&[-2])?)?.add(&mixed)?;
    Ok(out.astype(residual.dtype())?)
}

mod attention;
mod pipeline;
mod published;
pub use published::{sanitize, sanitized_shapes};
use attention::{Attention, Shared};

/// `DeepseekV41SwiGLU`: in float32, the gate clamped from above and the up part both ways.
fn clamped_swiglu(up: &Array, gate: &Array, limit: f64) -> Result<Array> {
    let (mut gate, mut up) = (gate.astype(Dtype::F32)?, up.astype(Dtype::F32)?);
    if limit > 0.0 {
        gate = gate.minimum_scalar(limit)?;
        up = up.maximum_scalar(-limit)?.minimum_scalar(limit)?;
    }
    Ok(fast::swiglu(&gate, &up)?)
}

/// The MoE block: float32 router, routed experts and the shared one.
#[derive(Clone)]
struct Moe {
    gate_weight: Array, // (experts, hidden) f32
    bias: Array,        // (experts,) f32
    switch_mlp: SwitchGlu,
    shared: [Linear; 3], // gate, up, down
    /// Tensor parallel: the group the experts' outputs are summed over.
    reduce: Option<Group>,
    top_k: i32,
    scoring: String,
    gate_temp: f64,
    norm_topk_prob: bool,
    route_scale: f64,
    limit: f64,
}

impl Moe {
    fn load(vb: &Vb<'_>, c: &Config, q: &QuantConfig) -> Result<Moe> {
        let (d, h, e) = (c.hidden_size, c.moe_intermediate_size, c.n_routed_experts);
        let s = vb.pp("shared_experts");
        Ok(Moe {
            gate_weight: vb.pp("gate").get("weight", &[e, d])?,
            bias: vb.pp("gate").get("e_score_correction_bias", &[e])?,
            switch_mlp: SwitchGlu::load(&vb.pp("experts").pp("switch_mlp"), d, h, e, q)?,
            shared: [
                Linear::load(&s.pp("gate_proj"), d, h, false, q)?,
                Linear::load(&s.pp("up_proj"), d, h, false, q)?,
                Linear::load(&s.pp("down_proj"), h, d, false, q)?,
            ],
            reduce: None,
            top_k: c.num_experts_per_tok,
            scoring: c.scoring_func.clone(),
            gate_temp: c.gate_temp,
            norm_topk_prob: c.norm_topk_prob,
            route_scale: c.routed_scaling_factor,
            limit: c.swiglu_limit,
        })
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut v = vec![&self.gate_weight, &self.bias];
        v.extend(self.switch_mlp.arrays());
        v.extend(self.shared.iter().flat_map(|l| l.arrays()));
        v
    }

    /// This rank's block of every routed and the shared expert's hidden units, summed over `group`
    /// once at the end (mlx-lm's `shard_inplace` and `sharding_group`); the router whole.
    fn shard(&self, group: &Group) -> Result<Moe> {
        let [g, u, d] = &self.shared;
        Ok(Moe {
            switch_mlp: self.switch_mlp.shard(group)?,
            shared: [
                g.shard(ShardMode::AllToSharded, &[g.out_dims()], group)?,
                u.shard(ShardMode::AllToSharded, &[u.out_dims()], group)?,
                d.shard_inplace(ShardMode::ShardedToAll, &[], group)?,
            ],
            reduce: Some(group.clone()),
            ..self.clone()
        })
    }

    /// x (B, L, D) -> (B, L, D).
    fn forward(&self, x: &Array) -> Result<Array> {
        let flat = x.reshape(&[-1, x.dim(-1)])?; // (N, D)
        // Router
        let logits = flat.astype(Dtype::F32)?.matmul(&self.gate_weight.astype(Dtype::F32)?.t()?)?.div_scalar(self.gate_temp)?;
        let scores = match self.scoring.as_str() {
            "sigmoid" => logits.sigmoid()?,
            "softmax" => logits.softmax(&[-1], false)?,
            _ => logits.logaddexp_scalar(0.0)?.sqrt()?,
        };
        let k = self.top_k;
        let chosen = scores.add(&self.bias)?.neg()?.argpartition(k - 1, -1)?.slice_axis(-1, 0, k)?;
        let mut weights = scores.take_along_axis(&chosen, -1)?;
        if self.norm_topk_prob && k > 1 {
            weights = weights.div(&weights.sum(&[-1], true)?.add_scalar(1e-20)?)?;
        }
        let weights = weights.mul_scalar(self.route_scale)?;
        // Experts
        let routed = self.switch_mlp.forward_with(&flat, &chosen, |up, gate| Ok(clamped_swiglu(up, gate, self.limit)?.astype(up.dtype())?))?;
        let routed = routed.astype(Dtype::F32)?.mul(&weights.expand_dims(&[-1])?.astype(Dtype::F32)?)?.sum(&[1], false)?;
        // SharedMLP
        let [g, u, dn] = &self.shared;
        let shared = dn.forward(&clamped_swiglu(&u.forward(&flat)?, &g.forward(&flat)?, self.limit)?.astype(flat.dtype())?)?;
        let out = routed.add(&shared.astype(Dtype::F32)?)?;
        let out = match &self.reduce {
            Some(g) => g.all_sum(&out)?,
            None => out,
        };
        Ok(out.reshape(&x.shape())?.astype(x.dtype())?)
    }
}

struct Layer {
    self_attn: Attention,
    mlp: Moe,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    attn_hc: HyperConnection,
    ffn_hc: HyperConnection,
}

pub struct DeepseekV41 {
    config: Config,
    model_type: String,
    vocab_size: i32,
    hc: i32,
    window: i32,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    /// A pipeline stage, with the shared state it receives and sends (`_shared_in`, `_shared_out`).
    stage: Option<(Stage, pipeline::Crossing, pipeline::Crossing)>,
}

/// `_window_indices`: for each of `length` new queries, the window rows it attends to (the
/// window holds `previous` rows, then the new ones), -1 for none; (length, width) int32.
fn window_indices(previous: i32, length: i32, window: i32) -> Result<Array> {
    let width = window.min(previous + length);
    let end = ops::arange(0.0, f64::from(length), 1.0, Dtype::I32)?.add_scalar(f64::from(previous))?;
    let start = end.sub_scalar(f64::from(window - 1))?.maximum_scalar(0.0)?;
    let idx = start.expand_dims(&[1])?.add(&ops::arange(0.0, f64::from(width), 1.0, Dtype::I32)?.expand_dims(&[0])?)?;
    Ok(ops::where_(&idx.gt(&end.expand_dims(&[1])?)?, &Array::scalar(-1.0, Dtype::I32)?, &idx)?)
}

impl Model for DeepseekV41 {
    fn model_type(&self) -> &str {
        &self.model_type
    }

    fn vocab_size(&self) -> i32 {
        self.vocab_size
    }

    fn parameters(&self) -> Vec<&Array> {
        let mut v = self.embed_tokens.arrays();
        for l in &self.layers {
            v.extend(l.self_attn.arrays());
            v.extend(l.mlp.arrays());
            v.extend(l.input_layernorm.arrays());
            v.extend(l.post_attention_layernorm.arrays());
            v.extend(l.attn_hc.arrays());
            v.extend(l.ffn_hc.arrays());
        }
        v.extend(self.norm.arrays());
        v.extend(self.lm_head.arrays());
        v
    }

    fn make_cache(&self) -> Vec<Box<dyn KvCache>> {
        self.layers.iter().map(|_| Box::new(LayerCache::new(self.window)) as Box<dyn KvCache>).collect()
    }

    /// mlx-lm's `pipeline`: this rank's layers (loaded alone), and what crosses its boundaries.
    fn pipeline(&mut self, stage: Stage) -> Result<()> {
        stage.check_loaded(self.layers.len())?;
        let r = stage.layers();
        let (shared_in, shared_out) = (pipeline::crossing(&self.config, r.start), pipeline::crossing(&self.config, r.end));
        self.stage = Some((stage, shared_in, shared_out));
        Ok(())
    }

    fn shard(&mut self, group: &Group) -> Result<()> {
        for l in &mut self.layers {
            l.self_attn = l.self_attn.shard(group)?;
            l.mlp = l.mlp.shard(group)?;
        }
        Ok(())
    }

    fn forward(&self, tokens: &Array, cache: &mut [Box<dyn KvCache>]) -> Result<Array> {
        super::check_caches(cache, self.layers.len())?;
        let mut caches = cache
            .iter_mut()
            .map(|c| c.as_any_mut().and_then(|a| a.downcast_mut::<LayerCache>()))
            .collect::<Option<Vec<&mut LayerCache>>>()
            .ok_or_else(|| EngineError::Invalid("deepseek_v41 runs on its own layer caches".into()))?;
        let h = self.embed_tokens.forward(tokens)?; // (B, L, D)
        let (b, l) = (h.dim(0), h.dim(1));
        let start = caches[0].offset;
        // Every layer's window holds the same rows, so all use the same indices.
        let previous = caches[0].window.as_ref().map_or(0, |w| w.dim(1));
        let window_idx = window_indices(previous, l, self.window)?.expand_dims(&[0])?.add(&ops::zeros(&[b, 1, 1], Dtype::I32)?)?; // (B, L, width)
        let h4 = h.expand_dims(&[2])?;
        let mut streams = h4.broadcast_to(&[b, l, self.hc, h.dim(2)])?; // (B, L, hc, D)
        let first = ops::full(&[b, l, 1], 1.0, Dtype::F32)?;
        let mut pre_mix = ops::concatenate(&[&first, &ops::zeros(&[b, l, self.hc - 1], Dtype::F32)?], -1)?; // (B, L, hc)
        let mut shared = Shared::default();
        if let Some((stage, shared_in, _)) = self.stage.as_ref().filter(|(s, ..)| s.receives()) {
            (streams, pre_mix) = pipeline::receive(&self.config, stage, shared_in, &streams, start, caches[0], &mut shared)?;
        }
        for (layer, c) in self.layers.iter().zip(caches.iter_mut()) {
            let (attn_pre, attn_post, attn_comb) = layer.attn_hc.forward(&streams)?;
            let x = layer.input_layernorm.forward(&collapse(&streams, &pre_mix)?)?;
            let x = layer.self_attn.forward(&x, start, &window_idx, c, &mut shared)?;
            streams = expand(&x, &streams, &attn_post, &attn_comb)?;
            let (ffn_pre, ffn_post, ffn_comb) = layer.ffn_hc.forward(&streams)?;
            let x = layer.mlp.forward(&layer.post_attention_layernorm.forward(&collapse(&streams, &attn_pre)?)?)?;
            streams = expand(&x, &streams, &ffn_post, &ffn_comb)?;
            pre_mix = ffn_pre;
        }
        if let Some((stage, _, shared_out)) = self.stage.as_ref().filter(|(s, ..)| s.sends()) {
            pipeline::send(&self.config, stage, shared_out, &streams, &pre_mix, start, &shared)?;
        }
        let mut out = collapse(&streams, &pre_mix)?;
        if let Some((stage, ..)) = &self.stage {
            // Rank 0 runs the last layers, and every rank needs its output.
            out = stage.gather(&out)?;
        }
        let out = self.norm.forward(&out)?;
        self.lm_head.forward(&out) // (B, L, vocab)
    }
}

pub fn load(config: &serde_json::Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    let c = parse(config)?;
    let model_type = config.get("model_type").and_then(|t| t.as_str()).unwrap_or("deepseek_v41").to_owned();
    sanitize(config, weights)?;
    let vb = weights.view("model");
    let mut layers = Vec::new();
    for i in (0..c.num_hidden_layers).filter(|&i| weights.loads_layer(i)) {
        let l = vb.pp("layers").pp(i);
        layers.push(Layer {
            self_attn: Attention::load(&l.pp("self_attn"), &c, i, q)?,
            mlp: Moe::load(&l.pp("mlp"), &c, q)?,
            input_layernorm: RmsNorm::load(&l.pp("input_layernorm"), c.hidden_size, c.rms_norm_eps)?,
            post_attention_layernorm: RmsNorm::load(&l.pp("post_attention_layernorm"), c.hidden_size, c.rms_norm_eps)?,
            attn_hc: HyperConnection::load(&l.pp("attn_hc"), &c)?,
            ffn_hc: HyperConnection::load(&l.pp("ffn_hc"), &c)?,
        });
    }
    Ok(Box::new(DeepseekV41 {
        config: c.clone(),
        model_type,
        vocab_size: c.vocab_size,
        hc: c.hc_mult,
        window: c.sliding_window,
        embed_tokens: Embedding::load(&vb.pp("embed_tokens"), c.vocab_size, c.hidden_size, q)?,
        layers,
        norm: RmsNorm::load(&vb.pp("norm"), c.hidden_size, c.rms_norm_eps)?,
        lm_head: Linear::load(&weights.view("lm_head"), c.hidden_size, c.vocab_size, false, q)?,
        stage: None,
    }))
}
