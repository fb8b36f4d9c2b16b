//! Anthropic's Messages API, `POST /v1/messages`, for tools that speak it (coding agents): the
//! request (system, text / tool_use / tool_result blocks, tools, tool_choice, stop_sequences) is
//! checked in Anthropic's terms, turned into the OpenAI-shaped request the engine thread runs (same
//! batching, same tool-call parsing and constrained decoding), and answered as Anthropic answers:
//! content blocks, `stop_reason`, `usage`, or with `stream` its event stream. `output_config.format`
//! (a JSON schema) is structured output, as `response_format` is on the OpenAI side (`message_start`,
//! `content_block_start` / `_delta` / `_stop`, `message_delta`, `message_stop`).
use crate::api::{self, ApiError};
use crate::reasoning::ReasoningStream;
use crate::routes::{json_response, submit, AppState, Events, Started};
use crate::tools::{Piece, ToolCall, ToolStream};
use crate::worker::Event;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

/// `POST /v1/messages`.
pub async fn messages(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    let response = match start(&s, body).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    };
    s.metrics.request("messages", response.status().as_u16());
    response
}

/// Anthropic's error body: `{"type": "error", "error": {"type", "message"}}` (the field named in the message).
fn error_body(e: &ApiError) -> Value {
    let kind = match e.status.as_u16() {
        401 => "authentication_error",
        404 => "not_found_error",
        413 => "request_too_large",
        503 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    };
    // Fields checked in their OpenAI form are named as the Anthropic request names them.
    let param = e.param.as_ref().map(|p| p.replace(".function.parameters", ".input_schema").replace(".function.name", ".name"));
    let message = match &param {
        Some(p) if !e.message.contains(p.as_str()) => format!("{p}: {}", e.message),
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

fn error_response(e: &ApiError) -> Response {
    let mut r = json_response(e.status, &error_body(e));
    if e.status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    r
}

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad(param, message)
}

/// The text of a `system` or `tool_result` content: a string or a list of text blocks.
fn text_of(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for (j, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => return Err(bad(&format!("{at}[{j}]"), "only text blocks are supported here")),
                }
            }
            Ok(text)
        }
        _ => Err(bad(at, "must be a string or a list of text blocks")),
    }
}

/// One Anthropic message as OpenAI chat messages (tool results become `tool` messages).
fn message(m: &Value, i: usize, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
    if role != "user" && role != "assistant" {
        return Err(bad(&format!("{at}.role"), "'role' must be 'user' or 'assistant'"));
    }
    let blocks = match m.get("content") {
        Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
        Some(Value::Array(b)) => b.clone(),
        _ => return Err(bad(&format!("{at}.content"), "'content' must be a string or a list of content blocks")),
    };
    let (mut text, mut calls, mut thinking) = (String::new(), Vec::new(), String::new());
    let flush_text = |text: &mut String, out: &mut Vec<Value>| {
        if !text.is_empty() {
            out.push(json!({"role": "user", "content": std::mem::take(text)}));
        }
    };
    for (j, b) in blocks.iter().enumerate() {
        let bat = format!("{at}.content[{j}]");
        match (b.get("type").and_then(Value::as_str), role) {
            (Some("text"), _) => text.push_str(b.get("text").and_then(Value::as_str).ok_or_else(|| bad(&format!("{bat}.text"), "a text block needs a 'text' string"))?),
            (Some("tool_use"), "assistant") => {
                let id = b.get("id").and_then(Value::as_str).filter(|s| !s.is_empty()).ok_or_else(|| bad(&format!("{bat}.id"), "a tool_use block needs an 'id' string"))?;
                let name = b.get("name").and_then(Value::as_str).filter(|s| !s.is_empty()).ok_or_else(|| bad(&format!("{bat}.name"), "a tool_use block needs a 'name' string"))?;
                let input = b.get("input").filter(|v| v.is_object()).ok_or_else(|| bad(&format!("{bat}.input"), "a tool_use block needs an 'input' object"))?;
                calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}}));
            }
            (Some("tool_result"), "user") => {
                flush_text(&mut text, out);
                let id = b.get("tool_use_id").and_then(Value::as_str).filter(|s| !s.is_empty()).ok_or_else(|| bad(&format!("{bat}.tool_use_id"), "a tool_result block needs a 'tool_use_id' string"))?;
                let content = text_of(b.get("content").unwrap_or(&Value::Null), &format!("{bat}.content"))?;
                if let Some(e) = b.get("is_error").filter(|v| !v.is_null() && !v.is_boolean()) {
                    return Err(bad(&format!("{bat}.is_error"), format!("'is_error' must be a boolean, got {e}")));
                }
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            (Some("thinking"), "assistant") => thinking.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or_default()),
            (Some(kind @ ("tool_use" | "tool_result" | "thinking")), _) => return Err(bad(&bat, format!("a '{kind}' block cannot be in a '{role}' message"))),
            (Some(kind), _) => return Err(bad(&bat, format!("'{}' content blocks are not supported (text-only models)", api::clip(kind)))),
            (None, _) => return Err(bad(&bat, "each content block needs a 'type'")),
        }
    }
    if role == "user" {
        flush_text(&mut text, out);
        return Ok(());
    }
    let mut msg = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        msg["tool_calls"] = Value::Array(calls);
    }
    if !thinking.is_empty() {
        msg["reasoning_content"] = json!(thinking);
    }
    out.push(msg);
    Ok(())
}

/// The Messages API fields this server implements, and `seed` (mlx-gen's own: a sampled answer
/// that can be had again, as in its OpenAI routes); any other is a 400 naming it.
const FIELDS: &[&str] = &["model", "max_tokens", "system", "messages", "temperature", "top_p", "top_k", "stop_sequences", "output_config", "thinking", "tools", "tool_choice", "stream", "seed"];

/// The Anthropic body as the OpenAI chat body the engine runs, and whether it streams.
fn translate(body: &[u8]) -> Result<(Value, bool), ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ApiError { status: StatusCode::BAD_REQUEST, message: format!("the body is not valid JSON: {e}"), param: None, code: Some("invalid_json") })?;
    let Value::Object(o) = &v else { return Err(bad("body", "the body must be a JSON object")) };
    if let Some(k) = o.iter().find(|(k, v)| !v.is_null() && !FIELDS.contains(&k.as_str())).map(|(k, _)| k) {
        return Err(api::unsupported(k, &format!("'{}' is not supported by this server", api::clip(k))));
    }
    let get = |k: &str| o.get(k).filter(|v| !v.is_null());
    let mut out = Map::new();
    match get("model") {
        Some(Value::String(m)) => out.insert("model".into(), json!(m)),
        _ => return Err(bad("model", "'model' is required (a string)")),
    };
    match get("max_tokens") {
        Some(n) if n.as_u64().is_some_and(|n| n >= 1) => out.insert("max_tokens".into(), n.clone()),
        Some(_) => return Err(bad("max_tokens", "'max_tokens' must be an integer >= 1")),
        None => return Err(bad("max_tokens", "'max_tokens' is required")),
    };
    let mut msgs = Vec::new();
    if let Some(sys) = get("system") {
        msgs.push(json!({"role": "system", "content": text_of(sys, "system")?}));
    }
    let Some(Value::Array(list)) = get("messages") else { return Err(bad("messages", "'messages' must be a non-empty list")) };
    if list.is_empty() {
        return Err(bad("messages", "'messages' must be a non-empty list"));
    }
    for (i, m) in list.iter().enumerate() {
        message(m, i, &mut msgs)?;
    }
    out.insert("messages".into(), Value::Array(msgs));
    for (from, to) in [("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"), ("stop_sequences", "stop"), ("seed", "seed")] {
        if let Some(x) = get(from) {
            out.insert(to.into(), x.clone());
        }
    }
    if let Some(oc) = get("output_config") {
        let Value::Object(oc) = oc else { return Err(bad("output_config", "'output_config' must be an object")) };
        if oc.get("effort").is_some_and(|e| !e.is_null()) {
            return Err(bad("output_config.effort", "'effort' is not supported"));
        }
        if let Some(f) = oc.get("format").filter(|f| !f.is_null()) {
            match (f.get("type").and_then(Value::as_str), f.get("schema")) {
                (Some("json_schema"), Some(schema)) if schema.is_object() => {
                    out.insert("response_format".into(), json!({"type": "json_schema", "json_schema": {"schema": schema, "strict": true}}));
                }
                _ => return Err(bad("output_config.format", "'format' must be {\"type\": \"json_schema\", \"schema\": {...}}")),
            }
        }
    }
    if let Some(t) = get("thinking") {
        if t.get("type").and_then(Value::as_str) != Some("disabled") {
            return Err(bad("thinking", "'thinking' budgets are not supported; a reasoning model's thinking comes back as thinking blocks"));
        }
    }
    if let Some(tools) = get("tools") {
        let Value::Array(tools) = tools else { return Err(bad("tools", "'tools' must be a list")) };
        let mut openai = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            if let Some(kind) = t.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
                return Err(bad(&format!("tools[{i}].type"), format!("server tools ('{}') are not supported", api::clip(kind))));
            }
            let name = t.get("name").and_then(Value::as_str).ok_or_else(|| bad(&format!("tools[{i}].name"), "each tool needs a 'name'"))?;
            let schema = t.get("input_schema").filter(|s| s.is_object()).ok_or_else(|| bad(&format!("tools[{i}].input_schema"), "each tool needs an 'input_schema' object"))?;
            let mut f = json!({"name": name, "parameters": schema});
            if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
                f["description"] = d.clone();
            }
            openai.push(json!({"type": "function", "function": f}));
        }
        out.insert("tools".into(), Value::Array(openai));
    }
    if let Some(tc) = get("tool_choice") {
        let choice = match (tc.get("type").and_then(Value::as_str), tc.get("name").and_then(Value::as_str)) {
            (Some("auto"), _) => json!("auto"),
            (Some("any"), _) => json!("required"),
            (Some("none"), _) => json!("none"),
            (Some("tool"), Some(n)) => json!({"type": "function", "function": {"name": n}}),
            _ => return Err(bad("tool_choice", "'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": NAME}")),
        };
        match tc.get("disable_parallel_tool_use") {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => {
                out.insert("parallel_tool_calls".into(), json!(!b));
            }
            Some(_) => return Err(bad("tool_choice.disable_parallel_tool_use", "must be a boolean")),
        }
        out.insert("tool_choice".into(), choice);
    }
    let stream = match get("stream") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("stream", "'stream' must be a boolean")),
    };
    Ok((Value::Object(out), stream))
}

async fn start(s: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body.map_err(|r| ApiError::new(r.status(), format!("cannot read the request body: {}", r.body_text()), "invalid_body"))?;
    let (openai, stream) = translate(&body)?;
    let req = api::parse(openai.to_string().as_bytes(), true, &s.options.model_id)?;
    let tool_defs = req.params.tools.tools.clone();
    let (started, rx) = submit(s, req.prompt, req.params).await?;
    let answer = Answer::new(&started, tool_defs, s.options.model_id.clone());
    if stream {
        return Ok(sse(answer, started, rx));
    }
    collect(answer, started, rx).await
}

/// One answer's blocks as they form: reasoning to `thinking`, answer text to `text`, calls to `tool_use`.
struct Answer {
    id: String,
    model: String,
    reasoning: Option<ReasoningStream>,
    tools: Option<ToolStream>,
}

/// A piece of the answer.
enum Part {
    Thinking(String),
    Text(String),
    Call(ToolCall),
}

impl Answer {
    fn new(started: &Started, tool_defs: Vec<Value>, model: String) -> Answer {
        Answer {
            id: format!("msg_{}", &crate::tools::new_call_id()[5..]),
            model,
            reasoning: started.reasoning.map(ReasoningStream::new),
            tools: started.tool_format.map(|f| ToolStream::new(f, tool_defs)),
        }
    }

    fn push(&mut self, text: &str, last: bool) -> Vec<Part> {
        let mut parts = Vec::new();
        let answer = match self.reasoning.as_mut() {
            Some(r) => {
                let (mut think, mut a) = r.push(text);
                if last {
                    let (t2, a2) = r.finish();
                    think.push_str(&t2);
                    a.push_str(&a2);
                }
                if !think.is_empty() {
                    parts.push(Part::Thinking(think));
                }
                a
            }
            None => text.to_owned(),
        };
        match self.tools.as_mut() {
            Some(ts) => {
                let mut pieces = ts.push(&answer);
                if last {
                    pieces.extend(ts.finish());
                }
                for p in pieces {
                    parts.push(match p {
                        Piece::Content(c) => Part::Text(c),
                        Piece::Call(c) => Part::Call(c),
                    });
                }
            }
            None => parts.push(Part::Text(answer)),
        }
        parts.retain(|p| !matches!(p, Part::Text(t) | Part::Thinking(t) if t.is_empty()));
        parts
    }

    fn calls(&self) -> usize {
        self.tools.as_ref().map_or(0, |t| t.calls)
    }
}

fn tool_id(c: &ToolCall) -> String {
    format!("toolu_{}", c.id.trim_start_matches("call_"))
}

fn stop_reason(reason: &str, calls: usize, stop_sequence: &Option<String>) -> &'static str {
    match (reason, calls, stop_sequence) {
        (_, n, _) if n > 0 && reason == "stop" => "tool_use",
        (_, _, Some(_)) => "stop_sequence",
        ("length", _, _) => "max_tokens",
        _ => "end_turn",
    }
}

fn usage(started: &Started, output_tokens: usize) -> Value {
    json!({"input_tokens": started.prompt_tokens - started.cached_tokens, "cache_read_input_tokens": started.cached_tokens, "cache_creation_input_tokens": 0, "output_tokens": output_tokens})
}

async fn collect(mut answer: Answer, started: Started, mut rx: Events) -> Result<Response, ApiError> {
    let mut parts = Vec::new();
    let (mut reason, mut output_tokens, mut stop_sequence) = ("stop", 0, None);
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Delta { index: 0, text, .. } => parts.extend(answer.push(&text, false)),
            Event::Finish { index: 0, reason: r, completion_tokens, stop_sequence: s, .. } => {
                parts.extend(answer.push("", true));
                (reason, output_tokens, stop_sequence) = (r, completion_tokens, s);
            }
            Event::Error(e) => return Err(e),
            _ => {}
        }
    }
    let mut content: Vec<Value> = Vec::new();
    for p in parts {
        match (p, content.last_mut()) {
            (Part::Text(t), Some(last)) if last["type"] == "text" => last["text"] = json!(format!("{}{t}", last["text"].as_str().unwrap_or_default())),
            (Part::Thinking(t), Some(last)) if last["type"] == "thinking" => last["thinking"] = json!(format!("{}{t}", last["thinking"].as_str().unwrap_or_default())),
            (Part::Text(t), _) => content.push(json!({"type": "text", "text": t})),
            (Part::Thinking(t), _) => content.push(json!({"type": "thinking", "thinking": t, "signature": ""})),
            (Part::Call(c), _) => content.push(json!({"type": "tool_use", "id": tool_id(&c), "name": c.name, "input": serde_json::from_str::<Value>(&c.arguments).unwrap_or(json!({}))})),
        }
    }
    let stop = stop_reason(reason, answer.calls(), &stop_sequence);
    let body = json!({
        "id": answer.id, "type": "message", "role": "assistant", "model": answer.model, "content": content,
        "stop_reason": stop, "stop_sequence": stop_sequence, "usage": usage(&started, output_tokens),
    });
    Ok(json_response(StatusCode::OK, &body))
}

fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// Anthropic's event stream; a client that goes away cancels the job (its receiver is dropped).
fn sse(mut answer: Answer, started: Started, mut rx: Events) -> Response {
    let (btx, brx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let start = json!({"type": "message_start", "message": {
            "id": answer.id, "type": "message", "role": "assistant", "model": answer.model, "content": [],
            "stop_reason": null, "stop_sequence": null, "usage": usage(&started, 0)}});
        let mut frames = vec![event("message_start", &start), event("ping", &json!({"type": "ping"}))];
        // The open block: its index and kind ("text" / "thinking").
        let mut open: Option<(usize, &'static str)> = None;
        let mut next = 0;
        let close = |open: &mut Option<(usize, &'static str)>, frames: &mut Vec<Bytes>| {
            if let Some((i, _)) = open.take() {
                frames.push(event("content_block_stop", &json!({"type": "content_block_stop", "index": i})));
            }
        };
        loop {
            let Some(ev) = rx.recv().await else { break };
            let (parts, finish) = match ev {
                Event::Delta { index: 0, text, .. } => (answer.push(&text, false), None),
                Event::Finish { index: 0, reason, completion_tokens, stop_sequence, .. } => (answer.push("", true), Some((reason, completion_tokens, stop_sequence))),
                Event::Error(e) => {
                    frames.push(event("error", &error_body(&e)));
                    (Vec::new(), None)
                }
                _ => (Vec::new(), None),
            };
            for p in parts {
                let (kind, delta) = match &p {
                    Part::Text(t) => ("text", json!({"type": "text_delta", "text": t})),
                    Part::Thinking(t) => ("thinking", json!({"type": "thinking_delta", "thinking": t})),
                    Part::Call(_) => ("tool_use", Value::Null),
                };
                if let Part::Call(c) = &p {
                    close(&mut open, &mut frames);
                    let block = json!({"type": "tool_use", "id": tool_id(c), "name": c.name, "input": {}});
                    frames.push(event("content_block_start", &json!({"type": "content_block_start", "index": next, "content_block": block})));
                    let d = json!({"type": "input_json_delta", "partial_json": c.arguments});
                    frames.push(event("content_block_delta", &json!({"type": "content_block_delta", "index": next, "delta": d})));
                    frames.push(event("content_block_stop", &json!({"type": "content_block_stop", "index": next})));
                    next += 1;
                    continue;
                }
                if open.map(|(_, k)| k) != Some(kind) {
                    close(&mut open, &mut frames);
                    let block = if kind == "text" { json!({"type": "text", "text": ""}) } else { json!({"type": "thinking", "thinking": "", "signature": ""}) };
                    frames.push(event("content_block_start", &json!({"type": "content_block_start", "index": next, "content_block": block})));
                    open = Some((next, kind));
                    next += 1;
                }
                let i = open.map_or(0, |(i, _)| i);
                frames.push(event("content_block_delta", &json!({"type": "content_block_delta", "index": i, "delta": delta})));
            }
            if let Some((reason, output_tokens, stop_sequence)) = finish {
                close(&mut open, &mut frames);
                let stop = stop_reason(reason, answer.calls(), &stop_sequence);
                let d = json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": stop_sequence}, "usage": {"output_tokens": output_tokens}});
                frames.push(event("message_delta", &d));
                frames.push(event("message_stop", &json!({"type": "message_stop"})));
            }
            for f in frames.drain(..) {
                if btx.send(f).await.is_err() {
                    return;
                }
            }
        }
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
    use super::*;

    fn openai(body: Value) -> Result<Value, ApiError> {
        translate(body.to_string().as_bytes()).map(|(v, _)| v)
    }

    #[test]
    fn messages_become_openai_messages() {
        let v = openai(json!({"model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "S"}], "stop_sequences": ["x"],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "ok"}, {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "2"}]}, {"type": "text", "text": "more"}]}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any", "disable_parallel_tool_use": true}}))
        .expect("valid");
        assert_eq!(v["messages"], json!([
            {"role": "system", "content": "S"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "ok", "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "2"},
            {"role": "user", "content": "more"}]));
        assert_eq!((v["tool_choice"].clone(), v["parallel_tool_calls"].clone(), v["stop"].clone()), (json!("required"), json!(false), json!(["x"])));
        assert_eq!(v["tools"][0]["function"]["parameters"], json!({"type": "object"}));
    }

    #[test]
    fn bad_fields_are_named() {
        let m = json!([{"role": "user", "content": "x"}]);
        for (param, body) in [
            ("max_tokens", json!({"model": "m", "messages": m})),
            ("model", json!({"max_tokens": 1, "messages": m})),
            ("messages[0].role", json!({"model": "m", "max_tokens": 1, "messages": [{"role": "system", "content": "x"}]})),
            ("messages[0].content[0]", json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})),
            ("messages[0].content[0]", json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}]})),
            ("messages[0].content[0].tool_use_id", json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]})),
            ("tools[0].input_schema", json!({"model": "m", "max_tokens": 1, "messages": m, "tools": [{"name": "f"}]})),
            ("tools[0].type", json!({"model": "m", "max_tokens": 1, "messages": m, "tools": [{"type": "web_search_20250305", "name": "w"}]})),
            ("tool_choice", json!({"model": "m", "max_tokens": 1, "messages": m, "tool_choice": {"type": "sometimes"}})),
            ("thinking", json!({"model": "m", "max_tokens": 1, "messages": m, "thinking": {"type": "enabled", "budget_tokens": 10}})),
            ("metadata", json!({"model": "m", "max_tokens": 1, "messages": m, "metadata": {"user_id": "u"}})),
            ("service_tier", json!({"model": "m", "max_tokens": 1, "messages": m, "service_tier": "auto"})),
            ("top_n", json!({"model": "m", "max_tokens": 1, "messages": m, "top_n": 3})),
        ] {
            let e = openai(body.clone()).expect_err(&body.to_string());
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
            assert!(error_body(&e)["error"]["message"].as_str().unwrap().contains(param));
        }
    }
}
