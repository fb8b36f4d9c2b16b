//! `mlx-gen generate`: one prompt in, text out, as `mlx_lm.generate` does it (chat template,
//! streaming, statistics), plus `--output json` for programs.
use anyhow::{bail, Context, Result};
use engine::tokenizer::ChatMessage;
use super::sampling::SamplingArgs;
use engine::{GenerateConfig, Generator};
use serde::Serialize;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Model folder or .gguf file (default: SmolLM2-135M-Instruct, fetched on first use).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The prompt; `-` reads it from standard input.
    #[arg(short, long, default_value = "hello")]
    prompt: String,
    /// Maximum number of tokens to generate.
    #[arg(short = 'm', long, default_value_t = 100)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// A system message placed before the prompt in the chat template.
    #[arg(long)]
    system_prompt: Option<String>,
    /// Use the prompt as raw text, without the chat template.
    #[arg(long)]
    ignore_chat_template: bool,
    /// Prompt tokens per prefill step.
    #[arg(long, default_value_t = 2048)]
    prefill_step_size: usize,
    /// Print separators and statistics (prompt and generation tok/s, peak memory) like mlx-lm.
    #[arg(long)]
    verbose: bool,
    /// `text` streams the answer; `json` prints one JSON object at the end.
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Serialize)]
struct JsonResult {
    text: String,
    tokens: Vec<u32>,
    prompt_tokens: usize,
    generation_tokens: usize,
    prompt_tps: f64,
    generation_tps: f64,
    peak_memory_gb: f64,
    finish_reason: &'static str,
    /// Per token (with --logprobs or --top-logprobs): its log-probability.
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<Vec<f32>>,
    /// Per token (with --top-logprobs K): the K most likely [id, logprob], most likely first.
    #[serde(skip_serializing_if = "Option::is_none")]
    top_logprobs: Option<Vec<Vec<(u32, f32)>>>,
}

pub fn run(args: Args) -> Result<()> {
    let sampler = args.sampling.sampler_config()?;
    let raw = if args.prompt == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).context("cannot read the prompt from standard input")?;
        s
    } else {
        args.prompt.replace("\\n", "\n").replace("\\t", "\t")
    };
    if raw.is_empty() {
        bail!("the prompt is empty: give some text with --prompt (or on standard input with --prompt -)");
    }

    let model_dir = crate::model_arg::resolve(args.model.as_deref())?;
    let (loaded, _) = crate::progress::load_model(&model_dir)?;
    let sampler = args.sampling.for_model(sampler, &loaded)?;
    let tok = &loaded.tokenizer;
    let use_chat_template = !args.ignore_chat_template && tok.has_chat_template();
    let prompt_ids = if use_chat_template {
        let mut messages = Vec::new();
        if let Some(system) = &args.system_prompt {
            messages.push(ChatMessage { role: "system".into(), content: system.clone() });
        }
        messages.push(ChatMessage { role: "user".into(), content: raw });
        let text = tok.apply_chat_template(&messages, true)?;
        tok.encode(&text, false)?
    } else {
        tok.encode(&raw, true)?
    };
    if prompt_ids.is_empty() {
        bail!("the prompt encodes to no tokens");
    }

    let config = GenerateConfig {
        max_tokens: Some(args.max_tokens),
        prefill_step_size: args.prefill_step_size,
        sampler,
    };
    let json = args.output == Output::Json;
    let mut out = std::io::stdout().lock();
    if args.verbose && !json {
        writeln!(out, "==========")?;
    }
    mlx::runtime::reset_peak_memory();
    let mut detok = tok.detokenizer();
    let mut tokens = Vec::new();
    let top_k = args.sampling.top_logprobs;
    let want_logprobs = json && (args.sampling.logprobs || top_k > 0);
    let (mut logprobs, mut top_logprobs) = (Vec::new(), Vec::new());
    let mut finish_reason = "length";
    let tic = Instant::now();
    let mut prompt_time = 0.0;
    let mut gen_start = tic;
    let cache = loaded.model.make_cache();
    let generator = Generator::new(loaded.model.as_ref(), &prompt_ids, cache, config)?;
    for step in generator {
        let step = step?;
        if tokens.is_empty() {
            prompt_time = tic.elapsed().as_secs_f64();
            gen_start = Instant::now();
        }
        if loaded.is_eos(step.token) {
            finish_reason = "stop";
            break;
        }
        tokens.push(step.token);
        if want_logprobs {
            let lp = engine::sample::token_logprobs(&step.logprobs, step.token, top_k)?;
            logprobs.push(lp.logprob);
            top_logprobs.push(lp.top);
        }
        detok.add_token(step.token);
        if !json {
            write!(out, "{}", detok.last_segment())?;
            out.flush()?;
        }
    }
    detok.finalize();
    let gen_time = gen_start.elapsed().as_secs_f64();
    if prompt_time == 0.0 {
        prompt_time = tic.elapsed().as_secs_f64();
    }
    let prompt_tps = prompt_ids.len() as f64 / prompt_time.max(1e-9);
    // mlx-lm counts the token that ended generation too, and times from the first token.
    let counted = tokens.len() + usize::from(finish_reason == "stop");
    let generation_tps = if counted > 0 { counted as f64 / gen_time.max(1e-9) } else { 0.0 };
    let peak_memory_gb = mlx::runtime::peak_memory() as f64 / 1e9;
    if json {
        let result = JsonResult {
            text: detok.text().to_owned(),
            generation_tokens: tokens.len(),
            tokens,
            prompt_tokens: prompt_ids.len(),
            prompt_tps,
            generation_tps,
            peak_memory_gb,
            finish_reason,
            logprobs: want_logprobs.then_some(logprobs),
            top_logprobs: (want_logprobs && top_k > 0).then_some(top_logprobs),
        };
        serde_json::to_writer(&mut out, &result)?;
        writeln!(out)?;
        return Ok(());
    }
    write!(out, "{}", detok.last_segment())?;
    writeln!(out)?;
    if args.verbose {
        writeln!(out, "==========")?;
        writeln!(out, "Prompt: {} tokens, {prompt_tps:.3} tokens-per-sec", prompt_ids.len())?;
        writeln!(out, "Generation: {counted} tokens, {generation_tps:.3} tokens-per-sec")?;
        writeln!(out, "Peak memory: {peak_memory_gb:.3} GB")?;
    }
    Ok(())
}
