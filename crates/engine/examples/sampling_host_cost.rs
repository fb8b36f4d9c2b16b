//! Host-side cost of the full sampler stack per token for a 150k vocabulary: the time to build (not evaluate) the processors' and sampler's MLX graph, as the generator does each step.
//!
//! `cargo run --release -p engine --example sampling_host_cost [VOCAB] [ITERS]`; prints microseconds
//! per token, to compare with the decode time per token (scripts/bench/sampling_overhead.sh).
use engine::sample::processors::extend_history;
use engine::sample::LogitsProcessors;
use engine::SamplerConfig;
use mlx::{random, Array, Dtype};
use std::time::Instant;

fn main() -> engine::Result<()> {
    let mut a = std::env::args().skip(1);
    let vocab: i32 = a.next().and_then(|s| s.parse().ok()).unwrap_or(151_936);
    let iters: u32 = a.next().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let full = SamplerConfig {
        temp: 0.8,
        top_p: 0.95,
        min_p: 0.02,
        min_tokens_to_keep: 3,
        top_k: 40,
        xtc_probability: 0.5,
        xtc_threshold: 0.1,
        xtc_special_tokens: vec![198, 151_643, 151_645],
        processors: LogitsProcessors {
            logit_bias: vec![(9, 1.5), (42, -2.0)],
            repetition_penalty: Some(1.1),
            presence_penalty: Some(0.2),
            frequency_penalty: Some(0.1),
            ..LogitsProcessors::default()
        },
    };
    let greedy = SamplerConfig::default();
    let samplers_only = SamplerConfig { processors: LogitsProcessors::default(), ..full.clone() };
    random::seed(0)?;
    let logits = random::uniform(&[1, vocab], Dtype::F32)?.mul_scalar(20.0)?.astype(Dtype::BF16)?;
    let prompt: Vec<i32> = (0..64).map(|i| (i * 7919) % vocab).collect();
    let prompt = Array::from_slice(&prompt, &[64])?;
    logits.eval()?;
    for (name, cfg) in [("greedy (argmax only)", &greedy), ("samplers only", &samplers_only), ("full stack", &full)] {
        let keep = cfg.processors.history_needed();
        let mut history = Some(prompt.clone());
        let mut y = Array::from_slice(&[1i32], &[1])?;
        let tic = Instant::now();
        for _ in 0..iters {
            // What Generator::step does on the host after the forward pass.
            let mut l = logits.clone();
            if !cfg.processors.is_empty() {
                history = Some(extend_history(history.take(), &y, keep)?);
                l = cfg.processors.apply(history.as_ref(), &l)?;
            }
            let lp = l.sub(&l.logsumexp(&[], true)?)?;
            y = cfg.sample(&lp)?;
        }
        let us = tic.elapsed().as_secs_f64() * 1e6 / f64::from(iters);
        println!("{name}: {us:.1} us of host work per token (graph building, vocab {vocab})");
    }
    Ok(())
}
