//! The GPU's fused q/k/v and gate/up projections compute what the separate ones do: same greedy
//! tokens and logits within rounding, on float and quantized models with biases and q/k norms.
mod common;

use engine::{GenerateConfig, Generator, LoadedModel};

fn run(variant: &str, fused: bool) -> (Vec<f32>, Vec<u32>, usize) {
    engine::nn::set_fused_projections(fused);
    let loaded = LoadedModel::load(&common::model(variant)).expect("load");
    let prompt = loaded.tokenizer.encode("The quick brown fox jumps over the lazy dog", true).expect("encode");
    let logits = loaded.prompt_logits(&prompt).expect("logits");
    let config = GenerateConfig { max_tokens: Some(32), ..GenerateConfig::default() };
    let tokens = Generator::new(loaded.model.as_ref(), &prompt, loaded.model.make_cache(), config)
        .expect("generator")
        .map(|g| g.expect("step").token)
        .collect();
    (logits, tokens, loaded.model.parameters().len())
}

#[test]
fn fused_projections_match_separate_ones() {
    for variant in ["llama3-f32", "qwen2-f32", "qwen3-f32", "qwen2-q4g32", "qwen3-q8g64", "llama-linear-bf16"] {
        let (a, ta, na) = run(variant, false);
        let (b, tb, nb) = run(variant, true);
        assert!(nb < na, "{variant}: fusing left {nb} weight arrays of {na}");
        let range = a.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        let tol = if variant.ends_with("f32") { 1e-4 } else { 2e-2 * range };
        assert!(diff <= tol, "{variant}: logits differ by {diff} (tolerance {tol})");
        assert_eq!(ta, tb, "{variant}: greedy tokens differ");
    }
    engine::nn::set_fused_projections(false);
}
