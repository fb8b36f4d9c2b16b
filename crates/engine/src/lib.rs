//! mlx-gen's engine: model configs and weights, the architectures (one file per `model_type`),
//! KV caches, sampling and the token generator, plus tokenizers and chat templates.
//! Everything runs on one thread that owns the MLX arrays.
#![forbid(unsafe_code)]

pub mod batch;
pub mod cache;
pub mod convert;
pub mod default_model;
mod error;
pub mod flow;
pub mod generate;
pub mod gguf;
pub mod hub;
mod load;
pub mod models;
pub mod pipeline;
pub mod nn;
pub mod sample;
pub mod shard;
pub mod speculative;
pub mod tokenizer;
pub mod weights;

pub use error::{EngineError, Result};
pub use generate::{GenerateConfig, Generated, Generator};
pub use load::{LoadedModel, Parallel};
pub use sample::SamplerConfig;
pub use speculative::{Draft, SpecStats, SpecToken, SpeculativeConfig, SpeculativeGenerator};
