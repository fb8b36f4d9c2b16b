//! Serving a model split over several ranks (`mlx-gen launch -- serve`): rank 0 runs the HTTP
//! server and the batch scheduler; every other rank runs [`follow`], which replays rank 0's engine
//! calls (sequences added and ended, then one step) so that all ranks run the same forward passes
//! and meet at the same collectives. Rank 0 sends each step's calls before the step, through a
//! `share` function (rank 0's bytes on every rank: a length, then the bytes, over `all_sum`).
use crate::worker::BatchOptions;
use anyhow::{Context, Result};
use engine::batch::{BatchEngine, SeqParams};
use engine::cache::PagedPool;
use engine::sample::{init_random_draws, key_seq_as_mlx_lm, KeySeq};
use engine::{LoadedModel, SamplerConfig};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

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

/// The engine every rank builds alike.
pub fn new_engine<'m>(loaded: &'m LoadedModel, options: &BatchOptions, pool: Option<PagedPool>) -> BatchEngine<'m> {
    BatchEngine::new(loaded.model.as_ref(), options.prefill_step_size, pool)
}

/// The prefix pool every rank builds alike (`None` when off).
pub fn new_pool(loaded: &LoadedModel, options: &BatchOptions) -> Option<PagedPool> {
    let layers = loaded.model.make_cache().len();
    (options.prefix_cache_bytes > 0).then(|| PagedPool::new(layers, crate::worker::BLOCK, options.prefix_cache_bytes))
}

/// A follower rank: replays rank 0's calls until it stops.
pub fn follow(loaded: LoadedModel, share: Share, options: BatchOptions) -> Result<()> {
    let init_draws = init_random_draws(&loaded.path, &loaded.config).unwrap_or(0);
    // Rank 0 measures the KV bytes per token with a forward pass: the same here.
    engine::batch::kv_bytes_per_token(loaded.model.as_ref())?;
    let pool = new_pool(&loaded, &options);
    let mut engine = new_engine(&loaded, &options, pool.clone());
    let mut constraints: Option<Result<crate::constrain::Constraints, String>> = None;
    loop {
        let calls: Vec<Call> = serde_json::from_slice(&share(&[])?).context("rank 0 sent calls this rank cannot read")?;
        for call in calls {
            match call {
                // A call that fails on rank 0 fails here alike; rank 0 answers for it.
                Call::Add(spec) => {
                    let constraint = match &spec.grammar {
                        None => Ok(None),
                        Some(g) => {
                            let c = constraints.get_or_insert_with(|| crate::constrain::Constraints::new(&loaded));
                            c.as_ref().map_err(|e| engine::EngineError::Invalid(e.clone())).and_then(|c| c.compile(g).map_err(engine::EngineError::Invalid)).map(|g| Some(Box::new(g) as Box<dyn engine::sample::TokenConstraint>))
                        }
                    };
                    let _ = constraint.and_then(|c| spec.params(init_draws).and_then(|p| engine.add_constrained(spec.id, spec.prompt, p, c)));
                }
                Call::Finish(id) => engine.finish(id),
                Call::Step => {
                    if engine.step().is_err() {
                        engine = new_engine(&loaded, &options, pool.clone());
                    }
                }
                Call::Stop => return Ok(()),
            }
        }
    }
}
