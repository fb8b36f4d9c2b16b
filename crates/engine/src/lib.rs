//! mlx-gen's engine: the forward pass and what drives it. It owns the architectures (one file per
//! `model_type`, built from a strict weight map), the nn blocks, KV caches, sampling, the token
//! generator, continuous batching, speculative decoding, tensor-parallel sharding and pipeline
//! stages. It may not download, import or convert model files (the `formats` crate does), and it
//! reads only MLX model folders (`checkpoint` for the weights, `tokenizer` for the tokenizer).
//! Everything runs on one thread that owns the MLX arrays.
#![forbid(unsafe_code)]

pub mod batch;
pub mod cache;
mod error;
pub mod generate;
mod load;
pub mod models;
pub mod pipeline;
pub mod prefill;
pub mod nn;
pub mod pace;
pub mod sample;
pub mod shard;
pub mod speculative;

pub use error::{EngineError, Result};
pub use generate::{GenerateConfig, Generated, Generator};
pub use load::{LoadedModel, Parallel};
pub use sample::SamplerConfig;
pub use speculative::{Draft, SpecStats, SpecToken, SpeculativeConfig, SpeculativeGenerator};
