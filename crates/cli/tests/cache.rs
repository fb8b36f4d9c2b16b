//! KV cache oracle tests: rotating (`--max-kv-size`, sliding-window layers), quantized (`--kv-bits`)
//! and prompt-cache files give mlx-lm 0.32.2's tokens; the paged cache gives the growing one's (and
//! the rotating one's, its windows being rings of blocks) and shares a common prefix's memory. All Python references run in one process (cache_reference.py).
mod common;

use engine::cache::{KvCache, PagedPool};
use engine::{GenerateConfig, Generator, LoadedModel};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const LONG: &str = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen \
                    sixteen seventeen eighteen nineteen twenty and then some more words to make it long";
const SHORT: &str = "Tell me a story about a cat.";

/// Runs cache_reference.py once over all `cases`.
fn python_reference(cases: &[Value]) -> Vec<Value> {
    common::batched_reference("cache_reference.py", cases)
}

/// Our `generate --output json` tokens.
fn ours(model: &Path, prompt: &str, max_tokens: usize, flags: &[String]) -> Vec<u64> {
    let m = max_tokens.to_string();
    let mut args = vec!["generate", "--device", "cpu", "--model", model.to_str().unwrap(), "-p", prompt, "-m", &m, "--output", "json"];
    args.extend(flags.iter().map(String::as_str));
    let out = common::mlx_gen(&args, None);
    assert!(out.status.success(), "mlx-gen {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    v["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect()
}

/// A copy of llama3-f32 whose first layer is sliding-window attention (window 12).
fn sliding_llama(dir: &Path) -> PathBuf {
    let dst = dir.join("llama3-sliding");
    common::copy_dir(&common::model("llama3-f32"), &dst);
    let p = dst.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    c["layer_types"] = json!(["sliding_attention", "full_attention"]);
    c["sliding_window"] = json!(12);
    std::fs::write(&p, c.to_string()).unwrap();
    dst
}

/// One generation: our flags and the same settings for mlx-lm.
struct Case {
    name: String,
    model: PathBuf,
    prompt: &'static str,
    max_tokens: usize,
    flags: Vec<String>,
    py: Value,
}

fn case(name: &str, model: &Path, prompt: &'static str, max_tokens: usize, flags: &str, py: Value) -> Case {
    let mut full = json!({"op": "generate", "model": model, "prompt": prompt, "max_tokens": max_tokens});
    for (k, v) in py.as_object().unwrap() {
        full[k] = v.clone();
    }
    let flags = flags.split_whitespace().map(str::to_owned).collect();
    Case { name: name.to_owned(), model: model.to_owned(), prompt, max_tokens, flags, py: full }
}

#[test]
fn rotating_quantized_and_prompt_cache_files_match_mlx_lm() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cache-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let sliding = sliding_llama(&tmp);
    let (qwen3, qwen2, llama, h128) =
        (common::model("qwen3-f32"), common::model("qwen2-f32"), common::model("llama3-f32"), common::model("llama-h128-f32"));
    let raw = json!({"ignore_chat_template": true});
    let with = |extra: Value| {
        let mut v = raw.clone();
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    let mut cases = vec![
        // Window 24 with a 30-token prompt in chunks of 7 and 80 tokens: wraps several times.
        case("qwen3 rotating 24", &qwen3, LONG, 80, "--ignore-chat-template --max-kv-size 24 --prefill-step-size 7",
             with(json!({"max_kv_size": 24, "prefill_step_size": 7}))),
        case("qwen2 rotating 16 one chunk", &qwen2, LONG, 70, "--ignore-chat-template --max-kv-size 16",
             with(json!({"max_kv_size": 16}))),
        case("qwen3 rotating 40 short prompt", &qwen3, SHORT, 120, "--max-kv-size 40", json!({"max_kv_size": 40})),
        case("qwen3 rotating seeded", &qwen3, LONG, 60, "--ignore-chat-template --max-kv-size 20 --prefill-step-size 9 --temp 1 --seed 7",
             with(json!({"max_kv_size": 20, "prefill_step_size": 9, "temp": 1.0, "seed": 7}))),
        // llama makes its own caches (mlx-lm ignores --max-kv-size there): a sliding layer of 12.
        case("llama sliding layer", &sliding, LONG, 60, "--ignore-chat-template --prefill-step-size 5",
             with(json!({"prefill_step_size": 5}))),
        case("llama sliding seeded", &sliding, SHORT, 50, "--temp 1 --seed 3", json!({"temp": 1.0, "seed": 3})),
        case("llama --max-kv-size ignored", &llama, LONG, 40, "--ignore-chat-template --max-kv-size 16",
             with(json!({"max_kv_size": 16}))),
    ];
    for bits in [4, 8] {
        for (name, model) in [("qwen3", &qwen3), ("llama-h128", &h128)] {
            cases.push(case(&format!("{name} kv-bits {bits} from prefill"), model, LONG, 40,
                &format!("--ignore-chat-template --kv-bits {bits} --kv-group-size 32 --quantized-kv-start 10 --prefill-step-size 6"),
                with(json!({"kv_bits": bits, "kv_group_size": 32, "quantized_kv_start": 10, "prefill_step_size": 6}))));
            cases.push(case(&format!("{name} kv-bits {bits} in decode seeded"), model, SHORT, 40,
                &format!("--kv-bits {bits} --kv-group-size 32 --quantized-kv-start 60 --temp 1 --seed 6"),
                json!({"kv_bits": bits, "kv_group_size": 32, "quantized_kv_start": 60, "temp": 1.0, "seed": 6})));
        }
    }
    // Prompt-cache files, each tool reading the other's.
    let file = |n: &str| tmp.join(format!("{n}.safetensors"));
    let ours_files = [("plain", &qwen3, ""), ("rotating", &qwen2, "--max-kv-size 24"), ("q8", &qwen3, "--kv-bits 8 --kv-group-size 32 --quantized-kv-start 0")];
    let mut py_ops = Vec::new();
    for (n, model, flags) in ours_files {
        let f = file(&format!("ours-{n}"));
        let mut args = vec!["cache-prompt", "--device", "cpu", "--model", model.to_str().unwrap(), "--prompt", LONG, "--prompt-cache-file", f.to_str().unwrap()];
        args.extend(flags.split_whitespace());
        let out = common::mlx_gen(&args, None);
        assert!(out.status.success(), "cache-prompt {n}: {}", String::from_utf8_lossy(&out.stderr));
        let theirs = file(&format!("theirs-{n}"));
        let mut op = json!({"op": "cache_prompt", "model": model, "prompt": LONG, "prompt_cache_file": theirs});
        for (k, v) in flags.split_whitespace().collect::<Vec<_>>().chunks(2).map(|p| (p[0].trim_start_matches("--").replace('-', "_"), p[1])) {
            op[k] = json!(v.parse::<i64>().unwrap());
        }
        py_ops.push(op);
        let gen_flags = if n == "q8" { "--kv-group-size 32" } else { "" };
        let py_extra = if n == "q8" { json!({"kv_group_size": 32}) } else { json!({}) };
        for (who, path) in [("ours", &f), ("theirs", &theirs)] {
            let mut py = py_extra.clone();
            py["prompt_cache_file"] = json!(path);
            cases.push(case(&format!("{n} prompt cache written by {who}"), model, SHORT, 40,
                &format!("{gen_flags} --prompt-cache-file {}", path.display()), py));
        }
    }
    let mut all = py_ops.clone();
    all.extend(cases.iter().map(|c| c.py.clone()));
    let refs = python_reference(&all);
    for (c, r) in cases.iter().zip(&refs[py_ops.len()..]) {
        let theirs: Vec<u64> = r["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
        let mine = ours(&c.model, c.prompt, c.max_tokens, &c.flags);
        assert_eq!(mine, theirs, "{}: tokens differ from mlx-lm's", c.name);
        eprintln!("{}: {} tokens equal", c.name, mine.len());
        if c.name.contains("rotating") || c.name.contains("sliding") || c.name.contains("from prefill") {
            assert!(mine.len() >= c.max_tokens / 2, "{}: too short to exercise the cache ({} tokens)", c.name, mine.len());
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn paged_cache_generates_the_growing_caches_tokens() {
    for model in ["qwen3-f32", "llama3-f32", "qwen2-q4g32"] {
        let dir = common::model(model);
        let a = ours(&dir, LONG, 300, &["--ignore-chat-template".into(), "--prefill-step-size".into(), "13".into()]);
        let flags: Vec<String> = "--ignore-chat-template --prefill-step-size 13 --kv-cache paged".split(' ').map(Into::into).collect();
        assert_eq!(ours(&dir, LONG, 300, &flags), a, "{model}: paged tokens differ");
    }
}

/// `--max-kv-size` (and sliding-window layers) with `--kv-cache paged`: each window is a ring of
/// blocks, and the tokens are the rotating cache's (which are mlx-lm's, see above) while prompt and
/// generation wrap the window several times, with blocks that do and do not divide the window.
#[test]
fn paged_rings_give_the_rotating_caches_tokens() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("paged-ring-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let sliding = sliding_llama(&tmp);
    let (qwen3, qwen2) = (common::model("qwen3-f32"), common::model("qwen2-f32"));
    let mla = common::deepseek_model("dsv3-f32");
    let cases: &[(&str, &Path, &str, usize, &str)] = &[
        ("deepseek_v3 MLA window 24", &mla, LONG, 60, "--ignore-chat-template --max-kv-size 24 --prefill-step-size 7"),
        ("qwen3 window 24, chunks of 7", &qwen3, LONG, 80, "--ignore-chat-template --max-kv-size 24 --prefill-step-size 7"),
        ("qwen2 window 16, prompt longer than it", &qwen2, LONG, 70, "--ignore-chat-template --max-kv-size 16"),
        ("qwen3 window 40", &qwen3, SHORT, 120, "--max-kv-size 40"),
        ("qwen3 window 20 seeded", &qwen3, LONG, 60, "--ignore-chat-template --max-kv-size 20 --prefill-step-size 9 --temp 1 --seed 7"),
        ("llama sliding layer of 12", &sliding, LONG, 60, "--ignore-chat-template --prefill-step-size 5"),
    ];
    for (name, model, prompt, n, flags) in cases {
        let flags: Vec<String> = flags.split(' ').map(Into::into).collect();
        let want = ours(model, prompt, *n, &flags);
        assert!(want.len() >= n / 2, "{name}: too short to wrap the window ({} tokens)", want.len());
        for block in ["4", "5", "256"] {
            let mut paged = flags.clone();
            paged.extend(["--kv-cache", "paged", "--kv-block-size", block].map(String::from));
            assert_eq!(ours(model, prompt, *n, &paged), want, "{name}: paged blocks of {block} give other tokens");
        }
        eprintln!("{name}: {} tokens equal with rings of 4, 5 and 256-position blocks", want.len());
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Combinations the paged cache cannot serve fail with one clear line.
#[test]
fn paged_cache_refuses_what_it_cannot_do() {
    let model = common::model("qwen3-f32");
    let m = model.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "--device", "cpu", "--model", m, "-p", "hi", "-m", "2", "--kv-cache", "paged"];
        args.extend(extra);
        common::mlx_gen(&args, None)
    };
    common::assert_error(&run(&["--kv-bits", "4"]), 1, &["--kv-cache paged", "--kv-bits"]);
    common::assert_error(&run(&["--kv-block-size", "0"]), 1, &["--kv-block-size"]);
    let file = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("paged-refuse-{}.safetensors", std::process::id()));
    common::assert_error(&run(&["--prompt-cache-file", file.to_str().unwrap()]), 1, &["--kv-cache paged", "--prompt-cache-file"]);
}

fn greedy(loaded: &LoadedModel, prompt: &[u32], cache: Vec<Box<dyn KvCache>>, n: usize) -> (Vec<u32>, Vec<Box<dyn KvCache>>) {
    let config = GenerateConfig { max_tokens: Some(n), ..GenerateConfig::default() };
    let mut g = Generator::new(loaded.model.as_ref(), prompt, cache, config).expect("generator");
    let tokens = g.by_ref().map(|s| s.expect("step").token).collect();
    (tokens, g.into_cache())
}

/// Four sequences sharing a 1,000-token prefix: the paged pool holds the prefix once, tokens equal.
#[test]
fn shared_prefix_takes_less_memory_than_four_caches() {
    let loaded = LoadedModel::load(&common::model("qwen3-f32")).expect("load");
    let prefix: Vec<u32> = (0..1000u32).map(|i| (i * 37 + 11) % 480).collect();
    let prompts: Vec<Vec<u32>> = (0..4u32).map(|s| prefix.iter().copied().chain([s + 1, s + 2, s + 3]).collect()).collect();
    let (mut growing_bytes, mut expected) = (0, Vec::new());
    for p in &prompts {
        let (t, cache) = greedy(&loaded, p, loaded.model.make_cache(), 8);
        growing_bytes += cache.iter().map(|c| c.nbytes()).sum::<usize>();
        expected.push(t);
    }
    let pool = PagedPool::new(loaded.model.make_cache().len(), 16, 1 << 30);
    let mut held = Vec::new();
    for (p, want) in prompts.iter().zip(&expected) {
        let (cache, reused) = pool.new_sequence(p);
        let (t, cache) = greedy(&loaded, &p[reused..], cache, 8);
        assert_eq!(&t, want, "paged with a shared prefix ({reused} reused) gives other tokens");
        held.push(cache);
    }
    let paged_bytes = pool.nbytes();
    let (used, _, seqs) = pool.usage();
    eprintln!("4 sequences, 1,000-token shared prefix: growing caches {growing_bytes} bytes, paged pool {paged_bytes} bytes ({used} blocks of 16 in use)");
    assert_eq!(seqs, 4);
    assert!(paged_bytes * 2 < growing_bytes, "the paged pool ({paged_bytes}) should hold the prefix once (growing: {growing_bytes})");
    drop(held);
    assert_eq!(pool.usage().0, 0, "blocks still held after every sequence ended");
}
