//! One module per subcommand.
pub mod bench;
pub mod cache_prompt;
pub mod chat;
pub mod convert;
pub mod flow_schedule;
pub mod generate;
pub mod launch;
pub mod outpaint_prep;
pub mod sampling;
pub mod serve;
