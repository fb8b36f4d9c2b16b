//! The host's cost of building one decode step's graph, without evaluating it: what a token costs
//! the host on a GPU before MLX queues anything (the trace's `graph`), measured on any machine.
//! `cargo run --release -p engine --example graph_cost -- MODEL [--fused] [--steps N] [--rounds R]`.
//! The prompt (32 tokens) is run and evaluated first; then each timed step builds the forward pass
//! of one more token over that cache and the greedy token after it, and trims the cache back (an
//! offset change), N steps a round (default 200, 5 rounds). Prints microseconds a step per round,
//! their median, and the step's primitives (from `export_to_dot`) with the microseconds per primitive.
use engine::LoadedModel;
use mlx::Array;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: graph_cost MODEL [--fused] [--steps N] [--rounds R]";
    let dir = args.first().filter(|d| !d.starts_with("--")).ok_or(usage)?;
    let (mut steps, mut rounds) = (200usize, 5usize);
    let mut rest = args[1..].iter();
    while let Some(a) = rest.next() {
        match a.as_str() {
            "--fused" => engine::nn::set_fused_projections(true),
            "--steps" => steps = rest.next().ok_or(usage)?.parse()?,
            "--rounds" => rounds = rest.next().ok_or(usage)?.parse()?,
            _ => return Err(format!("unknown argument {a:?}; {usage}").into()),
        }
    }
    let m = LoadedModel::load(std::path::Path::new(dir))?;
    let mut cache = m.model.make_cache();
    let prompt: Vec<i32> = (0..32).map(|t| (t * 31) % 200 + 1).collect();
    let logits = m.model.forward(&Array::from_slice(&prompt, &[1, 32])?, &mut cache)?;
    let mut state: Vec<&Array> = vec![&logits];
    let cache_state: Vec<Array> = cache.iter().flat_map(|c| c.state()).collect();
    state.extend(cache_state.iter());
    mlx::eval(&state)?;
    let token = Array::from_slice(&[7i32], &[1, 1])?;
    let step = |cache: &mut Vec<Box<dyn engine::cache::KvCache>>| -> Result<Array, Box<dyn std::error::Error>> {
        let logits = m.model.forward(&token, cache)?; // (1, 1, vocab)
        let next = logits.reshape(&[1, -1])?.argmax(-1, false)?; // (1,)
        for c in cache.iter_mut() {
            c.trim(1)?;
        }
        Ok(next)
    };
    let dot = std::env::temp_dir().join(format!("graph_cost_{}.dot", std::process::id()));
    let one = step(&mut cache)?;
    mlx::export_to_dot(&[&one], dot.to_str().ok_or("temp path")?)?;
    let text = std::fs::read_to_string(&dot)?;
    let _ = std::fs::remove_file(&dot);
    let primitives = text.lines().filter(|l| l.contains("shape=rectangle")).count();
    let mut per_round = Vec::new();
    for r in 0..rounds {
        let t0 = Instant::now();
        for _ in 0..steps {
            std::hint::black_box(step(&mut cache)?);
        }
        let us = 1e6 * t0.elapsed().as_secs_f64() / steps as f64;
        println!("round {}: {us:.1} us a step", r + 1);
        per_round.push(us);
    }
    per_round.sort_by(f64::total_cmp);
    let median = per_round[per_round.len() / 2];
    println!("median {median:.1} us a step; {primitives} primitives in the step's graph, {:.2} us a primitive", median / primitives as f64);
    Ok(())
}
