//! Oracle tests: for every tiny model of the matrix (tests/oracle/make_models.py), our `mlx-gen
//! generate` must produce exactly the tokens and text of Python mlx-lm 0.32.2
//! (tests/oracle/reference.py), and the engine's prompt logits must match mlx-lm's:
//!   * float32 (unquantized) variants: max |ours - mlx-lm| <= 1e-5;
//!   * bfloat16 and quantized variants: max |ours - mlx-lm| <= 1e-2 * (max - min of mlx-lm's logits).
//!
//! Needs the oracle venv (scripts/oracle-venv.sh); fails, never skips, when it cannot be made.

mod common;

use serde_json::Value;
use std::process::{Command, Stdio};

const MAX_TOKENS: usize = 64;
const CHAT_PROMPT: &str = "Hello, how are you?";
const RAW_PROMPT: &str = "The capital of France is";

const LLAMA_FLOAT: &[&str] = &["llama3-f32", "llama-linear-bf16", "llama-headdim-f32", "llama-h128-f32"];
const LLAMA_QUANT: &[&str] =
    &["llama3-q4g64", "llama-headdim-q3g32", "llama-h128-q4g128", "llama-linear-q8g32", "llama3-mixed-3-6"];
const MISTRAL: &[&str] = &["mistral-f32", "mistral-q2g64"];
const QWEN2: &[&str] = &["qwen2-f32", "qwen2-bf16", "qwen2-q4g32", "qwen2-q6g64"];
const QWEN3: &[&str] = &["qwen3-f32", "qwen3-bf16", "qwen3-q8g64", "qwen3-q5g32", "qwen3-mixed-custom"];

/// What reference.py printed.
struct Reference {
    prompt_ids: Vec<u32>,
    tokens: Vec<u32>,
    text: String,
    finish_reason: String,
    logits: Vec<f32>,
}

fn ids(v: &Value, what: &str) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("{what} is not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap_or_else(|| panic!("{what}: {x} is not a token id")) as u32)
        .collect()
}

fn reference(variant: &str, prompt: &str, ignore_chat_template: bool, system: Option<&str>) -> Reference {
    let dir = common::model(variant);
    let mut cmd = Command::new(common::venv_python());
    cmd.arg(common::oracle_dir().join("reference.py"))
        .arg("--model")
        .arg(&dir)
        .args(["--prompt", prompt, "--max-tokens", &MAX_TOKENS.to_string()])
        .stdin(Stdio::null());
    if ignore_chat_template {
        cmd.arg("--ignore-chat-template");
    }
    if let Some(s) = system {
        cmd.args(["--system-prompt", s]);
    }
    let out = cmd.output().expect("run reference.py");
    assert!(
        out.status.success(),
        "{variant}: reference.py failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{variant}: reference.py output is not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    Reference {
        prompt_ids: ids(&v["prompt_ids"], "prompt_ids"),
        tokens: ids(&v["tokens"], "tokens"),
        text: v["text"].as_str().expect("text").to_string(),
        finish_reason: v["finish_reason"].as_str().unwrap_or("").to_string(),
        logits: v["logits"].as_array().expect("logits").iter().map(|x| x.as_f64().expect("logit") as f32).collect(),
    }
}

/// Runs `mlx-gen generate ... --output json`; returns its JSON object.
fn ours(variant: &str, prompt: &str, ignore_chat_template: bool, system: Option<&str>) -> Value {
    let dir = common::model(variant);
    let dir = dir.to_str().unwrap();
    let max = MAX_TOKENS.to_string();
    let mut args = vec!["generate", "--model", dir, "--prompt", prompt, "--max-tokens", &max, "--output", "json"];
    if ignore_chat_template {
        args.push("--ignore-chat-template");
    }
    if let Some(s) = system {
        args.extend(["--system-prompt", s]);
    }
    let out = common::mlx_gen(&args, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{variant}: mlx-gen {args:?} failed ({}):\n{stderr}", out.status);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{variant}: mlx-gen --output json printed no JSON object ({e}):\n{}", String::from_utf8_lossy(&out.stdout))
    })
}

fn is_f32_float(variant: &str) -> bool {
    let info = &common::variants()[variant];
    info["kind"] == "float" && info["dtype"] == "float32"
}

/// Compares generation (tokens, text, counts) and prompt logits for one variant and prompt.
fn check_case(variant: &str, prompt: &str, ignore_chat_template: bool, system: Option<&str>) -> Reference {
    let case = format!("{variant} (prompt {prompt:?}, ignore_chat_template={ignore_chat_template}, system {system:?})");
    let r = reference(variant, prompt, ignore_chat_template, system);
    assert!(!r.prompt_ids.is_empty(), "{case}: reference prompt is empty");
    assert!(r.tokens.len() <= MAX_TOKENS);
    assert!(r.logits.iter().all(|x| x.is_finite()), "{case}: reference logits are not finite");

    // 1. Generation through the CLI.
    let o = ours(variant, prompt, ignore_chat_template, system);
    let tokens = ids(&o["tokens"], "mlx-gen tokens");
    assert_eq!(
        tokens, r.tokens,
        "{case}: generated tokens differ from mlx-lm's (ours {} tokens, mlx-lm {} tokens, mlx-lm finish: {})",
        tokens.len(), r.tokens.len(), r.finish_reason
    );
    let text = o["text"].as_str().unwrap_or_else(|| panic!("{case}: mlx-gen JSON has no text: {o}"));
    assert_eq!(text, r.text, "{case}: text differs from mlx-lm's");
    assert_eq!(o["prompt_tokens"].as_u64(), Some(r.prompt_ids.len() as u64), "{case}: prompt_tokens");
    assert_eq!(o["generation_tokens"].as_u64(), Some(r.tokens.len() as u64), "{case}: generation_tokens");

    // 2. Prompt logits through the engine library.
    let dir = common::model(variant);
    let model = engine::LoadedModel::load(dir.as_path()).unwrap_or_else(|e| panic!("{case}: load: {e:?}"));
    let logits: Vec<f32> = model.prompt_logits(&r.prompt_ids).unwrap_or_else(|e| panic!("{case}: prompt_logits: {e:?}"));
    assert_eq!(logits.len(), r.logits.len(), "{case}: logits length");
    let (mut max_diff, mut at) = (0f32, 0usize);
    for (i, (a, b)) in logits.iter().zip(&r.logits).enumerate() {
        let d = (a - b).abs();
        if d.is_nan() || d > max_diff {
            max_diff = d;
            at = i;
            if d.is_nan() {
                break;
            }
        }
    }
    let (lo, hi) = r.logits.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    let (tol, rule) = if is_f32_float(variant) {
        (1e-5f32, "1e-5 absolute (float32)".to_string())
    } else {
        (1e-2 * (hi - lo), format!("1e-2 x logit range {:.3} (bf16/quantized)", hi - lo))
    };
    assert!(
        max_diff <= tol, // false for NaN
        "{case}: prompt logits differ from mlx-lm's: max |diff| = {max_diff:e} at id {at} \
         (ours {}, mlx-lm {}), tolerance {tol:e} = {rule}",
        logits[at], r.logits[at]
    );
    eprintln!("{case}: {} tokens ok, {}; logits max |diff| {max_diff:e} (tol {tol:e})", r.tokens.len(), r.finish_reason);
    r
}

/// Every variant: the chat prompt and the raw prompt; the first of each group also a system
/// prompt and a literal `\\n` in the prompt (mlx-lm's main() turns it into a newline).
fn check_variants(variants: &[&str]) {
    for (i, v) in variants.iter().enumerate() {
        check_case(v, CHAT_PROMPT, false, None);
        check_case(v, RAW_PROMPT, true, None);
        if i == 0 {
            check_case(v, "Write a story\\nabout a cat.", false, Some("You are terse."));
        }
    }
}

/// Mistral's template allows no system message: mlx-lm raises the template's exception, and so
/// must we (one line naming it, exit 1).
fn check_system_refused(variant: &str) {
    let dir = common::model(variant);
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-gen"))
        .args(["generate", "--model"])
        .arg(&dir)
        .args(["--prompt", "Hi", "--system-prompt", "You are terse.", "--max-tokens", "4"])
        .output()
        .expect("run mlx-gen");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{variant}: {stderr}");
    assert!(stderr.contains("Conversation roles must alternate"), "{variant}: {stderr}");
    let py = Command::new(common::venv_python())
        .arg(common::oracle_dir().join("reference.py"))
        .arg("--model")
        .arg(&dir)
        .args(["--prompt", "Hi", "--system-prompt", "You are terse.", "--max-tokens", "4"])
        .output()
        .expect("run reference.py");
    assert!(!py.status.success(), "{variant}: mlx-lm accepted a system message");
}

#[test]
fn matrix_is_covered() {
    let all: Vec<&str> = [LLAMA_FLOAT, LLAMA_QUANT, MISTRAL, QWEN2, QWEN3].concat();
    let mut built: Vec<String> = common::variants().keys().cloned().collect();
    built.sort();
    let mut tested: Vec<String> = all.iter().map(|s| s.to_string()).collect();
    tested.sort();
    assert_eq!(built, tested, "the oracle tests must cover exactly the variants make_models.py builds");
}

#[test]
fn llama_float() {
    check_variants(LLAMA_FLOAT);
}

#[test]
fn llama_quantized() {
    check_variants(LLAMA_QUANT);
}

#[test]
fn mistral() {
    for v in MISTRAL {
        check_case(v, CHAT_PROMPT, false, None);
        check_case(v, RAW_PROMPT, true, None);
    }
    check_system_refused(MISTRAL[0]);
}

#[test]
fn qwen2() {
    check_variants(QWEN2);
}

#[test]
fn qwen3() {
    check_variants(QWEN3);
}

/// generation_config.json adds an eos id that greedy decoding of the chat prompt reaches: both
/// must stop there (the eos not included), well before max tokens.
#[test]
fn extra_eos_from_generation_config() {
    let v = "llama-linear-bf16";
    let extra = common::variants()[v]["extra_eos"].as_u64().expect("extra_eos") as u32;
    let r = check_case(v, CHAT_PROMPT, false, None);
    assert_eq!(r.finish_reason, "stop", "{v}: mlx-lm did not stop on the extra eos {extra}");
    assert!(r.tokens.len() < MAX_TOKENS && !r.tokens.contains(&extra), "{v}: {:?}", r.tokens);
}
