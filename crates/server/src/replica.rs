//! Serving a model split over several ranks (`mlx-gen launch -- serve`): rank 0 runs the HTTP
//! server and the batch scheduler; every other rank runs [`follow`], which replays rank 0's engine
//! calls (sequences added and ended, then one step; see [`crate::lockstep`]) so that all ranks run
//! the same forward passes and meet at the same collectives.
use crate::constrain::{compile, Constraints};
use crate::lockstep::{new_engine, new_pool, warm_up, BatchOptions, Call, Share};
use anyhow::{Context, Result};
use engine::sample::init_random_draws;
use engine::LoadedModel;

/// A follower rank: replays rank 0's calls until it stops.
pub fn follow(loaded: LoadedModel, share: Share, options: BatchOptions) -> Result<()> {
    if options.speculation.is_some() {
        anyhow::bail!("speculative decoding (--draft-model, --prompt-lookup) is served on one rank only");
    }
    let init_draws = init_random_draws(&loaded.path, &loaded.config).unwrap_or(0);
    // Rank 0 measures the KV bytes per token with a forward pass: the same here.
    engine::batch::kv_bytes_per_token(loaded.model.as_ref())?;
    // Rank 0 warms its engine up before serving: the same forward passes here.
    if options.warm_up {
        warm_up(&loaded, &options, None)?;
    }
    let pool = new_pool(&loaded, &options);
    let mut engine = new_engine(&loaded, &options, pool.clone(), None);
    let mut constraints: Option<Result<Constraints, String>> = None;
    loop {
        let calls: Vec<Call> = serde_json::from_slice(&share(&[])?).context("rank 0 sent calls this rank cannot read")?;
        for call in calls {
            match call {
                // A call that fails on rank 0 fails here alike; rank 0 answers for it.
                Call::Add(spec) => {
                    let constraint = spec.grammar.as_ref().map(|g| compile(constraints.get_or_insert_with(|| Constraints::new(&loaded)).as_ref(), g)).transpose();
                    let _ = constraint.and_then(|c| spec.params(init_draws).and_then(|p| engine.add_constrained(spec.id, spec.prompt, p, c)));
                }
                Call::Finish(id) => engine.finish(id),
                Call::Step => {
                    if engine.step().is_err() {
                        engine = new_engine(&loaded, &options, pool.clone(), None);
                    }
                }
                Call::Stop => return Ok(()),
            }
        }
    }
}
