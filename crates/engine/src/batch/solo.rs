//! Speculative decoding in the batch engine while it decodes one sequence alone (as mlx_lm.server
//! serves a request with its draft model; it never batches then, here the batch goes on).
//!
//! With a [`Speculation`] set, a sequence that asks for draft tokens and has no grammar runs
//! alone in a [`SpeculativeGenerator`] whenever no other sequence decodes or is prefilled with
//! it: a newcomer that finds the engine idle is prefilled by the generator itself (its first token
//! comes from the first round's verification, as in `mlx-gen generate --draft-model`, so a seed
//! gives `generate`'s tokens), and a running row left alone moves out of the batch into its own
//! caches. When a newcomer arrives, the generator's caches (exactly as its handed-out tokens left
//! them, see [`SpeculativeGenerator::into_parts`]) join the batch as a row whose next input is the
//! last handed-out token (not handed out again), and batched decoding goes on for every row. The
//! draft model's cache stays with the sequence between its stretches alone and catches up on the
//! tokens it missed (a prefill) when the sequence is alone again. Every round draws from the
//! sequence's own random stream. Constrained sequences (grammars) always decode in the batch.
//! The prefix pool receives a speculated sequence's keys and values when it ends; recurrent
//! models' prompt snapshots are not taken while the generator prefills.
use super::prefill::{Prefill, Prefilled};
use super::{batch_cache, filled, history_of, BatchEngine, Pending, Row, StepToken};
use crate::cache::{GrowingCache, KvCache, ListCache};
use crate::error::{EngineError, Result};
use crate::generate::GenerateConfig;
use crate::models::Model;
use crate::sample::constraint::TokenConstraint;
use crate::speculative::{check_rewindable, Draft, Resume, SpecStats, SpeculativeConfig, SpeculativeGenerator};
use crate::cache::Caches;
use mlx::Array;

/// Who drafts while the batch engine decodes one sequence alone.
#[derive(Clone, Copy)]
pub enum Drafter<'m> {
    /// A model with the target's vocabulary.
    Model(&'m dyn Model),
    /// Prompt lookup with n-grams of this size down to 1.
    PromptLookup { ngram: usize },
}

/// How the batch engine speculates ([`BatchEngine::with_speculation`]).
#[derive(Clone, Copy)]
pub struct Speculation<'m> {
    pub drafter: Drafter<'m>,
    /// The rounds' settings; its `num_draft_tokens` is that of sequences that do not ask for
    /// their own ([`SeqSpeculation`]).
    pub config: SpeculativeConfig,
}

impl Speculation<'_> {
    /// Fails when speculation cannot rewind `model`'s caches or the draft model's, or the
    /// settings are out of range.
    pub fn check(&self, model: &dyn Model) -> Result<()> {
        if self.config.num_draft_tokens == 0 {
            return Err(EngineError::Invalid("the number of draft tokens must be at least 1".into()));
        }
        check_rewindable(model, "model")?;
        match self.drafter {
            Drafter::Model(d) => check_rewindable(d, "draft model"),
            Drafter::PromptLookup { ngram: 0 } => Err(EngineError::Invalid("the prompt-lookup n-gram size must be at least 1".into())),
            Drafter::PromptLookup { .. } => Ok(()),
        }
    }
}

/// One sequence's speculation settings.
#[derive(Clone, Copy, Debug, Default)]
pub struct SeqSpeculation {
    /// Draft tokens per round: `None` the engine's default, 0 none (plain batched decoding).
    pub num_draft_tokens: Option<usize>,
    /// Tokens the sequence is handed at most (its last round proposes no more drafts than fit,
    /// as mlx-lm's; the caller still ends it).
    pub max_tokens: Option<usize>,
}

/// A sequence's speculation state, wherever the sequence is (waiting, in the batch, alone).
#[derive(Default)]
pub(super) struct SeqDraft {
    /// Draft tokens per round (0: none).
    k: usize,
    max_tokens: Option<usize>,
    /// Tokens handed out so far.
    generated: usize,
    /// The draft model's cache between stretches alone, and how many of the sequence's tokens it holds.
    cache: Option<(Caches, usize)>,
    /// Statistics of its finished stretches alone.
    stats: SpecStats,
}

impl SeqDraft {
    /// Counts a token handed out.
    pub(super) fn handed(&mut self) {
        self.generated += 1;
    }
}

/// The sequence decoding alone.
pub(super) struct Solo<'m> {
    pub(super) id: u64,
    generator: SpeculativeGenerator<'m>,
    /// Its settings (the random stream is the generator's meanwhile).
    params: super::SeqParams,
    /// Prompt and every token handed out.
    tokens: Vec<u32>,
    draft: SeqDraft,
}

/// Whether a sequence speculates when it is alone.
fn eligible(draft: &SeqDraft, constraint: Option<&dyn TokenConstraint>) -> bool {
    draft.k > 0 && constraint.is_none()
}

impl<'m> BatchEngine<'m> {
    /// Speculates for a sequence alone (see the module doc), with `speculation` checked
    /// ([`Speculation::check`]).
    pub fn with_speculation(mut self, speculation: Speculation<'m>) -> BatchEngine<'m> {
        self.speculation = Some(speculation);
        self
    }

    /// Draft statistics of sequence `id` so far (`None` without speculation or for an unknown id).
    pub fn speculation_stats(&self, id: u64) -> Option<SpecStats> {
        self.speculation?;
        if let Some(s) = self.solo.as_ref().filter(|s| s.id == id) {
            return Some(s.draft.stats + s.generator.stats());
        }
        let row = self.rows.iter().find(|r| r.id == id).map(|r| r.draft.stats);
        let waiting = self.waiting.iter().any(|p| p.id == id) || self.group.as_ref().is_some_and(|g| g.has(id));
        row.or(waiting.then(SpecStats::default))
    }

    /// A new sequence's speculation state, checked: draft tokens only with speculation, and the
    /// sampler's token ids within the draft model's vocabulary.
    pub(super) fn seq_draft(&self, spec: SeqSpeculation, params: &super::SeqParams) -> Result<SeqDraft> {
        let k = match (spec.num_draft_tokens, self.speculation) {
            (Some(k), Some(_)) => k,
            (None, Some(s)) => s.config.num_draft_tokens,
            (Some(k), None) if k > 0 => return Err(EngineError::Invalid("draft tokens were asked for, but the engine has no speculation".into())),
            (_, None) => 0,
        };
        if let (true, Some(Speculation { drafter: Drafter::Model(d), .. })) = (k > 0, self.speculation) {
            params.sampler.validate_vocab(d.vocab_size())?;
        }
        Ok(SeqDraft { k, max_tokens: spec.max_tokens, ..SeqDraft::default() })
    }

    /// Whether a sequence waits or is being prefilled that could join the running ones (a model
    /// without batch caches runs one sequence at a time: nothing joins it).
    pub(super) fn newcomers(&self) -> bool {
        self.batchable && (!self.waiting.is_empty() || self.group.is_some())
    }

    /// The step of a sequence alone, when there is one: a round of the sequence already alone, or
    /// of a newcomer that finds the engine idle, or the queued token of the one row left, which
    /// then leaves the batch. `None`: a batched step is to run (a sequence alone that newcomers
    /// will join is back in the batch).
    pub(super) fn solo_step(&mut self) -> Result<Option<Vec<StepToken>>> {
        let Some(spec) = self.speculation else { return Ok(None) };
        if self.solo.is_some() {
            if self.newcomers() {
                self.unsolo()?;
                return Ok(None);
            }
            return self.solo_round().map(Some);
        }
        let alone = self.waiting.len() == 1 || !self.batchable;
        if self.rows.is_empty() && self.group.is_none() && alone && self.waiting.front().is_some_and(|p| eligible(&p.draft, p.constraint.as_deref())) {
            let p = self.waiting.pop_front().expect("front exists");
            self.solo_from_prompt(p, spec)?;
            return self.solo_round().map(Some);
        }
        if self.pending.is_some() && !self.newcomers() && self.last_row_may_go_alone() {
            return self.solo_from_row(spec).map(Some);
        }
        Ok(None)
    }

    /// Whether the batch's one row would go on alone in speculative rounds (with no newcomers).
    pub(super) fn last_row_may_go_alone(&self) -> bool {
        self.speculation.is_some() && self.rows.len() == 1 && eligible(&self.rows[0].draft, self.rows[0].constraint.as_deref())
    }

    /// The generator's settings for a sequence: its sampler, what is left of its token limit.
    fn solo_configs(&self, params: &super::SeqParams, draft: &SeqDraft, spec: Speculation<'m>) -> (GenerateConfig, SpeculativeConfig) {
        let config = GenerateConfig {
            max_tokens: draft.max_tokens.map(|m| m.saturating_sub(draft.generated)),
            prefill_step_size: self.prefill_step_size,
            sampler: params.sampler.clone(),
            kv_quant: None,
        };
        (config, SpeculativeConfig { num_draft_tokens: draft.k, ..spec.config })
    }

    /// The drafter for a sequence, with its draft cache (kept or fresh) and the tokens it holds.
    fn drafter(draft: &mut SeqDraft, spec: Speculation<'m>) -> (Draft<'m>, usize) {
        match spec.drafter {
            Drafter::Model(model) => {
                let (cache, held) = draft.cache.take().unwrap_or_else(|| (model.make_cache(), 0));
                (Draft::Model { model, cache }, held)
            }
            Drafter::PromptLookup { ngram } => (Draft::PromptLookup { ngram }, 0),
        }
    }

    /// A newcomer alone: the generator prefills its prompt (after its cached prefix).
    fn solo_from_prompt(&mut self, p: Prefill, spec: Speculation<'m>) -> Result<()> {
        let Prefill { id, prompt, mut params, done, cache, mut draft, .. } = p;
        let (config, spec_config) = self.solo_configs(&params, &draft, spec);
        let (drafter, draft_cached) = Self::drafter(&mut draft, spec);
        let at = Resume { tokens: &prompt, cached: done, draft_cached };
        let mut generator = SpeculativeGenerator::resume(self.model, at, cache, drafter, config, spec_config, params.keys.take())?;
        self.start_as_judged(&mut generator, draft.k);
        self.solo = Some(Solo { id, generator, params, tokens: prompt, draft });
        Ok(())
    }

    /// The one row left leaves the batch: its queued token is handed out, and the generator goes
    /// on from there in the row's keys and values.
    fn solo_from_row(&mut self, spec: Speculation<'m>) -> Result<Vec<StepToken>> {
        let current = self.pending.take().ok_or_else(|| EngineError::Invalid("a running row without a queued token".into()))?;
        let token = *current.tokens.to_vec::<u32>()?.first().ok_or_else(|| EngineError::Invalid("a queued step without tokens".into()))?;
        let mut row = self.rows.pop().ok_or_else(|| EngineError::Invalid("no running row".into()))?;
        let mut caches = std::mem::take(&mut self.caches);
        let cache = if self.batchable { caches.iter_mut().map(single).collect::<Result<_>>()? } else { caches };
        let mut out = Vec::new();
        if !std::mem::take(&mut row.skip) {
            row.draft.handed();
            out.push(StepToken { id: row.id, token, logprobs: current.logprobs.into_iter().next().flatten() });
        }
        let mut tokens = std::mem::take(&mut row.tokens);
        let cached = tokens.len();
        tokens.push(token);
        let (config, spec_config) = self.solo_configs(&row.params, &row.draft, spec);
        let (drafter, draft_cached) = Self::drafter(&mut row.draft, spec);
        let at = Resume { tokens: &tokens, cached, draft_cached };
        let mut generator = SpeculativeGenerator::resume(self.model, at, cache, drafter, config, spec_config, row.params.keys.take())?;
        self.start_as_judged(&mut generator, row.draft.k);
        self.solo = Some(Solo { id: row.id, generator, params: row.params, tokens, draft: row.draft });
        Ok(out)
    }

    /// A new generator with draft length `k` starts plain for the fallback's longest stretch
    /// where the last judged sequence alone lost even at full acceptance with that length: its
    /// probing rounds (about 3 a sequence) would lose again, whatever the prompt.
    fn start_as_judged(&self, generator: &mut SpeculativeGenerator<'m>, k: usize) {
        if self.spec_lost == Some(k) {
            generator.start_plain();
        }
    }

    /// Keeps the judgement of the sequence alone that is leaving (see `start_as_judged`).
    fn keep_judgement(&mut self, solo: &Solo<'m>) {
        if let Some(lost) = solo.generator.structural_loss() {
            self.spec_lost = lost.then_some(solo.draft.k);
        }
    }

    /// One round of the sequence alone: its tokens.
    fn solo_round(&mut self) -> Result<Vec<StepToken>> {
        let solo = self.solo.as_mut().ok_or_else(|| EngineError::Invalid("no sequence alone".into()))?;
        let (start, waits0) = (std::time::Instant::now(), mlx::host_waits());
        let round = solo.generator.next_round()?;
        if round.is_empty() {
            return Err(EngineError::Invalid(format!("sequence {} reached its token limit but was not ended", solo.id)));
        }
        let mut out = Vec::with_capacity(round.len());
        for t in round {
            solo.tokens.push(t.token);
            solo.draft.handed();
            out.push(StepToken { id: solo.id, token: t.token, logprobs: solo.params.logprobs.then_some(t.logprobs) });
        }
        let mut times = [std::time::Duration::ZERO; 7];
        times[3] = start.elapsed();
        self.add_trace(&times, out.len(), waits0);
        Ok(out)
    }

    /// The sequence alone goes back into the batch (newcomers are about to join it): its caches as
    /// a row whose next input is its last handed-out token (marked as handed out), or, where a
    /// queued plain step could not be rewound, that step's token.
    fn unsolo(&mut self) -> Result<()> {
        let solo = self.solo.take().ok_or_else(|| EngineError::Invalid("no sequence alone".into()))?;
        self.keep_judgement(&solo);
        let Solo { id, generator, mut params, tokens, mut draft } = solo;
        draft.stats = draft.stats + generator.stats();
        let parts = generator.into_parts()?;
        params.keys = parts.keys;
        draft.cache = parts.draft.map(|(cache, lacks)| (cache, tokens.len() - lacks));
        let (held, first, skip) = match parts.queued {
            None => {
                let last = *tokens.last().ok_or_else(|| EngineError::Invalid("a sequence without tokens".into()))?;
                let held = tokens[..tokens.len() - 1].to_vec();
                (held, Pending { tokens: Array::from_slice(&[last], &[1])?, logprobs: vec![None], ticket: None }, true)
            }
            Some((token, logprobs)) => {
                let logprobs = params.logprobs.then(|| logprobs.squeeze(&[0])).transpose()?;
                (tokens, Pending { tokens: token, logprobs: vec![logprobs], ticket: None }, false)
            }
        };
        let history = history_of(&params.sampler, &held)?;
        let row = Row { id, params, tokens: held, history, constraint: None, draft, skip };
        self.join(vec![Prefilled { rows: vec![row], cache: parts.cache, own: true, first }])
    }

    /// Forgets the sequence alone (it ended), its keys and values left in the prefix pool.
    pub(super) fn drop_solo(&mut self) -> Result<()> {
        let Some(solo) = self.solo.take() else { return Ok(()) };
        self.keep_judgement(&solo);
        let Some(pool) = self.prefix.as_ref().filter(|_| self.batchable) else { return Ok(()) };
        let parts = solo.generator.into_parts()?;
        let n = if parts.queued.is_some() { solo.tokens.len() } else { solo.tokens.len() - 1 };
        let kv = parts.cache.iter().map(|c| filled(c.as_ref())).collect::<Result<Vec<_>>>()?;
        // A full pool only means the sequence is not kept for reuse.
        let _ = pool.store_all(&[(&solo.tokens[..n], kv.as_slice())]);
        Ok(())
    }
}

/// A batch layer cache of one row as that sequence's own cache (keys and values without the
/// row's padding; a recurrent state as it is; a cache list part by part).
fn single(c: &mut Box<dyn KvCache>) -> Result<Box<dyn KvCache>> {
    if let Some(a) = c.as_arrays() {
        return Ok(Box::new(a.clone()));
    }
    if let Some(parts) = c.parts_mut() {
        let parts = parts.iter_mut().map(single).collect::<Result<Vec<_>>>()?;
        return Ok(Box::new(ListCache::new(parts)?));
    }
    let (k, v) = batch_cache(c.as_ref())?.row(0)?;
    let n = k.dim(2);
    Ok(Box::new(GrowingCache::from_state(Some(k), Some(v), n)?))
}
