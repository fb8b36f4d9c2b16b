//! deepseek_v41.py's attention: the sliding window of single-head latents, the KV compressor
//! (groups of `ratio` tokens pooled by a softmax gate) and the indexer that picks each query's
//! top-k compressed groups (optionally within candidate blocks), attended together with sinks.
use super::cache::{append, LayerCache};
use super::rounding::{fake_quant_fp4, fake_quant_fp8, TailRope};
use super::Config;
use crate::error::Result;
use crate::nn::moe::SwitchLinear;
use crate::nn::{Linear, QuantConfig, RmsNorm, Rope, RopeScaling};
use crate::shard::ShardMode;
use checkpoint::Vb;
use mlx::distributed::Group;
use mlx::{fast, ops, Array, Dtype};

/// What one forward pass's layers hand on to later layers (mlx-lm's `shared` dict).
#[derive(Default)]
pub(super) struct Shared {
    pub(super) compress_kv: Option<Array>, // (B, groups, head_dim)
    pub(super) index_k: Option<Array>,     // (B, groups, index_head_dim)
    pub(super) topk_idx: Option<Array>,    // (B, L, k) int32, -1 for none
    pub(super) candidates: Option<Array>,  // (B, L, groups) bool
}

#[derive(Clone)]
struct Compressor {
    ratio: i32,
    kv_proj: Linear,
    gate_proj: Option<Linear>,
    kv_norm: RmsNorm,
}

impl Compressor {
    /// Each full group of `ratio` tokens pooled into one latent (B, groups, head_dim), `None` while
    /// no group is full, and the index of the first group.
    fn forward(&self, x: &Array, start: i32, cache: &mut LayerCache) -> Result<(Option<Array>, i32)> {
        let Some(gate_proj) = self.gate_proj.as_ref().filter(|_| self.ratio > 1) else {
            return Ok((Some(self.kv_norm.forward(&self.kv_proj.forward(x)?)?), start));
        };
        let h = x.astype(Dtype::F32)?;
        let pending = cache.pending_kv.as_ref().map_or(0, |p| p.dim(1));
        let kv = append(&cache.pending_kv, &self.kv_proj.forward(&h)?)?;
        let gate = append(&cache.pending_gate, &gate_proj.forward(&h)?)?;
        let n = kv.dim(1);
        let full = n - n % self.ratio;
        cache.pending_kv = Some(kv.slice_axis(1, full, n)?);
        cache.pending_gate = Some(gate.slice_axis(1, full, n)?);
        // A group takes the position of its first token; the RoPE scale multiplies by the ratio.
        let first = (start - pending).div_euclid(self.ratio);
        if full == 0 {
            return Ok((None, first));
        }
        let (b, dim) = (kv.dim(0), kv.dim(2));
        let kv = kv.slice_axis(1, 0, full)?.reshape(&[b, -1, self.ratio, dim])?;
        let gate = gate.slice_axis(1, 0, full)?.reshape(&[b, -1, self.ratio, dim])?;
        let latent = kv.mul(&gate.softmax(&[2], false)?)?.sum(&[2], false)?;
        Ok((Some(self.kv_norm.forward(&latent.astype(x.dtype())?)?), first))
    }
}

#[derive(Clone)]
struct Indexer {
    ratio: i32,
    candidate_source: bool,
    candidate_topk_blocks: i32,
    candidate_block_size: i32,
    heads: i32,
    head_dim: i32,
    topk: i32,
    q_b_proj: Linear,
    weights_proj: Linear,
    /// On a layer that compresses its own KV: the index keys' projection and norm.
    k: Option<(Linear, RmsNorm)>,
}

impl Indexer {
    /// The top-k compressed groups of each query (B, L, k) int32, -1 for none, and the candidate
    /// mask: the one this layer selects, or the given one.
    fn forward(&self, x: &Array, q_residual: &Array, shared: &Shared, rope: &TailRope, start: i32) -> Result<(Array, Option<Array>)> {
        let (b, l) = (x.dim(0), x.dim(1));
        let index_k = match &shared.index_k {
            Some(k) if k.dim(1) > 0 => k,
            _ => return Ok((ops::zeros(&[b, l, 0], Dtype::I32)?, shared.candidates.clone())),
        };
        let groups = index_k.dim(1);
        let q = self.q_b_proj.forward(q_residual)?.reshape(&[b, l, self.heads, self.head_dim])?;
        let q = fake_quant_fp4(&rope.apply(&q, start, 1.0, false)?, 32, false)?;
        let keys = index_k.astype(Dtype::F32)?;
        let weights = self.weights_proj.forward(x)?.astype(Dtype::F32)?.mul_scalar(f64::from(self.heads).powf(-0.5))?;
        let scores = q.astype(Dtype::F32)?.matmul(&keys.expand_dims(&[1])?.swapaxes(-1, -2)?)?; // (B, L, H, groups)
        let scores = scores.maximum_scalar(0.0)?.mul_scalar(f64::from(self.head_dim).powf(-0.5))?;
        let scores = scores.mul(&weights.expand_dims(&[-1])?)?.sum(&[2], false)?; // (B, L, groups)
        // A query sees the groups that end at or before it.
        let lens = ops::arange(0.0, f64::from(l), 1.0, Dtype::I32)?.add_scalar(f64::from(start + 1))?;
        let lens = lens.floor_divide_scalar(f64::from(self.ratio))?.expand_dims(&[1])?; // (L, 1)
        let visible = ops::arange(0.0, f64::from(groups), 1.0, Dtype::I32)?.expand_dims(&[0])?.lt(&lens)?;
        let neg_inf = Array::scalar(f64::NEG_INFINITY, Dtype::F32)?;
        let mut scores = ops::where_(&visible.expand_dims(&[0])?, &scores, &neg_inf)?;
        let mut candidates = shared.candidates.clone();
        if self.candidate_source && self.candidate_topk_blocks > 0 {
            let block = self.candidate_block_size;
            let pad = (-groups).rem_euclid(block);
            let padded = scores.pad(&[(0, 0), (0, 0), (0, pad)], f64::NEG_INFINITY)?;
            let block_scores = padded.reshape(&[b, l, -1, block])?.max(&[-1], false)?; // (B, L, blocks)
            // Always keep the newest block: it is only partly full.
            let last = ops::where_(&lens.gt_scalar(0.0)?, &lens.sub_scalar(1.0)?.floor_divide_scalar(f64::from(block))?, &Array::scalar(-1.0, Dtype::I32)?)?;
            let n_blocks = block_scores.dim(-1);
            let is_last = ops::arange(0.0, f64::from(n_blocks), 1.0, Dtype::I32)?.eq(&last)?;
            let block_scores = ops::where_(&is_last, &Array::scalar(f64::INFINITY, Dtype::F32)?, &block_scores)?;
            let k_blocks = self.candidate_topk_blocks.min(n_blocks);
            let chosen = block_scores.neg()?.argpartition(k_blocks - 1, -1)?.slice_axis(-1, 0, k_blocks)?;
            let reachable = block_scores.take_along_axis(&chosen, -1)?.gt(&neg_inf)?;
            let c = ops::zeros(&block_scores.shape(), Dtype::Bool)?.put_along_axis(&chosen, &reachable, -1)?;
            candidates = Some(c.repeat(block, -1)?.slice_axis(-1, 0, groups)?);
        } else if let Some(c) = &candidates {
            scores = ops::where_(c, &scores, &neg_inf)?;
        }
        let k = self.topk.min(groups);
        let chosen = scores.neg()?.argpartition(k - 1, -1)?.slice_axis(-1, 0, k)?.astype(Dtype::I32)?;
        let chosen = ops::where_(&chosen.lt(&lens.expand_dims(&[0])?)?, &chosen, &Array::scalar(-1.0, Dtype::I32)?)?;
        Ok((chosen, candidates))
    }
}

#[derive(Clone)]
pub(super) struct Attention {
    heads: i32,
    head_dim: i32,
    o_groups: i32,
    ratio: i32,
    q_a_proj: Linear,
    q_a_norm: RmsNorm,
    q_b_proj: Linear,
    kv_proj: Linear,
    kv_norm: RmsNorm,
    o_a_proj: SwitchLinear, // o_groups x (o_lora, heads * head_dim / o_groups)
    o_b_proj: Linear,
    sinks: Array, // (heads,) f32
    group_ids: Array,
    compressor: Option<Compressor>,
    indexer: Option<Indexer>,
    rope: TailRope,
}

/// `_gather_rows`: values (B, K, D) at indices (B, S, k) (-1 read as 0) -> (B, S, k, D).
fn gather_rows(values: &Array, indices: &Array) -> Result<Array> {
    let (b, len, dim) = (values.dim(0), values.dim(1), values.dim(2));
    let safe = indices.maximum_scalar(0.0)?;
    let base = ops::arange(0.0, f64::from(b), 1.0, Dtype::I32)?.mul_scalar(f64::from(len))?.reshape(&[b, 1, 1])?;
    let flat = values.reshape(&[b * len, dim])?;
    let mut shape = indices.shape();
    shape.push(dim);
    Ok(flat.take(&safe.add(&base)?.reshape(&[-1])?, 0)?.reshape(&shape)?)
}

/// `_sparse_attention`: each query q (B, S, H, D) attends to the rows its indices pick from each
/// KV array (one head, keys = values), in float32 with the heads' sinks.
fn sparse_attention(q: &Array, kvs: &[Array], indices: &[Array], sinks: &Array, scale: f32) -> Result<Array> {
    let (b, s, h, d) = (q.dim(0), q.dim(1), q.dim(2), q.dim(3));
    let rows = kvs.iter().zip(indices).map(|(kv, idx)| gather_rows(kv, idx)).collect::<Result<Vec<_>>>()?;
    let keys = ops::concatenate(&rows.iter().collect::<Vec<_>>(), 2)?.reshape(&[b * s, 1, -1, d])?.astype(Dtype::F32)?;
    let mask = ops::concatenate(&indices.iter().collect::<Vec<_>>(), -1)?.ge_scalar(0.0)?;
    let out = fast::sdpa_sinks(
        &q.reshape(&[b * s, h, 1, d])?.astype(Dtype::F32)?,
        &keys,
        &keys,
        scale,
        &mask.reshape(&[b * s, 1, 1, -1])?,
        &sinks.astype(Dtype::F32)?,
    )?;
    Ok(out.reshape(&[b, s, h, d])?.astype(q.dtype())?)
}

impl Attention {
    pub(super) fn load(vb: &Vb<'_>, c: &Config, layer: i32, q: &QuantConfig) -> Result<Attention> {
        let (d, h, hd, eps) = (c.hidden_size, c.num_attention_heads, c.head_dim, c.rms_norm_eps);
        let ratio = c.compress_ratios.get(layer as usize).copied().unwrap_or(0);
        let kv_source = c.kv_source_layer_ids.contains(&layer);
        let compressor = match kv_source {
            true => {
                let cv = vb.pp("compressor");
                let own_ratio = *c.compress_ratios.get(layer as usize).ok_or_else(|| {
                    crate::error::EngineError::Config(format!("kv source layer {layer} has no compress_ratios entry"))
                })?;
                Some(Compressor {
                    ratio: own_ratio,
                    kv_proj: Linear::load(&cv.pp("kv_proj"), d, hd, false, q)?,
                    gate_proj: (own_ratio > 1).then(|| Linear::load(&cv.pp("gate_proj"), d, hd, false, q)).transpose()?,
                    kv_norm: RmsNorm::load(&cv.pp("kv_norm"), hd, eps)?,
                })
            }
            false => None,
        };
        let indexer = match c.index_source_layer_ids.contains(&layer) {
            true => {
                let iv = vb.pp("indexer");
                let (ih, ihd) = (c.index_n_heads, c.index_head_dim);
                let k = match kv_source {
                    true => Some((Linear::load(&iv.pp("k_proj"), hd, ihd, false, q)?, RmsNorm::load(&iv.pp("k_norm"), ihd, eps)?)),
                    false => None,
                };
                Some(Indexer {
                    ratio: *c.compress_ratios.get(layer as usize).ok_or_else(|| {
                        crate::error::EngineError::Config(format!("index source layer {layer} has no compress_ratios entry"))
                    })?,
                    candidate_source: layer == c.candidate_source_layer_id,
                    candidate_topk_blocks: c.candidate_topk_blocks,
                    candidate_block_size: c.candidate_block_size,
                    heads: ih,
                    head_dim: ihd,
                    topk: c.index_topk,
                    q_b_proj: Linear::load(&iv.pp("q_b_proj"), c.q_lora_rank, ih * ihd, false, q)?,
                    weights_proj: Linear::load(&iv.pp("weights_proj"), d, ih, false, q)?,
                    k,
                })
            }
            false => None,
        };
        // YarnRoPE: the compress theta with the config's YaRN (attention_factor 1) on compressing
        // layers; the base theta without YaRN on window-only ones.
        let scaling = if ratio != 0 {
            let s = c.rope_scaling.clone().unwrap_or_default();
            RopeScaling {
                factor: Some(s.factor.unwrap_or(1.0)),
                original_max_position_embeddings: Some(s.original_max_position_embeddings.unwrap_or(c.max_position_embeddings).trunc()),
                beta_fast: Some(s.beta_fast.unwrap_or(32.0).trunc()),
                beta_slow: Some(s.beta_slow.unwrap_or(1.0).trunc()),
                mscale: Some(0.0),
                mscale_all_dim: Some(0.0),
                ..RopeScaling::default()
            }
        } else {
            RopeScaling { factor: Some(1.0), ..RopeScaling::default() }
        };
        let base = if ratio != 0 { c.compress_rope_theta } else { c.rope_theta };
        let per_group = h * hd / c.o_groups.max(1);
        Ok(Attention {
            heads: h,
            head_dim: hd,
            o_groups: c.o_groups,
            ratio,
            q_a_proj: Linear::load(&vb.pp("q_a_proj"), d, c.q_lora_rank, false, q)?,
            q_a_norm: RmsNorm::load(&vb.pp("q_a_norm"), c.q_lora_rank, eps)?,
            q_b_proj: Linear::load(&vb.pp("q_b_proj"), c.q_lora_rank, h * hd, false, q)?,
            kv_proj: Linear::load(&vb.pp("kv_proj"), d, hd, false, q)?,
            kv_norm: RmsNorm::load(&vb.pp("kv_norm"), hd, eps)?,
            o_a_proj: SwitchLinear::load(&vb.pp("o_a_proj"), per_group, c.o_lora_rank, c.o_groups, q)?,
            o_b_proj: Linear::load(&vb.pp("o_b_proj"), c.o_groups * c.o_lora_rank, d, false, q)?,
            sinks: vb.get("sinks", &[h])?,
            group_ids: ops::arange(0.0, f64::from(c.o_groups), 1.0, Dtype::I32)?.expand_dims(&[0])?,
            compressor,
            indexer,
            rope: TailRope { rope: Rope::yarn(c.qk_rope_head_dim, base, true, &scaling)?, dims: c.qk_rope_head_dim },
        })
    }

    /// This rank's heads for tensor parallel over `group` (mlx-lm's `shard`): the query rows, whole
    /// output groups of `o_a_proj`, `o_b_proj` columns summed over the group, the heads' sinks;
    /// the window, compressor and indexer stay whole.
    pub(super) fn shard(&self, group: &Group) -> Result<Attention> {
        let n = group.size();
        let heads = crate::shard::check_divides("the attention heads", self.heads, n)?;
        let o_groups = crate::shard::check_divides("the output groups (o_groups)", self.o_groups, n)?;
        Ok(Attention {
            heads,
            o_groups,
            q_b_proj: self.q_b_proj.shard(ShardMode::AllToSharded, &[self.q_b_proj.out_dims()], group)?,
            o_a_proj: self.o_a_proj.shard_experts(group)?,
            o_b_proj: self.o_b_proj.shard(ShardMode::ShardedToAll, &[], group)?,
            sinks: crate::shard::block(&self.sinks, 0, group.rank(), n)?,
            group_ids: ops::arange(0.0, f64::from(o_groups), 1.0, Dtype::I32)?.expand_dims(&[0])?,
            ..self.clone()
        })
    }

    pub(super) fn arrays(&self) -> Vec<&Array> {
        let mut v = [&self.q_a_proj, &self.q_b_proj, &self.kv_proj, &self.o_b_proj].iter().flat_map(|l| l.arrays()).collect::<Vec<_>>();
        v.extend(self.q_a_norm.arrays());
        v.extend(self.kv_norm.arrays());
        v.extend(self.o_a_proj.arrays());
        v.push(&self.sinks);
        if let Some(c) = &self.compressor {
            v.extend(c.kv_proj.arrays());
            v.extend(c.gate_proj.iter().flat_map(|g| g.arrays()));
            v.extend(c.kv_norm.arrays());
        }
        if let Some(i) = &self.indexer {
            v.extend(i.q_b_proj.arrays());
            v.extend(i.weights_proj.arrays());
            if let Some((p, n)) = &i.k {
                v.extend(p.arrays());
                v.extend(n.arrays());
            }
        }
        v
    }

    /// x (B, L, hidden) at positions `start..`, `window_idx` (B, L, width) -> (B, L, hidden).
    pub(super) fn forward(&self, x: &Array, start: i32, window_idx: &Array, cache: &mut LayerCache, shared: &mut Shared) -> Result<Array> {
        let (b, l) = (x.dim(0), x.dim(1));
        let q_residual = self.q_a_norm.forward(&self.q_a_proj.forward(x)?)?;
        let q = self.q_b_proj.forward(&q_residual)?.reshape(&[b, l, self.heads, self.head_dim])?;
        let q = self.rope.apply(&q, start, 1.0, false)?;
        let kv = self.kv_norm.forward(&self.kv_proj.forward(x)?)?;
        let kv = fake_quant_fp8(&self.rope.apply(&kv, start, 1.0, false)?, 32)?;
        let mut kvs = vec![cache.update_window(&kv)?];
        let mut indices = vec![window_idx.clone()];
        if self.ratio != 0 {
            if self.compressor.is_some() {
                self.compress(x, start, cache, shared)?;
            }
            if let Some(ix) = &self.indexer {
                let (topk, candidates) = ix.forward(x, &q_residual, shared, &self.rope, start)?;
                shared.topk_idx = Some(topk);
                if ix.candidate_source {
                    shared.candidates = candidates;
                }
            }
            if let (Some(compressed), Some(topk)) = (&shared.compress_kv, &shared.topk_idx) {
                if topk.dim(-1) > 0 {
                    kvs.push(compressed.clone());
                    indices.push(topk.clone());
                }
            }
        }
        let out = sparse_attention(&q, &kvs, &indices, &self.sinks, (f64::from(self.head_dim).powf(-0.5)) as f32)?;
        let out = self.rope.apply(&out, start, 1.0, true)?;
        let out = self.o_a_proj.forward(&out.reshape(&[b * l, self.o_groups, 1, -1])?, &self.group_ids, false)?;
        self.o_b_proj.forward(&out.reshape(&[b, l, -1])?)
    }

    /// `_compress`: the new compressed KV and index keys into the cache, and shared.
    fn compress(&self, x: &Array, start: i32, cache: &mut LayerCache, shared: &mut Shared) -> Result<()> {
        let Some(comp) = &self.compressor else { return Ok(()) };
        let (latent, first) = comp.forward(x, start, cache)?;
        if let Some(latent) = latent {
            let scale = self.ratio as f32;
            let kv = fake_quant_fp4(&self.rope.apply(&latent, first, scale, false)?, 16, true)?;
            cache.compress_kv = Some(append(&cache.compress_kv, &kv)?);
            if let Some((proj, norm)) = self.indexer.as_ref().and_then(|i| i.k.as_ref()) {
                let k = norm.forward(&proj.forward(&latent)?)?;
                let k = fake_quant_fp4(&self.rope.apply(&k, first, scale, false)?, 32, false)?;
                cache.index_k = Some(append(&cache.index_k, &k)?);
            }
        }
        shared.compress_kv = cache.compress_kv.clone();
        if self.indexer.is_some() {
            shared.index_k = cache.index_k.clone();
        }
        Ok(())
    }
}
