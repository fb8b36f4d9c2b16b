//! Rotary position embeddings as mlx-lm's `initialize_rope` builds them: plain (`nn.RoPE`), `linear`
//! scaling, Llama 3's frequency smoothing (`Llama3RoPE`) and YaRN (`YarnRoPE`), all through
//! `mx.fast.rope`.
use crate::error::{EngineError, Result};
use mlx::{fast, ops, Array, Dtype};
use serde::Deserialize;
use std::f64::consts::PI;

/// The `rope_scaling` entry of config.json (fields as Hugging Face names them).
#[derive(Clone, Debug, Deserialize, Default)]
pub struct RopeScaling {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub rope_type: Option<String>,
    pub factor: Option<f64>,
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
    pub original_max_position_embeddings: Option<f64>,
    /// YaRN (`YarnRoPE`): correction range and attention-scale factors.
    pub beta_fast: Option<f64>,
    pub beta_slow: Option<f64>,
    pub mscale: Option<f64>,
    pub mscale_all_dim: Option<f64>,
}

/// Where the rotated positions start.
#[derive(Clone, Copy)]
enum Offset<'a> {
    Same(i32),
    Rows(&'a Array),
}

#[derive(Clone)]
pub enum Rope {
    /// `mx.fast.rope(x, dims, traditional, base, scale, offset)`
    Base { dims: i32, traditional: bool, base: f32, scale: f32 },
    /// Explicit per-pair frequencies (dims / 2,), float32.
    Freqs { dims: i32, traditional: bool, freqs: Array },
    /// `YarnRoPE`: explicit frequencies, and the first `dims` features scaled by `mscale` first.
    Yarn { dims: i32, traditional: bool, freqs: Array, mscale: f64 },
}

impl Rope {
    pub fn new(dims: i32, base: f64, traditional: bool, scaling: Option<&RopeScaling>) -> Result<Rope> {
        let kind = scaling.and_then(|s| s.kind.clone().or_else(|| s.rope_type.clone())).unwrap_or("default".into());
        let factor = || {
            scaling
                .and_then(|s| s.factor)
                .ok_or_else(|| EngineError::Config(format!("rope_scaling of type {kind} needs a factor")))
        };
        match kind.as_str() {
            "default" => Ok(Rope::Base { dims, traditional, base: base as f32, scale: 1.0 }),
            "linear" => Ok(Rope::Base { dims, traditional, base: base as f32, scale: (1.0 / factor()?) as f32 }),
            "llama3" => {
                let s = scaling.cloned().unwrap_or_default();
                let freqs = llama3_freqs(dims, base, factor()?, &s)?;
                Ok(Rope::Freqs { dims, traditional, freqs })
            }
            "yarn" | "deepseek_yarn" | "telechat3-yarn" => Rope::yarn(dims, base, traditional, &scaling.cloned().unwrap_or_default()),
            other => Err(EngineError::Config(format!(
                "rope_scaling type {other:?} is not supported (supported: default, linear, llama3, yarn)"
            ))),
        }
    }

    /// x (B, heads, L, head_dim) rotated for positions offset..offset+L.
    pub fn forward(&self, x: &Array, offset: i32) -> Result<Array> {
        self.apply(x, Offset::Same(offset))
    }

    /// x (B, heads, L, head_dim) with row b rotated for positions offsets[b]..offsets[b]+L
    /// (offsets (B,) int32: a batch of sequences of different lengths).
    pub fn forward_rows(&self, x: &Array, offsets: &Array) -> Result<Array> {
        self.apply(x, Offset::Rows(offsets))
    }

    /// As the layer's cache says: one offset, or one per row for a batch cache.
    pub fn forward_cached(&self, x: &Array, cache: &dyn crate::cache::KvCache) -> Result<Array> {
        match cache.row_offsets() {
            Some(rows) => self.forward_rows(x, &rows),
            None => self.forward(x, cache.offset()),
        }
    }

    /// `YarnRoPE.__call__(x, offset, scale, inverse)`: positions `offset..` times `scale`; `inverse`
    /// rotates back (negated frequencies, the input scale inverted). YaRN ropes only.
    pub fn forward_scaled(&self, x: &Array, offset: i32, scale: f32, inverse: bool) -> Result<Array> {
        let Rope::Yarn { dims, traditional, freqs, mscale } = self else {
            return Err(EngineError::Config("a scaled or inverse rotation needs a YaRN rope".into()));
        };
        let x = if *mscale == 1.0 {
            x.clone()
        } else {
            let s = if inverse { 1.0 / mscale } else { *mscale };
            let head = x.slice_axis(-1, 0, *dims)?.mul_scalar(s)?;
            ops::concatenate(&[&head, &x.slice_axis(-1, *dims, i32::MAX)?], -1)?
        };
        let freqs = if inverse { freqs.neg()? } else { freqs.clone() };
        Ok(fast::rope(&x, *dims, *traditional, None, scale, offset, Some(&freqs))?)
    }

    fn apply(&self, x: &Array, offset: Offset<'_>) -> Result<Array> {
        let rope = |x: &Array, dims: i32, traditional: bool, base: Option<f32>, scale: f32, freqs: Option<&Array>| match offset {
            Offset::Same(o) => fast::rope(x, dims, traditional, base, scale, o, freqs),
            Offset::Rows(o) => fast::rope_rows(x, dims, traditional, base, scale, o, freqs),
        };
        Ok(match self {
            Rope::Base { dims, traditional, base, scale } => rope(x, *dims, *traditional, Some(*base), *scale, None)?,
            Rope::Freqs { dims, traditional, freqs } => rope(x, *dims, *traditional, None, 1.0, Some(freqs))?,
            Rope::Yarn { dims, traditional, freqs, mscale } => {
                // x.at[..., :dims].multiply(mscale) when mscale != 1.0 (a weak Python float).
                let x = if *mscale == 1.0 {
                    x.clone()
                } else if x.dim(-1) == *dims {
                    x.mul_scalar(*mscale)?
                } else {
                    let head = x.slice_axis(-1, 0, *dims)?.mul_scalar(*mscale)?;
                    ops::concatenate(&[&head, &x.slice_axis(-1, *dims, i32::MAX)?], -1)?
                };
                rope(&x, *dims, *traditional, None, 1.0, Some(freqs))?
            }
        })
    }

    /// mlx-lm's `YarnRoPE` (rope_utils.py; also deepseek_v2.py's `DeepseekV2YarnRotaryEmbedding`,
    /// which computes the same): YaRN frequencies blended by a linear ramp over the correction
    /// range, and the `mscale / mscale_all_dim` input scale.
    pub fn yarn(dims: i32, base: f64, traditional: bool, s: &RopeScaling) -> Result<Rope> {
        let factor = s.factor.ok_or_else(|| EngineError::Config("yarn rope_scaling needs a factor".into()))?;
        let original = s.original_max_position_embeddings.unwrap_or(4096.0);
        let (beta_fast, beta_slow) = (s.beta_fast.unwrap_or(32.0), s.beta_slow.unwrap_or(1.0));
        let d = f64::from(dims);
        let correction_dim = |rotations: f64| (d * (original / (rotations * 2.0 * PI)).ln()) / (2.0 * base.ln());
        let low = correction_dim(beta_fast).floor().max(0.0);
        let high = correction_dim(beta_slow).ceil().min(d - 1.0);
        let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
        let mscale = get_mscale(factor, s.mscale.unwrap_or(1.0)) / get_mscale(factor, s.mscale_all_dim.unwrap_or(0.0));

        let freq_extra = Array::scalar(base, Dtype::F32)?.power(&ops::arange(0.0, d, 2.0, Dtype::F32)?.div_scalar(d)?)?;
        let freq_inter = freq_extra.mul_scalar(factor)?;
        // yarn_linear_ramp_mask(low, high, dims // 2)
        let high = if low == high { high + 0.001 } else { high };
        let ramp = ops::arange(0.0, f64::from(dims / 2), 1.0, Dtype::F32)?.sub_scalar(low)?.div_scalar(high - low)?;
        let ramp = ramp.maximum_scalar(0.0)?.minimum_scalar(1.0)?;
        let one = Array::scalar(1.0, Dtype::F32)?;
        let freq_mask = one.sub(&ramp)?;
        let denom = freq_inter.mul(&freq_mask)?.add(&freq_extra.mul(&one.sub(&freq_mask)?)?)?;
        let freqs = freq_inter.mul(&freq_extra)?.div(&denom)?;
        freqs.eval()?;
        Ok(Rope::Yarn { dims, traditional, freqs, mscale })
    }
}

/// `Llama3RoPE.__init__`, the same MLX operations in the same order.
fn llama3_freqs(dims: i32, base: f64, factor: f64, s: &RopeScaling) -> Result<Array> {
    let low_freq_factor = s.low_freq_factor.unwrap_or(1.0);
    let high_freq_factor = s.high_freq_factor.unwrap_or(4.0);
    let old_context_len = s.original_max_position_embeddings.unwrap_or(8192.0);
    let low_freq_wavelen = old_context_len / low_freq_factor;
    let high_freq_wavelen = old_context_len / high_freq_factor;

    // freqs = base ** (mx.arange(0, dims, 2) / dims)
    let exponents = ops::arange(0.0, dims as f64, 2.0, Dtype::I32)?.div_scalar(dims as f64)?;
    let freqs = Array::scalar(base, Dtype::F32)?.power(&exponents)?;
    let wavelens = freqs.mul_scalar(2.0 * PI)?;
    let freqs = ops::where_(&wavelens.gt_scalar(low_freq_wavelen)?, &freqs.mul_scalar(factor)?, &freqs)?;
    let is_medium = wavelens.gt_scalar(high_freq_wavelen)?.logical_and(&wavelens.lt_scalar(low_freq_wavelen)?)?;
    let smooth = Array::scalar(old_context_len, Dtype::F32)?
        .div(&wavelens)?
        .sub_scalar(low_freq_factor)?
        .div_scalar(high_freq_factor - low_freq_factor)?;
    let denom = Array::scalar(1.0, Dtype::F32)?.sub(&smooth)?.div_scalar(factor)?.add(&smooth)?;
    let smooth_freqs = freqs.div(&denom)?;
    let out = ops::where_(&is_medium, &smooth_freqs, &freqs)?;
    out.eval()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention's fused path rotates the query and key heads of one projection in one call
    /// (`Attention::fused_roped`): that must be the separate calls' result to the bit, for every
    /// kind of rope, one offset or one per row, one position or several, and heads that are a
    /// strided slice of a wider array (the fused projection's output).
    #[test]
    fn one_call_over_side_by_side_heads_equals_one_call_each() {
        let llama3 = RopeScaling { rope_type: Some("llama3".into()), factor: Some(32.0), original_max_position_embeddings: Some(8192.0), ..RopeScaling::default() };
        let yarn = RopeScaling { rope_type: Some("yarn".into()), factor: Some(4.0), original_max_position_embeddings: Some(64.0), mscale: Some(1.0), mscale_all_dim: Some(0.5), ..RopeScaling::default() };
        let ropes = [
            Rope::new(16, 10000.0, false, None).unwrap(),
            Rope::new(16, 10000.0, true, None).unwrap(),
            Rope::new(16, 500000.0, false, Some(&llama3)).unwrap(),
            Rope::new(16, 10000.0, false, Some(&yarn)).unwrap(),
        ];
        let (h, kvh) = (6, 2);
        let rows = Array::from_slice(&[3i32, 17], &[2]).unwrap();
        for (r, rope) in ropes.iter().enumerate() {
            for l in [1, 5] {
                // (B, heads + 2 kv_heads, L, D) as the fused projection lays it out; q and k heads first.
                let k = mlx::random::key(r as u64).unwrap();
                let y = mlx::random::uniform_with_key(&[2, l, h + 2 * kvh, 16], Dtype::F32, &k).unwrap().transpose(&[0, 2, 1, 3]).unwrap();
                let (q, kk) = (y.slice_axis(1, 0, h).unwrap(), y.slice_axis(1, h, h + kvh).unwrap());
                let qk = y.slice_axis(1, 0, h + kvh).unwrap();
                let same = |a: &Array, b: &Array, what: &str| {
                    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
                    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "rope {r}, L {l}: {what} differ");
                };
                for offsets in [None, Some(&rows)] {
                    let turn = |x: &Array| match offsets {
                        Some(o) => rope.forward_rows(x, o).unwrap(),
                        None => rope.forward(x, 9).unwrap(),
                    };
                    let both = turn(&qk);
                    same(&both.slice_axis(1, 0, h).unwrap(), &turn(&q), "queries");
                    same(&both.slice_axis(1, h, h + kvh).unwrap(), &turn(&kk), "keys");
                }
            }
        }
    }
}
