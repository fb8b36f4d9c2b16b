//! mlx-gen engine.
#![forbid(unsafe_code)]
