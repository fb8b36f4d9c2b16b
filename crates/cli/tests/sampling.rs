//! Sampling oracle tests: with a fixed `--seed`, `mlx-gen generate --output json` samples exactly mlx-lm 0.32.2's tokens, with the same logprobs, for every sampler and logits processor; bad values exit with one `error:` line.
//!
//! The reference (tests/oracle/sample_reference.py) runs every case in one Python process, as
//! `mlx_lm.generate --seed` does: seed, load, make_sampler, make_logits_processors, stream_generate.

mod common;

use serde_json::{json, Value};
use std::process::Command;

const MAX_TOKENS: usize = 64;
const TOP_LOGPROBS: usize = 3;
const SEEDS: &[u64] = &[0, 1, 42];
/// Float and quantized (4- and 8-bit, bf16) models of three architectures.
const MODELS: &[&str] = &["llama3-f32", "qwen3-q8g64", "qwen2-q4g32"];
const PROMPT: &str = "Tell me a story about a cat.";

/// One setting: our CLI flags and the same settings as mlx-lm's make_sampler / make_logits_processors.
struct Setting {
    name: &'static str,
    flags: &'static [&'static str],
    sampler: Value,
    processors: Value,
}

fn settings() -> Vec<Setting> {
    let s = |name, flags, sampler, processors| Setting { name, flags, sampler, processors };
    let none = || json!({});
    vec![
        s("temp 1", &["--temp", "1"], json!({"temp": 1.0}), none()),
        s("temp 0.7", &["--temp", "0.7"], json!({"temp": 0.7}), none()),
        s("top_p 0.9", &["--temp", "1", "--top-p", "0.9"], json!({"temp": 1.0, "top_p": 0.9}), none()),
        s("min_p 0.1", &["--temp", "1", "--min-p", "0.1"], json!({"temp": 1.0, "min_p": 0.1}), none()),
        s(
            "min_p 0.3 keep 5",
            &["--temp", "1.5", "--min-p", "0.3", "--min-tokens-to-keep", "5"],
            json!({"temp": 1.5, "min_p": 0.3, "min_tokens_to_keep": 5}),
            none(),
        ),
        s("top_k 8", &["--temp", "1", "--top-k", "8"], json!({"temp": 1.0, "top_k": 8}), none()),
        s(
            "xtc 0.5/0.05",
            &["--temp", "1", "--xtc-probability", "0.5", "--xtc-threshold", "0.05"],
            json!({"temp": 1.0, "xtc_probability": 0.5, "xtc_threshold": 0.05}),
            none(),
        ),
        s(
            "xtc always",
            &["--temp", "0.8", "--xtc-probability", "1"],
            json!({"temp": 0.8, "xtc_probability": 1.0}),
            none(),
        ),
        s(
            "temp 0.7 top_p 0.9 min_p 0.05",
            &["--temp", "0.7", "--top-p", "0.9", "--min-p", "0.05"],
            json!({"temp": 0.7, "top_p": 0.9, "min_p": 0.05}),
            none(),
        ),
        s(
            "top_k 20 + repetition 1.3",
            &["--temp", "0.8", "--top-k", "20", "--repetition-penalty", "1.3"],
            json!({"temp": 0.8, "top_k": 20}),
            json!({"repetition_penalty": 1.3}),
        ),
        s(
            "greedy + repetition 1.5 ctx 10",
            &["--repetition-penalty", "1.5", "--repetition-context-size", "10"],
            json!({"temp": 0.0}),
            json!({"repetition_penalty": 1.5, "repetition_context_size": 10}),
        ),
        s(
            "logit bias",
            &["--temp", "1", "--logit-bias", "7=5.5,100=-inf", "--logit-bias", "3=-2.25"],
            json!({"temp": 1.0}),
            json!({"logit_bias": {"7": "5.5", "100": "-inf", "3": "-2.25"}}),
        ),
        s(
            "greedy + logit bias",
            &["--logit-bias", "12=3.3"],
            json!({"temp": 0.0}),
            json!({"logit_bias": {"12": "3.3"}}),
        ),
        s(
            "presence 0.8",
            &["--temp", "1", "--presence-penalty", "0.8"],
            json!({"temp": 1.0}),
            json!({"presence_penalty": 0.8}),
        ),
        s(
            "frequency 0.6 whole history",
            &["--temp", "0.9", "--frequency-penalty", "0.6", "--frequency-context-size", "0"],
            json!({"temp": 0.9}),
            json!({"frequency_penalty": 0.6, "frequency_context_size": 0}),
        ),
        s(
            "presence -0.5 + frequency 0.3 ctx 40",
            &["--temp", "1", "--presence-penalty", "-0.5", "--frequency-penalty", "0.3", "--frequency-context-size", "40"],
            json!({"temp": 1.0}),
            json!({"presence_penalty": -0.5, "frequency_penalty": 0.3, "frequency_context_size": 40}),
        ),
        s(
            "everything",
            &[
                "--temp", "0.8", "--top-p", "0.95", "--min-p", "0.02", "--min-tokens-to-keep", "3", "--top-k", "30",
                "--xtc-probability", "0.3", "--xtc-threshold", "0.08", "--repetition-penalty", "1.1",
                "--presence-penalty", "0.2", "--presence-context-size", "5", "--frequency-penalty", "0.1",
                "--logit-bias", "9=1.5",
            ],
            json!({"temp": 0.8, "top_p": 0.95, "min_p": 0.02, "min_tokens_to_keep": 3, "top_k": 30,
                   "xtc_probability": 0.3, "xtc_threshold": 0.08}),
            json!({"repetition_penalty": 1.1, "presence_penalty": 0.2, "presence_context_size": 5,
                   "frequency_penalty": 0.1, "logit_bias": {"9": "1.5"}}),
        ),
        s(
            "hot min_p 0.2",
            &["--temp", "2", "--min-p", "0.2"],
            json!({"temp": 2.0, "min_p": 0.2}),
            none(),
        ),
    ]
}

/// Runs sample_reference.py once over all `cases`.
fn python_reference(cases: &[Value]) -> Vec<Value> {
    common::batched_reference("sample_reference.py", cases)
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array().unwrap_or_else(|| panic!("not an array: {v}")).iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// Compares our JSON result with mlx-lm's for one case.
fn check(case: &str, ours: &Value, theirs: &Value) {
    assert_eq!(ours["tokens"], theirs["tokens"], "{case}: sampled tokens differ from mlx-lm's");
    let (a, b) = (f32s(&ours["logprobs"]), f32s(&theirs["logprobs"]));
    assert_eq!(a.len(), b.len(), "{case}: number of logprobs");
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!((x - y).abs() <= 1e-5 || x == y, "{case}: logprob of token {i}: ours {x}, mlx-lm {y}");
    }
    let (ta, tb) = (ours["top_logprobs"].as_array().unwrap(), theirs["top_logprobs"].as_array().unwrap());
    assert_eq!(ta.len(), tb.len(), "{case}: number of top_logprobs entries");
    for (i, (x, y)) in ta.iter().zip(tb).enumerate() {
        let (x, y) = (x.as_array().unwrap(), y.as_array().unwrap());
        assert_eq!(x.len(), TOP_LOGPROBS, "{case}: top_logprobs[{i}] has {} entries", x.len());
        for (p, q) in x.iter().zip(y) {
            assert_eq!(p[0], q[0], "{case}: top_logprobs[{i}] ids: ours {x:?}, mlx-lm {y:?}");
            let (lp, lq) = (p[1].as_f64().unwrap() as f32, q[1].as_f64().unwrap() as f32);
            assert!((lp - lq).abs() <= 1e-5 || lp == lq, "{case}: top_logprobs[{i}]: ours {x:?}, mlx-lm {y:?}");
        }
    }
}

#[test]
fn samplers_and_processors_match_mlx_lm() {
    let settings = settings();
    assert!(settings.len() >= 16);
    let mut cases = Vec::new();
    let mut runs = Vec::new();
    for model in MODELS {
        let dir = common::model(model);
        for st in &settings {
            for &seed in SEEDS {
                cases.push(json!({
                    "model": dir, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "seed": seed,
                    "top_logprobs": TOP_LOGPROBS, "sampler": st.sampler, "processors": st.processors,
                }));
                runs.push((format!("{model} / {} / seed {seed}", st.name), dir.clone(), st.flags, seed));
            }
        }
    }
    // mlx-lm in the background while ours run.
    let reference = std::thread::spawn(move || python_reference(&cases));
    let mut ours = Vec::new();
    for (case, dir, flags, seed) in &runs {
        let (seed, max, top) = (seed.to_string(), MAX_TOKENS.to_string(), TOP_LOGPROBS.to_string());
        let mut args = vec!["generate", "--model", dir.to_str().unwrap(), "--prompt", PROMPT, "--max-tokens", &max];
        args.extend(["--seed", &seed, "--top-logprobs", &top, "--output", "json"]);
        args.extend_from_slice(flags);
        let out = common::mlx_gen(&args, None);
        assert!(out.status.success(), "{case}: mlx-gen {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
        ours.push(serde_json::from_slice::<Value>(&out.stdout).unwrap_or_else(|e| panic!("{case}: not JSON: {e}")));
    }
    let theirs = reference.join().expect("reference thread");
    assert_eq!(theirs.len(), ours.len());
    let mut sampled = 0;
    for ((case, ..), (o, t)) in runs.iter().zip(ours.iter().zip(&theirs)) {
        check(case, o, t);
        sampled += t["tokens"].as_array().unwrap().len();
    }
    // Random models rarely hit EOS: most cases must really sample 64 tokens.
    assert!(sampled >= runs.len() * MAX_TOKENS * 3 / 4, "only {sampled} tokens sampled in {} cases", runs.len());
    eprintln!("{} cases ({} settings x {} seeds x {} models), {sampled} tokens: all equal", runs.len(), settings.len(), SEEDS.len(), MODELS.len());
}

/// The global-key splits mlx-lm's `load` makes, which `--seed` skips, for every model of the matrix.
#[test]
fn load_draws_match_mlx_lm() {
    let names: Vec<String> = common::variants().keys().cloned().collect();
    let script = "import sys, json\nfrom sample_reference import count_draws\n\
                  print(json.dumps([count_draws(d) for d in sys.argv[1:]]))";
    let out = Command::new(common::venv_python())
        .current_dir(common::oracle_dir())
        .args(["-c", script])
        .args(names.iter().map(|n| common::model(n)))
        .output()
        .expect("run python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let theirs: Vec<usize> = serde_json::from_slice(&out.stdout).unwrap();
    for (name, want) in names.iter().zip(theirs) {
        let dir = common::model(name);
        let config: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        let got = engine::sample::init_random_draws(&dir, &config).unwrap();
        assert_eq!(got, want, "{name}: key splits while loading");
    }
}

/// Bad values: exit 1 with one `error:` line (clap's own parse errors: exit 2).
#[test]
fn invalid_values_are_rejected() {
    let dir = common::model("llama3-f32");
    let dir = dir.to_str().unwrap();
    let cases: &[(&[&str], i32, &str)] = &[
        (&["--temp", "-0.5"], 1, "temperature"),
        (&["--temp", "abc"], 2, "abc"),
        (&["--top-p", "1.5"], 1, "top_p"),
        (&["--top-p", "-0.1"], 1, "top_p"),
        (&["--min-p", "2"], 1, "min_p"),
        (&["--min-tokens-to-keep", "0"], 1, "min_tokens_to_keep"),
        (&["--top-k", "-1"], 1, "top_k"),
        (&["--temp", "1", "--top-k", "512"], 1, "vocabulary"),
        (&["--top-k", "x"], 2, "x"),
        (&["--xtc-probability", "1.5"], 1, "xtc_probability"),
        (&["--xtc-threshold", "0.7"], 1, "xtc_threshold"),
        (&["--repetition-penalty", "-1"], 1, "repetition_penalty"),
        (&["--repetition-penalty", "nan"], 1, "repetition_penalty"),
        (&["--presence-penalty", "inf"], 1, "presence_penalty"),
        (&["--frequency-context-size", "-3"], 2, "-3"),
        (&["--logit-bias", "5"], 1, "ID=BIAS"),
        (&["--logit-bias", "x=1"], 1, "token id"),
        (&["--logit-bias", "-4=1"], 1, "token id"),
        (&["--logit-bias", "5=abc"], 1, "not a number"),
        (&["--logit-bias", "5=1,5=2"], 1, "twice"),
        (&["--logit-bias", "99999=1"], 1, "vocabulary"),
    ];
    for (flags, code, needle) in cases {
        let mut args = vec!["generate", "--model", dir, "--prompt", "hi", "--max-tokens", "2"];
        args.extend_from_slice(flags);
        let out = common::mlx_gen(&args, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{flags:?}: panicked:\n{stderr}");
        assert_eq!(out.status.code(), Some(*code), "{flags:?}: exit status (stderr: {stderr})");
        assert!(stderr.starts_with("error:"), "{flags:?}: stderr: {stderr}");
        if *code == 1 {
            assert_eq!(stderr.trim_end().lines().count(), 1, "{flags:?}: one line: {stderr}");
        }
        assert!(stderr.contains(needle), "{flags:?}: {needle:?} not in: {stderr}");
    }
}
