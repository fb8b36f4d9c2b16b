//! Hugging Face tokenizers as Python mlx-lm 0.32.2 (on transformers 5) loads them: encode/decode, chat
//! templates and the streaming detokenizers.
//!
//! `Tokenizer::from_dir` reads `tokenizer.json`, then applies what transformers' `TokenizersBackend` adds
//! on top of it from `tokenizer_config.json` (special tokens not yet in the vocab, `added_tokens_decoder`,
//! `split_special_tokens`, `clean_up_tokenization_spaces`), and picks the streaming detokenizer the way
//! mlx-lm's `tokenizer_utils.load` does, from the `decoder` of `tokenizer.json`.

mod chat_template;
mod config;
mod detokenizer;
mod pyfmt;
mod reasoning;
mod template_source;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use chat_template::ChatTemplates;
use config::TokenizerConfig;
pub use detokenizer::{DetokenizerKind, StreamingDetokenizer};
pub use reasoning::{prompt_opens_reasoning, split_reasoning};

/// Everything that can go wrong while loading or using a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer directory {0} does not exist or is not a directory")]
    DirNotFound(PathBuf),
    #[error("tokenizer file {0} is missing")]
    MissingTokenizerJson(PathBuf),
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{path} is not a tokenizer the tokenizers library can load: {message}")]
    Load { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("cannot encode text: {0}")]
    Encode(String),
    #[error("cannot decode token ids: {0}")]
    Decode(String),
    #[error("this tokenizer has no chat template (tokenizer_config.json has no chat_template and there is no chat_template.jinja)")]
    NoChatTemplate,
    #[error("cannot apply a chat template to an empty conversation")]
    EmptyConversation,
    #[error("chat template error: {0}")]
    Template(String),
    #[error("chat_template_type {0:?} names a Python chat template of mlx-lm, which mlx-gen does not implement")]
    UnsupportedChatTemplateType(String),
    #[error("{0:?} is not a token for this tokenizer")]
    UnknownToken(String),
}

/// One chat message with a role ("system", "user", "assistant", ...) and its text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A loaded tokenizer: the `tokenizers` pipeline, its special tokens, chat template and detokenizer kind.
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    vocab_size: usize,
    /// transformers' `special_tokens_map`: named special tokens in attribute order (template variables).
    special_tokens: Vec<(String, String)>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    eos_ids: Vec<u32>,
    unk_id: Option<u32>,
    clean_up_spaces: bool,
    templates: Option<ChatTemplates>,
    chat_template_type: Option<String>,
    has_thinking: bool,
    detok: detokenizer::Prototype,
}

/// Reads a file as text and as JSON.
/// The one part of tokenizer.json read apart from the tokenizers library: its `decoder`. Only that
/// field is built as a value (the vocabulary and merges are skipped), since parsing the whole file
/// into a `Value` costs as much as a fifth of the library's own load.
#[derive(serde::Deserialize)]
struct TokenizerJson {
    #[serde(default)]
    decoder: Option<serde_json::Value>,
}

fn read_json(path: &Path) -> Result<(String, TokenizerJson), TokenizerError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let value = serde_json::from_str(&text).map_err(|e| TokenizerError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok((text, value))
}

impl Tokenizer {
    /// Loads tokenizer.json (required), tokenizer_config.json (optional: chat_template string or list form,
    /// bos/eos/pad/unk tokens as strings or AddedToken objects), chat_template.jinja (optional; takes
    /// precedence as in transformers), special_tokens_map.json (legacy, as transformers reads it).
    /// generation_config.json is NOT read here.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        if !dir.is_dir() {
            return Err(TokenizerError::DirNotFound(dir.to_path_buf()));
        }
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            return Err(TokenizerError::MissingTokenizerJson(tok_path));
        }
        let (text, tok_json) = read_json(&tok_path)?;
        let mut inner: tokenizers::Tokenizer =
            text.parse()
                .map_err(|e: tokenizers::Error| TokenizerError::Load {
                    path: tok_path.clone(),
                    message: e.to_string(),
                })?;
        drop(text);

        let cfg = TokenizerConfig::load(dir)?;
        cfg.apply_to(&mut inner)
            .map_err(|message| TokenizerError::Load {
                path: tok_path.clone(),
                message,
            })?;

        let vocab_size = vocab_with_added(&inner);
        let eos_ids = cfg
            .eos_token
            .as_deref()
            .and_then(|t| token_id_or_unk(&inner, t, &cfg))
            .into_iter()
            .collect();
        let unk_id = cfg.unk_token.as_deref().and_then(|t| inner.token_to_id(t));
        let is_bpe = matches!(inner.get_model(), tokenizers::ModelWrapper::BPE(_));
        let clean_up_spaces = cfg.clean_up_tokenization_spaces && (!is_bpe || cfg.clean_up_for_bpe);
        let has_thinking = infer_thinking(&inner);
        let templates = cfg
            .chat_templates
            .as_ref()
            .map(|t| ChatTemplates::new(t.clone()));
        let inner = Arc::new(inner);
        let detok = detokenizer::Prototype::new(
            tok_json.decoder.as_ref(),
            &inner,
            vocab_size,
            clean_up_spaces,
        );
        Ok(Tokenizer {
            inner,
            vocab_size,
            special_tokens: cfg.special_tokens_map(),
            bos_token: cfg.bos_token.clone(),
            eos_token: cfg.eos_token.clone(),
            eos_ids,
            unk_id,
            clean_up_spaces,
            templates,
            chat_template_type: cfg.chat_template_type.clone(),
            has_thinking,
            detok,
        })
    }

    /// Encodes text as transformers' `tokenizer.encode(text, add_special_tokens=...)` does (no padding or
    /// truncation).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// Decodes ids as transformers' `tokenizer.decode(ids, skip_special_tokens=...)` does, including its
    /// `clean_up_tokenization_spaces` step (which transformers 5 ignores for BPE models). Unknown ids are
    /// dropped, as the tokenizers library does.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        hf_decode(&self.inner, ids, skip_special_tokens, self.clean_up_spaces)
            .map_err(TokenizerError::Decode)
    }

    /// `len(tokenizer)` as transformers counts it (the vocab including added tokens).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The id of a token (added tokens included), or None when the vocab lacks it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token string of an id (as `convert_ids_to_tokens`), or None when out of range.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The ids mlx-lm's `TokenizerWrapper` starts `eos_token_ids` with: the tokenizer's eos_token, plus any
    /// added with [`Tokenizer::add_eos_token`]. mlx-lm also adds config.json's `eos_token_id`, which the
    /// caller merges in.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_ids.clone()
    }

    /// As mlx-lm's `TokenizerWrapper.add_eos_token`: an integer string is taken as an id, anything else is
    /// looked up as a token (transformers falls back to the unk token's id for unknown tokens).
    pub fn add_eos_token(&mut self, token: &str) -> Result<(), TokenizerError> {
        let id = match token.trim().parse::<i64>() {
            Ok(i) => {
                u32::try_from(i).map_err(|_| TokenizerError::UnknownToken(token.to_string()))?
            }
            Err(_) => self
                .inner
                .token_to_id(token)
                .or(self.unk_id)
                .ok_or_else(|| TokenizerError::UnknownToken(token.to_string()))?,
        };
        if !self.eos_ids.contains(&id) {
            self.eos_ids.push(id);
        }
        Ok(())
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// transformers' `special_tokens_map`: (name, token) pairs such as ("eos_token", "<|im_end|>").
    pub fn special_tokens_map(&self) -> &[(String, String)] {
        &self.special_tokens
    }

    /// mlx-lm's `TokenizerWrapper.has_chat_template`.
    pub fn has_chat_template(&self) -> bool {
        self.templates.is_some() || self.chat_template_type.is_some()
    }

    /// The chat template's source when the tokenizer has a single one (mlx-lm picks the tool-call
    /// parser from it).
    pub fn chat_template_source(&self) -> Option<&str> {
        self.templates.as_ref().and_then(|t| t.source())
    }

    /// `chat_template_type` of tokenizer_config.json: mlx-lm then renders with a Python module of its own.
    pub fn chat_template_type(&self) -> Option<&str> {
        self.chat_template_type.as_deref()
    }

    /// mlx-lm's `has_thinking`: the vocab has a thinking start/end pair; passed to templates as
    /// `enable_thinking`.
    pub fn has_thinking(&self) -> bool {
        self.has_thinking
    }

    /// Which of mlx-lm's streaming detokenizers this tokenizer uses.
    pub fn detokenizer_kind(&self) -> DetokenizerKind {
        self.detok.kind()
    }

    /// Renders the template as mlx-lm's `apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=...)` does: transformers' Jinja environment (trim_blocks, lstrip_blocks,
    /// `raise_exception`, `strftime_now`, its `tojson`), variables messages, tools=None, documents=None,
    /// add_generation_prompt, the special tokens, and mlx-lm's `enable_thinking` = `has_thinking()`.
    /// Encode the result with `add_special_tokens = false`, as mlx-lm's `generate` does.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let messages = minijinja::Value::from_serialize(messages);
        self.render_template(messages, add_generation_prompt, None, &[])
    }

    /// Like [`Tokenizer::apply_chat_template`] with messages of any JSON shape (tool calls, content
    /// lists), optional tools (the "tool_use" template is chosen when the template list has one), and
    /// extra template variables (mlx-lm's `--chat-template-config`), which override the special tokens
    /// and `enable_thinking`. Message keys whose value is null are dropped, and reasoning fields aliased,
    /// as transformers does.
    pub fn apply_chat_template_json(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
        extra: &[(String, serde_json::Value)],
    ) -> Result<String, TokenizerError> {
        let Some(list) = messages.as_array() else {
            return Err(TokenizerError::Template(
                "messages must be a JSON array".into(),
            ));
        };
        let normalized = chat_template::normalize_messages(list)?;
        let extra: Vec<(String, minijinja::Value)> = extra
            .iter()
            .map(|(k, v)| (k.clone(), minijinja::Value::from_serialize(v)))
            .collect();
        let tools = tools.map(minijinja::Value::from_serialize);
        self.render_template(
            minijinja::Value::from_serialize(&normalized),
            add_generation_prompt,
            tools,
            &extra,
        )
    }

    fn render_template(
        &self,
        messages: minijinja::Value,
        add_generation_prompt: bool,
        tools: Option<minijinja::Value>,
        extra: &[(String, minijinja::Value)],
    ) -> Result<String, TokenizerError> {
        if let Some(t) = &self.chat_template_type {
            return Err(TokenizerError::UnsupportedChatTemplateType(t.clone()));
        }
        let templates = self
            .templates
            .as_ref()
            .ok_or(TokenizerError::NoChatTemplate)?;
        if messages.len() == Some(0) {
            return Err(TokenizerError::EmptyConversation);
        }
        let mut vars: Vec<(String, minijinja::Value)> = self
            .special_tokens
            .iter()
            .map(|(k, v)| (k.clone(), minijinja::Value::from(v.as_str())))
            .collect();
        vars.push((
            "enable_thinking".into(),
            minijinja::Value::from(self.has_thinking),
        ));
        vars.extend(extra.iter().cloned());
        templates.render(messages, tools, add_generation_prompt, vars)
    }

    /// A fresh streaming detokenizer of the kind mlx-lm would use for this tokenizer.
    pub fn detokenizer(&self) -> StreamingDetokenizer {
        self.detok.make()
    }
}

/// transformers' `convert_tokens_to_ids`: the token's id, else the unk token's id.
fn token_id_or_unk(tok: &tokenizers::Tokenizer, token: &str, cfg: &TokenizerConfig) -> Option<u32> {
    tok.token_to_id(token)
        .or_else(|| cfg.unk_token.as_deref().and_then(|u| tok.token_to_id(u)))
}

/// transformers' `TokenizersBackend._decode`: the backend's decode, then `clean_up_tokenization` if asked.
pub(crate) fn hf_decode(
    tok: &tokenizers::Tokenizer,
    ids: &[u32],
    skip_special_tokens: bool,
    clean_up_spaces: bool,
) -> Result<String, String> {
    let text = tok
        .decode(ids, skip_special_tokens)
        .map_err(|e| e.to_string())?;
    Ok(if clean_up_spaces {
        clean_up_tokenization(&text)
    } else {
        text
    })
}

/// transformers' `clean_up_tokenization`.
fn clean_up_tokenization(text: &str) -> String {
    const PAIRS: [(&str, &str); 10] = [
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ];
    PAIRS
        .iter()
        .fold(text.to_string(), |acc, (from, to)| acc.replace(from, to))
}

/// mlx-lm's `_infer_thinking`: whether the vocab holds a thinking start/end marker pair.
/// `get_vocab_size(true)` (the model's vocabulary and the added tokens, each content once) without
/// building the whole vocabulary as a map of strings (tens of milliseconds on a 150k vocabulary).
fn vocab_with_added(tok: &tokenizers::Tokenizer) -> usize {
    use tokenizers::Model;
    let added: std::collections::BTreeSet<String> = tok.get_added_tokens_decoder().into_values().map(|t| t.content).collect();
    let model = tok.get_model();
    model.get_vocab_size() + added.iter().filter(|c| model.token_to_id(c).is_none()).count()
}

fn infer_thinking(tok: &tokenizers::Tokenizer) -> bool {
    let has = |t: &str| tok.token_to_id(t).is_some();
    let pairs = [
        ("<think>", "</think>"),
        ("<longcat_think>", "</longcat_think>"),
        ("<|think:start|>", "<|think:end|>"),
        ("<|channel>", "<channel|>"),
    ];
    pairs.iter().any(|(a, b)| has(a) && has(b))
        || ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]
            .iter()
            .all(|t| has(t))
}
