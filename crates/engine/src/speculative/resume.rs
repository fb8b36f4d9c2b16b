//! Speculation over a sequence already under way, and back out of it: the batch engine decodes a
//! sequence alone with speculative rounds and hands it back to batched decoding when another one
//! joins ([`crate::batch`]). A [`Resume`] says which of the sequence's tokens each cache holds;
//! [`SpeculativeGenerator::resume`] prefills the rest and draws from the sequence's own random
//! stream; [`SpeculativeGenerator::into_parts`] returns the caches exactly as the handed-out tokens
//! left them, with the random stream and what the draft model has not seen yet.
use super::{cannot_rewind, rewindable, trims_only, SpecToken, SpeculativeConfig, SpeculativeGenerator};
use crate::cache::{can_trim_prompt_cache, trim_prompt_cache, Caches};
use crate::error::{EngineError, Result};
use crate::generate::GenerateConfig;
use crate::models::Model;
use super::Draft;
use mlx::random::KeySeq;
use mlx::Array;

/// Where a sequence stands: its tokens so far (prompt, then generated ones), and how many of them
/// the target's cache and the draft model's hold already. The last token is the next input, in
/// neither cache.
#[derive(Clone, Copy, Debug)]
pub struct Resume<'a> {
    pub tokens: &'a [u32],
    pub cached: usize,
    /// Ignored with prompt lookup.
    pub draft_cached: usize,
}

/// A generator taken apart between rounds ([`SpeculativeGenerator::into_parts`]).
pub struct Parts {
    /// The target's caches: every handed-out token but the last, or all of them with `queued`.
    pub cache: Caches,
    /// The draft model's caches and how many of the last handed-out tokens they lack.
    pub draft: Option<(Caches, usize)>,
    /// The random stream the generator drew from (`None`: MLX's global key).
    pub keys: Option<KeySeq>,
    /// A plain-decoding step queued after the last handed-out token, where the cache cannot be
    /// rewound past it (recurrent layers): its token (1,) and log-probabilities (1, vocab), not
    /// handed out.
    pub queued: Option<(Array, Array)>,
}

/// Checks that the batch engine can speculate on `model` (`whose` names it in the error: "model",
/// "draft model"): its sequences move between the batch and the generator as plain keys and values
/// or recurrent states, so every other layer cache must trim at any length (a rotating window,
/// which stops trimming once it wraps, or a model's own layer cache is refused up front).
pub fn check_rewindable(model: &dyn Model, whose: &str) -> Result<()> {
    let cache = model.make_cache();
    if !rewindable(&cache) {
        return Err(cannot_rewind(whose, &cache));
    }
    if !cache.iter().all(|c| c.as_arrays().is_some() || trims_only(std::slice::from_ref(c))) {
        return Err(EngineError::Invalid(format!(
            "speculation in the server needs caches that trim at any length, and the {whose}'s sliding-window layers (a RotatingKVCache, which cannot be trimmed once it wraps around its window) or its own layer caches do not; `mlx-gen generate` speculates on it"
        )));
    }
    Ok(())
}

impl<'m> SpeculativeGenerator<'m> {
    /// Speculative decoding of the sequence `at` (unconstrained), `cache` and the draft's cache
    /// holding what `at` says; every token is drawn from `keys` when given (the sequence's own
    /// stream, as `mlx-gen generate --seed` draws from MLX's global key), else from the global key.
    /// The logits processors' history starts as [`SpeculativeGenerator::new`]'s does over `at`'s
    /// tokens taken as the prompt.
    pub fn resume(
        model: &'m dyn Model,
        at: Resume<'_>,
        cache: Caches,
        draft: Draft<'m>,
        config: GenerateConfig,
        spec: SpeculativeConfig,
        keys: Option<KeySeq>,
    ) -> Result<SpeculativeGenerator<'m>> {
        let mut generator = Self::start(model, at, cache, draft, config, spec, None)?;
        generator.keys = keys;
        Ok(generator)
    }

    /// The tokens of the next round (or of the plain fallback's next step), in order; empty once
    /// max_tokens are out.
    pub fn next_round(&mut self) -> Result<Vec<SpecToken>> {
        let mut out = Vec::new();
        while let Some(t) = self.next() {
            out.push(t?);
            if self.ready.is_empty() {
                break;
            }
        }
        if let Some(k) = &self.keys {
            // The stream's state joins the evaluated graph (no chain of splits builds up).
            mlx::async_eval(&[k.state()])?;
        }
        Ok(out)
    }

    /// The caches, the random stream and the draft model's lag, as the handed-out tokens left them
    /// (see [`Parts`]): a pipelined round in flight is rewound, and a queued plain step too where
    /// the cache trims.
    pub fn into_parts(mut self) -> Result<Parts> {
        let mut rewound = self.inflight.take().map_or(0, |r| r.positions());
        let mut queued = self.plain_pending.take();
        if queued.is_some() && can_trim_prompt_cache(&self.cache) {
            queued = None;
            rewound += 1;
        }
        if rewound > 0 {
            trim_prompt_cache(&mut self.cache, rewound as i32)?;
        }
        // A draft step queued for the next round: its input goes back to pending (`draft_y`).
        self.settle_draft_ahead(None)?;
        let draft = match std::mem::replace(&mut self.draft, Draft::PromptLookup { ngram: 1 }) {
            Draft::Model { cache, .. } => Some((cache, self.draft_y.len())),
            Draft::PromptLookup { .. } => None,
        };
        Ok(Parts { cache: std::mem::take(&mut self.cache), draft, keys: self.keys.take(), queued })
    }
}
