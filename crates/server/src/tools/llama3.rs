//! Llama 3.x tool calls: the whole answer is `{"name": ..., "parameters": {...}}` (Llama 3.1 may
//! put `<|python_tag|>` first; several calls are separated by `;`). mlx-lm 0.32.2 has no parser
//! for it; this follows Meta's format as the 3.1/3.2 templates describe it.
use super::{call_from_json, call_schema, json_atom, ParsedCall};
use serde_json::Value;

pub const PYTHON_TAG: &str = "<|python_tag|>";

/// The calls of a whole answer (without a leading `<|python_tag|>`).
pub fn parse(text: &str) -> Result<Vec<ParsedCall>, String> {
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = match it.next() {
            Some(Ok(v)) => v,
            _ => return Err("the answer is not a JSON tool call".into()),
        };
        let used = it.byte_offset();
        calls.push(call_from_json(&v, &["parameters", "arguments"]).ok_or("a tool call needs a string 'name' and object 'parameters'")?);
        rest = rest[used..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
        if !rest.is_empty() && !rest.starts_with('{') {
            return Err("text after the tool call".into());
        }
    }
    Ok(calls)
}

/// One or more `{"name": ..., "parameters": ...}` objects, `; `-separated.
pub fn grammar(tools: &[Value], parallel: bool) -> String {
    let body = if parallel { "call (\"; \" call)*" } else { "call" };
    format!("start: {body}\ncall: {}\n", json_atom(&call_schema(tools, "parameters")))
}
