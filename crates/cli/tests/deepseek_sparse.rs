//! Oracle tests for DeepSeek sparse attention, `deepseek_v32` and `deepseek_v41`
//! (tests/oracle/make_deepseek_sparse.py: tiny random models whose indexer keeps fewer keys or
//! groups than the prompts and generations hold; V3.2 in float32, mlx-lm's 4-bit (float32,
//! bfloat16) and mixed-precision conversions and FP8 as published; V4.1 in float32, 4-bit, and as
//! published: DeepSeek's names, FP8 / FP4 weights kept packed as mxfp8 / mxfp4):
//! `mlx-gen generate` gives Python mlx-lm 0.32.2's greedy tokens and text (64 tokens) and prompt
//! logits within 1e-5 (float32; 1e-2 x the logit range for bfloat16); seeded sampling gives
//! mlx-lm's tokens and log-probabilities. V3.2's layer caches (latent KV + indexer keys, mlx-lm's
//! `CacheList`) continue across prompt-cache files both ways, chat turns and speculative decoding;
//! tensor and pipeline parallel on 2 ranks equal one process; `mlx-gen convert` equals
//! `mlx_lm.convert`. V4.1's untrimmable layer caches refuse prompt files, as mlx-lm's, and are put back after rejected drafts;
//! its tensor and pipeline parallel equal one process. Both: chunked prefill as mlx-lm's, and
//! `serve` answering concurrent requests as `generate`; V3.2's continuous batching equals each
//! sequence alone.
//! Needs the oracle venv (scripts/oracle-venv.sh); fails, never skips, when it cannot be made.

mod common;
mod dist;
mod server_harness;

use serde_json::Value;
use std::path::PathBuf;

const MAX_TOKENS: usize = 64;
/// With the template's default system prompt: 47 tokens, above every variant's index_topk.
const CHAT_PROMPT: &str = "Hello, how are you?";
const RAW_PROMPT: &str = "The capital of France is";
const VARIANTS: &[&str] = &[
    "dsv32-f32",
    "dsv32-fp8",
    "dsv32-interleave-f32",
    "dsv32-mixed",
    "dsv32-q4g32",
    "dsv32-q4g32-bf16",
    "dsv41-f32",
    "dsv41-fp8",
    "dsv41-q4g32",
    "dsv41-sigmoid-f32",
];

fn info() -> Value {
    let path = common::deepseek_sparse_models_dir().join("variants.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("variants.json")).expect("variants.json object")
}

fn model(name: &str) -> PathBuf {
    let d = common::deepseek_sparse_models_dir().join(name);
    assert!(d.join("config.json").is_file(), "variant {name} missing from {}", d.display());
    d
}

fn generate_json(args: &[&str], what: &str) -> Value {
    let o = common::mlx_gen(args, None);
    assert!(o.status.success(), "{what}: mlx-gen failed:\n{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{what}: not JSON: {e}"))
}

#[test]
fn variants_are_covered() {
    let built = info();
    let mut built: Vec<&str> = built.as_object().unwrap().keys().map(String::as_str).collect();
    built.sort_unstable();
    assert_eq!(built, VARIANTS, "the tests must cover exactly the variants make_deepseek_sparse.py builds");
}

#[test]
fn deepseek_v32() {
    let info = info();
    for v in VARIANTS.iter().filter(|v| v.starts_with("dsv32")) {
        let f32 = info[v]["dtype"] == "float32";
        let n = common::check_against_reference(&model(v), f32, CHAT_PROMPT, false, MAX_TOKENS);
        let topk = config(v)["index_topk"].as_u64().unwrap() as usize;
        assert!(n > topk, "{v}: the prompt ({n} tokens) must be longer than index_topk {topk}");
        common::check_against_reference(&model(v), f32, RAW_PROMPT, true, MAX_TOKENS);
    }
}

/// `mlx-gen convert -q` of the float folder equals `mlx_lm.convert -q`'s, tensor for tensor (V3.2:
/// experts stacked, kv_b_proj split; both: the router unquantized, what the cast_predicate names
/// kept in its dtype).
#[test]
fn convert_equals_mlx_lm() {
    let info = info();
    for v in VARIANTS.iter().filter(|v| info[**v]["kind"] == "quantized") {
        let src = model(info[*v]["src"].as_str().unwrap());
        let ours = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("dsv32-convert-{v}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&ours);
        let args = ["convert", "--model", src.to_str().unwrap(), "--mlx-path", ours.to_str().unwrap()];
        let dtype = info[*v]["dtype"].as_str().unwrap();
        let o = common::mlx_gen(&[&args[..], &["-q", "--q-group-size", "32", "--dtype", dtype]].concat(), None);
        assert!(o.status.success(), "{v}: mlx-gen convert failed:\n{}", String::from_utf8_lossy(&o.stderr));
        common::assert_same_model_folder(&ours, &model(v));
        let _ = std::fs::remove_dir_all(&ours);
        eprintln!("{v}: mlx-gen convert equals mlx_lm.convert");
    }
}

/// Hyper-connections, the window, the compressor and the indexer: 64 greedy tokens and the prompt
/// logits as mlx-lm's, the prompts longer than the window and holding more groups than index_topk.
#[test]
fn deepseek_v41() {
    for v in VARIANTS.iter().filter(|v| v.starts_with("dsv41")) {
        let n = common::check_against_reference(&model(v), true, CHAT_PROMPT, false, MAX_TOKENS);
        let text = &config(v)["text_config"];
        let (window, topk) = (text["sliding_window"].as_u64().unwrap() as usize, text["index_topk"].as_u64().unwrap() as usize);
        assert!(n > window && n / 4 > topk, "{v}: the prompt ({n} tokens) must pass the window {window} and hold over {topk} groups");
        common::check_against_reference(&model(v), true, RAW_PROMPT, true, MAX_TOKENS);
    }
}

/// What mlx-lm cannot do with deepseek_v41's layer caches fails with one clear line: a prompt-cache
/// file (mlx-lm cannot load a `LayerCache`); so does a config without hyper-connection streams.
#[test]
fn deepseek_v41_refuses_what_its_cache_cannot_do() {
    let dir = model("dsv41-f32");
    let file = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("dsv41-{}.safetensors", std::process::id()));
    let m = dir.to_str().unwrap();
    let cases: [(&[&str], &str); 1] =
        [(&["cache-prompt", "--model", m, "--prompt", "hi", "--prompt-cache-file", file.to_str().unwrap()], "cannot be saved")];
    for (args, needle) in cases {
        let o = common::mlx_gen(args, None);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && stderr.trim().lines().count() == 1 && stderr.contains(needle), "{args:?}: {stderr}");
    }
    assert!(!file.exists(), "no file is left behind");
    // A config that cannot describe the model: one line, no panic.
    let bad = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("dsv41-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&bad);
    common::copy_dir(&dir, &bad);
    let mut cfg = config("dsv41-f32");
    cfg["text_config"]["hc_mult"] = Value::from(0);
    std::fs::write(bad.join("config.json"), cfg.to_string()).unwrap();
    let o = common::mlx_gen(&["generate", "--model", bad.to_str().unwrap(), "--prompt", "hi", "--max-tokens", "2"], None);
    let _ = std::fs::remove_dir_all(&bad);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && stderr.trim().lines().count() == 1 && stderr.contains("positive hc_mult"), "{stderr}");
}

fn config(v: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(model(v).join("config.json")).unwrap()).unwrap()
}

/// The indexer's choice changes the tokens: with index_topk above every length (dense attention)
/// the same weights generate other tokens.
#[test]
fn sparsity_changes_the_tokens() {
    let src = model("dsv32-interleave-f32");
    let dense = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("dsv32-dense-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dense);
    common::copy_dir(&src, &dense);
    let mut cfg = config("dsv32-interleave-f32");
    cfg["index_topk"] = Value::from(4096);
    std::fs::write(dense.join("config.json"), cfg.to_string()).unwrap();
    let max = MAX_TOKENS.to_string();
    let run = |dir: &PathBuf| {
        let args = ["generate", "--model", dir.to_str().unwrap(), "--prompt", CHAT_PROMPT, "--max-tokens", &max, "--output", "json"];
        generate_json(&args, "generate")["tokens"].clone()
    };
    let (sparse, full) = (run(&src), run(&dense));
    let _ = std::fs::remove_dir_all(&dense);
    assert_ne!(sparse, full, "top-8 sparse attention gave the dense attention's tokens");
}

/// `--seed` sampling (temperature, top-p, top-k) equals mlx-lm's, log-probabilities included.
#[test]
fn seeded_sampling_matches_mlx_lm() {
    let mut cases = Vec::new();
    let mut runs = Vec::new();
    for (v, seed) in [("dsv32-f32", 7), ("dsv32-q4g32", 11), ("dsv32-interleave-f32", 3), ("dsv32-fp8", 4), ("dsv41-f32", 5), ("dsv41-q4g32", 2),
        ("dsv41-fp8", 9)] {
        let sampler = serde_json::json!({"temp": 0.9, "top_p": 0.95, "top_k": 40});
        cases.push(serde_json::json!({"model": model(v), "prompt": CHAT_PROMPT, "max_tokens": MAX_TOKENS, "seed": seed,
            "top_logprobs": 0, "sampler": sampler, "processors": {}}));
        runs.push((v, seed));
    }
    let theirs = common::batched_reference("sample_reference.py", &cases);
    for ((v, seed), t) in runs.iter().zip(&theirs) {
        let (dir, seed, max) = (model(v), seed.to_string(), MAX_TOKENS.to_string());
        let args = ["generate", "--model", dir.to_str().unwrap(), "--prompt", CHAT_PROMPT, "--max-tokens", &max, "--seed", &seed];
        let o = generate_json(&[&args[..], &["--temp", "0.9", "--top-p", "0.95", "--top-k", "40", "--logprobs", "--output", "json"]].concat(), v);
        assert_eq!(o["tokens"], t["tokens"], "{v} seed {seed}: sampled tokens differ from mlx-lm's");
        let lp = |x: &Value| x.as_array().unwrap().iter().map(|p| p.as_f64().unwrap()).collect::<Vec<_>>();
        let (a, b) = (lp(&o["logprobs"]), lp(&t["logprobs"]));
        assert_eq!(a.len(), b.len(), "{v}: number of logprobs");
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-5), "{v} seed {seed}: logprobs differ: {a:?} vs {b:?}");
        assert!(a.len() >= MAX_TOKENS / 2, "{v}: only {} tokens sampled", a.len());
        eprintln!("{v} seed {seed}: {} sampled tokens equal", a.len());
    }
}

/// Prompt-cache files both ways (`cache-prompt`, then `generate --prompt-cache-file`): mlx-lm
/// continues from ours and we from mlx-lm's (its `CacheList` of two `KVCache`s), same tokens.
#[test]
fn prompt_cache_files_are_mlx_lms() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("dsv32-prompt-cache-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let (first, then) = (CHAT_PROMPT, "Summarize it.");
    let mut ops = Vec::new();
    let mut runs = Vec::new();
    for v in ["dsv32-interleave-f32", "dsv32-q4g32"] {
        let m = model(v);
        let (ours, theirs) = (tmp.join(format!("{v}-ours.safetensors")), tmp.join(format!("{v}-theirs.safetensors")));
        let args = ["cache-prompt", "--device", "cpu", "--model", m.to_str().unwrap(), "--prompt", first];
        let o = common::mlx_gen(&[&args[..], &["--prompt-cache-file", ours.to_str().unwrap()]].concat(), None);
        assert!(o.status.success(), "{v}: cache-prompt failed:\n{}", String::from_utf8_lossy(&o.stderr));
        ops.push(serde_json::json!({"op": "cache_prompt", "model": m, "prompt": first, "prompt_cache_file": theirs}));
        runs.push((v, m, ours, theirs));
    }
    for (_, m, ours, theirs) in &runs {
        for f in [ours, theirs] {
            ops.push(serde_json::json!({"op": "generate", "model": m, "prompt": then, "max_tokens": MAX_TOKENS, "prompt_cache_file": f}));
        }
    }
    let refs = common::batched_reference("cache_reference.py", &ops);
    for (i, (v, m, ours, theirs)) in runs.iter().enumerate() {
        for (j, (who, f)) in [("ours", ours), ("theirs", theirs)].into_iter().enumerate() {
            let want = &refs[runs.len() + 2 * i + j]["tokens"];
            let max = MAX_TOKENS.to_string();
            let args = ["generate", "--device", "cpu", "--model", m.to_str().unwrap(), "--prompt", then, "--max-tokens", &max];
            let o = generate_json(&[&args[..], &["--output", "json", "--prompt-cache-file", f.to_str().unwrap()]].concat(), v);
            assert_eq!(&o["tokens"], want, "{v}: tokens after the prompt cache written by {who} differ from mlx-lm's");
            assert!(want.as_array().is_some_and(|t| !t.is_empty()), "{v}: mlx-lm generated nothing");
            eprintln!("{v}: prompt cache written by {who}: {} tokens equal", want.as_array().map_or(0, Vec::len));
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Two chat turns: the second prefills only its new tokens (the rest reused from both caches).
#[test]
fn chat_turns_reuse_the_layer_caches() {
    let dir = model("dsv32-interleave-f32");
    let out = common::mlx_gen(&["chat", "--model", dir.to_str().unwrap(), "-m", "24", "--verbose"], Some(b"Hello\nAnd then?\n/exit\n"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let reused: Vec<usize> = stderr
        .lines()
        .filter_map(|l| l.split(" tokens processed, ").nth(1))
        .map(|r| r.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(reused.len(), 2, "two turns: {stderr}");
    assert!(reused[0] == 0 && reused[1] > 16, "the second turn reuses the first's cache (beyond index_topk): {reused:?}");
}

/// Speculative decoding (a draft model, and prompt lookup) keeps the greedy tokens: V3.2 with both
/// caches of every layer trimmed after rejected drafts; V4.1 (beyond mlx-lm, which cannot trim its
/// layer caches and so goes on over wrong ones) with its caches put back and the accepted tokens
/// run again, as the target and as the draft model.
#[test]
fn speculative_decoding_keeps_the_greedy_tokens() {
    for (target, draft) in [("dsv32-interleave-f32", "dsv32-f32"), ("dsv41-f32", "dsv41-q4g32"), ("dsv41-sigmoid-f32", "dsv41-f32")] {
        let (target, draft) = (model(target), model(draft));
        let base = ["generate", "--device", "cpu", "--model", target.to_str().unwrap(), "--prompt", CHAT_PROMPT, "--max-tokens", "48", "--output", "json"];
        let plain = generate_json(&base, "plain");
        for extra in [&["--draft-model", draft.to_str().unwrap(), "--num-draft-tokens", "3"][..], &["--prompt-lookup", "2"][..]] {
            let spec = generate_json(&[&base[..], extra].concat(), "speculative");
            assert_eq!(spec["tokens"], plain["tokens"], "{target:?} {extra:?}: speculative tokens differ from plain greedy ones");
        }
    }
}

/// MLA heads split over 2 ranks (queries, embed_q / unembed_out, o_proj columns), the indexer
/// whole on each, the experts' hidden units split; as mlx-lm's `shard`.
#[test]
fn tp2_deepseek_v32_matches_single_process() {
    dist::sharded_matches_single(&model("dsv32-interleave-f32"), dist::Split::Tensor);
}

#[test]
fn pp2_deepseek_v32_matches_single_process() {
    dist::sharded_matches_single(&model("dsv32-interleave-f32"), dist::Split::Pipeline);
}

/// deepseek_v41: the query heads, whole output groups and their sinks, every expert's hidden
/// units split over 2 ranks (the window, compressor, indexer and hyper-connections whole), as
/// mlx-lm's `shard`.
#[test]
fn tp2_deepseek_v41_matches_single_process() {
    dist::sharded_matches_single(&model("dsv41-f32"), dist::Split::Tensor);
}

/// deepseek_v41 in 2 pipeline stages: the shared state that crosses the boundary (compressed KV,
/// index keys, the indexer's choice and its candidate blocks) travels with the streams.
#[test]
fn pp2_deepseek_v41_matches_single_process() {
    for v in ["dsv41-f32", "dsv41-sigmoid-f32"] {
        dist::sharded_matches_single(&model(v), dist::Split::Pipeline);
    }
}

/// `serve` (deepseek_v32's cache lists batched part by part, deepseek_v41's layer caches one
/// sequence at a time): concurrent chat requests each get the text `generate` gives.
#[test]
fn serve_answers_concurrent_requests_as_generate() {
    for v in ["dsv32-interleave-f32", "dsv41-f32"] {
        let dir = model(v);
        let prompts = ["Hello, how are you?", "The capital of France is", "Tell me a story."];
        let alone: Vec<Value> = prompts
            .iter()
            .map(|p| {
                let args = ["generate", "--model", dir.to_str().unwrap(), "--prompt", p, "--max-tokens", "24", "--output", "json"];
                generate_json(&args, v)["text"].clone()
            })
            .collect();
        let server = server_harness::Server::start(dir.to_str().unwrap(), &[]);
        let answers: Vec<Value> = std::thread::scope(|s| {
            let handles: Vec<_> = prompts
                .iter()
                .map(|p| {
                    let server = &server;
                    s.spawn(move || {
                        let body = serde_json::json!({"messages": [{"role": "user", "content": p}], "max_tokens": 24, "temperature": 0});
                        server.post("/v1/chat/completions", &body)["choices"][0]["message"]["content"].clone()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("request thread")).collect()
        });
        assert_eq!(answers, alone, "{v}: served answers differ from generate's");
        eprintln!("{v}: {} concurrent answers equal generate's", answers.len());
    }
}

/// Chunked prefill (`--prefill-step-size` below the prompt length; `--max-kv-size`, which these
/// models' own caches ignore, as mlx-lm's): the indexer over a partly filled cache, V4.1's window,
/// open compressor groups and index keys carried across chunks, against mlx-lm's generate.
#[test]
fn chunked_prefill_matches_mlx_lm() {
    let cases: &[(&str, &[(&str, i64)])] = &[
        ("dsv32-f32", &[("prefill_step_size", 8)]),
        ("dsv32-interleave-f32", &[("prefill_step_size", 5), ("max_kv_size", 20)]),
        ("dsv41-f32", &[("prefill_step_size", 5)]),
        ("dsv41-sigmoid-f32", &[("prefill_step_size", 7), ("max_kv_size", 16)]),
        ("dsv41-q4g32", &[("prefill_step_size", 3)]),
    ];
    let ops: Vec<Value> = cases
        .iter()
        .map(|(v, flags)| {
            let mut c = serde_json::json!({"op": "generate", "model": model(v), "prompt": CHAT_PROMPT, "max_tokens": MAX_TOKENS});
            for (k, n) in *flags {
                c[*k] = Value::from(*n);
            }
            c
        })
        .collect();
    let refs = common::batched_reference("cache_reference.py", &ops);
    for ((v, flags), r) in cases.iter().zip(&refs) {
        let (dir, max) = (model(v), MAX_TOKENS.to_string());
        let values: Vec<(String, String)> = flags.iter().map(|(k, n)| (format!("--{}", k.replace('_', "-")), n.to_string())).collect();
        let mut args = vec!["generate", "--model", dir.to_str().unwrap(), "--prompt", CHAT_PROMPT, "--max-tokens", &max, "--output", "json"];
        args.extend(values.iter().flat_map(|(k, n)| [k.as_str(), n.as_str()]));
        let o = generate_json(&args, v);
        assert_eq!(o["tokens"], r["tokens"], "{v} {flags:?}: tokens differ from mlx-lm's");
        assert!(r["tokens"].as_array().is_some_and(|t| !t.is_empty()), "{v}: mlx-lm generated nothing");
        eprintln!("{v} {flags:?}: {} tokens equal", r["tokens"].as_array().map_or(0, Vec::len));
    }
}

/// Continuous batching on deepseek_v32: sequences of different lengths (some beyond index_topk)
/// joining at different steps, both parts of each layer's cache list batched (left-padded rows,
/// per-row RoPE offsets, the indexer masked per row), give the greedy tokens each gives alone.
#[test]
fn batched_sequences_match_their_runs_alone() {
    use engine::LoadedModel;
    let m = LoadedModel::load(&model("dsv32-interleave-f32")).unwrap();
    assert!(engine::batch::is_batchable(m.model.as_ref()), "a cache list of KV caches batches");
    let prompts: Vec<Vec<u32>> = [5usize, 40, 17].iter().map(|&n| (0..n as u32).map(|i| (i * 37 + n as u32) % 400 + 3).collect()).collect();
    common::assert_batched_equal_alone(&m, "dsv32-interleave-f32", &prompts, &[0, 0, 4], &[20, 12, 16], 32);
}
