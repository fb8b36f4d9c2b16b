//! deepseek_v41's hyper-connections: the `hc_mult` residual streams collapsed into each block's
//! input and expanded from its output, mixed by Sinkhorn-normalised matrices (`attn_hc` / `ffn_hc`).
use super::Config;
use crate::error::Result;
use checkpoint::Vb;
use mlx::{fast, Array, Dtype};

/// The hyper-connection mixer (`attn_hc` / `ffn_hc`).
#[derive(Clone)]
pub(super) struct HyperConnection {
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
    pub(super) fn load(vb: &Vb<'_>, c: &Config) -> Result<HyperConnection> {
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

    pub(super) fn arrays(&self) -> Vec<&Array> {
        vec![&self.fn_, &self.base, &self.scale]
    }

    /// streams (B, L, hc, D) -> (pre (B, L, hc), post (B, L, hc), comb (B, L, hc, hc)), float32.
    pub(super) fn forward(&self, streams: &Array) -> Result<(Array, Array, Array)> {
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
pub(super) fn collapse(streams: &Array, mix: &Array) -> Result<Array> {
    let s = mix.expand_dims(&[-1])?.mul(&streams.astype(Dtype::F32)?)?.sum(&[2], false)?;
    Ok(s.astype(streams.dtype())?)
}

/// `_expand`: the block output x (B, L, D) into the streams, `post`-weighed, plus the residual
/// streams mixed by `comb`.
pub(super) fn expand(x: &Array, residual: &Array, post: &Array, comb: &Array) -> Result<Array> {
    let mixed = comb.expand_dims(&[-1])?.mul(&residual.expand_dims(&[-2])?)?.sum(&[2], false)?;
    let out = post.expand_dims(&[-1])?.mul(&x.expand_dims(&[-2])?)?.add(&mixed)?;
    Ok(out.astype(residual.dtype())?)
}
