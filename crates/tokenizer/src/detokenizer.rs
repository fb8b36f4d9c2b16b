//! Streaming detokenizers that emit exactly the text of mlx-lm 0.32.2's `NaiveStreamingDetokenizer`,
//! `SPMStreamingDetokenizer` and `BPEStreamingDetokenizer`, chosen from tokenizer.json's `decoder` as
//! mlx-lm's `load` chooses them.

use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};

use super::hf_decode;

const REPLACEMENT: char = '\u{FFFD}';
/// "▁" (U+2581) in UTF-8, SentencePiece's space.
const SPM_SPACE: &[u8] = "\u{2581}".as_bytes();

/// Which of mlx-lm's streaming detokenizers is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DetokenizerKind {
    /// `NaiveStreamingDetokenizer`: re-decodes the current line with the tokenizer.
    Naive,
    /// `SPMStreamingDetokenizer`, with its `trim_space` flag.
    Spm { trim_space: bool },
    /// `BPEStreamingDetokenizer` (byte-level BPE).
    Bpe,
}

/// What every detokenizer of one tokenizer shares (mlx-lm builds it once in `TokenizerWrapper`).
pub(crate) enum Prototype {
    Naive {
        tok: Arc<tokenizers::Tokenizer>,
        clean_up: bool,
        clean_spaces: bool,
    },
    Spm {
        map: Arc<Vec<Vec<u8>>>,
        trim_space: bool,
    },
    Bpe {
        map: Arc<Vec<String>>,
    },
}

fn decoder_matches(decoder: Option<&Value>, strip: bool) -> bool {
    let mut steps = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if strip {
        steps.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    // mlx-lm's `_match` compares dicts key for key (same key sets) and lists item for item; serde_json's
    // equality does the same, except that it takes 1 and 1.0 as different numbers, as Python's type check does.
    decoder == Some(&json!({"type": "Sequence", "decoders": steps}))
}

impl Prototype {
    pub fn new(
        decoder: Option<&Value>,
        tok: &Arc<tokenizers::Tokenizer>,
        vocab_size: usize,
        clean_up: bool,
    ) -> Prototype {
        let tokens = || (0..vocab_size as u32).map(|i| tok.id_to_token(i).unwrap_or_default());
        if decoder_matches(decoder, true) || decoder_matches(decoder, false) {
            let map = tokens().map(|t| spm_bytes(&t)).collect();
            Prototype::Spm {
                map: Arc::new(map),
                trim_space: decoder_matches(decoder, true),
            }
        } else if decoder.and_then(|d| d.get("type")).and_then(Value::as_str) == Some("ByteLevel") {
            Prototype::Bpe {
                map: Arc::new(tokens().collect()),
            }
        } else {
            // `" ," not in tokenizer.decode(tokenizer.encode("a ,b", add_special_tokens=False))`
            let probe = tok
                .encode("a ,b", false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default();
            let text = hf_decode(tok, &probe, false, clean_up).unwrap_or_default();
            Prototype::Naive {
                tok: tok.clone(),
                clean_up,
                clean_spaces: !text.contains(" ,"),
            }
        }
    }

    pub fn kind(&self) -> DetokenizerKind {
        match self {
            Prototype::Naive { .. } => DetokenizerKind::Naive,
            Prototype::Spm { trim_space, .. } => DetokenizerKind::Spm {
                trim_space: *trim_space,
            },
            Prototype::Bpe { .. } => DetokenizerKind::Bpe,
        }
    }

    pub fn make(&self) -> StreamingDetokenizer {
        let state = match self {
            Prototype::Naive {
                tok,
                clean_up,
                clean_spaces,
            } => State::Naive {
                tok: tok.clone(),
                clean_up: *clean_up,
                clean_spaces: *clean_spaces,
                stable: 0,
                current: Vec::new(),
            },
            Prototype::Spm { map, trim_space } => State::Spm {
                map: map.clone(),
                trim_space: *trim_space,
                unflushed: Vec::new(),
            },
            Prototype::Bpe { map } => State::Bpe {
                map: map.clone(),
                unflushed: String::new(),
            },
        };
        StreamingDetokenizer {
            state,
            text: String::new(),
            tokens: Vec::new(),
            offset: 0,
            anchor: (0, 0),
        }
    }
}

/// SPMStreamingDetokenizer's token map: `<0xXX>` tokens are their byte, others their UTF-8.
fn spm_bytes(token: &str) -> Vec<u8> {
    if let Some(rest) = token.strip_prefix("<0x") {
        let hex: String = rest.chars().take(2).collect();
        if let Ok(b) = u8::from_str_radix(&hex, 16) {
            return vec![b];
        }
    }
    token.as_bytes().to_vec()
}

/// GPT-2's byte decoder: the printable character standing for each byte.
fn byte_decoder() -> &'static std::collections::HashMap<char, u8> {
    static MAP: OnceLock<std::collections::HashMap<char, u8>> = OnceLock::new();
    MAP.get_or_init(|| {
        let printable = |b: u32| {
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b)
        };
        let mut n = 0;
        (0u32..256)
            .map(|b| {
                let c = if printable(b) {
                    b
                } else {
                    n += 1;
                    255 + n
                };
                (char::from_u32(c).unwrap_or(REPLACEMENT), b as u8)
            })
            .collect()
    })
}

/// `BPEStreamingDetokenizer._decode_bytes`: note that byte 0 ('Ā') is falsy there and so is kept as UTF-8.
fn bpe_decode_lenient(s: &str) -> String {
    let dec = byte_decoder();
    let mut bytes = Vec::with_capacity(s.len());
    for c in s.chars() {
        match dec.get(&c) {
            Some(&b) if b != 0 => bytes.push(b),
            _ => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `BPEStreamingDetokenizer.finalize`'s decoding. Python raises KeyError on a character outside the byte
/// decoder; it is kept as UTF-8 here.
fn bpe_decode_strict(s: &str) -> String {
    let dec = byte_decoder();
    let mut bytes = Vec::with_capacity(s.len());
    for c in s.chars() {
        match dec.get(&c) {
            Some(&b) => bytes.push(b),
            None => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn replace_bytes(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

enum State {
    /// `text[..stable]` is mlx-lm's `_text`; the rest its `_current_text`.
    Naive {
        tok: Arc<tokenizers::Tokenizer>,
        clean_up: bool,
        clean_spaces: bool,
        stable: usize,
        current: Vec<u32>,
    },
    Spm {
        map: Arc<Vec<Vec<u8>>>,
        trim_space: bool,
        unflushed: Vec<u8>,
    },
    Bpe {
        map: Arc<Vec<String>>,
        unflushed: String,
    },
}

/// Streams text out token by token exactly as mlx-lm's streaming detokenizers do.
///
/// mlx-lm's naive detokenizer does its work when `.text` is read, which its `stream_generate` does (through
/// `last_segment`) after every token; this one does that work in `add_token`.
pub struct StreamingDetokenizer {
    state: State,
    text: String,
    tokens: Vec<u32>,
    /// mlx-lm's `offset`: a count of characters (Python string indices), not bytes.
    offset: usize,
    /// (byte, char) position of a prefix of `text` that will not change, at or before `offset`.
    anchor: (usize, usize),
}

impl StreamingDetokenizer {
    /// Drops all streaming state.
    pub fn reset(&mut self) {
        self.text.clear();
        self.tokens.clear();
        self.offset = 0;
        self.anchor = (0, 0);
        match &mut self.state {
            State::Naive {
                stable, current, ..
            } => {
                *stable = 0;
                current.clear();
            }
            State::Spm { unflushed, .. } => unflushed.clear(),
            State::Bpe { unflushed, .. } => unflushed.clear(),
        }
    }

    /// Consumes one token id.
    pub fn add_token(&mut self, id: u32) {
        self.tokens.push(id);
        let text = &mut self.text;
        match &mut self.state {
            State::Naive {
                tok,
                clean_up,
                clean_spaces,
                stable,
                current,
            } => {
                current.push(id);
                let mut cur = hf_decode(tok, current, false, *clean_up).unwrap_or_default();
                if cur.ends_with(REPLACEMENT) {
                    cur.truncate(cur.trim_end_matches(REPLACEMENT).len());
                } else if *clean_spaces && cur.ends_with(' ') {
                    cur.pop();
                }
                text.truncate(*stable);
                text.push_str(&cur);
                if cur.ends_with('\n') {
                    *stable = text.len();
                    current.clear();
                }
            }
            State::Spm {
                map,
                trim_space,
                unflushed,
            } => {
                if let Some(bytes) = map.get(id as usize) {
                    unflushed.extend_from_slice(bytes);
                }
                spm_flush(text, unflushed, *trim_space, false);
            }
            State::Bpe { map, unflushed } => {
                let v = map.get(id as usize).map_or("!", String::as_str);
                unflushed.push_str(v);
                let decoded = bpe_decode_lenient(unflushed);
                let lone_space = v.chars().count() == 1 && v.starts_with('\u{120}');
                if !decoded.ends_with(REPLACEMENT) && !lone_space {
                    bpe_push_trimmed(text, &decoded);
                    unflushed.clear();
                }
            }
        }
    }

    /// Flushes any text held back waiting for more tokens.
    pub fn finalize(&mut self) {
        let text = &mut self.text;
        match &mut self.state {
            State::Naive {
                tok,
                clean_up,
                stable,
                current,
                ..
            } => {
                let rest = hf_decode(tok, current, false, *clean_up).unwrap_or_default();
                text.truncate(*stable);
                text.push_str(&rest);
                *stable = text.len();
                current.clear();
            }
            State::Spm {
                trim_space,
                unflushed,
                ..
            } => {
                spm_flush(text, unflushed, *trim_space, true);
                unflushed.clear();
            }
            State::Bpe { unflushed, .. } => {
                let decoded = bpe_decode_strict(unflushed);
                bpe_push_trimmed(text, &decoded);
                unflushed.clear();
            }
        }
    }

    /// All text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// All tokens added since the last reset.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The text added since the previous call (mlx-lm's `last_segment`: `text[offset:]` in characters).
    pub fn last_segment(&mut self) -> String {
        let (anchor_byte, anchor_char) = self.anchor;
        let rest = self.text.get(anchor_byte..).unwrap_or_default();
        let skip = self.offset.saturating_sub(anchor_char);
        let mut start = None;
        let mut count = 0;
        for (i, _) in rest.char_indices() {
            if count == skip {
                start = Some(i);
            }
            count += 1;
        }
        let segment = start.map_or_else(String::new, |s| rest[s..].to_string());
        self.offset = anchor_char + count;
        let stable = match &self.state {
            State::Naive { stable, .. } => *stable,
            _ => self.text.len(),
        };
        let stable_chars = self
            .text
            .get(anchor_byte..stable)
            .map_or(0, |s| s.chars().count());
        self.anchor = (stable, anchor_char + stable_chars);
        segment
    }
}

/// `SPMStreamingDetokenizer._try_flush`.
fn spm_flush(text: &mut String, unflushed: &mut Vec<u8>, trim_space: bool, force: bool) {
    let replaced = replace_bytes(unflushed, SPM_SPACE, b" ");
    let decoded = String::from_utf8_lossy(&replaced);
    if !force && decoded.ends_with(REPLACEMENT) {
        return;
    }
    let mut piece: &str = &decoded;
    if text.is_empty() && trim_space && piece.starts_with(' ') {
        piece = &piece[1..];
    }
    text.push_str(piece);
    unflushed.clear();
}

/// `BPEStreamingDetokenizer._maybe_trim_space`, then append.
fn bpe_push_trimmed(text: &mut String, current: &str) {
    if text.is_empty() && current.starts_with(' ') {
        text.push_str(&current[1..]);
    } else {
        text.push_str(current);
    }
}
