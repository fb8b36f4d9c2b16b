//! Decode speed of the batch engine (what `serve` steps) with every row constrained by a JSON
//! schema against the same rows free: issue 21's "within 5% at 8 concurrent constrained streams"
//! without the server's prompts and prefill in the measurement (on a CPU their prefill would be
//! most of the run).
//!
//! `cargo run --release -p server --example constrained_batch_cost -- MODEL_DIR [ROWS] [TOKENS] [ROUNDS]`
//! (defaults 8, 64, 3). MODEL_DIR holds the model and its `tokenizer.json` (the mask's cost grows
//! with the vocabulary: use a real one, e.g. Qwen2.5's 151k ids). Each round runs free then
//! constrained: ROWS greedy sequences with short prompts of their own added at once, stepped until
//! each has its first token (the prefill, not timed), then TOKENS steps timed. The schema keeps a
//! row inside a free JSON string (the widest masks); a row that ends (EOS) is finished and the
//! rows still decoding are printed. Prints each run's decode tok/s, the medians, their ratio and,
//! with `MLX_GEN_TRACE`, the timed steps' stage split.
use engine::batch::{BatchEngine, SeqParams};
use engine::sample::TokenConstraint;
use engine::{LoadedModel, SamplerConfig};
use server::constrain::{Constraints, Grammar};
use std::time::Instant;

/// One run: (decode tok/s, rows decoding at the end, the timed steps' trace).
fn run(m: &LoadedModel, cs: Option<&Constraints>, rows: usize, tokens: usize, salt: usize) -> Result<(f64, usize, String), Box<dyn std::error::Error>> {
    let schema = serde_json::json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]});
    let vocab = m.model.vocab_size() as usize;
    let mut engine = BatchEngine::new(m.model.as_ref(), 512, None);
    for i in 0..rows {
        // Prompts of 12-19 tokens, each its own (rows padded as a server's are).
        let prompt: Vec<u32> = (0..12 + i % 8).map(|t| ((t * 31 + (salt * rows + i) * 17 + 1) % (vocab - 1) + 1) as u32).collect();
        let params = SeqParams { sampler: SamplerConfig::default(), keys: None, logprobs: false };
        let constraint = cs.map(|c| c.compile(&Grammar::JsonSchema(schema.clone())).map(|g| Box::new(g) as Box<dyn TokenConstraint>)).transpose()?;
        engine.add_constrained(i as u64, prompt, params, constraint)?;
    }
    let mut counts = vec![0usize; rows];
    let mut live = rows;
    let step = |engine: &mut BatchEngine, counts: &mut [usize], live: &mut usize| -> Result<usize, Box<dyn std::error::Error>> {
        let out = engine.step()?;
        for t in &out {
            counts[t.id as usize] += 1;
            if m.eos_token_ids.contains(&t.token) {
                engine.finish(t.id);
                *live -= 1;
            }
        }
        Ok(out.len())
    };
    // The prefill: until every row has handed out its first token.
    while counts.contains(&0) {
        step(&mut engine, &mut counts, &mut live)?;
    }
    let _ = engine.take_trace();
    let t0 = Instant::now();
    let mut n = 0;
    for _ in 0..tokens {
        if live == 0 {
            break;
        }
        n += step(&mut engine, &mut counts, &mut live)?;
    }
    let dt = t0.elapsed().as_secs_f64();
    let trace = engine.take_trace().map(|t| t.summary()).unwrap_or_default();
    Ok((n as f64 / dt, live, trace))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: constrained_batch_cost MODEL_DIR [ROWS] [TOKENS] [ROUNDS]";
    let dir = std::path::PathBuf::from(args.first().ok_or(usage)?);
    let num = |i: usize, d: usize| -> Result<usize, Box<dyn std::error::Error>> { Ok(args.get(i).map(|s| s.parse()).transpose()?.unwrap_or(d)) };
    let (rows, tokens, rounds) = (num(1, 8)?, num(2, 64)?, num(3, 3)?);
    if rows == 0 || tokens == 0 || rounds == 0 {
        return Err(usage.into());
    }
    let m = LoadedModel::load(&dir)?;
    let cs = Constraints::new(&m)?;
    // First-use costs (shapes, the trie's first masks) out of the timed rounds.
    run(&m, None, rows, 4, 0)?;
    run(&m, Some(&cs), rows, 4, 0)?;
    let (mut free, mut con) = (Vec::new(), Vec::new());
    for r in 1..=rounds {
        for (label, c) in [("free", None), ("json schema", Some(&cs))] {
            let (tps, live, trace) = run(&m, c, rows, tokens, r)?;
            println!("round {r} {label}: {tps:.2} tok/s, {live}/{rows} rows decoding at the end{}", if trace.is_empty() { String::new() } else { format!(" | {trace}") });
            if c.is_some() { &mut con } else { &mut free }.push(tps);
        }
    }
    let (f, c) = (median(free), median(con));
    println!("{rows} rows, {tokens} steps, medians of {rounds}: free {f:.2} tok/s, json schema {c:.2} ({:+.1}%, {:.3}x)", 100.0 * (c / f - 1.0), c / f);
    Ok(())
}
