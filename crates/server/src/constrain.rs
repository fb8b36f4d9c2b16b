//! Constrained decoding with llguidance (the engine llama.cpp, vLLM and mistral.rs use): JSON
//! schemas, `json_object`, Lark grammars and regexes compiled against the model's tokenizer into a
//! [`engine::sample::TokenConstraint`] the engine masks every sampled token with.
//!
//! The token trie comes from the model's `tokenizer.json` (llguidance's own byte mapping for
//! byte-level BPE and SentencePiece byte-fallback vocabularies), padded to the model's vocabulary.
//! A grammar that dead-ends allows only the end-of-sequence tokens, so the choice ends with
//! finish reason `stop` and a note, never a hang.
use engine::sample::TokenConstraint;
use engine::{EngineError, LoadedModel};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, InferenceCapabilities, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::Arc;

/// What the output must follow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Grammar {
    /// A JSON schema (`response_format` `json_schema`, `json_object` as `{"type": "object"}`,
    /// `generate --json-schema`).
    JsonSchema(Value),
    /// A Lark grammar (llguidance's dialect: `%json {...}` embeds a schema).
    Lark(String),
    /// A regular expression the whole output matches.
    Regex(String),
}

impl Grammar {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonSchema(schema) => TopLevelGrammar::from_json_schema(compact_json(schema)),
            Grammar::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
        }
    }
}

/// `schema` with llguidance's options for compact JSON (`{"a": 1, "b": [2, 3]}`: no free
/// whitespace, which a model could otherwise repeat until `max_tokens`), where the schema's own
/// `x-guidance` options do not say otherwise.
pub fn compact_json(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Value::Object(o) = &mut schema {
        let options = o.entry("x-guidance").or_insert_with(|| json!({}));
        if let Value::Object(options) = options {
            for (k, v) in [("whitespace_flexible", json!(false)), ("item_separator", json!(", ")), ("key_separator", json!(": "))] {
                options.entry(k).or_insert(v);
            }
        }
    }
    schema
}

/// The model's grammar compiler: the token trie and llguidance's parser factory, built once.
#[derive(Clone)]
pub struct Constraints {
    factory: Arc<ParserFactory>,
    vocab: usize,
    eos: Vec<u32>,
}

impl Constraints {
    /// Builds the token trie of `loaded`'s `tokenizer.json`, with its end-of-sequence tokens.
    pub fn new(loaded: &LoadedModel) -> Result<Constraints, String> {
        Self::building(loaded)()
    }

    /// [`Constraints::new`] as a function to run later, on any thread (the trie of a 151k
    /// vocabulary takes a few hundred milliseconds: the server builds it beside its warm-up).
    pub fn building(loaded: &LoadedModel) -> impl FnOnce() -> Result<Constraints, String> + Send + 'static {
        let (path, vocab, eos) = (loaded.path.join("tokenizer.json"), loaded.model.vocab_size() as usize, loaded.eos_token_ids.clone());
        move || {
            let text = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let json: Value = serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            Self::from_tokenizer_json(&json, vocab, &eos)
        }
    }

    /// From a parsed `tokenizer.json`, for a model with `vocab` logits and these EOS ids.
    pub fn from_tokenizer_json(json: &Value, vocab: usize, eos: &[u32]) -> Result<Constraints, String> {
        // llguidance asserts on some odd vocabularies: a panic there is an error here.
        let words = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| llguidance::token_bytes_from_tokenizer_json(json)));
        let mut words = match words {
            Ok(Ok(w)) => w,
            Ok(Err(e)) => return Err(format!("cannot read the vocabulary for constrained decoding: {e}")),
            Err(_) => return Err("cannot read the vocabulary for constrained decoding: unexpected token names".into()),
        };
        let vocab = vocab.max(words.len());
        words.resize(vocab, Vec::new());
        let Some(&first) = eos.first() else { return Err("the model has no end-of-sequence token, which constrained decoding needs".into()) };
        if let Some(bad) = eos.iter().find(|&&e| e as usize >= vocab) {
            return Err(format!("end-of-sequence token {bad} is outside the vocabulary ({vocab})"));
        }
        let trie = TokTrie::from(&TokRxInfo::new(vocab as u32, first), &words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new(&env, InferenceCapabilities::default(), &[]).map_err(|e| format!("cannot set up constrained decoding: {e}"))?;
        factory.quiet();
        Ok(Constraints { factory: Arc::new(factory), vocab, eos: eos.to_vec() })
    }

    /// Compiles `grammar` (an error says why it cannot be followed) into a fresh constraint.
    pub fn compile(&self, grammar: &Grammar) -> Result<GuidanceConstraint, String> {
        let parser = self.factory.create_parser(grammar.top_level()).map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(GuidanceConstraint { matcher, note: None, vocab: self.vocab, eos: self.eos.clone(), consumed: 0, note_at: 0 })
    }
}

/// A fresh engine constraint for one sequence, from the engine's grammar compiler (or the error
/// that kept it from being built); the same on every rank.
pub fn compile(constraints: Result<&Constraints, &String>, grammar: &Grammar) -> engine::Result<Box<dyn TokenConstraint>> {
    let c = constraints.map_err(|e| EngineError::Invalid(e.clone()))?;
    let g = c.compile(grammar).map_err(EngineError::Invalid)?;
    Ok(Box::new(g))
}

/// One sequence's llguidance matcher.
pub struct GuidanceConstraint {
    matcher: Matcher,
    note: Option<String>,
    vocab: usize,
    eos: Vec<u32>,
    /// Tokens the matcher consumed, and how many it had when `note` was set (a rollback past
    /// that point clears the note).
    consumed: usize,
    note_at: usize,
}

impl GuidanceConstraint {
    /// Whether the grammar is complete (the output so far is a whole match).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    fn set_note(&mut self, note: String) {
        self.note = Some(note);
        self.note_at = self.consumed;
    }

    fn eos_only(&self, vocab: usize) -> Vec<bool> {
        let mut allowed = vec![false; vocab];
        for &e in &self.eos {
            if let Some(a) = allowed.get_mut(e as usize) {
                *a = true;
            }
        }
        allowed
    }
}

impl GuidanceConstraint {
    /// The matcher's next token set, or `None` (and a note) once only the end may come: the grammar
    /// ended early, dead-ended here or failed.
    fn mask(&mut self) -> Option<llguidance::toktrie::SimpleVob> {
        if self.note.is_some() {
            return None;
        }
        match self.matcher.compute_mask_or_eos() {
            Ok(mask) if !mask.is_zero() => Some(mask),
            Ok(_) => {
                self.set_note("the grammar allows no token here (it dead-ended)".into());
                None
            }
            Err(e) => {
                self.set_note(format!("the grammar failed: {e}"));
                None
            }
        }
    }
}

impl TokenConstraint for GuidanceConstraint {
    fn allowed(&mut self, vocab: usize) -> engine::Result<Vec<bool>> {
        let Some(mask) = self.mask() else { return Ok(self.eos_only(vocab)) };
        let mut allowed = vec![false; vocab];
        for (t, a) in allowed.iter_mut().enumerate().take(self.vocab) {
            *a = mask.is_allowed(t as u32);
        }
        Ok(allowed)
    }

    /// llguidance's own words (same layout as `pack_bits`), ids past the tokenizer's vocabulary
    /// cleared.
    fn allowed_bits(&mut self, vocab: usize) -> engine::Result<Vec<u32>> {
        let Some(mask) = self.mask() else { return Ok(engine::sample::constraint::pack_bits(&self.eos_only(vocab))) };
        let mut words = vec![0u32; engine::sample::constraint::mask_words(vocab)];
        let known = self.vocab.min(vocab);
        for (w, &m) in words.iter_mut().zip(mask.as_slice()).take(engine::sample::constraint::mask_words(known)) {
            *w = m;
        }
        if !known.is_multiple_of(32) {
            words[known / 32] &= (1u32 << (known % 32)) - 1;
        }
        Ok(words)
    }

    fn commit(&mut self, token: u32) -> engine::Result<()> {
        if self.note.is_some() || self.matcher.is_stopped() {
            return Ok(());
        }
        if token as usize >= self.vocab {
            return Err(EngineError::Invalid(format!("token {token} is outside the constrained vocabulary")));
        }
        match self.matcher.consume_token(token) {
            Ok(()) => self.consumed += 1,
            Err(e) => self.set_note(format!("the grammar rejected token {token}: {e}")),
        }
        Ok(())
    }

    fn rollback(&mut self, n: usize) -> engine::Result<()> {
        let n = n.min(self.consumed);
        if n > 0 {
            self.matcher.rollback(n).map_err(|e| EngineError::Invalid(format!("the grammar cannot go back {n} tokens: {e}")))?;
            self.consumed -= n;
        }
        if self.note.is_some() && self.note_at > self.consumed {
            self.note = None;
        }
        Ok(())
    }

    fn note(&self) -> Option<String> {
        self.note.clone()
    }
}

/// A byte-level vocabulary for tests: the 256 bytes (GPT-2's character mapping), `{"`, `"}`
/// (ids 256, 257), an EOS (258) and an unused id 259 (a model vocabulary of 260).
#[cfg(test)]
pub(crate) fn test_constraints() -> Constraints {
        let mut vocab = serde_json::Map::new();
        let mut k = 0x100u32;
        for b in 0u32..256 {
            let c = char::from_u32(b).unwrap_or(' ');
            let self_mapped = matches!(c, '!'..='~' | '\u{A1}'..='\u{AC}' | '\u{AE}'..='\u{FF}');
            let ch = if self_mapped { c } else { k += 1; char::from_u32(k - 1).unwrap_or(' ') };
            vocab.insert(ch.to_string(), json!(b));
        }
        vocab.insert("{\"".into(), json!(256));
        vocab.insert("\"}".into(), json!(257));
        let tok = json!({"decoder": {"type": "ByteLevel"}, "added_tokens": [{"id": 258, "content": "<eos>", "special": true}], "model": {"vocab": vocab}});
        Constraints::from_tokenizer_json(&tok, 260, &[258]).expect("constraints")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn constraints() -> Constraints {
        test_constraints()
    }

    fn run(c: &mut GuidanceConstraint, text: &str) -> Vec<bool> {
        for b in text.bytes() {
            let allowed = c.allowed(260).expect("mask");
            assert!(allowed[b as usize], "{:?} not allowed after {text:?}", b as char);
            c.commit(u32::from(b)).expect("commit");
        }
        c.allowed(260).expect("mask")
    }

    #[test]
    fn json_schema_masks_and_ends_with_eos() {
        let cs = constraints();
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false});
        let mut c = cs.compile(&Grammar::JsonSchema(schema)).expect("compiles");
        let first = c.allowed(260).expect("mask");
        assert!(first[b'{' as usize] && first[256] && !first[b'x' as usize] && !first[258] && !first[259]);
        let end = run(&mut c, "{\"a\": 12}");
        assert_eq!(end.iter().filter(|&&a| a).count(), 1, "only EOS after a complete object");
        assert!(end[258] && c.note().is_none());
    }

    /// llguidance's own words, as the engine sends them to the device, say what the flags say, on a
    /// model vocabulary longer than the tokenizer's (the ids past it never allowed), also once the
    /// grammar only allows the end.
    #[test]
    fn packed_masks_are_the_flags() {
        use engine::sample::constraint::{pack_bits, unpack_bits};
        let cs = constraints();
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false});
        let mut c = cs.compile(&Grammar::JsonSchema(schema)).expect("compiles");
        for b in "{\"a\": 12}".bytes() {
            for vocab in [260, 300] {
                let (bits, flags) = (c.allowed_bits(vocab).expect("bits"), c.allowed(vocab).expect("flags"));
                assert_eq!(bits, pack_bits(&flags), "after {:?}, vocab {vocab}", b as char);
                assert!(unpack_bits(&bits, vocab)[260..].iter().all(|&a| !a));
            }
            c.commit(u32::from(b)).expect("commit");
        }
        let end = c.allowed_bits(300).expect("end");
        assert_eq!(unpack_bits(&end, 300).iter().filter(|&&a| a).count(), 1, "only EOS after a complete object");
        assert_eq!(end, pack_bits(&c.allowed(300).expect("flags")));
    }

    #[test]
    fn regex_lark_and_bad_grammars() {
        let cs = constraints();
        let mut c = cs.compile(&Grammar::Regex("ab+c".into())).expect("regex");
        let after = run(&mut c, "abb");
        assert!(after[b'b' as usize] && after[b'c' as usize] && !after[b'a' as usize] && !after[258]);
        let mut c = cs.compile(&Grammar::Lark("start: \"yes\" | \"no\"".into())).expect("lark");
        assert!(run(&mut c, "no")[258]);
        assert!(cs.compile(&Grammar::Lark("start: undefined_rule".into())).is_err());
        assert!(cs.compile(&Grammar::JsonSchema(json!({"type": "nonsense"}))).is_err());
    }

    #[test]
    fn drafts_are_checked_ahead_and_the_matcher_goes_back() {
        let cs = constraints();
        let mut c = cs.compile(&Grammar::Regex("ab+c".into())).expect("regex");
        let (a, b, c_, z) = (u32::from(b'a'), u32::from(b'b'), u32::from(b'c'), u32::from(b'z'));
        // a, b allowed in turn; z refused after "ab": its row and the ones after repeat "ab"'s mask.
        let m = engine::sample::constraint::draft_masks(&mut c, &[a, b, z, c_], 260).expect("masks");
        let per_row = engine::sample::constraint::mask_words(260);
        assert_eq!(m.len(), 5 * per_row);
        let row = |i: usize| engine::sample::constraint::unpack_bits(&m[i * per_row..(i + 1) * per_row], 260);
        assert!(row(0)[a as usize] && !row(0)[b as usize]);
        assert!(row(1)[b as usize] && !row(1)[a as usize] && !row(1)[c_ as usize]);
        assert!(row(2)[b as usize] && row(2)[c_ as usize] && !row(2)[z as usize]);
        assert_eq!(row(3), row(2));
        assert_eq!(row(4), row(2));
        // The matcher is back at the start.
        assert!(c.allowed(260).expect("mask")[a as usize]);
        // A dead end met ahead is forgotten on the way back.
        let mut c = cs.compile(&Grammar::Regex("ab".into())).expect("regex");
        engine::sample::constraint::draft_masks(&mut c, &[a, b, b], 260).expect("masks");
        assert!(c.note().is_none(), "{:?}", c.note());
        assert!(c.allowed(260).expect("mask")[a as usize]);
    }

    #[test]
    fn a_rejected_token_leaves_only_eos() {
        let cs = constraints();
        let mut c = cs.compile(&Grammar::Regex("ab".into())).expect("regex");
        c.commit(u32::from(b'z')).expect("commit");
        let allowed = c.allowed(260).expect("mask");
        assert!(allowed[258] && allowed.iter().filter(|&&a| a).count() == 1);
        assert!(c.note().is_some_and(|n| n.contains("rejected")));
    }
}
