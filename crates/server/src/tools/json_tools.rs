//! Qwen2.5 / Hermes tool calls (mlx-lm's `json_tools`): each call is a JSON object
//! `{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`. Beyond mlx-lm: an
//! answer that is only such objects without the tags (what Qwen2.5-Coder-0.5B writes) is read as
//! calls too.
use super::{call_from_json, call_schema, json_atom, ParsedCall};
use serde_json::Value;

/// The call in one `<tool_call>` section.
pub fn parse(text: &str) -> Result<Vec<ParsedCall>, String> {
    let v: Value = serde_json::from_str(text.trim()).map_err(|e| format!("the tool call is not JSON: {e}"))?;
    call_from_json(&v, &["arguments"]).map(|c| vec![c]).ok_or_else(|| "the tool call needs a string 'name' and object 'arguments'".into())
}

/// The calls at the start of a bare answer (JSON call objects one after another, without tags) and
/// the text after the last one; no calls when the answer does not start with one.
pub fn bare_calls(text: &str) -> (Vec<ParsedCall>, &str) {
    let mut calls = Vec::new();
    let mut rest = text.trim_start();
    loop {
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match it.next() {
            Some(Ok(v)) => match call_from_json(&v, &["arguments"]) {
                Some(c) => {
                    calls.push(c);
                    rest = rest[it.byte_offset()..].trim_start();
                }
                None => break,
            },
            _ => break,
        }
    }
    if calls.is_empty() {
        return (calls, text);
    }
    (calls, rest)
}

/// Calls as Qwen2.5's template shows them: `<tool_call>\n{json}\n</tool_call>`, newline-separated.
pub fn grammar(tools: &[Value], parallel: bool, lit: &dyn Fn(&str) -> String) -> String {
    let body = if parallel { "call (\"\\n\" call)*" } else { "call" };
    format!("start: {body}\ncall: {} \"\\n\" {} \"\\n\" {}\n", lit("<tool_call>"), json_atom(&call_schema(tools, "arguments")), lit("</tool_call>"))
}
