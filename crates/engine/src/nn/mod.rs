//! Building blocks shared by the architectures: (quantized) linear and embedding layers, RMS norm,
//! rotary embeddings, attention over a KV cache and mixture-of-experts layers. Each mirrors its
//! `mlx.nn` / mlx-lm counterpart operation for operation, so that results are bit-identical.
mod attention;
mod embedding;
mod gate_up;
pub mod gated_delta;
mod linear;
pub mod mla;
pub mod moe;
mod norm;
mod quant;
mod rope;
pub mod sdpa;
mod switch;

pub use attention::{Attention, AttentionSpec, PlainQkNorm};
pub(crate) use gate_up::GateUp;

use std::sync::atomic::{AtomicBool, Ordering};

static FUSE_PROJECTIONS: AtomicBool = AtomicBool::new(false);

/// Load q/k/v (and gate/up) projections as one matrix each, so decode runs fewer kernels. Exact per
/// element, but a different matmul shape may round differently than mlx-lm's separate ones, so it
/// is meant for the GPU (where speed is the point), not for the CPU oracle runs.
pub fn set_fused_projections(on: bool) {
    FUSE_PROJECTIONS.store(on, Ordering::Relaxed);
}

pub fn fused_projections() -> bool {
    FUSE_PROJECTIONS.load(Ordering::Relaxed)
}
/// The rows of x (..., d): its leading axes folded into one (what picks a product's or a norm's kernel).
fn rows(x: &mlx::Array) -> usize {
    x.size() / x.dim(-1).max(1) as usize
}

pub use embedding::Embedding;
pub use linear::Linear;
pub use norm::RmsNorm;
pub use quant::{with_device_bound_decode, QuantConfig};
pub use rope::{Rope, RopeScaling};
