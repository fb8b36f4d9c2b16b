//! `deepseek_v32` (DeepSeek-V3.2) as mlx-lm's `models/deepseek_v32.py`: DeepSeek-V3's absorbed
//! multi-head latent attention and experts, with DeepSeek Sparse Attention in front: a lightning
//! indexer scores every cached key per query (ReLU'd multi-head dot products, weighted per head)
//! and the attention sees only the `index_topk` best ones once more keys than that are cached.
//! Each layer's cache is a [`ListCache`] (mlx-lm's `CacheList(KVCache(), KVCache())`): the
//! latent cache, and the indexer's keys (its values kept as zeros, as mlx-lm's).
use super::deepseek_v2::{mla_spec, parse, Config as V2Config};
use super::deepseek_v3::{self as v3, LatentAttention};
use super::stack::Part;
use super::Model;
use crate::cache::{GrowingCache, KvCache, ListCache};
use crate::error::{EngineError, Result};
use crate::nn::moe::stack_experts;
use crate::nn::{Linear, QuantConfig, Rope};
use checkpoint::{Vb, Weights};
use mlx::distributed::Group;
use mlx::{fast, ops, Array, Dtype};
use serde::Deserialize;

/// The indexer's fields of deepseek_v32.py's `ModelArgs` (the rest read as deepseek_v3's).
#[derive(Debug, Deserialize)]
struct IndexerConfig {
    index_head_dim: i32,
    index_n_heads: i32,
    index_topk: i32,
    indexer_rope_interleave: bool,
}

fn defaults() -> serde_json::Value {
    let mut d = v3::v3_defaults();
    let extra = serde_json::json!({
        "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048, "indexer_rope_interleave": false,
    });
    if let (Some(d), Some(extra)) = (d.as_object_mut(), extra.as_object()) {
        d.extend(extra.clone());
    }
    d
}

/// The lightning indexer, loaded from `self_attn.indexer`.
#[derive(Clone)]
struct Indexer {
    wq_b: Linear,         // q_lora_rank -> heads * head_dim
    wk: Linear,           // hidden -> head_dim
    k_norm: [Array; 2],   // nn.LayerNorm(head_dim): weight, bias (head_dim,)
    weights_proj: Linear, // hidden -> heads
    heads: i32,
    head_dim: i32,
    topk: i32,
    rope: Rope,
}

impl Indexer {
    fn load(vb: &Vb<'_>, c: &V2Config, ic: &IndexerConfig, q_lora_rank: i32, q: &QuantConfig) -> Result<Indexer> {
        let (d, h, hd) = (c.hidden_size, ic.index_n_heads, ic.index_head_dim);
        let n = vb.pp("k_norm");
        Ok(Indexer {
            wq_b: Linear::load(&vb.pp("wq_b"), q_lora_rank, h * hd, false, q)?,
            wk: Linear::load(&vb.pp("wk"), d, hd, false, q)?,
            k_norm: [n.get("weight", &[hd])?, n.get("bias", &[hd])?],
            weights_proj: Linear::load(&vb.pp("weights_proj"), d, h, false, q)?,
            heads: h,
            head_dim: hd,
            topk: ic.index_topk,
            // initialize_rope(qk_rope_head_dim, rope_theta, indexer_rope_interleave, rope_scaling)
            rope: Rope::new(c.qk_rope_head_dim, c.rope_theta, ic.indexer_rope_interleave, c.rope_scaling.as_ref())?,
        })
    }

    fn arrays(&self) -> Vec<&Array> {
        let mut v = self.wq_b.arrays();
        v.extend(self.wk.arrays());
        v.extend(&self.k_norm);
        v.extend(self.weights_proj.arrays());
        v
    }

    /// x (B, L, hidden), `qr` (B, L, q_lora_rank): the indices (B, 1, L, topk) of the cached keys
    /// each query keeps, after adding this step's keys to `cache`; `None` while no more than
    /// `topk` keys are cached (all are kept).
    fn forward(&self, x: &Array, qr: &Array, mask: Option<&Array>, cache: &mut dyn KvCache) -> Result<Option<Array>> {
        let (b, s) = (x.dim(0), x.dim(1));
        let q = self.wq_b.forward(qr)?.reshape(&[b, s, self.heads, self.head_dim])?.swapaxes(1, 2)?; // (B, H, L, D)
        let k = self.wk.forward(x)?;
        let k = fast::layer_norm(&k, Some(&self.k_norm[0]), Some(&self.k_norm[1]), 1e-5)?.reshape(&[b, 1, s, self.head_dim])?;
        let q = self.rope.forward_cached(&q, cache)?;
        let k = self.rope.forward_cached(&k, cache)?;
        // update_and_fetch(k, k), then the values replaced by zeros.
        let (k, _) = cache.update_and_fetch(&k, &ops::zeros(&k.shape(), k.dtype())?)?; // (B, 1, S, D)
        let n_keys = k.dim(2);
        if n_keys <= self.topk {
            return Ok(None);
        }
        let scores = q.matmul(&k.swapaxes(-1, -2)?)?.maximum_scalar(0.0)?; // (B, H, L, S)
        let w = f64::from(self.heads).powf(-0.5) * f64::from(self.head_dim).powf(-0.5);
        let weights = self.weights_proj.forward(x)?.mul_scalar(w)?.swapaxes(-1, -2)?.expand_dims(&[-1])?; // (B, H, L, 1)
        let scores = scores.mul(&weights)?;
        let scores = if s > 1 {
            // Python's sum() over the heads one by one, from 0.
            let mut acc = scores.slice_axis(1, 0, 1)?.add_scalar(0.0)?;
            for h in 1..self.heads {
                acc = acc.add(&scores.slice_axis(1, h, h + 1)?)?;
            }
            acc
        } else {
            scores.sum(&[1], true)?
        }; // (B, 1, L, S)
        let scores = match mask {
            Some(m) => ops::where_(m, &scores, &Array::scalar(f64::NEG_INFINITY, scores.dtype())?)?,
            None => scores,
        };
        Ok(Some(scores.argpartition(n_keys - self.topk, -1)?.slice_axis(-1, n_keys - self.topk, n_keys)?))
    }
}

#[derive(Clone)]
struct Attention {
    mla: v3::Attention,
    indexer: Indexer,
}

impl Part for Attention {
    fn arrays(&self) -> Vec<&Array> {
        let mut v = self.mla.arrays();
        v.extend(self.indexer.arrays());
        v
    }

    /// mlx-lm's `shard`: the latent attention's heads; the indexer stays whole on every rank.
    fn shard(&self, group: &Group) -> Result<Attention> {
        Ok(Attention { mla: Part::shard(&self.mla, group)?, indexer: self.indexer.clone() })
    }
}

impl LatentAttention for Attention {
    fn forward(&self, x: &Array, mask: Option<&Array>, cache: &mut dyn KvCache) -> Result<Array> {
        let l = x.dim(1);
        let [kv, index] = cache.parts_mut().ok_or_else(not_its_cache)? else { return Err(not_its_cache()) };
        let (p, kv_latent, k_pe) = self.mla.project_and_cache(x, kv.as_mut())?;
        let qr = p.q_residual.as_ref().ok_or_else(|| EngineError::Config("deepseek_v32 needs q_lora_rank".into()))?;
        match self.indexer.forward(x, qr, mask, index.as_mut())? {
            None => self.mla.attend(&p.q_nope, &p.q_pe, &kv_latent, &k_pe, mask),
            Some(topk) if l == 1 => {
                // Decode: gather the chosen latents and RoPE keys.
                let idx = topk.squeeze(&[2])?.expand_dims(&[-1])?; // (B, 1, topk, 1)
                let kv_latent = kv_latent.take_along_axis(&idx, 2)?; // (B, 1, topk, kv_lora_rank)
                let k_pe = k_pe.take_along_axis(&idx, 2)?; // (B, 1, topk, rope)
                let mask = mask.map(|m| m.take_along_axis(&topk, -1)).transpose()?;
                self.mla.attend(&p.q_nope, &p.q_pe, &kv_latent, &k_pe, mask.as_ref())
            }
            Some(topk) => {
                // Prefill: the chosen keys as a boolean mask (B, 1, L, S), and-ed with the causal one.
                let (mut shape, s) = (topk.shape(), kv_latent.dim(2));
                *shape.last_mut().expect("4-D indices") = s;
                let sparse = ops::zeros(&shape, Dtype::Bool)?.put_along_axis(&topk, &Array::scalar(1.0, Dtype::Bool)?, -1)?;
                let sparse = match mask {
                    Some(m) => sparse.logical_and(m)?,
                    None => sparse,
                };
                self.mla.attend(&p.q_nope, &p.q_pe, &kv_latent, &k_pe, Some(&sparse))
            }
        }
    }

    /// `CacheList(KVCache(), KVCache())`.
    fn own_cache() -> Option<Box<dyn KvCache>> {
        let parts: Vec<Box<dyn KvCache>> = vec![Box::new(GrowingCache::new()), Box::new(GrowingCache::new())];
        ListCache::new(parts).ok().map(|c| Box::new(c) as Box<dyn KvCache>)
    }
}

fn not_its_cache() -> EngineError {
    EngineError::Invalid("deepseek_v32 attention needs its own cache list (latent KV cache + indexer keys)".into())
}

/// mlx-lm's `sanitize` (also `mlx-gen convert`'s): the multi-token-prediction layers (index >=
/// num_hidden_layers) dropped, FP8 weights with 128x128 `weight_scale_inv` blocks dequantized to
/// bfloat16, experts stacked, `kv_b_proj` split into `embed_q` / `unembed_out`.
pub fn sanitize(config: &serde_json::Value, weights: &mut Weights) -> Result<()> {
    let (c, _) = v3::parse_v3(config, defaults())?;
    let n = i64::from(c.num_hidden_layers);
    weights.drop_where(|k| {
        let parts: Vec<&str> = k.split('.').collect();
        parts.len() >= 3 && parts[1] == "layers" && parts[2].parse::<i64>().is_ok_and(|i| i >= n)
    });
    super::hf_quant::dequantize_fp8(weights)?;
    let spec = mla_spec(&c);
    for i in 0..c.num_hidden_layers {
        stack_experts(weights, &format!("model.layers.{i}.mlp"), c.n_routed_experts.unwrap_or(0))?;
        v3::split_kv_b(weights, &format!("model.layers.{i}.self_attn"), &spec)?;
    }
    Ok(())
}

pub fn load(config: &serde_json::Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    let (c, r) = v3::parse_v3(config, defaults())?;
    let ic: IndexerConfig = parse(config, defaults())?;
    let q_lora = c.q_lora_rank.ok_or_else(|| EngineError::Config("deepseek_v32 needs q_lora_rank (its indexer reads the query's low-rank part)".into()))?;
    if ic.index_topk <= 0 || ic.index_n_heads <= 0 || ic.index_head_dim < c.qk_rope_head_dim {
        return Err(EngineError::Config(format!(
            "index_topk {}, index_n_heads {} and index_head_dim {} (>= qk_rope_head_dim {}) must be positive",
            ic.index_topk, ic.index_n_heads, ic.index_head_dim, c.qk_rope_head_dim
        )));
    }
    sanitize(config, weights)?;
    let spec = mla_spec(&c);
    v3::load_as(&c, &r, weights, q, |a, rope, scale| {
        Ok(Attention { mla: v3::Attention::load(a, &c, &spec, rope, scale, q)?, indexer: Indexer::load(&a.pp("indexer"), &c, &ic, q_lora, q)? })
    })
}
