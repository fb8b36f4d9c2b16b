//! The engine thread: it owns the model and does all MLX work, taking jobs from a channel and streaming events back per job.
//!
//! The loop admits waiting jobs and then advances the running sequence by one token at a time, so
//! that continuous batching can later replace `active: Option<Sequence>` by a set of sequences
//! stepped together, without changing the channels or the events.
use crate::api::{ApiError, GenParams, Prompt};
use crate::metrics::Metrics;
use engine::sample::token_logprobs;
use engine::tokenizer::StreamingDetokenizer;
use engine::{GenerateConfig, Generator, LoadedModel};
use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

use crate::stop::StopBuffer;

/// One request for the engine thread; its events go to `tx` (the job ends when `tx` is dropped).
pub struct Job {
    pub prompt: Prompt,
    pub params: GenParams,
    pub tx: UnboundedSender<Event>,
    pub arrived: Instant,
}

/// One generated token's log-probability and the most likely alternatives, as text.
#[derive(Clone, Debug)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
}

/// What the engine thread tells the handler of a job.
#[derive(Debug)]
pub enum Event {
    /// The prompt is accepted (always the first event unless `Error`).
    Started {
        prompt_tokens: usize,
        /// Chat with a reasoning model: whether the template left the model inside `<think>`
        /// (then the answer's `reasoning_content` is split out); `None` otherwise.
        reasoning: Option<bool>,
    },
    /// New text of choice `index` (possibly empty when only log-probabilities are new).
    Delta { index: usize, text: String, logprobs: Vec<TokenLogprob> },
    /// Choice `index` ended: "stop" (EOS or a stop string) or "length".
    Finish { index: usize, reason: &'static str, completion_tokens: usize },
    /// The job failed; before `Started`, a 4xx answer.
    Error(ApiError),
}

/// Starts the engine thread; it runs until every sender of its channel is dropped. Once `stopping`
/// is set, running jobs end at their next token (so that a shutdown never waits on a long stream).
pub fn spawn(loaded: LoadedModel, jobs: Receiver<Job>, metrics: Arc<Metrics>, stopping: Arc<AtomicBool>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("mlx-gen-engine".into()).spawn(move || run(&loaded, &jobs, &metrics, &stopping))
}

fn run(loaded: &LoadedModel, jobs: &Receiver<Job>, metrics: &Metrics, stopping: &AtomicBool) {
    let xtc_special = engine::sample::xtc_special_tokens(loaded).unwrap_or_default();
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut active: Option<Sequence> = None;
    loop {
        if active.is_none() && queue.is_empty() {
            match jobs.recv() {
                Ok(job) => queue.push_back(job),
                Err(_) => return,
            }
        }
        loop {
            match jobs.try_recv() {
                Ok(job) => queue.push_back(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if active.is_none() && queue.is_empty() => return,
                Err(TryRecvError::Disconnected) => break,
            }
        }
        if active.is_none() {
            if let Some(job) = queue.pop_front() {
                metrics.queue(-1, 1);
                active = Sequence::start(loaded, job, &xtc_special, metrics);
                if active.is_none() {
                    metrics.queue(0, -1);
                }
            }
        }
        if let Some(seq) = active.as_mut() {
            if stopping.load(Ordering::Relaxed) || !seq.step(metrics) {
                active = None;
                metrics.queue(0, -1);
            }
        }
    }
}

/// A job being generated: its choices one after another, each a fresh generator over the prompt.
struct Sequence<'m> {
    loaded: &'m LoadedModel,
    job: Job,
    prompt: Vec<u32>,
    config: GenerateConfig,
    choice: usize,
    generator: Generator<'m>,
    detok: StreamingDetokenizer,
    stop: StopBuffer,
    tokens: usize,
    last_token: Option<Instant>,
    first_token_seen: bool,
}

fn invalid(param: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::bad(param, e.to_string())
}

impl<'m> Sequence<'m> {
    /// Tokenizes and checks the prompt and settings against the model, and prefills the first
    /// choice; on failure the job gets an `Error` event and `None` is returned.
    fn start(loaded: &'m LoadedModel, job: Job, xtc_special: &[u32], metrics: &Metrics) -> Option<Sequence<'m>> {
        match Self::prepare(loaded, &job, xtc_special) {
            Ok((prompt, config, reasoning)) => {
                let _ = job.tx.send(Event::Started { prompt_tokens: prompt.len(), reasoning });
                metrics.prompt_tokens(prompt.len());
                match Generator::new(loaded.model.as_ref(), &prompt, loaded.model.make_cache(), config.clone()) {
                    Ok(generator) => Some(Sequence {
                        loaded,
                        stop: StopBuffer::new(job.params.stop.clone()),
                        job,
                        prompt,
                        config,
                        choice: 0,
                        generator,
                        detok: loaded.tokenizer.detokenizer(),
                        tokens: 0,
                        last_token: None,
                        first_token_seen: false,
                    }),
                    Err(e) => {
                        let _ = job.tx.send(Event::Error(ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "engine_error")));
                        None
                    }
                }
            }
            Err(e) => {
                let _ = job.tx.send(Event::Error(e));
                None
            }
        }
    }

    fn prepare(
        loaded: &LoadedModel,
        job: &Job,
        xtc_special: &[u32],
    ) -> Result<(Vec<u32>, GenerateConfig, Option<bool>), ApiError> {
        let tok = &loaded.tokenizer;
        let mut reasoning = None;
        let (prompt, param) = match &job.prompt {
            Prompt::Chat(messages) => {
                let text = tok.apply_chat_template_json(messages, true, None, &[]).map_err(|e| invalid("messages", e))?;
                if tok.has_thinking() {
                    reasoning = Some(engine::tokenizer::prompt_opens_reasoning(&text));
                }
                (tok.encode(&text, false).map_err(|e| invalid("messages", e))?, "messages")
            }
            Prompt::Text(text) => (tok.encode(text, true).map_err(|e| invalid("prompt", e))?, "prompt"),
            Prompt::Tokens(ids) => (ids.clone(), "prompt"),
        };
        let vocab = loaded.model.vocab_size();
        if prompt.is_empty() {
            return Err(ApiError::bad(param, "the prompt encodes to no tokens"));
        }
        if let Some(bad) = prompt.iter().find(|&&t| i64::from(t) >= i64::from(vocab)) {
            return Err(ApiError::bad(param, format!("token id {bad} is outside the vocabulary (ids 0..{})", vocab - 1)));
        }
        if let Some(ctx) = loaded.config.get("max_position_embeddings").and_then(|v| v.as_u64()) {
            if prompt.len() as u64 >= ctx {
                let mut e = ApiError::bad(param, format!("the prompt has {} tokens; the model's context is {ctx}", prompt.len()));
                e.code = Some("context_length_exceeded");
                return Err(e);
            }
        }
        let mut sampler = job.params.sampler.clone();
        sampler.xtc_special_tokens = xtc_special.to_vec();
        let without_bias = engine::SamplerConfig { processors: Default::default(), ..sampler.clone() };
        without_bias.validate_vocab(vocab).map_err(|e| invalid("top_k", e))?;
        sampler.processors.validate_vocab(vocab).map_err(|e| invalid("logit_bias", e))?;
        if let Some(seed) = job.params.seed {
            engine::sample::seed_as_mlx_lm(seed, loaded).map_err(|e| invalid("seed", e))?;
        }
        let config = GenerateConfig { max_tokens: Some(job.params.max_tokens), sampler, ..GenerateConfig::default() };
        Ok((prompt, config, reasoning))
    }

    /// Hands out one token; false once the job is over (all choices done, failed, or its client gone).
    fn step(&mut self, metrics: &Metrics) -> bool {
        if self.job.tx.is_closed() {
            return false;
        }
        let generated = match self.generator.next() {
            None => return self.finish("length"),
            Some(Err(e)) => {
                let _ = self.job.tx.send(Event::Error(ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "engine_error")));
                return false;
            }
            Some(Ok(g)) => g,
        };
        let now = Instant::now();
        if !self.first_token_seen {
            self.first_token_seen = true;
            metrics.ttft(now.duration_since(self.job.arrived).as_secs_f64());
        }
        if self.loaded.is_eos(generated.token) {
            return self.finish("stop");
        }
        metrics.generated_token(self.last_token.map(|t| now.duration_since(t).as_secs_f64()));
        self.last_token = Some(now);
        self.tokens += 1;
        let mut logprobs = Vec::new();
        if let Some(k) = self.job.params.logprobs {
            match token_logprobs(&generated.logprobs, generated.token, k) {
                Ok(lp) => {
                    let text = |id: u32| self.loaded.tokenizer.decode(&[id], false).unwrap_or_default();
                    let top = lp.top.iter().map(|&(id, l)| (text(id), l)).collect();
                    logprobs.push(TokenLogprob { token: text(lp.token), logprob: lp.logprob, top });
                }
                Err(e) => {
                    let _ = self.job.tx.send(Event::Error(ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "engine_error")));
                    return false;
                }
            }
        }
        self.detok.add_token(generated.token);
        let (text, hit) = self.stop.push(&self.detok.last_segment());
        if !text.is_empty() || !logprobs.is_empty() {
            let _ = self.job.tx.send(Event::Delta { index: self.choice, text, logprobs });
        }
        if hit {
            return self.finish_choice("stop");
        }
        true
    }

    /// Ends the choice at EOS or the token limit: the detokenizer's and stop buffer's held text goes out.
    fn finish(&mut self, reason: &'static str) -> bool {
        self.detok.finalize();
        let (mut text, hit) = self.stop.push(&self.detok.last_segment());
        if !hit {
            text.push_str(&self.stop.flush());
        }
        if !text.is_empty() {
            let _ = self.job.tx.send(Event::Delta { index: self.choice, text, logprobs: Vec::new() });
        }
        self.finish_choice(if hit { "stop" } else { reason })
    }

    /// Reports the choice's end and starts the next choice, if any.
    fn finish_choice(&mut self, reason: &'static str) -> bool {
        let _ = self.job.tx.send(Event::Finish { index: self.choice, reason, completion_tokens: self.tokens });
        self.choice += 1;
        if self.choice >= self.job.params.n {
            return false;
        }
        match Generator::new(self.loaded.model.as_ref(), &self.prompt, self.loaded.model.make_cache(), self.config.clone()) {
            Ok(g) => self.generator = g,
            Err(e) => {
                let _ = self.job.tx.send(Event::Error(ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "engine_error")));
                return false;
            }
        }
        self.detok = self.loaded.tokenizer.detokenizer();
        self.stop = StopBuffer::new(self.job.params.stop.clone());
        self.tokens = 0;
        self.last_token = None;
        true
    }
}
