//! Oracle tests for `ministral3`, `mistral3` (with a ministral3 text model), `llama4_text` and
//! `llama4` (tests/oracle/make_llama4_mistral3.py: tiny random models with sliding-window layers,
//! the llama-4 attention scale, YaRN; chunked attention over chunks of 8, no-RoPE global layers
//! with temperature tuning, q/k norms, MoE with a shared expert; float32, 4-bit, mixed 4/8-bit
//! with per-layer entries, and 4-bit bfloat16): `mlx-gen generate` must give Python mlx-lm
//! 0.32.2's greedy tokens and text (64 tokens, with and without the chat template; the chat prompt
//! of 47 tokens crosses the window and several chunks), the engine's prompt logits must be within
//! 1e-5 of mlx-lm's (float32 activations; 1e-2 x the logit range for bfloat16), also with chunked
//! prefill, rotating and quantized KV caches and prompt-cache files; `mlx-gen convert -q` of each
//! Hugging Face checkpoint must equal `mlx_lm.convert -q`'s output; speculative decoding keeps the
//! greedy tokens; the batch engine gives each sequence its tokens alone (batched with default
//! caches, one after another with rotating or chunked ones); chat turns reuse or rebuild caches.
//! Needs the oracle venv (scripts/oracle-venv.sh); fails, never skips, when it cannot be made.

mod common;

use engine::batch::{BatchEngine, SeqParams};
use engine::{GenerateConfig, Generator, LoadedModel, SamplerConfig};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Command, Stdio};

const MAX_TOKENS: usize = 64;
/// With the template's default system prompt: 47 tokens, past the window (12) and 5 chunks of 8.
const CHAT_PROMPT: &str = "Hello, how are you?";
const RAW_PROMPT: &str = "The capital of France is";
const VARIANTS: &[&str] = &[
    "ministral3-f32",
    "ministral3-q4",
    "ministral3-q4-bf16",
    "mistral3-f32",
    "mistral3-q4",
    "mistral3-mixed",
    "llama4_text-f32",
    "llama4_text-q4",
    "llama4-f32",
    "llama4-q4",
    "llama4-mixed",
    "llama4-q4-bf16",
];

fn models() -> PathBuf {
    common::llama4_mistral3_models_dir().to_path_buf()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("token id") as u32).collect()
}

/// `mlx-gen generate ... --output json` on `variant` (CPU).
fn generate(variant: &str, prompt: &str, flags: &[&str]) -> Value {
    let dir = models().join(variant);
    let max = MAX_TOKENS.to_string();
    let mut args = vec!["generate", "--device", "cpu", "--model", dir.to_str().unwrap(), "--prompt", prompt, "--max-tokens", &max];
    args.extend(["--output", "json"]);
    args.extend(flags);
    let o = common::mlx_gen(&args, None);
    assert!(o.status.success(), "{variant} {flags:?}: mlx-gen failed:\n{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("mlx-gen JSON")
}

#[test]
fn variants_are_covered() {
    let text = std::fs::read_to_string(models().join("variants.json")).expect("variants.json");
    let built: serde_json::Map<String, Value> = serde_json::from_str(&text).expect("variants.json object");
    let mut built: Vec<&str> = built.keys().map(String::as_str).collect();
    built.sort_unstable();
    let mut tested = VARIANTS.to_vec();
    tested.sort_unstable();
    assert_eq!(built, tested, "the tests must cover exactly the variants make_llama4_mistral3.py builds");
}

/// Greedy tokens, text and prompt logits of every variant, with and without the chat template.
#[test]
fn tokens_and_logits_equal_mlx_lm() {
    let cases: Vec<(&str, &str, bool)> =
        VARIANTS.iter().flat_map(|v| [(*v, CHAT_PROMPT, false), (*v, RAW_PROMPT, true)]).collect();
    let json_cases: Vec<Value> = cases
        .iter()
        .map(|(v, p, raw)| json!({"model": models().join(v), "prompt": p, "max_tokens": MAX_TOKENS, "ignore_chat_template": raw}))
        .collect();
    let refs = common::batched_reference("batch_reference.py", &json_cases);
    for ((variant, prompt, raw), r) in cases.iter().zip(&refs) {
        let case = format!("{variant} (prompt {prompt:?}, ignore_chat_template={raw})");
        let (ref_prompt, ref_tokens) = (ids(&r["prompt_ids"]), ids(&r["tokens"]));
        let flags: &[&str] = if *raw { &["--ignore-chat-template"] } else { &[] };
        let o = generate(variant, prompt, flags);
        assert_eq!(ids(&o["tokens"]), ref_tokens, "{case}: generated tokens differ from mlx-lm's");
        assert_eq!(o["text"], r["text"], "{case}: text differs from mlx-lm's");
        assert_eq!(o["prompt_tokens"].as_u64(), Some(ref_prompt.len() as u64), "{case}: prompt_tokens");

        let ref_logits: Vec<f32> = r["logits"].as_array().expect("logits").iter().map(|x| x.as_f64().unwrap() as f32).collect();
        let max_diff = common::assert_prompt_logits(&case, &models().join(variant), &ref_prompt, &ref_logits, !variant.ends_with("-bf16"));
        eprintln!("{case}: {} tokens equal, logits max |diff| {max_diff:e}", ref_tokens.len());
    }
}

/// Chunked prefill, `--max-kv-size` (rotating caches where the model makes none), quantized KV
/// caches (Llama 4's global layers; its chunked ones stay float, as mlx-lm's) and prompt-cache
/// files written by either tool, against mlx-lm's generate and cache_prompt (cache_reference.py).
#[test]
fn caches_equal_mlx_lm() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("llama4-mistral3-caches-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let file = |who: &str, v: &str| tmp.join(format!("{who}-{v}.safetensors")).to_str().unwrap().to_owned();
    let mut cases: Vec<(&str, Vec<String>)> = [
        ("ministral3-f32", "--prefill-step-size 5"),
        ("mistral3-f32", "--max-kv-size 20 --prefill-step-size 7"),
        ("mistral3-f32", "--kv-bits 4 --kv-group-size 32 --quantized-kv-start 10 --prefill-step-size 6"),
        ("llama4_text-f32", "--max-kv-size 20"),
        ("llama4-f32", "--prefill-step-size 5"),
        ("llama4-q4", "--kv-bits 8 --kv-group-size 32 --quantized-kv-start 0 --prefill-step-size 9"),
    ]
    .iter()
    .map(|(v, f)| (*v, f.split_whitespace().map(str::to_owned).collect()))
    .collect();
    let mut py_ops = Vec::new();
    for v in ["llama4-f32", "ministral3-f32"] {
        let ours = file("ours", v);
        let dir = models().join(v);
        let args = ["cache-prompt", "--device", "cpu", "--model", dir.to_str().unwrap(), "--prompt", CHAT_PROMPT, "--prompt-cache-file", &ours];
        let o = common::mlx_gen(&args, None);
        assert!(o.status.success(), "cache-prompt {v}: {}", String::from_utf8_lossy(&o.stderr));
        py_ops.push(json!({"op": "cache_prompt", "model": dir, "prompt": CHAT_PROMPT, "prompt_cache_file": file("theirs", v)}));
        for who in ["ours", "theirs"] {
            cases.push((v, vec!["--prompt-cache-file".into(), file(who, v)]));
        }
    }
    let mut all = py_ops.clone();
    for (v, flags) in &cases {
        let mut c = json!({"op": "generate", "model": models().join(v), "prompt": CHAT_PROMPT, "max_tokens": MAX_TOKENS});
        for pair in flags.chunks(2) {
            let key = pair[0].trim_start_matches("--").replace('-', "_");
            c[key] = pair[1].parse::<i64>().map(Value::from).unwrap_or_else(|_| Value::from(pair[1].clone()));
        }
        all.push(c);
    }
    let refs = common::batched_reference("cache_reference.py", &all);
    for ((variant, flags), r) in cases.iter().zip(&refs[py_ops.len()..]) {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let o = generate(variant, CHAT_PROMPT, &flags);
        assert_eq!(ids(&o["tokens"]), ids(&r["tokens"]), "{variant} {flags:?}: tokens differ from mlx-lm's");
        eprintln!("{variant} {flags:?}: {} tokens equal", ids(&r["tokens"]).len());
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `mlx-gen convert -q --q-group-size 32 --dtype float32` of each Hugging Face checkpoint equals
/// the folder `mlx_lm.convert` wrote with the same flags, tensor for tensor.
#[test]
fn convert_equals_mlx_lm() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("llama4-mistral3-convert-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    for v in VARIANTS.iter().filter(|v| v.ends_with("-f32")) {
        let (src, ours, theirs) = (models().join(v), tmp.join(v), models().join(v.replace("-f32", "-q4")));
        let args = ["convert", "--model", src.to_str().unwrap(), "--mlx-path", ours.to_str().unwrap(), "-q", "--q-group-size", "32", "--dtype", "float32"];
        let o = common::mlx_gen(&args, None);
        assert!(o.status.success(), "{v}: convert failed:\n{}", String::from_utf8_lossy(&o.stderr));
        let out = Command::new(common::venv_python())
            .arg(common::oracle_dir().join("convert_compare.py"))
            .args([&ours, &theirs])
            .stdin(Stdio::null())
            .output()
            .expect("run convert_compare.py");
        assert!(out.status.success(), "convert_compare.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let r: Value = serde_json::from_slice(&out.stdout).expect("convert_compare.py JSON");
        assert_eq!(r["ok"], true, "{v}: convert differs from mlx_lm.convert: {}", r["problems"]);
        eprintln!("{v}: {} tensors equal to mlx_lm.convert's", r["tensors"]);
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Speculative decoding (a draft model, and prompt lookup) keeps the target's greedy tokens, with
/// chunked caches trimmed after rejected drafts, and with ministral3's rotating windows (12
/// positions, passed by the prompt), which cannot be trimmed once wrapped (mlx-lm's trim then does
/// nothing and its speculation goes on over a wrong cache): they are put back and the accepted
/// tokens run again. Also a draft model whose own windows wrap, and `--max-kv-size`.
#[test]
fn speculative_keeps_greedy_tokens() {
    for (target, draft) in [
        ("llama4-f32", "llama4_text-f32"),
        ("mistral3-f32", "llama4_text-q4"),
        ("ministral3-f32", "llama4_text-q4"),
        ("llama4_text-f32", "ministral3-q4"),
    ] {
        let plain = generate(target, CHAT_PROMPT, &[]);
        let d = models().join(draft);
        for k in ["2", "5"] {
            let with_draft = generate(target, CHAT_PROMPT, &["--draft-model", d.to_str().unwrap(), "--num-draft-tokens", k]);
            assert_eq!(ids(&with_draft["tokens"]), ids(&plain["tokens"]), "{target} with draft {draft}, K={k}");
        }
        let lookup = generate(target, CHAT_PROMPT, &["--prompt-lookup", "2"]);
        assert_eq!(ids(&lookup["tokens"]), ids(&plain["tokens"]), "{target} with prompt lookup");
    }
    let plain = generate("ministral3-f32", CHAT_PROMPT, &["--max-kv-size", "20"]);
    let lookup = generate("ministral3-f32", CHAT_PROMPT, &["--max-kv-size", "20", "--prompt-lookup", "1", "--num-draft-tokens", "4"]);
    assert_eq!(ids(&lookup["tokens"]), ids(&plain["tokens"]), "ministral3 --max-kv-size 20 with prompt lookup");
}

/// Runs `prompts` through one batch engine (the second joins at step 5, the others at once), 24
/// tokens each; returns each one's tokens.
fn batched(m: &LoadedModel, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let mut engine = BatchEngine::new(m.model.as_ref(), 8, None);
    let mut got = vec![Vec::new(); prompts.len()];
    let mut step = 0;
    while step <= 5 || !engine.is_idle() {
        for (i, p) in prompts.iter().enumerate().filter(|(i, _)| step == if *i == 1 { 5 } else { 0 }) {
            engine.add(i as u64, p.clone(), SeqParams { sampler: SamplerConfig::default(), keys: None, logprobs: false }).unwrap();
        }
        for t in engine.step().unwrap() {
            let v = &mut got[t.id as usize];
            v.push(t.token);
            if v.len() == 24 {
                engine.finish(t.id);
            }
        }
        step += 1;
        assert!(step < 1000, "the batch never finished");
    }
    got
}

/// The batch engine gives each sequence its tokens alone: mistral3 (default caches) decodes its
/// rows together at different positions (two with the same prompt); ministral3 (rotating caches) and llama4 (chunked caches),
/// whose caches cannot be merged, run them one after another in their own caches.
#[test]
fn batching() {
    // The last is the first again (a request's second choice: it shares the first's prefill where
    // rows can be merged, and runs after it where they cannot).
    let prompts: [Vec<u32>; 4] = [(1..30).collect(), (40..47).collect(), (100..118).collect(), (1..30).collect()];
    for v in ["mistral3-f32", "ministral3-f32", "llama4-f32"] {
        let m = LoadedModel::load(&models().join(v)).unwrap();
        let alone: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| {
                let config = GenerateConfig { max_tokens: Some(24), ..GenerateConfig::default() };
                Generator::new(m.model.as_ref(), p, m.model.make_cache(), config).unwrap().map(|g| g.unwrap().token).collect()
            })
            .collect();
        assert_eq!(batched(&m, &prompts), alone, "{v}: batched sequences differ from their runs alone");
    }
}

/// A llama4 config with two experts per token is refused in one line (mlx-lm asserts top-1).
#[test]
fn refusals() {
    let dir = models().join("llama4-f32");
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("llama4-top2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    common::copy_dir(&dir, &tmp);
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(tmp.join("config.json")).unwrap()).unwrap();
    cfg["text_config"]["num_experts_per_tok"] = json!(2);
    std::fs::write(tmp.join("config.json"), cfg.to_string()).unwrap();
    let o = common::mlx_gen(&["generate", "--device", "cpu", "--model", tmp.to_str().unwrap(), "--prompt", "Hi"], None);
    common::assert_error(&o, 1, &["1 expert per token"]);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `chat` over several turns: mistral3's default caches are trimmed back to the common prefix and
/// reused; ministral3's rotating caches (past their window) and llama4's chunked ones (past their
/// chunk) cannot be trimmed back, so each turn starts over rather than failing.
#[test]
fn chat_turns() {
    for (v, reuses) in [("mistral3-f32", true), ("ministral3-f32", false), ("llama4-f32", false)] {
        let dir = models().join(v);
        let args = ["chat", "--device", "cpu", "--model", dir.to_str().unwrap(), "--max-tokens", "8", "--verbose"];
        let o = common::mlx_gen(&args, Some(b"hello there\nwhat now\nand then?\n"));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{v}: chat failed:\n{stderr}");
        let all = format!("{}{stderr}", String::from_utf8_lossy(&o.stdout));
        let reused: Vec<usize> = all
            .lines()
            .filter_map(|l| l.split(" tokens processed, ").nth(1))
            .map(|r| r.split(' ').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(reused.len(), 3, "{v}: want one --verbose line per turn:\n{all}");
        assert_eq!(reused[0], 0, "{v}: the first turn has nothing cached");
        assert_eq!(reused[1..].iter().all(|&r| r > 0), reuses, "{v}: reused {reused:?}");
    }
}
