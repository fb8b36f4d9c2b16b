//! mlx-gen's engine: model configs and weights, the architectures (one file per `model_type`),
//! KV caches, sampling and the token generator, plus tokenizers and chat templates.
//! Everything runs on one thread that owns the MLX arrays.
#![forbid(unsafe_code)]

pub mod tokenizer;
