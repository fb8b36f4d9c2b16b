//! Mistral tool calls (mlx-lm's `mistral`): `[TOOL_CALLS]` and then, to the end of the output,
//! either a JSON list `[{"name": ..., "arguments": {...}}]` or `name[ARGS]{...}` repeated.
use super::{call_from_json, call_schema, json_atom, lark_string, name_and_params, ParsedCall};
use serde_json::{json, Value};

/// The calls after `[TOOL_CALLS]`.
pub fn parse(text: &str) -> Result<Vec<ParsedCall>, String> {
    let t = text.trim();
    if let Ok(Value::Array(list)) = serde_json::from_str::<Value>(t) {
        return list.iter().map(|c| call_from_json(c, &["arguments"]).ok_or_else(|| format!("cannot parse a tool call from {t}"))).collect();
    }
    let mut calls = Vec::new();
    let mut rest = t;
    while let Some(at) = rest.find("[ARGS]") {
        let name = rest[..at].trim();
        if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '-') {
            return Err(format!("'{name}' is not a tool name"));
        }
        let after = rest[at + "[ARGS]".len()..].trim_start();
        let mut it = serde_json::Deserializer::from_str(after).into_iter::<Value>();
        let args = match it.next() {
            Some(Ok(v)) if v.is_object() => v,
            _ => return Err("the tool call's arguments are not a JSON object".into()),
        };
        calls.push(ParsedCall { name: name.to_owned(), arguments: args });
        rest = after[it.byte_offset()..].trim_start();
    }
    if calls.is_empty() {
        return Err(format!("cannot parse a tool call from {t}"));
    }
    Ok(calls)
}

/// `[TOOL_CALLS]` then `name[ARGS]{...}` (templates that show `[ARGS]`) or a JSON list of calls.
pub fn grammar(tools: &[Value], parallel: bool, template: &str, lit: &dyn Fn(&str) -> String) -> String {
    let open = lit("[TOOL_CALLS]");
    if template.contains("[ARGS]") {
        let alts: Vec<String> = tools
            .iter()
            .map(|t| {
                let (name, params) = name_and_params(t);
                format!("{} {} {}", lark_string(&name), lit("[ARGS]"), json_atom(&params))
            })
            .collect();
        let body = if parallel { "call+" } else { "call" };
        return format!("start: {open} {body}\ncall: {}\n", alts.join(" | "));
    }
    let mut list = json!({"type": "array", "items": call_schema(tools, "arguments"), "minItems": 1});
    if !parallel {
        list["maxItems"] = json!(1);
    }
    format!("start: {open} {}\n", json_atom(&list))
}
