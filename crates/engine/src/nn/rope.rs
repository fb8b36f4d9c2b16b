//! Rotary position embeddings as mlx-lm's `initialize_rope` builds them: plain (`nn.RoPE`), `linear`
//! scaling, and Llama 3's frequency smoothing (`Llama3RoPE`), all through `mx.fast.rope`.
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
}

#[derive(Clone)]
pub enum Rope {
    /// `mx.fast.rope(x, dims, traditional, base, scale, offset)`
    Base { dims: i32, traditional: bool, base: f32, scale: f32 },
    /// Explicit per-pair frequencies (dims / 2,), float32.
    Freqs { dims: i32, traditional: bool, freqs: Array },
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
            other => Err(EngineError::Config(format!(
                "rope_scaling type {other:?} is not supported (supported: default, linear, llama3)"
            ))),
        }
    }

    /// x (B, heads, L, head_dim) rotated for positions offset..offset+L.
    pub fn forward(&self, x: &Array, offset: i32) -> Result<Array> {
        Ok(match self {
            Rope::Base { dims, traditional, base, scale } => {
                fast::rope(x, *dims, *traditional, Some(*base), *scale, offset, None)?
            }
            Rope::Freqs { dims, traditional, freqs } => {
                fast::rope(x, *dims, *traditional, None, 1.0, offset, Some(freqs))?
            }
        })
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
