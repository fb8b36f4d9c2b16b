//! Oracle tests for `deepseek_v2` and `deepseek_v3` (tests/oracle/make_deepseek.py: tiny random
//! models with routed + shared experts, group-limited routing, q_lora on and off, a dense layer then
//! MoE layers, float32 and 4-bit, and V3 as published: FP8 with block scales, compressed-tensors
//! int4): `mlx-gen generate` must give Python mlx-lm 0.32.2's greedy tokens and text (64 tokens),
//! and the engine's prompt logits must be within 1e-5 of mlx-lm's (float32 activations and scales;
//! 1e-2 x the logit range for bfloat16), also with rotating and quantized KV caches and chunked
//! prefill.
//! Needs the oracle venv (scripts/oracle-venv.sh); fails, never skips, when it cannot be made.

mod common;

use serde_json::Value;
use std::path::PathBuf;

const MAX_TOKENS: usize = 64;
/// With the template's default system prompt, long enough (47 tokens) for the sorted-experts path.
const CHAT_PROMPT: &str = "Hello, how are you?";
const RAW_PROMPT: &str = "The capital of France is";
const VARIANTS: &[&str] = &[
    "dsv2-f32",
    "dsv2-qlora-f32",
    "dsv2-q4g32",
    "dsv2-q4g32-bf16",
    "dsv3-f32",
    "dsv3-noqlora-f32",
    "dsv3-q4g32",
    "dsv3-q4g32-bf16",
    "dsv3-kvb-q4g32",
    "dsv3-fp8",
    "dsv3-int4",
];

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("token id") as u32).collect()
}

fn check(variant: &str, prompt: &str, ignore_chat_template: bool) {
    let info: Value = serde_json::from_str(&std::fs::read_to_string(common::deepseek_models_dir().join("variants.json")).unwrap()).unwrap();
    let f32 = info[variant]["dtype"] == "float32";
    common::check_against_reference(&common::deepseek_model(variant), f32, prompt, ignore_chat_template, MAX_TOKENS);
}

#[test]
fn variants_are_covered() {
    let text = std::fs::read_to_string(common::deepseek_models_dir().join("variants.json")).expect("variants.json");
    let built: serde_json::Map<String, Value> = serde_json::from_str(&text).expect("variants.json object");
    let mut built: Vec<&str> = built.keys().map(String::as_str).collect();
    built.sort_unstable();
    let mut tested = VARIANTS.to_vec();
    tested.sort_unstable();
    assert_eq!(built, tested, "the tests must cover exactly the variants make_deepseek.py builds");
}

#[test]
fn deepseek_v2() {
    for v in VARIANTS.iter().filter(|v| v.starts_with("dsv2")) {
        check(v, CHAT_PROMPT, false);
        check(v, RAW_PROMPT, true);
    }
}

#[test]
fn deepseek_v3() {
    for v in VARIANTS.iter().filter(|v| v.starts_with("dsv3")) {
        check(v, CHAT_PROMPT, false);
        check(v, RAW_PROMPT, true);
    }
}

/// Rotating caches (`--max-kv-size` below the prompt length), a quantized KV cache (V2; mlx-lm's
/// V3 attention cannot use one) and chunked prefill, against mlx-lm's generate (cache_reference.py).
#[test]
fn caches() {
    let cases: &[(&str, &[&str])] = &[
        ("dsv2-f32", &["--max-kv-size", "40", "--prefill-step-size", "16"]),
        ("dsv3-f32", &["--max-kv-size", "40", "--prefill-step-size", "16"]),
        ("dsv2-f32", &["--kv-bits", "4", "--kv-group-size", "32", "--quantized-kv-start", "20", "--prefill-step-size", "16"]),
        ("dsv2-q4g32", &["--kv-bits", "8", "--kv-group-size", "32", "--quantized-kv-start", "0"]),
        ("dsv3-q4g32", &["--prefill-step-size", "8"]),
        ("dsv3-noqlora-f32", &["--max-kv-size", "24", "--prefill-step-size", "5"]),
    ];
    let json_cases: Vec<Value> = cases
        .iter()
        .map(|(v, flags)| {
            let mut c = serde_json::json!({"op": "generate", "model": common::deepseek_models_dir().join(v), "prompt": CHAT_PROMPT,
                "max_tokens": MAX_TOKENS});
            for pair in flags.chunks(2) {
                let key = pair[0].trim_start_matches("--").replace('-', "_");
                c[key] = Value::from(pair[1].parse::<i64>().unwrap());
            }
            c
        })
        .collect();
    let refs = common::batched_reference("cache_reference.py", &json_cases);
    for ((variant, flags), r) in cases.iter().zip(&refs) {
        let dir = common::deepseek_models_dir().join(variant);
        let max = MAX_TOKENS.to_string();
        let mut args = vec!["generate", "--device", "cpu", "--model", dir.to_str().unwrap(), "--prompt", CHAT_PROMPT];
        args.extend(["--max-tokens", &max, "--output", "json"]);
        args.extend(flags.iter());
        let o = common::mlx_gen(&args, None);
        assert!(o.status.success(), "{variant} {flags:?}: mlx-gen failed:\n{}", String::from_utf8_lossy(&o.stderr));
        let o: Value = serde_json::from_slice(&o.stdout).expect("mlx-gen JSON");
        assert_eq!(ids(&o["tokens"]), ids(&r["tokens"]), "{variant} {flags:?}: tokens differ from mlx-lm's");
        eprintln!("{variant} {flags:?}: {} tokens equal", ids(&r["tokens"]).len());
    }
}

/// V3 with a quantized KV cache fails with a message (mlx-lm fails too), rather than computing garbage.
#[test]
fn v3_quantized_kv_refused() {
    let dir = common::deepseek_models_dir().join("dsv3-f32");
    let args = ["generate", "--model", dir.to_str().unwrap(), "--prompt", "Hi", "--max-tokens", "4"];
    let o = common::mlx_gen(&[&args[..], &["--kv-bits", "4", "--kv-group-size", "32", "--quantized-kv-start", "0"]].concat(), None);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && stderr.contains("quantized KV cache"), "{stderr}");
}

/// A bfloat16 model with float (unquantized) experts on the CPU fails with one clear line: MLX's CPU
/// gather_mm takes float32 only (mlx-lm fails too, with MLX's internal message).
#[test]
fn bf16_float_experts_on_cpu_refused() {
    let src = common::deepseek_models_dir().join("dsv3-f32");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("dsv3-bf16-float-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        if f.extension().is_some_and(|e| e != "safetensors") {
            std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
        }
    }
    let st = mlx::io::load_safetensors(&src.join("model.safetensors")).unwrap();
    let bf16: Vec<(String, mlx::Array)> =
        st.tensors.iter().map(|(n, a)| (n.clone(), a.astype(mlx::Dtype::BF16).unwrap())).collect();
    let refs: Vec<(&str, &mlx::Array)> = bf16.iter().map(|(n, a)| (n.as_str(), a)).collect();
    mlx::io::save_safetensors(&dir.join("model.safetensors"), &refs, &[("format", "pt")]).unwrap();
    let args = ["generate", "--device", "cpu", "--model", dir.to_str().unwrap(), "--prompt", "Hi", "--max-tokens", "4"];
    let o = common::mlx_gen(&args, None);
    let stderr = String::from_utf8_lossy(&o.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!o.status.success(), "a bf16 float MoE ran on the CPU: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: ") && stderr.contains("float32 on the CPU") && !stderr.contains("GatherMM"), "{stderr}");
}
