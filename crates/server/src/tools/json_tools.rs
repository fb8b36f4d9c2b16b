//! Qwen2.5 / Hermes tool calls (mlx-lm's `json_tools`): each call is a JSON object
//! `{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`.
use super::{call_from_json, call_schema, json_atom, ParsedCall};
use serde_json::Value;

/// The call in one `<tool_call>` section.
pub fn parse(text: &str) -> Result<Vec<ParsedCall>, String> {
    let v: Value = serde_json::from_str(text.trim()).map_err(|e| format!("the tool call is not JSON: {e}"))?;
    call_from_json(&v, &["arguments"]).map(|c| vec![c]).ok_or_else(|| "the tool call needs a string 'name' and object 'arguments'".into())
}

/// Calls as Qwen2.5's template shows them: `<tool_call>\n{json}\n</tool_call>`, newline-separated.
pub fn grammar(tools: &[Value], parallel: bool, lit: &dyn Fn(&str) -> String) -> String {
    let body = if parallel { "call (\"\\n\" call)*" } else { "call" };
    format!("start: {body}\ncall: {} \"\\n\" {} \"\\n\" {}\n", lit("<tool_call>"), json_atom(&call_schema(tools, "arguments")), lit("</tool_call>"))
}
