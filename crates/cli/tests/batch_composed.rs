//! The GPU's composed attention (`engine::nn::sdpa`: what `serve` on a GPU runs for every batch
//! step and prefill chunk, grouped query heads folded into the query positions, keys optionally
//! in buckets) run on the CPU, in a process of its own (it is a process-wide setting): greedy
//! sequences of different lengths joining and leaving a batch give the tokens each gives alone
//! through MLX's own attention.
mod common;

use engine::batch::{BatchEngine, SeqParams};
use engine::{GenerateConfig, Generator, LoadedModel, SamplerConfig};
use std::collections::BTreeMap;

#[test]
fn the_composed_attention_gives_the_batch_its_tokens_alone() {
    for variant in ["llama3-f32", "qwen3-f32", "mistral-f32"] {
        let m = LoadedModel::load(&common::model(variant)).unwrap();
        let vocab = m.model.vocab_size() as u32;
        // (prompt length, tokens, step at which it joins)
        let cases = [(5usize, 20usize, 0usize), (40, 12, 0), (1, 16, 2), (23, 24, 4), (70, 6, 4)];
        let prompts: Vec<Vec<u32>> =
            cases.iter().enumerate().map(|(i, &(len, ..))| (0..len as u32).map(|t| (t * 37 + i as u32 * 11) % (vocab - 1) + 1).collect()).collect();
        let alone: Vec<Vec<u32>> = prompts
            .iter()
            .zip(&cases)
            .map(|(p, &(_, n, _))| {
                let config = GenerateConfig { max_tokens: Some(n), ..GenerateConfig::default() };
                Generator::new(m.model.as_ref(), p, m.model.make_cache(), config).unwrap().map(|g| g.unwrap().token).collect()
            })
            .collect();
        engine::nn::sdpa::set_composed_max(512);
        let mut engine = BatchEngine::new(m.model.as_ref(), 32, None);
        let mut got: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
        for step in 0..200 {
            for (i, &(_, _, at)) in cases.iter().enumerate().filter(|(_, c)| c.2 == step) {
                let params = SeqParams { sampler: SamplerConfig::default(), keys: None, logprobs: false };
                engine.add(i as u64, prompts[i].clone(), params).unwrap();
                got.insert(i as u64, Vec::new());
                assert_eq!(at, step);
            }
            for t in engine.step().unwrap() {
                let v = got.get_mut(&t.id).unwrap();
                v.push(t.token);
                if v.len() == cases[t.id as usize].1 {
                    engine.finish(t.id);
                }
            }
            if engine.is_idle() && step > 4 {
                break;
            }
        }
        engine::nn::sdpa::set_composed_max(0);
        let got: Vec<Vec<u32>> = got.into_values().collect();
        assert_eq!(got, alone, "{variant}: the batch with composed attention differs from the runs alone");
    }
}
