//! Speculative decoding tests: greedy output with a draft model or prompt lookup equals plain output token for token; seeded sampling with a draft model equals mlx-lm 0.32.2's `speculative_generate_step`; bad drafts are refused.
//!
//! The reference (tests/oracle/speculative_reference.py) runs every case in one Python process, as
//! `mlx_lm.generate --seed S --draft-model D` does: seed, load the model, load the draft, sample.

mod common;

use serde_json::{json, Value};

const PROMPT: &str = "Tell me a story about a cat.";

/// `mlx-gen generate --output json` with `flags`; panics on failure.
fn generate(model: &str, max_tokens: usize, flags: &[&str]) -> Value {
    let dir = common::model(model);
    let max = max_tokens.to_string();
    let mut args = vec!["generate", "--model", dir.to_str().unwrap(), "--prompt", PROMPT, "--max-tokens", &max];
    args.extend(["--output", "json"]);
    args.extend_from_slice(flags);
    let out = common::mlx_gen(&args, None);
    assert!(out.status.success(), "mlx-gen {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON: {e}"))
}

/// [`generate`] with the verification pass padded to a multiple of `pad` positions (as on the GPU).
fn generate_padded(model: &str, max_tokens: usize, flags: &[&str], pad: usize) -> Value {
    generate_env(model, max_tokens, flags, &[("MLX_GEN_VERIFY_PAD", &pad.to_string())])
}

/// [`generate`] with environment variables set.
fn generate_env(model: &str, max_tokens: usize, flags: &[&str], env: &[(&str, &str)]) -> Value {
    let dir = common::model(model);
    let max = max_tokens.to_string();
    let mut args = vec!["generate", "--model", dir.to_str().unwrap(), "--prompt", PROMPT, "--max-tokens", &max, "--output", "json"];
    args.extend_from_slice(flags);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mlx-gen"))
        .args(&args)
        .envs(env.iter().copied())
        .output()
        .expect("spawn mlx-gen");
    assert!(out.status.success(), "mlx-gen {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON: {e}"))
}

fn count(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

#[test]
fn greedy_speculation_equals_plain_generation() {
    let draft = |m: &str| common::model(m).to_str().unwrap().to_owned();
    let (q4, qwen2, same) = (draft("llama3-q4g64"), draft("qwen2-f32"), draft("llama3-f32"));
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("4-bit draft, K=3", vec!["--draft-model", &q4]),
        ("4-bit draft, K=5", vec!["--draft-model", &q4, "--num-draft-tokens", "5"]),
        ("4-bit draft, adaptive", vec!["--draft-model", &q4, "--adaptive-draft"]),
        ("unrelated draft (rejections), K=2", vec!["--draft-model", &qwen2, "--num-draft-tokens", "2"]),
        ("the model as its own draft", vec!["--draft-model", &same, "--num-draft-tokens", "4"]),
        ("prompt lookup 3", vec!["--prompt-lookup", "3"]),
        ("prompt lookup 2, K=8", vec!["--prompt-lookup", "2", "--num-draft-tokens", "8"]),
        ("prompt lookup 1, adaptive", vec!["--prompt-lookup", "1", "--adaptive-draft"]),
    ];
    let plain = generate("llama3-f32", 128, &[]);
    assert_eq!(count(&plain, "generation_tokens"), 128, "the plain run must not stop early: {plain}");
    assert!(plain.get("draft_tokens_proposed").is_none(), "no draft statistics without speculation");
    for (name, flags) in &cases {
        // Every round speculative, then with the measured fallback to plain decoding (its first
        // tokens are plain, the rest as the timing decides: the tokens must not depend on it).
        let always = generate("llama3-f32", 128, &[&flags[..], &["--always-speculate"]].concat());
        let spec = generate("llama3-f32", 128, flags);
        for (mode, v) in [("every round speculative", &always), ("with the fallback", &spec)] {
            assert_eq!(v["tokens"], plain["tokens"], "{name}, {mode}: tokens differ from plain greedy generation");
            assert_eq!(v["text"], plain["text"], "{name}, {mode}: text");
        }
        let (proposed, accepted) = (count(&always, "draft_tokens_proposed"), count(&always, "draft_tokens_accepted"));
        assert!(accepted <= proposed, "{name}: {accepted} accepted of {proposed}");
        assert!(accepted > 0, "{name}: no draft token was accepted");
        assert_eq!(count(&always, "plain_fallback_tokens"), 0, "{name}: --always-speculate decoded plainly");
        let fallback = count(&spec, "plain_fallback_tokens");
        assert!(fallback >= 16, "{name}: the fallback measures plain decoding first, {fallback} plain tokens");
        eprintln!("{name}: {accepted}/{proposed} accepted; with the fallback {fallback} of 128 plain");
    }
    // Verification padded to 8 positions (the GPU's default), and to 5 (so that K=8's 9 become 10):
    // the padding changes no token, and the cache is rewound past it.
    for (name, flags) in cases.iter().filter(|(n, _)| n.contains("K=3") || n.contains("K=8") || n.contains("own draft")) {
        for pad in [8, 5] {
            let flags = [&flags[..], &["--always-speculate"]].concat();
            let padded = generate_padded("llama3-f32", 128, &flags, pad);
            assert_eq!(padded["tokens"], plain["tokens"], "{name}, verification padded to {pad}: tokens differ from plain");
        }
    }
    // Pipelined rounds, every round speculative and with the fallback, also with padded
    // verification: prompt lookup queues each round before the one in flight is read, a draft
    // model the next round's first draft step (kept after a full acceptance, taken back out of the
    // draft cache after a rejection: the 4-bit and unrelated drafts reject, the model's own does not).
    let pipelined = |n: &str| n.contains("lookup") || n.contains("K=3") || n.contains("rejections") || n.contains("own draft") || n.contains("adaptive");
    for (name, flags) in cases.iter().filter(|(n, _)| pipelined(n)) {
        for extra in [&["--always-speculate"][..], &[]] {
            let flags = [&flags[..], extra].concat();
            for env in [&[("MLX_GEN_SPEC_PIPELINE", "1")][..], &[("MLX_GEN_SPEC_PIPELINE", "1"), ("MLX_GEN_VERIFY_PAD", "8")]] {
                let v = generate_env("llama3-f32", 128, &flags, env);
                assert_eq!(v["tokens"], plain["tokens"], "{name} {extra:?} {env:?}: tokens differ from plain");
            }
        }
    }
    // With penalties, prompt lookup keeps plain generation's whole token history.
    let pen = ["--repetition-penalty", "1.3", "--frequency-penalty", "0.2", "--frequency-context-size", "0"];
    let plain = generate("llama3-f32", 128, &pen);
    let spec = generate("llama3-f32", 128, &[&pen[..], &["--prompt-lookup", "2", "--num-draft-tokens", "4"]].concat());
    assert_eq!(spec["tokens"], plain["tokens"], "prompt lookup with penalties: tokens differ from plain generation");
    let flags = [&pen[..], &["--prompt-lookup", "2", "--num-draft-tokens", "4"]].concat();
    let padded = generate_padded("llama3-f32", 128, &flags, 8);
    assert_eq!(padded["tokens"], plain["tokens"], "prompt lookup with penalties, padded verification: tokens differ");
}

#[test]
fn max_tokens_is_exact_with_speculation() {
    let q4 = common::model("llama3-q4g64");
    for max in [1, 2, 5, 7] {
        let plain = generate("qwen3-f32", max, &[]);
        let q4 = q4.to_str().unwrap();
        for flags in [
            vec!["--draft-model", q4, "--num-draft-tokens", "3"],
            vec!["--draft-model", q4, "--num-draft-tokens", "3", "--always-speculate"],
            vec!["--prompt-lookup", "2"],
            vec!["--prompt-lookup", "2", "--always-speculate"],
        ] {
            let spec = generate("qwen3-f32", max, &flags);
            assert_eq!(spec["tokens"], plain["tokens"], "max {max} {flags:?}");
            assert_eq!(count(&spec, "generation_tokens"), max as u64, "max {max} {flags:?}");
        }
        for flags in [vec!["--prompt-lookup", "1", "--always-speculate"], vec!["--draft-model", q4, "--num-draft-tokens", "2", "--always-speculate"]] {
            let pipelined = generate_env("qwen3-f32", max, &flags, &[("MLX_GEN_SPEC_PIPELINE", "1")]);
            assert_eq!(pipelined["tokens"], plain["tokens"], "max {max}, pipelined {flags:?}");
            assert_eq!(count(&pipelined, "generation_tokens"), max as u64, "max {max}, pipelined {flags:?}");
        }
    }
}

/// One sampled setting: our flags, and mlx-lm's make_sampler / make_logits_processors arguments.
struct Setting {
    name: &'static str,
    flags: &'static [&'static str],
    sampler: Value,
    processors: Value,
}

/// Runs speculative_reference.py once over all `cases`.
fn python_reference(cases: &[Value]) -> Vec<Value> {
    common::batched_reference("speculative_reference.py", cases)
}

#[test]
fn seeded_speculation_matches_mlx_lm() {
    const MAX_TOKENS: usize = 64;
    let s = |name, flags, sampler, processors| Setting { name, flags, sampler, processors };
    let settings = [
        s("temp 0.7", &["--temp", "0.7"][..], json!({"temp": 0.7}), json!({})),
        s("temp 1 top_p 0.9 min_p 0.05", &["--temp", "1", "--top-p", "0.9", "--min-p", "0.05"], json!({"temp": 1.0, "top_p": 0.9, "min_p": 0.05}), json!({})),
        s("temp 0.8 xtc 0.5 top_k 20", &["--temp", "0.8", "--xtc-probability", "0.5", "--xtc-threshold", "0.05", "--top-k", "20"],
          json!({"temp": 0.8, "xtc_probability": 0.5, "xtc_threshold": 0.05, "top_k": 20}), json!({})),
        s("temp 0.7 + repetition 1.3 ctx 8", &["--temp", "0.7", "--repetition-penalty", "1.3", "--repetition-context-size", "8"],
          json!({"temp": 0.7}), json!({"repetition_penalty": 1.3, "repetition_context_size": 8})),
        s("temp 0.9 + presence/frequency + bias", &["--temp", "0.9", "--presence-penalty", "0.5", "--frequency-penalty", "0.3", "--frequency-context-size", "0", "--logit-bias", "9=1.5"],
          json!({"temp": 0.9}), json!({"presence_penalty": 0.5, "frequency_penalty": 0.3, "frequency_context_size": 0, "logit_bias": {"9": "1.5"}})),
        s("greedy + repetition 1.5", &["--repetition-penalty", "1.5"], json!({"temp": 0.0}), json!({"repetition_penalty": 1.5})),
        s("temp 0.7 + logit bias only", &["--temp", "0.7", "--logit-bias", "12=2"], json!({"temp": 0.7}), json!({"logit_bias": {"12": "2"}})),
    ];
    // (model, draft, K): a 4-bit copy as draft, and an unrelated model of the same vocabulary.
    let pairs = [("llama3-f32", "llama3-q4g64", 3), ("llama3-f32", "qwen2-f32", 2), ("qwen3-q8g64", "qwen3-f32", 4)];
    let mut cases = Vec::new();
    let mut runs = Vec::new();
    for (model, draft, k) in pairs {
        for st in &settings {
            for seed in [0u64, 7] {
                let (dir, ddir) = (common::model(model), common::model(draft));
                cases.push(json!({
                    "model": dir, "draft": ddir, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "seed": seed,
                    "num_draft_tokens": k, "sampler": st.sampler, "processors": st.processors,
                }));
                let mut flags: Vec<String> = st.flags.iter().map(|f| f.to_string()).collect();
                flags.extend(["--draft-model".into(), ddir.to_str().unwrap().into(), "--num-draft-tokens".into(), k.to_string()]);
                flags.extend(["--seed".into(), seed.to_string(), "--logprobs".into()]);
                runs.push((format!("{model} + draft {draft} K={k} / {} / seed {seed}", st.name), model, flags));
            }
        }
    }
    let reference = std::thread::spawn(move || python_reference(&cases));
    let ours: Vec<Value> = runs
        .iter()
        .map(|(_, model, flags)| generate(model, MAX_TOKENS, &flags.iter().map(String::as_str).collect::<Vec<_>>()))
        .collect();
    let theirs = reference.join().expect("reference thread");
    assert_eq!(theirs.len(), ours.len());
    let (mut sampled, mut drafted) = (0, 0);
    for ((case, ..), (o, t)) in runs.iter().zip(ours.iter().zip(&theirs)) {
        assert_eq!(o["tokens"], t["tokens"], "{case}: tokens differ from mlx-lm's");
        let (a, b) = (o["logprobs"].as_array().unwrap(), t["logprobs"].as_array().unwrap());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() <= 1e-5 || x == y, "{case}: logprob of token {i}: ours {x}, mlx-lm {y}");
        }
        let from_draft = t["from_draft"].as_array().unwrap().iter().filter(|b| b.as_bool() == Some(true)).count() as u64;
        if o["finish_reason"] == "length" {
            assert_eq!(count(o, "draft_tokens_accepted"), from_draft, "{case}: accepted draft tokens");
        }
        sampled += a.len();
        drafted += from_draft;
    }
    assert!(sampled >= runs.len() * MAX_TOKENS * 3 / 4, "only {sampled} tokens sampled in {} cases", runs.len());
    assert!(drafted as usize >= sampled / 10, "only {drafted} of {sampled} tokens came from the drafts");
    eprintln!("{} cases, {sampled} tokens ({drafted} drafted): all equal to mlx-lm's", runs.len());
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let mistral = common::model("mistral-f32");
    let dir = common::model("llama3-f32");
    let args = ["generate", "--model", dir.to_str().unwrap(), "--draft-model", mistral.to_str().unwrap(), "--max-tokens", "4"];
    let out = common::mlx_gen(&args, None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one error line: {err}");
    assert!(err.starts_with("error:") && err.contains("vocabulary") && err.contains("same tokenizer"), "{err}");
    // Both kinds at once, and a zero draft length, are usage errors.
    let q4 = common::model("llama3-q4g64");
    for extra in [&["--draft-model", q4.to_str().unwrap(), "--prompt-lookup", "2"][..], &["--prompt-lookup", "0"], &["--prompt-lookup", "2", "--num-draft-tokens", "0"]] {
        let mut a = vec!["generate", "--model", dir.to_str().unwrap()];
        a.extend_from_slice(extra);
        let out = common::mlx_gen(&a, None);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // A speculation setting in the environment that is not a value it takes: one error line.
    for (var, value) in [("MLX_GEN_SPEC_PIPELINE", "yes"), ("MLX_GEN_VERIFY_PAD", "eight")] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mlx-gen"))
            .args(["generate", "--model", dir.to_str().unwrap(), "--prompt-lookup", "2", "--max-tokens", "4"])
            .env(var, value)
            .output()
            .expect("spawn mlx-gen");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{var}={value}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one error line: {err}");
        assert!(err.contains(var) && err.contains(value), "{err}");
    }
}

#[test]
fn prompt_lookup_proposes_the_latest_match() {
    use engine::speculative::prompt_lookup;
    let seq = [1, 2, 3, 9, 1, 2, 4, 5, 1, 2];
    assert_eq!(prompt_lookup(&seq, 2, 3), vec![4, 5, 1], "latest match of [1, 2]");
    assert_eq!(prompt_lookup(&seq, 2, 10), vec![4, 5, 1, 2, 4, 5, 1, 2, 4, 5], "to the end, then the pattern again");
    assert_eq!(prompt_lookup(&[7, 8, 5, 6, 8], 3, 2), vec![5, 6], "falls back to a 1-gram");
    assert_eq!(prompt_lookup(&[3, 9, 9, 9], 3, 4), vec![9, 9, 9, 9], "a run of one token");
    assert_eq!(prompt_lookup(&[1, 2, 1, 2], 2, 5), vec![1, 2, 1, 2, 1], "a two-token cycle");
    assert!(prompt_lookup(&[1, 2, 3], 2, 3).is_empty(), "no match");
    assert!(prompt_lookup(&seq, 2, 0).is_empty());
    assert!(prompt_lookup(&[5], 3, 3).is_empty());
}
