//! Speculative decoding, mlx-lm 0.32.2's `speculative_generate_step`, with a draft model or with prompt lookup (n-gram matches in the prompt and the text so far).
//!
//! Each round the drafter proposes up to K tokens; the target scores its pending token and the K
//! proposals in one forward pass and samples every position; proposals are accepted while they
//! equal the target's own samples, the first mismatch hands out the target's token instead, and a
//! fully accepted round adds the target's bonus token. Both caches are then trimmed by the
//! rejected count. With a draft model every operation, random draw and token-history update is
//! mlx-lm's, so one seed gives mlx-lm's tokens: the draft samples with the same sampler (one draw
//! per token), the target samples all K+1 positions with one draw (per position, one each, when
//! logits processors are on), and the processors' history starts at the last prompt token, as
//! mlx-lm's `prev_tokens` does. Prompt lookup (not in mlx-lm) keeps the whole history instead, so
//! at temperature 0 it gives exactly the tokens of plain generation, penalties included.
//!
//! Greedy runs without logits processors fall back to plain decoding while speculation is measured
//! to be slower (see [`crate::pace`]; `SpeculativeConfig::fallback`): their tokens are plain
//! decoding's either way. Sampled runs keep mlx-lm's schedule, so a seed gives mlx-lm's tokens.
//! With `MLX_GEN_TRACE` set, each round is timed stage by stage (draft, verification, host work;
//! with a device sync after the draft) and the totals are printed when the generator is dropped.
//!
//! A recurrent layer's state (qwen3_next, qwen3_5) cannot be trimmed, so mlx-lm refuses such
//! models, and a rotating window (sliding-window layers, `--max-kv-size`) cannot once it has
//! wrapped (mlx-lm's trim then silently does nothing); here such layers are kept before each
//! forward pass that may be rejected in part, and a rejection puts them back and runs the accepted
//! tokens through the model again (their logits unused), which leaves every cache holding what
//! plain decoding of the same tokens would.
use crate::cache::{trim_prompt_cache, Caches, KvCache};
use crate::prefill::prefill;
use crate::error::{EngineError, Result};
use crate::generate::GenerateConfig;
use crate::models::Model;
use crate::pace::{Pace, Phase};
use crate::sample::constraint::{draft_masks, TokenConstraint};
use mlx::random::KeySeq;
use mlx::{async_eval, ops, Array, Dtype};
use std::collections::VecDeque;
use std::time::Instant;

mod parts;
mod pipelined;
mod resume;

use parts::{cannot_rewind, checkpoint, rewind, rewindable, step, step_padded, trims_only, History};
pub use parts::prompt_lookup;
pub use resume::{check_rewindable, Parts, Resume};

/// Who proposes the draft tokens.
pub enum Draft<'m> {
    /// A (smaller) model with the target's vocabulary, and its cache (fresh or continued with the
    /// target's).
    Model { model: &'m dyn Model, cache: Vec<Box<dyn KvCache>> },
    /// Prompt lookup: the continuation of the latest earlier occurrence of the text's last n-gram,
    /// for n from this size down to 1.
    PromptLookup { ngram: usize },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpeculativeConfig {
    /// Draft tokens per round (mlx-lm's `num_draft_tokens`); the starting value when adaptive.
    pub num_draft_tokens: usize,
    /// Grow the draft length by 2 after a fully accepted round and shrink it by 1 after a rejection,
    /// within 1..=4K. Off by default (mlx-lm's draft length is fixed).
    pub adaptive: bool,
    /// Greedy decoding without logits processors goes plain while speculation is measured to be
    /// slower ([`crate::pace`]); ignored otherwise (sampled runs keep mlx-lm's schedule). On by default.
    pub fallback: bool,
    /// The verification forward pass is padded to a multiple of this many positions (1: none). On
    /// MLX's CUDA backend a quantized matrix product of 2-7 rows costs several times one of 8
    /// (BENCHMARKS.md), so the GPU pads to 8; padding changes no token (causal attention).
    pub pad_verify: usize,
    /// Greedy decoding without logits processors over trimmable caches queues work before reading
    /// the round in flight ([`pipelined`]): prompt lookup its next round, a draft model the next
    /// round's first draft step. Off by default.
    pub pipeline: bool,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        SpeculativeConfig { num_draft_tokens: 3, adaptive: false, fallback: true, pad_verify: 1, pipeline: false }
    }
}

/// One generated token, its log-probabilities and whether it is an accepted draft token.
pub struct SpecToken {
    pub token: u32,
    /// (vocab,)
    pub logprobs: Array,
    pub from_draft: bool,
}

/// Draft statistics so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct SpecStats {
    /// Draft tokens proposed to the target.
    pub proposed: usize,
    /// Draft tokens accepted by the target and handed out.
    pub accepted: usize,
    /// Target forward passes after the prompt (rounds).
    pub rounds: usize,
    /// Tokens the rounds handed out (accepted drafts and the target's own).
    pub round_tokens: usize,
    /// Seconds spent in rounds (building, running and reading them).
    pub round_s: f64,
    /// Tokens from plain decoding while speculation did not pay, and the number of such stretches.
    pub plain_tokens: usize,
    pub fallbacks: usize,
    /// Pipelined rounds queued and then given up (the round before them rejected a draft).
    pub discarded: usize,
}

impl std::ops::Add for SpecStats {
    type Output = SpecStats;

    /// Both stretches' statistics together.
    fn add(self, o: SpecStats) -> SpecStats {
        SpecStats {
            proposed: self.proposed + o.proposed,
            accepted: self.accepted + o.accepted,
            rounds: self.rounds + o.rounds,
            round_tokens: self.round_tokens + o.round_tokens,
            round_s: self.round_s + o.round_s,
            plain_tokens: self.plain_tokens + o.plain_tokens,
            fallbacks: self.fallbacks + o.fallbacks,
            discarded: self.discarded + o.discarded,
        }
    }
}

impl SpecStats {
    /// accepted / proposed (0 when nothing was proposed).
    pub fn acceptance_rate(&self) -> f64 {
        if self.proposed == 0 {
            0.0
        } else {
            self.accepted as f64 / self.proposed as f64
        }
    }

    /// Tokens handed out per round (0 without rounds).
    pub fn tokens_per_round(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            self.round_tokens as f64 / self.rounds as f64
        }
    }

    /// Milliseconds per round (0 without rounds).
    pub fn ms_per_round(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            1e3 * self.round_s / self.rounds as f64
        }
    }
}

/// `MLX_GEN_TRACE`: seconds per stage of the rounds so far (drafting, verification up to its
/// tokens on the host, acceptance and rewinding).
#[derive(Default)]
struct Trace {
    draft_s: f64,
    verify_s: f64,
    host_s: f64,
    /// Calls that waited for the device during rounds (`mlx::host_waits`; the trace's own sync
    /// after the draft included).
    waits: u64,
}

/// Yields generated tokens, a round of speculation at a time; the caller stops it at EOS.
pub struct SpeculativeGenerator<'m> {
    model: &'m dyn Model,
    cache: Vec<Box<dyn KvCache>>,
    draft: Draft<'m>,
    config: GenerateConfig,
    /// The current draft length and its bounds.
    k: usize,
    k_max: usize,
    adaptive: bool,
    pad_verify: usize,
    /// The target's next input (its last token, not yet in its cache) and the draft model's.
    y: Vec<u32>,
    draft_y: Vec<u32>,
    history: History,
    /// Prompt and tokens so far (prompt lookup only).
    seq: Vec<u32>,
    ready: VecDeque<SpecToken>,
    ntoks: usize,
    stats: SpecStats,
    done: bool,
    /// The plain-decoding fallback's schedule (greedy runs without processors), and its queued
    /// next token with its log-probabilities (1,), (1, vocab).
    pace: Option<Pace>,
    plain_pending: Option<(Array, Array)>,
    trace: Option<Trace>,
    /// Rounds are pipelined (see [`pipelined`]), and prompt lookup's round in flight.
    pipelined: bool,
    inflight: Option<pipelined::Inflight>,
    /// Whether the last round accepted all its drafts (then pipelined work is queued early).
    all_accepted: bool,
    /// A draft model's first draft token of the next round (1,), queued while the round before ran,
    /// on the bet that it accepts all its drafts (its input, `draft_y`, is then in the draft cache).
    draft_ahead: Option<Array>,
    /// Constrained decoding: the grammar every handed-out token follows.
    constraint: Option<Box<dyn TokenConstraint>>,
    /// The sequence's own random stream ([`SpeculativeGenerator::resume`]); `None`: MLX's global key.
    keys: Option<KeySeq>,
}

impl Drop for SpeculativeGenerator<'_> {
    fn drop(&mut self) {
        let (Some(t), s) = (&self.trace, &self.stats) else { return };
        if s.rounds > 0 {
            let per = |x: f64| 1e3 * x / s.rounds as f64;
            eprintln!(
                "trace: {} rounds, {:.2} tokens/round, acceptance {:.1}%, draft {:.3} ms/round, verify {:.3} ms/round, host {:.3} ms/round, {:.2} evaluations and host reads/round (the trace's own sync after the draft among them); {} plain tokens in {} stretches",
                s.rounds,
                s.tokens_per_round(),
                100.0 * s.acceptance_rate(),
                per(t.draft_s),
                per(t.verify_s),
                per(t.host_s),
                t.waits as f64 / s.rounds as f64,
                s.plain_tokens,
                s.fallbacks
            );
        }
    }
}

impl<'m> SpeculativeGenerator<'m> {
    /// Prefills `prompt` into the draft cache and then `cache` (fresh or continued; both trimmable).
    pub fn new(
        model: &'m dyn Model,
        prompt: &[u32],
        cache: Vec<Box<dyn KvCache>>,
        draft: Draft<'m>,
        config: GenerateConfig,
        spec: SpeculativeConfig,
    ) -> Result<SpeculativeGenerator<'m>> {
        Self::new_constrained(model, prompt, cache, draft, config, spec, None)
    }

    /// [`SpeculativeGenerator::new`] with every handed-out token following `constraint`: drafts
    /// are checked against it ahead of the verification, whose positions are sampled under its
    /// masks (so greedy tokens are those of constrained plain decoding). Every round speculates
    /// (no plain fallback) and rounds are not pipelined.
    pub fn new_constrained(
        model: &'m dyn Model,
        prompt: &[u32],
        cache: Vec<Box<dyn KvCache>>,
        draft: Draft<'m>,
        config: GenerateConfig,
        spec: SpeculativeConfig,
        constraint: Option<Box<dyn TokenConstraint>>,
    ) -> Result<SpeculativeGenerator<'m>> {
        Self::start(model, Resume { tokens: prompt, cached: 0, draft_cached: 0 }, cache, draft, config, spec, constraint)
    }

    /// The generator for `at`: the tokens neither cache holds yet are prefilled into the draft
    /// cache and then `cache` (both trimmable), all but the last, the next input.
    fn start(
        model: &'m dyn Model,
        at: Resume<'_>,
        cache: Vec<Box<dyn KvCache>>,
        mut draft: Draft<'m>,
        config: GenerateConfig,
        spec: SpeculativeConfig,
        constraint: Option<Box<dyn TokenConstraint>>,
    ) -> Result<SpeculativeGenerator<'m>> {
        let invalid = |m: &str| Err(EngineError::Invalid(m.into()));
        let prompt = at.tokens;
        config.validate(model, prompt)?;
        if spec.num_draft_tokens == 0 {
            return invalid("the number of draft tokens must be at least 1");
        }
        if at.cached >= prompt.len() || at.draft_cached >= prompt.len() {
            return invalid("a sequence's caches must not hold its last token (the next input)");
        }
        if !rewindable(&cache) {
            return Err(cannot_rewind("model", &cache));
        }
        let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
        let from = |start: usize| Array::from_slice(&ids[start..], &[1, (ids.len() - start) as i32]); // (1, L - start)
        let (step, kv_quant) = (config.prefill_step_size, config.kv_quant.as_ref());
        let processors = &config.sampler.processors;
        let need = processors.history_needed();
        let mut history = History { tokens: None, track: !processors.is_empty() && need != Some(0), keep: need };
        match &mut draft {
            Draft::Model { model: d, cache: dc } => {
                config.sampler.validate_vocab(d.vocab_size())?;
                if !rewindable(dc) {
                    return Err(cannot_rewind("draft model", dc));
                }
                prefill(*d, dc, &from(at.draft_cached)?, step, kv_quant, |_| Ok(()))?;
            }
            Draft::PromptLookup { ngram } => {
                if *ngram == 0 {
                    return invalid("the prompt-lookup n-gram size must be at least 1");
                }
                // The whole history before the pending token, as plain generation has it.
                if history.track && ids.len() > 1 {
                    history.push(&Array::from_slice(&ids[..ids.len() - 1], &[ids.len() as i32 - 1])?)?;
                    history.cut_front()?;
                }
            }
        }
        let mut cache = cache;
        prefill(model, &mut cache, &from(at.cached)?, step, kv_quant, |_| Ok(()))?;
        let last = *prompt.last().unwrap_or(&0);
        let seq = if matches!(draft, Draft::PromptLookup { .. }) { prompt.to_vec() } else { Vec::new() };
        let k = spec.num_draft_tokens;
        let config_max = config.max_tokens;
        let exact_anyway = config.sampler.is_greedy() && processors.is_empty() && constraint.is_none();
        let pace = (spec.fallback && exact_anyway).then(Pace::new);
        // Padding and pipelining rewind by trimming: not over recurrent states or rotating windows.
        let trimmable = trims_only(&cache);
        let pipelined = exact_anyway
            && spec.pipeline
            && trimmable
            && match &draft {
                Draft::PromptLookup { .. } => true,
                Draft::Model { cache, .. } => trims_only(cache),
            };
        let trace = std::env::var_os("MLX_GEN_TRACE").map(|_| Trace::default());
        Ok(SpeculativeGenerator {
            model,
            cache,
            draft,
            config,
            k,
            k_max: 4 * k,
            adaptive: spec.adaptive,
            pad_verify: if trimmable { spec.pad_verify.max(1) } else { 1 },
            y: vec![last],
            draft_y: vec![last],
            history,
            seq,
            ready: VecDeque::new(),
            ntoks: 0,
            stats: SpecStats::default(),
            done: config_max == Some(0),
            pace,
            plain_pending: None,
            trace,
            pipelined,
            inflight: None,
            all_accepted: true,
            draft_ahead: None,
            constraint,
            keys: None,
        })
    }

    pub fn stats(&self) -> SpecStats {
        SpecStats { fallbacks: self.pace.as_ref().map_or(0, |p| p.fallbacks), ..self.stats }
    }

    /// The target's caches and the draft model's (if any), as the tokens handed out so far left them:
    /// the target holds the prompt and every handed-out token but the last (a pipelined round in
    /// flight is rewound; a queued plain step too, where the cache trims), the draft model what
    /// it was fed.
    pub fn into_caches(self) -> Result<(Caches, Option<Caches>)> {
        let parts = self.into_parts()?;
        Ok((parts.cache, parts.draft.map(|(cache, _)| cache)))
    }

    /// Why the constraint ended generation early, if it did.
    pub fn constraint_note(&self) -> Option<String> {
        self.constraint.as_ref().and_then(|c| c.note())
    }

    /// The fallback's last judgement: whether speculation lost even counting every proposed
    /// draft as accepted (see [`Pace::structural_loss`]; `None`: no judgement, or no fallback).
    pub fn structural_loss(&self) -> Option<bool> {
        self.pace.as_ref().and_then(Pace::structural_loss)
    }

    /// Starts with the fallback's longest plain stretch (an earlier sequence's speculation with
    /// these settings lost even at full acceptance); nothing without the fallback. Called before
    /// the first token.
    pub fn start_plain(&mut self) {
        if let Some(p) = self.pace.as_mut() {
            *p = Pace::after_structural_loss();
        }
    }

    /// The draft length of the next round.
    pub fn draft_length(&self) -> usize {
        self.k
    }

    /// One plain decoding step of the fallback, pipelined as `Generator`'s: the next step is
    /// queued before the current token is read, unless this is the stretch's last token (then
    /// the token becomes the pending input of the next round, as after a round).
    fn plain_next(&mut self) -> Result<()> {
        let max = self.config.max_tokens.unwrap_or(usize::MAX);
        let (tok, logprobs) = match self.plain_pending.take() {
            Some(p) => p,
            None => {
                let y = Array::from_slice(&self.y, &[self.y.len() as i32])?;
                let p = step(self.model, &mut self.cache, &y, 1, &self.config, &mut self.history, self.keys.as_mut())?;
                async_eval(&[&p.0, &p.1])?;
                p
            }
        };
        let goes_on = self.pace.as_ref().is_some_and(Pace::plain_continues) && self.ntoks + 1 < max;
        if goes_on {
            let next = step(self.model, &mut self.cache, &tok, 1, &self.config, &mut self.history, self.keys.as_mut())?;
            async_eval(&[&next.0, &next.1])?;
            self.plain_pending = Some(next);
        }
        let token = tok.item::<u32>()?;
        self.ready.push_back(SpecToken { token, logprobs: logprobs.squeeze(&[0])?, from_draft: false });
        self.ntoks += 1;
        self.stats.plain_tokens += 1;
        if self.ntoks == max {
            self.done = true;
        }
        if let Some(p) = self.pace.as_mut() {
            p.plain_token();
        }
        if matches!(self.draft, Draft::PromptLookup { .. }) {
            self.seq.push(token);
        } else {
            // The draft model catches up on the plain tokens at its next step.
            self.draft_y.push(token);
        }
        if !goes_on {
            self.y = vec![token];
        }
        if self.stats.plain_tokens.is_multiple_of(256) {
            crate::prefill::clear_buffer_cache();
        }
        Ok(())
    }

    /// One round: draft, verify, queue the accepted tokens, rewind the caches.
    fn round(&mut self) -> Result<()> {
        let t0 = Instant::now();
        let waits0 = mlx::host_waits();
        let max = self.config.max_tokens.unwrap_or(usize::MAX);
        let want = (max - self.ntoks).min(self.k);
        // The draft: lazy tokens from the draft model, or known ones from prompt lookup.
        let draft_before = match &self.draft {
            Draft::Model { cache, .. } => checkpoint(cache, self.draft_y.len() + want),
            Draft::PromptLookup { .. } => None,
        };
        let draft_input = self.draft_y.clone();
        let ahead = self.draft_ahead.take();
        let (draft_tokens, lookup) = match &mut self.draft {
            Draft::Model { model, cache } => {
                let mut ds = Vec::with_capacity(want);
                let mut input = Array::from_slice(&self.draft_y, &[self.draft_y.len() as i32])?;
                // The first step already queued during the last round (it was fed `draft_y`).
                if let Some(d) = ahead {
                    ds.push(d.clone());
                    input = d;
                }
                while ds.len() < want {
                    let (d, _) = step(*model, cache, &input, 1, &self.config, &mut self.history, self.keys.as_mut())?;
                    async_eval(&[&d])?;
                    ds.push(d.clone());
                    input = d;
                }
                // Drops what the draft steps added to the history but the target's pending token.
                self.history.drop_last((self.y.len() + want).saturating_sub(1))?;
                (ds, None)
            }
            Draft::PromptLookup { ngram } => {
                let found = prompt_lookup(&self.seq, *ngram, want);
                let ds = if found.is_empty() { Vec::new() } else { vec![Array::from_slice(&found, &[found.len() as i32])?] };
                (ds, Some(found))
            }
        };
        let num_draft = lookup.as_ref().map_or(draft_tokens.len(), Vec::len);
        let t_draft = if self.trace.is_some() {
            mlx::eval(&draft_tokens.iter().collect::<Vec<_>>())?;
            Some(Instant::now())
        } else {
            None
        };
        let y = Array::from_slice(&self.y, &[self.y.len() as i32])?;
        let draft = match (draft_tokens.is_empty(), &lookup) {
            (true, _) => None,
            (false, Some(found)) => Some(Array::from_slice(found, &[found.len() as i32])?),
            (false, None) => Some(ops::concatenate(&draft_tokens.iter().collect::<Vec<_>>(), 0)?),
        };
        // Constrained decoding: each position's mask, the grammar advanced along the drafts (which
        // the host reads first when a draft model made them).
        let masks = match (self.constraint.as_mut(), &lookup, &draft) {
            (Some(c), Some(found), _) => Some(draft_masks(c.as_mut(), found, self.model.vocab_size() as usize)?),
            (Some(c), None, Some(d)) => Some(draft_masks(c.as_mut(), &d.to_vec::<u32>()?, self.model.vocab_size() as usize)?),
            (Some(c), None, None) => Some(draft_masks(c.as_mut(), &[], self.model.vocab_size() as usize)?),
            (None, ..) => None,
        };
        // Recurrent states and rotating windows about to wrap, to put back if drafts are rejected.
        let before = checkpoint(&self.cache, self.y.len() + num_draft + self.pad_verify);
        let v = self.queue_verify(&y, draft.as_ref(), num_draft, masks.as_deref())?;
        let input = v.input.astype(Dtype::U32)?;
        let ahead = if lookup.is_none() && num_draft == want { self.queue_draft_ahead(&v, &input, draft_tokens.last())? } else { None };
        // One wait for the device: the sampled tokens and the fed input (the drafts) together.
        mlx::eval(&[&v.tokens, &input])?;
        let tokens: Vec<u32> = v.tokens.to_vec()?;
        let mut fed: Vec<u32> = input.to_vec()?;
        fed.truncate(v.real);
        let drafted = &fed[self.y.len()..];
        let t_verify = Instant::now();
        let handed_before = self.ntoks;
        let n = self.accept(&tokens, drafted, &v.logprobs)?;
        self.all_accepted = n == num_draft;
        if let Some(c) = self.constraint.as_mut() {
            for &t in &tokens[..=n] {
                c.commit(t)?;
            }
        }
        self.y = vec![tokens[n]];
        self.draft_y = if n == num_draft && lookup.is_none() && num_draft > 0 {
            // The last draft token has not been through the draft model yet.
            vec![drafted[num_draft - 1], tokens[n]]
        } else {
            vec![tokens[n]]
        };
        // The history keeps the accepted tokens (mlx-lm drops at least one: the draft model
        // appends its two-token input again).
        let extra = if lookup.is_none() { (num_draft - n).max(1) } else { num_draft - n };
        self.history.drop_last(extra)?;
        self.history.cut_front()?;
        // The target was fed its pending token and the drafts, the draft model its input and all
        // drafts but the last: each keeps what was accepted.
        let kept = fed.len() - (num_draft - n);
        rewind(self.model, &mut self.cache, before, &fed, kept, &self.config)?;
        self.settle_draft_ahead(ahead)?;
        if let Draft::Model { model, cache } = &mut self.draft {
            let fed: Vec<u32> = draft_input.iter().copied().chain(drafted[..num_draft.saturating_sub(1)].iter().copied()).collect();
            let kept = fed.len() - (num_draft - n).saturating_sub(1);
            rewind(*model, cache, draft_before, &fed, kept, &self.config)?;
        }
        let end = Instant::now();
        if let Some(t) = self.trace.as_mut() {
            let drafted_at = t_draft.unwrap_or(t0);
            t.draft_s += (drafted_at - t0).as_secs_f64();
            t.verify_s += (t_verify - drafted_at).as_secs_f64();
            t.host_s += (end - t_verify).as_secs_f64();
            t.waits += mlx::host_waits() - waits0;
        }
        self.finish_round(num_draft, n, self.ntoks - handed_before, t0);
        if self.leaving_speculation() {
            self.settle_draft_ahead(None)?; // the fallback goes plain: the queued draft step is given up
        }
        Ok(())
    }

    /// Queues the target's verification of `draft` (num_draft,) after the pending input `y` (L,):
    /// the forward pass, padded to a multiple of `pad_verify` positions (repeats of `y`'s first
    /// token, trimmed from the cache at once), and the sampling of its last num_draft + 1 positions.
    fn queue_verify(&mut self, y: &Array, draft: Option<&Array>, num_draft: usize, masks: Option<&[u32]>) -> Result<Verify> {
        let real = y.dim(0) as usize + num_draft;
        let pad = if num_draft > 0 && self.pad_verify > 1 { real.next_multiple_of(self.pad_verify) - real } else { 0 };
        let mut parts = vec![y.clone()];
        parts.extend(draft.cloned());
        if pad > 0 {
            let first = y.slice_axis(0, 0, 1)?;
            parts.extend(std::iter::repeat_n(first, pad));
        }
        let input = ops::concatenate(&parts.iter().collect::<Vec<_>>(), 0)?; // (real + pad,)
        let (tokens, logprobs) = step_padded(
            self.model,
            &mut self.cache,
            &input,
            pad as i32,
            num_draft as i32 + 1,
            &self.config,
            &mut self.history,
            masks,
            self.keys.as_mut(),
        )?;
        if pad > 0 {
            trim_prompt_cache(&mut self.cache, pad as i32)?;
        }
        Ok(Verify { tokens, logprobs, input, real })
    }

    /// Hands out the drafts the target's `tokens` (num_draft + 1,) agree with, then the target's
    /// own token (up to max_tokens); returns how many drafts were accepted.
    fn accept(&mut self, tokens: &[u32], drafted: &[u32], logprobs: &Array) -> Result<usize> {
        let max = self.config.max_tokens.unwrap_or(usize::MAX);
        let row = |i: usize| -> Result<Array> { Ok(logprobs.slice_axis(0, i as i32, i as i32 + 1)?.squeeze(&[0])?) };
        let mut n = 0;
        while n < drafted.len() && tokens[n] == drafted[n] {
            self.ready.push_back(SpecToken { token: tokens[n], logprobs: row(n)?, from_draft: true });
            n += 1;
            self.ntoks += 1;
            if self.ntoks == max {
                break;
            }
        }
        if self.ntoks < max {
            self.ntoks += 1;
            self.ready.push_back(SpecToken { token: tokens[n], logprobs: row(n)?, from_draft: false });
        }
        if self.ntoks == max {
            self.done = true;
        }
        if matches!(self.draft, Draft::PromptLookup { .. }) {
            self.seq.extend_from_slice(&tokens[..=n]);
        }
        Ok(n)
    }

    /// A round's bookkeeping: the adaptive draft length, statistics, the fallback's measurement.
    fn finish_round(&mut self, num_draft: usize, accepted: usize, handed: usize, t0: Instant) {
        self.stats.proposed += num_draft;
        self.stats.rounds += 1;
        let full = num_draft >= self.k;
        if self.adaptive && num_draft > 0 {
            self.k = if accepted == num_draft { (self.k + 2).min(self.k_max) } else { self.k.saturating_sub(1).max(1) };
        }
        if self.stats.rounds.is_multiple_of(256) {
            crate::prefill::clear_buffer_cache();
        }
        self.stats.round_tokens += handed;
        self.stats.round_s += t0.elapsed().as_secs_f64();
        if let Some(p) = self.pace.as_mut() {
            p.round(handed, num_draft, full);
        }
    }
}

/// A queued verification: its sampled tokens (num_draft + 1,) and log-probabilities
/// (num_draft + 1, vocab), its input (real + padding,), and the positions it added to the cache.
struct Verify {
    tokens: Array,
    logprobs: Array,
    input: Array,
    real: usize,
}

impl Iterator for SpeculativeGenerator<'_> {
    type Item = Result<SpecToken>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ready.is_empty() && !self.done {
            let plain = self.plain_pending.is_some() || self.pace.as_ref().is_some_and(|p| matches!(p.phase(), Phase::Plain { .. }));
            let r = match (&self.draft, plain) {
                (_, true) => self.plain_next(),
                (Draft::PromptLookup { ngram }, false) if self.pipelined => self.lookup_round_pipelined(*ngram),
                _ => self.round(),
            };
            if let Err(e) = r {
                self.done = true;
                return Some(Err(e));
            }
        }
        let t = self.ready.pop_front()?;
        if t.from_draft {
            self.stats.accepted += 1;
        }
        Some(Ok(t))
    }
}
