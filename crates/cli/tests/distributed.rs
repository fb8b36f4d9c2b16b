//! Tensor and pipeline parallel over MLX's ring backend on loopback: 2 ranks give the
//! single-process greedy tokens (and mlx-lm's sharded ones) for generate, chat, bench and serve,
//! each rank's memory is about half, and a rank that dies or never comes makes the others exit
//! non-zero in bounded time. Separate hosts are in `distributed_hosts.rs`.
mod common;
mod dist;

use dist::*;
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn tp2_ring_llama3_matches_single_process() {
    sharded_matches_single(&common::model("llama3-f32"), Split::Tensor);
}

#[test]
fn tp2_ring_qwen2_matches_single_process() {
    sharded_matches_single(&common::model("qwen2-f32"), Split::Tensor);
}

#[test]
fn pp2_ring_llama3_matches_single_process() {
    sharded_matches_single(&common::model("llama3-f32"), Split::Pipeline);
}

#[test]
fn pp2_ring_qwen2_matches_single_process() {
    sharded_matches_single(&common::model("qwen2-f32"), Split::Pipeline);
}

/// DeepSeek-V2: MLA heads (q, kv_b rows; o columns), the dense layer's MLP, and in the MoE layers
/// every routed and shared expert's hidden units split, the router whole, one all_sum per MoE.
#[test]
fn tp2_ring_deepseek_v2_matches_single_process() {
    sharded_matches_single(&common::deepseek_model("dsv2-f32"), Split::Tensor);
}

/// DeepSeek-V3: as V2, with the absorbed attention's per-head embed_q / unembed_out split by head.
#[test]
fn tp2_ring_deepseek_v3_matches_single_process() {
    sharded_matches_single(&common::deepseek_model("dsv3-f32"), Split::Tensor);
}

#[test]
fn pp2_ring_deepseek_v3_matches_single_process() {
    sharded_matches_single(&common::deepseek_model("dsv3-f32"), Split::Pipeline);
}

/// Ministral 3: Llama's split (heads, MLP hidden units) with the llama-4 query scale and sliding
/// layers; the pipeline stages pick their own first full and sliding layers for the masks.
#[test]
fn tp2_ring_ministral3_matches_single_process() {
    sharded_matches_single(&common::llama4_mistral3_models_dir().join("ministral3-f32"), Split::Tensor);
}

#[test]
fn pp2_ring_ministral3_matches_single_process() {
    sharded_matches_single(&common::llama4_mistral3_models_dir().join("ministral3-f32"), Split::Pipeline);
}

#[test]
fn killed_peer_makes_the_other_rank_fail_fast() {
    let model = common::model("llama3-f32");
    let m = model.to_str().unwrap();
    let hosts = hostfile(2, "kill");
    // Text output streams, so rank 0's first bytes show that generation (and the ring) is running.
    let args = ["--device", "cpu", "generate", "--model", m, "--prompt", "hello", "-m", "3000", "--temp", "0", "--ignore-chat-template"];
    let mut r0 = rank(0, &hosts, 20, &args);
    let mut r1 = rank(1, &hosts, 20, &args);
    let mut first = [0u8; 1];
    let mut out0 = r0.stdout.take().unwrap();
    // Bounded: rank 0's watchdog ends it within 20 s if the ring never forms, closing stdout.
    let got = out0.read(&mut first).unwrap();
    assert_eq!(got, 1, "rank 0 printed nothing before exiting");
    // Keep draining, so that a full pipe never blocks rank 0.
    let drain = std::thread::spawn(move || std::io::copy(&mut out0, &mut std::io::sink()));
    r1.kill().unwrap();
    let killed_at = Instant::now();
    let _ = r1.wait();
    let (status, err) = wait_bounded(&mut r0, Duration::from_secs(30), "rank 0 after its peer died");
    let _ = drain.join();
    assert!(!status.success(), "rank 0 succeeded although its peer was killed mid-generation");
    assert!(err.contains("peer"), "rank 0's error does not name the lost peer:\n{err}");
    assert!(killed_at.elapsed() < Duration::from_secs(25), "rank 0 took {:?} to notice", killed_at.elapsed());
    let _ = std::fs::remove_file(hosts);
}

#[test]
fn unreachable_peer_fails_within_the_timeout() {
    let model = common::model("qwen2-f32");
    let hosts = hostfile(2, "alone");
    let start = Instant::now();
    let mut r0 = rank(0, &hosts, 3, &["--device", "cpu", "generate", "--model", model.to_str().unwrap(), "-m", "4"]);
    let (status, err) = wait_bounded(&mut r0, Duration::from_secs(30), "rank 0 without its peer");
    assert!(!status.success());
    assert!(err.contains("joining the ring group") && err.contains("no answer from a peer"), "unclear error:\n{err}");
    assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
    let _ = std::fs::remove_file(hosts);
}

#[test]
fn launch_fails_when_the_ranks_fail() {
    let out = common::mlx_gen(
        &["launch", "--hosts", "127.0.0.1,127.0.0.1", "--timeout", "10", "--", "--device", "cpu", "generate", "--model", "/nonexistent/model"],
        None,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank") && err.contains("failed"), "launch's error does not name the failed rank:\n{err}");
    // generate, chat, bench and serve run sharded; other commands are refused up front.
    let out = common::mlx_gen(&["launch", "--hosts", "127.0.0.1,127.0.0.1", "--", "convert"], None);
    common::assert_error(&out, 1, &["generate, chat, bench, serve"]);
}

/// Pipeline parallel needs a layer per rank: 3 ranks on a 2-layer model fail with one clear line
/// per rank, and launch names the failed rank.
#[test]
fn pipeline_with_more_ranks_than_layers_fails_clearly() {
    let model = common::model("qwen2-f32");
    let m = model.to_str().unwrap();
    let args = ["launch", "--hosts", "127.0.0.1,127.0.0.1,127.0.0.1", "--timeout", "30", "--", "--device", "cpu", "generate", "--model", m, "--pipeline"];
    let out = common::mlx_gen(&args, None);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("at least one layer per rank") && err.contains("has 2"), "unclear error:\n{err}");
    assert!(err.lines().all(|l| l.starts_with("error: ")), "{err}");
}

/// Python mlx-lm's greedy tokens and their log-probabilities from `sharded_load` +
/// `stream_generate` on 2 ranks started by `mlx.launch` (tests/oracle/sharded_reference.py).
fn mlx_lm_sharded(model: &Path, split: Split) -> Value {
    let py = common::venv_python();
    let launcher = py.with_file_name("mlx.launch");
    let mut cmd = Command::new(&launcher);
    cmd.args(["--hosts", "127.0.0.1,127.0.0.1", "--backend", "ring", "--python"])
        .arg(py)
        .arg(common::oracle_dir().join("sharded_reference.py"))
        .args(["--model", model.to_str().unwrap(), "--prompt", "hello", "--max-tokens", TOKENS])
        .args(split.flags())
        .current_dir(common::oracle_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("run {}: {e}", launcher.display()));
    let (status, err) = wait_bounded(&mut child, Duration::from_secs(600), "mlx.launch sharded_reference.py");
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(status.success(), "mlx-lm's sharded generation failed ({status}):\n{err}");
    let line = out.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON from mlx-lm: {out}\n{err}"));
    let v: Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["group_size"], 2, "mlx-lm did not run on 2 ranks: {line}");
    v
}

/// A copy of `model` with a `model.safetensors.index.json` (mlx-lm's pipeline loader reads the
/// index to find each stage's files); the caller removes it.
fn with_index(model: &Path, tag: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    common::copy_dir(model, &dir);
    let mut header = Vec::new();
    let mut f = std::fs::File::open(dir.join("model.safetensors")).unwrap();
    let mut n = [0u8; 8];
    f.read_exact(&mut n).unwrap();
    f.take(u64::from_le_bytes(n)).read_to_end(&mut header).unwrap();
    let names: serde_json::Map<String, Value> = serde_json::from_slice(&header).unwrap();
    let map: serde_json::Map<String, Value> =
        names.keys().filter(|k| *k != "__metadata__").map(|k| (k.clone(), Value::from("model.safetensors"))).collect();
    let index = serde_json::json!({ "metadata": {}, "weight_map": map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    dir
}

/// Our 2-rank greedy tokens equal mlx-lm's sharded ones, and their log-probabilities agree within
/// 1e-5: the same split sums the same partial products (float32 noise of the backends' kernels,
/// ~1e-7 here), where a different split or reduction order is off by the whole tensor-parallel
/// difference (up to 1.5e-4 on qwen3_5, see `tp2_qwen3_5_matches_single_process`).
fn ours_equal_mlx_lm(model: &Path, split: Split) {
    let name = model.file_name().unwrap().to_string_lossy().into_owned();
    let args = generate_args(model);
    let mut argv: Vec<&str> = args.iter().map(String::as_str).collect();
    argv.extend(split.flags());
    let ours = launch2(&argv, &format!("launch generate {name} ({split:?})"));
    let theirs = mlx_lm_sharded(model, split);
    assert!(tokens(&theirs).len() >= 32, "{name}: mlx-lm generated only {} tokens", tokens(&theirs).len());
    assert_eq!(tokens(&ours), tokens(&theirs), "{name}: {split:?}-parallel tokens differ from mlx-lm's sharded generation");
    for (i, (x, y)) in logprobs(&ours).iter().zip(logprobs(&theirs)).enumerate() {
        assert!((x - y).abs() <= 1e-5, "{name}: token {i}: logprob {x} ours vs {y} mlx-lm's, {split:?}-parallel");
    }
}

/// mlx-lm's `shard` exists for llama, qwen2 and DeepSeek: the same split gives the same tokens.
#[test]
fn tp2_tokens_equal_mlx_lm_sharded_generation() {
    ours_equal_mlx_lm(&common::model("llama3-f32"), Split::Tensor);
    ours_equal_mlx_lm(&common::model("qwen2-f32"), Split::Tensor);
    ours_equal_mlx_lm(&common::deepseek_model("dsv3-f32"), Split::Tensor);
}

/// qwen3_5.py's `shard` (DeltaNet heads, attention heads, MLP or experts, the head's vocabulary),
/// for qwen3_5, qwen3_5_moe and a qwen3_5 with one key/value head (repeated for the 2 ranks).
#[test]
fn tp2_qwen3_5_tokens_equal_mlx_lm_sharded_generation() {
    for name in ["qwen35-f32", "qwen35moe-f32"] {
        ours_equal_mlx_lm(&common::qwen35_models_dir().join(name), Split::Tensor);
    }
    ours_equal_mlx_lm(qwen35_one_kv_head(), Split::Tensor);
}

/// Fewer key/value heads (1) than ranks (2): each rank keeps a copy of the one head (mlx-lm's
/// `repeat_kv_layer_inplace`), its 2 query heads attending over it, as the single process.
#[test]
fn tp2_qwen3_5_with_one_kv_head_matches_single_process() {
    sharded_matches_single(qwen35_one_kv_head(), Split::Tensor);
}

/// make_qwen35.py's qwen3_5 (Hugging Face layout) with only its first key/value head: k_proj and
/// v_proj keep their first head_dim rows; built once per test process.
fn qwen35_one_kv_head() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let src = common::qwen35_models_dir().join("qwen35-f32");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("qwen35-kv1-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        common::copy_dir(&src, &dir);
        let mut config: Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
        let text = &mut config["text_config"];
        let (kv_heads, head_dim) = (text["num_key_value_heads"].as_i64().unwrap() as i32, text["head_dim"].as_i64().unwrap() as i32);
        assert!(kv_heads > 1, "the source model must have several key/value heads");
        text["num_key_value_heads"] = Value::from(1);
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let st = mlx::io::load_safetensors(&src.join("model.safetensors")).unwrap();
        let mut kept = 0;
        let tensors: Vec<(String, mlx::Array)> = st
            .tensors
            .into_iter()
            .map(|(name, a)| {
                if name.ends_with("self_attn.k_proj.weight") || name.ends_with("self_attn.v_proj.weight") {
                    assert_eq!(a.dim(0), kv_heads * head_dim, "{name}");
                    kept += 1;
                    (name, a.slice_axis(0, 0, head_dim).unwrap()) // (head_dim, hidden)
                } else {
                    (name, a)
                }
            })
            .collect();
        assert!(kept >= 2, "no attention layer in the source model");
        let named: Vec<(&str, &mlx::Array)> = tensors.iter().map(|(n, a)| (n.as_str(), a)).collect();
        let meta: Vec<(&str, &str)> = st.metadata.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        mlx::io::save_safetensors(&dir.join("model.safetensors"), &named, &meta).unwrap();
        dir
    })
}

/// mlx-lm pipelines qwen2 and DeepSeek (not llama) with the same layer split.
#[test]
fn pp2_tokens_equal_mlx_lm_sharded_generation() {
    for (model, tag) in [(common::model("qwen2-f32"), "pp-qwen2"), (common::deepseek_model("dsv2-f32"), "pp-dsv2")] {
        let dir = with_index(&model, tag);
        ours_equal_mlx_lm(&dir, Split::Pipeline);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Rank 0 reads the conversation (two turns and a slash command in between) and hands it to rank 1:
/// the 2-rank transcript, tensor and pipeline parallel, equals the single-process one.
#[test]
fn chat_on_2_ranks_matches_single_process() {
    let model = common::model("qwen2-f32");
    let m = model.to_str().unwrap();
    let input = b"hello there\n/system be brief\nwhat is up\n/reset\nhello there\n";
    let args = ["--device", "cpu", "chat", "--model", m, "-m", "24", "--temp", "0"];
    let single = common::mlx_gen(&args, Some(input));
    assert!(single.status.success(), "{}", String::from_utf8_lossy(&single.stderr));
    let transcript = String::from_utf8_lossy(&single.stdout).into_owned();
    assert!(transcript.contains("System prompt set.") && transcript.contains("Conversation reset."), "{transcript}");
    for split in [Split::Tensor, Split::Pipeline] {
        let mut launch = vec!["launch", "--hosts", "127.0.0.1,127.0.0.1", "--timeout", "60", "--"];
        launch.extend(args);
        launch.extend(split.flags());
        let sharded = common::mlx_gen(&launch, Some(input));
        assert!(sharded.status.success(), "{split:?}: {}", String::from_utf8_lossy(&sharded.stderr));
        assert_eq!(String::from_utf8_lossy(&sharded.stdout), transcript, "{split:?}: the 2-rank chat differs");
    }
}

/// Every rank runs the same trials; rank 0 alone reports, once.
#[test]
fn bench_on_2_ranks_reports_once() {
    let model = common::model("llama3-f32");
    let m = model.to_str().unwrap();
    for split in [Split::Tensor, Split::Pipeline] {
        let mut argv = vec!["--device", "cpu", "bench", "--model", m, "-p", "32", "-g", "16", "-n", "2", "--json"];
        argv.extend(split.flags());
        let report = launch2(&argv, &format!("launch bench ({split:?})"));
        assert_eq!(report["trials"].as_array().map(Vec::len), Some(2), "{report}");
        assert!(report["median"]["generation_tps"].as_f64().unwrap() > 0.0, "{report}");
    }
}

/// A llama whose layers dominate its size (4 layers of hidden 256 and MLP 1024, a 512-token
/// vocabulary: 16.8 MB of layers, 1 MB of embeddings and head), random f32 weights, with
/// llama3-f32's tokenizer. The caller removes it.
fn wide_model() -> PathBuf {
    let src = common::model("llama3-f32");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("wide-llama-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let (d, ff, layers, vocab) = (256, 1024, 4, config["vocab_size"].as_i64().unwrap() as i32);
    config["hidden_size"] = d.into();
    config["intermediate_size"] = ff.into();
    config["num_hidden_layers"] = layers.into();
    config["num_attention_heads"] = 4.into();
    config["num_key_value_heads"] = 4.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut shapes: Vec<(String, Vec<i32>)> = vec![
        ("model.embed_tokens.weight".into(), vec![vocab, d]),
        ("model.norm.weight".into(), vec![d]),
        ("lm_head.weight".into(), vec![vocab, d]),
    ];
    for l in 0..layers {
        for (n, s) in [("self_attn.q_proj", [d, d]), ("self_attn.k_proj", [d, d]), ("self_attn.v_proj", [d, d]), ("self_attn.o_proj", [d, d])]
            .into_iter()
            .chain([("mlp.gate_proj", [ff, d]), ("mlp.up_proj", [ff, d]), ("mlp.down_proj", [d, ff])])
        {
            shapes.push((format!("model.layers.{l}.{n}.weight"), s.to_vec()));
        }
        for n in ["input_layernorm", "post_attention_layernorm"] {
            shapes.push((format!("model.layers.{l}.{n}.weight"), vec![d]));
        }
    }
    // Norms 1, matrices uniform in [-0.06, 0.06), each from its own key.
    let tensors: Vec<(String, mlx::Array)> = shapes
        .into_iter()
        .enumerate()
        .map(|(i, (n, s))| {
            let a = if s.len() == 1 {
                mlx::ops::full(&s, 1.0, mlx::Dtype::F32).unwrap()
            } else {
                let key = mlx::random::key(i as u64).unwrap();
                mlx::random::uniform_with_key(&s, mlx::Dtype::F32, &key).unwrap().sub_scalar(0.5).unwrap().mul_scalar(0.12).unwrap()
            };
            (n, a)
        })
        .collect();
    let refs: Vec<(&str, &mlx::Array)> = tensors.iter().map(|(n, a)| (n.as_str(), a)).collect();
    mlx::io::save_safetensors(&dir.join("model.safetensors"), &refs, &[("format", "mlx")]).unwrap();
    dir
}

/// Each rank's peak memory (weights resident plus the run's activations and cache) against the
/// single process's, for 2-way tensor and pipeline parallel: close to half, since the layers make up
/// 94% of the model and only the embeddings and head are kept whole on every rank. A pipeline
/// rank's peak also shows that it never read the other stage's tensors (they would be resident).
#[test]
fn per_rank_peak_memory_is_about_half() {
    let dir = wide_model();
    let args = generate_args(&dir);
    let mut argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let single = json_of(&common::mlx_gen(&argv, None), "single-process generate");
    let whole = single["peak_memory_gb"].as_f64().unwrap() * 1e3;
    argv.push("--pipeline");
    for split in [Split::Tensor, Split::Pipeline] {
        let argv = if split == Split::Pipeline { &argv[..] } else { &argv[..argv.len() - 1] };
        let hosts = hostfile(2, "mem");
        let [r0, r1] = run_pair([rank(0, &hosts, 60, argv), rank(1, &hosts, 60, argv)], &format!("wide model ({split:?})"));
        let _ = std::fs::remove_file(hosts);
        assert_eq!(tokens(&r0), tokens(&single), "{split:?}: tokens differ from the single-process ones");
        let peaks = [r0["peak_memory_gb"].as_f64().unwrap() * 1e3, r1["peak_memory_gb"].as_f64().unwrap() * 1e3];
        eprintln!(
            "wide model peak memory: single {whole:.2} MB; {split:?} 2-way: rank 0 {:.2} MB ({:.0}%), rank 1 {:.2} MB ({:.0}%)",
            peaks[0],
            100.0 * peaks[0] / whole,
            peaks[1],
            100.0 * peaks[1] / whole
        );
        for (r, p) in peaks.iter().enumerate() {
            assert!(*p < 0.62 * whole && *p > 0.4 * whole, "{split:?}: rank {r} peak {p:.2} MB is not about half of {whole:.2} MB");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mlx-gen serve` on 2 ranks (rank 0 serves, rank 1 replays its engine calls) answers as one
/// process does, greedy and seeded, several requests batched together, after both ranks warmed up;
/// SIGTERM to the launcher ends every rank.
#[test]
fn serve_on_2_ranks_answers_as_one_process() {
    use std::io::{BufRead, BufReader};
    let model = common::model("llama3-f32");
    let m = model.to_str().unwrap();
    let start = |launch: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlx-gen"));
        if launch {
            cmd.args(["launch", "--hosts", "127.0.0.1,127.0.0.1", "--backend", "ring", "--timeout", "60", "--"]);
        }
        let mut child = cmd
            .args(["--device", "cpu", "serve", "--model", m, "--port", "0"])
            // Both ranks warm up alike (their forward passes' collectives meet) and leave no trace.
            .args(["--warmup", if launch { "on" } else { "off" }])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("http://") {
                    let _ = tx.send(line[at..].split_whitespace().next().unwrap_or("").to_owned());
                }
            }
        });
        let base = rx.recv_timeout(Duration::from_secs(120)).expect("serve did not report its address");
        (child, base)
    };
    let requests: Vec<Value> = (0..4)
        .map(|i| {
            serde_json::json!({
                "messages": [{"role": "user", "content": format!("request number {i}")}],
                "max_tokens": 20 + 4 * i,
                "temperature": if i % 2 == 0 { 0.0 } else { 0.8 },
                "seed": i,
            })
        })
        .collect();
    let ask_all = |base: &str| -> Vec<String> {
        let handles: Vec<_> = requests
            .iter()
            .map(|r| {
                let (url, body) = (format!("{base}/v1/chat/completions"), r.to_string());
                std::thread::spawn(move || {
                    let text = ureq::post(&url).set("Content-Type", "application/json").send_string(&body).unwrap().into_string().unwrap();
                    let v: Value = serde_json::from_str(&text).unwrap();
                    v["choices"][0]["message"]["content"].as_str().unwrap().to_owned()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    };
    let (mut single, base) = start(false);
    let want = ask_all(&base);
    let _ = single.kill();
    let _ = single.wait();
    let (mut group, base) = start(true);
    let got = ask_all(&base);
    assert_eq!(got, want, "2-rank answers differ from the single process's");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(group.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = group.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "launch still running 30 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success(), "a launcher stopped by a signal reports it");
    let leftover = Command::new("pgrep").args(["-f", &format!("serve --model {m} --port 0")]).output().unwrap();
    assert!(leftover.stdout.is_empty(), "ranks left running: {}", String::from_utf8_lossy(&leftover.stdout));
}
