//! `nn.RMSNorm` through MLX's fused kernel.
use crate::error::Result;
use checkpoint::Vb;
use mlx::{fast, Array};

#[derive(Clone)]
pub struct RmsNorm {
    weight: Array, // (dims,)
    eps: f32,
}

impl RmsNorm {
    pub fn load(vb: &Vb<'_>, dims: i32, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm { weight: vb.get("weight", &[dims])?, eps: eps as f32 })
    }

    pub fn arrays(&self) -> Vec<&Array> {
        vec![&self.weight]
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}
