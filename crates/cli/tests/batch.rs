//! Continuous batching (`engine::batch`): sequences that join and leave a running batch at
//! different steps give the tokens each gives alone (greedy, and seeded sampling with per-request
//! key streams), and prompts that share a cached prefix skip it without changing the answer.
mod common;

use engine::batch::{BatchEngine, SeqParams, StepToken};
use engine::cache::PagedPool;
use engine::sample::{init_random_draws, key_seq_as_mlx_lm, seed_as_mlx_lm, LogitsProcessors, TokenConstraint};
use engine::{GenerateConfig, Generator, LoadedModel, SamplerConfig};
use std::collections::BTreeMap;

fn prompt(seed: u32, len: usize, vocab: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed * 97)) % (vocab - 1) + 1).collect()
}

fn alone(m: &LoadedModel, p: &[u32], sampler: &SamplerConfig, seed: Option<u64>, n: usize) -> Vec<u32> {
    alone_constrained(m, p, sampler, seed, n, None)
}

fn alone_constrained(m: &LoadedModel, p: &[u32], sampler: &SamplerConfig, seed: Option<u64>, n: usize, constraint: Option<u32>) -> Vec<u32> {
    if let Some(s) = seed {
        seed_as_mlx_lm(s, m).unwrap();
    }
    let config = GenerateConfig { max_tokens: Some(n), sampler: sampler.clone(), ..GenerateConfig::default() };
    Generator::new_constrained(m.model.as_ref(), p, m.model.make_cache(), config, banned(constraint)).unwrap().map(|g| g.unwrap().token).collect()
}

struct Case {
    prompt: Vec<u32>,
    sampler: SamplerConfig,
    seed: Option<u64>,
    /// Step at which it is added.
    joins_at: usize,
    tokens: usize,
    /// Masked by a [`Banned`] rule with this salt.
    constraint: Option<u32>,
}

/// A rule over the tokens that changes with each one committed: token t is banned where
/// (7t + salt) % 5 == 0, and so is the token last committed.
struct Banned {
    salt: u32,
    committed: Vec<u32>,
}

impl TokenConstraint for Banned {
    fn allowed(&mut self, vocab: usize) -> engine::Result<Vec<bool>> {
        let last = self.committed.last().copied();
        Ok((0..vocab as u32).map(|t| !(7 * t + self.salt).is_multiple_of(5) && Some(t) != last).collect())
    }
    fn commit(&mut self, token: u32) -> engine::Result<()> {
        self.committed.push(token);
        Ok(())
    }
    fn rollback(&mut self, n: usize) -> engine::Result<()> {
        self.committed.truncate(self.committed.len() - n);
        Ok(())
    }
    fn note(&self) -> Option<String> {
        None
    }
}

fn banned(salt: Option<u32>) -> Option<Box<dyn TokenConstraint>> {
    salt.map(|salt| Box::new(Banned { salt, committed: Vec::new() }) as Box<dyn TokenConstraint>)
}

/// Runs every case through one batch engine; returns each case's tokens and the cached-prefix counts.
fn batched(m: &LoadedModel, cases: &[Case], prefill_chunk: usize, pool: Option<PagedPool>) -> (Vec<Vec<u32>>, Vec<usize>) {
    batched_rows(m, cases, prefill_chunk, pool, 8)
}

/// [`batched`] with at most `rows` prompts prefilled together.
fn batched_rows(m: &LoadedModel, cases: &[Case], prefill_chunk: usize, pool: Option<PagedPool>, rows: usize) -> (Vec<Vec<u32>>, Vec<usize>) {
    let draws = init_random_draws(&m.path, &m.config).unwrap();
    let mut engine = BatchEngine::new(m.model.as_ref(), prefill_chunk, pool).with_prompt_concurrency(rows);
    let mut out: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    let mut cached = vec![0; cases.len()];
    let mut step = 0;
    loop {
        for (i, c) in cases.iter().enumerate().filter(|(_, c)| c.joins_at == step) {
            let keys = c.seed.map(|s| key_seq_as_mlx_lm(s, draws).unwrap());
            let params = SeqParams { sampler: c.sampler.clone(), keys, logprobs: false };
            cached[i] = engine.add_constrained(i as u64, c.prompt.clone(), params, banned(c.constraint)).unwrap();
            out.insert(i as u64, Vec::new());
        }
        for StepToken { id, token, .. } in engine.step().unwrap() {
            let v = out.get_mut(&id).unwrap();
            assert!(v.len() < cases[id as usize].tokens, "sequence {id} got a token after it finished");
            v.push(token);
            if v.len() == cases[id as usize].tokens {
                engine.finish(id);
            }
        }
        step += 1;
        if engine.is_idle() && cases.iter().all(|c| c.joins_at < step) {
            break;
        }
        assert!(step < 10_000, "the batch never finished");
    }
    (out.into_values().collect(), cached)
}

fn sampler(temp: f64, top_p: f64, top_k: i32, penalty: Option<f64>) -> SamplerConfig {
    let mut processors = LogitsProcessors::default();
    if let Some(p) = penalty {
        processors.repetition_penalty = Some(p);
    }
    SamplerConfig { temp, top_p, top_k, processors, ..SamplerConfig::default() }
}

fn check(variant: &str, cases: &[Case], chunk: usize) {
    let m = LoadedModel::load(&common::model(variant)).unwrap();
    let want: Vec<Vec<u32>> = cases.iter().map(|c| alone_constrained(&m, &c.prompt, &c.sampler, c.seed, c.tokens, c.constraint)).collect();
    for (c, w) in cases.iter().zip(&want) {
        let Some(salt) = c.constraint else { continue };
        assert_eq!(w.len(), c.tokens, "{variant}: a constrained run gave {} of {} tokens", w.len(), c.tokens);
        for (i, &t) in w.iter().enumerate() {
            assert!(!(7 * t + salt).is_multiple_of(5) && (i == 0 || w[i - 1] != t), "{variant}: token {i} ({t}) of {w:?} breaks its rule (salt {salt})");
        }
    }
    let (got, _) = batched(&m, cases, chunk, None);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "{variant}: sequence {i} differs from its run alone");
    }
}

#[test]
fn greedy_sequences_joining_and_leaving_match_their_runs_alone() {
    let vocab = 256;
    let cases: Vec<Case> = (0..6)
        .map(|i| Case {
            prompt: prompt(i, [5, 40, 1, 17, 90, 3][i as usize], vocab),
            sampler: SamplerConfig::default(),
            seed: None,
            joins_at: [0, 0, 3, 5, 5, 20][i as usize],
            tokens: [30, 12, 25, 40, 8, 16][i as usize],
            constraint: None,
        })
        .collect();
    check("llama3-f32", &cases, 32);
    check("qwen3-f32", &cases, 2048);
}

/// Constrained rows (each masked by a rule that changes with every token) among free rows, joining
/// and leaving at different steps: while any row is constrained the engine queues each step's
/// next forward pass ahead of the host's masks, and drops it for leaving rows and newcomers; every
/// sequence still gives its tokens alone, greedy and seeded.
#[test]
fn constrained_rows_joining_and_leaving_match_their_runs_alone() {
    let vocab = 256;
    let cases: Vec<Case> = (0..7)
        .map(|i| Case {
            prompt: prompt(60 + i, [9, 33, 2, 17, 48, 5, 12][i as usize], vocab),
            sampler: if i % 3 == 1 { sampler(0.9, 0.9, 0, Some(1.1)) } else { SamplerConfig::default() },
            seed: (i % 3 == 1).then_some(u64::from(i) + 20),
            joins_at: [0, 0, 4, 9, 9, 15, 30][i as usize],
            tokens: [20, 6, 26, 14, 3, 18, 10][i as usize],
            constraint: (i != 2 && i != 5).then_some(i),
        })
        .collect();
    check("llama3-f32", &cases, 32);
    check("qwen3-f32", &cases, 2048);
}

#[test]
fn seeded_sampling_and_penalties_match_per_sequence() {
    let vocab = 256;
    let settings = [
        (sampler(0.8, 0.9, 0, None), Some(7)),
        (sampler(1.0, 0.0, 20, None), Some(42)),
        (sampler(0.0, 0.0, 0, Some(1.3)), None),
        (sampler(0.7, 0.0, 0, Some(1.1)), Some(3)),
        (sampler(0.0, 0.0, 0, None), None),
        // Rows the batch samples in one graph: min-p, top-p with min-p, temperature alone.
        (SamplerConfig { min_p: 0.1, ..sampler(0.9, 0.0, 0, None) }, Some(11)),
        (SamplerConfig { min_p: 0.05, ..sampler(1.1, 0.8, 0, None) }, Some(12)),
        (sampler(1.3, 0.0, 0, None), Some(13)),
    ];
    let cases: Vec<Case> = settings
        .iter()
        .enumerate()
        .map(|(i, (s, seed))| Case { prompt: prompt(i as u32 + 10, 6 + 9 * i, vocab), sampler: s.clone(), seed: *seed, joins_at: i % 6, tokens: 24, constraint: None })
        .collect();
    check("qwen2-f32", &cases, 64);
}

#[test]
fn a_cached_prefix_is_skipped_and_changes_nothing() {
    let m = LoadedModel::load(&common::model("llama3-f32")).unwrap();
    let base = prompt(1, 70, 256);
    let mut longer = base.clone();
    longer.extend(prompt(2, 9, 256));
    let first = Case { prompt: base.clone(), sampler: SamplerConfig::default(), seed: None, joins_at: 0, tokens: 10, constraint: None };
    let second = Case { prompt: longer.clone(), sampler: SamplerConfig::default(), seed: None, joins_at: 30, tokens: 10, constraint: None };
    let pool = PagedPool::new(m.model.make_cache().len(), 16, 64 << 20);
    let (got, cached) = batched(&m, &[first, second], 2048, Some(pool.clone()));
    assert_eq!(cached, vec![0, 64], "the second prompt should reuse the first one's 4 full blocks");
    assert_eq!(got[0], alone(&m, &base, &SamplerConfig::default(), None, 10));
    assert_eq!(got[1], alone(&m, &longer, &SamplerConfig::default(), None, 10));
    let (used, cached_blocks, seqs) = pool.usage();
    assert_eq!((used, seqs), (0, 0), "no block or sequence may stay held");
    assert!(cached_blocks >= 5, "finished sequences stay cached for reuse: {cached_blocks} blocks");
}

/// Newcomers arriving together are prefilled together (one forward per chunk for several prompts
/// of different lengths, right-padded, over several steps when the chunk is small), sequences with
/// the same prompt share one prefill (a request's `n` choices), and rows starting from cached
/// prefixes of different lengths join rows without one: every sequence still gives its tokens
/// alone, greedy and seeded.
#[test]
fn newcomers_prefilled_together_and_shared_choices_match_their_runs_alone() {
    let vocab = 256;
    let base = prompt(3, 50, vocab);
    let mut with_prefix = base.clone();
    with_prefix.extend(prompt(4, 23, vocab));
    let lens = [7, 61, 1, 33, 18];
    let mut cases: Vec<Case> = vec![Case { prompt: base.clone(), sampler: SamplerConfig::default(), seed: None, joins_at: 0, tokens: 4, constraint: None }];
    for (i, &len) in lens.iter().enumerate() {
        cases.push(Case { prompt: prompt(20 + i as u32, len, vocab), sampler: SamplerConfig::default(), seed: None, joins_at: 12, tokens: 9 + i, constraint: None });
    }
    // The same prompt three times (greedy, and two seeded streams), and one with a cached prefix.
    for (s, seed) in [(SamplerConfig::default(), None), (sampler(0.9, 0.95, 0, None), Some(5)), (sampler(1.0, 0.0, 0, Some(1.2)), Some(6))] {
        cases.push(Case { prompt: prompt(40, 29, vocab), sampler: s, seed, joins_at: 12, tokens: 14, constraint: None });
    }
    cases.push(Case { prompt: with_prefix.clone(), sampler: SamplerConfig::default(), seed: None, joins_at: 12, tokens: 11, constraint: None });
    for (variant, chunk) in [("llama3-f32", 64), ("qwen3-f32", 2048)] {
        let m = LoadedModel::load(&common::model(variant)).unwrap();
        let want: Vec<Vec<u32>> = cases.iter().map(|c| alone(&m, &c.prompt, &c.sampler, c.seed, c.tokens)).collect();
        // Groups of at most 8 (the default), 2 and all of them (`serve --prompt-concurrency`).
        for rows in [8, 2, 32] {
            let pool = PagedPool::new(m.model.make_cache().len(), 16, 64 << 20);
            let (got, cached) = batched_rows(&m, &cases, chunk, Some(pool.clone()), rows);
            assert_eq!(cached[cases.len() - 1], 48, "{variant}: the last prompt starts from the first one's 3 full blocks");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "{variant}, groups of {rows}: sequence {i} differs from its run alone");
            }
            assert_eq!((pool.usage().0, pool.usage().2), (0, 0), "{variant}: no block or sequence may stay held");
        }
    }
}

/// Sequences ended while their group is still being prefilled (a client gone mid-prefill) hand out
/// nothing, and the others of the group (one sharing the ended one's prompt) still give their
/// tokens alone; a group whose members all ended is dropped.
#[test]
fn sequences_ended_during_their_groups_prefill_leave_the_rest_unchanged() {
    let m = LoadedModel::load(&common::model("llama3-f32")).unwrap();
    let vocab = 256;
    let prompts = [prompt(50, 90, vocab), prompt(51, 70, vocab), prompt(50, 90, vocab), prompt(52, 60, vocab), prompt(53, 80, vocab)];
    let n = 8;
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| alone(&m, p, &SamplerConfig::default(), None, n)).collect();
    let mut engine = BatchEngine::new(m.model.as_ref(), 48, None);
    let params = || SeqParams { sampler: SamplerConfig::default(), keys: None, logprobs: false };
    for (i, p) in prompts.iter().take(4).enumerate() {
        engine.add(i as u64, p.clone(), params()).unwrap();
    }
    // One step runs the first chunk of the group (48 positions over 3 rows: 16 columns).
    assert!(engine.step().unwrap().is_empty());
    assert_eq!(engine.len(), (0, 4));
    engine.finish(0); // shares its row with 2
    engine.finish(3);
    assert_eq!(engine.len(), (0, 2));
    let mut got: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for step in 0..200 {
        if step == 1 {
            // A group of one whose only member ends at once.
            engine.add(4, prompts[4].clone(), params()).unwrap();
        }
        if step == 2 {
            engine.finish(4);
        }
        for StepToken { id, token, .. } in engine.step().unwrap() {
            let v = got.entry(id).or_default();
            v.push(token);
            if v.len() == n {
                engine.finish(id);
            }
        }
        if engine.is_idle() && step > 2 {
            break;
        }
    }
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![1, 2], "only the sequences not ended hand out tokens");
    assert_eq!(got[&1], want[1]);
    assert_eq!(got[&2], want[2]);
}
