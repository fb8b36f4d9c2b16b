//! Oracle tests for the hybrid linear-attention architectures `qwen3_next`, `qwen3_5` and
//! `qwen3_5_moe` (tests/oracle/make_qwen35.py: tiny random models in Hugging Face layout, float32,
//! mlx-lm's own 4-bit conversions of them and an unquantized MLX folder): `mlx-gen generate`
//! gives Python mlx-lm 0.32.2's greedy tokens and text (64 tokens), prompt logits within 1e-5
//! (float32 activations and scales, the 4-bit ones too); seeded sampling equal; the layer-state
//! cache through chunked prefill, `--kv-bits` (attention layers only), prompt-cache files both
//! ways and a 4-turn chat that prefills only each turn's new tokens; tensor (qwen3_5, qwen3_5_moe)
//! and pipeline parallel on 2 ranks equal to one process. Needs the oracle venv
//! (scripts/oracle-venv.sh); fails, never skips, when it cannot be made.

mod common;
mod dist;

use serde_json::{json, Value};
use std::path::PathBuf;

const MAX_TOKENS: usize = 64;
const CHAT_PROMPT: &str = "Hello, how are you?";
const RAW_PROMPT: &str = "The capital of France is";
const VARIANTS: &[&str] =
    &["qwen35-f32", "qwen35-mlx-f32", "qwen35-q4g32", "qwen35moe-f32", "qwen35moe-q4g32", "qwen35moe-q4g32-bf16", "qwen3next-f32", "qwen3next-q4g32"];

fn info() -> Value {
    serde_json::from_str(&std::fs::read_to_string(common::qwen35_models_dir().join("variants.json")).unwrap()).unwrap()
}

fn model(name: &str) -> PathBuf {
    let d = common::qwen35_models_dir().join(name);
    assert!(d.join("config.json").is_file(), "variant {name} missing from {}", common::qwen35_models_dir().display());
    d
}

fn json_out(args: &[&str], stdin: Option<&[u8]>) -> Value {
    let o = common::mlx_gen(args, stdin);
    assert!(o.status.success(), "mlx-gen {args:?} failed:\n{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("mlx-gen JSON")
}

/// Every variant of one architecture with the chat prompt, the float32 ones with the raw one too.
fn check_arch(prefix: &str) {
    let info = info();
    for v in VARIANTS.iter().filter(|v| v.starts_with(prefix) && !v[prefix.len()..].starts_with("moe")) {
        let f32 = info[v]["dtype"] == "float32";
        common::check_against_reference(&model(v), f32, CHAT_PROMPT, false, MAX_TOKENS);
        if f32 {
            common::check_against_reference(&model(v), true, RAW_PROMPT, true, MAX_TOKENS);
        }
    }
}

#[test]
fn variants_are_covered() {
    let built = info();
    let mut built: Vec<&str> = built.as_object().unwrap().keys().map(String::as_str).collect();
    built.sort_unstable();
    assert_eq!(built, VARIANTS, "the tests must cover exactly the variants make_qwen35.py builds");
}

#[test]
fn qwen3_next() {
    check_arch("qwen3next");
}

#[test]
fn qwen3_5() {
    check_arch("qwen35");
}

#[test]
fn qwen3_5_moe() {
    check_arch("qwen35moe");
}

/// `mlx-gen convert` of each Hugging Face float checkpoint equals `mlx_lm.convert` with the same
/// settings, tensor for tensor (experts stacked or split, conv1d weights moved, RMS norms + 1,
/// routers in 8 bits, `language_model.` names, `rope_parameters.type`, bfloat16 but `A_log`).
#[test]
fn convert_equals_mlx_lm() {
    let info = info();
    for v in VARIANTS.iter().filter(|v| info[**v]["kind"] != "float") {
        let src = model(info[*v]["src"].as_str().unwrap());
        let ours = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("qwen35-convert-{v}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&ours);
        let mut args = vec!["convert", "--model", src.to_str().unwrap(), "--mlx-path", ours.to_str().unwrap()];
        args.extend(["--dtype", info[*v]["dtype"].as_str().unwrap()]);
        if info[*v]["kind"] == "quantized" {
            args.extend(["-q", "--q-group-size", "32"]);
        }
        let o = common::mlx_gen(&args, None);
        assert!(o.status.success(), "{v}: mlx-gen convert failed:\n{}", String::from_utf8_lossy(&o.stderr));
        common::assert_same_model_folder(&ours, &model(v));
        let _ = std::fs::remove_dir_all(&ours);
        eprintln!("{v}: mlx-gen convert equals mlx_lm.convert");
    }
}

/// Chunked prefill (the recurrent state carried from chunk to chunk) and a quantized KV cache on
/// the attention layers only (mlx-lm's `maybe_quantize_kv_cache` skips the ArraysCaches), against
/// mlx-lm's generate (cache_reference.py).
#[test]
fn chunked_prefill_and_quantized_attention_caches() {
    let cases: &[(&str, &[&str])] = &[
        ("qwen35-f32", &["--prefill-step-size", "7"]),
        ("qwen3next-f32", &["--prefill-step-size", "16"]),
        ("qwen35-q4g32", &["--kv-bits", "4", "--kv-group-size", "32", "--quantized-kv-start", "20"]),
        ("qwen35moe-f32", &["--kv-bits", "8", "--kv-group-size", "32", "--quantized-kv-start", "0", "--prefill-step-size", "9"]),
    ];
    let json_cases: Vec<Value> = cases
        .iter()
        .map(|(v, flags)| {
            let mut c = json!({"op": "generate", "model": model(v), "prompt": CHAT_PROMPT, "max_tokens": MAX_TOKENS});
            for pair in flags.chunks(2) {
                c[pair[0].trim_start_matches("--").replace('-', "_")] = Value::from(pair[1].parse::<i64>().unwrap());
            }
            c
        })
        .collect();
    let refs = common::batched_reference("cache_reference.py", &json_cases);
    for ((v, flags), r) in cases.iter().zip(&refs) {
        let dir = model(v);
        let max = MAX_TOKENS.to_string();
        let mut args = vec!["generate", "--model", dir.to_str().unwrap(), "--prompt", CHAT_PROMPT, "--max-tokens", &max, "--output", "json"];
        args.extend(flags.iter());
        let o = json_out(&args, None);
        assert_eq!(o["tokens"], r["tokens"], "{v} {flags:?}: tokens differ from mlx-lm's");
        assert_eq!(o["tokens"].as_array().map_or(0, Vec::len), MAX_TOKENS, "{v}: no early stop");
        eprintln!("{v} {flags:?}: {MAX_TOKENS} tokens equal");
    }
}

/// Prompt-cache files both ways (`cache-prompt`, then `generate --prompt-cache-file`): mlx-lm
/// continues from ours (ArraysCache + KVCache layers) and we from mlx-lm's, with the same tokens.
#[test]
fn prompt_cache_files_are_mlx_lms() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("qwen35-prompt-cache-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let (first, then) = (CHAT_PROMPT, "Summarize it.");
    let (mut ops, mut runs) = (Vec::new(), Vec::new());
    for v in ["qwen35-f32", "qwen35moe-q4g32", "qwen3next-f32"] {
        let dir = model(v);
        let (ours, theirs) = (tmp.join(format!("{v}-ours.safetensors")), tmp.join(format!("{v}-theirs.safetensors")));
        let args = ["cache-prompt", "--model", dir.to_str().unwrap(), "--prompt", first, "--prompt-cache-file", ours.to_str().unwrap()];
        let o = common::mlx_gen(&args, None);
        assert!(o.status.success(), "{v}: cache-prompt failed:\n{}", String::from_utf8_lossy(&o.stderr));
        ops.push(json!({"op": "cache_prompt", "model": dir, "prompt": first, "prompt_cache_file": theirs}));
        runs.push((v, dir, ours, theirs));
    }
    for (_, dir, ours, theirs) in &runs {
        for f in [ours, theirs] {
            ops.push(json!({"op": "generate", "model": dir, "prompt": then, "max_tokens": MAX_TOKENS, "prompt_cache_file": f}));
        }
    }
    let refs = common::batched_reference("cache_reference.py", &ops);
    for (i, (v, dir, ours, theirs)) in runs.iter().enumerate() {
        let (want_ours, want_theirs) = (&refs[runs.len() + 2 * i]["tokens"], &refs[runs.len() + 2 * i + 1]["tokens"]);
        assert_eq!(want_ours, want_theirs, "{v}: mlx-lm continues differently from our file and its own");
        for (who, f) in [("ours", ours), ("theirs", theirs)] {
            let max = MAX_TOKENS.to_string();
            let args = ["generate", "--model", dir.to_str().unwrap(), "--prompt", then, "--max-tokens", &max, "--output", "json"];
            let o = json_out(&[&args[..], &["--prompt-cache-file", f.to_str().unwrap()]].concat(), None);
            assert_eq!(&o["tokens"], want_ours, "{v}: tokens after the prompt cache written by {who} differ from mlx-lm's");
            eprintln!("{v}: prompt cache written by {who}: {} tokens equal", want_ours.as_array().map_or(0, Vec::len));
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `--seed` sampling equals mlx-lm's (the draws its `load` makes for the Conv1d and `A_log`
/// initialisers of the linear layers included).
#[test]
fn seeded_sampling_matches_mlx_lm() {
    let cases: Vec<(&str, u64, Value, Vec<&str>)> = vec![
        ("qwen35-f32", 7, json!({"temp": 1.0}), vec!["--temp", "1"]),
        ("qwen35-q4g32", 3, json!({"temp": 0.8, "top_p": 0.9}), vec!["--temp", "0.8", "--top-p", "0.9"]),
        ("qwen3next-f32", 11, json!({"temp": 1.0, "top_k": 20}), vec!["--temp", "1", "--top-k", "20"]),
        ("qwen35moe-q4g32", 5, json!({"temp": 1.0, "min_p": 0.05}), vec!["--temp", "1", "--min-p", "0.05"]),
    ];
    let json_cases: Vec<Value> = cases
        .iter()
        .map(|(v, seed, sampler, _)| json!({"model": model(v), "prompt": CHAT_PROMPT, "max_tokens": MAX_TOKENS, "seed": seed, "sampler": sampler}))
        .collect();
    let refs = common::batched_reference("sample_reference.py", &json_cases);
    for ((v, seed, _, flags), r) in cases.iter().zip(&refs) {
        let dir = model(v);
        let (max, seed_s) = (MAX_TOKENS.to_string(), seed.to_string());
        let args = ["generate", "--model", dir.to_str().unwrap(), "--prompt", CHAT_PROMPT, "--max-tokens", &max, "--seed", &seed_s, "--output", "json"];
        let o = json_out(&[&args[..], flags].concat(), None);
        assert_eq!(o["tokens"], r["tokens"], "{v} seed {seed} {flags:?}: sampled tokens differ from mlx-lm's");
        eprintln!("{v} seed {seed} {flags:?}: {} sampled tokens equal", r["tokens"].as_array().map_or(0, Vec::len));
    }
}

/// `mlx-gen chat` over 4 turns on qwen3_5: from the 2nd turn on, the recurrent states and KV
/// caches carry the conversation (all of it, or up to the end of the last user message where
/// the answer's tokens render differently), so only the turn's new tokens are prefilled; the
/// last answer equals a fresh run over the whole conversation.
#[test]
fn chat_prefills_only_each_turns_new_tokens() {
    let dir = model("qwen35-f32");
    let save = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("qwen35-chat-{}.json", std::process::id()));
    let script = format!("Hello there\nWhat is the capital of France?\nTell me more.\nThanks, bye.\n/save {}\n/exit\n", save.display());
    let o = common::mlx_gen(&["chat", "--model", dir.to_str().unwrap(), "-m", "12", "--verbose"], Some(script.as_bytes()));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    // [prompt: P tokens processed, R reused from the cache, ... | generation: G tokens, ...]
    let turns: Vec<(usize, usize, usize)> = stderr
        .lines()
        .filter(|l| l.starts_with("[prompt: "))
        .map(|l| {
            let n = |after: &str| l.split(after).nth(1).unwrap().trim_start().split(' ').next().unwrap().parse::<usize>().unwrap();
            (n("[prompt:"), n("processed,"), n("generation:"))
        })
        .collect();
    assert_eq!(turns.len(), 4, "{stderr}");
    let loaded = engine::LoadedModel::load(&dir).unwrap();
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&save).unwrap()).unwrap();
    let _ = std::fs::remove_file(&save);
    let msgs: Vec<tokenizer::ChatMessage> = saved["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| tokenizer::ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(msgs.len(), 8);
    for (t, &(processed, reused, generated)) in turns.iter().enumerate() {
        let text = loaded.tokenizer.apply_chat_template(&msgs[..2 * t + 1], true).unwrap();
        let ids = loaded.tokenizer.encode(&text, false).unwrap();
        assert_eq!(processed + reused, ids.len(), "turn {t}: the whole conversation is the prompt");
        if t > 0 {
            // All the cache holds, or (when the answer's tokens render differently) the recurrent
            // states kept at the end of the previous user message: never a fresh start.
            let (p, r, g) = turns[t - 1];
            let prev = loaded.tokenizer.encode(&loaded.tokenizer.apply_chat_template(&msgs[..2 * t - 1], false).unwrap(), false).unwrap();
            let kept = prev.iter().zip(&ids).take_while(|(a, b)| a == b).count();
            assert!(reused == p + r + g || reused == kept, "turn {t}: {reused} reused, not {} nor {kept}", p + r + g);
            assert!(kept > r, "turn {t}: the kept states are past the previous turn's start");
        }
        assert!(generated > 0);
    }
    // The 4th answer from scratch over the whole conversation.
    let text = loaded.tokenizer.apply_chat_template(&msgs[..7], true).unwrap();
    let ids = loaded.tokenizer.encode(&text, false).unwrap();
    let config = engine::GenerateConfig { max_tokens: Some(12), ..engine::GenerateConfig::default() };
    let fresh: Vec<u32> = engine::Generator::new(loaded.model.as_ref(), &ids, loaded.model.make_cache(), config)
        .unwrap()
        .map(|g| g.unwrap().token)
        .filter(|t| !loaded.eos_token_ids.contains(t))
        .collect();
    assert_eq!(loaded.tokenizer.decode(&fresh, false).unwrap(), msgs[7].content, "the 4th answer differs from a fresh run's");
}

/// Speculative decoding on qwen3_5 (mlx-lm refuses: the recurrent states cannot be trimmed):
/// prompt lookup, a draft model of another hybrid type (mostly rejected drafts) and the model as
/// its own draft (all accepted) give exactly the plain greedy tokens.
#[test]
fn speculative_decoding_keeps_the_greedy_tokens() {
    let target = model("qwen35-f32");
    let base = ["generate", "--model", target.to_str().unwrap(), "--prompt", CHAT_PROMPT, "--max-tokens", "48", "--output", "json"];
    let run = |extra: &[&str]| json_out(&[&base[..], extra].concat(), None);
    let plain = run(&[]);
    assert_eq!(plain["tokens"].as_array().unwrap().len(), 48);
    let (other, own) = (model("qwen35moe-f32"), model("qwen35-q4g32"));
    for extra in [
        &["--prompt-lookup", "2"][..],
        &["--draft-model", other.to_str().unwrap(), "--num-draft-tokens", "3"][..],
        &["--draft-model", own.to_str().unwrap(), "--num-draft-tokens", "2"][..],
        &["--draft-model", target.to_str().unwrap(), "--num-draft-tokens", "4"][..],
    ] {
        assert_eq!(run(extra)["tokens"], plain["tokens"], "{extra:?}: speculative tokens differ from plain greedy ones");
    }
}

/// The caches after speculative rounds with rejected drafts (target and a recurrent draft model)
/// equal, array for array, those of plain decoding of the same tokens.
#[test]
fn rejected_drafts_leave_plain_decodings_state() {
    use engine::cache::KvCache;
    use engine::cache::StateNode;
    let target = engine::LoadedModel::load(&model("qwen35-f32")).unwrap();
    let draft = engine::LoadedModel::load(&model("qwen3next-f32")).unwrap();
    let prompt = target.tokenizer.encode("The capital of France is", true).unwrap();
    let n = 20;
    let config = engine::GenerateConfig { max_tokens: Some(n), ..engine::GenerateConfig::default() };
    let d = engine::Draft::Model { model: draft.model.as_ref(), cache: draft.model.make_cache() };
    let spec = engine::SpeculativeConfig { num_draft_tokens: 3, adaptive: false, fallback: false, ..Default::default() };
    let mut g = engine::SpeculativeGenerator::new(target.model.as_ref(), &prompt, target.model.make_cache(), d, config, spec).unwrap();
    let tokens: Vec<u32> = g.by_ref().map(|t| t.unwrap().token).collect();
    let stats = g.stats();
    assert!(stats.accepted < stats.proposed, "some drafts were rejected: {stats:?}");
    let (spec_cache, draft_cache) = g.into_caches().unwrap();

    // Plain decoding: the prompt but its last token prefilled, then one token at a time.
    let plain = |m: &dyn engine::models::Model, fed: &[u32]| -> Vec<Box<dyn KvCache>> {
        let mut cache = m.make_cache();
        let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
        engine::prefill::prefill(m, &mut cache, &mlx::Array::from_slice(&ids, &[1, ids.len() as i32]).unwrap(), 2048, None, |_| Ok(())).unwrap();
        for &t in fed {
            m.forward(&mlx::Array::from_slice(&[t as i32], &[1, 1]).unwrap(), &mut cache).unwrap();
        }
        cache
    };
    let flat = |c: &dyn KvCache| -> Vec<Vec<f32>> {
        let (_, nodes) = c.saved_state().unwrap();
        let off = c.offset();
        let mut out = Vec::new();
        let mut walk = vec![StateNode::List(nodes)];
        while let Some(node) = walk.pop() {
            match node {
                StateNode::List(items) => walk.extend(items.into_iter().rev()),
                // Keys and values (B, heads, capacity, D) up to the filled positions.
                StateNode::Array(a) if a.ndim() == 4 && c.as_arrays().is_none() => out.push(a.slice_axis(2, 0, off).unwrap().to_vec::<f32>().unwrap()),
                StateNode::Array(a) => out.push(a.to_vec::<f32>().unwrap()),
                StateNode::Int(_) | StateNode::Str(_) | StateNode::None => {}
            }
        }
        out
    };
    let check = |who: &str, m: &dyn engine::models::Model, got: &[Box<dyn KvCache>], fed: &[u32]| {
        let want = plain(m, fed);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.offset(), b.offset(), "{who} layer {i}: positions");
            assert!(flat(a.as_ref()) == flat(b.as_ref()), "{who} layer {i}: the state differs from plain decoding's");
        }
        eprintln!("{who}: {} layers equal to plain decoding's after {} positions", got.len(), got[0].offset());
    };
    // The target holds the prompt and every token but the pending last one.
    let mut fed = vec![*prompt.last().unwrap()];
    fed.extend(&tokens[..tokens.len() - 1]);
    check("target", target.model.as_ref(), &spec_cache, &fed);
    // The draft model holds what it was fed: as many positions as its caches say.
    let draft_cache = draft_cache.unwrap();
    let held = draft_cache[0].offset() as usize - (prompt.len() - 1);
    check("draft", draft.model.as_ref(), &draft_cache, &fed[..held]);
}

/// Continuous batching: 16 sequences of different lengths joining at different steps and leaving
/// when done (the recurrent states' rows concatenated and filtered as mlx-lm's ArraysCache
/// `extend` / `filter`, the attention layers' rows in a batch KV cache) each give the greedy
/// tokens of their run alone.
#[test]
fn sixteen_batched_sequences_match_their_runs_alone() {
    for v in ["qwen35-f32", "qwen35moe-q4g32"] {
        let m = engine::LoadedModel::load(&model(v)).unwrap();
        let n = 16usize;
        let prompts: Vec<Vec<u32>> = (0..n).map(|i| (0..(3 + 5 * i) as u32).map(|j| (j * 37 + 11 * i as u32) % 400 + 3).collect()).collect();
        let joins: Vec<usize> = (0..n).map(|i| i % 3).collect();
        let lens: Vec<usize> = (0..n).map(|i| 16 + (i * 7) % 13).collect();
        let most = common::assert_batched_equal_alone(&m, v, &prompts, &joins, &lens, 512);
        assert_eq!(most, n, "{v}: at most {most} sequences ran together");
        eprintln!("{v}: {n} batched sequences (up to {most} at once) equal their runs alone");
    }
}

/// The prefix cache of batched serving: a second request sharing a long system prompt starts
/// from the snapshot at the last block boundary they share (`add` reports those positions as
/// cached), and both give the tokens of their runs alone.
#[test]
fn shared_system_prompt_reuses_state_snapshots() {
    use engine::batch::{BatchEngine, SeqParams};
    let m = engine::LoadedModel::load(&model("qwen35-f32")).unwrap();
    let system = "You are a careful assistant. Answer in full sentences, cite what you know, and say so when you do not know something.";
    let prompts: Vec<Vec<u32>> = ["What is the capital of France?", "Name three rivers."]
        .iter()
        .map(|u| {
            let msgs = [tokenizer::ChatMessage::new("system", system), tokenizer::ChatMessage::new("user", *u)];
            m.tokenizer.encode(&m.tokenizer.apply_chat_template(&msgs, true).unwrap(), false).unwrap()
        })
        .collect();
    let shared = prompts[0].iter().zip(&prompts[1]).take_while(|(a, b)| a == b).count();
    assert!(shared >= 32, "the prompts share {shared} tokens");
    let block = 16;
    let alone = |p: &[u32]| -> Vec<u32> {
        let config = engine::GenerateConfig { max_tokens: Some(24), ..engine::GenerateConfig::default() };
        engine::Generator::new(m.model.as_ref(), p, m.model.make_cache(), config).unwrap().map(|g| g.unwrap().token).collect()
    };
    let pool = engine::cache::PagedPool::new(m.model.make_cache().len(), block, 64 << 20);
    let mut batch = BatchEngine::new(m.model.as_ref(), 512, Some(pool));
    let mut cached = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        cached.push(batch.add(i as u64, p.clone(), SeqParams { sampler: Default::default(), keys: None, logprobs: false }).unwrap());
        let mut got = Vec::new();
        while got.len() < 24 {
            got.extend(batch.step().unwrap().into_iter().map(|t| t.token));
        }
        batch.finish(i as u64);
        batch.step().unwrap();
        assert_eq!(got, alone(p), "request {i}: tokens differ from its run alone");
    }
    assert_eq!(cached[0], 0);
    assert_eq!(cached[1], shared / block * block, "the second request starts from the last shared block boundary");
    eprintln!("second request: {} of {} prompt tokens from the prefix cache (shared {shared})", cached[1], prompts[1].len());
}

/// `--kv-cache paged`: the attention layers' keys and values in blocks, the recurrent states as
/// they are; the tokens of the default caches.
#[test]
fn paged_kv_cache_keeps_the_tokens() {
    let dir = model("qwen3next-f32");
    let base = ["generate", "--model", dir.to_str().unwrap(), "--prompt", CHAT_PROMPT, "--max-tokens", "32", "--output", "json"];
    let plain = json_out(&base, None);
    let paged = json_out(&[&base[..], &["--kv-cache", "paged", "--kv-block-size", "16"]].concat(), None);
    assert_eq!(paged["tokens"], plain["tokens"]);
}

/// Pipeline parallel on 2 ranks (each rank its layers and their caches, recurrent or KV), as
/// mlx-lm's PipelineMixin: the single process's tokens and log-probabilities.
#[test]
fn pp2_qwen3_5_matches_single_process() {
    dist::sharded_matches_single(&model("qwen35-f32"), dist::Split::Pipeline);
}

/// Tensor parallel on 2 ranks, as qwen3_5.py's `shard`: each rank keeps half of every DeltaNet
/// layer's key and value heads (convolution channels, in_proj_qkv's q/k/v segments, z/b/a, dt_bias,
/// A_log; out_proj's columns summed over the group), half of the attention heads and MLP hidden
/// units, and half of the head's vocabulary (the logits gathered back): the single process's tokens,
/// log-probabilities within 1e-3. The split's different summation order is ~1e-6 on most tokens
/// but 1.5e-4 on one of the 64 (it grows through the recurrent layers; the gated RMS norm rescales
/// heads whose output is small), the same under mlx-lm's own `shard` (distributed.rs compares ours
/// with that within 1e-5); a wrong split changes the tokens.
#[test]
fn tp2_qwen3_5_matches_single_process() {
    dist::sharded_matches_single_within(&model("qwen35-f32"), dist::Split::Tensor, 1e-3);
}

/// qwen3_5_moe: as qwen3_5, with every routed and shared expert's hidden units split, the router
/// and the shared expert's gate whole, one all_sum per MoE layer.
#[test]
fn tp2_qwen3_5_moe_matches_single_process() {
    dist::sharded_matches_single(&model("qwen35moe-f32"), dist::Split::Tensor);
}

/// qwen3_next.py has no `shard` in mlx-lm: a clear one-line error, not wrong tokens.
#[test]
fn tensor_parallel_over_qwen3_next_is_refused() {
    let dir = model("qwen3next-f32");
    let args = ["launch", "--hosts", "127.0.0.1,127.0.0.1", "--backend", "ring", "--timeout", "60", "--", "generate", "--model", dir.to_str().unwrap(), "--prompt", "hi", "--max-tokens", "4"];
    let o = common::mlx_gen(&args, None);
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("tensor parallel is not supported for model_type qwen3_next") && stderr.contains("mlx-lm"), "{stderr}");
}
