//! `mlx-gen bench`, the counterpart of `mlx_lm.benchmark`: a random prompt from seed 0, EOS ignored,
//! one warm-up, then timed trials reporting load time, time to first token, prompt and generation
//! tok/s and peak memory, each trial and the median, with mlx-lm's definitions.
use anyhow::{bail, Context, Result};
use engine::{GenerateConfig, Generator, LoadedModel};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Model folder.
    #[arg(long)]
    model: PathBuf,
    /// Prompt length in tokens.
    #[arg(short = 'p', long = "prompt-tokens", default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens to generate per trial.
    #[arg(short = 'g', long = "generation-tokens", default_value_t = 1024)]
    generation_tokens: usize,
    /// Sequences per batch.
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
}

#[derive(Serialize, Clone, Copy, Default)]
struct Trial {
    ttft_s: f64,
    prompt_tps: f64,
    generation_tps: f64,
    peak_memory_gb: f64,
    total_s: f64,
}

#[derive(Serialize)]
struct Report {
    model: String,
    device: String,
    prompt_tokens: usize,
    generation_tokens: usize,
    batch_size: usize,
    load_s: f64,
    trials: Vec<Trial>,
    median: Trial,
}

pub fn run(args: Args, device: &str) -> Result<()> {
    if args.prompt_tokens == 0 || args.generation_tokens == 0 || args.num_trials == 0 {
        bail!("--prompt-tokens, --generation-tokens and --num-trials must each be at least 1");
    }
    if args.batch_size != 1 {
        bail!("--batch-size {} is not supported yet: bench runs one sequence at a time", args.batch_size);
    }
    let t0 = Instant::now();
    let loaded = LoadedModel::load(&args.model).with_context(|| format!("cannot load {}", args.model.display()))?;
    let load_s = t0.elapsed().as_secs_f64();

    // As mlx_lm.benchmark: seed 0, then a uniform random prompt over the vocabulary.
    mlx::random::seed(0)?;
    let vocab = loaded.model.vocab_size() as i64;
    let prompt: Vec<u32> =
        mlx::random::randint(0, vocab, &[1, args.prompt_tokens as i32], mlx::Dtype::I32)?.to_vec::<u32>()?;

    if !args.json {
        eprintln!("Running warmup..");
    }
    trial(&loaded, &prompt, &args)?;
    if !args.json {
        eprintln!(
            "Timing with prompt_tokens={}, generation_tokens={}, batch_size={}.",
            args.prompt_tokens, args.generation_tokens, args.batch_size
        );
    }
    let mut trials = Vec::new();
    for i in 0..args.num_trials {
        let t = trial(&loaded, &prompt, &args)?;
        if !args.json {
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
        ttft_s: median(trials.iter().map(|t| t.ttft_s)),
        prompt_tps: median(trials.iter().map(|t| t.prompt_tps)),
        generation_tps: median(trials.iter().map(|t| t.generation_tps)),
        peak_memory_gb: median(trials.iter().map(|t| t.peak_memory_gb)),
        total_s: median(trials.iter().map(|t| t.total_s)),
    };
    let report = Report {
        model: args.model.display().to_string(),
        device: device.to_owned(),
        prompt_tokens: args.prompt_tokens,
        generation_tokens: args.generation_tokens,
        batch_size: args.batch_size,
        load_s,
        trials,
        median,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "Averages: load_s={:.3}, ttft_s={:.4}, prompt_tps={:.3}, generation_tps={:.3}, peak_memory={:.3}",
            report.load_s, median.ttft_s, median.prompt_tps, median.generation_tps, median.peak_memory_gb
        );
    }
    Ok(())
}

/// One generation of `generation_tokens` tokens, EOS ignored. Peak memory is MLX's since the
/// process started, as mlx-lm reports it.
fn trial(loaded: &LoadedModel, prompt: &[u32], args: &Args) -> Result<Trial> {
    let config = GenerateConfig {
        max_tokens: Some(args.generation_tokens),
        prefill_step_size: args.prefill_step_size,
        ..GenerateConfig::default()
    };
    let tic = Instant::now();
    let mut first = None;
    let mut count = 0usize;
    let generator = Generator::new(loaded.model.as_ref(), prompt, loaded.model.make_cache(), config)?;
    for step in generator {
        step?;
        if first.is_none() {
            first = Some(Instant::now());
        }
        count += 1;
    }
    let end = Instant::now();
    let first = first.unwrap_or(end);
    let ttft_s = (first - tic).as_secs_f64();
    let gen_s = (end - first).as_secs_f64();
    Ok(Trial {
        ttft_s,
        prompt_tps: prompt.len() as f64 / ttft_s.max(1e-9),
        // mlx-lm: tokens generated / time since the first token arrived.
        generation_tps: if gen_s > 0.0 { count as f64 / gen_s } else { 0.0 },
        peak_memory_gb: mlx::runtime::peak_memory() as f64 / 1e9,
        total_s: (end - tic).as_secs_f64(),
    })
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
