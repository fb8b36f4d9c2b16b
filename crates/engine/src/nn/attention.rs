//! Multi-head attention with grouped-query heads, RoPE and a KV cache, as mlx-lm's Llama/Qwen
//! `Attention` modules compute it; optional q/k RMS norms (Qwen3's weighted ones, Llama 4's plain
//! ones before or after RoPE), projection biases (Qwen2), no RoPE at all (Llama 4's global layers)
//! and a per-position query scale (Ministral 3's llama-4 scaling, Llama 4's temperature tuning).
use super::{Linear, QuantConfig, RmsNorm, Rope};
use crate::cache::KvCache;
use crate::error::Result;
use crate::shard::ShardMode;
use checkpoint::Vb;
use mlx::fast::Mask;
use mlx::distributed::Group;
use mlx::Array;

/// The shape of one attention block, as read from a config.
#[derive(Clone, Debug)]
pub struct AttentionSpec {
    pub hidden: i32,
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    /// Bias on the q/k/v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// RMS norms over each head's queries and keys (eps), applied before RoPE.
    pub qk_norm_eps: Option<f64>,
}

/// The query/key/value projections: as stored, or fused into one matrix (see `set_fused_projections`).
#[derive(Clone)]
enum Qkv {
    Separate { q: Linear, k: Linear, v: Linear },
    Fused(Linear), // rows: queries, then keys, then values
}

#[derive(Clone)]
pub struct Attention {
    qkv: Qkv,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    scale: f32,
    /// `None`: a layer without positional embedding (Llama 4's global-attention layers).
    rope: Option<Rope>,
    /// `mx.fast.rms_norm(x, None, eps)` over each head's queries and keys.
    plain_qk_norm: Option<PlainQkNorm>,
}

/// An RMS norm without weight over each head's queries and keys, before RoPE (`llama4_text`) or
/// after it (`llama4`).
#[derive(Clone, Copy, Debug)]
pub struct PlainQkNorm {
    pub eps: f32,
    pub after_rope: bool,
}

impl Attention {
    pub fn load(vb: &Vb<'_>, spec: &AttentionSpec, rope: Rope, q: &QuantConfig) -> Result<Attention> {
        let (d, h, kvh, hd) = (spec.hidden, spec.n_heads, spec.n_kv_heads, spec.head_dim);
        let norm = |name: &str| spec.qk_norm_eps.map(|eps| RmsNorm::load(&vb.pp(name), hd, eps)).transpose();
        let q_proj = Linear::load(&vb.pp("q_proj"), d, h * hd, spec.qkv_bias, q)?;
        let k_proj = Linear::load(&vb.pp("k_proj"), d, kvh * hd, spec.qkv_bias, q)?;
        let v_proj = Linear::load(&vb.pp("v_proj"), d, kvh * hd, spec.qkv_bias, q)?;
        let fused = if super::fused_projections() { Linear::fuse(&[&q_proj, &k_proj, &v_proj])? } else { None };
        let qkv = match fused {
            Some(f) => Qkv::Fused(f),
            None => Qkv::Separate { q: q_proj, k: k_proj, v: v_proj },
        };
        Ok(Attention {
            qkv,
            o_proj: Linear::load(&vb.pp("o_proj"), h * hd, d, spec.o_bias, q)?,
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
            n_heads: h,
            n_kv_heads: kvh,
            head_dim: hd,
            // head_dim ** -0.5 in Python (a double), handed to MLX as a float.
            scale: (hd as f64).powf(-0.5) as f32,
            rope: Some(rope),
            plain_qk_norm: None,
        })
    }

    /// The same layer without RoPE.
    pub fn without_rope(self) -> Attention {
        Attention { rope: None, ..self }
    }

    /// The same layer with a weightless RMS norm over each head's queries and keys.
    pub fn with_plain_qk_norm(self, norm: PlainQkNorm) -> Attention {
        Attention { plain_qk_norm: Some(norm), ..self }
    }

    /// This rank's heads for tensor parallel over `group` (as mlx-lm's `shard`): q/k/v keep their
    /// heads' rows, o_proj the matching columns and sums over the group.
    pub fn shard(&self, group: &Group) -> Result<Attention> {
        let size = group.size();
        let (h, kvh, hd) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let n_heads = crate::shard::check_divides("the attention heads", h, size)?;
        let n_kv_heads = crate::shard::check_divides("the key/value heads", kvh, size)?;
        let qkv = match &self.qkv {
            Qkv::Separate { q, k, v } => Qkv::Separate {
                q: q.shard(ShardMode::AllToSharded, &[h * hd], group)?,
                k: k.shard(ShardMode::AllToSharded, &[kvh * hd], group)?,
                v: v.shard(ShardMode::AllToSharded, &[kvh * hd], group)?,
            },
            Qkv::Fused(f) => Qkv::Fused(f.shard(ShardMode::AllToSharded, &[h * hd, kvh * hd, kvh * hd], group)?),
        };
        Ok(Attention {
            qkv,
            o_proj: self.o_proj.shard(ShardMode::ShardedToAll, &[], group)?,
            n_heads,
            n_kv_heads,
            ..self.clone()
        })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let projections = match &self.qkv {
            Qkv::Separate { q, k, v } => vec![q, k, v, &self.o_proj],
            Qkv::Fused(f) => vec![f, &self.o_proj],
        };
        let norms = self.q_norm.iter().chain(self.k_norm.iter());
        projections.iter().flat_map(|p| p.arrays()).chain(norms.flat_map(|n| n.arrays())).collect()
    }

    /// (B, L, (heads + 2 kv_heads) * D) -> queries, keys, values, each (B, n, L, D).
    fn split_fused(&self, y: &Array, b: i32, l: i32) -> Result<(Array, Array, Array)> {
        let (h, kvh) = (self.n_heads, self.n_kv_heads);
        let norm = |t: Array, n: &Option<RmsNorm>| -> Result<Array> {
            match n {
                Some(nm) => nm.forward(&t),
                None => Ok(t),
            }
        };
        if l == 1 {
            // One position: (B, 1, n * D) is (B, n, 1, D) in memory; the splits are views.
            let y = y.reshape(&[b, h + 2 * kvh, 1, -1])?;
            let q = norm(y.slice_axis(1, 0, h)?, &self.q_norm)?;
            let k = norm(y.slice_axis(1, h, h + kvh)?, &self.k_norm)?;
            return Ok((q, k, y.slice_axis(1, h + kvh, h + 2 * kvh)?));
        }
        let y = y.reshape(&[b, l, h + 2 * kvh, -1])?; // (B, L, n, D)
        let q = norm(y.slice_axis(2, 0, h)?, &self.q_norm)?.transpose(&[0, 2, 1, 3])?;
        let k = norm(y.slice_axis(2, h, h + kvh)?, &self.k_norm)?.transpose(&[0, 2, 1, 3])?;
        let v = y.slice_axis(2, h + kvh, h + 2 * kvh)?.transpose(&[0, 2, 1, 3])?;
        Ok((q, k, v))
    }

    /// The fused projection's output y (B, L, (heads + 2 kv_heads) * D) -> queries and keys after
    /// RoPE and values, each (B, n, L, D), for layers without q/k norms: the query and key heads
    /// lie side by side in y, so one RoPE call turns both (RoPE is the same function of each
    /// head's own values and position, so the result is the two calls' to the bit), one kernel a
    /// layer less than rotating them apart.
    fn fused_roped(&self, y: &Array, rope: &Rope, cache: &dyn KvCache, b: i32, l: i32) -> Result<(Array, Array, Array)> {
        let (h, kvh) = (self.n_heads, self.n_kv_heads);
        let y = if l == 1 {
            y.reshape(&[b, h + 2 * kvh, 1, -1])? // (B, 1, n * D) is (B, n, 1, D) in memory
        } else {
            y.reshape(&[b, l, h + 2 * kvh, -1])?.transpose(&[0, 2, 1, 3])? // (B, n, L, D)
        };
        let qk = rope.forward_cached(&y.slice_axis(1, 0, h + kvh)?, cache)?; // (B, heads + kv_heads, L, D)
        Ok((qk.slice_axis(1, 0, h)?, qk.slice_axis(1, h, h + kvh)?, y.slice_axis(1, h + kvh, h + 2 * kvh)?))
    }

    /// x (B, L, hidden) -> (B, L, hidden)
    pub fn forward(&self, x: &Array, mask: Mask<'_>, cache: &mut dyn KvCache) -> Result<Array> {
        self.forward_scaled(x, mask, cache, None)
    }

    /// As [`Attention::forward`], with the queries multiplied by `q_scale` ((L, 1) or (B, 1, L, 1))
    /// after RoPE and the q/k norms, and cast back to their dtype (`(queries * s).astype(...)`).
    pub fn forward_scaled(&self, x: &Array, mask: Mask<'_>, cache: &mut dyn KvCache, q_scale: Option<&Array>) -> Result<Array> {
        let (b, l) = (x.dim(0), x.dim(1));
        let heads = |t: Array, n: i32, norm: &Option<RmsNorm>| -> Result<Array> {
            // (B, L, n * head_dim) -> (B, n, L, head_dim). With one position (decode) the transpose
            // moves nothing, so a single reshape gives the same array with one graph node less.
            match norm {
                None if l == 1 => Ok(t.reshape(&[b, n, 1, -1])?),
                _ => {
                    let t = t.reshape(&[b, l, n, -1])?; // (B, L, n, head_dim)
                    let t = match norm {
                        Some(nm) => nm.forward(&t)?,
                        None => t,
                    };
                    Ok(t.transpose(&[0, 2, 1, 3])?)
                }
            }
        };
        let plain = |t: Array, after: bool| -> Result<Array> {
            match self.plain_qk_norm {
                Some(n) if n.after_rope == after => Ok(mlx::fast::rms_norm(&t, None, n.eps)?),
                _ => Ok(t),
            }
        };
        let (queries, keys, values) = match (&self.qkv, &self.rope) {
            (Qkv::Fused(f), Some(rope)) if self.q_norm.is_none() && self.k_norm.is_none() && self.plain_qk_norm.is_none() => {
                self.fused_roped(&f.forward(x)?, rope, cache, b, l)?
            }
            (qkv, rope) => {
                let (queries, keys, values) = match qkv {
                    Qkv::Separate { q, k, v } => (
                        heads(q.forward(x)?, self.n_heads, &self.q_norm)?,
                        heads(k.forward(x)?, self.n_kv_heads, &self.k_norm)?,
                        heads(v.forward(x)?, self.n_kv_heads, &None)?,
                    ),
                    Qkv::Fused(f) => self.split_fused(&f.forward(x)?, b, l)?,
                };
                let (queries, keys) = (plain(queries, false)?, plain(keys, false)?);
                match rope {
                    Some(rope) => (rope.forward_cached(&queries, cache)?, rope.forward_cached(&keys, cache)?, values),
                    None => (queries, keys, values),
                }
            }
        };
        let (queries, keys) = (plain(queries, true)?, plain(keys, true)?);
        let queries = match q_scale {
            Some(s) => queries.mul(s)?.astype(queries.dtype())?,
            None => queries,
        };
        let out = match cache.quantization() {
            // mlx-lm's quantized_scaled_dot_product_attention over a QuantizedKVCache.
            Some(spec) => {
                let (keys, values) = cache.update_and_fetch_quantized(&keys, &values)?;
                crate::cache::quantized_sdpa(&queries, &keys, &values, self.scale, mask, spec)?
            }
            None => {
                let (keys, values) = cache.update_and_fetch(&keys, &values)?; // (B, kv_heads, S, head_dim)
                crate::nn::sdpa::sdpa(&queries, &keys, &values, self.scale, mask)? // (B, heads, L, head_dim)
            }
        };
        let out = if l == 1 {
            out.reshape(&[b, 1, -1])? // (B, heads, 1, D) is already (B, 1, heads * D) in memory
        } else {
            out.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?
        };
        self.o_proj.forward(&out)
    }
}
