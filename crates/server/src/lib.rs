//! mlx-gen server (see the server issue).
#![forbid(unsafe_code)]
