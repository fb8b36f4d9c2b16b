//! The engine's error type: every failure a user can cause, with a message that names the culprit.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
    #[error(transparent)]
    Tokenizer(#[from] tokenizer::TokenizerError),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::Error),
    #[error("model folder {0} does not exist")]
    NoModelDir(PathBuf),
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("unsupported model_type {found:?}; supported: {supported}")]
    UnsupportedModel { found: String, supported: String },
    #[error("invalid config.json: {0}")]
    Config(String),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, EngineError>;

impl EngineError {
    /// A tensor the model needs is not in the checkpoint.
    pub fn missing_tensor(name: impl Into<String>) -> Self {
        checkpoint::Error::MissingTensor(name.into()).into()
    }

    /// A checkpoint tensor whose shape the model cannot use.
    pub fn shape(name: impl Into<String>, found: Vec<i32>, expected: Vec<i32>) -> Self {
        checkpoint::Error::Shape { name: name.into(), found, expected }.into()
    }

    pub fn file(path: impl Into<PathBuf>, message: impl std::fmt::Display) -> Self {
        EngineError::File { path: path.into(), message: message.to_string() }
    }
}
