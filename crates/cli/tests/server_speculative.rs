//! Speculative decoding in serving (`serve --draft-model`, `--prompt-lookup`): a sequence that
//! decodes alone runs speculative rounds, several decode batched, and the tokens stay those of
//! plain greedy decoding through every change (the batch engine driven step by step, and the real
//! server over HTTP); seeded sampling of a request alone equals `mlx-gen generate --draft-model
//! --seed` (itself mlx-lm's); draft counts show in `usage` and `/metrics`; bad settings are refused.
mod common;
mod server_harness;

use engine::batch::{BatchEngine, Drafter, SeqParams, SeqSpeculation, Speculation, StepToken};
use engine::{GenerateConfig, Generator, LoadedModel, SpecStats, SpeculativeConfig};
use serde_json::{json, Value};
use server_harness::{chunks, Server};

/// A sequence for the batch engine: its prompt, the step it is added at, its token count.
struct Seq {
    prompt: Vec<u32>,
    joins_at: usize,
    tokens: usize,
}

fn ids(seed: u32, len: usize, vocab: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed * 97)) % (vocab - 1) + 1).collect()
}

/// Plain greedy decoding of `prompt` alone.
fn plain(m: &LoadedModel, prompt: &[u32], n: usize) -> Vec<u32> {
    let config = GenerateConfig { max_tokens: Some(n), ..GenerateConfig::default() };
    Generator::new(m.model.as_ref(), prompt, m.model.make_cache(), config).unwrap().map(|g| g.unwrap().token).collect()
}

/// Runs `seqs` greedily through a batch engine that speculates with `spec`; returns each one's
/// tokens and, per step, whether another sequence than the first ran with it and the first's
/// draft statistics after the step.
fn run(m: &LoadedModel, spec: Speculation<'_>, seqs: &[Seq]) -> (Vec<Vec<u32>>, Vec<(bool, SpecStats)>) {
    let mut engine = BatchEngine::new(m.model.as_ref(), 64, None).with_speculation(spec);
    let mut got = vec![Vec::new(); seqs.len()];
    let mut done = vec![false; seqs.len()];
    let mut trail = Vec::new();
    for step in 0..2000 {
        for (i, s) in seqs.iter().enumerate().filter(|(_, s)| s.joins_at == step) {
            let params = SeqParams { sampler: Default::default(), keys: None, logprobs: false };
            let limit = SeqSpeculation { num_draft_tokens: None, max_tokens: Some(s.tokens) };
            engine.add_speculative(i as u64, s.prompt.clone(), params, None, limit).unwrap();
        }
        let others = (1..seqs.len()).any(|i| seqs[i].joins_at <= step && !done[i]);
        for StepToken { id, token, .. } in engine.step().unwrap() {
            let (g, i) = (&mut got[id as usize], id as usize);
            assert!(!done[i], "sequence {i} got a token after it finished");
            g.push(token);
            if g.len() == seqs[i].tokens {
                done[i] = true;
                engine.finish(id);
            }
        }
        // The first sequence's count, kept once it has ended.
        let last = trail.last().map_or(SpecStats::default(), |&(_, s)| s);
        trail.push((others, engine.speculation_stats(0).unwrap_or(last)));
        if engine.is_idle() && seqs.iter().all(|s| s.joins_at <= step) {
            return (got, trail);
        }
    }
    panic!("the engine never finished");
}

/// Checks `run` against plain decoding, and that the first sequence speculated while alone and
/// only then: drafts before the others join (unless the fallback measures plain decoding first),
/// none while they run, more once they have left. Returns the first's draft statistics.
fn check(label: &str, m: &LoadedModel, spec: Speculation<'_>, seqs: &[Seq]) -> SpecStats {
    let want: Vec<Vec<u32>> = seqs.iter().map(|s| plain(m, &s.prompt, s.tokens)).collect();
    let (got, trail) = run(m, spec, seqs);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "{label}: sequence {i} differs from plain greedy decoding");
    }
    let mut before = 0;
    let (mut alone_first, mut alone_after) = (0, 0);
    let mut others_seen = false;
    // Plain phases the fallback began once the others had left.
    let (mut fallbacks_after, mut fallbacks_before) = (0, None);
    for &(others, SpecStats { proposed, fallbacks, .. }) in &trail {
        if others {
            assert_eq!(proposed, before, "{label}: drafts were proposed while other sequences ran: {trail:?}");
            others_seen = true;
        } else if others_seen {
            alone_after += proposed - before;
            fallbacks_after = fallbacks - *fallbacks_before.get_or_insert(fallbacks);
        } else {
            alone_first += proposed - before;
        }
        before = proposed;
    }
    assert!(others_seen, "{label}: the sequences never ran together");
    // With the fallback on, rounds alone may measure slower than plain decoding (nothing to look
    // up, a busy machine) and go plain before any draft: plain is what the fallback is for.
    let fallback = spec.config.fallback;
    assert!(
        (alone_first > 0 || fallback) && (alone_after > 0 || fallback && fallbacks_after > 0),
        "{label}: the first sequence did not speculate both before ({alone_first}) and after ({alone_after}) the others: {trail:?}"
    );
    trail.last().map(|&(_, s)| s).unwrap_or_default()
}

/// The first sequence alone, then two more join (one while the other is still prefilled), they
/// leave, and the first goes on alone.
fn staggered(vocab: u32, lookup: bool) -> Vec<Seq> {
    let first = if lookup { ids(1, 12, vocab).repeat(4) } else { ids(1, 20, vocab) };
    vec![
        Seq { prompt: first, joins_at: 0, tokens: 80 },
        Seq { prompt: ids(2, 150, vocab), joins_at: 12, tokens: 9 },
        Seq { prompt: ids(3, 7, vocab), joins_at: 13, tokens: 14 },
    ]
}

fn config(k: usize, fallback: bool) -> SpeculativeConfig {
    SpeculativeConfig { num_draft_tokens: k, fallback, ..SpeculativeConfig::default() }
}

#[test]
fn batch_engine_speculates_alone_and_batches_otherwise() {
    let target = LoadedModel::load(&common::model("llama3-f32")).unwrap();
    let draft = LoadedModel::load(&common::model("llama3-q4g64")).unwrap();
    let vocab = target.model.vocab_size() as u32;
    for fallback in [false, true] {
        let by_model = Speculation { drafter: Drafter::Model(draft.model.as_ref()), config: config(3, fallback) };
        check(&format!("llama3, 4-bit draft, fallback {fallback}"), &target, by_model, &staggered(vocab, false));
        let own = Speculation { drafter: Drafter::Model(target.model.as_ref()), config: config(4, fallback) };
        let label = format!("llama3, own draft, fallback {fallback}");
        let s = check(&label, &target, own, &staggered(vocab, false));
        // The draft model caught up on the tokens decoded batched: it keeps agreeing with the model.
        assert!(s.accepted * 10 >= s.proposed * 9, "{label}: {} of {} drafts accepted", s.accepted, s.proposed);
        let lookup = Speculation { drafter: Drafter::PromptLookup { ngram: 2 }, config: config(4, fallback) };
        check(&format!("llama3, prompt lookup, fallback {fallback}"), &target, lookup, &staggered(vocab, true));
    }
}

/// Recurrent layers (qwen3_5): the states move out of the batch and back in, and a plain step
/// queued over them when the others join (the fallback's first tokens are plain) is kept.
#[test]
fn batch_engine_speculates_over_recurrent_states() {
    let dir = common::qwen35_models_dir();
    let target = LoadedModel::load(&dir.join("qwen35-f32")).unwrap();
    let draft = LoadedModel::load(&dir.join("qwen35-q4g32")).unwrap();
    let vocab = target.model.vocab_size() as u32;
    for fallback in [false, true] {
        let by_model = Speculation { drafter: Drafter::Model(draft.model.as_ref()), config: config(2, fallback) };
        check(&format!("qwen3_5, 4-bit draft, fallback {fallback}"), &target, by_model, &staggered(vocab, false));
        let lookup = Speculation { drafter: Drafter::PromptLookup { ngram: 2 }, config: config(3, fallback) };
        check(&format!("qwen3_5, prompt lookup, fallback {fallback}"), &target, lookup, &staggered(vocab, true));
    }
}

/// A model whose caches do not batch (llama4's chunked attention) runs one sequence at a time:
/// the first speculates throughout while the others wait, and they speculate in turn.
#[test]
fn batch_engine_speculates_one_at_a_time_without_batch_caches() {
    let target = LoadedModel::load(&common::llama4_mistral3_models_dir().join("llama4-f32")).unwrap();
    assert!(!engine::batch::is_batchable(target.model.as_ref()), "the test needs a model without batch caches");
    let vocab = target.model.vocab_size() as u32;
    for (label, drafter) in [("own draft", Drafter::Model(target.model.as_ref())), ("prompt lookup", Drafter::PromptLookup { ngram: 2 })] {
        let seqs = staggered(vocab, matches!(drafter, Drafter::PromptLookup { .. }));
        let want: Vec<Vec<u32>> = seqs.iter().map(|s| plain(&target, &s.prompt, s.tokens)).collect();
        let (got, trail) = run(&target, Speculation { drafter, config: config(3, false) }, &seqs);
        assert_eq!(got, want, "llama4, {label}: tokens differ from plain greedy decoding");
        let proposed = trail.last().map_or(0, |(_, s)| s.proposed);
        assert!(proposed > 0, "llama4, {label}: the first sequence never speculated");
    }
    // Sliding-window layers (a rotating cache stops trimming once it wraps): refused up front.
    let windowed = LoadedModel::load(&common::llama4_mistral3_models_dir().join("ministral3-f32")).unwrap();
    let spec = Speculation { drafter: Drafter::PromptLookup { ngram: 2 }, config: config(3, false) };
    let err = spec.check(windowed.model.as_ref()).expect_err("a rotating cache").to_string();
    assert!(err.contains("RotatingKVCache") && err.contains("window"), "{err}");
    // A model's own layer caches (DeepSeek-V4.1's, which `generate` speculates on by putting them
    // back) do not move between the batch and the generator: refused up front too.
    let own = LoadedModel::load(&common::deepseek_sparse_models_dir().join("dsv41-f32")).unwrap();
    let err = spec.check(own.model.as_ref()).expect_err("a model's own layer caches").to_string();
    assert!(err.contains("own layer caches"), "{err}");
}

fn dir(variant: &str) -> String {
    common::model(variant).to_string_lossy().into_owned()
}

/// `mlx-gen generate --model MODEL --output json ARGS...`.
fn generate(model: &str, args: &[&str]) -> Value {
    let mut all = vec!["generate", "--model", model, "--output", "json"];
    all.extend_from_slice(args);
    let out = common::mlx_gen(&all, None);
    assert!(out.status.success(), "{all:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("generate JSON")
}

/// `generate`'s token ids, each decoded alone (as the server names each token in `logprobs`).
fn token_texts(m: &LoadedModel, generated: &Value) -> Vec<String> {
    let ids = generated["tokens"].as_array().expect("tokens");
    ids.iter().map(|id| m.tokenizer.decode(&[id.as_u64().unwrap() as u32], false).unwrap()).collect()
}

/// A text completion's tokens, one string per token (it must ask for `logprobs`).
fn served_tokens(v: &Value) -> Vec<String> {
    let tokens = v["choices"][0]["logprobs"]["tokens"].as_array().unwrap_or_else(|| panic!("no logprobs tokens: {v}"));
    tokens.iter().map(|t| t.as_str().unwrap().to_owned()).collect()
}

/// `usage.draft_tokens` of an answer: (proposed, accepted).
fn drafted(v: &Value) -> (u64, u64) {
    let d = &v["usage"]["draft_tokens"];
    (d["proposed"].as_u64().unwrap_or_else(|| panic!("no draft_tokens in {v}")), d["accepted"].as_u64().unwrap())
}

/// Text completions of `prompts` (`max` tokens each, logprobs on) sent at once; every third streamed.
fn concurrently(s: &Server, prompts: &[(&str, usize)]) -> Vec<(String, Vec<String>)> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, &(p, max))| {
                scope.spawn(move || {
                    let mut body = json!({"prompt": p, "max_tokens": max, "logprobs": 0});
                    if i % 3 == 2 {
                        body["stream"] = json!(true);
                        let c = chunks(&s.stream("/v1/completions", &body));
                        let text: String = c.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
                        let tokens = c.iter().flat_map(|c| c["choices"][0]["logprobs"]["tokens"].as_array().cloned().unwrap_or_default());
                        return (text, tokens.map(|t| t.as_str().unwrap().to_owned()).collect());
                    }
                    let v = s.post("/v1/completions", &body);
                    (v["choices"][0]["text"].as_str().unwrap().to_owned(), served_tokens(&v))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("client thread")).collect()
    })
}

/// Each of `prompts` through `s` at once equals plain greedy `generate` of `model`.
fn assert_concurrent_plain(s: &Server, m: &LoadedModel, model: &str, prompts: &[(&str, usize)]) {
    let got = concurrently(s, prompts);
    for ((p, max), (text, tokens)) in prompts.iter().zip(&got) {
        let want = generate(model, &["--prompt", p, "-m", &max.to_string(), "--ignore-chat-template"]);
        assert_eq!(tokens, &token_texts(m, &want), "{p:?} sent with others: tokens differ from plain greedy generation");
        assert_eq!(text, want["text"].as_str().unwrap(), "{p:?} sent with others");
    }
}

#[test]
fn serve_with_a_draft_model_keeps_plain_greedy_tokens() {
    let (model, draft) = (dir("llama3-f32"), dir("llama3-q4g64"));
    let m = LoadedModel::load(&common::model("llama3-f32")).unwrap();
    let s = Server::start(&model, &["--draft-model", &draft, "--always-speculate"]);
    let want = generate(&model, &["--prompt", "hello", "-m", "40", "--ignore-chat-template"]);
    assert_eq!(want["generation_tokens"], 40, "{want}");
    for k in [None, Some(5), Some(1), Some(0)] {
        let mut body = json!({"prompt": "hello", "max_tokens": 40, "logprobs": 0});
        if let Some(k) = k {
            body["num_draft_tokens"] = json!(k);
        }
        let got = s.post("/v1/completions", &body);
        assert_eq!(served_tokens(&got), token_texts(&m, &want), "num_draft_tokens {k:?}: tokens differ from plain greedy generation");
        assert_eq!(got["choices"][0]["text"], want["text"]);
        let (proposed, accepted) = drafted(&got);
        match k {
            Some(0) => assert_eq!(proposed, 0, "num_draft_tokens 0 speculated"),
            _ => assert!(proposed > 0 && accepted <= proposed, "num_draft_tokens {k:?}: {accepted} of {proposed} drafts accepted"),
        }
    }
    // Chat, and streamed with usage.
    let chat = generate(&model, &["--prompt", "hello", "-m", "24"]);
    let body = json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 24});
    assert_eq!(s.post("/v1/chat/completions", &body)["choices"][0]["message"]["content"], chat["text"]);
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let c = chunks(&s.stream("/v1/chat/completions", &sbody));
    let streamed: String = c.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, chat["text"].as_str().unwrap());
    assert!(drafted(c.last().unwrap()).0 > 0, "the usage chunk counts the drafts");
    // Three at once (batched decoding, speculation for whichever is left alone), then alone again.
    let prompts = [("prompt number 0", 30), ("prompt number 1", 45), ("prompt number 2", 60)];
    assert_concurrent_plain(&s, &m, &model, &prompts);
    let again = s.post("/v1/completions", &json!({"prompt": "hello", "max_tokens": 40, "logprobs": 0}));
    assert_eq!(served_tokens(&again), token_texts(&m, &want), "alone after the batch");
    let metrics = s.metrics();
    let count = |name: &str| -> u64 {
        let line = metrics.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in {metrics}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let (proposed, accepted) = (count("mlxgen_draft_tokens_proposed_total"), count("mlxgen_draft_tokens_accepted_total"));
    assert!(accepted > 0 && accepted <= proposed, "metrics: {accepted} of {proposed} drafts accepted");
}

#[test]
fn serve_with_prompt_lookup_keeps_plain_greedy_tokens() {
    let model = dir("llama3-f32");
    let m = LoadedModel::load(&common::model("llama3-f32")).unwrap();
    let s = Server::start(&model, &["--prompt-lookup", "2", "--num-draft-tokens", "4", "--always-speculate"]);
    let prompt = "one two three four one two three four one two three four";
    let want = generate(&model, &["--prompt", prompt, "-m", "64", "--ignore-chat-template"]);
    let got = s.post("/v1/completions", &json!({"prompt": prompt, "max_tokens": 64, "logprobs": 0}));
    assert_eq!(served_tokens(&got), token_texts(&m, &want), "tokens differ from plain greedy generation");
    let (proposed, accepted) = drafted(&got);
    assert!(accepted > 0 && accepted <= proposed, "{accepted} of {proposed} drafts accepted");
    let lines = [format!("mlxgen_draft_tokens_proposed_total {proposed}"), format!("mlxgen_draft_tokens_accepted_total {accepted}")];
    let (text, found) = s.wait_for_metrics(&[&lines[0], &lines[1]]);
    assert!(found, "the metrics count the request's drafts ({lines:?}): {text}");
    assert_concurrent_plain(&s, &m, &model, &[(prompt, 48), ("hello", 20), ("a b a b a b", 33)]);
}

/// `serve --warmup on` with speculation also runs speculative rounds before it listens (on the GPU
/// the draft model's first steps and the verification's shape are paid there), and leaves nothing
/// behind: a request gets plain greedy decoding's tokens.
#[test]
fn a_warm_up_with_speculation_verifies_drafts_and_changes_no_token() {
    let model = dir("llama3-f32");
    let m = LoadedModel::load(&common::model("llama3-f32")).unwrap();
    let q4 = dir("llama3-q4g64");
    for extra in [&["--prompt-lookup", "2"][..], &["--draft-model", q4.as_str(), "--num-draft-tokens", "3"]] {
        let s = Server::start(&model, &[&["--warmup", "on"][..], extra].concat());
        let log = s.log.lock().expect("log").clone();
        let line = log.iter().find(|l| l.contains("batch engine warmed up in")).unwrap_or_else(|| panic!("{extra:?}: no warm-up reported: {log:?}"));
        let verified: usize = line.split('(').nth(1).and_then(|r| r.split_whitespace().next()).and_then(|n| n.parse().ok()).unwrap_or(0);
        assert!(verified > 0, "{extra:?}: the warm-up verified no draft: {line}");
        let prompt = "one two three four one two three four";
        let want = generate(&model, &["--prompt", prompt, "-m", "40", "--ignore-chat-template"]);
        let got = s.post("/v1/completions", &json!({"prompt": prompt, "max_tokens": 40, "logprobs": 0}));
        assert_eq!(served_tokens(&got), token_texts(&m, &want), "{extra:?}: tokens differ from plain greedy generation");
    }
}

/// A seeded request alone draws as `generate --draft-model --seed` (which draws as mlx-lm's
/// `speculative_generate_step`); with `num_draft_tokens` 0 as plain `generate --seed`.
#[test]
fn seeded_sampling_alone_equals_generate_with_the_draft_model() {
    let (model, draft) = (dir("llama3-f32"), dir("llama3-q4g64"));
    let m = LoadedModel::load(&common::model("llama3-f32")).unwrap();
    let s = Server::start(&model, &["--draft-model", &draft]);
    for (temp, top_p, seed) in [(0.8, 1.0, 7), (1.0, 0.9, 3)] {
        let flags = ["--prompt", "hello", "-m", "40", "--ignore-chat-template", "--temp", &temp.to_string(), "--top-p", &top_p.to_string(), "--seed", &seed.to_string()];
        let body = json!({"prompt": "hello", "max_tokens": 40, "logprobs": 0, "temperature": temp, "top_p": top_p, "seed": seed});
        let want = generate(&model, &[&flags[..], &["--draft-model", &draft]].concat());
        let got = s.post("/v1/completions", &body);
        assert_eq!(served_tokens(&got), token_texts(&m, &want), "temp {temp} top_p {top_p} seed {seed}: tokens differ from generate --draft-model");
        assert_eq!(drafted(&got).1, want["draft_tokens_accepted"].as_u64().unwrap(), "accepted drafts as generate's");
        let mut plain_body = body.clone();
        plain_body["num_draft_tokens"] = json!(0);
        let want = generate(&model, &flags);
        let got = s.post("/v1/completions", &plain_body);
        assert_eq!(served_tokens(&got), token_texts(&m, &want), "temp {temp} seed {seed}, num_draft_tokens 0: tokens differ from plain generate --seed");
    }
}

#[test]
fn bad_speculation_settings_are_refused() {
    let model = dir("llama3-f32");
    let plain = Server::start(&model, &[]);
    let body = |k: Value| json!({"prompt": "hello", "max_tokens": 4, "num_draft_tokens": k}).to_string();
    let a = plain.call("POST", "/v1/completions", Some(&body(json!(2))));
    assert_eq!(a.status, 400, "{}", a.body);
    let e: Value = serde_json::from_str(&a.body).unwrap();
    assert_eq!(e["error"]["param"], "num_draft_tokens");
    assert!(e["error"]["message"].as_str().unwrap().contains("started without"), "{e}");
    assert_eq!(plain.call("POST", "/v1/completions", Some(&body(json!(0)))).status, 200, "0 asks for nothing the server lacks");
    drop(plain);
    let s = Server::start(&model, &["--prompt-lookup", "3"]);
    for bad in [json!(-1), json!(2.5), json!("3"), json!(1000), json!([2])] {
        let a = s.call("POST", "/v1/chat/completions", Some(&json!({"messages": [{"role": "user", "content": "hi"}], "num_draft_tokens": bad}).to_string()));
        assert_eq!(a.status, 400, "{bad}: {}", a.body);
        let e: Value = serde_json::from_str(&a.body).unwrap();
        assert_eq!(e["error"]["param"], "num_draft_tokens", "{bad}: {e}");
    }
    // Start-up errors: one line, as generate's.
    let mistral = dir("mistral-f32");
    let out = common::mlx_gen(&["serve", "--model", &model, "--port", "0", "--draft-model", &mistral], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one error line: {err}");
    assert!(err.starts_with("error:") && err.contains("vocabulary"), "{err}");
    let q4 = dir("llama3-q4g64");
    for extra in [&["--draft-model", q4.as_str(), "--prompt-lookup", "2"][..], &["--prompt-lookup", "0"], &["--prompt-lookup", "2", "--num-draft-tokens", "0"]] {
        let out = common::mlx_gen(&[&["serve", "--model", &model, "--port", "0"][..], extra].concat(), None);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// Recurrent layers (qwen3_5) over HTTP: alone and three at once, as plain greedy `generate`.
#[test]
fn serve_speculates_over_recurrent_states() {
    let qdir = common::qwen35_models_dir();
    let (model, draft) = (qdir.join("qwen35-f32").to_string_lossy().into_owned(), qdir.join("qwen35-q4g32").to_string_lossy().into_owned());
    let m = LoadedModel::load(std::path::Path::new(&model)).unwrap();
    let s = Server::start(&model, &["--draft-model", &draft, "--always-speculate"]);
    let want = generate(&model, &["--prompt", "hello", "-m", "32", "--ignore-chat-template"]);
    let got = s.post("/v1/completions", &json!({"prompt": "hello", "max_tokens": 32, "logprobs": 0}));
    assert_eq!(served_tokens(&got), token_texts(&m, &want), "tokens differ from plain greedy generation");
    assert!(drafted(&got).0 > 0);
    assert_concurrent_plain(&s, &m, &model, &[("prompt number 0", 20), ("prompt number 1", 36), ("prompt number 2", 28)]);
}

/// Speculation's rounds are not among the engine calls the other ranks replay: refused up front.
#[test]
fn speculation_is_refused_on_several_ranks() {
    let (model, draft) = (dir("llama3-f32"), dir("llama3-q4g64"));
    for (flag, value) in [("--prompt-lookup", "2"), ("--draft-model", draft.as_str())] {
        let args = ["launch", "--hosts", "127.0.0.1,127.0.0.1", "--timeout", "30", "--", "--device", "cpu", "serve", "--model", &model, "--port", "0", flag, value];
        let out = common::mlx_gen(&args, None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag}: {err}");
        assert!(err.contains(&format!("{flag} is served on one rank only")), "{flag}: {err}");
    }
}

/// With a draft model each sequence keeps the draft's cache beside its own, so `--kv-budget-mb`
/// counts both models' keys and values per position: a request that the target's cache alone would
/// fit, but not both, is a 400 `context_length_exceeded`; without the draft model it is served.
#[test]
fn the_kv_budget_counts_the_draft_models_cache() {
    let (model, draft) = (dir("llama3-f32"), dir("llama3-q4g64"));
    let per = |v: &str| engine::batch::kv_bytes_per_token(LoadedModel::load(&common::model(v)).unwrap().model.as_ref()).unwrap();
    let (target, both) = (per("llama3-f32"), per("llama3-f32") + per("llama3-q4g64"));
    let budget = 1 << 20; // --kv-budget-mb 1
    // Positions reserved: prompt + max_tokens + the cache's growth step of 256.
    let fits_target = budget / target - 256 - 8;
    assert!(fits_target + 256 + 8 > budget / both, "the test needs a request the target alone fits but not both");
    let body = json!({"prompt": "hello", "max_tokens": fits_target, "num_draft_tokens": 2});
    let flags = ["--kv-budget-mb", "1", "--prefix-cache-mb", "0"];
    let s = Server::start(&model, &[&flags[..], &["--draft-model", &draft]].concat());
    let a = s.call("POST", "/v1/completions", Some(&body.to_string()));
    assert_eq!(a.status, 400, "{}", a.body);
    let e: Value = serde_json::from_str(&a.body).unwrap();
    assert_eq!(e["error"]["code"], "context_length_exceeded", "{e}");
    drop(s);
    let plain = Server::start(&model, &flags);
    let big = json!({"prompt": "hello", "max_tokens": fits_target});
    assert_eq!(plain.call("POST", "/v1/completions", Some(&big.to_string())).status, 200, "the target's cache alone fits");
}
