//! qwen3_next's full-attention layers (`Qwen3NextAttention`, also qwen3_5's): queries and an output
//! gate from one `q_proj`, q/k RMS norms, partial RoPE, attention over the layer's KV cache
//! (quantized or not), then `o_proj(out * sigmoid(gate))`; tensor parallel as qwen3_5.py's `shard`.
use super::HybridSpec;
use crate::cache::{CacheMask, KvCache};
use crate::error::Result;
use crate::nn::{Linear, QuantConfig, RmsNorm, Rope};
use crate::shard::{self, ShardMode};
use checkpoint::Vb;
use mlx::distributed::Group;
use mlx::Array;

/// `Qwen3NextAttention`: full attention with an output gate.
#[derive(Clone)]
pub(crate) struct GatedAttention {
    q_proj: Linear, // (2 heads head_dim, hidden): per head [queries | gate]
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    scale: f32,
    rope: Rope,
}

impl GatedAttention {
    pub(super) fn load(vb: &Vb<'_>, s: &HybridSpec, q: &QuantConfig) -> Result<GatedAttention> {
        let (d, h, kvh, hd, bias) = (s.hidden, s.heads, s.kv_heads, s.head_dim, s.attention_bias);
        Ok(GatedAttention {
            q_proj: Linear::load(&vb.pp("q_proj"), d, 2 * h * hd, bias, q)?,
            k_proj: Linear::load(&vb.pp("k_proj"), d, kvh * hd, bias, q)?,
            v_proj: Linear::load(&vb.pp("v_proj"), d, kvh * hd, bias, q)?,
            o_proj: Linear::load(&vb.pp("o_proj"), h * hd, d, bias, q)?,
            q_norm: RmsNorm::load(&vb.pp("q_norm"), hd, s.rms_norm_eps)?,
            k_norm: RmsNorm::load(&vb.pp("k_norm"), hd, s.rms_norm_eps)?,
            heads: h,
            kv_heads: kvh,
            head_dim: hd,
            scale: f64::from(hd).powf(-0.5) as f32,
            rope: s.rope.clone(),
        })
    }

    /// This rank's heads for tensor parallel over `group`, as qwen3_5.py's `shard`: q_proj's rows
    /// (each head's queries and gate), k/v_proj's (each key/value head first repeated until there
    /// is one per rank, where there are fewer than ranks), o_proj's columns summed over the group.
    pub(super) fn shard(&self, group: &Group) -> Result<GatedAttention> {
        let size = group.size();
        let (h, kvh, hd) = (self.heads, self.kv_heads, self.head_dim);
        let heads = shard::check_divides("the attention heads", h, size)?;
        // repeat_kv_layer_inplace: more ranks than key/value heads -> each repeated size / kvh times.
        let (k_proj, v_proj, kv_rows) = if size > kvh {
            let times = shard::check_divides("the ranks per key/value head", size, kvh)?;
            (self.k_proj.repeat_heads(kvh, times)?, self.v_proj.repeat_heads(kvh, times)?, size * hd)
        } else {
            (self.k_proj.clone(), self.v_proj.clone(), kvh * hd)
        };
        let kv_heads = shard::check_divides("the key/value heads", kv_rows / hd, size)?;
        let split = |l: &Linear, rows: i32| l.shard(ShardMode::AllToSharded, &[rows], group);
        Ok(GatedAttention {
            q_proj: split(&self.q_proj, 2 * h * hd)?,
            k_proj: split(&k_proj, kv_rows)?,
            v_proj: split(&v_proj, kv_rows)?,
            o_proj: self.o_proj.shard(ShardMode::ShardedToAll, &[], group)?,
            heads,
            kv_heads,
            ..self.clone()
        })
    }

    pub(super) fn arrays(&self) -> Vec<&Array> {
        let mut v = [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj].iter().flat_map(|l| l.arrays()).collect::<Vec<_>>();
        v.extend(self.q_norm.arrays());
        v.extend(self.k_norm.arrays());
        v
    }

    /// x (B, L, hidden) -> (B, L, hidden)
    pub(super) fn forward(&self, x: &Array, mask: &CacheMask, cache: &mut dyn KvCache) -> Result<Array> {
        let (b, l, hd) = (x.dim(0), x.dim(1), self.head_dim);
        let qg = self.q_proj.forward(x)?.reshape(&[b, l, self.heads, -1])?; // (B, L, heads, 2 head_dim)
        let gate = qg.slice_axis(-1, hd, 2 * hd)?.reshape(&[b, l, -1])?; // (B, L, heads head_dim)
        let queries = self.q_norm.forward(&qg.slice_axis(-1, 0, hd)?)?.transpose(&[0, 2, 1, 3])?;
        let keys = self.k_proj.forward(x)?.reshape(&[b, l, self.kv_heads, -1])?;
        let keys = self.k_norm.forward(&keys)?.transpose(&[0, 2, 1, 3])?; // (B, kv_heads, L, head_dim)
        let values = self.v_proj.forward(x)?.reshape(&[b, l, self.kv_heads, -1])?.transpose(&[0, 2, 1, 3])?;
        let queries = self.rope.forward_cached(&queries, cache)?;
        let keys = self.rope.forward_cached(&keys, cache)?;
        let out = match cache.quantization() {
            Some(spec) => {
                let (k, v) = cache.update_and_fetch_quantized(&keys, &values)?;
                crate::cache::quantized_sdpa(&queries, &k, &v, self.scale, mask.as_mask(), spec)?
            }
            None => {
                let (k, v) = cache.update_and_fetch(&keys, &values)?;
                crate::nn::sdpa::sdpa(&queries, &k, &v, self.scale, mask.as_mask())?
            }
        }; // (B, heads, L, head_dim)
        let out = out.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        self.o_proj.forward(&out.mul(&gate.sigmoid()?)?)
    }
}
