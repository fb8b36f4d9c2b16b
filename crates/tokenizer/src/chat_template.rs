//! Chat templates rendered as transformers renders them: a Jinja environment with trim_blocks and
//! lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, its own `tojson`, Python string methods
//! and Python's way of printing values.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Value};

use super::config::TemplateSet;
use super::pyfmt::{self, JsonOptions};
use super::template_source;
use super::TokenizerError;

/// The compiled chat templates of a tokenizer.
pub(crate) struct ChatTemplates {
    env: Environment<'static>,
    /// One template (stored as "default") rather than a named set.
    single: bool,
    /// Per name: None when it compiled, else the compile error (reported when the template is used).
    compiled: BTreeMap<String, Option<String>>,
    /// The source of a single template (transformers' `chat_template` as a string).
    source: Option<String>,
}

/// transformers' Jinja environment, as `_compile_jinja_template` builds it.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(|out, _state, value| {
        out.write_str(&pyfmt::py_str(value))
            .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
    });
    env.add_filter("tojson", tojson);
    env.add_filter("string", |v: Value| pyfmt::py_str(&v));
    env.add_function(
        "raise_exception",
        |message: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        },
    );
    env.add_function("strftime_now", |format: String| {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        pyfmt::strftime(&format, now)
    });
    env
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    let mut given: [Option<Value>; 4] = Default::default();
    for (i, a) in args.iter().enumerate() {
        given[i] = Some(a.clone());
    }
    for (i, name) in NAMES.iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            given[i] = Some(v);
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = given;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) => {
            let n = v
                .as_i64()
                .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "indent must be an int"))?;
            Some(" ".repeat(n.max(0) as usize))
        }
    };
    let (item_sep, key_sep) = match separators.filter(|v| !v.is_none()) {
        Some(seps) => {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "separators must be two strings",
                    ))
                }
            }
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let opts = JsonOptions {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    pyfmt::json_dumps(&value, &opts).map(Value::from)
}

impl ChatTemplates {
    pub fn new(set: TemplateSet) -> ChatTemplates {
        let mut env = environment();
        let mut compiled = BTreeMap::new();
        let source = if set.single { set.by_name.get("default").cloned() } else { None };
        for (name, source) in set.by_name {
            let result = env.add_template_owned(name.clone(), template_source::prepare(&source));
            compiled.insert(name, result.err().map(|e| e.to_string()));
        }
        ChatTemplates {
            env,
            single: set.single,
            compiled,
            source,
        }
    }

    /// The template's source when there is one template (not a named set), as transformers'
    /// `tokenizer.chat_template` is a string only then.
    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    /// transformers' `get_chat_template(None, tools)`: the single template, else "tool_use" when tools are
    /// given and it exists, else "default".
    fn select(&self, has_tools: bool) -> Result<&str, TokenizerError> {
        if !self.single && has_tools && self.compiled.contains_key("tool_use") {
            return Ok("tool_use");
        }
        if self.compiled.contains_key("default") {
            return Ok("default");
        }
        let names: Vec<&str> = self.compiled.keys().map(String::as_str).collect();
        Err(TokenizerError::Template(format!(
            "this model has multiple chat templates with no default specified (available: {names:?})"
        )))
    }

    /// Renders with transformers' variables: `vars` (special tokens and extra kwargs), then messages, tools,
    /// documents and add_generation_prompt.
    pub fn render(
        &self,
        messages: Value,
        tools: Option<Value>,
        add_generation_prompt: bool,
        vars: Vec<(String, Value)>,
    ) -> Result<String, TokenizerError> {
        let name = self.select(tools.is_some())?;
        if let Some(Some(err)) = self.compiled.get(name) {
            return Err(TokenizerError::Template(err.clone()));
        }
        let mut ctx: BTreeMap<String, Value> = vars.into_iter().collect();
        ctx.insert("messages".into(), messages);
        ctx.insert("tools".into(), tools.unwrap_or(Value::from(())));
        ctx.insert("documents".into(), Value::from(()));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        let template = self
            .env
            .get_template(name)
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        template
            .render(ctx)
            .map_err(|e| TokenizerError::Template(e.to_string()))
    }
}

/// transformers' message normalization: messages must be objects; keys whose value is null are dropped;
/// a reasoning field (reasoning_content, thinking or reasoning) is copied to "thinking" and
/// "reasoning_content".
pub(crate) fn normalize_messages(
    list: &[serde_json::Value],
) -> Result<Vec<serde_json::Value>, TokenizerError> {
    let mut out = Vec::with_capacity(list.len());
    for m in list {
        let Some(obj) = m.as_object() else {
            return Err(TokenizerError::Template(format!(
                "chat messages should be objects, got {m}"
            )));
        };
        let mut obj: serde_json::Map<String, serde_json::Value> = obj
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let reasoning = ["reasoning_content", "thinking", "reasoning"]
            .iter()
            .find_map(|k| obj.get(*k).cloned());
        if let Some(r) = reasoning {
            obj.entry("thinking").or_insert(r.clone());
            obj.insert("reasoning_content".into(), r);
        }
        out.push(serde_json::Value::Object(obj));
    }
    Ok(out)
}
