//! The command line itself: `--help`/`--version` start, completions and man page, `bench --json` figures, and every
//! documented user mistake of `chat`, `bench` and the top level (one `error:` line, exit 1, or 2 for usage).
mod common;

use serde_json::Value;
use std::process::Output;

fn run(args: &[&str]) -> Output {
    common::mlx_gen(args, None)
}

fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

use common::assert_error;

#[test]
fn help_and_version_are_quick() {
    for args in [&["--help"][..], &["--version"], &["chat", "--help"], &["bench", "--help"]] {
        let t = std::time::Instant::now();
        let out = run(args);
        assert!(t.elapsed().as_secs_f64() < 2.0, "{args:?} took {:?}", t.elapsed());
        let text = stdout(&out);
        assert!(!text.is_empty(), "{args:?}");
    }
    assert!(stdout(&run(&["--version"])).starts_with("mlx-gen "));
    assert!(stdout(&run(&["--help"])).contains("chat"));
}

#[test]
fn completions_and_man_page() {
    for (shell, marker) in [("bash", "complete"), ("zsh", "#compdef"), ("fish", "complete -c mlx-gen")] {
        let text = stdout(&run(&["completions", shell]));
        assert!(text.contains(marker) && text.contains("chat") && text.contains("max-tokens"), "{shell}: {text}");
    }
    let man = stdout(&run(&["man"]));
    assert!(man.contains(".TH") && man.contains("MLX-GEN-CHAT") && man.contains("hide\\-reasoning"), "{man}");
}

#[track_caller]
fn close(a: f64, b: f64, what: &str) {
    assert!((a - b).abs() <= 0.02 * b.abs().max(1e-9), "{what}: {a} vs {b}");
}

fn bench(batch: usize) {
    let dir = common::model("llama3-f32");
    let (p, g, n) = (24usize, 10usize, 3usize);
    let b = batch.to_string();
    let args = ["bench", "--model", dir.to_str().unwrap(), "-p", "24", "-g", "10", "-n", "3", "-b", &b, "--json"];
    let v: Value = serde_json::from_str(stdout(&run(&args)).trim()).expect("bench --json prints one JSON object");
    assert_eq!((v["prompt_tokens"].as_u64(), v["generation_tokens"].as_u64()), (Some(p as u64), Some(g as u64)));
    assert_eq!(v["batch_size"].as_u64(), Some(batch as u64));
    let load = v["load_s"].as_f64().unwrap();
    assert!(load > 0.0 && load < 60.0, "load_s {load}");
    let l = &v["load"];
    let u = |k: &str| l[k].as_u64().unwrap_or_else(|| panic!("load.{k} missing: {l}"));
    assert!(u("weights_bytes") > 0 && u("tensors_in_place") + u("tensors_copied") > 0, "{l}");
    assert!(u("rss_after_load_bytes") > 0 && u("rss_after_trials_bytes") > 0, "{l}");
    let trials = v["trials"].as_array().unwrap();
    assert_eq!(trials.len(), n);
    for t in trials.iter().chain([&v["median"]]) {
        let f = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {t}"));
        for k in ["load_s", "ttft_s", "prompt_tps", "generation_tps", "peak_memory_gb", "total_s"] {
            assert!(f(k) > 0.0 && f(k).is_finite(), "{k} = {} in {t}", f(k));
        }
        assert!(f("ttft_s") < f("total_s"), "{t}");
    }
    for t in trials {
        let f = |k: &str| t[k].as_f64().unwrap();
        // prompt tok/s is the batch's prompt tokens over the time to the first token; generation tok/s the batch's
        // generated tokens over the time after it.
        close(f("prompt_tps") * f("ttft_s"), (p * batch) as f64, "prompt tokens");
        close(f("generation_tps") * (f("total_s") - f("ttft_s")), (g * batch) as f64, "generated tokens");
    }
    let med = |k: &str| {
        let mut xs: Vec<f64> = trials.iter().map(|t| t[k].as_f64().unwrap()).collect();
        xs.sort_by(f64::total_cmp);
        xs[1]
    };
    for k in ["ttft_s", "prompt_tps", "generation_tps"] {
        assert_eq!(v["median"][k].as_f64().unwrap(), med(k), "median {k}");
    }
}

#[test]
fn bench_json_is_consistent() {
    bench(1);
}

#[test]
fn bench_json_batched() {
    bench(3);
}

/// `bench --memory`: the model's resident bytes are its weights, each phase's KV cache is the
/// growing cache's buffers as the config gives them (256-position steps, as mlx-lm's KVCache), and
/// each peak holds the model and the cache; with -b it is a usage error.
#[test]
fn bench_memory_breakdown() {
    let dir = common::model("llama3-f32");
    let args = ["bench", "--model", dir.to_str().unwrap(), "-p", "300", "-g", "8", "-n", "1", "--memory", "--json"];
    let v: Value = serde_json::from_str(stdout(&run(&args)).trim()).expect("bench --json prints one JSON object");
    let m = &v["memory"];
    let u = |k: &str| m[k].as_u64().unwrap_or_else(|| panic!("memory.{k} missing: {m}"));
    assert_eq!(u("weights_file_bytes"), v["load"]["weights_bytes"].as_u64().unwrap());
    let load_peak = v["load"]["peak_during_load_bytes"].as_u64().unwrap();
    assert!(load_peak >= u("model_bytes"), "the load's peak holds the model: {load_peak} {m}");
    // The weights as loaded (a tensor the model does not use is dropped: a few bytes here).
    assert!(u("model_bytes").abs_diff(u("weights_file_bytes")) * 100 <= u("weights_file_bytes"), "{m}");
    let c: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let n = |k: &str| c[k].as_u64().unwrap();
    let head_dim = c["head_dim"].as_u64().unwrap_or(n("hidden_size") / n("num_attention_heads"));
    // 300 prompt positions + 8 tokens: two 256-position steps of f32 keys and values per layer.
    let kv = n("num_hidden_layers") * 2 * n("num_key_value_heads") * 512 * head_dim * 4;
    for phase in ["prefill", "decode"] {
        let p = &m[phase];
        let b = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("memory.{phase}.{k} missing: {m}"));
        assert_eq!(b("kv_cache_bytes"), kv, "{phase}: {m}");
        assert!(b("peak_bytes") >= u("model_bytes") + kv, "{phase}: {m}");
        assert_eq!(b("transient_bytes"), b("peak_bytes") - u("model_bytes") - kv, "{phase}: {m}");
    }
    // The prefill's transient (attention scores of 299 positions) is above one decode step's.
    assert!(m["prefill"]["transient_bytes"].as_u64() > m["decode"]["transient_bytes"].as_u64(), "{m}");
    let out = run(&["bench", "--model", dir.to_str().unwrap(), "-p", "8", "-g", "2", "-n", "1", "-b", "2", "--memory"]);
    assert_error(&out, 1, &["--memory", "-b"]);
}

/// `bench --pacing`: one more trial's inter-token intervals, their quantiles and the longest ones with
/// the tokens they ended at, in the JSON and as a line of the table output.
#[test]
fn bench_pacing_reports_quantiles_and_the_slowest_tokens() {
    let dir = common::model("llama3-f32");
    let base = ["bench", "--model", dir.to_str().unwrap(), "-p", "8", "-g", "30", "-n", "1", "--pacing"];
    let v: Value = serde_json::from_str(stdout(&run(&[&base[..], &["--json"]].concat())).trim()).expect("bench --json prints one JSON object");
    let p = &v["pacing"];
    assert_eq!(p["tokens"], 30, "{p}");
    let f = |k: &str| p[k].as_f64().unwrap_or_else(|| panic!("pacing.{k} missing: {p}"));
    assert!(0.0 < f("p50_ms") && f("p50_ms") <= f("p99_ms") && f("p99_ms") <= f("max_ms"), "{p}");
    let slowest: Vec<(u64, f64)> = p["slowest"].as_array().expect("pacing.slowest").iter().map(|e| (e[0].as_u64().unwrap(), e[1].as_f64().unwrap())).collect();
    assert_eq!(slowest.len(), 12, "{p}");
    assert!(slowest.windows(2).all(|w| w[0].0 < w[1].0) && slowest.iter().all(|&(i, _)| (1..30).contains(&i)), "token order, within the trial: {p}");
    assert!(slowest.iter().any(|&(_, ms)| ms == f("max_ms")) && slowest.iter().all(|&(_, ms)| ms >= f("p50_ms")), "the longest intervals: {p}");
    assert!(p.get("slowest_split").is_none(), "the host's stages only with MLX_GEN_TRACE: {p}");
    let text = stdout(&run(&base));
    let line = text.lines().find(|l| l.starts_with("Pacing: 30 tokens, inter-token p50=")).unwrap_or_else(|| panic!("no pacing line: {text}"));
    assert!(line.contains("slowest at tokens (ms): ") && !line.contains("graph"), "{line}");
    // With the trace, each of the slowest tokens says how its interval split on the host: building the
    // next step's graph, MLX queueing it, waiting for the token; together at most the interval.
    let traced = std::process::Command::new(env!("CARGO_BIN_EXE_mlx-gen")).args([&base[..], &["--json"]].concat()).env("MLX_GEN_TRACE", "1").output().unwrap();
    let v: Value = serde_json::from_str(stdout(&traced).trim()).expect("bench --json prints one JSON object");
    let p = &v["pacing"];
    let splits = p["slowest_split"].as_array().unwrap_or_else(|| panic!("no slowest_split with MLX_GEN_TRACE: {p}"));
    assert_eq!(splits.len(), 12, "{p}");
    for (split, slow) in splits.iter().zip(p["slowest"].as_array().unwrap()) {
        let parts: Vec<f64> = split.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let interval = slow[1].as_f64().unwrap();
        assert!(parts.len() == 3 && parts.iter().all(|&x| x >= 0.0) && parts.iter().sum::<f64>() <= interval + 1e-6, "{split} of {interval} ms: {p}");
    }
}

#[test]
fn usage_errors_exit_2_in_one_line() {
    assert_error(&run(&["chat", "--no-such-flag"]), 2, &["--no-such-flag", "mlx-gen chat --help"]);
    assert_error(&run(&["bench", "--model", "x", "-p", "many"]), 2, &["many", "mlx-gen bench --help"]);
    assert_error(&run(&["chat", "--model", "x", "--max-kv-size", "3"]), 2, &["max-kv-size"]);
    assert_error(&run(&["frobnicate"]), 2, &["frobnicate"]);
    assert_error(&run(&["completions", "powershell7"]), 2, &["powershell7"]);
    assert_error(&run(&["chat", "--model"]), 2, &["--model"]);
    assert_error(&run(&["generate", "--model", "x", "--output", "xml"]), 2, &["xml"]);
    assert_error(&run(&["--device", "tpu", "bench", "--model", "x"]), 2, &["tpu"]);
}

#[test]
fn user_errors_exit_1_in_one_line() {
    assert_error(&run(&["chat", "--model", "/no/such/model"]), 1, &["/no/such/model"]);
    assert_error(&run(&["bench", "--model", "/no/such/model"]), 1, &["/no/such/model"]);
    let dir = common::model("llama3-f32");
    let d = dir.to_str().unwrap();
    assert_error(&run(&["bench", "--model", d, "-b", "0"]), 1, &["batch-size"]);
    assert_error(&run(&["chat", "--model", d, "--temp", "-1"]), 1, &["temp"]);
    // An architecture mlx-gen does not implement.
    let tmp = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-unsupported-arch");
    common::copy_dir(&dir, &tmp);
    let cfg = tmp.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["model_type"] = "gpt_neox".into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    assert_error(&run(&["chat", "--model", tmp.to_str().unwrap()]), 1, &["gpt_neox", "llama"]);
    assert_error(&run(&["bench", "--model", tmp.to_str().unwrap(), "-n", "1"]), 1, &["gpt_neox"]);
}

/// `MLX_GEN_PREFILL_LOOKAHEAD=N` (the GPU prefill-peak experiment) only changes when the host
/// waits for the device during a long prefill chunk, never a value: the same tokens and
/// log-probabilities as without it, with the waits it adds counted by the trace.
#[test]
fn prefill_lookahead_changes_no_value() {
    let dir = common::model("llama3-f32");
    let prompt = "one two three four five six seven eight nine ten ".repeat(40);
    let args = ["generate", "--model", dir.to_str().unwrap(), "--prompt", &prompt, "-m", "12", "--temp", "0", "--ignore-chat-template", "--top-logprobs", "2", "--output", "json"];
    let gen = |lookahead: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mlx-gen"));
        cmd.args(args).env_remove("MLX_GEN_PREFILL_LOOKAHEAD").env("MLX_GEN_TRACE", "1");
        if let Some(n) = lookahead {
            cmd.env("MLX_GEN_PREFILL_LOOKAHEAD", n);
        }
        let out = cmd.output().expect("run mlx-gen");
        let v: Value = serde_json::from_str(stdout(&out).trim()).expect("generate --output json prints one JSON object");
        // "trace: prefill N positions in C chunks, T ms, W device waits"
        let err = String::from_utf8_lossy(&out.stderr);
        let waits = err.lines().find(|l| l.starts_with("trace: prefill")).and_then(|l| l.split(", ").last()).map(str::to_owned);
        (v["tokens"].clone(), v["logprobs"].clone(), waits)
    };
    let (tokens, logprobs, waits) = gen(None);
    assert!(tokens.as_array().is_some_and(|t| t.len() == 12), "{tokens}");
    assert!(logprobs.as_array().is_some_and(|l| l.len() == 12), "{logprobs}");
    // The test model has 2 layers: a bound of 1 waits once per chunk.
    let (t, l, w) = gen(Some("1"));
    assert_eq!(t, tokens, "MLX_GEN_PREFILL_LOOKAHEAD=1: tokens");
    assert_eq!(l, logprobs, "MLX_GEN_PREFILL_LOOKAHEAD=1: log-probabilities");
    assert_ne!(w, waits, "MLX_GEN_PREFILL_LOOKAHEAD=1: the trace shows no extra wait ({w:?} against {waits:?})");
}
