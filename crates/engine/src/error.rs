//! The engine's error type: every failure a user can cause, with a message that names the culprit.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    #[error("model folder {0} does not exist")]
    NoModelDir(PathBuf),
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("unsupported model_type {found:?}; supported: {supported}")]
    UnsupportedModel { found: String, supported: String },
    #[error("invalid config.json: {0}")]
    Config(String),
    #[error("tensor {0} is missing from the checkpoint")]
    MissingTensor(String),
    #[error("the checkpoint has tensors the model does not use: {0}")]
    UnusedTensors(String),
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    Shape { name: String, found: Vec<i32>, expected: Vec<i32> },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, EngineError>;

impl EngineError {
    pub fn file(path: impl Into<PathBuf>, message: impl std::fmt::Display) -> Self {
        EngineError::File { path: path.into(), message: message.to_string() }
    }
}
