//! `generate --output json` separates a reasoning model's `<think>` part: with a chat template that
//! opens `<think>` at the end of the prompt (as the DeepSeek-R1 distills' does), the generated text
//! up to `</think>` is `reasoning` and the rest `answer`; models without think tokens get neither.
mod common;

use serde_json::Value;

fn json(args: &[&str]) -> Value {
    let out = common::mlx_gen(args, None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn reasoning_is_split_from_the_answer() {
    let dir = common::reasoning_model_copy("qwen3-f32", "reasoning");
    let d = dir.to_str().unwrap();
    let v = json(&["generate", "--model", d, "--prompt", "Hi", "--max-tokens", "24", "--output", "json"]);
    let text = v["text"].as_str().unwrap();
    let expected = tokenizer::split_reasoning(text, true);
    assert_eq!(v["reasoning"].as_str(), expected.0.as_deref(), "{v}");
    assert_eq!(v["answer"].as_str(), Some(expected.1.as_str()), "{v}");
    assert!(v["reasoning"].is_string(), "a prompt that opens <think> always yields reasoning: {v}");

    // Raw text (no template): nothing opens <think>, so no reasoning unless the model writes one.
    let v = json(&["generate", "--model", d, "--prompt", "Hi", "--max-tokens", "8", "--output", "json", "--ignore-chat-template"]);
    let text = v["text"].as_str().unwrap();
    assert_eq!(v["reasoning"].is_string(), text.trim_start().starts_with("<think>"), "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}
