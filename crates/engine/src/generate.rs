//! The token generator, mlx-lm's `generate_step`: the prompt is prefilled in chunks up to its last
//! token, then each step queues the next forward pass (async eval) before the current token is
//! handed out, so the host never waits on the device between tokens. With logits processors the
//! token history (prompt, then each sampled token) is kept as a lazy array, as mlx-lm does.
//! With a [`TokenConstraint`] each step reads the previous token and computes the next token mask
//! on the CPU while the device runs the forward pass over that token (see `sample::constraint`),
//! and queues the masked sampling with the following forward pass over the sampled (lazy) token
//! before handing the previous one out, so the device does not wait for the host's graph building;
//! the token reaches the host through an [`mlx::Mailbox`] as soon as it is sampled (two evaluations,
//! the sampling first, where there is none or the caller reads log-probabilities).
use crate::cache::{maybe_quantize_kv_cache, KvCache, KvQuantConfig};
use crate::prefill::prefill;
use crate::error::{EngineError, Result};
use crate::models::Model;
use crate::sample::processors::extend_history;
use crate::sample::constraint::TokenConstraint;
use crate::sample::SamplerConfig;
use mlx::{async_eval, Array, Mailbox, Ticket};

#[derive(Clone, Debug)]
pub struct GenerateConfig {
    /// Tokens to generate at most; `None` for no limit.
    pub max_tokens: Option<usize>,
    /// Prompt tokens per prefill forward pass.
    pub prefill_step_size: usize,
    pub sampler: SamplerConfig,
    /// `--kv-bits`: caches are quantized once they hold `start` positions (mlx-lm's
    /// `maybe_quantize_kv_cache`, after each prefill chunk and each step).
    pub kv_quant: Option<KvQuantConfig>,
}

impl GenerateConfig {
    /// What every generator checks before it starts: a prompt to continue, sampler settings valid
    /// for `model`'s vocabulary, a prefill step of at least one token, valid KV quantization.
    pub fn validate(&self, model: &dyn Model, prompt: &[u32]) -> Result<()> {
        if prompt.is_empty() {
            return Err(EngineError::Invalid("the prompt is empty: there is nothing to continue".into()));
        }
        self.sampler.validate()?;
        self.sampler.validate_vocab(model.vocab_size())?;
        if self.prefill_step_size == 0 {
            return Err(EngineError::Invalid("prefill step size must be at least 1".into()));
        }
        if let Some(q) = &self.kv_quant {
            q.validate()?;
        }
        Ok(())
    }
}

impl Default for GenerateConfig {
    fn default() -> Self {
        GenerateConfig { max_tokens: Some(256), prefill_step_size: 2048, sampler: SamplerConfig::default(), kv_quant: None }
    }
}

/// One generated token with the log-probabilities it was drawn from.
pub struct Generated {
    pub token: u32,
    /// (vocab,)
    pub logprobs: Array,
}

/// Yields generated tokens; the caller stops it at EOS (or simply drops it).
pub struct Generator<'m> {
    model: &'m dyn Model,
    cache: Vec<Box<dyn KvCache>>,
    config: GenerateConfig,
    /// The token being handed out next and its log-probabilities, already queued.
    pending: Option<(Array, Array)>,
    n: usize,
    /// The latest tokens the logits processors read (prompt, then sampled), when there are any.
    history: Option<Array>,
    /// With MLX_GEN_TRACE set: seconds spent building+queueing steps, waiting for tokens, steps,
    /// of the first, seconds spent building the graph alone (the rest is MLX's queueing), and with a
    /// constraint, seconds spent committing tokens and computing masks on the host.
    timing: Option<(f64, f64, usize, f64, f64)>,
    /// `mlx::host_waits()` once the prompt was in (the trace's count of device waits per token).
    waits_start: u64,
    /// Constrained decoding: the grammar every sampled token must follow.
    constraint: Option<Box<dyn TokenConstraint>>,
    /// Constrained, with trimmable caches: the logits (1, vocab) of the forward pass over the
    /// pending token, queued already, so the device goes from one forward pass to the next while
    /// the host computes the mask; the caches hold that token's keys and values.
    ahead: Option<Array>,
    /// Constrained, where the device has one (the CPU, CUDA): the mailbox a step's sampled token
    /// goes through when its sampling and the forward pass over it are queued in one evaluation.
    mailbox: std::cell::OnceCell<Option<Mailbox>>,
    /// The post to read the pending token by, where it went through the mailbox.
    ticket: Option<Ticket>,
    /// Whether the caller reads the log-probabilities (then a constrained step queues the sampling
    /// in an evaluation of its own: reading them would wait for the forward pass behind it).
    logprobs_read: bool,
}

impl Drop for Generator<'_> {
    fn drop(&mut self) {
        if let Some((build, wait, n, graph, mask)) = self.timing {
            if n > 0 {
                let mask = if self.constraint.is_some() { format!(", mask {:.3} ms/token", 1e3 * mask / n as f64) } else { String::new() };
                eprintln!(
                    "trace: {n} tokens, build+queue {:.3} ms/token (graph {:.3}, queue {:.3}), wait {:.3} ms/token{mask}, {:.2} evaluations and host reads/token",
                    1e3 * build / n as f64,
                    1e3 * graph / n as f64,
                    1e3 * (build - graph) / n as f64,
                    1e3 * wait / n as f64,
                    (mlx::host_waits() - self.waits_start) as f64 / n as f64
                );
            }
        }
    }
}

/// With `MLX_GEN_TRACE` set, the host's time so far over the generated tokens, in seconds: building
/// the next step's graph, MLX queueing it, and waiting for the token handed out.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTimes {
    pub graph: f64,
    pub queue: f64,
    pub wait: f64,
}

impl<'m> Generator<'m> {
    /// The trace's stage times so far (`None` without `MLX_GEN_TRACE`); the difference between two
    /// tokens' values is what the host did for the later one.
    pub fn step_times(&self) -> Option<StepTimes> {
        self.timing.map(|(build, wait, _, graph, _)| StepTimes { graph, queue: build - graph, wait })
    }

    /// Prefills `prompt` into `cache` (fresh from `model.make_cache()` or continued) and queues the
    /// first token.
    pub fn new(
        model: &'m dyn Model,
        prompt: &[u32],
        cache: Vec<Box<dyn KvCache>>,
        config: GenerateConfig,
    ) -> Result<Generator<'m>> {
        Self::new_constrained(model, prompt, cache, config, None)
    }

    /// [`Generator::new`] with every token masked by `constraint` before sampling.
    pub fn new_constrained(
        model: &'m dyn Model,
        prompt: &[u32],
        cache: Vec<Box<dyn KvCache>>,
        config: GenerateConfig,
        constraint: Option<Box<dyn TokenConstraint>>,
    ) -> Result<Generator<'m>> {
        config.validate(model, prompt)?;
        let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
        let timing = std::env::var_os("MLX_GEN_TRACE").map(|_| (0.0, 0.0, 0, 0.0, 0.0));
        let mut g = Generator { model, cache, config, pending: None, n: 0, history: None, timing, waits_start: 0, constraint, ahead: None, mailbox: Default::default(), ticket: None, logprobs_read: false };
        let (track, keep) = (g.tracks_history(), g.config.sampler.processors.history_needed());
        let mut history = None;
        let all = Array::from_slice(&ids, &[1, ids.len() as i32])?; // (1, L)
        let (step, kv_quant) = (g.config.prefill_step_size, g.config.kv_quant);
        let last = prefill(model, &mut g.cache, &all, step, kv_quant.as_ref(), |chunk| {
            if track {
                history = Some(extend_history(history.take(), chunk, keep)?);
            }
            Ok(())
        })?;
        g.history = history;
        let last = last.reshape(&[-1])?; // (1,)
        let vocab = g.model.vocab_size() as usize;
        let allowed = g.constraint.as_mut().map(|c| c.allowed_bits(vocab)).transpose()?;
        let logits = g.logits(&last)?;
        let (y, logprobs) = g.sample(&logits, allowed.as_deref())?;
        async_eval(&[&y, &logprobs])?;
        g.pending = Some((y, logprobs));
        g.waits_start = mlx::host_waits();
        Ok(g)
    }

    /// Whether the caller reads each token's log-probabilities (off by default): a constrained
    /// generator whose caller does not queues a token's sampling with the forward pass over it and
    /// reads the token through the device's mailbox (see `advance`).
    pub fn set_logprobs_read(&mut self, read: bool) {
        self.logprobs_read = read;
    }

    /// One forward pass over `input` (L,): the sampled next token (1,) and its log-probabilities (vocab,).
    fn step(&mut self, input: &Array) -> Result<(Array, Array)> {
        let logits = self.logits(input)?;
        self.sample(&logits, None)
    }

    /// One forward pass over `input` (L,): the last position's logits (1, vocab), before the
    /// sampling chain (the token history is extended by `input`).
    fn logits(&mut self, input: &Array) -> Result<Array> {
        let len = input.dim(0);
        let logits = self.model.forward(&input.reshape(&[1, len])?, &mut self.cache)?; // (1, L, vocab)
        // (1, vocab): the last position; with one position that is a single reshape (one node less).
        let logits = if len == 1 {
            logits.reshape(&[1, -1])?
        } else {
            logits.slice_axis(1, -1, i32::MAX)?.squeeze(&[1])?
        };
        let processors = &self.config.sampler.processors;
        if !processors.is_empty() && self.tracks_history() {
            self.history = Some(extend_history(self.history.take(), input, processors.history_needed())?);
        }
        maybe_quantize_kv_cache(&mut self.cache, self.config.kv_quant.as_ref())?;
        Ok(logits)
    }

    /// logits (1, vocab) -> the sampled token (1,) and the log-probabilities (vocab,), through the
    /// sampling chain, with the constraint's mask `allowed` when given.
    fn sample(&mut self, logits: &Array, allowed: Option<&[u32]>) -> Result<(Array, Array)> {
        let (sampled, logprobs) = self.config.sampler.process_and_sample_masked(logits, self.history.as_ref(), None, allowed)?; // (1,), (1, vocab)
        Ok((sampled, logprobs.squeeze(&[0])?))
    }

    /// Whether the penalties need the token history.
    fn tracks_history(&self) -> bool {
        self.config.sampler.processors.history_needed() != Some(0)
    }

    /// The caches as they stand (the queued step may still be filling them).
    pub fn cache(&self) -> &[Box<dyn KvCache>] {
        &self.cache
    }

    /// The caches, for reuse by a following turn (without a constrained step's forward ahead:
    /// they end where the unconstrained generator's end).
    pub fn into_cache(mut self) -> Vec<Box<dyn KvCache>> {
        if self.ahead.take().is_some() {
            for c in &mut self.cache {
                // Queued ahead only over trimmable caches.
                let _ = c.trim(1);
            }
        }
        std::mem::take(&mut self.cache)
    }

    /// Tokens handed out so far.
    pub fn count(&self) -> usize {
        self.n
    }

    /// Why the constraint ended generation early, if it did (see [`TokenConstraint::note`]).
    pub fn constraint_note(&self) -> Option<String> {
        self.constraint.as_ref().and_then(|c| c.note())
    }

    fn advance(&mut self) -> Result<Option<Generated>> {
        if self.config.max_tokens == Some(self.n) {
            return Ok(None);
        }
        let Some((y, logprobs)) = self.pending.take() else { return Ok(None) };
        // Queue the next step before waiting on this one (skipped when this is the last token).
        let t0 = std::time::Instant::now();
        let last = self.config.max_tokens == Some(self.n + 1);
        let t1;
        // Host seconds of this token outside the wait: the graphs built (and of them, the forward's
        // alone) and, constrained, the commit and mask.
        let (mut graph, mut after, mut mask) = (None, 0.0, 0.0);
        let token;
        if let Some(mut c) = self.constraint.take() {
            // Forward n+1 (queued ahead by the previous token's step where it could be) runs while
            // token n is committed and the mask for n+1 computed.
            let logits = match (last, self.ahead.take()) {
                (true, _) => None,
                (false, Some(l)) => Some(l),
                (false, None) => {
                    let l = self.logits(&y)?;
                    async_eval(&[&l])?;
                    Some(l)
                }
            };
            t1 = std::time::Instant::now();
            token = match (self.ticket.take(), self.mailbox.get().and_then(Option::as_ref)) {
                (Some(ticket), Some(mailbox)) => mailbox.read(ticket, &y)?[0],
                _ => y.item::<u32>()?,
            };
            let waited = std::time::Instant::now();
            let next = (|| -> Result<Option<(Array, Array)>> {
                c.commit(token)?;
                match &logits {
                    Some(l) => {
                        let allowed = c.allowed_bits(self.model.vocab_size() as usize)?;
                        mask = waited.elapsed().as_secs_f64();
                        let (mut y, logprobs) = self.sample(l, Some(&allowed))?;
                        // Forward n+2 over the sampled (lazy) token, not past max_tokens, and only
                        // where the caches can drop it again (`into_cache`). Through the mailbox
                        // (log-probabilities unread) both go in one evaluation and token n+1
                        // reaches the host as soon as it is sampled; else the sampling is an
                        // evaluation of its own, so that reading token n+1 does not wait for it.
                        let needed = self.config.max_tokens.is_none_or(|m| self.n + 2 < m);
                        if needed && self.cache.iter().all(|c| c.is_trimmable()) {
                            let mailbox = if self.logprobs_read { None } else { self.mailbox.get_or_init(Mailbox::new).as_ref() };
                            let ahead = match mailbox {
                                Some(mailbox) => {
                                    let (posted, ticket) = mailbox.post(&y)?;
                                    (y, self.ticket) = (posted, Some(ticket));
                                    let ahead = self.logits(&y)?;
                                    async_eval(&[&y, &logprobs, &ahead])?;
                                    ahead
                                }
                                None => {
                                    async_eval(&[&y, &logprobs])?;
                                    let ahead = self.logits(&y)?;
                                    async_eval(&[&ahead])?;
                                    ahead
                                }
                            };
                            self.ahead = Some(ahead);
                        } else {
                            async_eval(&[&y, &logprobs])?;
                        }
                        Ok(Some((y, logprobs)))
                    }
                    None => Ok(None),
                }
            })();
            after = waited.elapsed().as_secs_f64() - mask;
            self.constraint = Some(c);
            self.pending = next?;
        } else {
            if !last {
                let next = self.step(&y)?;
                graph = Some(t0.elapsed().as_secs_f64());
                async_eval(&[&next.0, &next.1])?;
                self.pending = Some(next);
            }
            t1 = std::time::Instant::now();
            token = y.item::<u32>()?;
        }
        if let Some(t) = self.timing.as_mut() {
            let wait = t1.elapsed().as_secs_f64() - after - mask;
            t.0 += (t1 - t0).as_secs_f64() + after;
            t.1 += wait;
            t.2 += 1;
            t.3 += graph.unwrap_or((t1 - t0).as_secs_f64());
            t.4 += mask;
        }
        if self.n.is_multiple_of(256) {
            crate::prefill::clear_buffer_cache();
        }
        self.n += 1;
        Ok(Some(Generated { token, logprobs }))
    }
}

impl Iterator for Generator<'_> {
    type Item = Result<Generated>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.advance() {
            Ok(Some(g)) => Some(Ok(g)),
            Ok(None) => None,
            Err(e) => {
                self.pending = None;
                Some(Err(e))
            }
        }
    }
}
