//! Host and device time of one continuous-batching step against the batch size, for a model
//! folder: `cargo run --release -p engine --example batch_step_cost -- MODEL [B...]`.
//! Every sequence gets a different prompt length (so rows are padded, as in a server). With
//! `MLX_GEN_TRACE` set, each line adds the steps' stage split.
//!
//! `batch_step_cost MODEL --prefill ROWSxLEN[@STEP]...`: the newcomers' prefill alone: ROWS prompts
//! of LEN tokens (each its own tokens) added at once and stepped until every one is decoding, with
//! a per-step budget of STEP padded positions (default 512, `serve --prefill-step-size`); three
//! trials, the first meeting the shapes' first-use costs. Prints prompt tok/s, forwards and the
//! steps' stage split (`MLX_GEN_TRACE`).
use engine::batch::{BatchEngine, SeqParams};
use engine::{LoadedModel, SamplerConfig};
use std::time::Instant;

fn params() -> SeqParams {
    SeqParams { sampler: SamplerConfig::default(), keys: None, logprobs: false }
}

/// One prefill case "ROWSxLEN[@STEP]".
fn prefill_case(m: &LoadedModel, case: &str) -> Result<(), Box<dyn std::error::Error>> {
    let (shape, step) = case.split_once('@').unwrap_or((case, "512"));
    let (rows, len) = shape.split_once('x').ok_or("a prefill case is ROWSxLEN[@STEP]")?;
    let (rows, len, step): (usize, usize, usize) = (rows.parse()?, len.parse()?, step.parse()?);
    let vocab = m.model.vocab_size() as u32;
    for trial in 0..3u32 {
        let mut engine = BatchEngine::new(m.model.as_ref(), step, None);
        for i in 0..rows {
            let salt = (trial as usize * rows + i) as u32;
            let prompt: Vec<u32> = (0..len as u32).map(|t| (t * 31 + salt * 17 + 1) % (vocab - 1) + 1).collect();
            engine.add(i as u64, prompt, params())?;
        }
        let _ = engine.take_trace();
        let t0 = Instant::now();
        let mut steps = 0;
        while engine.len().1 > 0 {
            engine.step()?;
            steps += 1;
        }
        engine.step()?; // every first token read
        let dt = t0.elapsed().as_secs_f64();
        let trace = engine.take_trace().map(|t| format!("; {}", t.summary())).unwrap_or_default();
        println!(
            "prefill {rows}x{len} step {step} trial {trial}: {:.1} ms, {:.0} prompt tok/s, {steps} steps{trace}",
            1e3 * dt,
            (rows * len) as f64 / dt
        );
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: batch_step_cost MODEL [B...] | MODEL --prefill ROWSxLEN[@STEP]...")?;
    let rest: Vec<String> = args.collect();
    if mlx::runtime::gpu_available() {
        // As `mlx-gen serve` on a GPU (its default prefill chunk): masked and multi-position
        // attention composed of plain operations (see engine::nn::sdpa).
        mlx::runtime::set_env_default("MLX_MAX_OPS_PER_BUFFER", "80")?;
        engine::nn::sdpa::set_composed_max(512);
    }
    let m = LoadedModel::load(std::path::Path::new(&dir))?;
    if rest.first().map(String::as_str) == Some("--prefill") {
        for case in &rest[1..] {
            prefill_case(&m, case)?;
        }
        return Ok(());
    }
    let sizes: Vec<usize> = rest.iter().map(|a| a.parse()).collect::<Result<_, _>>()?;
    for b in if sizes.is_empty() { vec![1, 8, 32] } else { sizes } {
        let mut engine = BatchEngine::new(m.model.as_ref(), 4096, None);
        for i in 0..b {
            let prompt: Vec<u32> = (0..(20 + 7 * i) as u32).map(|t| (t * 31 + i as u32) % 200 + 1).collect();
            engine.add(i as u64, prompt, params())?;
        }
        for _ in 0..8 {
            engine.step()?; // prefill, join, warm up
        }
        let _ = engine.take_trace();
        let t0 = Instant::now();
        let steps = 64;
        for _ in 0..steps {
            engine.step()?;
        }
        let dt = t0.elapsed().as_secs_f64() / f64::from(steps);
        let trace = engine.take_trace().map(|t| format!("; {}", t.summary())).unwrap_or_default();
        println!("batch {b:3}: {:.2} ms per step, {:.0} tok/s{trace}", 1e3 * dt, b as f64 / dt);
    }
    Ok(())
}
