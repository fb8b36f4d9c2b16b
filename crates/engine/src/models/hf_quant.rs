//! Quantized formats of checkpoints as published on Hugging Face, rewritten at load as mlx-lm
//! 0.32.2's `deepseek_v3.py` `sanitize` does: compressed-tensors int4 (`weight_packed` +
//! `weight_scale` + `weight_shape`, Kimi-K2 style) becomes MLX affine 4-bit, and FP8 weights
//! (`float8_e4m3fn`, read from safetensors as uint8) with 128x128 `weight_scale_inv` block scales
//! are dequantized to bfloat16 (and mistral4.py's variant, whose scales may also broadcast).
use crate::error::{EngineError, Result};
use checkpoint::Weights;
use mlx::{Array, Dtype};

/// The FP8 block size (`bs = 128` in mlx-lm).
const BLOCK: i32 = 128;

/// Both rewrites, in mlx-lm's order: int4 first, then FP8.
pub fn sanitize(weights: &mut Weights) -> Result<()> {
    remap_packed_int4(weights)?;
    dequantize_fp8(weights)
}

/// compressed-tensors `pack-quantized` int4: `X.weight_packed` (int32, eight 4-bit values offset by 8
/// per word, low bits first) read as uint32 into `X.weight`, `X.weight_scale` into `X.scales`, and
/// `X.biases = -8 * scales`. As mlx-lm, every other `*weight_scale` / `*weight_packed` tensor is
/// dropped and `X.weight_shape` is not kept.
pub fn remap_packed_int4(weights: &mut Weights) -> Result<()> {
    let names = weights.names();
    let mut made = Vec::new();
    for k in &names {
        if !k.ends_with("weight_shape") {
            continue;
        }
        let base = k.replace("weight_shape", "");
        let take = |w: &mut Weights, n: &str| -> Result<Array> {
            let name = format!("{base}{n}");
            w.remove(&name).ok_or(EngineError::missing_tensor(name))
        };
        let packed = take(weights, "weight_packed")?;
        if packed.dtype().size() != 4 {
            return Err(EngineError::Invalid(format!(
                "{base}weight_packed is {}, expected 32-bit words of packed int4",
                packed.dtype().name()
            )));
        }
        let s = take(weights, "weight_scale")?;
        weights.remove(k);
        made.push((format!("{base}weight"), packed.view(Dtype::U32)?));
        made.push((format!("{base}biases"), s.mul_scalar(-8.0)?));
        made.push((format!("{base}scales"), s));
    }
    weights.drop_where(|k| k.ends_with("weight_scale") || k.ends_with("weight_packed"));
    for (name, a) in made {
        weights.insert(name, a);
    }
    Ok(())
}

/// Every `X.weight_scale_inv` (float32, one scale per 128x128 block, the last blocks partial)
/// dequantizes `X.weight` to bfloat16 and is dropped.
pub fn dequantize_fp8(weights: &mut Weights) -> Result<()> {
    for k in weights.names() {
        if !k.contains("weight_scale_inv") {
            continue;
        }
        let wk = k.replace("_scale_inv", "");
        let scale_inv = weights.remove(&k).expect("listed by names()");
        let weight = weights.remove(&wk).ok_or_else(|| EngineError::missing_tensor(wk.clone()))?;
        weights.insert(wk.clone(), dequantize_blocks(&wk, &weight, &scale_inv)?);
    }
    Ok(())
}

/// mistral4.py's FP8 pass: `*activation_scale` tensors dropped; every `X_scale_inv` dequantizes
/// `X` (the name without `_scale_inv`: `...weight`, or fused experts' `experts.down_proj`) to
/// bfloat16, by broadcasting where the scale broadcasts against it (per tensor, or per expert
/// (E, 1, 1)), else by 128x128 blocks.
pub fn dequantize_fp8_broadcasting(weights: &mut Weights) -> Result<()> {
    weights.drop_where(|k| k.ends_with("activation_scale"));
    for k in weights.names() {
        if !k.ends_with("_scale_inv") {
            continue;
        }
        let wk = k.replace("_scale_inv", "");
        let scale_inv = weights.remove(&k).expect("listed by names()");
        let weight = weights.remove(&wk).ok_or_else(|| EngineError::missing_tensor(wk.clone()))?;
        let (s, w) = (scale_inv.shape(), weight.shape());
        let broadcasts = s.len() <= w.len() && s.iter().rev().zip(w.iter().rev()).all(|(a, b)| *a == 1 || a == b);
        let out = if broadcasts {
            if weight.dtype() != Dtype::U8 {
                return Err(EngineError::Invalid(format!("{wk} has {k} but is {}, not float8_e4m3 (F8_E4M3)", weight.dtype().name())));
            }
            weight.from_fp8(Dtype::BF16)?.mul(&scale_inv)?.astype(Dtype::BF16)?
        } else {
            dequantize_blocks(&wk, &weight, &scale_inv)?
        };
        weights.insert(wk, out);
    }
    Ok(())
}

/// mlx-lm's `dequant`: the FP8 weight (m, n) as bfloat16, zero-padded to whole blocks, times its
/// block's scale (in float32, the scales' dtype), cut back to (m, n) and cast to bfloat16.
pub fn dequantize_blocks(name: &str, weight: &Array, scale_inv: &Array) -> Result<Array> {
    let shape = weight.shape();
    let [m, n] = shape[..] else {
        return Err(EngineError::Invalid(format!("{name}: an FP8 weight with block scales must be 2-D, found shape {shape:?}")));
    };
    if weight.dtype() != Dtype::U8 {
        return Err(EngineError::Invalid(format!(
            "{name} has weight_scale_inv but is {}, not float8_e4m3 (F8_E4M3)",
            weight.dtype().name()
        )));
    }
    let (pad_bottom, pad_side) = ((-m).rem_euclid(BLOCK), (-n).rem_euclid(BLOCK));
    let (mb, nb) = ((m + pad_bottom) / BLOCK, (n + pad_side) / BLOCK);
    if scale_inv.shape() != [mb, nb] {
        return Err(EngineError::shape(format!("{name}_scale_inv"), scale_inv.shape(), vec![mb, nb]));
    }
    let w = weight.from_fp8(Dtype::BF16)?.pad(&[(0, pad_bottom), (0, pad_side)], 0.0)?;
    let w = w.reshape(&[mb, BLOCK, nb, BLOCK])?; // (row blocks, 128, column blocks, 128)
    let w = w.mul(&scale_inv.expand_dims(&[1, 3])?)?.reshape(&[m + pad_bottom, n + pad_side])?;
    Ok(w.slice(&[0, 0], &[m, n], &[1, 1])?.astype(Dtype::BF16)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Float8 e4m3 bytes of small exact values: 0x38 = 1.0, 0x40 = 2.0, 0xB8 = -1.0, 0x30 = 0.5.
    #[test]
    fn dequantizes_partial_blocks_with_their_own_scale() {
        let (m, n) = (130, 3); // two row blocks, the second with 2 rows
        let bytes: Vec<u8> = (0..m * n).map(|i| [0x38u8, 0x40, 0xB8, 0x30][i as usize % 4]).collect();
        let w = Array::from_bytes(&bytes, &[m, n], Dtype::U8).unwrap();
        let s = Array::from_slice(&[2.0f32, 0.25], &[2, 1]).unwrap();
        let out = dequantize_blocks("x.weight", &w, &s).unwrap();
        assert_eq!(out.shape(), vec![m, n]);
        assert_eq!(out.dtype(), Dtype::BF16);
        let v = out.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
        let base = [1.0f32, 2.0, -1.0, 0.5];
        for (i, x) in v.iter().enumerate() {
            let scale = if (i as i32) / n < BLOCK { 2.0 } else { 0.25 };
            assert_eq!(*x, base[i % 4] * scale, "element {i}");
        }
    }

    /// mistral4's pass: a per-expert (E, 1, 1) scale broadcasts, `activation_scale` is dropped.
    #[test]
    fn per_expert_scales_broadcast_and_activation_scales_go() {
        let mut map = std::collections::HashMap::new();
        map.insert("e.down_proj".to_owned(), Array::from_bytes(&[0x38u8; 8], &[2, 2, 2], Dtype::U8).unwrap());
        map.insert("e.down_proj_scale_inv".to_owned(), Array::from_slice(&[2.0f32, 0.5], &[2, 1, 1]).unwrap());
        map.insert("q.activation_scale".to_owned(), Array::from_slice(&[1.0f32], &[1]).unwrap());
        let mut w = Weights::from_map(map);
        dequantize_fp8_broadcasting(&mut w).unwrap();
        assert_eq!(w.names(), ["e.down_proj"]);
        let out = w.remove("e.down_proj").unwrap();
        assert_eq!(out.dtype(), Dtype::BF16);
        assert_eq!(out.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap(), [2.0, 2.0, 2.0, 2.0, 0.5, 0.5, 0.5, 0.5]);
    }

    #[test]
    fn wrong_scale_shape_is_an_error() {
        let w = Array::from_bytes(&[0x38u8; 6], &[2, 3], Dtype::U8).unwrap();
        let s = Array::from_slice(&[1.0f32, 1.0], &[1, 2]).unwrap();
        let e = dequantize_blocks("x.weight", &w, &s).expect_err("an error").to_string();
        assert!(e.contains("x.weight_scale_inv") && e.contains("[1, 2]"), "{e}");
    }

    #[test]
    fn int4_remap_names_and_biases() {
        let mut map = std::collections::HashMap::new();
        map.insert("l.weight_packed".to_owned(), Array::from_slice(&[-1i32, 0x12345678], &[1, 2]).unwrap());
        map.insert("l.weight_scale".to_owned(), Array::from_slice(&[0.5f32], &[1, 1]).unwrap());
        map.insert("l.weight_shape".to_owned(), Array::from_slice(&[1i32, 16], &[2]).unwrap());
        map.insert("other.weight_scale".to_owned(), Array::from_slice(&[1.0f32], &[1]).unwrap());
        let mut w = Weights::from_map(map);
        sanitize(&mut w).unwrap();
        assert_eq!(w.names(), ["l.biases", "l.scales", "l.weight"]);
        let q = w.remove("l.weight").unwrap();
        assert_eq!(q.dtype(), Dtype::U32);
        assert_eq!(q.to_vec::<u32>().unwrap(), [u32::MAX, 0x12345678]);
        assert_eq!(w.remove("l.biases").unwrap().to_vec::<f32>().unwrap(), [-4.0]);
    }
}
