//! The tokenizer crate's loading and usage errors: missing or corrupt files and bad configs are
//! typed errors naming the problem, misuse never panics; tokenizers and detokenizers are Send.
mod tok_common;

use tok_common::*;

use tokenizer::{ChatMessage, Tokenizer, TokenizerError};

fn assert_send<T: Send>() {}

#[test]
fn tokenizer_and_detokenizer_are_send() {
    assert_send::<Tokenizer>();
    assert_send::<tokenizer::StreamingDetokenizer>();
}

#[test]
fn missing_dir_is_an_error() {
    let tmp = TempDir::new("missing");
    let err = Tokenizer::from_dir(&tmp.0.join("nope"))
        .err()
        .expect("error");
    assert!(matches!(err, TokenizerError::DirNotFound(_)), "{err}");
}

#[test]
fn missing_tokenizer_json_is_an_error() {
    let tmp = TempDir::new("nojson");
    write(&tmp.0.join("tokenizer_config.json"), "{}");
    let err = Tokenizer::from_dir(&tmp.0).err().expect("error");
    assert!(
        matches!(err, TokenizerError::MissingTokenizerJson(_)),
        "{err}"
    );
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

#[test]
fn corrupt_files_are_errors() {
    let tmp = TempDir::new("corrupt");
    write(&tmp.0.join("tokenizer.json"), "{\"version\": \"1.0\", oops");
    let err = Tokenizer::from_dir(&tmp.0).err().expect("error");
    assert!(
        matches!(err, TokenizerError::Json { ref path, .. } if path.ends_with("tokenizer.json")),
        "{err}"
    );

    write(&tmp.0.join("tokenizer.json"), "{\"model\": 12}");
    let err = Tokenizer::from_dir(&tmp.0).err().expect("error");
    assert!(matches!(err, TokenizerError::Load { .. }), "{err}");

    write(&tmp.0.join("tokenizer.json"), "[1, 2]");
    let err = Tokenizer::from_dir(&tmp.0).err().expect("error");
    assert!(matches!(err, TokenizerError::Json { .. }), "{err}");
}

/// A minimal valid tokenizer.json (word level, no Python needed).
const TINY: &str = r#"{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
  "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
  "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "hello": 1, "world": 2}, "unk_token": "<unk>"}}"#;

#[test]
fn bad_configs_are_errors() {
    let tmp = TempDir::new("badcfg");
    write(&tmp.0.join("tokenizer.json"), TINY);
    write(&tmp.0.join("tokenizer_config.json"), "{\"eos_token\": ");
    let err = Tokenizer::from_dir(&tmp.0).err().expect("error");
    assert!(
        matches!(err, TokenizerError::Json { ref path, .. } if path.ends_with("tokenizer_config.json")),
        "{err}"
    );

    write(
        &tmp.0.join("tokenizer_config.json"),
        "{\"chat_template\": 5}",
    );
    let err = Tokenizer::from_dir(&tmp.0).err().expect("error");
    assert!(matches!(err, TokenizerError::Config { .. }), "{err}");

    write(&tmp.0.join("tokenizer_config.json"), "{\"eos_token\": 7}");
    let err = Tokenizer::from_dir(&tmp.0).err().expect("error");
    assert!(matches!(err, TokenizerError::Config { .. }), "{err}");
}

#[test]
fn usage_errors_do_not_panic() {
    let tmp = TempDir::new("usage");
    write(&tmp.0.join("tokenizer.json"), TINY);
    let tok = Tokenizer::from_dir(&tmp.0).expect("load tiny");
    assert!(!tok.has_chat_template());
    let msgs = [ChatMessage::new("user", "hi")];
    assert!(matches!(
        tok.apply_chat_template(&msgs, true),
        Err(TokenizerError::NoChatTemplate)
    ));
    assert_eq!(tok.encode("hello world", true).expect("encode"), vec![1, 2]);
    assert_eq!(
        tok.decode(&[1, 99, 2], false).expect("decode"),
        "hello world"
    );
    assert!(tok.eos_token_ids().is_empty());
    let mut d = tok.detokenizer();
    for id in [1, 4_000_000_000, 2] {
        d.add_token(id);
    }
    d.finalize();
    assert_eq!(d.text(), "hello world");

    write(
        &tmp.0.join("tokenizer_config.json"),
        r#"{"chat_template": "{% for m in messages %}{{ m.content ", "eos_token": "world"}"#,
    );
    let mut tok = Tokenizer::from_dir(&tmp.0).expect("a broken template only fails when used");
    assert!(tok.has_chat_template());
    assert!(matches!(
        tok.apply_chat_template(&msgs, true),
        Err(TokenizerError::Template(_))
    ));
    assert!(matches!(
        tok.apply_chat_template(&[], true),
        Err(TokenizerError::EmptyConversation)
    ));
    assert_eq!(tok.eos_token_ids(), vec![2]);
    tok.add_eos_token("hello").expect("known token");
    tok.add_eos_token("7").expect("an id");
    assert_eq!(tok.eos_token_ids(), vec![2, 1, 7]);
    assert!(matches!(
        tok.add_eos_token("nope"),
        Err(TokenizerError::UnknownToken(_))
    ));
}
