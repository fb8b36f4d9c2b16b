//! One module per subcommand.
pub mod bench;
pub mod chat;
pub mod convert;
pub mod generate;
pub mod sampling;
