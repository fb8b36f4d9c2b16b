//! Tool calls: which format the model writes them in (picked from its chat template, as mlx-lm's
//! `_infer_tool_parser`), parsing its output back into calls (also while it streams), and the
//! grammar that forces a call when `tool_choice` is `required` or names a function.
//!
//! One file per family: `json_tools` (Qwen / Hermes `<tool_call>` JSON), `qwen3_coder` (XML-style
//! `<function=...>`), `llama3` (a bare JSON object), `mistral` (`[TOOL_CALLS]`), `deepseek` (its
//! tool tokens). Text that looks like a call but does not parse stays content.
mod deepseek;
mod json_tools;
mod llama3;
mod mistral;
mod qwen3_coder;

use serde_json::{json, Value};

/// The tool-call formats of the families served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (mlx-lm's `json_tools`).
    JsonTools,
    /// `<tool_call>\n<function=NAME>\n<parameter=P>\nV\n</parameter>\n</function>\n</tool_call>`.
    Qwen3Coder,
    /// `{"name": ..., "parameters": {...}}` as the whole answer (optionally after `<|python_tag|>`).
    Llama3,
    /// `[TOOL_CALLS]` then a JSON list of calls, or `name[ARGS]{...}` repeated.
    Mistral,
    /// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>...`.
    DeepSeek,
}

/// One parsed call: the function's name and its arguments (a JSON object).
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: Value,
}

/// A call as the API returns it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as a JSON string (OpenAI's `function.arguments`).
    pub arguments: String,
}

impl ToolCall {
    fn new(call: ParsedCall) -> ToolCall {
        ToolCall { id: new_call_id(), name: call.name, arguments: call.arguments.to_string() }
    }

    /// OpenAI's `{"id", "type": "function", "function": {"name", "arguments"}}`.
    pub fn openai(&self) -> Value {
        json!({"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}})
    }
}

/// `call_` and 24 hex digits, unique within the process.
pub fn new_call_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    format!("call_{:016x}{:08x}", t.wrapping_mul(0x9e37_79b9_7f4a_7c15), n as u32)
}

impl ToolFormat {
    /// The format a chat template writes, as mlx-lm's `_infer_tool_parser` checks (for the families
    /// served here), plus DeepSeek's and Llama 3.x's templates, which mlx-lm 0.32.2 does not parse.
    pub fn detect(template: &str) -> Option<ToolFormat> {
        if template.contains("<tool_call>\\n<function=") || template.contains("<tool_call>\n<function=") {
            Some(ToolFormat::Qwen3Coder)
        } else if template.contains("[TOOL_CALLS]") {
            Some(ToolFormat::Mistral)
        } else if template.contains("<tool_call>") && template.contains("tool_call.name") {
            Some(ToolFormat::JsonTools)
        } else if template.contains("tool▁calls▁begin") {
            Some(ToolFormat::DeepSeek)
        } else if template.contains("<|start_header_id|>") && template.contains("\"parameters\"") && template.contains("tools") {
            Some(ToolFormat::Llama3)
        } else {
            None
        }
    }

    /// Where a call section starts and ends in the output ("" for Llama 3: the whole answer; no
    /// end for Mistral: to the end of the output).
    fn markers(self) -> (&'static str, &'static str) {
        match self {
            ToolFormat::JsonTools | ToolFormat::Qwen3Coder => ("<tool_call>", "</tool_call>"),
            ToolFormat::Llama3 => ("", ""),
            ToolFormat::Mistral => ("[TOOL_CALLS]", ""),
            ToolFormat::DeepSeek => (deepseek::CALLS_BEGIN, deepseek::CALLS_END),
        }
    }

    /// The calls in the text of one call section (between the markers).
    pub fn parse(self, text: &str, tools: &[Value]) -> Result<Vec<ParsedCall>, String> {
        match self {
            ToolFormat::JsonTools => json_tools::parse(text),
            ToolFormat::Qwen3Coder => qwen3_coder::parse(text, tools),
            ToolFormat::Llama3 => llama3::parse(text),
            ToolFormat::Mistral => mistral::parse(text),
            ToolFormat::DeepSeek => deepseek::parse(text),
        }
    }

    /// A Lark grammar (llguidance's dialect) for one call, or one or more (`parallel`), of `tools`
    /// (OpenAI tool objects), each call's arguments constrained to its `parameters` schema.
    /// `token_id` names a marker's single token when the vocabulary has one (the grammar then asks
    /// for that token).
    pub fn forced_grammar(self, tools: &[Value], parallel: bool, template: &str, token_id: &dyn Fn(&str) -> Option<u32>) -> String {
        let lit = |s: &str| match token_id(s) {
            Some(id) => format!("<[{id}]>"),
            None => lark_string(s),
        };
        match self {
            ToolFormat::JsonTools => json_tools::grammar(tools, parallel, &lit),
            ToolFormat::Qwen3Coder => qwen3_coder::grammar(tools, parallel, &lit),
            ToolFormat::Llama3 => llama3::grammar(tools, parallel),
            ToolFormat::Mistral => mistral::grammar(tools, parallel, template, &lit),
            ToolFormat::DeepSeek => deepseek::grammar(tools, parallel, &lit),
        }
    }
}

/// A Lark string literal.
pub(crate) fn lark_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// A tool's name and `parameters` schema (`{"type": "object"}` when it has none).
pub(crate) fn name_and_params(tool: &Value) -> (String, Value) {
    let f = &tool["function"];
    let name = f["name"].as_str().unwrap_or_default().to_owned();
    let params = f.get("parameters").filter(|p| p.is_object()).cloned().unwrap_or_else(|| json!({"type": "object"}));
    (name, params)
}

/// The schema of one call object `{"name": NAME, args_key: ARGS}` over `tools` (anyOf when several).
pub(crate) fn call_schema(tools: &[Value], args_key: &str) -> Value {
    let one = |t: &Value| {
        let (name, params) = name_and_params(t);
        json!({"type": "object", "properties": {"name": {"const": name}, args_key: params}, "required": ["name", args_key], "additionalProperties": false})
    };
    let mut schema = if tools.len() == 1 { one(&tools[0]) } else { json!({"anyOf": tools.iter().map(one).collect::<Vec<_>>()}) };
    schema["x-guidance"] = json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
    schema
}

/// A `%json {...}` grammar atom for `schema` with compact separators.
pub(crate) fn json_atom(schema: &Value) -> String {
    format!("%json {}", crate::constrain::compact_json(schema))
}

/// A call parsed from a JSON object with a string `name` and an object (or JSON-string) under one
/// of `arg_keys`; `None` when it is not one.
pub(crate) fn call_from_json(v: &Value, arg_keys: &[&str]) -> Option<ParsedCall> {
    let name = v.get("name")?.as_str()?.to_owned();
    let args = arg_keys.iter().find_map(|k| v.get(*k)).cloned().unwrap_or_else(|| json!({}));
    let args = match args {
        Value::String(s) => serde_json::from_str::<Value>(&s).ok()?,
        a => a,
    };
    args.is_object().then_some(ParsedCall { name, arguments: args })
}

/// What a [`ToolStream`] hands out: answer text, or a finished call.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Content(String),
    Call(ToolCall),
}

/// Splits streamed answer text into content and tool calls: text that could still become a call
/// marker is held back, call sections are parsed when they close (or at the end), and a section
/// that does not parse comes back as content.
pub struct ToolStream {
    format: ToolFormat,
    tools: Vec<Value>,
    /// Text not yet handed out (outside calls: a possible marker prefix; Llama 3: the whole answer).
    held: String,
    /// Inside a call section: its text so far.
    section: Option<String>,
    /// The answer still may be a bare JSON call (it starts with `{`, or Llama 3's `<|python_tag|>`):
    /// Llama 3's format, and JSON-tools models that leave out the `<tool_call>` tags (small Qwen2.5s do).
    maybe_bare_call: bool,
    pub calls: usize,
}

impl ToolStream {
    pub fn new(format: ToolFormat, tools: Vec<Value>) -> ToolStream {
        ToolStream { format, tools, held: String::new(), section: None, maybe_bare_call: matches!(format, ToolFormat::Llama3 | ToolFormat::JsonTools), calls: 0 }
    }

    /// The pieces `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        if self.maybe_bare_call {
            self.held.push_str(text);
            let t = self.held.trim_start();
            let tag = self.format == ToolFormat::Llama3 && (llama3::PYTHON_TAG.starts_with(t) || t.starts_with(llama3::PYTHON_TAG));
            if t.is_empty() || t.starts_with('{') || tag {
                return out;
            }
            self.maybe_bare_call = false;
            let held = std::mem::take(&mut self.held);
            if self.format == ToolFormat::Llama3 {
                out.push(Piece::Content(held));
                return out;
            }
            return self.push(&held);
        }
        if self.format == ToolFormat::Llama3 {
            out.push(Piece::Content(text.to_owned()));
            return out;
        }
        let (start, end) = self.format.markers();
        self.held.push_str(text);
        loop {
            match &mut self.section {
                None => match self.held.find(start) {
                    Some(at) => {
                        if at > 0 {
                            out.push(Piece::Content(self.held[..at].to_owned()));
                        }
                        self.held = self.held[at + start.len()..].to_owned();
                        self.section = Some(String::new());
                    }
                    None => {
                        let keep = partial_suffix(&self.held, start);
                        let emit = self.held.len() - keep;
                        if emit > 0 {
                            out.push(Piece::Content(self.held[..emit].to_owned()));
                            self.held = self.held[emit..].to_owned();
                        }
                        return out;
                    }
                },
                Some(section) => {
                    section.push_str(&self.held);
                    self.held.clear();
                    let found = if end.is_empty() { None } else { section.find(end) };
                    let Some(at) = found else { return out };
                    let body = section[..at].to_owned();
                    self.held = section[at + end.len()..].to_owned();
                    self.section = None;
                    self.close(&body, true, &mut out);
                }
            }
        }
    }

    /// The pieces left at the end of the output.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        if self.maybe_bare_call {
            self.maybe_bare_call = false;
            let held = std::mem::take(&mut self.held);
            let t = held.trim();
            if self.format == ToolFormat::JsonTools {
                let (calls, rest) = json_tools::bare_calls(t);
                if calls.is_empty() {
                    out.push(Piece::Content(held));
                } else {
                    self.emit(calls, &mut out);
                    if !rest.is_empty() {
                        out.push(Piece::Content(rest.to_owned()));
                    }
                }
                return out;
            }
            let t = t.strip_prefix(llama3::PYTHON_TAG).unwrap_or(t);
            match llama3::parse(t) {
                Ok(calls) if !calls.is_empty() => self.emit(calls, &mut out),
                _ if !held.is_empty() => out.push(Piece::Content(held)),
                _ => {}
            }
            return out;
        }
        if let Some(section) = self.section.take() {
            self.close(&section, false, &mut out);
        }
        if !self.held.is_empty() {
            out.push(Piece::Content(std::mem::take(&mut self.held)));
        }
        out
    }

    fn close(&mut self, body: &str, closed: bool, out: &mut Vec<Piece>) {
        match self.format.parse(body, &self.tools) {
            Ok(calls) if !calls.is_empty() => self.emit(calls, out),
            _ => {
                let (start, end) = self.format.markers();
                out.push(Piece::Content(format!("{start}{body}{}", if closed { end } else { "" })));
            }
        }
    }

    fn emit(&mut self, calls: Vec<ParsedCall>, out: &mut Vec<Piece>) {
        for c in calls {
            self.calls += 1;
            out.push(Piece::Call(ToolCall::new(c)));
        }
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `marker`.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1)).rev().find(|&n| text.is_char_boundary(text.len() - n) && marker.as_bytes().starts_with(&text.as_bytes()[text.len() - n..])).unwrap_or(0)
}

/// Splits a whole answer into its content and calls.
pub fn split(format: ToolFormat, tools: &[Value], text: &str) -> (String, Vec<ToolCall>) {
    let mut s = ToolStream::new(format, tools.to_vec());
    let mut pieces = s.push(text);
    pieces.extend(s.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for p in pieces {
        match p {
            Piece::Content(c) => content.push_str(&c),
            Piece::Call(c) => calls.push(c),
        }
    }
    (content, calls)
}

#[cfg(test)]
mod tests;
