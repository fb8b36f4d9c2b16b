//! The graph of one decode step's forward pass, in Graphviz dot, for counting the operations MLX
//! runs per token: `cargo run --release -p engine --example step_graph -- MODEL OUT.dot [--fused]
//! [--prompt N] [--positions L]`. The prompt (N tokens, default 32) is run and evaluated first; the
//! step is the forward of one more token (or of L, as a speculative verification, with attention
//! composed of plain operations as the GPU computes a few positions) over that cache, exported
//! unevaluated (`mx.export_to_dot`). `scripts/bench/graph_ops.py` compares it with mlx-lm's.
use engine::LoadedModel;
use mlx::Array;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: step_graph MODEL OUT.dot [--fused] [--prompt N] [--positions L]";
    let (dir, out) = match (args.first(), args.get(1)) {
        (Some(d), Some(o)) if !d.starts_with("--") && !o.starts_with("--") => (d, o),
        _ => return Err(usage.into()),
    };
    let (mut prompt_len, mut positions) = (32, 1);
    let mut rest = args[2..].iter();
    while let Some(a) = rest.next() {
        match a.as_str() {
            "--fused" => engine::nn::set_fused_projections(true),
            "--prompt" => prompt_len = rest.next().ok_or(usage)?.parse()?,
            "--positions" => positions = rest.next().ok_or(usage)?.parse()?,
            _ => return Err(format!("unknown argument {a:?}; {usage}").into()),
        }
    }
    let m = LoadedModel::load(std::path::Path::new(dir))?;
    let mut cache = m.model.make_cache();
    let prompt: Vec<i32> = (0..prompt_len).map(|t| (t * 31) % 200 + 1).collect();
    let logits = m.model.forward(&Array::from_slice(&prompt, &[1, prompt_len])?, &mut cache)?;
    let mut state: Vec<&Array> = vec![&logits];
    let cache_state: Vec<Array> = cache.iter().flat_map(|c| c.state()).collect();
    state.extend(cache_state.iter());
    mlx::eval(&state)?;
    if positions > 1 {
        engine::nn::sdpa::set_composed_max(32);
    }
    let ids: Vec<i32> = (0..positions).map(|t| 7 + t).collect();
    let step = m.model.forward(&Array::from_slice(&ids, &[1, positions])?, &mut cache)?; // (1, L, vocab)
    mlx::export_to_dot(&[&step], out)?;
    Ok(())
}
