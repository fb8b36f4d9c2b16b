//! Gated DeltaNet linear attention, as mlx-lm's `Qwen3NextGatedDeltaNet` (qwen3_next.py, fused
//! `in_proj_qkvz` / `in_proj_ba` projections) and `GatedDeltaNet` (qwen3_5.py, separate
//! `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`) compute it: a short causal depthwise
//! convolution over q/k/v, L2-normalised q/k, the gated delta rule recurrence of gated_delta.py
//! (its ops path, one compiled step per position, on the CPU; on a GPU one kernel for the whole
//! prompt, as mlx-lm runs on Metal), and the gated RMS norm. Its state lives in an [`ArraysCache`]: [0] the convolution's last K-1 inputs,
//! [1] the recurrent matrix (B, Hv, Dv, Dk) in float32. Tensor parallel splits it by head
//! ([`GatedDeltaNet::shard`]).
use super::{Linear, QuantConfig};
use crate::cache::ArraysCache;
use crate::error::{EngineError, Result};
use crate::shard::{self, ShardMode};
use checkpoint::Vb;
use mlx::distributed::Group;
use mlx::{fast, ops, Array, Dtype};

/// The sizes of one DeltaNet layer (the `linear_*` fields of config.json).
#[derive(Clone, Copy, Debug)]
pub struct DeltaNetSpec {
    pub hidden: i32,
    pub num_v_heads: i32,
    pub num_k_heads: i32,
    pub head_k_dim: i32,
    pub head_v_dim: i32,
    pub conv_kernel: i32,
    pub eps: f64,
}

impl DeltaNetSpec {
    fn key_dim(&self) -> i32 {
        self.head_k_dim * self.num_k_heads
    }

    fn value_dim(&self) -> i32 {
        self.head_v_dim * self.num_v_heads
    }

    fn conv_dim(&self) -> i32 {
        2 * self.key_dim() + self.value_dim()
    }
}

/// How the checkpoint stores the input projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeltaNetLayout {
    /// qwen3_next: `in_proj_qkvz` and `in_proj_ba`, interleaved per key head.
    Fused,
    /// qwen3_5: `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Separate,
}

#[derive(Clone)]
enum InProj {
    Fused { qkvz: Linear, ba: Linear },
    Separate { qkv: Linear, z: Linear, b: Linear, a: Linear },
}

#[derive(Clone)]
pub struct GatedDeltaNet {
    spec: DeltaNetSpec,
    proj: InProj,
    conv1d: Array,  // (conv_dim, K, 1): depthwise, no bias
    dt_bias: Array, // (Hv,)
    a_log: Array,   // (Hv,)
    norm: Array,    // (head_v_dim,): the gated RMS norm's weight
    out_proj: Linear,
}

impl GatedDeltaNet {
    pub fn load(vb: &Vb<'_>, spec: DeltaNetSpec, layout: DeltaNetLayout, q: &QuantConfig) -> Result<GatedDeltaNet> {
        let s = spec;
        if s.num_k_heads <= 0 || s.num_v_heads % s.num_k_heads != 0 || s.conv_kernel < 1 {
            return Err(EngineError::Config(format!(
                "num_v_heads ({}) must be divisible by num_k_heads ({}), and the convolution kernel ({}) positive",
                s.num_v_heads, s.num_k_heads, s.conv_kernel
            )));
        }
        let (d, kd, vd, nv) = (s.hidden, s.key_dim(), s.value_dim(), s.num_v_heads);
        let proj = match layout {
            DeltaNetLayout::Fused => InProj::Fused {
                qkvz: Linear::load(&vb.pp("in_proj_qkvz"), d, 2 * kd + 2 * vd, false, q)?,
                ba: Linear::load(&vb.pp("in_proj_ba"), d, 2 * nv, false, q)?,
            },
            DeltaNetLayout::Separate => InProj::Separate {
                qkv: Linear::load(&vb.pp("in_proj_qkv"), d, 2 * kd + vd, false, q)?,
                z: Linear::load(&vb.pp("in_proj_z"), d, vd, false, q)?,
                b: Linear::load(&vb.pp("in_proj_b"), d, nv, false, q)?,
                a: Linear::load(&vb.pp("in_proj_a"), d, nv, false, q)?,
            },
        };
        Ok(GatedDeltaNet {
            spec,
            proj,
            conv1d: vb.get("conv1d.weight", &[s.conv_dim(), s.conv_kernel, 1])?,
            dt_bias: vb.get("dt_bias", &[nv])?,
            a_log: vb.get("A_log", &[nv])?,
            norm: vb.get("norm.weight", &[s.head_v_dim])?,
            out_proj: Linear::load(&vb.pp("out_proj"), vd, d, false, q)?,
        })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut v = match &self.proj {
            InProj::Fused { qkvz, ba } => [qkvz.arrays(), ba.arrays()].concat(),
            InProj::Separate { qkv, z, b, a } => [qkv.arrays(), z.arrays(), b.arrays(), a.arrays()].concat(),
        };
        v.extend([&self.conv1d, &self.dt_bias, &self.a_log, &self.norm]);
        v.extend(self.out_proj.arrays());
        v
    }

    /// This rank's key and value heads for tensor parallel over `group`, as qwen3_5.py's `shard`:
    /// the convolution's and `in_proj_qkv`'s q, k and v channels each split (its segments
    /// `[key_dim, 2 key_dim]`), `in_proj_z` / `in_proj_b` / `in_proj_a`, `dt_bias` and `A_log` by
    /// value head, `out_proj`'s inputs split and its output summed over the group (mlx-lm's
    /// `all_sum` after `out_proj`); the gated norm (per value head) stays whole. mlx-lm has no
    /// `shard` for the fused layout (qwen3_next.py).
    pub fn shard(&self, group: &Group) -> Result<GatedDeltaNet> {
        let InProj::Separate { qkv, z, b, a } = &self.proj else {
            return Err(EngineError::Config("tensor parallel over qwen3_next's fused DeltaNet projections is not supported (mlx-lm has no shard for them either)".into()));
        };
        let (rank, size) = shard::place(group);
        let s = self.spec;
        let spec = DeltaNetSpec {
            num_k_heads: shard::check_divides("the linear-attention key heads", s.num_k_heads, size)?,
            num_v_heads: shard::check_divides("the linear-attention value heads", s.num_v_heads, size)?,
            ..s
        };
        let (kd, vd, nv) = (s.key_dim(), s.value_dim(), s.num_v_heads);
        let split = |l: &Linear, segments: &[i32]| l.shard(ShardMode::AllToSharded, segments, group);
        Ok(GatedDeltaNet {
            spec,
            proj: InProj::Separate { qkv: split(qkv, &[kd, kd, vd])?, z: split(z, &[vd])?, b: split(b, &[nv])?, a: split(a, &[nv])? },
            conv1d: shard::rows(&self.conv1d, &[kd, kd, vd], rank, size)?, // (conv_dim / N, K, 1)
            dt_bias: shard::block(&self.dt_bias, 0, rank, size)?,
            a_log: shard::block(&self.a_log, 0, rank, size)?,
            norm: self.norm.clone(),
            out_proj: self.out_proj.shard(ShardMode::ShardedToAll, &[], group)?,
        })
    }

    /// x (B, S, hidden) -> mixed q/k/v (B, S, conv_dim), z (B, S, Hv, Dv), b and a (B, S, Hv).
    fn project(&self, x: &Array) -> Result<(Array, Array, Array, Array)> {
        let s = &self.spec;
        let (bsz, len) = (x.dim(0), x.dim(1));
        Ok(match &self.proj {
            InProj::Separate { qkv, z, b, a } => {
                let z = z.forward(x)?.reshape(&[bsz, len, s.num_v_heads, s.head_v_dim])?;
                (qkv.forward(x)?, z, b.forward(x)?, a.forward(x)?)
            }
            InProj::Fused { qkvz, ba } => {
                // fix_query_key_value_ordering: per key head [q | k | v | z] and [b | a].
                let (nk, dn, nv, dv) = (s.num_k_heads, s.head_k_dim, s.num_v_heads, s.head_v_dim);
                let mixed = qkvz.forward(x)?.reshape(&[bsz, len, nk, -1])?; // (B, S, nk, 2 dn + 2 nv/nk dv)
                let mixed_ba = ba.forward(x)?.reshape(&[bsz, len, nk, -1])?; // (B, S, nk, 2 nv/nk)
                let vend = 2 * dn + nv / nk * dv;
                let q = mixed.slice_axis(-1, 0, dn)?;
                let k = mixed.slice_axis(-1, dn, 2 * dn)?;
                let v = mixed.slice_axis(-1, 2 * dn, vend)?.reshape(&[bsz, len, -1, dv])?;
                let z = mixed.slice_axis(-1, vend, mixed.dim(-1))?.reshape(&[bsz, len, -1, dv])?;
                let b = mixed_ba.slice_axis(-1, 0, nv / nk)?.reshape(&[bsz, len, nv])?;
                let a = mixed_ba.slice_axis(-1, nv / nk, mixed_ba.dim(-1))?.reshape(&[bsz, len, nv])?;
                let flat = |t: &Array| t.reshape(&[bsz, len, -1]);
                (ops::concatenate(&[&flat(&q)?, &flat(&k)?, &flat(&v)?], -1)?, z, b, a)
            }
        })
    }

    /// x (B, S, hidden) -> (B, S, hidden); `mask` (B, S) bool marks real (not padding) positions.
    pub fn forward(&self, x: &Array, mask: Option<&Array>, cache: &mut ArraysCache) -> Result<Array> {
        let s = &self.spec;
        let (bsz, len) = (x.dim(0), x.dim(1));
        let (qkv, z, b, a) = self.project(x)?;
        let conv_state = match cache.get(0) {
            Some(c) => c.clone(),
            None => ops::zeros(&[bsz, s.conv_kernel - 1, s.conv_dim()], x.dtype())?, // (B, K-1, conv_dim)
        };
        let qkv = match mask {
            Some(m) => ops::where_(&m.expand_dims(&[-1])?, &qkv, &Array::scalar(0.0, qkv.dtype())?)?,
            None => qkv,
        };
        let conv_input = ops::concatenate(&[&conv_state, &qkv], 1)?; // (B, K-1 + S, conv_dim)
        let n_keep = s.conv_kernel - 1;
        let total = conv_input.dim(1);
        cache.set(0, conv_input.slice_axis(1, total - n_keep, total)?.contiguous()?)?;
        let conv_out = conv_input.conv1d(&self.conv1d, 1, 0, 1, s.conv_dim())?.silu()?; // (B, S, conv_dim)
        let kd = s.key_dim();
        let q = conv_out.slice_axis(-1, 0, kd)?.reshape(&[bsz, len, s.num_k_heads, s.head_k_dim])?;
        let k = conv_out.slice_axis(-1, kd, 2 * kd)?.reshape(&[bsz, len, s.num_k_heads, s.head_k_dim])?;
        let v = conv_out.slice_axis(-1, 2 * kd, s.conv_dim())?.reshape(&[bsz, len, s.num_v_heads, s.head_v_dim])?;
        let (q, k) = normalize_qk(&q, &k, f64::from(s.head_k_dim).powf(-0.5), 1e-6)?;
        let (out, state) = gated_delta_update(&q, &k, &v, &a, &b, &self.a_log, &self.dt_bias, cache.get(1), mask)?;
        cache.set(1, state)?;
        cache.advance(len);
        // Qwen3NextRMSNormGated(out, z)
        let normed = fast::rms_norm(&out, Some(&self.norm), s.eps as f32)?;
        let out = fast::precise_swiglu(&out, &z, &normed)?; // (B, S, Hv, Dv)
        self.out_proj.forward(&out.reshape(&[bsz, len, -1])?)
    }
}

/// gated_delta.py's `normalize_qk`: L2-normalised q and k, the `Dk ** -0.5` readout scale folded
/// into q (through `rms_norm` with eps scaled to its mean of squares).
pub fn normalize_qk(q: &Array, k: &Array, inv_scale: f64, eps: f64) -> Result<(Array, Array)> {
    let rms_eps = (eps * inv_scale.powi(2)) as f32;
    let q = fast::rms_norm(q, None, rms_eps)?.mul_scalar(inv_scale.powi(2))?;
    let k = fast::rms_norm(k, None, rms_eps)?.mul_scalar(inv_scale)?;
    Ok((q, k))
}

/// Whether the recurrence runs as one GPU kernel ([`fast::GatedDelta::Kernel`], mlx-lm's Metal
/// kernel, also on CUDA, where MLX 0.32.4 has none and mlx-lm runs one compiled step per position):
/// on a GPU, for key heads of a multiple of 32 (as mlx-lm's condition), unless
/// `MLX_GEN_GDN_KERNEL=0` keeps the per-position steps (mlx-lm's ops path, bit for bit).
fn recurrence_kernel(dk: i32) -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = *OFF.get_or_init(|| std::env::var_os("MLX_GEN_GDN_KERNEL").is_some_and(|v| v == "0"));
    !off && dk >= 32 && dk % 32 == 0 && fast::gated_delta_kernel_available()
}

/// gated_delta.py's `gated_delta_update`: q, k (B, T, Hk, Dk), v (B, T, Hv, Dv), a and b (B, T, Hv),
/// state (B, Hv, Dv, Dk) or none yet, mask (B, T) -> y (B, T, Hv, Dv) and the new state. On the
/// CPU (and with `MLX_GEN_GDN_KERNEL=0`) its ops path, one compiled step per position; on a GPU
/// one kernel for all positions ([`recurrence_kernel`]).
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_update(
    q: &Array,
    k: &Array,
    v: &Array,
    a: &Array,
    b: &Array,
    a_log: &Array,
    dt_bias: &Array,
    state: Option<&Array>,
    mask: Option<&Array>,
) -> Result<(Array, Array)> {
    let beta = b.sigmoid()?; // (B, T, Hv)
    let g = fast::gated_delta_g(a_log, a, dt_bias)?; // (B, T, Hv)
    let (bsz, t, hk, dk) = (q.dim(0), q.dim(1), q.dim(2), q.dim(3));
    let (hv, dv) = (v.dim(2), v.dim(3));
    let mut state = match state {
        Some(s) => s.clone(),
        None => ops::zeros(&[bsz, hv, dv, dk], Dtype::F32)?,
    };
    if recurrence_kernel(dk) {
        return Ok(fast::gated_delta(fast::GatedDelta::Kernel, q, k, v, &g, &beta, &state, mask)?);
    }
    let (q, k) = match hv / hk {
        r if r > 1 => (q.repeat(r, -2)?, k.repeat(r, -2)?),
        _ => (q.clone(), k.clone()),
    };
    let at = |x: &Array, i: i32| -> Result<Array> { Ok(x.slice_axis(1, i, i + 1)?.squeeze(&[1])?) }; // x[:, t]
    let mut ys = Vec::with_capacity(t.max(0) as usize);
    for i in 0..t {
        let m = mask.map(|m| at(m, i)).transpose()?;
        let (y, s) = fast::gated_delta(fast::GatedDelta::Step, &at(&q, i)?, &at(&k, i)?, &at(v, i)?, &at(&g, i)?, &at(&beta, i)?, &state, m.as_ref())?;
        ys.push(y);
        state = s;
    }
    let ys: Vec<&Array> = ys.iter().collect();
    Ok((ops::stack(&ys, 1)?, state))
}
