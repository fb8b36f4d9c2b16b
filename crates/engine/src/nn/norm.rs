//! `nn.RMSNorm` through MLX's fused kernel, and the residual add before it fused in (GPU).
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

    /// The residual add and this norm: (h = x + y, norm(h)), both (B, L, dims). On a GPU with
    /// `MLX_GEN_FUSED_NORM=1`, one kernel instead of MLX's two (a decoder layer has two such
    /// pairs: two kernels less per layer and token for the host to encode); elsewhere MLX's two
    /// operations, the same arrays.
    pub fn add_forward(&self, x: &Array, y: &Array) -> Result<(Array, Array)> {
        Ok(fast::add_rms_norm(x, y, &self.weight, self.eps, fused_add_norm())?)
    }
}

/// `MLX_GEN_FUSED_NORM=1`: the residual add and the RMS norm after it as one GPU kernel (CUDA;
/// Metal's, written to the same formula, untried). Off: on an H100 (`gpu_suite.sh fusednorm`) it
/// rounded as MLX's two kernels do (equal log-probabilities) but decoded 1-8% slower, each call
/// through MLX's custom-kernel API costing the host more than the two built-in kernels. It is now
/// launched by the shim's own primitive (jit.cpp, MLX's host cost a call): to be measured again.
fn fused_add_norm() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MLX_GEN_FUSED_NORM").is_some_and(|v| v == "1"))
}
