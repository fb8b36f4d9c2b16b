//! What every rank of a served model must build identically, and the protocol they keep in step
//! with: the batch options, the prefix pool's block size, the engine and pool constructors, and the
//! engine calls rank 0 makes ([`Call`]), which it sends to the other ranks before each step through
//! a [`Share`] function (rank 0's bytes on every rank: a length, then the bytes, over `all_sum`).
//! Rank 0's scheduler ([`crate::worker`]) makes the calls; the others replay them
//! ([`crate::replica`]). Neither of those two modules uses the other. Speculative decoding
//! ([`SpecOptions`]) is served on one rank only: its rounds are not among the calls replayed.
use anyhow::Result;
use engine::batch::{BatchEngine, SeqParams, Speculation};
use engine::cache::PagedPool;
use engine::sample::{key_seq_as_mlx_lm, KeySeq};
use engine::{LoadedModel, SamplerConfig};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// How the engine thread batches (from `mlx-gen serve`'s flags).
#[derive(Clone, Debug)]
pub struct BatchOptions {
    /// Sequences decoded together at most.
    pub max_batch: usize,
    /// Prompt tokens prefilled per step (between two decode steps of the running batch).
    pub prefill_step_size: usize,
    /// Different prompts prefilled together at most (`serve --prompt-concurrency`).
    pub prompt_concurrency: usize,
    /// Bytes of KV cache the running sequences may reserve (prompt + max_tokens each).
    pub kv_budget_bytes: usize,
    /// Bytes of the prefix pool (finished sequences' keys and values kept for reuse); 0: off.
    pub prefix_cache_bytes: usize,
    /// Speculative decoding of a sequence decoding alone (one rank only).
    pub speculation: Option<SpecOptions>,
    /// Run [`warm_up`] before serving (`serve --warmup`: on the GPU by default).
    pub warm_up: bool,
}

/// `serve --draft-model` or `--prompt-lookup`: who drafts, and the rounds' settings (its
/// `num_draft_tokens` is that of requests without their own).
#[derive(Clone, Copy, Debug)]
pub struct SpecOptions {
    pub drafter: SpecDrafter,
    pub config: engine::SpeculativeConfig,
}

/// Who drafts for [`SpecOptions`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecDrafter {
    /// The draft model the server loaded ([`crate::Models::draft`]).
    DraftModel,
    /// Prompt lookup with n-grams of this size down to 1.
    PromptLookup(usize),
}

/// Positions per block of the prefix pool (and the unit of the KV metrics).
pub const BLOCK: usize = 16;

/// Rank 0's bytes on every rank (see the module doc).
pub type Share = Arc<dyn Fn(&[u8]) -> Result<Vec<u8>> + Send + Sync>;

/// Everything a rank needs to add the same sequence with the same random stream.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SeqSpec {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub sampler: SamplerConfig,
    pub seed: u64,
    /// Seeded as `mlx-gen generate --seed` (past the model-init draws), or a fresh stream.
    pub as_generate: bool,
    pub logprobs: bool,
    /// Constrained decoding: what every token must follow (each rank compiles it alike).
    #[serde(default)]
    pub grammar: Option<crate::constrain::Grammar>,
}

impl SeqSpec {
    pub fn params(&self, init_draws: usize) -> engine::Result<SeqParams> {
        let keys = if self.as_generate { key_seq_as_mlx_lm(self.seed, init_draws)? } else { KeySeq::new(self.seed)? };
        Ok(SeqParams { sampler: self.sampler.clone(), keys: Some(keys), logprobs: self.logprobs })
    }
}

/// One engine call, in the order rank 0 made it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Call {
    Add(Box<SeqSpec>),
    Finish(u64),
    /// One `step` (after the calls before it).
    Step,
    /// Rank 0 is shutting down.
    Stop,
}

/// The engine every rank builds alike, speculating with `speculation` (rank 0 alone: see the module doc).
pub fn new_engine<'m>(loaded: &'m LoadedModel, options: &BatchOptions, pool: Option<PagedPool>, speculation: Option<Speculation<'m>>) -> BatchEngine<'m> {
    let engine = BatchEngine::new(loaded.model.as_ref(), options.prefill_step_size, pool).with_prompt_concurrency(options.prompt_concurrency);
    match speculation {
        Some(s) => engine.with_speculation(s),
        None => engine,
    }
}

/// The prefix pool every rank builds alike (`None` when off).
pub fn new_pool(loaded: &LoadedModel, options: &BatchOptions) -> Option<PagedPool> {
    let layers = loaded.model.make_cache().len();
    (options.prefix_cache_bytes > 0).then(|| PagedPool::new(layers, BLOCK, options.prefix_cache_bytes))
}

/// Prompt lengths of the warm-up's batch: rows of different lengths (padded groups), one past the
/// batch caches' growth step of 256 positions, several chunks of a step's prefill budget.
const WARM_UP_PROMPTS: [usize; 8] = [12, 300, 20, 40, 70, 16, 100, 30];

/// Rows of the warm-up's full batch at most (the server's `--max-batch-size` when smaller).
const WARM_UP_FULL_BATCH: usize = 64;

/// Runs the batch engine once over dummy sequences before the first request, in an engine of its
/// own (no prefix pool), greedy: one sequence alone, then up to 8 rows of different lengths
/// prefilled as a group, decoding with rows leaving one after another and two newcomers joining
/// the running batch, then a full batch (up to 64 rows) decoding down to one row. On a GPU the
/// first use of each kind of batched shape compiles kernels (on the H200 a fresh machine's first
/// 8-stream round waited 42 s in its prefill); this pays that before a user's request does.
/// Deterministic, so that every rank runs it alike (the forward passes' collectives meet). With
/// `speculation` (one rank only) a sequence then decodes alone in an engine that speculates every
/// round (no fallback), on a prompt that repeats itself (prompt lookup finds its continuation at
/// least in the first round): the draft model's first steps and the verification's shape cost a fresh process about 0.1 s a round for
/// its first rounds on an H100 (BENCHMARKS.md), paid here rather than by a user's request.
/// Returns how long it took and the draft tokens its speculative rounds proposed.
pub fn warm_up(loaded: &LoadedModel, options: &BatchOptions, speculation: Option<Speculation<'_>>) -> Result<(std::time::Duration, usize)> {
    let started = std::time::Instant::now();
    let mut engine = new_engine(loaded, options, None, None);
    let mut dummies = Dummies { vocab: (loaded.model.vocab_size().max(2) as u64).min(1 << 20), left: Vec::new(), steps: 0, proposed: 0 };
    dummies.add(&mut engine, 24, 3)?;
    dummies.run(&mut engine, &[])?;
    let rows = options.max_batch.clamp(1, WARM_UP_PROMPTS.len());
    for (i, &len) in WARM_UP_PROMPTS.iter().take(rows).enumerate() {
        dummies.add(&mut engine, len, 2 + i)?;
    }
    // Two newcomers join the batch while its first rows decode.
    dummies.run(&mut engine, if rows > 1 { &[9, 50] } else { &[] })?;
    // A full batch: its prompts prefilled in groups as large as the server makes them, then decode
    // steps at every row count from the full batch down to one, as its rows leave one a step (on
    // an H100 the first 32-stream round of a server warmed up with 8 rows only spent 1.0 s in
    // prefill against 0.17 s warm: the kernels of 17-32 rows were compiled then). Not for a model
    // whose caches do not batch: its sequences run one after another, no new row counts to meet.
    let full = options.max_batch.min(WARM_UP_FULL_BATCH);
    if full > rows + 2 && engine::batch::is_batchable(loaded.model.as_ref()) {
        for i in 0..full {
            dummies.add(&mut engine, 10 + (i * 37) % 90, 2 + i)?;
        }
        dummies.run(&mut engine, &[])?;
    }
    if let Some(speculation) = speculation {
        // Every round speculates (the fallback would first decode plainly, then judge).
        let speculation = Speculation { config: engine::SpeculativeConfig { fallback: false, ..speculation.config }, ..speculation };
        let mut engine = new_engine(loaded, options, None, Some(speculation));
        let prompt = (0..48u64).map(|j| ((j % 6) * 7 % (dummies.vocab - 1) + 1) as u32).collect();
        dummies.add_prompt(&mut engine, prompt, 64)?;
        dummies.run(&mut engine, &[])?;
    }
    Ok((started.elapsed(), dummies.proposed))
}

/// The warm-up's dummy sequences (id = index): the tokens each has still to decode.
struct Dummies {
    vocab: u64,
    left: Vec<usize>,
    steps: usize,
    /// Draft tokens the speculative sequences proposed.
    proposed: usize,
}

impl Dummies {
    /// Adds a greedy sequence of a `len`-token prompt that ends after `tokens` tokens.
    fn add(&mut self, engine: &mut BatchEngine<'_>, len: usize, tokens: usize) -> Result<()> {
        let id = self.left.len() as u64;
        let prompt = (0..len as u64).map(|j| ((id * 7919 + j * 104_729 + 1) % (self.vocab - 1) + 1) as u32).collect();
        self.add_prompt(engine, prompt, tokens)
    }

    /// Adds a greedy sequence of `prompt` that ends after `tokens` tokens.
    fn add_prompt(&mut self, engine: &mut BatchEngine<'_>, prompt: Vec<u32>, tokens: usize) -> Result<()> {
        engine.add(self.left.len() as u64, prompt, SeqParams { sampler: SamplerConfig::default(), keys: None, logprobs: false })?;
        self.left.push(tokens);
        Ok(())
    }

    /// Steps until every sequence is done; `newcomers` (prompt lengths) join once some rows decode.
    fn run(&mut self, engine: &mut BatchEngine<'_>, mut newcomers: &[usize]) -> Result<()> {
        while !engine.is_idle() {
            for t in engine.step()? {
                let left = self.left.get_mut(t.id as usize).ok_or_else(|| anyhow::anyhow!("warm-up: a token of an unknown sequence {}", t.id))?;
                *left = left.saturating_sub(1);
                if *left == 0 {
                    self.proposed += engine.speculation_stats(t.id).map_or(0, |s| s.proposed);
                    engine.finish(t.id);
                }
            }
            self.steps += 1;
            if !newcomers.is_empty() && engine.len().0 > 0 {
                for &len in std::mem::take(&mut newcomers) {
                    self.add(engine, len, 3)?;
                }
            }
            if self.steps > 10_000 {
                anyhow::bail!("warm-up: the batch engine did not finish its dummy sequences");
            }
        }
        Ok(())
    }
}
