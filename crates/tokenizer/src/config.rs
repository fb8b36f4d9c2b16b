//! Reads tokenizer_config.json, special_tokens_map.json and the chat template files the way transformers 5's
//! `from_pretrained` and `TokenizersBackend.__init__` do.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use tokenizers::AddedToken;

use super::TokenizerError;

/// transformers' `SPECIAL_TOKENS_ATTRIBUTES`, in its order.
const NAMED: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// A JSON object that keeps its keys in file order (Python dicts do; serde_json's Map here sorts them).
struct Ordered(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ordered, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
                let mut out: Vec<(String, Value)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    // A repeated key keeps its first position and its last value, as in a Python dict.
                    match out.iter_mut().find(|(key, _)| *key == k) {
                        Some(slot) => slot.1 = v,
                        None => out.push((k, v)),
                    }
                }
                Ok(Ordered(out))
            }
        }
        d.deserialize_map(V)
    }
}

fn read_ordered(path: &Path) -> Result<Option<Vec<(String, Value)>>, TokenizerError> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let parsed: Ordered = serde_json::from_str(&text).map_err(|e| TokenizerError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(Some(parsed.0))
}

/// A special token as tokenizer_config.json writes it: a string, or an AddedToken object.
#[derive(Clone, Debug)]
enum TokenSpec {
    Plain(String),
    Added(AddedToken),
}

impl TokenSpec {
    fn content(&self) -> &str {
        match self {
            TokenSpec::Plain(s) => s,
            TokenSpec::Added(t) => &t.content,
        }
    }

    fn parse(v: &Value) -> Option<TokenSpec> {
        match v {
            Value::String(s) => Some(TokenSpec::Plain(s.clone())),
            Value::Object(_) => added_token(v).map(TokenSpec::Added),
            _ => None,
        }
    }
}

/// An AddedToken from its JSON object (`AddedToken(**obj)`: normalized defaults to `not special`).
fn added_token(v: &Value) -> Option<AddedToken> {
    let content = v.get("content")?.as_str()?;
    let flag = |k: &str| v.get(k).and_then(Value::as_bool);
    let special = flag("special").unwrap_or(false);
    Some(
        AddedToken::from(content, special)
            .single_word(flag("single_word").unwrap_or(false))
            .lstrip(flag("lstrip").unwrap_or(false))
            .rstrip(flag("rstrip").unwrap_or(false))
            .normalized(flag("normalized").unwrap_or(!special)),
    )
}

/// Chat templates by name; a single template is stored under "default" with `single` set.
#[derive(Clone, Debug)]
pub(crate) struct TemplateSet {
    pub single: bool,
    pub by_name: BTreeMap<String, String>,
}

/// What the tokenizer needs from tokenizer_config.json and friends.
pub(crate) struct TokenizerConfig {
    named: Vec<(String, TokenSpec)>,
    extra: Vec<TokenSpec>,
    added_decoder: Vec<(u64, AddedToken)>,
    split_special_tokens: bool,
    pub clean_up_tokenization_spaces: bool,
    pub clean_up_for_bpe: bool,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub unk_token: Option<String>,
    pub chat_templates: Option<TemplateSet>,
    pub chat_template_type: Option<String>,
}

impl TokenizerConfig {
    pub fn load(dir: &Path) -> Result<TokenizerConfig, TokenizerError> {
        let path = dir.join("tokenizer_config.json");
        let mut kv = read_ordered(&path)?.unwrap_or_default();
        let bad = |message: String| TokenizerError::Config {
            path: path.clone(),
            message,
        };

        let added_decoder = match kv.iter().find(|(k, _)| k == "added_tokens_decoder") {
            Some((_, Value::Object(m))) => {
                let mut out = Vec::new();
                for (id, tok) in m {
                    let id: u64 = id.parse().map_err(|_| {
                        bad(format!("added_tokens_decoder key {id:?} is not an id"))
                    })?;
                    let tok = added_token(tok).ok_or_else(|| {
                        bad(format!(
                            "added_tokens_decoder entry {id} has no string \"content\""
                        ))
                    })?;
                    out.push((id, tok));
                }
                out.sort_by_key(|(id, _)| *id);
                Some(out)
            }
            Some((_, Value::Null)) | None => None,
            Some(_) => return Err(bad("added_tokens_decoder is not an object".into())),
        };
        // Legacy special_tokens_map.json: read only without added_tokens_decoder, and it overrides the config.
        if added_decoder.is_none() {
            if let Some(stm) = read_ordered(&dir.join("special_tokens_map.json"))? {
                for (k, v) in stm {
                    match kv.iter_mut().find(|(key, _)| *key == k) {
                        Some(slot) => slot.1 = v,
                        None => kv.push((k, v)),
                    }
                }
            }
        }
        let get = |k: &str| kv.iter().find(|(key, _)| key == k).map(|(_, v)| v);
        let flag = |k: &str| get(k).and_then(Value::as_bool).unwrap_or(false);

        let mut named: Vec<(String, TokenSpec)> = Vec::new();
        for key in NAMED {
            match get(key) {
                None | Some(Value::Null) => {}
                Some(v) => {
                    let spec = TokenSpec::parse(v).ok_or_else(|| {
                        bad(format!(
                            "{key} is neither a string nor an AddedToken object"
                        ))
                    })?;
                    named.push((key.to_string(), spec));
                }
            }
        }
        // Other `*_token` keys with a token value, then a dict-valued extra_special_tokens, are named too.
        for (k, v) in &kv {
            if k.ends_with("_token") && !NAMED.contains(&k.as_str()) {
                if let Some(spec) =
                    TokenSpec::parse(v).filter(|_| v.is_string() || is_added_token_obj(v))
                {
                    named.push((k.clone(), spec));
                }
            }
        }
        let extra_value = get("extra_special_tokens")
            .filter(|v| !is_empty_list(v))
            .or_else(|| get("additional_special_tokens"));
        let mut extra = Vec::new();
        match extra_value {
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    if let Some(spec) = TokenSpec::parse(v) {
                        named.push((k.clone(), spec));
                    }
                }
            }
            Some(Value::Array(a)) => extra.extend(a.iter().filter_map(TokenSpec::parse)),
            _ => {}
        }
        let content = |key: &str| {
            named
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, s)| s.content().to_string())
        };
        let chat_templates = load_templates(dir, get("chat_template"), &bad)?;
        Ok(TokenizerConfig {
            bos_token: content("bos_token"),
            eos_token: content("eos_token"),
            unk_token: content("unk_token"),
            named,
            extra,
            added_decoder: added_decoder.unwrap_or_default(),
            split_special_tokens: flag("split_special_tokens"),
            clean_up_tokenization_spaces: flag("clean_up_tokenization_spaces"),
            clean_up_for_bpe: flag(
                "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output",
            ),
            chat_templates,
            chat_template_type: get("chat_template_type")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }

    /// transformers' `special_tokens_map`: the named tokens' contents.
    pub fn special_tokens_map(&self) -> Vec<(String, String)> {
        self.named
            .iter()
            .map(|(k, s)| (k.clone(), s.content().to_string()))
            .collect()
    }

    /// What `TokenizersBackend.__init__` does to the tokenizer.json pipeline: adds the config's
    /// added_tokens_decoder, then the named and extra special tokens that are not added tokens yet, and
    /// sets `encode_special_tokens` from `split_special_tokens`.
    pub fn apply_to(&self, tok: &mut tokenizers::Tokenizer) -> Result<(), String> {
        let mut to_add: Vec<AddedToken> =
            self.added_decoder.iter().map(|(_, t)| t.clone()).collect();
        let mut encoder: Vec<String> = tok
            .get_added_tokens_decoder()
            .into_values()
            .map(|t| t.content)
            .collect();
        encoder.extend(to_add.iter().map(|t| t.content.clone()));
        let named_contents: Vec<&str> = self.named.iter().map(|(_, s)| s.content()).collect();
        let mut from_specials: Vec<TokenSpec> = Vec::new();
        for (_, spec) in &self.named {
            let c = spec.content();
            if !encoder.iter().any(|e| e == c) && !from_specials.iter().any(|s| s.content() == c) {
                from_specials.push(spec.clone());
            }
        }
        for spec in &self.extra {
            let c = spec.content();
            if !encoder.iter().any(|e| e == c) && !from_specials.iter().any(|s| s.content() == c) {
                from_specials.push(spec.clone());
            }
        }
        for spec in from_specials {
            to_add.push(match spec {
                TokenSpec::Plain(s) => AddedToken::from(s, true),
                TokenSpec::Added(t) => {
                    let special = t.special || named_contents.contains(&t.content.as_str());
                    t.special(special)
                }
            });
        }
        to_add.retain(|t| !t.content.is_empty());
        if !to_add.is_empty() {
            tok.add_tokens(&to_add);
        }
        tok.set_encode_special_tokens(self.split_special_tokens);
        // transformers encodes without the padding and truncation a tokenizer.json may carry.
        tok.with_padding(None);
        tok.with_truncation(None).map_err(|e| e.to_string())?;
        Ok(())
    }
}

fn is_added_token_obj(v: &Value) -> bool {
    v.get("__type").and_then(Value::as_str) == Some("AddedToken")
}

fn is_empty_list(v: &Value) -> bool {
    v.is_null() || v.as_array().is_some_and(|a| a.is_empty())
}

/// The chat templates: chat_template.jinja and additional_chat_templates/*.jinja win over the config's
/// `chat_template` (a string, or a list of {name, template}).
fn load_templates(
    dir: &Path,
    from_config: Option<&Value>,
    bad: &dyn Fn(String) -> TokenizerError,
) -> Result<Option<TemplateSet>, TokenizerError> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).map_err(|source| TokenizerError::Io {
            path: p.to_path_buf(),
            source,
        })
    };
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        files.insert("default".into(), read(&jinja)?);
    }
    let extra_dir = dir.join("additional_chat_templates");
    if extra_dir.is_dir() {
        let entries = std::fs::read_dir(&extra_dir).map_err(|source| TokenizerError::Io {
            path: extra_dir.clone(),
            source,
        })?;
        for entry in entries {
            let p = entry
                .map_err(|source| TokenizerError::Io {
                    path: extra_dir.clone(),
                    source,
                })?
                .path();
            let name = p
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".jinja"));
            if let (Some(name), true) = (name, p.is_file()) {
                files.insert(name.to_string(), read(&p)?);
            }
        }
    }
    if !files.is_empty() {
        let single = files.len() == 1 && files.contains_key("default");
        return Ok(Some(TemplateSet {
            single,
            by_name: files,
        }));
    }
    match from_config {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(TemplateSet {
            single: true,
            by_name: BTreeMap::from([("default".to_string(), s.clone())]),
        })),
        Some(Value::Array(list)) => {
            let mut by_name = BTreeMap::new();
            for item in list {
                let name = item.get("name").and_then(Value::as_str);
                let template = item.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some(n), Some(t)) => {
                        by_name.insert(n.to_string(), t.to_string());
                    }
                    _ => {
                        return Err(bad(
                            "chat_template list entries need string \"name\" and \"template\""
                                .into(),
                        ))
                    }
                }
            }
            Ok(Some(TemplateSet {
                single: false,
                by_name,
            }))
        }
        Some(Value::Object(m)) => {
            let by_name = m
                .iter()
                .map(|(k, v)| v.as_str().map(|t| (k.clone(), t.to_string())))
                .collect::<Option<BTreeMap<_, _>>>()
                .ok_or_else(|| bad("chat_template object values must be strings".into()))?;
            Ok(Some(TemplateSet {
                single: false,
                by_name,
            }))
        }
        Some(_) => Err(bad("chat_template is neither a string nor a list".into())),
    }
}
