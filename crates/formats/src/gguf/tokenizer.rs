//! `tokenizer.json` and `tokenizer_config.json` from a GGUF's `tokenizer.*` metadata, built as
//! transformers' GGUF conversion builds them (byte-level BPE, `tokenizer.ggml.model = gpt2`).
use super::reader::{GgufFile, Value};
use super::GgufError;
use serde_json::{json, Map, Value as Json};
use std::collections::{HashMap, HashSet};

/// llama.cpp's `tokenizer.ggml.token_type` values that matter here.
const CONTROL: u64 = 3;
const USER_DEFINED: u64 = 4;

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.pre` -> the split regex transformers puts before the byte-level step
/// (`None`: GPT-2's own byte-level regex, as transformers leaves it for these kinds).
fn pre_split(kind: &str) -> Result<Option<&'static str>, GgufError> {
    Ok(match kind {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" | "dbrx"
        | "smaug-bpe" | "jina-v5-nano" => Some(LLAMA3_SPLIT),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => Some(QWEN2_SPLIT),
        "default" | "gpt2" | "gpt-2" | "smollm" => None,
        other => {
            return Err(GgufError::Unsupported(format!(
                "tokenizer.ggml.pre {other:?} is not a known pre-tokenizer (supported: smollm, gpt2, default, \
                 qwen2, deepseek-r1-qwen, llama-bpe, llama3, dbrx, smaug-bpe, falcon3, pixtral, lfm2)"
            )))
        }
    })
}

/// GPT-2's byte -> printable character table (`bytes_to_unicode`).
fn byte_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        table[b as usize] = if printable {
            char::from_u32(b).unwrap_or('\0')
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\0')
        };
    }
    table
}

fn strings<'a>(g: &'a GgufFile, key: &str) -> Result<Option<Vec<&'a str>>, GgufError> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => {
            let items = v.as_array().ok_or_else(|| GgufError::Corrupt(format!("{key} is not an array")))?;
            items
                .iter()
                .map(|x| x.as_str().ok_or_else(|| GgufError::Corrupt(format!("{key} holds a non-string"))))
                .collect::<Result<Vec<_>, _>>()
                .map(Some)
        }
    }
}

/// What the import writes for the tokenizer, and the ids config.json names.
pub struct TokenizerFiles {
    pub tokenizer_json: Json,
    pub tokenizer_config: Json,
    pub bos_id: Option<u64>,
    pub eos_id: Option<u64>,
}

/// Builds both tokenizer files from the metadata.
pub fn build(g: &GgufFile) -> Result<TokenizerFiles, GgufError> {
    let model = g.get("tokenizer.ggml.model").and_then(Value::as_str).unwrap_or("(none)");
    if model != "gpt2" {
        return Err(GgufError::Unsupported(format!(
            "tokenizer.ggml.model {model:?}: only byte-level BPE (\"gpt2\") tokenizers can be imported"
        )));
    }
    let tokens = strings(g, "tokenizer.ggml.tokens")?
        .ok_or_else(|| GgufError::Corrupt("no tokenizer.ggml.tokens in the metadata".into()))?;
    let merges = strings(g, "tokenizer.ggml.merges")?.unwrap_or_default();
    let types: Vec<u64> = match g.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
        Some(a) => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
        None => Vec::new(),
    };
    let pre = g.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default");
    let split = pre_split(pre)?;

    // The vocabulary in the byte alphabet; a token spelled otherwise is respelled byte by byte.
    let table = byte_chars();
    let alphabet: HashSet<char> = table.iter().copied().collect();
    let in_alphabet = |t: &str| t.chars().all(|c| alphabet.contains(&c));
    let mut vocab: HashMap<String, u64> = HashMap::with_capacity(tokens.len());
    for (id, t) in tokens.iter().enumerate() {
        let key = if in_alphabet(t) { (*t).to_owned() } else { t.bytes().map(|b| table[b as usize]).collect() };
        vocab.insert(key, id as u64); // a repeated spelling keeps its last id, as a Python dict does
    }
    let pairs: Vec<Json> = merges
        .iter()
        .map(|m| {
            let mut it = m.splitn(2, ' ');
            json!([it.next().unwrap_or(""), it.next().unwrap_or("")])
        })
        .collect();

    let id_key = |k: &str| g.get(&format!("tokenizer.ggml.{k}")).and_then(Value::as_u64);
    let token_of = |id: Option<u64>| id.and_then(|i| tokens.get(i as usize)).map(|s| (*s).to_owned());
    let (bos_id, eos_id) = (id_key("bos_token_id"), id_key("eos_token_id"));
    let (unk_id, pad_id) = (id_key("unknown_token_id"), id_key("padding_token_id"));

    // Control tokens are special; user-defined ones are added but not special.
    let mut added: Vec<(u64, &str, bool)> = Vec::new();
    for (id, (t, ty)) in tokens.iter().zip(types.iter()).enumerate() {
        if *ty == CONTROL && in_alphabet(t) {
            added.push((id as u64, t, true));
        }
    }
    // The named special tokens are special too, whatever their type.
    for id in [bos_id, eos_id, unk_id, pad_id].into_iter().flatten() {
        if let Some(t) = tokens.get(id as usize) {
            if !added.iter().any(|(_, a, _)| a == t) && vocab.get(*t) == Some(&id) {
                added.push((id, t, true));
            }
        }
    }
    for (id, (t, ty)) in tokens.iter().zip(types.iter()).enumerate() {
        if *ty == USER_DEFINED && vocab.contains_key(*t) && !added.iter().any(|(_, a, _)| a == t) {
            added.push((id as u64, t, false));
        }
    }
    added.sort_by_key(|a| a.0);
    let added_tokens: Vec<Json> = added
        .iter()
        .map(|(_, t, special)| {
            let id = vocab.get(*t).copied().unwrap_or(0);
            json!({"id": id, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": special})
        })
        .collect();

    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let pre_tokenizer = match split {
        None => byte_level(true),
        Some(re) => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false},
            byte_level(false)]}),
    };
    // llama.cpp's flag (default false for BPE vocabularies); with it the BOS leads every encoding.
    let add_bos = g.get("tokenizer.ggml.add_bos_token").and_then(Value::as_bool).unwrap_or(false);
    let bos_token = token_of(bos_id);
    let a = json!({"Sequence": {"id": "A", "type_id": 0}});
    let b = json!({"Sequence": {"id": "B", "type_id": 1}});
    let post_processor = match (&bos_token, add_bos) {
        (Some(bos), true) => {
            let bid = bos_id.unwrap_or(0);
            json!({"type": "TemplateProcessing",
                   "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, a],
                   "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, a, {"SpecialToken": {"id": bos, "type_id": 1}}, b],
                   "special_tokens": {bos.as_str(): {"id": bos, "ids": [bid], "tokens": [bos]}}})
        }
        _ => json!({"type": "TemplateProcessing", "single": [a], "pair": [a, b], "special_tokens": {}}),
    };
    let tokenizer_json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": pairs},
    });

    let mut cfg = Map::new();
    cfg.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
    cfg.insert("add_bos_token".into(), json!(add_bos));
    if let Some(v) = g.get("tokenizer.ggml.add_eos_token").and_then(Value::as_bool) {
        cfg.insert("add_eos_token".into(), json!(v));
    }
    for (name, id) in [("bos_token", bos_id), ("eos_token", eos_id), ("unk_token", unk_id), ("pad_token", pad_id)] {
        if let Some(t) = token_of(id) {
            cfg.insert(name.into(), json!(t));
        }
    }
    if let Some(t) = g.get("tokenizer.chat_template").and_then(Value::as_str) {
        cfg.insert("chat_template".into(), json!(t));
    }
    cfg.insert("clean_up_tokenization_spaces".into(), json!(false));
    Ok(TokenizerFiles { tokenizer_json, tokenizer_config: Json::Object(cfg), bos_id, eos_id })
}
