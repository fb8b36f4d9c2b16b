//! Building blocks shared by the architectures: (quantized) linear and embedding layers, RMS norm,
//! rotary embeddings and attention over a KV cache. Each mirrors its `mlx.nn` / mlx-lm counterpart
//! operation for operation, so that results are bit-identical.
mod attention;
mod embedding;
mod linear;
mod norm;
mod quant;
mod rope;

pub use attention::{Attention, AttentionSpec};
pub use embedding::Embedding;
pub use linear::Linear;
pub use norm::RmsNorm;
pub use quant::QuantConfig;
pub use rope::{Rope, RopeScaling};
