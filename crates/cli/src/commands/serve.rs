//! `mlx-gen serve`: an OpenAI-compatible HTTP server for one model (chat and text completions, SSE streaming, metrics).
use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Model folder, .gguf file or Hugging Face repo id (default: SmolLM2-135M-Instruct); requests
    /// and `/v1/models` name it by this exact string.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Address to listen on (127.0.0.1: this machine only).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
}

pub fn run(args: Args) -> Result<()> {
    if args.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        anyhow::bail!("--api-key must not be empty");
    }
    let dir = crate::model_arg::resolve(args.model.as_deref())?;
    let model_id = match &args.model {
        Some(m) => m.to_string_lossy().into_owned(),
        None => dir.file_name().map_or_else(|| "default".to_owned(), |n| n.to_string_lossy().into_owned()),
    };
    let (loaded, _) = crate::progress::load_model(&dir)?;
    server::serve(
        loaded,
        server::ServeOptions { model_id, host: args.host, port: args.port, api_key: args.api_key, max_body_bytes: args.max_body_bytes },
    )
}
