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
    /// Bytes of KV cache the running sequences may reserve (prompt + max_tokens each).
    pub kv_budget_bytes: usize,
    /// Bytes of the prefix pool (finished sequences' keys and values kept for reuse); 0: off.
    pub prefix_cache_bytes: usize,
    /// Speculative decoding of a sequence decoding alone (one rank only).
    pub speculation: Option<SpecOptions>,
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
    let engine = BatchEngine::new(loaded.model.as_ref(), options.prefill_step_size, pool);
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
