//! `mlx-gen generate`: one prompt in, text out, as `mlx_lm.generate` does it (chat template,
//! streaming, statistics), plus `--output json` for programs.
use anyhow::{bail, Context, Result};
use tokenizer::ChatMessage;
use super::cache_prompt::{KvArgs, KvCacheKind};
use super::sampling::SamplingArgs;
use constrain::ConstrainArgs;
use speculative::SpecArgs;
use engine::GenerateConfig;
use serde::Serialize;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Instant;

mod constrain;
pub mod speculative;

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
    #[command(flatten)]
    kv: KvArgs,
    /// Continue from a prompt cache saved by `mlx-gen cache-prompt` (or mlx-lm's cache_prompt): the prompt is
    /// taken as what follows the cached one.
    #[arg(long)]
    prompt_cache_file: Option<PathBuf>,
    /// The KV cache implementation (`paged` gives the same tokens, also with --max-kv-size, where
    /// the window is a ring of blocks; it is there to be measured).
    #[arg(long, value_enum, default_value = "growing")]
    kv_cache: KvCacheKind,
    /// Positions per block of `--kv-cache paged`.
    #[arg(long, default_value_t = super::cache_prompt::DEFAULT_BLOCK_SIZE)]
    kv_block_size: usize,
    #[command(flatten)]
    spec: SpecArgs,
    #[command(flatten)]
    constrain: ConstrainArgs,
    /// Print separators and statistics (prompt and generation tok/s, peak memory) like mlx-lm.
    #[arg(long)]
    verbose: bool,
    /// `text` streams the answer; `json` prints one JSON object at the end.
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
    /// On several ranks (mlx-gen launch): give each rank a contiguous range of layers (pipeline
    /// parallel) instead of a slice of every layer (tensor parallel, the default). No effect alone.
    #[arg(long)]
    pipeline: bool,
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
    /// Reasoning models (`<think>…</think>`): the reasoning, and the answer after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    answer: Option<String>,
    /// Per token (with --logprobs or --top-logprobs): its log-probability.
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<Vec<f32>>,
    /// Per token (with --top-logprobs K): the K most likely [id, logprob], most likely first.
    #[serde(skip_serializing_if = "Option::is_none")]
    top_logprobs: Option<Vec<Vec<(u32, f32)>>>,
    /// With --json-schema, --grammar or --regex: why the grammar ended generation early, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    constraint_note: Option<String>,
    /// With --draft-model or --prompt-lookup: draft tokens proposed to the model, and accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    draft_tokens_proposed: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    draft_tokens_accepted: Option<usize>,
    /// With --draft-model or --prompt-lookup: tokens decoded plainly while speculation did not pay.
    #[serde(skip_serializing_if = "Option::is_none")]
    plain_fallback_tokens: Option<usize>,
}

pub fn run(args: Args) -> Result<()> {
    let sampler = args.sampling.sampler_config()?;
    let raw = if args.prompt == "-" {
        // On several ranks, rank 0 reads standard input and hands the prompt to the others.
        let mut s = String::new();
        if crate::rank::is_leader() {
            std::io::stdin().read_to_string(&mut s).context("cannot read the prompt from standard input")?;
        }
        String::from_utf8(crate::rank::share_from_leader(s.as_bytes())?).context("the prompt is not UTF-8")?
    } else {
        args.prompt.replace("\\n", "\n").replace("\\t", "\t")
    };
    if raw.is_empty() {
        bail!("the prompt is empty: give some text with --prompt (or on standard input with --prompt -)");
    }

    if args.kv_cache == KvCacheKind::Paged && args.prompt_cache_file.is_some() {
        bail!("--kv-cache paged does not combine with --prompt-cache-file (the file's cache is used as saved)");
    }
    // As mlx-lm's main(): a prompt cache file names its model and must agree with the KV flags.
    let loaded_cache = match &args.prompt_cache_file {
        Some(f) => Some(engine::cache::load_prompt_cache(f).with_context(|| format!("cannot read the prompt cache {}", f.display()))?),
        None => None,
    };
    if let Some(q) = loaded_cache.as_ref().and_then(|c| c.cache.first()).and_then(|c| c.quantization()) {
        if args.kv.kv_bits.is_some_and(|b| b != q.bits) {
            bail!("--kv-bits does not match the kv cache loaded from --prompt-cache-file.");
        }
        if args.kv.kv_group_size != q.group_size {
            bail!("--kv-group-size does not match the kv cache loaded from --prompt-cache-file.");
        }
    }
    let model_arg = match (&args.model, loaded_cache.as_ref().and_then(|c| c.get("model"))) {
        (Some(m), Some(cached)) if m.as_os_str() != cached && !same_path(m, cached) => bail!(
            "Providing a different model ({}) than that used to create the prompt cache ({cached}) is an error.",
            m.display()
        ),
        (None, Some(cached)) => Some(PathBuf::from(cached)),
        (m, _) => m.clone(),
    };
    let model_dir = crate::model_arg::resolve(model_arg.as_deref())?;
    let (loaded, _) = crate::rank::load_model(&model_dir, args.pipeline)?;
    if args.spec.draft_model.is_some() && args.prompt_cache_file.is_some() {
        bail!("--prompt-cache-file does not combine with --draft-model (the cache holds the model's prompt only)");
    }
    let constraint = args.constrain.compile(&loaded)?;
    let draft = args.spec.load_draft(&loaded)?;
    let sampler = args.sampling.for_models(sampler, &loaded, draft.as_ref())?;
    let tok = &loaded.tokenizer;
    let use_chat_template = !args.ignore_chat_template && tok.has_chat_template();
    // Whether the template leaves the model inside <think> (R1 distills), for `reasoning`.
    let mut opens_reasoning = false;
    let prompt_ids = if use_chat_template {
        let mut messages = Vec::new();
        if let Some(system) = &args.system_prompt {
            messages.push(ChatMessage { role: "system".into(), content: system.clone() });
        }
        messages.push(ChatMessage { role: "user".into(), content: raw });
        let mut text = tok.apply_chat_template(&messages, true)?;
        opens_reasoning = tokenizer::prompt_opens_reasoning(&text);
        if loaded_cache.is_some() {
            // The prompt is a suffix: the cached prefix ends where the user's message starts.
            if let Some(m) = messages.last_mut() {
                m.content = "<query>".into();
            }
            let test = tok.apply_chat_template(&messages, true)?;
            let at = test.find("<query>").context("the chat template drops the message")?;
            text = text.get(at..).unwrap_or("").to_owned();
        }
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
        kv_quant: args.kv.quant()?,
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
    let cache = match loaded_cache {
        Some(c) => c.cache,
        None => super::cache_prompt::make_cache_with(&loaded, &args.kv, args.kv_cache, args.kv_block_size)?,
    };
    crate::rank::heartbeat("prefill");
    let mut stream = args.spec.stream(loaded.model.as_ref(), draft.as_ref(), &prompt_ids, cache, config, constraint)?;
    stream.set_logprobs_read(want_logprobs);
    for step in stream.by_ref() {
        crate::rank::heartbeat("generation step");
        let (step, _from_draft) = step?;
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
    crate::rank::finished();
    detok.finalize();
    let constraint_note = stream.constraint_note();
    if let (Some(n), false) = (&constraint_note, json) {
        eprintln!("warning: {n}");
    }
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
        let (reasoning, answer) = if tok.has_thinking() {
            match tokenizer::split_reasoning(detok.text(), opens_reasoning) {
                (Some(r), a) => (Some(r), Some(a)),
                (None, _) => (None, None),
            }
        } else {
            (None, None)
        };
        let result = JsonResult {
            reasoning,
            answer,
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
            constraint_note,
            draft_tokens_proposed: stream.stats().map(|s| s.proposed),
            draft_tokens_accepted: stream.stats().map(|s| s.accepted),
            plain_fallback_tokens: stream.stats().map(|s| s.plain_tokens),
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
        if let Some(s) = stream.stats() {
            let rate = 100.0 * s.acceptance_rate();
            writeln!(out, "Draft: {} of {} proposed tokens accepted ({rate:.1}%), {} verify passes", s.accepted, s.proposed, s.rounds)?;
        }
        writeln!(out, "Peak memory: {peak_memory_gb:.3} GB")?;
    }
    Ok(())
}

/// Whether `a` and `b` name the same existing folder or file.
fn same_path(a: &std::path::Path, b: &str) -> bool {
    match (a.canonicalize(), std::path::Path::new(b).canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}
