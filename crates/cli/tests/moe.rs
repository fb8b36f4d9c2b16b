//! Oracle tests for the mixture-of-experts architectures `qwen3_moe`, `qwen2_moe`, `mixtral` and
//! `mistral4` (tests/oracle/make_moe.py: tiny random models in Hugging Face layout, float32, and
//! mlx-lm's own 4-bit conversions of them; mistral4 also as published in FP8): `mlx-gen generate` gives Python mlx-lm 0.32.2's greedy
//! tokens and text (64 tokens) with and without the chat template, the chat prompt routing enough
//! tokens (>= 64 token-expert pairs) for the sorted-experts path; prompt logits within 1e-5 of
//! mlx-lm's (float32 activations and scales, the 4-bit ones too; 1e-2 x the logit range for the
//! bfloat16 4-bit one); `mlx-gen convert -q` equal to
//! `mlx_lm.convert -q` tensor for tensor; rotating and quantized KV caches as mlx-lm's; tensor and
//! pipeline parallel on 2 ranks equal to one process; continuous batching equal to each sequence
//! alone. Needs the oracle venv (scripts/oracle-venv.sh); fails, never skips, when it cannot be made.

mod common;
mod dist;

use engine::LoadedModel;
use serde_json::Value;
use std::path::PathBuf;

const MAX_TOKENS: usize = 64;
/// With the template's default system prompt: 47 tokens, 94 routed token-expert pairs at top-2.
const CHAT_PROMPT: &str = "Hello, how are you?";
const RAW_PROMPT: &str = "The capital of France is";
const VARIANTS: &[&str] = &[
    "mistral4-f32",
    "mistral4-fp8",
    "mistral4-q4g32",
    "mixtral-f32",
    "mixtral-q4g32",
    "qwen2moe-f32",
    "qwen2moe-q4g32",
    "qwen3moe-f32",
    "qwen3moe-q4g32",
    "qwen3moe-q4g32-bf16",
    "qwen3moe-step2-f32",
];

fn info() -> Value {
    serde_json::from_str(&std::fs::read_to_string(common::moe_models_dir().join("variants.json")).unwrap()).unwrap()
}

/// Each variant of one architecture with the chat prompt; the main float32 and 4-bit ones also
/// with the raw prompt (too short for the sorted path: the unsorted one).
fn check_arch(prefix: &str) {
    let info = info();
    for v in VARIANTS.iter().filter(|v| v.starts_with(prefix)) {
        let f32 = info[v]["dtype"] == "float32";
        let n = common::check_against_reference(&common::moe_model(v), f32, CHAT_PROMPT, false, MAX_TOKENS);
        assert!(n * 2 >= 64, "{v}: the chat prompt routes {} token-expert pairs, fewer than the sorted path's 64", n * 2);
        if !v.contains("step2") && !v.contains("fp8") && !v.contains("bf16") {
            common::check_against_reference(&common::moe_model(v), f32, RAW_PROMPT, true, MAX_TOKENS);
        }
    }
}

#[test]
fn variants_are_covered() {
    let built = info();
    let mut built: Vec<&str> = built.as_object().unwrap().keys().map(String::as_str).collect();
    built.sort_unstable();
    assert_eq!(built, VARIANTS, "the tests must cover exactly the variants make_moe.py builds");
}

#[test]
fn qwen3_moe() {
    check_arch("qwen3moe");
}

#[test]
fn qwen2_moe() {
    check_arch("qwen2moe");
}

#[test]
fn mixtral() {
    check_arch("mixtral");
}

#[test]
fn mistral4() {
    check_arch("mistral4");
}

/// `mlx-gen convert -q --q-group-size 32 --dtype float32|bfloat16` of each Hugging Face float checkpoint
/// equals mlx-lm's conversion with the same settings (the 4-bit variants: per-expert tensors
/// stacked, mistral4's kv_b_proj absorbed, qwen3_moe's routers in 8 bits with their entries in
/// config.json).
#[test]
fn convert_equals_mlx_lm() {
    let info = info();
    for v in VARIANTS.iter().filter(|v| info[**v]["kind"] == "quantized") {
        let src = common::moe_model(info[*v]["src"].as_str().unwrap());
        let ours = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("moe-convert-{v}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&ours);
        let args = ["convert", "--model", src.to_str().unwrap(), "--mlx-path", ours.to_str().unwrap()];
        let dtype = info[*v]["dtype"].as_str().unwrap();
        let o = common::mlx_gen(&[&args[..], &["-q", "--q-group-size", "32", "--dtype", dtype]].concat(), None);
        assert!(o.status.success(), "{v}: mlx-gen convert failed:\n{}", String::from_utf8_lossy(&o.stderr));
        common::assert_same_model_folder(&ours, &common::moe_model(v));
        let _ = std::fs::remove_dir_all(&ours);
        eprintln!("{v}: mlx-gen convert equals mlx_lm.convert");
    }
}

/// Rotating caches (`--max-kv-size` below the prompt length), a quantized KV cache and chunked
/// prefill, against mlx-lm's generate (cache_reference.py).
#[test]
fn caches() {
    let cases: &[(&str, &[&str])] = &[
        ("qwen3moe-f32", &["--max-kv-size", "40", "--prefill-step-size", "16"]),
        ("qwen3moe-q4g32", &["--kv-bits", "4", "--kv-group-size", "32", "--quantized-kv-start", "20"]),
        ("qwen3moe-f32", &["--kv-bits", "8", "--kv-group-size", "32", "--quantized-kv-start", "0", "--prefill-step-size", "7"]),
        ("mixtral-f32", &["--max-kv-size", "30", "--prefill-step-size", "9"]),
        ("mistral4-f32", &["--max-kv-size", "24", "--prefill-step-size", "5"]),
    ];
    let json_cases: Vec<Value> = cases
        .iter()
        .map(|(v, flags)| {
            let mut c = serde_json::json!({"op": "generate", "model": common::moe_model(v), "prompt": CHAT_PROMPT,
                "max_tokens": MAX_TOKENS});
            for pair in flags.chunks(2) {
                c[pair[0].trim_start_matches("--").replace('-', "_")] = Value::from(pair[1].parse::<i64>().unwrap());
            }
            c
        })
        .collect();
    let refs = common::batched_reference("cache_reference.py", &json_cases);
    for ((variant, flags), r) in cases.iter().zip(&refs) {
        let dir = common::moe_model(variant);
        let max = MAX_TOKENS.to_string();
        let mut args = vec!["generate", "--device", "cpu", "--model", dir.to_str().unwrap(), "--prompt", CHAT_PROMPT];
        args.extend(["--max-tokens", &max, "--output", "json"]);
        args.extend(flags.iter());
        let o = common::mlx_gen(&args, None);
        assert!(o.status.success(), "{variant} {flags:?}: mlx-gen failed:\n{}", String::from_utf8_lossy(&o.stderr));
        let o: Value = serde_json::from_slice(&o.stdout).expect("mlx-gen JSON");
        assert_eq!(o["tokens"], r["tokens"], "{variant} {flags:?}: tokens differ from mlx-lm's");
        eprintln!("{variant} {flags:?}: {} tokens equal", r["tokens"].as_array().map_or(0, Vec::len));
    }
}

/// Prompt-cache files both ways (`cache-prompt`, then `generate --prompt-cache-file`): mlx-lm
/// continues from ours and we from mlx-lm's, with the same tokens (qwen3_moe's KV cache,
/// mistral4's latent cache).
#[test]
fn prompt_cache_files_are_mlx_lms() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("moe-prompt-cache-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let (first, then) = (CHAT_PROMPT, "Summarize it.");
    let mut ops = Vec::new();
    let mut runs = Vec::new();
    for v in ["qwen3moe-f32", "mistral4-q4g32"] {
        let model = common::moe_model(v);
        let (ours, theirs) = (tmp.join(format!("{v}-ours.safetensors")), tmp.join(format!("{v}-theirs.safetensors")));
        let args = ["cache-prompt", "--device", "cpu", "--model", model.to_str().unwrap(), "--prompt", first];
        let o = common::mlx_gen(&[&args[..], &["--prompt-cache-file", ours.to_str().unwrap()]].concat(), None);
        assert!(o.status.success(), "{v}: cache-prompt failed:\n{}", String::from_utf8_lossy(&o.stderr));
        ops.push(serde_json::json!({"op": "cache_prompt", "model": model, "prompt": first, "prompt_cache_file": theirs}));
        runs.push((v, model, ours, theirs));
    }
    for (_, model, ours, theirs) in &runs {
        for f in [ours, theirs] {
            ops.push(serde_json::json!({"op": "generate", "model": model, "prompt": then, "max_tokens": MAX_TOKENS,
                "prompt_cache_file": f}));
        }
    }
    let refs = common::batched_reference("cache_reference.py", &ops);
    for (i, (v, model, ours, theirs)) in runs.iter().enumerate() {
        for (j, (who, f)) in [("ours", ours), ("theirs", theirs)].into_iter().enumerate() {
            let want = &refs[runs.len() + 2 * i + j]["tokens"];
            let max = MAX_TOKENS.to_string();
            let args = ["generate", "--device", "cpu", "--model", model.to_str().unwrap(), "--prompt", then, "--max-tokens", &max];
            let o = common::mlx_gen(&[&args[..], &["--output", "json", "--prompt-cache-file", f.to_str().unwrap()]].concat(), None);
            assert!(o.status.success(), "{v} ({who} file): generate failed:\n{}", String::from_utf8_lossy(&o.stderr));
            let o: Value = serde_json::from_slice(&o.stdout).expect("mlx-gen JSON");
            assert_eq!(&o["tokens"], want, "{v}: tokens after the prompt cache written by {who} differ from mlx-lm's");
            eprintln!("{v}: prompt cache written by {who}: {} tokens equal", want.as_array().map_or(0, Vec::len));
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Speculative decoding (a draft model, and prompt lookup) keeps the greedy tokens on the CPU,
/// the target's caches trimmed after rejected drafts.
#[test]
fn speculative_decoding_keeps_the_greedy_tokens() {
    let (target, draft) = (common::moe_model("mistral4-f32"), common::moe_model("qwen3moe-f32"));
    let base = ["generate", "--device", "cpu", "--model", target.to_str().unwrap(), "--prompt", CHAT_PROMPT, "--max-tokens", "48", "--output", "json"];
    let run = |extra: &[&str]| -> Value {
        let o = common::mlx_gen(&[&base[..], extra].concat(), None);
        assert!(o.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).expect("mlx-gen JSON")
    };
    let plain = run(&[]);
    for extra in [&["--draft-model", draft.to_str().unwrap(), "--num-draft-tokens", "3"][..], &["--prompt-lookup", "2"][..]] {
        assert_eq!(run(extra)["tokens"], plain["tokens"], "{extra:?}: speculative tokens differ from plain greedy ones");
    }
}

/// qwen3_moe: attention heads, the dense layers' hidden units and every expert's hidden units
/// split over 2 ranks (the router whole, one all_sum per MoE layer), as mlx-lm's `shard`.
#[test]
fn tp2_qwen3_moe_matches_single_process() {
    dist::sharded_matches_single(&common::moe_model("qwen3moe-f32"), dist::Split::Tensor);
}

/// mistral4: MLA heads (queries, embed_q / unembed_out by head, o_proj columns), the dense layer,
/// routed and shared experts' hidden units.
#[test]
fn tp2_mistral4_matches_single_process() {
    dist::sharded_matches_single(&common::moe_model("mistral4-f32"), dist::Split::Tensor);
}

#[test]
fn pp2_mixtral_matches_single_process() {
    dist::sharded_matches_single(&common::moe_model("mixtral-f32"), dist::Split::Pipeline);
}

/// Continuous batching: sequences of different lengths joining at different steps (left-padded
/// rows, per-row RoPE offsets and, for mistral4, per-row Llama-4 query scales) give the greedy
/// tokens each gives alone.
#[test]
fn batched_sequences_match_their_runs_alone() {
    for v in ["mistral4-f32", "qwen2moe-q4g32"] {
        let m = LoadedModel::load(&common::moe_model(v)).unwrap();
        let prompts: Vec<Vec<u32>> = [5usize, 40, 17].iter().map(|&n| (0..n as u32).map(|i| (i * 37 + n as u32) % 400 + 3).collect()).collect();
        common::assert_batched_equal_alone(&m, v, &prompts, &[0, 0, 4], &[20, 12, 16], 32);
        eprintln!("{v}: 3 batched sequences equal their runs alone");
    }
}

/// mistral4 with a quantized KV cache fails with a message (mlx-lm fails too: its attention reads
/// the cached latent directly), rather than computing garbage.
#[test]
fn mistral4_quantized_kv_refused() {
    let dir = common::moe_model("mistral4-f32");
    let args = ["generate", "--model", dir.to_str().unwrap(), "--prompt", "Hi", "--max-tokens", "4"];
    let o = common::mlx_gen(&[&args[..], &["--kv-bits", "4", "--kv-group-size", "32", "--quantized-kv-start", "0"]].concat(), None);
    common::assert_error(&o, 1, &["quantized KV cache", "mistral4"]);
}

/// An unsupported `model_type` names every supported one, the new ones included.
#[test]
fn unsupported_model_type_lists_the_moe_types() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("moe-unsupported-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    common::copy_dir(&common::moe_model("mixtral-f32"), &dir);
    let cfg = dir.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    c["model_type"] = "jamba".into();
    std::fs::write(&cfg, c.to_string()).unwrap();
    let o = common::mlx_gen(&["generate", "--model", dir.to_str().unwrap(), "--prompt", "Hi", "--max-tokens", "2"], None);
    let _ = std::fs::remove_dir_all(&dir);
    common::assert_error(&o, 1, &["jamba", "qwen3_moe", "qwen2_moe", "mixtral", "mistral4", "deepseek_v3", "llama"]);
}

/// A prompt chunk's experts run one expert at a time (`MLX_GEN_MOE_GROUPED=1`: 64+ positions, 16+
/// slots an expert) give mlx-lm's tokens (its sorted gathered product), float32 and 4-bit.
#[test]
fn grouped_experts() {
    let prompt = "Hello, how are you? I would like to hear about your day. ".repeat(4);
    let variants = ["mixtral-q4g32", "qwen2moe-f32", "qwen3moe-q4g32"];
    let cases: Vec<Value> = variants
        .iter()
        .map(|v| serde_json::json!({"op": "generate", "model": common::moe_model(v), "prompt": prompt, "max_tokens": MAX_TOKENS}))
        .collect();
    let refs = common::batched_reference("cache_reference.py", &cases);
    for (variant, r) in variants.iter().zip(&refs) {
        let dir = common::moe_model(variant);
        let max = MAX_TOKENS.to_string();
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_mlx-gen"))
            .env("MLX_GEN_MOE_GROUPED", "1")
            .args(["generate", "--device", "cpu", "--model", dir.to_str().unwrap(), "--prompt", &prompt])
            .args(["--max-tokens", &max, "--output", "json"])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run mlx-gen");
        assert!(o.status.success(), "{variant}: mlx-gen failed:\n{}", String::from_utf8_lossy(&o.stderr));
        let o: Value = serde_json::from_slice(&o.stdout).expect("mlx-gen JSON");
        assert!(o["prompt_tokens"].as_u64().unwrap_or(0) > 64, "{variant}: the prompt is too short for the grouped path");
        assert_eq!(o["tokens"], r["tokens"], "{variant}: tokens differ from mlx-lm's");
        eprintln!("{variant}: {} tokens equal with the experts grouped", r["tokens"].as_array().map_or(0, Vec::len));
    }
}
