//! Newcomers' prefill for the batch engine, as mlx-lm's `PromptProcessingBatch`: the waiting
//! sequences are taken in arrival order into a group whose padded prompt positions fit the step's
//! budget, and the group runs through the model together, one forward per chunk of columns
//! (`prefill::queue_chunk`). Each row starts from its cached prefix (rows right-aligned,
//! `BatchCache::merge`) and its remaining prompt is right-padded, so that its real positions never
//! see a padded one (causality hides the padding after them); once the prompts are in, each row
//! moves right by its padding (`BatchCache::roll_right`), its last prompt position runs, and its
//! first token is sampled. Sequences with the same prompt and cached prefix (a request's `n`
//! choices) share one row of the prefill and split only when it is done.
//!
//! A group of one row runs in the sequence's own caches (exactly the single-sequence prefill);
//! models whose caches are not plain KV caches (recurrent states, cache lists, rotating windows)
//! only form groups of one row.
use super::solo::SeqDraft;
use super::{filled, history_of, sample_rows, Pending, Row, SeqParams};
use crate::cache::{BatchCache, KvCache, StatePrefixCache};
use crate::error::{EngineError, Result};
use crate::models::Model;
use crate::prefill::queue_chunk;
use crate::sample::constraint::TokenConstraint;
use mlx::{async_eval, Array};
use std::collections::VecDeque;

/// The id of a member removed while its group ran.
const GONE: u64 = u64::MAX;

/// Rows of one group at most by default (mlx-lm's `prefill_batch_size`, mlx_lm.server's
/// `--prompt-concurrency`); [`super::BatchEngine::with_prompt_concurrency`] sets it.
pub(super) const MAX_GROUP_ROWS: usize = 8;

/// A waiting sequence.
pub(super) struct Prefill {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub params: SeqParams,
    /// Positions already in `cache` (from the prefix cache).
    pub done: usize,
    pub cache: Vec<Box<dyn KvCache>>,
    pub constraint: Option<Box<dyn TokenConstraint>>,
    pub draft: SeqDraft,
}

impl Prefill {
    /// The positions the prefill runs: after the cached prefix, up to but not including the last.
    fn rest(&self) -> &[u32] {
        &self.prompt[self.done.min(self.prompt.len() - 1)..self.prompt.len() - 1]
    }

    /// Whether `other` can share this sequence's row (same prompt, same cached prefix).
    fn same_row(&self, other: &Prefill) -> bool {
        self.done == other.done && self.prompt == other.prompt
    }
}

/// Newcomers being prefilled together.
pub(super) struct Group {
    members: Vec<Prefill>,
    /// Per member: its row.
    row_of: Vec<usize>,
    /// Per row: its first member.
    first: Vec<usize>,
    /// Prompt columns run so far (of the longest row's rest).
    col: usize,
    /// One row: the first member's own caches; several: batch caches of the rows.
    cache: Vec<Box<dyn KvCache>>,
    own: bool,
}

/// What a finished group hands to the running batch: its rows, their caches (the one member's own
/// caches, to copy into the batch per member, or batch caches with one row per member) and their
/// first tokens, queued.
pub(super) struct Prefilled {
    pub rows: Vec<Row>,
    pub cache: Vec<Box<dyn KvCache>>,
    pub own: bool,
    pub first: Pending,
}

/// What a group's steps need from the engine.
pub(super) struct Ctx<'a> {
    pub model: &'a dyn Model,
    pub states: Option<&'a mut StatePrefixCache>,
    pub trace: &'a mut Option<super::StepTrace>,
}

impl Group {
    /// Takes waiting sequences from the front of `waiting` while the group's padded positions
    /// (rows times the longest rest) fit `budget` or are at most half padding (the first always
    /// joins; a group runs `budget` positions per step, in chunks of columns); `batched`: whether
    /// several rows may form (plain KV caches only), else only sequences sharing the first's row
    /// join it; `alone`: the first only (a model that runs one sequence at a time).
    pub fn take(waiting: &mut VecDeque<Prefill>, budget: usize, max_rows: usize, batched: bool, alone: bool) -> Option<Group> {
        let head = waiting.pop_front()?;
        if alone {
            return Some(Group { members: vec![head], row_of: vec![0], first: vec![0], col: 0, cache: Vec::new(), own: false });
        }
        let (mut width, mut real) = (head.rest().len(), head.rest().len());
        let mut members = vec![head];
        let (mut row_of, mut first) = (vec![0], vec![0]);
        while let Some(next) = waiting.front() {
            let shared = first.iter().position(|&f| members[f].same_row(next));
            let (rows, w, r) = match shared {
                Some(_) => (first.len(), width, real),
                None if batched => (first.len() + 1, width.max(next.rest().len()), real + next.rest().len()),
                None => break,
            };
            // Padding at most half of the group's positions, unless they all fit this step.
            if rows > max_rows || (rows * w > budget && rows * w > 2 * r) {
                break;
            }
            let next = waiting.pop_front().expect("front exists");
            (width, real) = (w, r);
            row_of.push(shared.unwrap_or(first.len()));
            if shared.is_none() {
                first.push(members.len());
            }
            members.push(next);
        }
        Some(Group { members, row_of, first, col: 0, cache: Vec::new(), own: false })
    }

    /// Whether sequence `id` is a member still wanted.
    pub fn has(&self, id: u64) -> bool {
        id != GONE && self.members.iter().any(|m| m.id == id)
    }

    /// Members still wanted.
    pub fn len(&self) -> usize {
        self.members.iter().filter(|m| m.id != GONE).count()
    }

    /// Forgets member `id` (its row still runs: it may be shared); whether no member is left.
    pub fn remove(&mut self, id: u64) -> bool {
        if let Some(m) = self.members.iter_mut().find(|m| m.id == id) {
            m.id = GONE;
        }
        self.members.iter().all(|m| m.id == GONE)
    }

    /// Rows of the prefill (members sharing a row count once).
    pub fn rows(&self) -> usize {
        self.first.len()
    }

    fn width(&self) -> usize {
        self.first.iter().map(|&f| self.members[f].rest().len()).max().unwrap_or(0)
    }

    /// Runs the next chunk of at most `budget` padded positions (of `full` per step); returns the
    /// positions spent, and the group's rows once every prompt is in (then the group is spent).
    pub fn advance(&mut self, ctx: &mut Ctx<'_>, budget: usize, full: usize) -> Result<(usize, Option<Prefilled>)> {
        if self.cache.is_empty() {
            self.start()?;
        }
        let rows = self.first.len();
        let left = self.width() - self.col;
        if left > 0 {
            // Equal chunks over the steps the rest takes at `full` positions per step, at most what
            // is left of this step's budget (one column at least).
            let steps = (left * rows).div_ceil(full.max(1));
            let mut n = left.div_ceil(steps.max(1)).min(budget / rows).max(1);
            // With snapshots (one row, recurrent layers), each chunk ends at the next block
            // boundary at the latest.
            let head = &self.members[self.first[0]];
            let done = head.done + self.col;
            if let Some(bs) = ctx.states.as_ref().map(|s| s.block_size()) {
                n = n.min(bs - done % bs);
            }
            let mut ids = Vec::with_capacity(rows * n);
            for &f in &self.first {
                let rest = self.members[f].rest();
                ids.extend((self.col..self.col + n).map(|c| rest.get(c).map_or(0, |&t| t as i32)));
            }
            queue_chunk(ctx.model, &mut self.cache, &Array::from_slice(&ids, &[rows as i32, n as i32])?, None)?; // (rows, n)
            super::note_prefill(ctx.trace, rows * n);
            self.col += n;
            if let Some(states) = ctx.states.as_deref_mut().filter(|s| (done + n).is_multiple_of(s.block_size())) {
                states.store(&self.members[self.first[0]].prompt[..done + n], &self.cache)?;
            }
            return Ok((rows * n, None));
        }
        Ok((rows, Some(self.finish(ctx)?)))
    }

    /// The group's caches: the first member's own for one row, else batch caches of the rows'
    /// cached prefixes.
    fn start(&mut self) -> Result<()> {
        if self.first.len() == 1 {
            self.cache = std::mem::take(&mut self.members[0].cache);
            self.own = true;
            return Ok(());
        }
        let layers = self.members[0].cache.len();
        self.cache = (0..layers)
            .map(|l| {
                let rows = self
                    .first
                    .iter()
                    .map(|&f| {
                        let m = &self.members[f];
                        (m.done > 0).then(|| filled(m.cache[l].as_ref())).transpose()
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(Box::new(BatchCache::merge(&rows)?) as Box<dyn KvCache>)
            })
            .collect::<Result<_>>()?;
        for m in &mut self.members {
            m.cache.clear();
        }
        Ok(())
    }

    /// Every prompt is in: rows aligned, last positions run, rows split per member and first tokens
    /// sampled. The prompts go to the prefix pool with their answers when their sequences end (as
    /// mlx_lm.server caches a prompt after its request): storing every group's prompts here as
    /// well cost 15-20% of the Llama-3.2-3B shape's 32-stream throughput on an H100 (BENCHMARKS.md
    /// 2026-12-07f) for requests that reuse a prefix still being decoded.
    fn finish(&mut self, ctx: &mut Ctx<'_>) -> Result<Prefilled> {
        let width = self.width();
        if !self.own {
            let shift: Vec<i32> = self.first.iter().map(|&f| (width - self.members[f].rest().len()) as i32).collect();
            if shift.iter().any(|&s| s > 0) {
                let index = BatchCache::roll_index(&shift, self.cache[0].offset())?;
                for c in &mut self.cache {
                    batch_mut(c)?.roll_right(&shift, &index)?;
                }
            }
        }
        // The last prompt position of every row: its logits give the first token.
        let last: Vec<i32> = self.first.iter().map(|&f| *self.members[f].prompt.last().expect("non-empty prompt") as i32).collect();
        let rows = last.len() as i32;
        let logits = ctx.model.forward(&Array::from_slice(&last, &[rows, 1])?, &mut self.cache)?.reshape(&[rows, -1])?; // (rows, vocab)
        super::note_prefill(ctx.trace, rows as usize);
        // One row per member still wanted.
        let row_of: Vec<usize> = self.members.iter().zip(&self.row_of).filter(|(m, _)| m.id != GONE).map(|(_, &r)| r).collect();
        let logits = if row_of == (0..self.first.len()).collect::<Vec<_>>() {
            logits
        } else {
            if !self.own {
                for c in &mut self.cache {
                    batch_mut(c)?.filter(&row_of)?;
                }
            }
            logits.take(&Array::from_slice(&row_of.iter().map(|&r| r as i32).collect::<Vec<_>>(), &[row_of.len() as i32])?, 0)? // (members, vocab)
        };
        self.sample_first(ctx, &logits)
    }

    /// The members' first tokens from `logits` (one row per member still wanted, in order).
    fn sample_first(&mut self, ctx: &mut Ctx<'_>, logits: &Array) -> Result<Prefilled> {
        let vocab = ctx.model.vocab_size() as usize;
        let mut rows = Vec::with_capacity(self.members.len());
        let mut masks = Vec::with_capacity(self.members.len());
        for mut m in self.members.drain(..).filter(|m| m.id != GONE) {
            masks.push(m.constraint.as_mut().map(|c| c.allowed_bits(vocab)).transpose()?);
            let history = history_of(&m.params.sampler, &m.prompt)?;
            rows.push(Row { id: m.id, params: m.params, tokens: m.prompt, history, constraint: m.constraint, draft: m.draft, skip: false });
        }
        let constrained = masks.iter().any(Option::is_some);
        let first = sample_rows(&mut rows, None, logits, constrained.then_some(masks.as_slice()))?;
        let mut to_eval: Vec<&Array> = vec![&first.tokens];
        to_eval.extend(first.logprobs.iter().flatten());
        async_eval(&to_eval)?;
        Ok(Prefilled { rows, cache: std::mem::take(&mut self.cache), own: self.own, first })
    }
}

fn batch_mut(c: &mut Box<dyn KvCache>) -> Result<&mut BatchCache> {
    c.as_batch_mut().ok_or_else(|| EngineError::Invalid("a prefill group holds a cache that is not a batch cache".into()))
}
