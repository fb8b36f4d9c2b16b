//! Prompt-lookup rounds pipelined the way plain decoding pipelines its steps: while one
//! verification runs on the device, the next is built and queued on the assumption that the
//! running one accepts all its drafts (its input is the running round's lazy bonus token, its
//! drafts the lookup over the text with the running round's drafts appended). When the running
//! round does accept everything, the next one is already in flight; when it rejects a draft, the
//! queued round is given up (the cache is rewound past it: an offset change) and the next round
//! is built from the target's token. The bet is only placed after a round that accepted all its
//! drafts (a rejection is often followed by more), so a run of rejections costs no wasted
//! verification. A round without drafts is a plain step, so a text with nothing to look up
//! decodes as pipelined plain decoding.
//!
//! With a draft model the same bet queues less: the next round's first draft step, fed the running
//! round's last draft and its lazy bonus token, so the host encodes it while the device verifies
//! instead of the device waiting for it at the start of the next round. A rejection takes its two
//! positions back out of the draft cache.
//!
//! Used for greedy decoding without logits processors over trimmable caches (tokens are plain
//! decoding's either way; sampled runs keep one draw per round in mlx-lm's order).
use super::{prompt_lookup, step, Draft, SpeculativeGenerator, Verify};
use crate::cache::trim_prompt_cache;
use crate::error::Result;
use crate::pace::Phase;
use mlx::{ops, Array};
use std::time::Instant;

/// A queued verification and the drafts it checks.
pub(super) struct Inflight {
    v: Verify,
    drafted: Vec<u32>,
}

impl Inflight {
    /// The positions the queued round added to the cache.
    pub(super) fn positions(&self) -> usize {
        self.v.real
    }
}

impl SpeculativeGenerator<'_> {
    /// Queues a verification of `drafted` after the pending input `y` (1,).
    fn queue_lookup(&mut self, y: &Array, drafted: Vec<u32>) -> Result<Inflight> {
        let draft = if drafted.is_empty() { None } else { Some(Array::from_slice(&drafted, &[drafted.len() as i32])?) };
        let v = self.queue_verify(y, draft.as_ref(), drafted.len(), None)?;
        mlx::async_eval(&[&v.tokens, &v.logprobs])?;
        Ok(Inflight { v, drafted })
    }

    /// One pipelined prompt-lookup round: read the round in flight (queued now if there is none),
    /// after queuing the one that follows it.
    pub(super) fn lookup_round_pipelined(&mut self, ngram: usize) -> Result<()> {
        let t0 = Instant::now();
        let max = self.config.max_tokens.unwrap_or(usize::MAX);
        let cur = match self.inflight.take() {
            Some(c) => c,
            None => {
                let y = Array::from_slice(&self.y, &[self.y.len() as i32])?;
                let drafted = prompt_lookup(&self.seq, ngram, (max - self.ntoks).min(self.k));
                self.queue_lookup(&y, drafted)?
            }
        };
        let nd = cur.drafted.len();
        // The next round, as if `cur` accepted all its drafts (none that could pass max_tokens).
        let assumed = self.ntoks + nd + 1;
        let next = if assumed < max && self.all_accepted && !self.leaving_speculation() {
            let mark = self.seq.len();
            self.seq.extend_from_slice(&cur.drafted);
            // The lookup's first token guesses `cur`'s bonus token, which is the next input.
            let found = prompt_lookup(&self.seq, ngram, (max - assumed).min(self.k) + 1);
            self.seq.truncate(mark);
            let drafted = found.get(1..).map(<[u32]>::to_vec).unwrap_or_default();
            let bonus = cur.v.tokens.slice_axis(0, nd as i32, nd as i32 + 1)?; // (1,), lazy
            Some(self.queue_lookup(&bonus, drafted)?)
        } else {
            None
        };
        let t_queued = Instant::now();
        let tokens: Vec<u32> = cur.v.tokens.to_vec()?;
        let t_read = Instant::now();
        let before = self.ntoks;
        let n = self.accept(&tokens, &cur.drafted, &cur.v.logprobs)?;
        self.all_accepted = n == nd;
        match next {
            Some(nx) if n == nd && !self.done => self.inflight = Some(nx),
            next => {
                // Rewinds the rejected drafts and the round queued after them.
                let queued = next.map_or(0, |nx| nx.v.real);
                if queued > 0 {
                    self.stats.discarded += 1;
                }
                trim_prompt_cache(&mut self.cache, (nd - n + queued) as i32)?;
                self.y = vec![tokens[n]];
            }
        }
        if let Some(t) = self.trace.as_mut() {
            t.verify_s += (t_read - t_queued).as_secs_f64();
            t.host_s += (t_queued - t0).as_secs_f64() + t_read.elapsed().as_secs_f64();
        }
        self.finish_round(nd, n, self.ntoks - before, t0);
        if self.leaving_speculation() {
            // The fallback goes plain: the round in flight is given up.
            if let Some(nx) = self.inflight.take() {
                self.stats.discarded += 1;
                trim_prompt_cache(&mut self.cache, nx.v.real as i32)?;
                self.y = vec![tokens[n]];
            }
        }
        Ok(())
    }

    /// Whether the fallback has switched to plain decoding.
    pub(super) fn leaving_speculation(&self) -> bool {
        self.pace.as_ref().is_some_and(|p| matches!(p.phase(), Phase::Plain { .. }))
    }

    /// A draft model's first draft step of the next round, queued behind `v` (the verification of
    /// `num_draft` drafts, the last of them `last`) on the bet that `v` accepts them all: fed that
    /// draft and `v`'s bonus token, lazily. `v`'s tokens, log-probabilities and `input` (its fed
    /// tokens) are queued first as an evaluation of their own, so reading them does not wait for the
    /// step. Only pipelined, after a round that accepted everything, with a next round to draft for.
    pub(super) fn queue_draft_ahead(&mut self, v: &Verify, input: &Array, last: Option<&Array>) -> Result<Option<Array>> {
        let num_draft = v.tokens.dim(0) as usize - 1;
        let max = self.config.max_tokens.unwrap_or(usize::MAX);
        if !self.pipelined || !self.all_accepted || self.ntoks + num_draft + 1 >= max || self.leaving_speculation() {
            return Ok(None);
        }
        let (Draft::Model { model, cache }, Some(last)) = (&mut self.draft, last) else { return Ok(None) };
        mlx::async_eval(&[&v.tokens, &v.logprobs, input])?;
        let bonus = v.tokens.slice_axis(0, num_draft as i32, num_draft as i32 + 1)?; // (1,)
        let fed = ops::concatenate(&[last, &bonus], 0)?; // (2,): the draft_y of a fully accepted round
        let (d, _) = step(*model, cache, &fed, 1, &self.config, &mut self.history, self.keys.as_mut())?; // (1,)
        mlx::async_eval(&[&d])?;
        Ok(Some(d))
    }

    /// After a round: keeps `ahead` (from [`Self::queue_draft_ahead`]) for the next round when this
    /// one accepted all its drafts, else takes its two fed positions back out of the draft cache;
    /// with `None`, gives up a kept one (the fallback going plain).
    pub(super) fn settle_draft_ahead(&mut self, ahead: Option<Array>) -> Result<()> {
        let give_up = match ahead {
            Some(d) if self.all_accepted && !self.done => {
                self.draft_ahead = Some(d);
                false
            }
            Some(_) => true,
            None => self.draft_ahead.take().is_some(),
        };
        if let (true, Draft::Model { cache, .. }) = (give_up, &mut self.draft) {
            self.stats.discarded += 1;
            trim_prompt_cache(cache, 2)?;
        }
        Ok(())
    }
}
