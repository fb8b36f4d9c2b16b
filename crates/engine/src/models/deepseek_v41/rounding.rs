//! deepseek_v41 attention's numerics as the reference computes them: the interleaved YaRN rope on
//! a latent's trailing features, and the FP8 (e4m3) and FP4 (e2m1) round trips the reference
//! applies to queries, keys and compressed latents.
use crate::error::Result;
use crate::nn::Rope;
use mlx::{ops, Array, Dtype};

/// The interleaved YaRN rope (`YarnRoPE(traditional=True)`) on the trailing `dims` features of
/// x (B, L, H, D) or (B, L, D), in float32, positions `offset..` times `scale`; `inverse` rotates back.
#[derive(Clone)]
pub(super) struct TailRope {
    pub(super) rope: Rope,
    pub(super) dims: i32,
}

impl TailRope {
    pub(super) fn apply(&self, x: &Array, offset: i32, scale: f32, inverse: bool) -> Result<Array> {
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
pub(super) fn fake_quant_fp8(x: &Array, block: i32) -> Result<Array> {
    let Some(b) = blocks(x, block)? else { return Ok(x.clone()) };
    let amax = b.abs()?.max(&[-1], true)?.maximum_scalar(1e-4)?;
    let scale = Array::scalar(2.0, Dtype::F32)?.power(&amax.div_scalar(448.0)?.log2()?.ceil()?)?;
    let q = b.div(&scale)?.maximum_scalar(-448.0)?.minimum_scalar(448.0)?;
    Ok(q.to_fp8()?.from_fp8(Dtype::F32)?.mul(&scale)?.reshape(&x.shape())?.astype(x.dtype())?)
}

/// `_fake_quant_fp4`: each value rounded to the nearest FP4 (e2m1) level of its block's scale
/// (an e4m3-rounded one, or a power of two).
pub(super) fn fake_quant_fp4(x: &Array, block: i32, e4m3_scale: bool) -> Result<Array> {
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
