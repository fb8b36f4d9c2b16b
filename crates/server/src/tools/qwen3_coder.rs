//! Qwen3-Coder tool calls (mlx-lm's `qwen3_coder`): inside `<tool_call>`, an XML-style
//! `<function=NAME>` with one `<parameter=P>\nVALUE\n</parameter>` per argument; values are
//! converted by the type the tool's schema gives the parameter, as mlx-lm's `_convert_param_value`.
use super::{json_atom, lark_string, name_and_params, ParsedCall};
use serde_json::{json, Map, Value};

/// mlx-lm's `_name_regex` (`\s*([^\s<>]+)>?`): the name and the rest after it.
fn name_of(s: &str) -> Option<(&str, &str)> {
    let t = s.trim_start();
    let end = t.find(|c: char| c.is_whitespace() || c == '<' || c == '>').unwrap_or(t.len());
    if end == 0 {
        return None;
    }
    let rest = &t[end..];
    Some((&t[..end], rest.strip_prefix('>').unwrap_or(rest)))
}

/// The call in one `<tool_call>` section.
pub fn parse(text: &str, tools: &[Value]) -> Result<Vec<ParsedCall>, String> {
    let t = text.trim_end();
    let start = t.find("<function=").ok_or("no function provided")?;
    let inner = t[start + "<function=".len()..].strip_suffix("</function>").ok_or("the function is not closed")?;
    let (name, mut rest) = name_of(inner).ok_or("no function name provided")?;
    let props = tools.iter().map(name_and_params).find(|(n, _)| n == name).map(|(_, p)| p["properties"].clone()).unwrap_or(Value::Null);
    let mut args = Map::new();
    while let Some(at) = rest.find("<parameter=") {
        let body = &rest[at + "<parameter=".len()..];
        let Some(close) = body.find("</parameter>") else { break };
        if let Some((pname, value)) = name_of(&body[..close]) {
            let value = value.strip_prefix('\n').unwrap_or(value);
            let value = value.strip_suffix('\n').unwrap_or(value);
            args.insert(pname.to_owned(), convert(value, &props[pname])?);
        }
        rest = &body[close + "</parameter>".len()..];
    }
    Ok(vec![ParsedCall { name: name.to_owned(), arguments: Value::Object(args) }])
}

/// mlx-lm's `_convert_param_value` for one value and its property schema.
fn convert(value: &str, prop: &Value) -> Result<Value, String> {
    if value.eq_ignore_ascii_case("null") {
        return Ok(Value::Null);
    }
    if !prop.is_object() {
        return Ok(json!(value));
    }
    let Some(kind) = prop.get("type") else {
        return Ok(match serde_json::from_str::<Value>(value) {
            Ok(v @ (Value::Object(_) | Value::Array(_))) => v,
            _ => json!(value),
        });
    };
    let kind = match kind {
        Value::String(s) => s.trim().to_lowercase(),
        other => other.to_string().to_lowercase(),
    };
    let float = || value.trim().parse::<f64>().map_err(|_| format!("{value:?} is not a number"));
    if ["string", "str", "text", "varchar", "char", "enum"].contains(&kind.as_str()) {
        Ok(json!(value))
    } else if ["int", "uint", "long", "short", "unsigned"].iter().any(|p| kind.starts_with(p)) {
        let f = float()?;
        if f.fract() != 0.0 {
            return Err(format!("invalid integer literal {value:?}"));
        }
        Ok(json!(f as i64))
    } else if kind.starts_with("num") || kind.starts_with("float") {
        let f = float()?;
        Ok(if f.fract() == 0.0 && f.abs() < 9e15 { json!(f as i64) } else { json!(f) })
    } else if ["boolean", "bool", "binary"].contains(&kind.as_str()) {
        Ok(json!(value.eq_ignore_ascii_case("true")))
    } else {
        Ok(serde_json::from_str::<Value>(value).unwrap_or_else(|_| json!(value)))
    }
}

/// `<tool_call>\n<function=NAME>\n` then the required parameters in order and each optional one
/// optionally, string values as one line without `<`, others as JSON of their schema.
pub fn grammar(tools: &[Value], parallel: bool, lit: &dyn Fn(&str) -> String) -> String {
    let mut rules = Vec::new();
    let mut alts = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let (name, params) = name_and_params(t);
        let required: Vec<&str> = params["required"].as_array().map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        let mut parts = vec![lark_string(&format!("<function={name}>\n"))];
        if let Some(props) = params["properties"].as_object() {
            for (p, schema) in props {
                let value = if schema["type"] == "string" && schema.get("enum").is_none() { "LINE".to_owned() } else { json_atom(schema) };
                let part = format!("{} {value} \"\\n</parameter>\\n\"", lark_string(&format!("<parameter={p}>\n")));
                parts.push(if required.contains(&p.as_str()) { part } else { format!("({part})?") });
            }
        }
        parts.push("\"</function>\"".into());
        rules.push(format!("f{i}: {}", parts.join(" ")));
        alts.push(format!("f{i}"));
    }
    let body = if parallel { "call (\"\\n\" call)*" } else { "call" };
    format!(
        "start: {body}\ncall: {} \"\\n\" ({}) \"\\n\" {}\n{}\nLINE: /[^<\\n]*/\n",
        lit("<tool_call>"),
        alts.join(" | "),
        lit("</tool_call>"),
        rules.join("\n")
    )
}
