//! DeepSeek tool calls, between its tool tokens: V3 / R1 write
//! `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>`, V3.1
//! `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`, all inside
//! `<｜tool▁calls▁begin｜>` ... `<｜tool▁calls▁end｜>`. mlx-lm 0.32.2 has no parser for it.
use super::{json_atom, lark_string, name_and_params, ParsedCall};
use serde_json::Value;

pub const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
pub const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";

/// The calls of one calls section.
pub fn parse(text: &str) -> Result<Vec<ParsedCall>, String> {
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(CALL_BEGIN) {
        let body_start = at + CALL_BEGIN.len();
        let end = rest[body_start..].find(CALL_END).map(|e| body_start + e);
        let body = &rest[body_start..end.unwrap_or(rest.len())];
        calls.push(parse_call(body)?);
        rest = end.map_or("", |e| &rest[e + CALL_END.len()..]);
    }
    if calls.is_empty() {
        return Err("no tool call in the section".into());
    }
    Ok(calls)
}

fn parse_call(body: &str) -> Result<ParsedCall, String> {
    let (before, after) = body.split_once(SEP).ok_or("a tool call without its separator")?;
    let (name, args) = if before.trim() == "function" {
        let (name, rest) = after.split_once('\n').ok_or("a tool call without its arguments")?;
        let rest = rest.trim();
        let json = rest.strip_prefix("```json").and_then(|r| r.trim_end().strip_suffix("```")).ok_or("the arguments are not in a json code block")?;
        (name.trim(), json)
    } else {
        (before.trim(), after)
    };
    let arguments: Value = serde_json::from_str(args.trim()).map_err(|e| format!("the arguments are not JSON: {e}"))?;
    if name.is_empty() || !arguments.is_object() {
        return Err("a tool call needs a name and object arguments".into());
    }
    Ok(ParsedCall { name: name.to_owned(), arguments })
}

/// The V3 / R1 form, which their templates render.
pub fn grammar(tools: &[Value], parallel: bool, lit: &dyn Fn(&str) -> String) -> String {
    let alts: Vec<String> = tools
        .iter()
        .map(|t| {
            let (name, params) = name_and_params(t);
            format!("{} {} \"\\n```\"", lark_string(&format!("{name}\n```json\n")), json_atom(&params))
        })
        .collect();
    let body = if parallel { "call+" } else { "call" };
    format!(
        "start: {} {body} {}\ncall: {} \"function\" {} fn {}\nfn: {}\n",
        lit(CALLS_BEGIN),
        lit(CALLS_END),
        lit(CALL_BEGIN),
        lit(SEP),
        lit(CALL_END),
        alts.join(" | ")
    )
}
