//! `mlx-gen serve`: an OpenAI-compatible HTTP server for one model (chat and text completions, SSE streaming, metrics), speculating with a draft model or prompt lookup for a request that decodes alone.
use super::generate::speculative::SpecArgs;
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
    /// Sequences decoded together at most (continuous batching; each of a request's `n` choices counts).
    #[arg(long, default_value_t = 32)]
    max_batch_size: usize,
    /// Requests waiting for a place in the batch at most; more get 503 with Retry-After.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Run the batch engine once over dummy sequences before serving, so that the first requests
    /// do not pay the GPU's first-use kernel compiles: auto = on the GPU only (on the CPU there is
    /// nothing to compile and it would cost seconds).
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    warmup: String,
    /// Prompt tokens prefilled per step between decode steps of the running batch [default: 2048
    /// on a GPU (mlx_lm.server's; fewer, larger forwards measured 1.04-1.27x at 32 streams on an
    /// H200), 512 on the CPU (where a step's prefill takes long enough to stall the running ones)].
    #[arg(long)]
    prefill_step_size: Option<usize>,
    /// Different prompts prefilled together in one batched forward at most (mlx_lm.server's
    /// `--prompt-concurrency`); newcomers beyond it wait for the next group [default: 32 on a GPU
    /// (32 streams of the Llama-3.2-3B shape: 1.2-1.6x the throughput of groups of 8 on an H100),
    /// 8 on the CPU (mlx_lm.server's)].
    #[arg(long)]
    prompt_concurrency: Option<usize>,
    /// KV cache the running batch may hold, in MiB: the padded batch, every sequence as long as
    /// the longest one's prompt + max_tokens (requests wait for room; one that can never fit is
    /// refused).
    #[arg(long, default_value_t = 8192)]
    kv_budget_mb: usize,
    /// A request still running this many seconds after it arrived ends with a 408 error (0: no limit).
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    request_timeout: u64,
    /// An engine step that runs longer than this many seconds makes /health answer 503 (stuck).
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    step_timeout: u64,
    /// Memory for the prefix cache, in MiB: finished requests' keys and values, reused by later
    /// prompts that begin the same way (0 turns it off).
    #[arg(long, default_value_t = 1024)]
    prefix_cache_mb: usize,
    /// On several ranks (mlx-gen launch): pipeline parallel instead of tensor parallel.
    #[arg(long)]
    pipeline: bool,
    /// Speculative decoding while one request decodes alone (several decode batched).
    #[command(flatten)]
    spec: SpecArgs,
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
    let on_gpu = mlx::runtime::default_device() == mlx::runtime::Device::Gpu;
    let prefill_step_size = args.prefill_step_size.unwrap_or(if on_gpu { 2048 } else { 512 });
    let prompt_concurrency = args.prompt_concurrency.unwrap_or(if on_gpu { 32 } else { 8 });
    if args.max_batch_size == 0 || prefill_step_size == 0 || prompt_concurrency == 0 || args.kv_budget_mb == 0 || args.step_timeout == 0 {
        anyhow::bail!("--max-batch-size, --prefill-step-size, --prompt-concurrency, --kv-budget-mb and --step-timeout must each be at least 1");
    }
    if engine::nn::sdpa::composed_max() > 0 {
        // Prompts of every length meet the prefill: composed attention up to a chunk avoids a
        // cuDNN graph build per new shape on the GPU (see engine::nn::sdpa).
        engine::nn::sdpa::set_composed_max(prefill_step_size.min(2048) as i32);
    }
    let speculation = match (&args.spec.draft_model, args.spec.prompt_lookup) {
        (None, None) => None,
        (_, lookup) if crate::rank::group().is_some() => {
            let flag = if lookup.is_some() { "--prompt-lookup" } else { "--draft-model" };
            anyhow::bail!("{flag} is served on one rank only: speculative decoding does not combine with serving over several ranks (mlx-gen launch)")
        }
        (Some(_), _) => Some(server::lockstep::SpecOptions { drafter: server::lockstep::SpecDrafter::DraftModel, config: args.spec.config()? }),
        (None, Some(n)) => Some(server::lockstep::SpecOptions { drafter: server::lockstep::SpecDrafter::PromptLookup(n as usize), config: args.spec.config()? }),
    };
    let batch = server::lockstep::BatchOptions {
        max_batch: args.max_batch_size,
        prefill_step_size,
        prompt_concurrency,
        kv_budget_bytes: args.kv_budget_mb << 20,
        prefix_cache_bytes: args.prefix_cache_mb << 20,
        speculation,
        warm_up: match args.warmup.as_str() {
            "on" => true,
            "off" => false,
            _ => on_gpu,
        },
    };
    // On several ranks rank 0 serves and the others replay its engine calls.
    let share: Option<server::lockstep::Share> =
        crate::rank::group().map(|_| std::sync::Arc::new(|b: &[u8]| crate::rank::share_from_leader(b)) as server::lockstep::Share);
    if let Some(share) = share.clone().filter(|_| !crate::rank::is_leader()) {
        // A terminal's Ctrl-C reaches every rank: rank 0 decides when the group stops.
        let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)));
        let (loaded, _) = crate::rank::load_model(&dir, args.pipeline)?;
        return server::replica::follow(loaded, share, batch);
    }
    // The engine thread loads the model and alone holds its arrays.
    let (pipeline, spec) = (args.pipeline, args.spec);
    server::serve(
        move || {
            let (model, _) = crate::rank::load_model(&dir, pipeline)?;
            let draft = spec.load_draft(&model)?;
            Ok(server::Models { model, draft })
        },
        server::ServeOptions {
            model_id,
            host: args.host,
            port: args.port,
            api_key: args.api_key,
            max_body_bytes: args.max_body_bytes,
            max_queue: args.max_queue,
            request_timeout: (args.request_timeout > 0).then(|| std::time::Duration::from_secs(args.request_timeout)),
            step_timeout: std::time::Duration::from_secs(args.step_timeout),
            batch,
            share,
        },
    )
}
