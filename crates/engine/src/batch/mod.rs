//! Continuous batching, as mlx-lm's `BatchGenerator`: sequences join and leave a running batch
//! between steps, and every step decodes all of them in one forward pass over a [`BatchCache`].
//!
//! New sequences are prefilled together in groups (see `prefill.rs`: several prompts in one
//! forward per chunk, a budget of padded prompt positions per step so the running sequences keep
//! flowing), each starting from the longest prefix the optional prefix pool holds; the first token
//! of each is sampled from its last prompt position and the group joins the batch. Each step
//! queues the next one before handing out the current tokens (as `generate_step`), so the host
//! builds step n+1 while the device computes step n. Sampling follows each sequence's own
//! settings, logits processors and random key stream, all rows in one graph
//! ([`crate::sample::rows`]). A model whose own caches cannot be merged into a batch (rotating or
//! chunked ones) runs its sequences one after another, as mlx-lm's server does. A sequence added
//! with a [`TokenConstraint`] has its row masked before sampling; while any row is constrained the
//! mask of step n+1 needs step n's tokens on the host, so a step reads the current
//! tokens, computes the masks on the CPU (one row after another while they are cheap, on threads
//! past that: [`commit_and_mask`]) while the device runs the forward pass over those tokens, and
//! queues the masked sampling with the next forward pass over the sampled (still lazy) tokens
//! before it returns: the device goes from one forward pass to the next without waiting for the
//! host to build a graph (one host sync and one evaluation per step, as without constraints). MLX
//! signals an evaluation's arrays together, so the tokens go through an [`mlx::Mailbox`] that the
//! device writes them to as soon as they are sampled; where there is none (Metal) or a row reads
//! log-probabilities, the sampling is an evaluation of its own ahead of the forward pass. That
//! forward ahead is left out while newcomers wait (they join at the next step instead). With
//! [`Speculation`] set, a sequence decoding alone runs speculative rounds instead (see `solo.rs`).
use crate::cache::{ArraysCache, BatchCache, GrowingCache, KvCache, ListCache, PagedPool, StateNode, StatePrefixCache};
use crate::error::{EngineError, Result};
use crate::models::Model;
use crate::sample::processors::extend_history;
use crate::sample::constraint::{commit_and_mask, TokenConstraint};
use crate::sample::rows::RowSampling;
use crate::sample::SamplerConfig;
use mlx::random::KeySeq;
use mlx::{async_eval, ops, Array, Mailbox, Ticket};
use std::cell::OnceCell;
use std::collections::VecDeque;
use std::time::Instant;

mod prefill;
mod solo;
mod trace;
use prefill::{Ctx, Group, Prefill, Prefilled};
use solo::{SeqDraft, Solo};
pub use solo::{Drafter, SeqSpeculation, Speculation};
pub use trace::StepTrace;
use trace::lap;

/// One sequence's generation settings.
pub struct SeqParams {
    pub sampler: SamplerConfig,
    /// Its own random stream (see `sample::key_seq_as_mlx_lm`); `None` draws from MLX's global key.
    pub keys: Option<KeySeq>,
    /// Keep each token's log-probabilities (vocab,) for the caller.
    pub logprobs: bool,
}

/// What a step hands out for one sequence.
pub struct StepToken {
    pub id: u64,
    pub token: u32,
    /// (vocab,) when the sequence asked for them.
    pub logprobs: Option<Array>,
}

struct Row {
    id: u64,
    params: SeqParams,
    /// Tokens whose keys and values the batch cache holds for this row, in order.
    tokens: Vec<u32>,
    history: Option<Array>,
    constraint: Option<Box<dyn TokenConstraint>>,
    draft: SeqDraft,
    /// Its queued token was handed out already (it came back from decoding alone): the next step
    /// feeds it without handing it out again.
    skip: bool,
}

/// The queued step: per row, the token to hand out next and its log-probabilities.
struct Pending {
    tokens: Array, // (B,)
    logprobs: Vec<Option<Array>>,
    /// Where the tokens went through the mailbox (queued with the forward pass over them): the
    /// post to read them by.
    ticket: Option<Ticket>,
}

pub struct BatchEngine<'m> {
    model: &'m dyn Model,
    /// The model's layers (caches per sequence).
    layers: usize,
    /// Whether the model's caches are plain KV caches, which a [`BatchCache`] merges. Models whose
    /// own caches are rotating or chunked run one sequence at a time in their own caches, as
    /// mlx-lm's server serves a model whose caches cannot `merge`.
    batchable: bool,
    prefill_step_size: usize,
    prefix: Option<PagedPool>,
    /// For models with recurrent layers, the prefix cache instead of `prefix`: snapshots of whole
    /// sequences at block boundaries of their prompts.
    states: Option<StatePrefixCache>,
    /// Whether newcomers with different prompts are prefilled together (plain KV caches only).
    groups: bool,
    /// Rows of one prefill group at most.
    group_rows: usize,
    waiting: VecDeque<Prefill>,
    /// The newcomers being prefilled now.
    group: Option<Group>,
    rows: Vec<Row>,
    caches: Vec<Box<dyn KvCache>>,
    pending: Option<Pending>,
    /// The logits (B, vocab) of the forward pass over `pending`'s tokens, queued already (a
    /// constrained step's forward ahead); the caches hold those tokens' keys and values.
    ahead: Option<Array>,
    /// Where the device has one (the CPU, CUDA): what a constrained step reads its tokens through
    /// when it queues their sampling and the forward pass over them in one evaluation.
    mailbox: OnceCell<Option<Mailbox>>,
    leaving: Vec<u64>,
    steps: usize,
    /// Prompt positions prefilled since MLX's buffer cache was last cleared.
    prefilled_since_clear: usize,
    /// `MLX_GEN_TRACE`: the steps' time by stage.
    trace: Option<StepTrace>,
    /// Speculative decoding of a sequence alone, and the sequence decoding so now.
    speculation: Option<Speculation<'m>>,
    solo: Option<Solo<'m>>,
    /// The draft length at which the last judged sequence alone found speculation losing even at
    /// full acceptance: later sequences with it start plain ([`crate::pace::Pace::structural_loss`]).
    spec_lost: Option<usize>,
}

impl<'m> BatchEngine<'m> {
    /// `prefix`: a pool of blocks where finished sequences leave their keys and values for later
    /// prompts with the same beginning.
    pub fn new(model: &'m dyn Model, prefill_step_size: usize, prefix: Option<PagedPool>) -> BatchEngine<'m> {
        let recurrent = has_recurrent_layers(model);
        let states = prefix.as_ref().filter(|_| recurrent).map(|p| StatePrefixCache::new(p.block_size(), p.budget_bytes()));
        // The prefix pool keeps one key/value list per layer: not a layer's cache list.
        let lists = model.make_cache().iter_mut().any(|c| c.parts_mut().is_some());
        let prefix = prefix.filter(|_| !lists);
        let batchable = is_batchable(model);
        BatchEngine {
            model,
            layers: model.make_cache().len(),
            batchable,
            groups: batchable && !recurrent && !lists,
            group_rows: prefill::MAX_GROUP_ROWS,
            prefill_step_size: prefill_step_size.max(1),
            prefix: prefix.filter(|_| !recurrent),
            states,
            waiting: VecDeque::new(),
            group: None,
            rows: Vec::new(),
            caches: Vec::new(),
            pending: None,
            ahead: None,
            mailbox: OnceCell::new(),
            leaving: Vec::new(),
            steps: 0,
            prefilled_since_clear: 0,
            trace: StepTrace::from_env(),
            speculation: None,
            solo: None,
            spec_lost: None,
        }
    }

    /// Prefills at most `rows` different prompts together (mlx_lm.server's `--prompt-concurrency`,
    /// 8 by default); at least 1.
    pub fn with_prompt_concurrency(mut self, rows: usize) -> BatchEngine<'m> {
        self.group_rows = rows.max(1);
        self
    }

    /// Sequences decoding now and sequences still being prefilled (ended ones not counted).
    pub fn len(&self) -> (usize, usize) {
        let running = self.rows.len() + usize::from(self.solo.is_some()) - self.leaving.len();
        (running, self.waiting.len() + self.group.as_ref().map_or(0, Group::len))
    }

    pub fn is_idle(&self) -> bool {
        self.rows.is_empty() && self.waiting.is_empty() && self.group.is_none() && self.solo.is_none()
    }

    /// Queues sequence `id` with `prompt`; returns how many leading prompt tokens came from the
    /// prefix pool (they are not computed again).
    pub fn add(&mut self, id: u64, prompt: Vec<u32>, params: SeqParams) -> Result<usize> {
        self.add_constrained(id, prompt, params, None)
    }

    /// [`BatchEngine::add`] with every token of the sequence masked by `constraint`.
    pub fn add_constrained(&mut self, id: u64, prompt: Vec<u32>, params: SeqParams, constraint: Option<Box<dyn TokenConstraint>>) -> Result<usize> {
        self.add_speculative(id, prompt, params, constraint, SeqSpeculation::default())
    }

    /// [`BatchEngine::add_constrained`] with the sequence's speculation settings (draft tokens
    /// only where the engine speculates).
    pub fn add_speculative(&mut self, id: u64, prompt: Vec<u32>, params: SeqParams, constraint: Option<Box<dyn TokenConstraint>>, spec: SeqSpeculation) -> Result<usize> {
        if prompt.is_empty() {
            return Err(EngineError::Invalid("the prompt is empty: there is nothing to continue".into()));
        }
        params.sampler.validate()?;
        params.sampler.validate_vocab(self.model.vocab_size())?;
        // Sequences that ended leave their keys and values in the prefix pool first, so that this
        // prompt finds them (a chat's next turn).
        self.drop_leaving()?;
        let draft = self.seq_draft(spec, &params)?;
        let n_layers = self.layers;
        if !self.batchable {
            let cache = self.model.make_cache();
            self.waiting.push_back(Prefill { id, prompt, params, done: 0, cache, constraint, draft });
            return Ok(0);
        }
        if let Some(states) = self.states.as_mut() {
            let (done, cache) = states.lookup(&prompt)?.unwrap_or_else(|| (0, self.model.make_cache()));
            self.waiting.push_back(Prefill { id, prompt, params, done, cache, constraint, draft });
            return Ok(done);
        }
        let (done, cache): (usize, Vec<Box<dyn KvCache>>) = match self.prefix.as_ref().map(|p| p.lookup(&prompt)).transpose()? {
            Some((n, kv)) if n > 0 && kv.len() == n_layers => {
                let cache = kv
                    .into_iter()
                    .map(|(k, v)| GrowingCache::from_state(Some(k), Some(v), n as i32).map(|c| Box::new(c) as Box<dyn KvCache>))
                    .collect::<Result<_>>()?;
                (n, cache)
            }
            _ => (0, self.model.make_cache()),
        };
        self.waiting.push_back(Prefill { id, prompt, params, done, cache, constraint, draft });
        Ok(done)
    }

    /// Why sequence `id`'s constraint ended it early, if it has one that did.
    pub fn constraint_note(&self, id: u64) -> Option<String> {
        let row = self.rows.iter().find(|r| r.id == id)?;
        row.constraint.as_ref().and_then(|c| c.note())
    }

    /// Ends sequence `id` (finished or cancelled) before the next step; it is forgotten if it is
    /// still waiting. Its keys and values go to the prefix pool.
    pub fn finish(&mut self, id: u64) {
        if let Some(i) = self.waiting.iter().position(|p| p.id == id) {
            self.waiting.remove(i);
        } else if self.group.as_mut().is_some_and(|g| g.remove(id)) {
            self.group = None;
        } else if self.rows.iter().any(|r| r.id == id) || self.solo.as_ref().is_some_and(|s| s.id == id) {
            self.leaving.push(id);
        }
    }

    /// Prefills waiting sequences (up to a chunk of prompt tokens), lets the prefilled ones join,
    /// and decodes one token for every running sequence. Returns the tokens handed out (at most one
    /// per sequence; a sequence that just joined hands out its first).
    pub fn step(&mut self) -> Result<Vec<StepToken>> {
        let waits0 = mlx::host_waits();
        let mut clock = Instant::now();
        let mut times = [std::time::Duration::ZERO; 7];
        self.drop_leaving()?;
        lap(&mut times[0], &mut clock);
        // With a forward pass ahead the rows decode on as they are: no sequence goes alone and
        // newcomers join at the next step.
        let joined = if self.ahead.is_some() {
            Vec::new()
        } else {
            if let Some(out) = self.solo_step()? {
                self.steps += 1;
                return Ok(out);
            }
            self.prefill_some()?
        };
        lap(&mut times[1], &mut clock);
        if !joined.is_empty() {
            self.join(joined)?;
        }
        lap(&mut times[2], &mut clock);
        let Some(current) = self.pending.take() else {
            self.add_trace(&times, 0, waits0);
            return Ok(Vec::new());
        };
        let constrained = self.rows.iter().any(|r| r.constraint.is_some());
        let ids = if constrained || self.ahead.is_some() {
            // The forward pass runs while this step's tokens are committed and the masks computed.
            let logits = match self.ahead.take() {
                Some(logits) => logits,
                None => {
                    let logits = self.forward(&current.tokens)?;
                    async_eval(&[&logits])?;
                    logits
                }
            };
            lap(&mut times[3], &mut clock);
            let ids = match (current.ticket, self.mailbox.get().and_then(Option::as_ref)) {
                (Some(ticket), Some(mailbox)) => mailbox.read(ticket, &current.tokens)?,
                _ => current.tokens.to_vec::<u32>()?,
            };
            lap(&mut times[4], &mut clock);
            let vocab = self.model.vocab_size() as usize;
            let masks = commit_and_mask(self.rows.iter_mut().map(|r| r.constraint.as_mut()).zip(ids.iter().copied()).collect(), vocab)?;
            lap(&mut times[6], &mut clock);
            let g0 = Instant::now();
            let mut next = sample_rows(&mut self.rows, Some(&current.tokens), &logits, Some(&masks))?;
            let mut graph = g0.elapsed();
            // The next forward pass, queued behind the sampling unless newcomers or a sequence
            // going alone are due. Through the mailbox (no row reading log-probabilities, which
            // would wait for the whole evaluation) both go in one evaluation and the tokens reach
            // the host as soon as they are sampled; else the sampling is an evaluation of its own,
            // so that reading its tokens does not wait for the forward pass.
            if constrained && !self.newcomers() && !self.last_row_may_go_alone() {
                let mailbox = match next.logprobs.iter().all(Option::is_none) {
                    true => self.mailbox.get_or_init(Mailbox::new).as_ref(),
                    false => None,
                };
                let logits = match mailbox {
                    Some(mailbox) => {
                        let g1 = Instant::now();
                        let (posted, ticket) = mailbox.post(&next.tokens)?;
                        (next.tokens, next.ticket) = (posted, Some(ticket));
                        let logits = self.forward(&next.tokens)?;
                        graph += g1.elapsed();
                        self.queue_with(next, Some(&logits))?;
                        logits
                    }
                    None => {
                        let tokens = next.tokens.clone();
                        self.queue(next)?;
                        let g1 = Instant::now();
                        let logits = self.forward(&tokens)?;
                        graph += g1.elapsed();
                        async_eval(&[&logits])?;
                        logits
                    }
                };
                self.ahead = Some(logits);
            } else {
                self.queue(next)?;
            }
            times[5] = graph;
            lap(&mut times[3], &mut clock);
            ids
        } else {
            // Queue the next step, then read this one.
            let logits = self.forward(&current.tokens)?;
            let next = sample_rows(&mut self.rows, Some(&current.tokens), &logits, None)?;
            times[5] = clock.elapsed();
            self.queue(next)?;
            lap(&mut times[3], &mut clock);
            let ids = current.tokens.to_vec::<u32>()?;
            lap(&mut times[4], &mut clock);
            ids
        };
        let mut out = Vec::with_capacity(ids.len());
        for ((row, &token), logprobs) in self.rows.iter_mut().zip(&ids).zip(current.logprobs) {
            row.tokens.push(token);
            if !std::mem::take(&mut row.skip) {
                row.draft.handed();
                out.push(StepToken { id: row.id, token, logprobs });
            }
        }
        self.steps += 1;
        if self.steps.is_multiple_of(256) {
            crate::prefill::clear_buffer_cache();
        }
        self.add_trace(&times, out.len(), waits0);
        Ok(out)
    }

    /// The trace so far (with `MLX_GEN_TRACE` set), and a fresh one started.
    pub fn take_trace(&mut self) -> Option<StepTrace> {
        self.trace.as_mut().map(std::mem::take)
    }

    /// Adds one step's stage times (drop, prefill, join, build, wait, of build the graph's
    /// building alone, and the constraints' masks) and its tokens to the trace.
    fn add_trace(&mut self, times: &[std::time::Duration; 7], tokens: usize, waits0: u64) {
        if let Some(t) = self.trace.as_mut() {
            t.steps += 1;
            t.waits += mlx::host_waits() - waits0;
            t.tokens += tokens;
            for (stage, d) in [&mut t.drop, &mut t.prefill, &mut t.join, &mut t.build, &mut t.wait, &mut t.graph, &mut t.mask].into_iter().zip(times) {
                *stage += *d;
            }
        }
    }


    /// Starts computing `next` (tokens, log-probabilities, the random streams' states) and keeps
    /// it as the step to hand out next.
    fn queue(&mut self, next: Pending) -> Result<()> {
        self.queue_with(next, None)
    }

    /// [`BatchEngine::queue`], with `also` in the same evaluation.
    fn queue_with(&mut self, next: Pending, also: Option<&Array>) -> Result<()> {
        let mut to_eval: Vec<&Array> = vec![&next.tokens];
        to_eval.extend(next.logprobs.iter().flatten());
        let key_states: Vec<Array> = self.rows.iter().filter_map(|r| r.params.keys.as_ref().map(|k| k.state().clone())).collect();
        to_eval.extend(key_states.iter());
        to_eval.extend(also);
        async_eval(&to_eval)?;
        self.pending = Some(next);
        Ok(())
    }

    /// Removes the rows that `finish` named, leaving their keys and values in the prefix pool.
    fn drop_leaving(&mut self) -> Result<()> {
        if self.leaving.is_empty() {
            return Ok(());
        }
        let leaving = std::mem::take(&mut self.leaving);
        if self.solo.as_ref().is_some_and(|s| leaving.contains(&s.id)) {
            self.drop_solo()?;
        }
        let keep: Vec<usize> = (0..self.rows.len()).filter(|&i| !leaving.contains(&self.rows[i].id)).collect();
        if !self.batchable {
            // The one running sequence left (its own caches go with it).
            if keep.is_empty() {
                self.rows.clear();
                self.caches.clear();
                self.pending = None;
                self.ahead = None;
            }
            return Ok(());
        }
        if let Some(pool) = &self.prefix {
            let mut seqs = Vec::new();
            for (i, row) in self.rows.iter().enumerate().filter(|(i, _)| !keep.contains(i)) {
                let kv = self.caches.iter().map(|c| batch_cache(c.as_ref())?.row(i)).collect::<Result<Vec<_>>>()?;
                let n = row.tokens.len().min(kv.first().map_or(0, |(k, _)| k.dim(2) as usize));
                let kv: Vec<(Array, Array)> = kv.iter().map(|(k, v)| Ok((k.slice_axis(2, 0, n as i32)?, v.slice_axis(2, 0, n as i32)?))).collect::<Result<_>>()?;
                seqs.push((&row.tokens[..n], kv));
            }
            // A full pool only means these sequences are not kept for reuse.
            let _ = pool.store_all(&seqs.iter().map(|(t, kv)| (*t, kv.as_slice())).collect::<Vec<_>>());
        }
        for c in &mut self.caches {
            if let Some(parts) = c.parts_mut() {
                for part in parts {
                    batch_cache_mut(part)?.filter(&keep)?;
                }
                continue;
            }
            match c.as_arrays_mut() {
                Some(a) => a.filter(&keep)?,
                None => batch_cache_mut(c)?.filter(&keep)?,
            }
        }
        let (pending, ahead) = (self.pending.take(), self.ahead.take());
        if !keep.is_empty() {
            let idx: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
            let idx = Array::from_slice(&idx, &[idx.len() as i32])?;
            if let Some(p) = pending {
                let tokens = p.tokens.take(&idx, 0)?;
                let logprobs = keep.iter().map(|&i| p.logprobs[i].clone()).collect();
                self.pending = Some(Pending { tokens, logprobs, ticket: None });
            }
            self.ahead = ahead.map(|logits| logits.take(&idx, 0)).transpose()?; // (kept, vocab)
        }
        let mut i = 0;
        self.rows.retain(|_| {
            i += 1;
            keep.contains(&(i - 1))
        });
        if self.rows.is_empty() {
            self.caches.clear();
        }
        Ok(())
    }

    /// Runs up to `prefill_step_size` padded prompt positions of the waiting sequences, in groups
    /// (see [`prefill`]); returns the groups whose prompts are done, each with its first tokens
    /// queued.
    fn prefill_some(&mut self) -> Result<Vec<Prefilled>> {
        let mut budget = self.prefill_step_size;
        let mut joined = Vec::new();
        while budget > 0 {
            if self.group.is_none() {
                // One sequence at a time where the caches cannot be merged.
                if !self.batchable && (!self.rows.is_empty() || !joined.is_empty() || self.solo.is_some()) {
                    break;
                }
                self.group = Group::take(&mut self.waiting, budget, self.group_rows, self.groups, !self.batchable);
            }
            let Some(group) = self.group.as_mut() else { break };
            if budget < group.rows() && budget < self.prefill_step_size {
                // Not a column of this group left in this step's budget: it goes on next step.
                break;
            }
            let mut ctx = Ctx { model: self.model, states: self.states.as_mut(), trace: &mut self.trace };
            let (spent, done) = group.advance(&mut ctx, budget, self.prefill_step_size)?;
            budget = budget.saturating_sub(spent);
            self.prefilled_since_clear += spent;
            if self.prefilled_since_clear >= crate::prefill::BATCH_CLEAR_POSITIONS {
                self.prefilled_since_clear = 0;
                crate::prefill::clear_buffer_cache();
            }
            if let Some(done) = done {
                self.group = None;
                if !done.rows.is_empty() {
                    joined.push(done);
                }
                if !self.batchable {
                    break;
                }
            }
        }
        Ok(joined)
    }

    /// Adds prefilled sequences to the running batch.
    fn join(&mut self, mut joined: Vec<Prefilled>) -> Result<()> {
        if !self.batchable {
            // The only running sequence (see `prefill_some`), in the model's own caches.
            let mut p = joined.pop().ok_or_else(|| EngineError::Invalid("nothing joined".into()))?;
            if !joined.is_empty() || !self.rows.is_empty() || p.rows.len() != 1 {
                return Err(EngineError::Invalid("a model without batch caches runs one sequence at a time".into()));
            }
            self.caches = p.cache;
            self.rows.push(p.rows.pop().expect("one row"));
            self.pending = Some(p.first);
            return Ok(());
        }
        if self.caches.is_empty() {
            self.caches = self
                .model
                .make_cache()
                .iter_mut()
                .map(|c| {
                    let arrays = c.as_arrays().is_some();
                    match (c.parts_mut(), arrays) {
                        // A cache list: a batch cache for each of its parts.
                        (Some(parts), _) => {
                            let batch = parts.iter().map(|_| Box::new(BatchCache::new()) as Box<dyn KvCache>).collect();
                            Ok(Box::new(ListCache::new(batch)?) as Box<dyn KvCache>)
                        }
                        (None, true) => Ok(Box::new(ArraysCache::batch(2)) as Box<dyn KvCache>),
                        (None, false) => Ok(Box::new(BatchCache::new()) as Box<dyn KvCache>),
                    }
                })
                .collect::<Result<_>>()?;
        }
        let (mut tokens, mut logprobs) = match self.pending.take() {
            Some(p) => (vec![p.tokens], p.logprobs),
            None => (Vec::new(), Vec::new()),
        };
        for mut p in joined {
            for (bc, c) in self.caches.iter_mut().zip(p.cache.iter_mut()) {
                if !p.own {
                    // Batch caches with one row per member.
                    let rows = c.as_batch_mut().map(std::mem::take).ok_or_else(|| EngineError::Invalid("a prefilled group without batch caches".into()))?;
                    batch_cache_mut(bc)?.extend_batch(rows)?;
                    continue;
                }
                // One sequence's own caches, one row per member (a request's choices share them).
                for _ in 0..p.rows.len() {
                    if let (Some(batch), Some(one)) = (bc.parts_mut(), c.parts_mut()) {
                        for (b, o) in batch.iter_mut().zip(one.iter()) {
                            let (k, v) = filled(o.as_ref())?;
                            batch_cache_mut(b)?.extend(&k, &v)?;
                        }
                        continue;
                    }
                    match (bc.as_arrays_mut(), c.as_arrays()) {
                        (Some(batch), Some(one)) => batch.extend(one)?,
                        _ => {
                            let (k, v) = filled(c.as_ref())?;
                            batch_cache_mut(bc)?.extend(&k, &v)?;
                        }
                    }
                }
            }
            tokens.push(p.first.tokens);
            logprobs.extend(p.first.logprobs);
            self.rows.extend(p.rows);
        }
        let tokens = if tokens.len() == 1 { tokens.pop().expect("one") } else { ops::concatenate(&tokens.iter().collect::<Vec<_>>(), 0)? };
        self.pending = Some(Pending { tokens, logprobs, ticket: None });
        Ok(())
    }

    /// One batched forward over `inputs` (B,): the logits (B, vocab).
    fn forward(&mut self, inputs: &Array) -> Result<Array> {
        let b = inputs.dim(0);
        // Every layer's rows are at the same positions: one offsets array serves them all.
        if let Some(offsets) = self.caches.iter().find_map(|c| c.as_batch().and_then(|bc| bc.row_offsets())) {
            for c in &mut self.caches {
                if let Some(bc) = c.as_batch_mut() {
                    bc.share_offsets(&offsets);
                }
            }
        }
        Ok(self.model.forward(&inputs.reshape(&[b, 1])?, &mut self.caches)?.reshape(&[b, -1])?) // (B, vocab)
    }
}

/// The next tokens and per-row log-probabilities of `rows` from `logits` (B, vocab), in one graph
/// ([`crate::sample::rows`]), each constrained row masked by its entry of `masks`; `inputs` (B,):
/// the tokens the logits came from, which join the logits processors' histories (`None` for first
/// tokens, whose history is the prompt).
fn sample_rows(rows: &mut [Row], inputs: Option<&Array>, logits: &Array, masks: Option<&[Option<Vec<u32>>]>) -> Result<Pending> {
    if let Some(inputs) = inputs {
        for (i, row) in rows.iter_mut().enumerate() {
            let procs = &row.params.sampler.processors;
            if !procs.is_empty() && procs.history_needed() != Some(0) {
                let input = inputs.slice_axis(0, i as i32, i as i32 + 1)?;
                row.history = Some(extend_history(row.history.take(), &input, procs.history_needed())?);
            }
        }
    }
    let mut each: Vec<RowSampling<'_>> = rows
        .iter_mut()
        .enumerate()
        .map(|(i, r)| RowSampling { sampler: &r.params.sampler, history: r.history.as_ref(), keys: r.params.keys.as_mut(), allowed: masks.and_then(|m| m[i].as_deref()) })
        .collect();
    let sampled = crate::sample::rows::sample_rows(&mut each, logits)?;
    let logprobs = rows.iter().enumerate().map(|(i, r)| r.params.logprobs.then(|| sampled.row_logprobs(i)).transpose()).collect::<Result<_>>()?;
    Ok(Pending { tokens: sampled.tokens, logprobs, ticket: None })
}

/// Whether every cache the model makes is a plain KV cache (mlx-lm's `KVCache`, which `merge`s
/// into a `BatchKVCache`) or a recurrent state (`ArraysCache`, whose rows are concatenated);
/// rotating (sliding-window layers) and chunked (Llama 4) ones are not batched here (mlx-lm's
/// server cannot batch a `ChunkedKVCache` either).
pub fn is_batchable(model: &dyn Model) -> bool {
    let class_is = |c: &dyn KvCache, names: &[&str]| c.saved_state().is_ok_and(|(class, _)| names.contains(&class));
    // A cache list of KV caches (deepseek_v32's) batches part by part.
    model.make_cache().iter_mut().all(|c| match c.parts_mut() {
        Some(parts) => parts.iter().all(|p| class_is(p.as_ref(), &["KVCache"])),
        None => class_is(c.as_ref(), &["KVCache", "ArraysCache"]),
    })
}

/// Whether the model has layers whose cache is a recurrent state (mlx-lm's `ArraysCache`), whose
/// rows a batch concatenates and filters as mlx-lm's `extend` / `filter`.
fn has_recurrent_layers(model: &dyn Model) -> bool {
    model.make_cache().iter().any(|c| c.as_arrays().is_some())
}

/// Bytes one position of one sequence takes in `model`'s KV caches, from a one-token forward pass
/// (a recurrent layer's state, the same size at every length, is not counted).
pub fn kv_bytes_per_token(model: &dyn Model) -> Result<usize> {
    // A model whose layers keep more than keys and values (cache lists) runs in its own caches;
    // recurrent layers keep their own states.
    let own = model.make_cache();
    let mut cache: Vec<Box<dyn KvCache>> = match own.iter().any(|c| c.saved_state().is_ok_and(|(class, _)| class == "CacheList")) {
        true => own,
        false => own
            .into_iter()
            .map(|c| if c.as_arrays().is_some() { c } else { Box::new(GrowingCache::new()) as Box<dyn KvCache> })
            .collect(),
    };
    model.forward(&Array::from_slice(&[0i32], &[1, 1])?, &mut cache)?;
    let state: Vec<Array> = cache.iter().flat_map(|c| c.state()).collect();
    mlx::eval(&state.iter().collect::<Vec<_>>())?;
    // A growing cache holds whole steps of 256 positions.
    Ok((cache.iter().filter(|c| c.as_arrays().is_none()).map(|c| c.nbytes()).sum::<usize>() / 256).max(1))
}

/// The token history the logits processors start from: the prompt (its last `history_needed`).
fn history_of(sampler: &SamplerConfig, prompt: &[u32]) -> Result<Option<Array>> {
    let procs = &sampler.processors;
    if procs.is_empty() || procs.history_needed() == Some(0) {
        return Ok(None);
    }
    let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    Ok(Some(extend_history(None, &Array::from_slice(&ids, &[ids.len() as i32])?, procs.history_needed())?))
}

/// Counts `positions` prompt positions run in one forward (for the trace).
fn note_prefill(trace: &mut Option<StepTrace>, positions: usize) {
    if let Some(t) = trace.as_mut() {
        t.prefill_positions += positions;
        t.prefill_forwards += 1;
    }
}

fn batch_cache(c: &dyn KvCache) -> Result<&BatchCache> {
    c.as_batch().ok_or_else(|| EngineError::Invalid("the running batch holds a cache that is not a batch cache".into()))
}

fn batch_cache_mut(c: &mut Box<dyn KvCache>) -> Result<&mut BatchCache> {
    c.as_batch_mut().ok_or_else(|| EngineError::Invalid("the running batch holds a cache that is not a batch cache".into()))
}

/// A single sequence's filled keys and values (1, kv_heads, len, D), from its saved state.
fn filled(c: &dyn KvCache) -> Result<(Array, Array)> {
    let (_, nodes) = c.saved_state()?;
    match nodes.as_slice() {
        [StateNode::Array(k), StateNode::Array(v), StateNode::Int(n), ..] => {
            let n = *n as i32;
            Ok((k.slice_axis(2, 0, n)?, v.slice_axis(2, 0, n)?))
        }
        _ => Err(EngineError::Invalid("a prefilled cache without keys and values".into())),
    }
}
