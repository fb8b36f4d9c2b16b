//! One module per subcommand.
pub mod bench;
pub mod chat;
pub mod generate;
pub mod sampling;
