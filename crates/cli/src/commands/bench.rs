//! `mlx-gen bench`, the counterpart of `mlx_lm.benchmark`: a random prompt from seed 0, EOS ignored,
//! one warm-up, then timed trials reporting load time, time to first token, prompt and generation
//! tok/s and peak memory, each trial and the median, with mlx-lm's definitions; `-b N` runs N equal-length random
//! prompts as one batch with greedy decoding, as mlx-lm's `batch_generate` measures it (tok/s summed over the batch).
//! On several ranks (`mlx-gen launch -- bench`, `--pipeline` as mlx-lm's) every rank runs the same
//! trials on the same prompt; rank 0 reports. With `--draft-model` or `--prompt-lookup` every trial
//! is a plain generation and a speculative one, alternating, and the report adds the speculative
//! run's decode rate, its ratio to plain in the same trials, the acceptance rate, tokens and time
//! per round (`--prompt-file` gives a real text, through the chat template, for prompt lookup).
//! Loading is reported beside the trials: its time, the weights' bytes, how many tensors MLX uses
//! in place in the mapped files, and the process's resident memory (VmRSS) after load and after the
//! trials (mapped weight pages count once touched). `--memory` adds one trial measured phase by
//! phase (see `memory.rs`).
mod memory;

use super::generate::speculative::SpecArgs;
use anyhow::{bail, Context, Result};
use engine::{GenerateConfig, Generator, LoadedModel, SpecStats};
use mlx::Array;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Model folder or .gguf file (default: SmolLM2-135M-Instruct, fetched on first use).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt length in tokens.
    #[arg(short = 'p', long = "prompt-tokens", default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens to generate per trial.
    #[arg(short = 'g', long = "generation-tokens", default_value_t = 1024)]
    generation_tokens: usize,
    /// Sequences per batch (greedy decoding of equal-length random prompts when more than 1).
    #[arg(short = 'b', long = "batch-size", default_value_t = 1)]
    batch_size: usize,
    /// Timed trials (after one warm-up).
    #[arg(short = 'n', long = "num-trials", default_value_t = 5)]
    num_trials: usize,
    /// Prompt tokens per prefill step.
    #[arg(long, default_value_t = 2048)]
    prefill_step_size: usize,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Also time every inter-token interval of one extra single-sequence trial and report p50,
    /// p99 and max (token pacing).
    #[arg(long)]
    pacing: bool,
    /// Also measure one extra single-sequence trial phase by phase: the model's resident bytes,
    /// and for prefill and decode the peak, the KV cache's bytes and the transient rest.
    #[arg(long)]
    memory: bool,
    /// KV cache of single-sequence trials: `paged` measures the block-pool cache against the default.
    #[arg(long, value_enum, default_value = "growing")]
    kv_cache: super::cache_prompt::KvCacheKind,
    /// On several ranks (mlx-gen launch): pipeline parallel instead of tensor parallel.
    #[arg(long)]
    pipeline: bool,
    /// The prompt: this file's text through the chat template (when the model has one) instead of
    /// random tokens (`--prompt-tokens` is then the text's length).
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    #[command(flatten)]
    spec: SpecArgs,
}

/// The speculative run of the trials, beside the plain one.
#[derive(Serialize)]
struct SpecReport {
    trials: Vec<SpecTrial>,
    /// Medians: speculative decode tok/s, its ratio to plain decoding in the same trial, and the
    /// draft statistics.
    generation_tps: f64,
    speedup: f64,
    acceptance: f64,
    tokens_per_round: f64,
    ms_per_round: f64,
}

#[derive(Serialize, Clone, Copy)]
struct SpecTrial {
    generation_tps: f64,
    speedup: f64,
    stats: SpecStats,
}

/// Inter-token intervals of one trial, in milliseconds.
#[derive(Serialize)]
struct Pacing {
    tokens: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// The longest intervals, in token order: (index of the token the interval ended with, ms);
    /// whether they recur every 256 tokens (the KV cache's growth step, MLX's buffer cache cleared)
    /// or fall anywhere says where to look.
    slowest: Vec<(usize, f64)>,
    /// With `MLX_GEN_TRACE`: for each of `slowest`, the host's ms on that token building the next
    /// step's graph, MLX queueing it, and waiting for the token (a host stall or the device's).
    #[serde(skip_serializing_if = "Option::is_none")]
    slowest_split: Option<Vec<[f64; 3]>>,
}

/// How many of the longest intervals [`Pacing`] lists.
const SLOWEST: usize = 12;

#[derive(Serialize, Clone, Copy, Default)]
struct Trial {
    /// Model load time: the same in every trial (the model is loaded once).
    load_s: f64,
    ttft_s: f64,
    prompt_tps: f64,
    generation_tps: f64,
    peak_memory_gb: f64,
    total_s: f64,
}

/// What loading cost in memory, beside its time.
#[derive(Serialize)]
struct LoadReport {
    /// Bytes of tensor data in the checkpoint's files.
    weights_bytes: u64,
    /// Tensors MLX uses in place in the mapped files, and tensors copied once.
    tensors_in_place: usize,
    tensors_copied: usize,
    /// Resident memory (VmRSS) right after load and after the trials, bytes (0 where the OS has no
    /// /proc/self/status).
    rss_after_load_bytes: u64,
    rss_after_trials_bytes: u64,
    /// MLX's peak (with the in-place weights) over the load alone: fused projections, converted
    /// tensors and other load-time transients show here, before any trial.
    peak_during_load_bytes: u64,
}

/// This process's resident memory in bytes (VmRSS of /proc/self/status), 0 where unavailable.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    kb.unwrap_or(0) * 1024
}

#[derive(Serialize)]
struct Report {
    model: String,
    device: String,
    prompt_tokens: usize,
    generation_tokens: usize,
    batch_size: usize,
    load_s: f64,
    load: LoadReport,
    trials: Vec<Trial>,
    median: Trial,
    #[serde(skip_serializing_if = "Option::is_none")]
    pacing: Option<Pacing>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<memory::Breakdown>,
    #[serde(skip_serializing_if = "Option::is_none")]
    speculative: Option<SpecReport>,
}

pub fn run(args: Args, device: &str) -> Result<()> {
    if args.prompt_tokens == 0 || args.generation_tokens == 0 || args.num_trials == 0 || args.batch_size == 0 {
        bail!("--prompt-tokens, --generation-tokens, --batch-size and --num-trials must each be at least 1");
    }
    if args.prefill_step_size == 0 {
        bail!("--prefill-step-size must be at least 1");
    }
    let model_dir = crate::model_arg::resolve(args.model.as_deref())?;
    let (loaded, load_s) = crate::rank::load_model(&model_dir, args.pipeline)?;
    let rss_after_load = resident_bytes();
    let peak_during_load = mlx::runtime::peak_memory() as u64;
    // On several ranks rank 0 alone reports (the others run the same trials silently).
    let leader = crate::rank::is_leader();
    let table = !args.json && leader;

    if args.spec.enabled() && (args.batch_size > 1 || args.pacing || args.memory || crate::rank::group().is_some()) {
        bail!("--draft-model and --prompt-lookup are benchmarked for one sequence in one process (not with -b, --pacing, --memory or launch)");
    }
    if args.memory && args.batch_size > 1 {
        bail!("--memory measures one sequence: it does not combine with -b");
    }
    let draft = args.spec.load_draft(&loaded)?;
    let prompt = bench_prompt(&loaded, &args)?;
    let prompt_tokens = prompt.len() / args.batch_size;

    if table {
        eprintln!("Running warmup..");
    }
    trial(&loaded, &prompt, &args)?;
    if let Some(d) = &draft {
        spec_trial(&loaded, Some(d), &prompt, &args)?;
    } else if args.spec.enabled() {
        spec_trial(&loaded, None, &prompt, &args)?;
    }
    if table {
        eprintln!(
            "Timing with prompt_tokens={}, generation_tokens={}, batch_size={}.",
            prompt_tokens, args.generation_tokens, args.batch_size
        );
    }
    let mut trials = Vec::new();
    let mut spec_trials = Vec::new();
    for i in 0..args.num_trials {
        let t = Trial { load_s, ..trial(&loaded, &prompt, &args)? };
        if args.spec.enabled() {
            let (tps, stats) = spec_trial(&loaded, draft.as_ref(), &prompt, &args)?;
            let st = SpecTrial { generation_tps: tps, speedup: tps / t.generation_tps.max(1e-9), stats };
            if table {
                println!(
                    "Trial {} speculative: generation_tps={:.3} ({:.2}x plain), acceptance={:.1}%, tokens/round={:.2}, ms/round={:.3}, plain tokens={}",
                    i + 1,
                    tps,
                    st.speedup,
                    100.0 * stats.acceptance_rate(),
                    stats.tokens_per_round(),
                    stats.ms_per_round(),
                    stats.plain_tokens
                );
            }
            spec_trials.push(st);
        }
        if table {
            println!(
                "Trial {}:  ttft_s={:.4}, prompt_tps={:.3}, generation_tps={:.3}, peak_memory={:.3}, total_time={:.3}",
                i + 1,
                t.ttft_s,
                t.prompt_tps,
                t.generation_tps,
                t.peak_memory_gb,
                t.total_s
            );
        }
        trials.push(t);
    }
    let median = Trial {
        load_s,
        ttft_s: median(trials.iter().map(|t| t.ttft_s)),
        prompt_tps: median(trials.iter().map(|t| t.prompt_tps)),
        generation_tps: median(trials.iter().map(|t| t.generation_tps)),
        peak_memory_gb: median(trials.iter().map(|t| t.peak_memory_gb)),
        total_s: median(trials.iter().map(|t| t.total_s)),
    };
    let pacing = if args.pacing { Some(pacing(&loaded, &prompt[..prompt_tokens], &args)?) } else { None };
    let memory = if args.memory {
        let cache = super::cache_prompt::make_cache(&loaded, &plain_kv(), args.kv_cache)?;
        Some(memory::breakdown(&loaded, &prompt[..prompt_tokens], cache, config_of(&args))?)
    } else {
        None
    };
    let speculative = (!spec_trials.is_empty()).then(|| SpecReport {
        generation_tps: self::median(spec_trials.iter().map(|t| t.generation_tps)),
        speedup: self::median(spec_trials.iter().map(|t| t.speedup)),
        acceptance: self::median(spec_trials.iter().map(|t| t.stats.acceptance_rate())),
        tokens_per_round: self::median(spec_trials.iter().map(|t| t.stats.tokens_per_round())),
        ms_per_round: self::median(spec_trials.iter().map(|t| t.stats.ms_per_round())),
        trials: spec_trials,
    });
    crate::rank::finished();
    if !leader {
        return Ok(());
    }
    let load = LoadReport {
        weights_bytes: loaded.weights.bytes,
        tensors_in_place: loaded.weights.in_place,
        tensors_copied: loaded.weights.copied,
        rss_after_load_bytes: rss_after_load,
        rss_after_trials_bytes: resident_bytes(),
        peak_during_load_bytes: peak_during_load,
    };
    let report = Report {
        load,
        pacing,
        memory,
        model: model_dir.display().to_string(),
        device: device.to_owned(),
        prompt_tokens,
        generation_tokens: args.generation_tokens,
        batch_size: args.batch_size,
        load_s,
        trials,
        median,
        speculative,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "Averages: load_s={:.3}, ttft_s={:.4}, prompt_tps={:.3}, generation_tps={:.3}, peak_memory={:.3}",
            report.load_s, median.ttft_s, median.prompt_tps, median.generation_tps, median.peak_memory_gb
        );
        let mb = |b: u64| b as f64 / 1e6;
        println!(
            "Load: weights={:.1} MB ({} tensors in place, {} copied), peak={:.1} MB, rss_after_load={:.1} MB, rss_after_trials={:.1} MB",
            mb(report.load.weights_bytes),
            report.load.tensors_in_place,
            report.load.tensors_copied,
            mb(report.load.peak_during_load_bytes),
            mb(report.load.rss_after_load_bytes),
            mb(report.load.rss_after_trials_bytes)
        );
        if let Some(m) = &report.memory {
            println!("{}", memory::line(m));
        }
        if let Some(p) = &report.pacing {
            let slow: Vec<String> = p
                .slowest
                .iter()
                .enumerate()
                .map(|(k, (i, ms))| match p.slowest_split.as_ref().and_then(|s| s.get(k)) {
                    Some([g, q, w]) => format!("{i} ({ms:.2}: graph {g:.2}, queue {q:.2}, wait {w:.2})"),
                    None => format!("{i} ({ms:.2})"),
                })
                .collect();
            println!(
                "Pacing: {} tokens, inter-token p50={:.3} ms, p99={:.3} ms ({:.2}x p50), max={:.3} ms; slowest at tokens (ms): {}",
                p.tokens,
                p.p50_ms,
                p.p99_ms,
                p.p99_ms / p.p50_ms.max(1e-9),
                p.max_ms,
                slow.join(", ")
            );
        }
        if let Some(s) = &report.speculative {
            println!(
                "Speculative: generation_tps={:.3} ({:.2}x plain), acceptance={:.1}%, tokens/round={:.2}, ms/round={:.3}",
                s.generation_tps,
                s.speedup,
                100.0 * s.acceptance,
                s.tokens_per_round,
                s.ms_per_round
            );
        }
    }
    Ok(())
}

/// `--prompt-file`'s text through the chat template (raw when the model has none), else as
/// mlx_lm.benchmark: seed 0, then a uniform random (batch, prompt_tokens) prompt over the vocabulary.
fn bench_prompt(loaded: &LoadedModel, args: &Args) -> Result<Vec<u32>> {
    if let Some(path) = &args.prompt_file {
        if args.batch_size > 1 {
            bail!("--prompt-file gives one prompt: it does not combine with -b");
        }
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read --prompt-file {}", path.display()))?;
        let tok = &loaded.tokenizer;
        let ids = if tok.has_chat_template() {
            let messages = [tokenizer::ChatMessage::new("user", text)];
            tok.encode(&tok.apply_chat_template(&messages, true)?, false)?
        } else {
            tok.encode(&text, true)?
        };
        if ids.is_empty() {
            bail!("--prompt-file {} encodes to no tokens", path.display());
        }
        return Ok(ids);
    }
    mlx::random::seed(0)?;
    let vocab = loaded.model.vocab_size() as i64;
    let shape = [args.batch_size as i32, args.prompt_tokens as i32];
    Ok(mlx::random::randint(0, vocab, &shape, mlx::Dtype::I32)?.to_vec::<u32>()?)
}

/// One speculative generation of `generation_tokens` tokens, greedy, EOS ignored: its decode
/// tok/s (as the plain trial counts it) and its draft statistics.
fn spec_trial(loaded: &LoadedModel, draft: Option<&LoadedModel>, prompt: &[u32], args: &Args) -> Result<(f64, SpecStats)> {
    let config = config_of(args);
    let model = loaded.model.as_ref();
    let mut stream = args.spec.stream(model, draft, prompt, model.make_cache(), config, None)?;
    let tic = Instant::now();
    let mut first = None;
    let mut count = 0usize;
    for step in stream.by_ref() {
        step?;
        if first.is_none() {
            first = Some(Instant::now());
        }
        count += 1;
    }
    let end = Instant::now();
    let t = timing(prompt.len(), count, tic, first.unwrap_or(end), end);
    Ok((t.generation_tps, stream.stats().unwrap_or_default()))
}

/// The intervals between consecutive tokens of one generation (after the first token); with
/// `MLX_GEN_TRACE`, the slowest ones' host stages too.
fn pacing(loaded: &LoadedModel, prompt: &[u32], args: &Args) -> Result<Pacing> {
    let config = config_of(args);
    let mut marks = Vec::with_capacity(args.generation_tokens);
    let mut times = Vec::with_capacity(args.generation_tokens);
    crate::rank::heartbeat("prefill");
    let mut generator = Generator::new(loaded.model.as_ref(), prompt, loaded.model.make_cache(), config)?;
    while let Some(step) = generator.next() {
        step?;
        crate::rank::heartbeat("generation step");
        marks.push(Instant::now());
        times.extend(generator.step_times());
    }
    let intervals: Vec<(usize, f64)> = marks.windows(2).enumerate().map(|(i, w)| (i + 1, (w[1] - w[0]).as_secs_f64() * 1e3)).collect();
    let mut ms: Vec<f64> = intervals.iter().map(|&(_, d)| d).collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| ms.get(((ms.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
    let mut slowest = intervals;
    slowest.sort_by(|a, b| b.1.total_cmp(&a.1));
    slowest.truncate(SLOWEST);
    slowest.sort_by_key(|&(i, _)| i);
    // Token i's stages: the trace's totals after it less those after token i - 1.
    let slowest_split = (times.len() == marks.len()).then(|| {
        slowest.iter().map(|&(i, _)| [times[i].graph - times[i - 1].graph, times[i].queue - times[i - 1].queue, times[i].wait - times[i - 1].wait].map(|s| s * 1e3)).collect()
    });
    Ok(Pacing { tokens: marks.len(), p50_ms: at(0.5), p99_ms: at(0.99), max_ms: ms.last().copied().unwrap_or(0.0), slowest, slowest_split })
}

/// One generation of `generation_tokens` tokens (per sequence), EOS ignored. Peak memory is MLX's
/// since the process started, as mlx-lm reports it.
fn trial(loaded: &LoadedModel, prompt: &[u32], args: &Args) -> Result<Trial> {
    if args.batch_size > 1 {
        return batch_trial(loaded, prompt, args);
    }
    let config = config_of(args);
    let tic = Instant::now();
    let mut first = None;
    let mut count = 0usize;
    let cache = super::cache_prompt::make_cache(loaded, &plain_kv(), args.kv_cache)?;
    crate::rank::heartbeat("prefill");
    let generator = Generator::new(loaded.model.as_ref(), prompt, cache, config)?;
    for step in generator {
        step?;
        crate::rank::heartbeat("generation step");
        if first.is_none() {
            first = Some(Instant::now());
        }
        count += 1;
    }
    let end = Instant::now();
    let first = first.unwrap_or(end);
    Ok(timing(prompt.len(), count, tic, first, end))
}

/// mlx-lm's figures: prompt tokens / time to the first token(s), tokens generated / time since they arrived.
fn timing(prompt_tokens: usize, generated: usize, tic: Instant, first: Instant, end: Instant) -> Trial {
    let ttft_s = (first - tic).as_secs_f64();
    let gen_s = (end - first).as_secs_f64();
    Trial {
        load_s: 0.0,
        ttft_s,
        prompt_tps: prompt_tokens as f64 / ttft_s.max(1e-9),
        generation_tps: if gen_s > 0.0 { generated as f64 / gen_s } else { 0.0 },
        peak_memory_gb: mlx::runtime::peak_memory() as f64 / 1e9,
        total_s: (end - tic).as_secs_f64(),
    }
}

/// Greedy decoding of the (batch, prompt_tokens) prompts at once: prefill in chunks, then one (batch, 1) step per
/// token, each queued before the previous one is read, as the single-sequence generator does.
fn batch_trial(loaded: &LoadedModel, prompt: &[u32], args: &Args) -> Result<Trial> {
    let (b, p) = (args.batch_size as i32, args.prompt_tokens as i32);
    let model = loaded.model.as_ref();
    let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let tic = Instant::now();
    let mut cache = model.make_cache();
    let all = Array::from_slice(&ids, &[b, p])?;
    crate::rank::heartbeat("prefill");
    let last = engine::prefill::prefill(model, &mut cache, &all, args.prefill_step_size, None, |_| Ok(()))?; // (B, 1)
    let greedy = |input: &Array, cache: &mut Vec<Box<dyn engine::cache::KvCache>>| -> Result<Array> {
        let logits = model.forward(input, cache)?; // (B, L, vocab)
        Ok(logits.slice_axis(1, -1, i32::MAX)?.argmax(-1, false)?) // (B, 1)
    };
    let mut y = greedy(&last, &mut cache)?;
    y.eval()?;
    let first = Instant::now();
    for i in 1..args.generation_tokens {
        let next = greedy(&y, &mut cache)?;
        mlx::async_eval(&[&next])?;
        crate::rank::heartbeat("generation step");
        y.to_vec::<u32>()?; // the host reads each step's tokens, as a generator hands them out
        y = next;
        if i % 256 == 0 {
            engine::prefill::clear_buffer_cache();
        }
    }
    y.to_vec::<u32>()?;
    let end = Instant::now();
    let n = args.batch_size;
    Ok(timing(prompt.len(), n * args.generation_tokens, tic, first, end))
}

/// A trial's generation settings: `generation_tokens` greedy tokens, EOS ignored.
fn config_of(args: &Args) -> GenerateConfig {
    GenerateConfig { max_tokens: Some(args.generation_tokens), prefill_step_size: args.prefill_step_size, ..GenerateConfig::default() }
}

/// A full-precision cache without a size limit (the trials' and mlx_lm.benchmark's).
fn plain_kv() -> super::cache_prompt::KvArgs {
    super::cache_prompt::KvArgs { max_kv_size: None, kv_bits: None, kv_group_size: 64, quantized_kv_start: 0 }
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
