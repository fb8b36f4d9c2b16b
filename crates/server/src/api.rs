//! The OpenAI request bodies, checked field by field: every bad field is a 400 error naming it.
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use crate::constrain::Grammar;
use engine::sample::LogitsProcessors;
use engine::SamplerConfig;
use serde_json::{json, Map, Value};

/// Requests may not ask for more tokens than this.
pub const MAX_TOKENS_LIMIT: u64 = 1 << 20;
/// Tokens generated when the request gives no limit (as mlx_lm.server).
pub const DEFAULT_MAX_TOKENS: usize = 512;
const MAX_N: u64 = 64;
/// Draft tokens per speculative round a request may ask for at most.
pub const MAX_DRAFT_TOKENS: i64 = 64;
const MAX_STOPS: usize = 16;

/// An OpenAI-shaped error: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), param: Some(param.to_owned()), code: None }
    }
    pub fn new(status: StatusCode, message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError { status, message: message.into(), param: None, code: Some(code) }
    }
    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind(), "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body().to_string();
        (self.status, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
    }
}

/// What to continue: chat messages (through the chat template), raw text, or token ids.
#[derive(Debug)]
pub enum Prompt {
    Chat(Value),
    Text(String),
    Tokens(Vec<u32>),
}

/// The generation settings of one request.
#[derive(Debug)]
pub struct GenParams {
    pub max_tokens: usize,
    /// Without XTC's special tokens and unchecked against the vocabulary (the engine thread does both).
    pub sampler: SamplerConfig,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    /// `Some(k)`: report each token's log-probability and the k most likely alternatives.
    pub logprobs: Option<usize>,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// `response_format`: what the output must follow (`None`: free text).
    pub response_format: Option<ResponseFormat>,
    pub tools: Tools,
    /// `num_draft_tokens` (as mlx_lm.server's): draft tokens per speculative round, 0 for none;
    /// `None`: the server's `--num-draft-tokens`.
    pub num_draft_tokens: Option<usize>,
}

/// `response_format` `json_object` or `json_schema`.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponseFormat {
    pub grammar: Grammar,
    /// `strict: true`: a schema keyword llguidance does not support is an error (else it is ignored).
    pub strict: bool,
}

/// The request's tools and how the model may use them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tools {
    /// OpenAI tool objects `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    /// Whether a forced answer may hold several calls (default true, as OpenAI).
    pub parallel: bool,
}

/// `tool_choice`.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum ToolChoice {
    /// The model decides (the default with tools).
    #[default]
    Auto,
    /// No calls: the tools are not shown to the model and the output is not parsed.
    None,
    /// At least one call, constrained to the tools' schemas.
    Required,
    /// A call of this function, constrained to its schema.
    Named(String),
}

impl Tools {
    /// Whether tool calls are parsed out of the answer.
    pub fn active(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }

    /// The tools a forced call may use (`None` when calls are not forced).
    pub fn forced(&self) -> Option<Vec<Value>> {
        match &self.choice {
            ToolChoice::Required => Some(self.tools.clone()),
            ToolChoice::Named(n) => Some(self.tools.iter().filter(|t| t["function"]["name"].as_str() == Some(n)).cloned().collect()),
            _ => None,
        }
    }
}

/// A checked request.
#[derive(Debug)]
pub struct GenRequest {
    pub prompt: Prompt,
    pub params: GenParams,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The fields of one body; absent and null fields read as `None`.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }
    fn num(&self, k: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        let Some(v) = self.get(k) else { return Ok(None) };
        match v.as_f64() {
            Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(Some(x)),
            Some(x) => Err(ApiError::bad(k, format!("'{k}' must be in [{lo}, {hi}], got {x}"))),
            None => Err(ApiError::bad(k, format!("'{k}' must be a number, got {}", type_name(v)))),
        }
    }
    fn int(&self, k: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(k) else { return Ok(None) };
        let x = match v {
            Value::Number(n) => n.as_i64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9e15).map(|f| f as i64)),
            _ => None,
        };
        match x {
            Some(x) if (lo..=hi).contains(&x) => Ok(Some(x)),
            Some(x) => Err(ApiError::bad(k, format!("'{k}' must be an integer in [{lo}, {hi}], got {x}"))),
            None if v.is_u64() => Err(ApiError::bad(k, format!("'{k}' must be an integer in [{lo}, {hi}], got {v}"))),
            None => Err(ApiError::bad(k, format!("'{k}' must be an integer, got {}", type_name(v)))),
        }
    }
    fn bool(&self, k: &str) -> Result<Option<bool>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::bad(k, format!("'{k}' must be a boolean, got {}", type_name(v)))),
        }
    }
}

/// Parses and checks a `/v1/chat/completions` (`chat`) or `/v1/completions` body. A `model` other
/// than `served` is a 404.
pub fn parse(body: &[u8], chat: bool, served: &str) -> Result<GenRequest, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| ApiError {
        status: StatusCode::BAD_REQUEST,
        message: format!("the body is not valid JSON: {e}"),
        param: None,
        code: Some("invalid_json"),
    })?;
    let Value::Object(map) = &value else {
        return Err(ApiError::bad("body", format!("the body must be a JSON object, got {}", type_name(&value))));
    };
    let f = Fields(map);
    match f.get("model") {
        None => {}
        Some(Value::String(m)) if m == served => {}
        Some(Value::String(m)) => {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!("the model '{}' does not exist; this server serves '{served}'", clip(m)),
                param: Some("model".into()),
                code: Some("model_not_found"),
            })
        }
        Some(v) => return Err(ApiError::bad("model", format!("'model' must be a string, got {}", type_name(v)))),
    }
    let prompt = if chat { chat_prompt(&f)? } else { text_prompt(&f)? };
    unsupported_fields(map, chat)?;
    let max_tokens = match (f.int("max_completion_tokens", 1, MAX_TOKENS_LIMIT as i64)?, f.int("max_tokens", 1, MAX_TOKENS_LIMIT as i64)?) {
        (Some(m), _) | (None, Some(m)) => m as usize,
        (None, None) => DEFAULT_MAX_TOKENS,
    };
    let logprobs = if chat {
        let top = f.int("top_logprobs", 0, 20)?;
        match (f.bool("logprobs")?, top) {
            (Some(true), t) => Some(t.unwrap_or(0) as usize),
            (_, Some(t)) if t > 0 => return Err(ApiError::bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")),
            _ => None,
        }
    } else {
        f.int("logprobs", 0, 20)?.map(|k| k as usize)
    };
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Fields(o).bool("include_usage").map_err(|_| ApiError::bad("stream_options", "'stream_options.include_usage' must be a boolean"))?.unwrap_or(false),
        Some(v) => return Err(ApiError::bad("stream_options", format!("'stream_options' must be an object, got {}", type_name(v)))),
    };
    let tools = if chat { tools(&f)? } else { no_tools(&f)? };
    if !chat && f.bool("echo")? == Some(true) {
        return Err(ApiError::bad("echo", "'echo' is not supported"));
    }
    let params = GenParams {
        max_tokens,
        sampler: sampler(&f)?,
        seed: f.int("seed", 0, i64::MAX)?.map(|s| s as u64),
        stop: stops(&f)?,
        logprobs,
        n: f.int("n", 1, MAX_N as i64)?.unwrap_or(1) as usize,
        stream,
        include_usage,
        response_format: response_format(&f)?,
        tools,
        num_draft_tokens: f.int("num_draft_tokens", 0, MAX_DRAFT_TOKENS)?.map(|k| k as usize),
    };
    Ok(GenRequest { prompt, params })
}

fn chat_prompt(f: &Fields) -> Result<Prompt, ApiError> {
    let Some(messages) = f.get("messages") else {
        return Err(ApiError::bad("messages", "'messages' is required"));
    };
    let Value::Array(list) = messages else {
        return Err(ApiError::bad("messages", format!("'messages' must be an array, got {}", type_name(messages))));
    };
    if list.is_empty() {
        return Err(ApiError::bad("messages", "'messages' must not be empty"));
    }
    let mut messages = list.clone();
    for (i, m) in messages.iter_mut().enumerate() {
        let Value::Object(o) = m else {
            return Err(ApiError::bad(&format!("messages[{i}]"), format!("each message must be an object, got {}", type_name(m))));
        };
        let role = match o.get("role") {
            Some(Value::String(r)) if !r.is_empty() => r.clone(),
            _ => return Err(ApiError::bad(&format!("messages[{i}].role"), "each message needs a 'role' string")),
        };
        tool_message(o, &role, i)?;
        // As mlx_lm.server: the template sees a string; text parts are joined. Only an assistant's
        // turn may leave it out (a call without text), read as "".
        let content = match o.get("content") {
            None | Some(Value::Null) if role == "assistant" => String::new(),
            None | Some(Value::Null) => return Err(ApiError::bad(&format!("messages[{i}].content"), format!("a '{}' message needs 'content'", clip(&role)))),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => text_parts(parts, i)?,
            Some(v) => {
                return Err(ApiError::bad(&format!("messages[{i}].content"), format!("'content' must be a string or an array of parts, got {}", type_name(v))))
            }
        };
        o.insert("content".into(), Value::String(content));
    }
    Ok(Prompt::Chat(Value::Array(messages)))
}

/// Checks a message's tool parts: an assistant's `tool_calls` (their `arguments` JSON strings
/// become objects, as mlx_lm.server passes them to the template) and a `tool` message's
/// `tool_call_id`.
fn tool_message(o: &mut Map<String, Value>, role: &str, i: usize) -> Result<(), ApiError> {
    if role == "tool" {
        match o.get("tool_call_id") {
            Some(Value::String(id)) if !id.is_empty() => {}
            None | Some(Value::Null) => return Err(ApiError::bad(&format!("messages[{i}].tool_call_id"), "a 'tool' message needs the 'tool_call_id' it answers")),
            Some(v) => return Err(ApiError::bad(&format!("messages[{i}].tool_call_id"), format!("'tool_call_id' must be a non-empty string, got {}", type_name(v)))),
        }
    }
    let Some(calls) = o.get_mut("tool_calls").filter(|v| !v.is_null()) else { return Ok(()) };
    if role != "assistant" {
        return Err(ApiError::bad(&format!("messages[{i}].tool_calls"), "only 'assistant' messages have 'tool_calls'"));
    }
    let Value::Array(calls) = calls else {
        return Err(ApiError::bad(&format!("messages[{i}].tool_calls"), format!("'tool_calls' must be an array, got {}", type_name(calls))));
    };
    for (j, c) in calls.iter_mut().enumerate() {
        let at = format!("messages[{i}].tool_calls[{j}]");
        let Some(call) = c.as_object_mut() else { return Err(ApiError::bad(&at, "each tool call must be an object")) };
        match call.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(t)) if t == "function" => {}
            Some(_) => return Err(ApiError::bad(&format!("{at}.type"), "a tool call's 'type' must be 'function'")),
        }
        if let Some(id) = call.get("id").filter(|v| !v.is_null()) {
            if !id.is_string() {
                return Err(ApiError::bad(&format!("{at}.id"), format!("a tool call's 'id' must be a string, got {}", type_name(id))));
            }
        }
        let Some(Value::Object(func)) = call.get_mut("function") else { return Err(ApiError::bad(&format!("{at}.function"), "a tool call needs a 'function' object")) };
        if func.get("name").and_then(Value::as_str).is_none_or(str::is_empty) {
            return Err(ApiError::bad(&format!("{at}.function.name"), "a tool call needs a 'name' string"));
        }
        let args = match func.get("arguments") {
            None | Some(Value::Null) => json!({}),
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(v @ Value::Object(_)) => v,
                _ => return Err(ApiError::bad(&format!("{at}.function.arguments"), "'arguments' must be a JSON object (as a string)")),
            },
            Some(v @ Value::Object(_)) => v.clone(),
            Some(v) => return Err(ApiError::bad(&format!("{at}.function.arguments"), format!("'arguments' must be a JSON string, got {}", type_name(v)))),
        };
        func.insert("arguments".into(), args);
    }
    Ok(())
}

/// A tool name as OpenAI allows: 1 to 64 of `a-z A-Z 0-9 _ -` (and `.`).
fn valid_tool_name(n: &str) -> bool {
    (1..=64).contains(&n.len()) && n.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// `tools`, `tool_choice` and `parallel_tool_calls` of a chat request.
fn tools(f: &Fields) -> Result<Tools, ApiError> {
    let mut tools = Vec::new();
    match f.get("tools") {
        None => {}
        Some(Value::Array(list)) => {
            for (i, t) in list.iter().enumerate() {
                let at = format!("tools[{i}]");
                if t.get("type").and_then(Value::as_str) != Some("function") {
                    return Err(ApiError::bad(&format!("{at}.type"), "each tool needs 'type': 'function'"));
                }
                let Some(func) = t.get("function").and_then(Value::as_object) else { return Err(ApiError::bad(&format!("{at}.function"), "each tool needs a 'function' object")) };
                let name = func.get("name").and_then(Value::as_str).unwrap_or_default();
                if !valid_tool_name(name) {
                    return Err(ApiError::bad(&format!("{at}.function.name"), "a tool name must be 1 to 64 letters, digits, '_', '-' or '.'"));
                }
                if tools.iter().any(|t: &Value| t["function"]["name"].as_str() == Some(name)) {
                    return Err(ApiError::bad(&format!("{at}.function.name"), format!("two tools are named '{name}'")));
                }
                match func.get("parameters") {
                    None | Some(Value::Null) | Some(Value::Object(_)) => {}
                    Some(v) => return Err(ApiError::bad(&format!("{at}.function.parameters"), format!("'parameters' must be a JSON schema object, got {}", type_name(v)))),
                }
                if let Some(d) = func.get("description").filter(|d| !d.is_null() && !d.is_string()) {
                    return Err(ApiError::bad(&format!("{at}.function.description"), format!("'description' must be a string, got {}", type_name(d))));
                }
                if let Some(s) = func.get("strict").filter(|d| !d.is_null() && !d.is_boolean()) {
                    return Err(ApiError::bad(&format!("{at}.function.strict"), format!("'strict' must be a boolean, got {}", type_name(s))));
                }
                tools.push(t.clone());
            }
        }
        Some(v) => return Err(ApiError::bad("tools", format!("'tools' must be an array, got {}", type_name(v)))),
    }
    let choice = match f.get("tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => return Err(ApiError::bad("tool_choice", format!("'tool_choice' must be 'auto', 'none', 'required' or a named function, got '{}'", clip(other)))),
        },
        Some(Value::Object(o)) => {
            let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            match (o.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(n)) => {
                    if !tools.iter().any(|t| t["function"]["name"].as_str() == Some(n)) {
                        return Err(ApiError::bad("tool_choice", format!("'tool_choice' names the function '{}', which is not in 'tools'", clip(n))));
                    }
                    ToolChoice::Named(n.to_owned())
                }
                _ => return Err(ApiError::bad("tool_choice", "a named 'tool_choice' is {\"type\": \"function\", \"function\": {\"name\": NAME}}")),
            }
        }
        Some(v) => return Err(ApiError::bad("tool_choice", format!("'tool_choice' must be a string or an object, got {}", type_name(v)))),
    };
    if tools.is_empty() && matches!(choice, ToolChoice::Required) {
        return Err(ApiError::bad("tool_choice", "'tool_choice': 'required' needs 'tools'"));
    }
    let parallel = f.bool("parallel_tool_calls")?.unwrap_or(true);
    for legacy in ["functions", "function_call"] {
        if f.get(legacy).is_some() {
            return Err(ApiError::bad(legacy, format!("'{legacy}' is deprecated and not supported; use 'tools' and 'tool_choice'")));
        }
    }
    Ok(Tools { tools, choice, parallel })
}

/// Text completions take no tools.
fn no_tools(f: &Fields) -> Result<Tools, ApiError> {
    for k in ["tools", "tool_choice", "parallel_tool_calls", "functions", "function_call"] {
        if f.get(k).is_some() {
            return Err(ApiError::bad(k, format!("'{k}' is only for /v1/chat/completions")));
        }
    }
    Ok(Tools::default())
}

/// `response_format`: `text`, `json_object`, or `json_schema` with `{"name", "schema", "strict"}`.
fn response_format(f: &Fields) -> Result<Option<ResponseFormat>, ApiError> {
    let bad = |m: &str| ApiError::bad("response_format", m);
    let Some(v) = f.get("response_format") else { return Ok(None) };
    let Value::Object(o) = v else { return Err(bad(&format!("'response_format' must be an object, got {}", type_name(v)))) };
    match o.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ResponseFormat { grammar: Grammar::JsonSchema(json!({"type": "object"})), strict: false })),
        Some("json_schema") => {
            let Some(Value::Object(js)) = o.get("json_schema") else { return Err(bad("'response_format' of type 'json_schema' needs a 'json_schema' object")) };
            if let Some(n) = js.get("name") {
                if !n.as_str().is_some_and(valid_tool_name) {
                    return Err(bad("'response_format.json_schema.name' must be 1 to 64 letters, digits, '_' or '-'"));
                }
            }
            let schema = match js.get("schema") {
                Some(s @ (Value::Object(_) | Value::Bool(_))) => s.clone(),
                None | Some(Value::Null) => json!({}),
                Some(s) => return Err(bad(&format!("'response_format.json_schema.schema' must be a JSON schema object, got {}", type_name(s)))),
            };
            let strict = match js.get("strict") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(s) => return Err(bad(&format!("'response_format.json_schema.strict' must be a boolean, got {}", type_name(s)))),
            };
            if let Some(d) = js.get("description").filter(|d| !d.is_null() && !d.is_string()) {
                return Err(bad(&format!("'response_format.json_schema.description' must be a string, got {}", type_name(d))));
            }
            Ok(Some(ResponseFormat { grammar: Grammar::JsonSchema(schema), strict }))
        }
        _ => Err(bad("'response_format.type' must be 'text', 'json_object' or 'json_schema'")),
    }
}

/// The text of a message's content parts, joined; only `{"type": "text", "text": "..."}` parts
/// are accepted (the models served are text-only).
fn text_parts(parts: &[Value], i: usize) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, p) in parts.iter().enumerate() {
        match (p.get("type").and_then(Value::as_str), p.get("text")) {
            (Some("text"), Some(Value::String(t))) => text.push_str(t),
            (Some("text"), _) => return Err(ApiError::bad(&format!("messages[{i}].content[{j}].text"), "a text part needs a 'text' string")),
            (Some(kind), _) => {
                return Err(ApiError::bad(&format!("messages[{i}].content[{j}]"), format!("only 'text' content parts are supported, got '{}'", clip(kind))))
            }
            (None, _) => return Err(ApiError::bad(&format!("messages[{i}].content[{j}]"), "each content part must be an object with a 'type'")),
        }
    }
    Ok(text)
}

/// At most 300 characters of a longer message (a compiler's error), for error messages.
pub fn clip_long(s: &str) -> String {
    match s.char_indices().nth(300) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_owned(),
    }
}

/// At most 64 characters of a string taken from the request, for error messages.
pub fn clip(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_owned(),
    }
}

/// The fields this server implements, per endpoint; any other field is a 400 naming it (a field
/// is never accepted and then ignored).
const CHAT_FIELDS: &[&str] = &[
    "model", "messages", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs", "stream", "stream_options", "temperature", "top_p", "min_p",
    "top_k", "logit_bias", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop", "n", "response_format", "tools", "tool_choice",
    "parallel_tool_calls", "functions", "function_call", "num_draft_tokens",
];
const COMPLETION_FIELDS: &[&str] = &[
    "model", "prompt", "max_tokens", "logprobs", "stream", "stream_options", "temperature", "top_p", "min_p", "top_k", "logit_bias", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "seed", "stop", "n", "response_format", "echo", "tools", "tool_choice", "parallel_tool_calls", "functions",
    "function_call", "num_draft_tokens",
];
/// Fields accepted only at the value that asks for nothing beyond what the server does.
/// (As JSON text.)
const DEFAULT_ONLY: &[(&str, &str)] = &[("store", "false"), ("best_of", "1")];

/// Refuses every field of the body (null or not) that the server does not implement.
fn unsupported_fields(map: &Map<String, Value>, chat: bool) -> Result<(), ApiError> {
    let known = if chat { CHAT_FIELDS } else { COMPLETION_FIELDS };
    for (k, v) in map {
        if known.contains(&k.as_str()) || v.is_null() {
            continue;
        }
        if let Some((_, want)) = DEFAULT_ONLY.iter().find(|(name, _)| name == k) {
            if serde_json::from_str::<Value>(want).is_ok_and(|w| *v == w) {
                continue;
            }
            return Err(unsupported(k, &format!("'{k}' is only accepted as {want}: this server does not implement it")));
        }
        return Err(unsupported(k, &format!("'{}' is not supported by this server", clip(k))));
    }
    Ok(())
}

/// A 400 for a request field the server does not implement.
pub fn unsupported(param: &str, message: &str) -> ApiError {
    ApiError { code: Some("unsupported_parameter"), ..ApiError::bad(&clip(param), message) }
}

fn text_prompt(f: &Fields) -> Result<Prompt, ApiError> {
    let bad = || ApiError::bad("prompt", "'prompt' must be a non-empty string, a list of one string, or a list of token ids");
    match f.get("prompt") {
        None => Err(ApiError::bad("prompt", "'prompt' is required")),
        Some(Value::String(s)) if !s.is_empty() => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(a)) if a.len() == 1 && a[0].as_str().is_some_and(|s| !s.is_empty()) => Ok(Prompt::Text(a[0].as_str().unwrap_or("").to_owned())),
        Some(Value::Array(a)) if !a.is_empty() => {
            a.iter().map(|v| v.as_u64().filter(|&t| t <= u64::from(u32::MAX)).map(|t| t as u32).ok_or_else(bad)).collect::<Result<_, _>>().map(Prompt::Tokens)
        }
        Some(_) => Err(bad()),
    }
}

fn stops(f: &Fields) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::bad("stop", format!("'stop' must be a non-empty string or a list of at most {MAX_STOPS} non-empty strings"));
    match f.get("stop") {
        None => Ok(Vec::new()),
        Some(Value::String(s)) if !s.is_empty() => Ok(vec![s.clone()]),
        Some(Value::Array(a)) if a.len() <= MAX_STOPS => {
            a.iter().map(|v| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned).ok_or_else(bad)).collect()
        }
        Some(_) => Err(bad()),
    }
}

fn sampler(f: &Fields) -> Result<SamplerConfig, ApiError> {
    let mut logit_bias = Vec::new();
    match f.get("logit_bias") {
        None => {}
        Some(Value::Object(o)) => {
            for (k, v) in o {
                let id: u32 = k.trim().parse().map_err(|_| ApiError::bad("logit_bias", format!("'logit_bias' keys must be token ids, got {:?}", clip(k))))?;
                let b = v.as_f64().filter(|b| (-100.0..=100.0).contains(b));
                let b = b.ok_or_else(|| ApiError::bad("logit_bias", format!("'logit_bias' values must be numbers in [-100, 100], got {} for {}", clip(&v.to_string()), clip(k))))?;
                logit_bias.push((id, b));
            }
        }
        Some(v) => return Err(ApiError::bad("logit_bias", format!("'logit_bias' must be an object, got {}", type_name(v)))),
    }
    let top_k = match f.int("top_k", -1, i64::from(i32::MAX))? {
        Some(-1) | None => 0,
        Some(k) => k as i32,
    };
    let config = SamplerConfig {
        temp: f.num("temperature", 0.0, 100.0)?.unwrap_or(0.0),
        top_p: f.num("top_p", 0.0, 1.0)?.unwrap_or(1.0),
        min_p: f.num("min_p", 0.0, 1.0)?.unwrap_or(0.0),
        top_k,
        processors: LogitsProcessors {
            logit_bias,
            repetition_penalty: f.num("repetition_penalty", 0.0, 100.0)?,
            presence_penalty: f.num("presence_penalty", -2.0, 2.0)?,
            frequency_penalty: f.num("frequency_penalty", -2.0, 2.0)?,
            ..LogitsProcessors::default()
        },
        ..SamplerConfig::default()
    };
    config.validate().map_err(|e| ApiError::bad("body", e.to_string()))?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str, chat: bool) -> ApiError {
        parse(body.as_bytes(), chat, "m").expect_err(body)
    }

    #[test]
    fn bad_fields_are_named() {
        let msgs = r#""messages":[{"role":"user","content":"hi"}]"#;
        for (field, body) in [
            ("temperature", format!(r#"{{{msgs},"temperature":"hot"}}"#)),
            ("temperature", format!(r#"{{{msgs},"temperature":-1}}"#)),
            ("top_p", format!(r#"{{{msgs},"top_p":2}}"#)),
            ("max_tokens", format!(r#"{{{msgs},"max_tokens":0}}"#)),
            ("max_tokens", format!(r#"{{{msgs},"max_tokens":1e30}}"#)),
            ("n", format!(r#"{{{msgs},"n":0}}"#)),
            ("stop", format!(r#"{{{msgs},"stop":[1]}}"#)),
            ("logit_bias", format!(r#"{{{msgs},"logit_bias":{{"x":1}}}}"#)),
            ("seed", format!(r#"{{{msgs},"seed":-3}}"#)),
            ("top_logprobs", format!(r#"{{{msgs},"top_logprobs":3}}"#)),
            ("num_draft_tokens", format!(r#"{{{msgs},"num_draft_tokens":-1}}"#)),
            ("num_draft_tokens", format!(r#"{{{msgs},"num_draft_tokens":2.5}}"#)),
            ("num_draft_tokens", format!(r#"{{{msgs},"num_draft_tokens":"3"}}"#)),
            ("num_draft_tokens", format!(r#"{{{msgs},"num_draft_tokens":1000}}"#)),
            ("messages", r#"{"messages":"hi"}"#.to_owned()),
            ("messages", r#"{}"#.to_owned()),
            ("messages[0].role", r#"{"messages":[{"content":"x"}]}"#.to_owned()),
        ] {
            let e = err(&body, true);
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {}", e.message);
        }
        assert_eq!(err(r#"{"prompt":5}"#, false).param.as_deref(), Some("prompt"));
        assert_eq!(err("[1", false).code, Some("invalid_json"));
        assert_eq!(err(r#"{"prompt":"x","model":"other"}"#, false).status, StatusCode::NOT_FOUND);
    }

    #[test]
    fn content_parts_are_joined_and_contentless_turns_refused() {
        let r = parse(br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null}]}"#, true, "m").expect("valid");
        let Prompt::Chat(m) = r.prompt else { panic!("not chat") };
        assert_eq!(m, json!([{"role": "user", "content": "ab"}, {"role": "assistant", "content": ""}]));
        for (param, body) in [
            ("messages[0].content[0]", r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}"#),
            ("messages[0].content[1]", r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},"b"]}]}"#),
            ("messages[0].content[0].text", r#"{"messages":[{"role":"user","content":[{"type":"text","text":{"x":1}}]}]}"#),
            ("tools", r#"{"messages":[{"role":"user","content":"x"}],"tools":5}"#),
            ("user", r#"{"messages":[{"role":"user","content":"x"}],"user":"u"}"#),
            ("messages[0].content", r#"{"messages":[{"role":"user"}]}"#),
            ("messages[1].content", r#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":null}]}"#),
            ("response_format", r#"{"messages":[{"role":"user","content":"x"}],"response_format":"json"}"#),
        ] {
            assert_eq!(err(body, true).param.as_deref(), Some(param), "{body}");
        }
        assert_eq!(err(r#"{"prompt":"x","best_of":2}"#, false).param.as_deref(), Some("best_of"));
        assert!(parse(br#"{"prompt":"x","user":null,"tools":null,"best_of":1,"store":false,"echo":false}"#, false, "m").is_ok());
    }

    /// Every field the server does not implement is a 400 that names it, on both endpoints.
    #[test]
    fn unimplemented_fields_are_refused_by_name() {
        let chat = r#""messages":[{"role":"user","content":"x"}]"#;
        for field in ["user", "metadata", "service_tier", "modalities", "reasoning_effort", "prediction", "audio", "web_search_options", "chat_template_kwargs", "suffix", "logprob", "store"] {
            for (is_chat, base) in [(true, chat), (false, r#""prompt":"x""#)] {
                let body = format!(r#"{{{base},"{field}":true}}"#);
                let e = err(&body, is_chat);
                assert_eq!((e.status, e.param.as_deref(), e.code), (StatusCode::BAD_REQUEST, Some(field), Some("unsupported_parameter")), "{body}");
            }
        }
        assert_eq!(err(r#"{"prompt":"x","min_p":0.1,"tool_choice":"auto","top_logprobs":2}"#, false).param.as_deref(), Some("top_logprobs"));
    }

    #[test]
    fn good_request_maps_to_settings() {
        let body = r#"{"model":"m","prompt":"x","max_tokens":7,"temperature":0.5,"top_k":-1,"stop":"\n","logprobs":2,"n":2}"#;
        let r = parse(body.as_bytes(), false, "m").expect("valid");
        assert_eq!((r.params.max_tokens, r.params.n, r.params.logprobs), (7, 2, Some(2)));
        assert_eq!((r.params.sampler.temp, r.params.sampler.top_k), (0.5, 0));
        assert_eq!(r.params.stop, vec!["\n".to_owned()]);
    }
}
