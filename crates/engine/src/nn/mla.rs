//! Multi-head latent attention pieces that DeepSeek V2 and V3 share (mlx-lm's deepseek_v2.py and
//! deepseek_v3.py attention, `mla.py`'s `MultiLinear`): the query path (direct or low-rank), the
//! compressed key/value projection with its decoupled RoPE key, the output projection and the scale.
use super::quant::{QuantConfig, Quantized};
use super::{Linear, RmsNorm, RopeScaling};
use crate::error::Result;
use crate::shard::ShardMode;
use checkpoint::Vb;
use mlx::distributed::Group;
use mlx::Array;

/// The attention shape, as DeepSeek configs give it.
#[derive(Clone, Debug)]
pub struct MlaSpec {
    pub hidden: i32,
    pub n_heads: i32,
    pub q_lora_rank: Option<i32>,
    pub kv_lora_rank: i32,
    pub qk_nope_head_dim: i32,
    pub qk_rope_head_dim: i32,
    pub v_head_dim: i32,
    pub attention_bias: bool,
}

impl MlaSpec {
    pub fn q_head_dim(&self) -> i32 {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// `q_head_dim ** -0.5`, times `mscale_all_dim`'s YaRN factor squared when the rope is scaled
    /// (factor > 1), in double precision as Python computes it.
    pub fn scale(&self, rope_scaling: Option<&RopeScaling>) -> f64 {
        let scale = f64::from(self.q_head_dim()).powf(-0.5);
        match rope_scaling.map(|s| (s.mscale_all_dim.unwrap_or(0.0), s.factor.unwrap_or(1.0))) {
            Some((m, factor)) if m != 0.0 && factor > 1.0 => {
                let s = 0.1 * m * factor.ln() + 1.0;
                scale * s * s
            }
            _ => scale,
        }
    }
}

#[derive(Clone)]
enum QProj {
    Direct(Linear),
    LowRank { a: Linear, norm: RmsNorm, b: Linear },
}

/// The projections around the attention kernel, loaded from `...self_attn`.
#[derive(Clone)]
pub struct MlaProjections {
    q: QProj,
    kv_a_proj_with_mqa: Linear,
    kv_a_layernorm: RmsNorm,
    pub o_proj: Linear,
    spec: MlaSpec,
}

/// What the projections give for x (B, L, hidden), before RoPE.
pub struct MlaInputs {
    pub q_nope: Array,    // (B, heads, L, qk_nope_head_dim)
    pub q_pe: Array,      // (B, heads, L, qk_rope_head_dim)
    pub kv_latent: Array, // (B, L, kv_lora_rank), after kv_a_layernorm
    pub k_pe: Array,      // (B, 1, L, qk_rope_head_dim)
    /// The low-rank query path's normed `q_a_proj` output (B, L, q_lora_rank); `None` when direct.
    pub q_residual: Option<Array>,
}

impl MlaProjections {
    pub fn load(vb: &Vb<'_>, spec: &MlaSpec, q: &QuantConfig) -> Result<MlaProjections> {
        let (d, h, bias) = (spec.hidden, spec.n_heads, spec.attention_bias);
        let q_out = h * spec.q_head_dim();
        let q_proj = match spec.q_lora_rank {
            None => QProj::Direct(Linear::load(&vb.pp("q_proj"), d, q_out, false, q)?),
            Some(r) => QProj::LowRank {
                a: Linear::load(&vb.pp("q_a_proj"), d, r, bias, q)?,
                norm: RmsNorm::load(&vb.pp("q_a_layernorm"), r, 1e-6)?,
                b: Linear::load(&vb.pp("q_b_proj"), r, q_out, false, q)?,
            },
        };
        let (r, rope) = (spec.kv_lora_rank, spec.qk_rope_head_dim);
        Ok(MlaProjections {
            q: q_proj,
            kv_a_proj_with_mqa: Linear::load(&vb.pp("kv_a_proj_with_mqa"), d, r + rope, bias, q)?,
            kv_a_layernorm: RmsNorm::load(&vb.pp("kv_a_layernorm"), r, 1e-6)?,
            o_proj: Linear::load(&vb.pp("o_proj"), h * spec.v_head_dim, d, bias, q)?,
            spec: spec.clone(),
        })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut v = match &self.q {
            QProj::Direct(p) => p.arrays(),
            QProj::LowRank { a, norm, b } => [a.arrays(), norm.arrays(), b.arrays()].concat(),
        };
        v.extend(self.kv_a_proj_with_mqa.arrays());
        v.extend(self.kv_a_layernorm.arrays());
        v.extend(self.o_proj.arrays());
        v
    }

    /// This rank's heads for tensor parallel over `group` (mlx-lm's deepseek `shard`): the query
    /// projection (`q_proj`, or `q_b_proj` after the shared low-rank part) keeps its heads' rows,
    /// `o_proj` the matching columns summed over the group; the compressed key/value path, shared
    /// by all heads, stays whole.
    pub fn shard(&self, group: &Group) -> Result<MlaProjections> {
        let heads = crate::shard::check_divides("the attention heads", self.spec.n_heads, group.size())?;
        let q = match &self.q {
            QProj::Direct(p) => QProj::Direct(p.shard(ShardMode::AllToSharded, &[p.out_dims()], group)?),
            QProj::LowRank { a, norm, b } => {
                QProj::LowRank { a: a.clone(), norm: norm.clone(), b: b.shard(ShardMode::AllToSharded, &[b.out_dims()], group)? }
            }
        };
        Ok(MlaProjections {
            q,
            o_proj: self.o_proj.shard(ShardMode::ShardedToAll, &[], group)?,
            spec: MlaSpec { n_heads: heads, ..self.spec.clone() },
            ..self.clone()
        })
    }

    pub fn spec(&self) -> &MlaSpec {
        &self.spec
    }

    pub fn project(&self, x: &Array) -> Result<MlaInputs> {
        let s = &self.spec;
        let (b, l) = (x.dim(0), x.dim(1));
        let (q, q_residual) = match &self.q {
            QProj::Direct(p) => (p.forward(x)?, None),
            QProj::LowRank { a, norm, b } => {
                let qr = norm.forward(&a.forward(x)?)?;
                (b.forward(&qr)?, Some(qr))
            }
        };
        let q = q.reshape(&[b, l, s.n_heads, s.q_head_dim()])?.transpose(&[0, 2, 1, 3])?;
        let (nope, r) = (s.qk_nope_head_dim, s.kv_lora_rank);
        let compressed = self.kv_a_proj_with_mqa.forward(x)?;
        let k_pe = compressed.slice_axis(-1, r, i32::MAX)?;
        Ok(MlaInputs {
            q_nope: q.slice_axis(-1, 0, nope)?,
            q_pe: q.slice_axis(-1, nope, i32::MAX)?,
            kv_latent: self.kv_a_layernorm.forward(&compressed.slice_axis(-1, 0, r)?)?,
            k_pe: k_pe.reshape(&[b, l, 1, s.qk_rope_head_dim])?.transpose(&[0, 2, 1, 3])?,
            q_residual,
        })
    }
}

#[derive(Clone)]
enum MultiKind {
    Float(Array), // (heads, out, in)
    Quant(Quantized),
}

/// `MultiLinear` / `QuantizedMultiLinear`: one (out, in) matrix per head.
#[derive(Clone)]
pub struct MultiLinear(MultiKind);

impl MultiLinear {
    pub fn load(vb: &Vb<'_>, in_dims: i32, out_dims: i32, heads: i32, q: &QuantConfig) -> Result<MultiLinear> {
        Ok(MultiLinear(match q.layer(vb, in_dims)? {
            Some(spec) => MultiKind::Quant(Quantized::load_stacked(vb, &[heads], out_dims, in_dims, spec)?),
            None => MultiKind::Float(vb.get("weight", &[heads, out_dims, in_dims])?),
        }))
    }

    pub fn arrays(&self) -> Vec<&Array> {
        match &self.0 {
            MultiKind::Float(w) => vec![w],
            MultiKind::Quant(q) => q.arrays(),
        }
    }

    /// This rank's block of the heads (axis 0) for tensor parallel over `group`.
    pub fn shard_heads(&self, group: &Group) -> Result<MultiLinear> {
        let part = |a: &Array| crate::shard::block(a, 0, group.rank(), group.size());
        Ok(MultiLinear(match &self.0 {
            MultiKind::Float(w) => MultiKind::Float(part(w)?),
            MultiKind::Quant(q) => MultiKind::Quant(q.map(part)?),
        }))
    }

    /// `x @ W.swapaxes(-1, -2)` (transpose) or `x @ W`, per head.
    pub fn forward(&self, x: &Array, transpose: bool) -> Result<Array> {
        Ok(match (&self.0, transpose) {
            (MultiKind::Float(w), true) => x.matmul(&w.swapaxes(-1, -2)?)?,
            (MultiKind::Float(w), false) => x.matmul(w)?,
            (MultiKind::Quant(q), t) => q.matmul(x, t)?,
        })
    }
}
