//! The engine thread: it owns the model and does all MLX work, taking jobs from a channel and
//! streaming events back per job. It runs continuous batching ([`engine::batch::BatchEngine`]):
//! at every step it admits waiting jobs (each of a job's `n` choices is one sequence) while the
//! batch has room and the KV budget allows, decodes one token for every running sequence, and
//! lets finished or abandoned ones go. Prompts start from the longest prefix the prefix pool
//! (a [`engine::cache::PagedPool`]) holds from earlier requests. Jobs arrive rendered and
//! tokenised ([`crate::prepare`], in the handlers); the engine thread only compiles grammars.
//! With `MLX_GEN_TRACE` set it times its stages ([`crate::trace`]).
//!
//! Memory is bounded by what the batch really holds: the batch cache is padded (every row as long
//! as the longest, plus the cache's growth step), so a job is admitted only while the padded batch
//! it makes (rows times the longest reservation, prompt + max_tokens) fits the KV budget; one that
//! can never fit, alone, is refused (`context_length_exceeded`), one that does not fit now waits.
//! A job past its deadline (`--request-timeout`) ends with a 408; the engine reports every step to
//! [`EngineHealth`] (for `/health`). With `serve --draft-model` or `--prompt-lookup`, a request
//! decoding alone runs speculative rounds (see `engine::batch`'s `solo.rs`); each choice's draft
//! counts go out with its `Finish` and into the metrics.
use crate::api::{ApiError, GenParams};
use crate::prepare::{Prepared, Preparer};
use crate::health::{EngineHealth, Fault};
use crate::outbox::Outbox;
use crate::constrain::{compile, Constraints};
use crate::tools::ToolFormat;
use crate::metrics::Metrics;
use crate::lockstep::{new_engine, new_pool, warm_up, BatchOptions, Call, SeqSpec, Share, SpecDrafter, SpecOptions, BLOCK};
use crate::Models;
use engine::batch::{BatchEngine, Drafter, SeqSpeculation, Speculation, StepToken};
use engine::cache::PagedPool;
use engine::sample::{init_random_draws, token_logprobs};
use tokenizer::StreamingDetokenizer;
use engine::LoadedModel;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::Sender;

use crate::stop::StopBuffer;
use crate::trace::{add, WorkerTrace};

/// One request for the engine thread; its events go to `tx` (the job ends when `tx` is dropped).
pub struct Job {
    /// The prompt, rendered and tokenised by the handler ([`crate::prepare`]).
    pub prepared: Prepared,
    pub params: GenParams,
    /// Bounded ([`crate::outbox::EVENT_QUEUE`]); see [`Outbox`].
    pub tx: Sender<Event>,
    pub arrived: Instant,
    /// The job ends with a 408 this long after it arrived (`--request-timeout`).
    pub timeout: Option<Duration>,
}

impl Job {
    fn expired(&self, now: Instant) -> bool {
        self.timeout.is_some_and(|t| now.duration_since(self.arrived) > t)
    }

    fn timeout_error(&self) -> ApiError {
        let secs = self.timeout.map_or(0, |t| t.as_secs());
        ApiError::new(axum::http::StatusCode::REQUEST_TIMEOUT, format!("the request took longer than the server's limit of {secs} s (--request-timeout)"), "request_timeout")
    }
}

/// Columns a batch cache may hold past its longest row (it grows in steps of this many).
const CACHE_STEP: usize = 256;

/// One generated token's log-probability and the most likely alternatives, as text.
#[derive(Clone, Debug)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
}

/// Draft tokens proposed to the model for a choice, and those it accepted (speculative decoding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drafted {
    pub proposed: usize,
    pub accepted: usize,
}

impl Drafted {
    /// Both counts summed (`None` when neither has any).
    pub fn sum(a: Option<Drafted>, b: Option<Drafted>) -> Option<Drafted> {
        match (a, b) {
            (Some(a), Some(b)) => Some(Drafted { proposed: a.proposed + b.proposed, accepted: a.accepted + b.accepted }),
            (a, None) => a,
            (None, b) => b,
        }
    }
}

/// What the engine thread tells the handler of a job.
#[derive(Debug)]
pub enum Event {
    /// The prompt is accepted (always the first event unless `Error`).
    Started {
        prompt_tokens: usize,
        /// Leading prompt tokens taken from the prefix cache (not computed again).
        cached_tokens: usize,
        /// Chat with a reasoning model: whether the template left the model inside `<think>`
        /// (then the answer's `reasoning_content` is split out); `None` otherwise.
        reasoning: Option<bool>,
        /// The format tool calls are parsed from (when the request has active tools).
        tool_format: Option<ToolFormat>,
    },
    /// New text of choice `index` (possibly empty when only log-probabilities are new).
    Delta { index: usize, text: String, logprobs: Vec<TokenLogprob> },
    /// Choice `index` ended: "stop" (EOS or a stop string) or "length"; `note` says why a grammar
    /// ended it early (it dead-ended or failed); `drafted`: its draft tokens when the server
    /// speculates.
    Finish { index: usize, reason: &'static str, completion_tokens: usize, note: Option<String>, stop_sequence: Option<String>, drafted: Option<Drafted> },
    /// The job failed; before `Started`, a 4xx answer.
    Error(ApiError),
}

/// Starts the engine thread, which loads the model with `load` (the model's arrays are made,
/// used and dropped on that thread alone: see `mlx::Array`) and then serves jobs until every
/// sender of its channel is dropped. Returns once the model is loaded and the engine is ready,
/// or with the load's error. Once `stopping` is set, running jobs end at their next token (so
/// that a shutdown never waits on a long stream). A panic of the engine thread is reported to
/// `health` (the thread ends; its jobs' channels close). Returns the thread and what the handlers
/// prepare prompts with.
pub fn spawn(
    load: Box<dyn FnOnce() -> anyhow::Result<Models> + Send>,
    jobs: Receiver<Job>,
    metrics: Arc<Metrics>,
    health: Arc<EngineHealth>,
    stopping: Arc<AtomicBool>,
    options: BatchOptions,
    share: Option<Share>,
) -> anyhow::Result<(std::thread::JoinHandle<()>, Preparer)> {
    let fault = Fault::from_env()?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<Preparer>>();
    let thread = std::thread::Builder::new().name("mlx-gen-engine".into()).spawn(move || {
        let models = match load() {
            Ok(m) => m,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return;
            }
        };
        let mut worker = match Worker::new(&models, &metrics, &health, options, share, fault) {
            Ok(w) => w,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return;
            }
        };
        if worker.options.warm_up {
            // Constrained decoding's token trie, built beside the warm-up (else at the first
            // constrained request, which would stall every stream meanwhile).
            let trie = std::thread::Builder::new().name("mlx-gen-trie".into()).spawn(Constraints::building(&models.model));
            let warmed = warm_up(&models.model, &worker.options, worker.speculation);
            if let Ok(trie) = trie {
                worker.constraints = Some(trie.join().unwrap_or_else(|_| Err("building the vocabulary's token trie failed".into())));
            }
            match warmed {
                Ok((t, proposed)) => {
                    let drafts = if proposed > 0 { format!(" ({proposed} draft tokens verified)") } else { String::new() };
                    eprintln!("mlx-gen: batch engine warmed up in {:.2} s{drafts}", t.as_secs_f64());
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e.context("the warm-up before serving failed (serve --warmup off skips it)")));
                    return;
                }
            }
        }
        let _ = ready_tx.send(Ok(Preparer::new(&models.model)));
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker.run(&jobs, &stopping))) {
            Ok(()) => {
                worker.calls.push(Call::Stop);
                worker.send_calls();
            }
            Err(panic) => {
                let what = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
                drop(worker);
                health.died(format!("the engine thread panicked: {what}"));
            }
        }
    })?;
    match ready_rx.recv() {
        Ok(Ok(preparer)) => Ok((thread, preparer)),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            anyhow::bail!("the engine thread ended while loading the model")
        }
    }
}

/// A job's shared part: its events' way out and settings. The job ends when its last choice and
/// the worker's list of jobs with held events drop it.
struct JobState {
    params: GenParams,
    outbox: Outbox,
    arrived: Instant,
    expires: Option<Instant>,
    timeout: ApiError,
}

/// A queued job and whether its plan has been checked (kept while it waits for room).
struct Queued {
    job: Job,
    checked: bool,
}

/// Sends `ev` to `job`'s handler; a job whose events are held joins `held` (flushed every step).
fn deliver(held: &mut Vec<Rc<JobState>>, job: &Rc<JobState>, ev: Event) {
    if job.outbox.send(ev) && !held.iter().any(|j| Rc::ptr_eq(j, job)) {
        held.push(job.clone());
    }
}

/// One choice of a job: one sequence of the batch.
struct Choice {
    job: Rc<JobState>,
    index: usize,
    detok: StreamingDetokenizer,
    stop: StopBuffer,
    tokens: usize,
    last_token: Option<Instant>,
    first_token_seen: bool,
    /// KV positions reserved for it (prompt + max_tokens).
    reserved: usize,
}

struct Worker<'m> {
    loaded: &'m LoadedModel,
    metrics: &'m Metrics,
    health: &'m EngineHealth,
    fault: Option<Fault>,
    steps: u64,
    /// Jobs whose reader is behind: events held in their outbox.
    held: Vec<Rc<JobState>>,
    options: BatchOptions,
    engine: BatchEngine<'m>,
    pool: Option<PagedPool>,
    xtc_special: Vec<u32>,
    init_draws: usize,
    /// Speculative decoding of a request decoding alone, and the draws the draft model's load
    /// takes from a seed (`generate --draft-model --seed` loads it after the model).
    speculation: Option<Speculation<'m>>,
    draft_draws: usize,
    kv_bytes_per_token: usize,
    choices: HashMap<u64, Choice>,
    next_id: u64,
    unseeded: u64,
    /// With several ranks: the engine calls since the last step, for the other ranks to replay.
    share: Option<Share>,
    calls: Vec<Call>,
    /// The grammar compiler: built beside the warm-up, else at the first constrained request.
    constraints: Option<Result<Constraints, String>>,
    /// `MLX_GEN_TRACE`: the serving steps' time by stage.
    trace: Option<WorkerTrace>,
}

fn invalid(param: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::bad(param, e.to_string())
}

fn engine_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "engine_error")
}

impl<'m> Worker<'m> {
    fn new(models: &'m Models, metrics: &'m Metrics, health: &'m EngineHealth, options: BatchOptions, share: Option<Share>, fault: Option<Fault>) -> anyhow::Result<Worker<'m>> {
        let loaded = &models.model;
        let speculation = speculation(models, options.speculation)?;
        if speculation.is_some() && share.is_some() {
            anyhow::bail!("speculative decoding (--draft-model, --prompt-lookup) is served on one rank only");
        }
        let draft_draws = match (&speculation, &models.draft) {
            (Some(_), Some(d)) => init_random_draws(&d.path, &d.config).unwrap_or(0),
            _ => 0,
        };
        let pool = new_pool(loaded, &options);
        // A sequence keeps its draft model's cache beside its own (it speculates whenever it decodes
        // alone), so each reserved position costs both models' keys and values.
        let draft_bytes = match (&speculation, &models.draft) {
            (Some(_), Some(d)) => engine::batch::kv_bytes_per_token(d.model.as_ref()).unwrap_or(0),
            _ => 0,
        };
        let kv_bytes_per_token = engine::batch::kv_bytes_per_token(loaded.model.as_ref()).unwrap_or(1) + draft_bytes;
        Ok(Worker {
            loaded,
            metrics,
            health,
            fault,
            steps: 0,
            held: Vec::new(),
            engine: new_engine(loaded, &options, pool.clone(), speculation),
            options,
            pool,
            xtc_special: engine::sample::xtc_special_tokens(loaded).unwrap_or_default(),
            init_draws: init_random_draws(&loaded.path, &loaded.config).unwrap_or(0),
            speculation,
            draft_draws,
            kv_bytes_per_token,
            choices: HashMap::new(),
            next_id: 0,
            unseeded: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64),
            share,
            calls: Vec::new(),
            constraints: None,
            trace: WorkerTrace::from_env(),
        })
    }

    /// Prints the trace of the busy stretch that just ended (with `MLX_GEN_TRACE`).
    fn report_trace(&mut self) {
        if let Some(t) = self.trace.as_mut() {
            t.report(self.engine.take_trace());
        }
    }

    fn constraints(&mut self) -> Result<&Constraints, &String> {
        let loaded = self.loaded;
        self.constraints.get_or_insert_with(|| Constraints::new(loaded)).as_ref()
    }

    /// Sends the calls since the last step to the other ranks (with several ranks).
    fn send_calls(&mut self) {
        let calls = std::mem::take(&mut self.calls);
        if let Some(share) = &self.share {
            let bytes = serde_json::to_vec(&calls).unwrap_or_default();
            if let Err(e) = share(&bytes) {
                // A rank is gone: nothing can be computed any more.
                eprintln!("error: cannot reach the other ranks: {e:#}");
                std::process::exit(1);
            }
        }
    }

    /// Adds a sequence; `speculation` applies where the server speculates. A sequence that may
    /// speculate draws from a seed as `generate --draft-model D --seed` (past the draft model's
    /// load too), the others as `generate --seed`.
    fn engine_add(&mut self, spec: SeqSpec, speculation: SeqSpeculation) -> engine::Result<usize> {
        let speculates = self.speculation.is_some() && speculation.num_draft_tokens != Some(0) && spec.grammar.is_none();
        let params = spec.params(self.init_draws + if speculates { self.draft_draws } else { 0 })?;
        let constraint = match &spec.grammar {
            Some(g) => Some(compile(self.constraints(), g)?),
            None => None,
        };
        let r = self.engine.add_speculative(spec.id, spec.prompt.clone(), params, constraint, speculation);
        if self.share.is_some() {
            self.calls.push(Call::Add(Box::new(spec)));
        }
        r
    }

    fn engine_finish(&mut self, id: u64) {
        self.engine.finish(id);
        if self.share.is_some() {
            self.calls.push(Call::Finish(id));
        }
    }

    fn engine_step(&mut self) -> engine::Result<Vec<StepToken>> {
        if self.share.is_some() {
            self.calls.push(Call::Step);
            self.send_calls();
        }
        self.engine.step()
    }

    fn run(&mut self, jobs: &Receiver<Job>, stopping: &AtomicBool) {
        let mut queue: VecDeque<Queued> = VecDeque::new();
        loop {
            if self.choices.is_empty() && queue.is_empty() {
                self.report_trace();
                self.health.waiting();
                // Held events of finished jobs go out as their readers catch up.
                let next = if self.held.is_empty() { jobs.recv().map_err(|_| RecvTimeoutError::Disconnected) } else { jobs.recv_timeout(Duration::from_millis(5)) };
                match next {
                    Ok(job) => queue.push_back(Queued { job, checked: false }),
                    Err(RecvTimeoutError::Timeout) => {
                        self.flush();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => return self.report_trace(),
                }
            }
            if let Some(t) = self.trace.as_mut() {
                t.busy();
            }
            loop {
                match jobs.try_recv() {
                    Ok(job) => queue.push_back(Queued { job, checked: false }),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) if self.choices.is_empty() && queue.is_empty() => return self.report_trace(),
                    Err(TryRecvError::Disconnected) => break,
                }
            }
            if stopping.load(Ordering::Relaxed) {
                for id in self.choices.keys().copied().collect::<Vec<_>>() {
                    self.end(id);
                }
                for _ in queue.drain(..) {
                    self.metrics.queue(-1, 0);
                }
            }
            let clock = Instant::now();
            self.expire(&mut queue);
            self.admit(&mut queue);
            self.drop_abandoned();
            add(&mut self.trace, clock, |t| &mut t.admit);
            let clock = Instant::now();
            self.flush();
            self.publish();
            add(&mut self.trace, clock, |t| &mut t.flush);
            if self.engine.is_idle() {
                continue;
            }
            self.health.step_begins();
            self.steps += 1;
            if let Some(f) = self.fault {
                f.at(self.steps);
            }
            let clock = Instant::now();
            let stepped = self.engine_step();
            add(&mut self.trace, clock, |t| &mut t.step);
            match stepped {
                Ok(tokens) => {
                    let clock = Instant::now();
                    for t in tokens {
                        self.on_token(t);
                    }
                    add(&mut self.trace, clock, |t| &mut t.on_token);
                }
                Err(e) => {
                    // Every running job fails; the engine starts over empty.
                    for id in self.choices.keys().copied().collect::<Vec<_>>() {
                        if let Some(c) = self.choices.get(&id) {
                            deliver(&mut self.held, &c.job, Event::Error(engine_error(&e)));
                        }
                        self.end(id);
                    }
                    self.engine = new_engine(self.loaded, &self.options, self.pool.clone(), self.speculation);
                }
            }
            let clock = Instant::now();
            self.flush();
            self.publish();
            add(&mut self.trace, clock, |t| &mut t.flush);
            if self.trace.as_ref().is_some_and(WorkerTrace::due) {
                self.report_trace();
            }
        }
    }

    /// Sends held events whose readers have room again.
    fn flush(&mut self) {
        self.held.retain(|j| j.outbox.flush());
    }

    /// Ends the jobs past their deadline, queued or running, with a 408.
    fn expire(&mut self, queue: &mut VecDeque<Queued>) {
        let now = Instant::now();
        queue.retain(|q| {
            if !q.job.expired(now) {
                return true;
            }
            let _ = q.job.tx.try_send(Event::Error(q.job.timeout_error()));
            self.metrics.queue(-1, 0);
            false
        });
        let late: Vec<Rc<JobState>> = self.choices.values().filter(|c| c.index == 0 && c.job.expires.is_some_and(|t| now > t)).map(|c| c.job.clone()).collect();
        for job in late {
            self.fail(&job, job.timeout.clone());
        }
    }

    /// Ends every choice of `job` with `error`.
    fn fail(&mut self, job: &Rc<JobState>, error: ApiError) {
        deliver(&mut self.held, job, Event::Error(error));
        for id in self.choices.iter().filter(|(_, c)| Rc::ptr_eq(&c.job, job)).map(|(id, _)| *id).collect::<Vec<_>>() {
            self.end(id);
        }
    }

    /// KV positions the padded batch cache may hold with `rows` more rows of `len` positions each:
    /// every row as long as the longest reservation, plus the cache's growth step.
    fn padded_positions(&self, rows: usize, len: usize) -> usize {
        let longest = self.choices.values().map(|c| c.reserved).chain([len]).max().unwrap_or(0);
        (self.choices.len() + rows) * (longest + CACHE_STEP)
    }

    /// KV positions the budget holds.
    fn budget_positions(&self) -> usize {
        self.options.kv_budget_bytes / self.kv_bytes_per_token
    }

    /// Moves queued jobs into the batch while it has room and the padded batch fits the budget.
    fn admit(&mut self, queue: &mut VecDeque<Queued>) {
        while let Some(q) = queue.front() {
            if q.job.tx.is_closed() {
                queue.pop_front();
                self.metrics.queue(-1, 0);
                continue;
            }
            let need = q.job.params.n;
            if need <= self.options.max_batch && self.choices.len() + need > self.options.max_batch {
                return;
            }
            let mut q = queue.pop_front().expect("front exists");
            self.metrics.queue(-1, 0);
            if need > self.options.max_batch {
                let e = ApiError::bad("n", format!("'n' is {need}, but the server decodes at most {} sequences at once (--max-batch-size)", self.options.max_batch));
                let _ = q.job.tx.try_send(Event::Error(e));
                continue;
            }
            let clock = Instant::now();
            let checked = if q.checked { Ok(()) } else { self.check(&q.job) };
            add(&mut self.trace, clock, |t| &mut t.prepare);
            if let Some(t) = self.trace.as_mut() {
                t.jobs += usize::from(!q.checked);
            }
            if let Err(e) = checked {
                let _ = q.job.tx.try_send(Event::Error(e));
                continue;
            }
            let prompt_len = q.job.prepared.tokens.len();
            let per_choice = prompt_len + q.job.params.max_tokens;
            let budget = self.budget_positions();
            if need * (per_choice + CACHE_STEP) > budget {
                let mut e = ApiError::bad(
                    "max_tokens",
                    format!(
                        "the prompt ({prompt_len} tokens) plus max_tokens ({}) for {need} choice(s) needs more KV cache than the server's budget ({budget} positions, --kv-budget-mb)",
                        q.job.params.max_tokens
                    ),
                );
                e.code = Some("context_length_exceeded");
                let _ = q.job.tx.try_send(Event::Error(e));
                continue;
            }
            if self.padded_positions(need, per_choice) > budget {
                // Waits (first in line) until running sequences give their room back.
                q.checked = true;
                queue.push_front(q);
                self.metrics.queue(1, 0);
                return;
            }
            self.start(q.job, per_choice);
        }
    }

    /// Adds a checked job's choices to the batch and tells its handler it started.
    fn start(&mut self, job: Job, per_choice: usize) {
        let n = job.params.n;
        let timeout = job.timeout_error();
        let expires = job.timeout.map(|t| job.arrived + t);
        let Prepared { tokens: prompt, reasoning, plan } = job.prepared;
        let state = Rc::new(JobState { params: job.params, outbox: Outbox::new(job.tx), arrived: job.arrived, expires, timeout });
        let mut cached = 0;
        for index in 0..n {
            let params = &state.params;
            let (seed, as_generate) = match params.seed {
                Some(seed) => (seed.wrapping_add(index as u64), true),
                None => {
                    self.unseeded = self.unseeded.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    (self.unseeded, false)
                }
            };
            let mut sampler = params.sampler.clone();
            sampler.xtc_special_tokens = self.xtc_special.clone();
            let logprobs = params.logprobs.is_some();
            let grammar = plan.grammar.clone();
            let speculation = SeqSpeculation { num_draft_tokens: params.num_draft_tokens, max_tokens: Some(params.max_tokens) };
            let added = self.engine_add(SeqSpec { id: self.next_id, prompt: prompt.clone(), sampler, seed, as_generate, logprobs, grammar }, speculation);
            match added {
                Ok(c) if index == 0 => cached = c,
                Ok(_) => {}
                Err(e) => return self.fail(&state, invalid("messages", e)),
            }
            if index == 0 {
                deliver(&mut self.held, &state, Event::Started { prompt_tokens: prompt.len(), cached_tokens: cached, reasoning, tool_format: plan.tool_format });
            }
            self.choices.insert(
                self.next_id,
                Choice {
                    job: state.clone(),
                    index,
                    detok: self.loaded.tokenizer.detokenizer(),
                    stop: StopBuffer::new(params.stop.clone()),
                    tokens: 0,
                    last_token: None,
                    first_token_seen: false,
                    reserved: per_choice,
                },
            );
            self.next_id += 1;
        }
        self.metrics.prompt_tokens(prompt.len());
        self.metrics.prefix(cached);
        self.metrics.queue(0, 1);
    }

    /// Checks what the handler could not: that the plan's grammar (and active tools' schemas)
    /// compile.
    fn check(&mut self, job: &Job) -> Result<(), ApiError> {
        let plan = &job.prepared.plan;
        crate::structured::check(plan, &job.params, self.constraints_if(plan.grammar.is_some() || job.params.tools.active()))
    }

    /// The grammar compiler when `needed` (else an `Ok` that is never read).
    fn constraints_if(&mut self, needed: bool) -> Result<&Constraints, &String> {
        if needed {
            return self.constraints();
        }
        static NONE: String = String::new();
        Err(&NONE)
    }

    /// Ends choices whose client went away (within one step).
    fn drop_abandoned(&mut self) {
        let gone: Vec<u64> = self.choices.iter().filter(|(_, c)| c.job.outbox.is_closed()).map(|(id, _)| *id).collect();
        for id in gone {
            self.end(id);
        }
    }

    /// Forgets choice `id`: out of the batch, its reservation back, its draft counts into the
    /// metrics; the job ends with its last choice.
    fn end(&mut self, id: u64) {
        let drafted = self.engine.speculation_stats(id);
        self.engine_finish(id);
        if let Some(c) = self.choices.remove(&id) {
            if let Some(d) = drafted {
                self.metrics.drafted(d.proposed, d.accepted);
            }
            if !self.choices.values().any(|o| Rc::ptr_eq(&o.job, &c.job)) {
                self.metrics.queue(0, -1);
            }
        }
    }

    fn on_token(&mut self, t: StepToken) {
        let Some(c) = self.choices.get_mut(&t.id) else { return };
        let now = Instant::now();
        if !c.first_token_seen {
            c.first_token_seen = true;
            if c.index == 0 {
                self.metrics.ttft(now.duration_since(c.job.arrived).as_secs_f64());
            }
        }
        if self.loaded.is_eos(t.token) {
            let note = self.engine.constraint_note(t.id);
            return self.finish_noted(t.id, "stop", note);
        }
        self.metrics.generated_token(c.last_token.map(|l| now.duration_since(l).as_secs_f64()));
        c.last_token = Some(now);
        c.tokens += 1;
        let mut logprobs = Vec::new();
        if let (Some(k), Some(lp)) = (c.job.params.logprobs, t.logprobs.as_ref()) {
            match token_logprobs(lp, t.token, k) {
                Ok(lp) => {
                    let text = |id: u32| self.loaded.tokenizer.decode(&[id], false).unwrap_or_default();
                    let top = lp.top.iter().map(|&(id, l)| (text(id), l)).collect();
                    logprobs.push(TokenLogprob { token: text(lp.token), logprob: lp.logprob, top });
                }
                Err(e) => {
                    let job = c.job.clone();
                    return self.fail(&job, engine_error(e));
                }
            }
        }
        c.detok.add_token(t.token);
        let (text, hit) = c.stop.push(&c.detok.last_segment());
        if !text.is_empty() || !logprobs.is_empty() {
            deliver(&mut self.held, &c.job, Event::Delta { index: c.index, text, logprobs });
        }
        if hit {
            let stop_sequence = c.stop.matched().map(str::to_owned);
            let drafted = self.engine.speculation_stats(t.id).map(|s| Drafted { proposed: s.proposed, accepted: s.accepted });
            deliver(&mut self.held, &c.job, Event::Finish { index: c.index, reason: "stop", completion_tokens: c.tokens, note: None, stop_sequence, drafted });
            return self.end(t.id);
        }
        if c.tokens >= c.job.params.max_tokens {
            self.finish(t.id, "length");
        }
    }

    /// Ends a choice at EOS or the token limit: the detokenizer's and stop buffer's held text goes out.
    fn finish(&mut self, id: u64, reason: &'static str) {
        self.finish_noted(id, reason, None)
    }

    fn finish_noted(&mut self, id: u64, reason: &'static str, note: Option<String>) {
        let drafted = self.engine.speculation_stats(id).map(|s| Drafted { proposed: s.proposed, accepted: s.accepted });
        if let Some(c) = self.choices.get_mut(&id) {
            c.detok.finalize();
            let (mut text, hit) = c.stop.push(&c.detok.last_segment());
            if !hit {
                text.push_str(&c.stop.flush());
            }
            if !text.is_empty() {
                deliver(&mut self.held, &c.job, Event::Delta { index: c.index, text, logprobs: Vec::new() });
            }
            let stop_sequence = c.stop.matched().map(str::to_owned);
            deliver(&mut self.held, &c.job, Event::Finish { index: c.index, reason: if hit { "stop" } else { reason }, completion_tokens: c.tokens, note, stop_sequence, drafted });
        }
        self.end(id);
    }

    /// Updates the batch and KV gauges (the KV blocks: the padded batch's reservation).
    fn publish(&self) {
        let (running, prefilling) = self.engine.len();
        let blocks = if self.choices.is_empty() { 0 } else { self.padded_positions(0, 0).div_ceil(BLOCK) };
        // Not `usage()`, which counts the used blocks one by one.
        let cached = self.pool.as_ref().map_or(0, PagedPool::cached_blocks);
        self.metrics.batch(running + prefilling, blocks, cached);
    }
}

/// The engine's speculation from `serve`'s options and the loaded draft model, checked.
fn speculation(models: &Models, options: Option<SpecOptions>) -> anyhow::Result<Option<Speculation<'_>>> {
    let speculation = match (options, &models.draft) {
        (None, None) => return Ok(None),
        (Some(SpecOptions { drafter: SpecDrafter::DraftModel, config }), Some(d)) => Speculation { drafter: Drafter::Model(d.model.as_ref()), config },
        (Some(SpecOptions { drafter: SpecDrafter::PromptLookup(ngram), config }), None) => Speculation { drafter: Drafter::PromptLookup { ngram }, config },
        _ => anyhow::bail!("a draft model is loaded exactly when speculation with a draft model is asked for"),
    };
    speculation.check(models.model.model.as_ref())?;
    Ok(Some(speculation))
}
