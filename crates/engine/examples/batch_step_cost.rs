//! Host and device time of one continuous-batching step against the batch size, for a model
//! folder: `cargo run --release -p engine --example batch_step_cost -- MODEL [B...]`.
//! Every sequence gets a different prompt length (so rows are padded, as in a server).
use engine::batch::{BatchEngine, SeqParams};
use engine::{LoadedModel, SamplerConfig};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: batch_step_cost MODEL [B...]")?;
    let sizes: Vec<usize> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    if mlx::runtime::gpu_available() {
        // As `mlx-gen serve` on a GPU (its default prefill chunk): masked and multi-position
        // attention composed of plain operations (see engine::nn::sdpa).
        mlx::runtime::set_env_default("MLX_MAX_OPS_PER_BUFFER", "80")?;
        engine::nn::sdpa::set_composed_max(512);
    }
    let m = LoadedModel::load(std::path::Path::new(&dir))?;
    for b in if sizes.is_empty() { vec![1, 8, 32] } else { sizes } {
        let mut engine = BatchEngine::new(m.model.as_ref(), 4096, None);
        for i in 0..b {
            let prompt: Vec<u32> = (0..(20 + 7 * i) as u32).map(|t| (t * 31 + i as u32) % 200 + 1).collect();
            engine.add(i as u64, prompt, SeqParams { sampler: SamplerConfig::default(), keys: None, logprobs: false })?;
        }
        for _ in 0..8 {
            engine.step()?; // prefill, join, warm up
        }
        let t0 = Instant::now();
        let steps = 64;
        for _ in 0..steps {
            engine.step()?;
        }
        let dt = t0.elapsed().as_secs_f64() / f64::from(steps);
        println!("batch {b:3}: {:.2} ms per step, {:.0} tok/s", 1e3 * dt, b as f64 / dt);
    }
    Ok(())
}
