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

    /// The residual add and this norm: (h = x + y, norm(h)), both (B, L, dims). Where
    /// [`fused_add_norm`] says so, one GPU kernel instead of MLX's two (a decoder layer has two
    /// such pairs: two kernels less per layer and token for the host to encode); elsewhere MLX's
    /// two operations, the same arrays.
    pub fn add_forward(&self, x: &Array, y: &Array) -> Result<(Array, Array)> {
        Ok(fast::add_rms_norm(x, y, &self.weight, self.eps, fused_add_norm(x))?)
    }
}

/// Rows up to which the fused add + norm runs by default: decode steps, batch steps, speculative
/// verification. A prompt's chunk (hundreds of rows) keeps MLX's two kernels, faster there.
const FUSED_MAX_ROWS: usize = 64;

/// Whether the residual add and the RMS norm after it run as one kernel of ours for x (..., dims):
/// by default on a CUDA GPU (where the shim's kernels run) for up to [`FUSED_MAX_ROWS`] rows;
/// `MLX_GEN_FUSED_NORM=1` for any rows on a GPU (Metal's kernel, written to the same formula, is
/// untried), `=0` never. Measured on an H100 (`gpu_suite.sh fusednorm`, BENCHMARKS.md 2026-12-06f):
/// MLX's log-probabilities bit for bit over 64 tokens (hidden sizes 1,024 and
/// 3,072); decode 1.14-1.23x on the Qwen3-0.6B shape and 0.91-1.23x (median 1.12x) on
/// Llama-3.2-3B, 3 rounds each; prefill 0.83x on Llama-3.2-3B, hence the row bound.
fn fused_add_norm(x: &Array) -> bool {
    #[derive(Clone, Copy)]
    enum Mode {
        Never,
        Always,
        FewRows,
    }
    static MODE: std::sync::OnceLock<Mode> = std::sync::OnceLock::new();
    let mode = *MODE.get_or_init(|| match std::env::var("MLX_GEN_FUSED_NORM").as_deref() {
        Ok("1") => Mode::Always,
        Ok("0") => Mode::Never,
        _ if mlx::fast::qmm_rows_available() => Mode::FewRows,
        _ => Mode::Never,
    });
    match mode {
        Mode::Never => false,
        Mode::Always => true,
        Mode::FewRows => super::rows(x) <= FUSED_MAX_ROWS,
    }
}
