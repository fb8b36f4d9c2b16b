//! The HTTP routes: OpenAI's chat and text completions (JSON or SSE), models, health and metrics, with API-key checks (in constant time) and JSON errors everywhere.
use crate::api::{self, ApiError};
use crate::health::{EngineHealth, Status};
use crate::metrics::Metrics;
use crate::tools::{Piece, ToolFormat, ToolStream};
use crate::worker::{Drafted, Event, Job, TokenLogprob};
use crate::ServeOptions;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

#[derive(Clone)]
pub struct AppState {
    pub jobs: std::sync::mpsc::Sender<Job>,
    /// Renders and tokenises prompts (on the blocking pool, not the engine thread).
    pub preparer: Arc<crate::prepare::Preparer>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<EngineHealth>,
    pub options: Arc<ServeOptions>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/messages", post(crate::anthropic::messages))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(DefaultBodyLimit::max(state.options.max_body_bytes))
        .with_state(state)
}

async fn auth(State(s): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.options.api_key {
        // The scheme is case-insensitive (RFC 9110); the key is not.
        let bearer = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| {
            let (scheme, token) = v.trim_start().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token.trim())
        });
        // Anthropic's clients send the key as `x-api-key`.
        let given = bearer.or_else(|| req.headers().get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim));
        if req.uri().path() != "/health" && !given.is_some_and(|g| same_key(g.as_bytes(), key.as_bytes())) {
            s.metrics.request("unauthorized", 401);
            return ApiError::new(StatusCode::UNAUTHORIZED, "a valid API key is required: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')", "invalid_api_key").into_response();
        }
    }
    // A body announced larger than the limit is refused before it is read.
    let announced = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > s.options.max_body_bytes as u64) {
        let limit = s.options.max_body_bytes;
        return ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("the request body is larger than the limit of {limit} bytes"), "payload_too_large").into_response();
    }
    next.run(req).await
}

/// Whether `given` equals `key`, in a time that depends on the key's length alone (not on where
/// the first difference is, nor on the given length).
fn same_key(given: &[u8], key: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != key.len());
    for (i, &k) in key.iter().enumerate() {
        diff |= k ^ given.get(i).copied().unwrap_or(!k);
    }
    std::hint::black_box(diff) == 0
}

async fn not_found(req: Request) -> Response {
    ApiError::new(StatusCode::NOT_FOUND, format!("no route {} {}", req.method(), api::clip(req.uri().path())), "not_found").into_response()
}

async fn method_not_allowed(req: Request) -> Response {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, format!("{} is not allowed on {}", req.method(), api::clip(req.uri().path())), "method_not_allowed").into_response()
}

/// 200 while the engine steps (or waits for work); 503 with the reason when its thread died or a
/// step has run past `--step-timeout`.
async fn health(State(s): State<AppState>) -> Response {
    match s.health.status() {
        Status::Ok { stepping, steps } => json_response(StatusCode::OK, &json!({"status": "ok", "engine": if stepping { "stepping" } else { "idle" }, "steps": steps})),
        Status::Dead(reason) => json_response(StatusCode::SERVICE_UNAVAILABLE, &json!({"status": "error", "reason": reason})),
        Status::Stuck(for_) => {
            let reason = format!("the engine has been in one step for {:.1} s (--step-timeout {} s)", for_.as_secs_f64(), s.health.deadline().as_secs());
            json_response(StatusCode::SERVICE_UNAVAILABLE, &json!({"status": "error", "reason": reason}))
        }
    }
}

async fn models(State(s): State<AppState>) -> Response {
    s.metrics.request("models", 200);
    let model = json!({"id": s.options.model_id, "object": "model", "created": 0, "owned_by": "mlx-gen"});
    json_response(StatusCode::OK, &json!({"object": "list", "data": [model]}))
}

async fn metrics(State(s): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], s.metrics.render()).into_response()
}

async fn chat(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(s, body, true).await
}

async fn completions(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(s, body, false).await
}

pub(crate) fn json_response(status: StatusCode, v: &Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

async fn generate(s: AppState, body: Result<Bytes, BytesRejection>, chat: bool) -> Response {
    let response = match start(&s, body, chat).await {
        Ok(r) => r,
        Err(e) if e.status == StatusCode::SERVICE_UNAVAILABLE => {
            let mut r = e.into_response();
            r.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            r
        }
        Err(e) => e.into_response(),
    };
    s.metrics.request(if chat { "chat_completions" } else { "completions" }, response.status().as_u16());
    response
}

/// What every response of one request shares.
struct Meta {
    id: String,
    created: u64,
    model: String,
    chat: bool,
    n: usize,
    prompt_tokens: usize,
    cached_tokens: usize,
    include_usage: bool,
    /// Chat with a reasoning model: whether the prompt opened `<think>` (see `reasoning`).
    reasoning: Option<bool>,
    /// With active tools: their format and definitions (the answer is parsed for calls).
    tools: Option<(ToolFormat, Vec<Value>)>,
}

impl Meta {
    /// `usage`, with the draft tokens of speculative decoding (not OpenAI's) when the server speculates.
    fn usage(&self, completion_tokens: usize, drafted: Option<Drafted>) -> Value {
        let mut v = json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        });
        if let Some(d) = drafted {
            v["draft_tokens"] = json!({"proposed": d.proposed, "accepted": d.accepted});
        }
        v
    }

    fn object(&self, stream: bool) -> &'static str {
        match (self.chat, stream) {
            (true, false) => "chat.completion",
            (true, true) => "chat.completion.chunk",
            (false, _) => "text_completion",
        }
    }

    fn envelope(&self, stream: bool, choices: Vec<Value>) -> Value {
        let mut v = json!({"id": self.id, "object": self.object(stream), "created": self.created, "model": self.model, "choices": choices});
        if stream && self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn logprobs(&self, lps: &[TokenLogprob]) -> Value {
        if self.chat {
            let entry = |t: &str, l: f32| json!({"token": t, "logprob": l, "bytes": t.as_bytes()});
            let content: Vec<Value> = lps
                .iter()
                .map(|lp| {
                    let mut e = entry(&lp.token, lp.logprob);
                    e["top_logprobs"] = lp.top.iter().map(|(t, l)| entry(t, *l)).collect();
                    e
                })
                .collect();
            return json!({"content": content});
        }
        let mut offset = 0;
        let mut offsets = Vec::new();
        for lp in lps {
            offsets.push(offset);
            offset += lp.token.len();
        }
        let top: Vec<Value> = lps.iter().map(|lp| lp.top.iter().map(|(t, l)| (t.clone(), json!(l))).collect::<serde_json::Map<_, _>>().into()).collect();
        json!({
            "tokens": lps.iter().map(|lp| lp.token.clone()).collect::<Vec<_>>(),
            "token_logprobs": lps.iter().map(|lp| lp.logprob).collect::<Vec<_>>(),
            "top_logprobs": top,
            "text_offset": offsets,
        })
    }
}

fn new_id(chat: bool) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    format!("{}-{:x}{n:04x}", if chat { "chatcmpl" } else { "cmpl" }, t & 0xffff_ffff)
}

/// What the engine thread says when a job starts.
pub(crate) struct Started {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub reasoning: Option<bool>,
    pub tool_format: Option<ToolFormat>,
}

/// A job's events as its handler reads them: when the engine goes away before every choice
/// finished (its thread died), one last `Error` says so, rather than a short answer that looks whole.
pub(crate) struct Events {
    rx: mpsc::Receiver<Event>,
    /// Choices not finished yet.
    open: usize,
    failed: bool,
}

impl Events {
    pub(crate) async fn recv(&mut self) -> Option<Event> {
        match self.rx.recv().await {
            Some(ev) => {
                match &ev {
                    Event::Finish { .. } => self.open = self.open.saturating_sub(1),
                    Event::Error(_) => self.failed = true,
                    _ => {}
                }
                Some(ev)
            }
            None if self.open > 0 && !self.failed => {
                self.failed = true;
                Some(Event::Error(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine stopped before the answer was complete", "engine_stopped")))
            }
            None => None,
        }
    }
}

/// Queues a checked request for the engine thread; returns once it has started (or failed), with
/// the receiver of its events.
pub(crate) async fn submit(s: &AppState, prompt: api::Prompt, params: api::GenParams) -> Result<(Started, Events), ApiError> {
    if params.num_draft_tokens.is_some_and(|k| k > 0) && s.options.batch.speculation.is_none() {
        return Err(ApiError::bad("num_draft_tokens", "'num_draft_tokens' asks for speculative decoding, but the server was started without it (serve --draft-model or --prompt-lookup)"));
    }
    if s.metrics.queued() >= s.options.max_queue as i64 {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the server is busy: {} requests are already waiting; retry later", s.options.max_queue),
            "server_busy",
        ));
    }
    let preparer = s.preparer.clone();
    let (prepared, params) = tokio::task::spawn_blocking(move || (preparer.prepare(&prompt, &params), params))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("preparing the prompt failed: {e}"), "engine_error"))?;
    let prepared = prepared?;
    let (tx, mut rx) = mpsc::channel(crate::outbox::EVENT_QUEUE);
    s.metrics.queue(1, 0);
    let open = params.n;
    if s.jobs.send(Job { prepared, params, tx, arrived: Instant::now(), timeout: s.options.request_timeout }).is_err() {
        s.metrics.queue(-1, 0);
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped", "engine_stopped"));
    }
    match rx.recv().await {
        Some(Event::Started { prompt_tokens, cached_tokens, reasoning, tool_format }) => Ok((Started { prompt_tokens, cached_tokens, reasoning, tool_format }, Events { rx, open, failed: false })),
        Some(Event::Error(e)) => Err(e),
        _ => Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the engine dropped the request", "engine_error")),
    }
}

/// Checks the request, queues it for the engine thread and answers once it has started.
async fn start(s: &AppState, body: Result<Bytes, BytesRejection>, chat: bool) -> Result<Response, ApiError> {
    let body = body.map_err(|r| ApiError::new(r.status(), format!("cannot read the request body: {}", r.body_text()), "invalid_body"))?;
    let req = api::parse(&body, chat, &s.options.model_id)?;
    let (stream, n, want_logprobs, include_usage) = (req.params.stream, req.params.n, req.params.logprobs.is_some(), req.params.include_usage);
    let tool_defs = req.params.tools.tools.clone();
    let (started, rx) = submit(s, req.prompt, req.params).await?;
    let Started { prompt_tokens, cached_tokens, reasoning, tool_format } = started;
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let tools = tool_format.map(|f| (f, tool_defs));
    let meta = Meta { id: new_id(chat), created, model: s.options.model_id.clone(), chat, n, prompt_tokens, cached_tokens, include_usage, reasoning, tools };
    if stream {
        return Ok(sse(meta, rx, want_logprobs));
    }
    collect(meta, rx, want_logprobs).await
}

/// A non-streaming answer: all choices, then `usage`.
async fn collect(meta: Meta, mut rx: Events, want_logprobs: bool) -> Result<Response, ApiError> {
    let mut texts = vec![String::new(); meta.n];
    let mut lps: Vec<Vec<TokenLogprob>> = vec![Vec::new(); meta.n];
    let mut reasons = vec!["stop"; meta.n];
    let mut notes: Vec<Option<String>> = vec![None; meta.n];
    let mut completion_tokens = 0;
    let mut drafted = None;
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Delta { index, text, logprobs } if index < meta.n => {
                texts[index].push_str(&text);
                lps[index].extend(logprobs);
            }
            Event::Finish { index, reason, completion_tokens: c, note, drafted: d, .. } if index < meta.n => {
                reasons[index] = reason;
                notes[index] = note;
                completion_tokens += c;
                drafted = Drafted::sum(drafted, d);
            }
            Event::Error(e) => return Err(e),
            _ => {}
        }
    }
    let choices = (0..meta.n)
        .map(|i| {
            let logprobs = if want_logprobs { meta.logprobs(&lps[i]) } else { Value::Null };
            if meta.chat {
                let mut message = json!({"role": "assistant", "content": texts[i]});
                let mut answer = texts[i].clone();
                if let Some(opened) = meta.reasoning {
                    if let (Some(r), a) = tokenizer::split_reasoning(&texts[i], opened) {
                        message["reasoning_content"] = json!(r);
                        message["content"] = json!(a);
                        answer = a;
                    }
                }
                let mut reason = reasons[i];
                if let Some((format, defs)) = &meta.tools {
                    let (content, calls) = crate::tools::split(*format, defs, &answer);
                    if !calls.is_empty() {
                        message["content"] = if content.trim().is_empty() { Value::Null } else { json!(content) };
                        message["tool_calls"] = calls.iter().map(|c| c.openai()).collect();
                        if reason == "stop" {
                            reason = "tool_calls";
                        }
                    }
                }
                let mut c = json!({"index": i, "message": message, "logprobs": logprobs, "finish_reason": reason});
                note_on(&mut c, &notes[i]);
                c
            } else {
                let mut c = json!({"index": i, "text": texts[i], "logprobs": logprobs, "finish_reason": reasons[i]});
                note_on(&mut c, &notes[i]);
                c
            }
        })
        .collect();
    let mut v = meta.envelope(false, choices);
    v["usage"] = meta.usage(completion_tokens, drafted);
    Ok(json_response(StatusCode::OK, &v))
}

/// A grammar's reason for ending a choice early, as the choice's `error`.
fn note_on(choice: &mut Value, note: &Option<String>) {
    if let Some(n) = note {
        choice["error"] = json!({"message": n, "type": "grammar_dead_end"});
    }
}

fn frame(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// A streaming answer over server-sent events, as OpenAI's: chunks with `choices[].delta` (chat)
/// or `choices[].text`, the usage chunk when asked for, then `data: [DONE]`. A client that goes
/// away drops the event receiver, which cancels the job on the engine thread.
fn sse(meta: Meta, mut rx: Events, want_logprobs: bool) -> Response {
    let (btx, brx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let mut started = vec![false; meta.n];
        let mut completion_tokens = 0;
        let mut drafted = None;
        let mut routers: Vec<Option<crate::reasoning::ReasoningStream>> =
            (0..meta.n).map(|_| meta.reasoning.filter(|_| meta.chat).map(crate::reasoning::ReasoningStream::new)).collect();
        let mut tool_streams: Vec<Option<ToolStream>> = (0..meta.n).map(|_| meta.tools.as_ref().map(|(f, d)| ToolStream::new(*f, d.clone()))).collect();
        // Answer text through the tool-call splitter: content chunks and `delta.tool_calls` chunks.
        let tool_chunks = |index: usize, pieces: Vec<Piece>, ts: &ToolStream| -> Vec<Value> {
            let first = ts.calls - pieces.iter().filter(|p| matches!(p, Piece::Call(_))).count();
            let mut k = first;
            let mut out = Vec::new();
            for p in pieces {
                let delta = match p {
                    Piece::Content(t) if t.is_empty() => continue,
                    Piece::Content(t) => json!({"content": t}),
                    Piece::Call(c) => {
                        let mut call = c.openai();
                        call["index"] = json!(k);
                        k += 1;
                        json!({"tool_calls": [call]})
                    }
                };
                out.push(meta.envelope(true, vec![json!({"index": index, "delta": delta, "logprobs": Value::Null, "finish_reason": Value::Null})]));
            }
            out
        };
        let reasoning_chunk = |index: usize, text: &str| {
            let c = json!({"index": index, "delta": {"reasoning_content": text}, "logprobs": Value::Null, "finish_reason": Value::Null});
            meta.envelope(true, vec![c])
        };
        let choice = |index: usize, text: Option<&str>, role: bool, lps: &[TokenLogprob], reason: Option<&str>| {
            let logprobs = if want_logprobs && !lps.is_empty() { meta.logprobs(lps) } else { Value::Null };
            let mut c = if meta.chat {
                let mut delta = json!({});
                if role {
                    delta["role"] = json!("assistant");
                }
                if let Some(t) = text {
                    delta["content"] = json!(t);
                }
                json!({"index": index, "delta": delta, "logprobs": logprobs})
            } else {
                json!({"index": index, "text": text.unwrap_or(""), "logprobs": logprobs})
            };
            c["finish_reason"] = json!(reason);
            meta.envelope(true, vec![c])
        };
        while let Some(ev) = rx.recv().await {
            let mut frames = Vec::new();
            // With tools: answer text goes through the splitter (log-probabilities in their own chunk).
            let ev = match ev {
                Event::Delta { index, text, logprobs } if index < meta.n && tool_streams[index].is_some() => {
                    if meta.chat && !started[index] {
                        started[index] = true;
                        frames.push(choice(index, Some(""), true, &[], None));
                    }
                    let answer = match routers.get_mut(index).and_then(Option::as_mut) {
                        Some(router) => {
                            let (r, a) = router.push(&text);
                            if !r.is_empty() {
                                frames.push(reasoning_chunk(index, &r));
                            }
                            a
                        }
                        None => text,
                    };
                    if let Some(ts) = tool_streams[index].as_mut() {
                        let pieces = ts.push(&answer);
                        frames.extend(tool_chunks(index, pieces, ts));
                    }
                    if !logprobs.is_empty() {
                        frames.push(choice(index, None, false, &logprobs, None));
                    }
                    None
                }
                Event::Finish { index, reason, completion_tokens: c, note, drafted: d, .. } if index < meta.n && tool_streams[index].is_some() => {
                    completion_tokens += c;
                    drafted = Drafted::sum(drafted, d);
                    if meta.chat && !started[index] {
                        started[index] = true;
                        frames.push(choice(index, Some(""), true, &[], None));
                    }
                    let mut answer = String::new();
                    if let Some(router) = routers.get_mut(index).and_then(Option::as_mut) {
                        let (r, a) = router.finish();
                        if !r.is_empty() {
                            frames.push(reasoning_chunk(index, &r));
                        }
                        answer = a;
                    }
                    let mut reason = reason;
                    if let Some(ts) = tool_streams[index].as_mut() {
                        let mut pieces = ts.push(&answer);
                        pieces.extend(ts.finish());
                        frames.extend(tool_chunks(index, pieces, ts));
                        if ts.calls > 0 && reason == "stop" {
                            reason = "tool_calls";
                        }
                    }
                    let mut last = choice(index, None, false, &[], Some(reason));
                    note_on(&mut last["choices"][0], &note);
                    frames.push(last);
                    None
                }
                ev => Some(ev),
            };
            let Some(ev) = ev else {
                for f in &frames {
                    if btx.send(frame(f)).await.is_err() {
                        return;
                    }
                }
                continue;
            };
            let index = match &ev {
                Event::Delta { index, .. } | Event::Finish { index, .. } => *index,
                _ => 0,
            };
            if meta.chat && matches!(ev, Event::Delta { .. } | Event::Finish { .. }) && index < meta.n && !started[index] {
                started[index] = true;
                frames.push(choice(index, Some(""), true, &[], None));
            }
            match ev {
                Event::Delta { index, text, logprobs } => match routers.get_mut(index).and_then(Option::as_mut) {
                    Some(router) => {
                        let (r, a) = router.push(&text);
                        if !r.is_empty() {
                            frames.push(reasoning_chunk(index, &r));
                        }
                        if !a.is_empty() || !logprobs.is_empty() {
                            frames.push(choice(index, Some(&a), false, &logprobs, None));
                        }
                    }
                    None => frames.push(choice(index, Some(&text), false, &logprobs, None)),
                },
                Event::Finish { index, reason, completion_tokens: c, note, drafted: d, .. } => {
                    completion_tokens += c;
                    drafted = Drafted::sum(drafted, d);
                    if let Some(router) = routers.get_mut(index).and_then(Option::as_mut) {
                        let (r, a) = router.finish();
                        if !r.is_empty() {
                            frames.push(reasoning_chunk(index, &r));
                        }
                        if !a.is_empty() {
                            frames.push(choice(index, Some(&a), false, &[], None));
                        }
                    }
                    let mut last = choice(index, None, false, &[], Some(reason));
                    note_on(&mut last["choices"][0], &note);
                    frames.push(last);
                }
                Event::Error(e) => frames.push(e.body()),
                Event::Started { .. } => {}
            }
            for f in &frames {
                if btx.send(frame(f)).await.is_err() {
                    return;
                }
            }
        }
        if meta.include_usage {
            let mut v = meta.envelope(true, Vec::new());
            v["usage"] = meta.usage(completion_tokens, drafted);
            let _ = btx.send(frame(&v)).await;
        }
        let _ = btx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    let body = futures_util::stream::unfold(brx, |mut brx| async move { brx.recv().await.map(|b| (Ok::<_, std::convert::Infallible>(b), brx)) });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[cfg(test)]
mod tests {
    use super::same_key;

    #[test]
    fn keys_match_only_exactly() {
        let key = b"sk-secret-key";
        assert!(same_key(key, key));
        for given in [&b""[..], b"sk-secret-ke", b"sk-secret-key!", b"sk-secret-kez", b"Sk-secret-key", b"sk-secret-key\0"] {
            assert!(!same_key(given, key), "{:?}", String::from_utf8_lossy(given));
        }
        assert!(!same_key(&[0xff; 13], &[0x00; 13]));
        assert!(!same_key(&[0x00; 12], &[0x00; 13]), "a missing byte never passes for a zero byte");
    }
}
