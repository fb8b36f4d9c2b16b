//! Bad input: `mlx-gen generate` must exit 1 (clap's usage errors: 2) with one line on stderr,
//! starting with `error:` and naming the problem, and never panic.
//! Broken models are copies of a good tiny variant of the oracle matrix, damaged.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

/// A good variant to damage: float32, one `model.safetensors`, tied embeddings.
const GOOD: &str = "qwen2-f32";

/// A fresh copy of the good model, in a folder of its own.
fn broken_copy(case: &str) -> PathBuf {
    let dst = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("errors").join(case);
    if dst.exists() {
        std::fs::remove_dir_all(&dst).unwrap();
    }
    common::copy_dir(&common::model(GOOD), &dst);
    dst
}

fn generate(model: &Path, prompt: &str, extra: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut args = vec!["generate", "--model", model.to_str().unwrap(), "--prompt", prompt, "--max-tokens", "2"];
    args.extend_from_slice(extra);
    common::mlx_gen(&args, stdin)
}

use common::assert_error;

// ---------------------------------------------------------------------------------------------
// safetensors editing: parse, change the tensor set, write back contiguous.

struct Tensor {
    name: String,
    dtype: String,
    shape: Vec<u64>,
    data: Vec<u8>,
}

fn read_safetensors(path: &Path) -> (Vec<Tensor>, Option<Value>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut meta = None;
    let mut tensors = Vec::new();
    for (name, v) in header {
        if name == "__metadata__" {
            meta = Some(v);
            continue;
        }
        let off: Vec<usize> = v["data_offsets"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        tensors.push(Tensor {
            name,
            dtype: v["dtype"].as_str().unwrap().to_string(),
            shape: v["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect(),
            data: data[off[0]..off[1]].to_vec(),
        });
    }
    (tensors, meta)
}

fn write_safetensors(path: &Path, tensors: &[Tensor], meta: Option<Value>) {
    let mut header = serde_json::Map::new();
    if let Some(m) = meta {
        header.insert("__metadata__".into(), m);
    }
    let mut off = 0usize;
    for t in tensors {
        header.insert(
            t.name.clone(),
            serde_json::json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + t.data.len()]}),
        );
        off += t.data.len();
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    for t in tensors {
        out.extend_from_slice(&t.data);
    }
    std::fs::write(path, out).unwrap();
}

fn edit_weights(dir: &Path, f: impl FnOnce(&mut Vec<Tensor>)) {
    let p = dir.join("model.safetensors");
    let (mut tensors, meta) = read_safetensors(&p);
    f(&mut tensors);
    write_safetensors(&p, &tensors, meta);
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let p = dir.join("config.json");
    let mut cfg: serde_json::Map<String, Value> = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut cfg);
    std::fs::write(&p, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
}

// ---------------------------------------------------------------------------------------------

/// The undamaged copy works: the checks below fail for the damage, not for the copy.
#[test]
fn good_copy_works() {
    let d = broken_copy("good");
    let out = generate(&d, "Hello", &[], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    edit_weights(&d, |_| {}); // a rewrite that changes nothing must also load
    let out = generate(&d, "Hello", &[], None);
    assert!(out.status.success(), "rewritten safetensors: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn model_dir_missing() {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("errors/no-such-model");
    let out = generate(&d, "Hello", &[], None);
    assert_error(&out, 1, &["no-such-model"]);
}

#[test]
fn config_missing() {
    let d = broken_copy("config-missing");
    std::fs::remove_file(d.join("config.json")).unwrap();
    assert_error(&generate(&d, "Hello", &[], None), 1, &["config.json"]);
}

#[test]
fn config_not_json() {
    let d = broken_copy("config-not-json");
    std::fs::write(d.join("config.json"), "{\"model_type\": \"qwen2\", \"hidden_size\": ").unwrap();
    assert_error(&generate(&d, "Hello", &[], None), 1, &["config.json"]);
}

#[test]
fn unknown_model_type() {
    let d = broken_copy("unknown-model-type");
    edit_config(&d, |c| {
        c.insert("model_type".into(), "gpt_neox".into());
    });
    assert_error(&generate(&d, "Hello", &[], None), 1, &["gpt_neox", "llama", "mistral", "qwen2", "qwen3"]);
}

#[test]
fn safetensors_missing() {
    let d = broken_copy("safetensors-missing");
    std::fs::remove_file(d.join("model.safetensors")).unwrap();
    assert_error(&generate(&d, "Hello", &[], None), 1, &["safetensors"]);
}

#[test]
fn safetensors_truncated() {
    let d = broken_copy("safetensors-truncated");
    let p = d.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    assert_error(&generate(&d, "Hello", &[], None), 1, &["model.safetensors"]);
}

#[test]
fn tensor_wrong_shape() {
    // Transposed: same bytes, only the shape is wrong.
    let name = "model.layers.1.mlp.gate_proj.weight";
    let d = broken_copy("tensor-wrong-shape");
    edit_weights(&d, |ts| {
        let t = ts.iter_mut().find(|t| t.name == name).expect(name);
        t.shape.reverse();
        assert_ne!(t.shape[0], t.shape[1]);
    });
    assert_error(&generate(&d, "Hello", &[], None), 1, &[name]);
}

#[test]
fn tensor_missing() {
    let name = "model.layers.1.self_attn.k_proj.weight";
    let d = broken_copy("tensor-missing");
    edit_weights(&d, |ts| {
        let n = ts.len();
        ts.retain(|t| t.name != name);
        assert_eq!(ts.len(), n - 1);
    });
    assert_error(&generate(&d, "Hello", &[], None), 1, &[name]);
}

#[test]
fn tensor_unused() {
    let name = "model.layers.0.mlp.extra_proj.weight";
    let d = broken_copy("tensor-unused");
    edit_weights(&d, |ts| {
        ts.push(Tensor { name: name.into(), dtype: "F32".into(), shape: vec![4, 4], data: vec![0u8; 64] });
    });
    assert_error(&generate(&d, "Hello", &[], None), 1, &[name]);
}

#[test]
fn empty_prompt() {
    let d = common::model(GOOD);
    assert_error(&generate(&d, "", &[], None), 1, &["prompt"]);
}

#[test]
fn empty_stdin_prompt() {
    let d = common::model(GOOD);
    assert_error(&generate(&d, "-", &[], Some(b"")), 1, &["prompt"]);
}

#[test]
fn unknown_flag() {
    let d = common::model(GOOD);
    assert_error(&generate(&d, "Hello", &["--no-such-flag"], None), 2, &["--no-such-flag"]);
}

#[test]
fn negative_temperature() {
    let d = common::model(GOOD);
    assert_error(&generate(&d, "Hello", &["--temp", "-1"], None), 1, &["temp"]);
}

#[test]
fn serve_zero_sizes() {
    let d = common::model(GOOD);
    for flag in ["--prompt-concurrency", "--max-batch-size", "--prefill-step-size"] {
        let out = common::mlx_gen(&["serve", "--model", d.to_str().unwrap(), "--port", "0", flag, "0"], None);
        assert_error(&out, 1, &[flag]);
    }
}
