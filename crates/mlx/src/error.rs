//! The error type of every MLX call: what was attempted, MLX's message, and where it was called.
use std::panic::Location;

#[derive(Debug, Clone, thiserror::Error)]
#[error("{what}: {message}")]
pub struct Error {
    /// The operation that failed, e.g. `matmul`.
    pub what: &'static str,
    /// MLX's exception text (or our own check's).
    pub message: String,
    /// Where in Rust the operation was requested.
    pub location: &'static Location<'static>,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    #[track_caller]
    pub fn new(what: &'static str, message: impl Into<String>) -> Self {
        Error { what, message: message.into(), location: Location::caller() }
    }
}

/// Attaches the operation name and the caller's location to a raw shim result.
#[track_caller]
pub(crate) fn ctx<T>(what: &'static str, r: mlx_sys::Result<T>) -> Result<T> {
    let location = Location::caller();
    r.map_err(|message| Error { what, message, location })
}
