//! mlx-gen's model formats: everything that produces an MLX model folder from something else.
//!
//! It owns GGUF reading and import ([`gguf`]), Hugging Face Hub downloads into the standard cache
//! ([`hub`]), `mlx-gen convert` from a Hugging Face float checkpoint ([`convert`]) and the default
//! model's first fetch ([`default_model`]). It reads and writes files and weight maps; it never
//! builds or runs a model: what an architecture does to its checkpoint at conversion (mlx-lm's
//! `sanitize`, config updates) is handed in by the caller as [`convert::ModelRules`], from the engine's registry.
#![forbid(unsafe_code)]

pub mod aligned;
pub mod convert;
pub mod default_model;
pub mod gguf;
pub mod hub;
pub mod mixed_quant;

use std::path::PathBuf;

/// A failure while producing a model folder, naming the file or setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::Error),
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("invalid config.json: {0}")]
    Config(String),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, FormatError>;

impl FormatError {
    pub fn file(path: impl Into<PathBuf>, message: impl std::fmt::Display) -> Self {
        FormatError::File { path: path.into(), message: message.to_string() }
    }
}
