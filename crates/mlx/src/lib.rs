//! Safe MLX for mlx-gen: an owned, cloneable, single-thread [`Array`] (see its doc), its dtypes, and the operations the
//! engine needs, grouped by kind. Every failure is an [`Error`] carrying MLX's own message and the
//! caller's source location. No `unsafe` here: it all lives in `mlx-sys`.
#![forbid(unsafe_code)]

mod array;
mod error;
pub mod distributed;
pub mod fast;
pub mod io;
mod mailbox;
pub mod ops;
pub mod random;
pub mod runtime;

pub use array::{async_eval, eval, export_to_dot, host_waits, Array, Dtype, Element};
pub use error::{Error, Result};
pub use mailbox::{Mailbox, Ticket};
