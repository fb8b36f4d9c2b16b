//! `mlx-gen convert` against `mlx_lm.convert` on the tiny float models of the oracle matrix: the
//! output folders must be equal tensor for tensor (tests/oracle/convert_compare.py) with the same
//! config.json, and mlx-gen's greedy tokens from our folder must equal mlx-lm's from its folder.
//! Our files start every tensor's data on a 16 KiB page (for zero-copy loading) and mlx-lm reads
//! them as they are.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn work(case: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("convert").join(case);
    if d.exists() {
        std::fs::remove_dir_all(&d).unwrap();
    }
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn mlx_lm_convert(src: &Path, dst: &Path, flags: &[&str]) {
    let out = Command::new(common::venv_python())
        .args(["-m", "mlx_lm", "convert", "--hf-path"])
        .arg(src)
        .arg("--mlx-path")
        .arg(dst)
        .args(flags)
        .stdin(Stdio::null())
        .output()
        .expect("run mlx_lm convert");
    assert!(out.status.success(), "mlx_lm.convert {flags:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

fn ours_convert(args: &[&str]) -> std::process::Output {
    let mut all = vec!["convert"];
    all.extend_from_slice(args);
    common::mlx_gen(&all, None)
}

fn compare(ours: &Path, theirs: &Path) {
    common::assert_same_model_folder(ours, theirs);
}

/// Greedy tokens of mlx-lm (reference.py) on `theirs` and of mlx-gen on `ours`.
fn same_generation(ours: &Path, theirs: &Path) {
    let prompt = "The capital of France is";
    let out = Command::new(common::venv_python())
        .arg(common::oracle_dir().join("reference.py"))
        .arg("--model")
        .arg(theirs)
        .args(["--prompt", prompt, "--max-tokens", "24", "--ignore-chat-template", "--no-logits"])
        .stdin(Stdio::null())
        .output()
        .expect("run reference.py");
    assert!(out.status.success(), "reference.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).expect("reference.py JSON");
    let dir = ours.to_str().unwrap();
    let args = ["generate", "--model", dir, "--prompt", prompt, "--max-tokens", "24", "--ignore-chat-template"];
    let o = common::mlx_gen(&[&args[..], &["--output", "json"]].concat(), None);
    assert!(o.status.success(), "mlx-gen generate failed:\n{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).expect("mlx-gen JSON");
    assert_eq!(v["tokens"], r["tokens"], "greedy tokens from {} differ from mlx-lm's", ours.display());
}

fn case(name: &str, variant: &str, flags: &[&str]) {
    case_from(name, &common::model(variant), flags);
}

fn case_from(name: &str, src: &Path, flags: &[&str]) {
    let dir = work(name);
    let (ours, theirs) = (dir.join("ours"), dir.join("theirs"));
    mlx_lm_convert(src, &theirs, flags);
    let mut args = vec!["--model", src.to_str().unwrap(), "--mlx-path", ours.to_str().unwrap()];
    args.extend_from_slice(flags);
    let out = ours_convert(&args);
    assert!(out.status.success(), "mlx-gen convert {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    compare(&ours, &theirs);
    same_generation(&ours, &theirs);
}

#[test]
fn q4_g64_equals_mlx_lm() {
    case("llama3-q4g64", "llama3-f32", &["-q"]);
}

/// Absolute file offsets of every tensor's data in one safetensors file.
fn data_starts(path: &Path) -> Vec<(String, u64)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n as usize]).unwrap();
    let tensors = header.into_iter().filter(|(k, _)| k != "__metadata__");
    tensors.map(|(k, v)| (k, 8 + n + v["data_offsets"][0].as_u64().unwrap())).collect()
}

#[test]
fn page_aligned_output_is_what_mlx_lm_loads() {
    let dir = work("aligned-q4");
    let ours = dir.join("ours");
    let out = ours_convert(&["--model", common::model("qwen2-bf16").to_str().unwrap(), "--mlx-path", ours.to_str().unwrap(), "-q"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let file = ours.join("model.safetensors");
    let starts = data_starts(&file);
    assert!(starts.len() > 10);
    // The data start on a page; every tensor on a multiple of its element size.
    let first = starts.iter().map(|(_, at)| *at).min().unwrap();
    assert_eq!(first % 16384, 0, "the data start at {first}");
    for (name, at) in &starts {
        assert_eq!(at % 4, 0, "{name} starts at {at}");
    }
    // A valid safetensors file: the Hugging Face library (which refuses holes) opens it.
    let check = "import sys\nfrom safetensors import safe_open\nwith safe_open(sys.argv[1], framework='numpy') as f: print(len(list(f.keys())))";
    let o = Command::new(common::venv_python()).args(["-c", check, file.to_str().unwrap()]).output().unwrap();
    assert!(o.status.success(), "safetensors refuses our file: {}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), starts.len().to_string());
    // mlx-lm's load() on our folder gives the tokens mlx-gen gives on it.
    same_generation(&ours, &ours);
    // And mlx-gen on the CPU uses every tensor in place (bench's load report; CUDA copies each once).
    let o = common::mlx_gen(&["bench", "--model", ours.to_str().unwrap(), "-p", "4", "-g", "2", "-n", "1", "--json"], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    if !v["device"].as_str().unwrap_or_default().to_lowercase().contains("cpu") {
        return;
    }
    assert_eq!(v["load"]["tensors_in_place"].as_u64(), Some(starts.len() as u64), "{}", v["load"]);
    assert_eq!(v["load"]["tensors_copied"].as_u64(), Some(0), "{}", v["load"]);
}

#[test]
fn q8_g32_from_bf16_equals_mlx_lm() {
    case("qwen2-q8g32", "qwen2-bf16", &["-q", "--q-bits", "8", "--q-group-size", "32"]);
}

#[test]
fn dtype_conversion_equals_mlx_lm() {
    case("qwen3-bf16", "qwen3-f32", &["--dtype", "bfloat16"]);
}

#[test]
fn quantized_half_precision_equals_mlx_lm() {
    case("mistral-f16-q3g32", "mistral-f32", &["-q", "--dtype", "float16", "--q-bits", "3", "--q-group-size", "32"]);
}

#[test]
fn mxfp4_equals_mlx_lm() {
    case("llama3-mxfp4", "llama3-f32", &["-q", "--q-mode", "mxfp4"]);
}

#[test]
fn nvfp4_equals_mlx_lm() {
    case("qwen3-nvfp4", "qwen3-f32", &["-q", "--q-mode", "nvfp4"]);
}

#[test]
fn mxfp8_from_bf16_equals_mlx_lm() {
    case("qwen2-mxfp8", "qwen2-bf16", &["-q", "--q-mode", "mxfp8"]);
}

/// The experts' gathered matmul in a float mode, beside the router's own 8-bit affine entry.
#[test]
fn mxfp4_mixture_of_experts_equals_mlx_lm() {
    case_from("qwen3moe-mxfp4", &common::moe_model("qwen3moe-f32"), &["-q", "--q-mode", "mxfp4"]);
}

#[test]
fn mixed_recipe_equals_mlx_lm() {
    case("mistral-mixed-2-6", "mistral-f32", &["-q", "--quant-predicate", "mixed_2_6", "--q-group-size", "32"]);
}

#[test]
fn invalid_quantization_flags_are_one_line_errors() {
    let dir = work("bad-flags");
    let src = common::model("qwen2-f32");
    let (src, dst) = (src.to_str().unwrap(), dir.join("out"));
    let dst = dst.to_str().unwrap();
    let run = |flags: &[&str]| ours_convert(&[&["--model", src, "--mlx-path", dst, "-q"][..], flags].concat());
    one_error_line(&run(&["--q-mode", "mxfp4", "--q-bits", "8"]), "--q-mode mxfp4 quantizes with 4 bits and group size 32 only");
    one_error_line(&run(&["--q-mode", "nvfp4", "--quant-predicate", "mixed_3_6"]), "affine mode only");
    one_error_line(&run(&["--q-bits", "7"]), "cannot quantize with 7 bits");
    assert!(!dir.join("out").exists());
}

fn one_error_line(out: &std::process::Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "expected exit 1, stderr:\n{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "expected one line on stderr:\n{stderr}");
    assert!(stderr.starts_with("error:") && stderr.contains(needle), "stderr {stderr:?} lacks {needle:?}");
}

#[test]
fn refuses_to_overwrite_without_force_and_hf_path_alias() {
    let dir = work("overwrite");
    let src = common::model("qwen2-f32");
    let dst = dir.join("out");
    std::fs::create_dir_all(&dst).unwrap();
    std::fs::write(dst.join("keep"), b"x").unwrap();
    let args = ["--hf-path", src.to_str().unwrap(), "--mlx-path", dst.to_str().unwrap(), "-q"];
    one_error_line(&ours_convert(&args), "already exists");
    assert!(dst.join("keep").is_file(), "the existing folder was touched");
    let out = ours_convert(&[&args[..], &["--force"]].concat());
    assert!(out.status.success(), "--force failed:\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(!dst.join("keep").exists() && dst.join("model.safetensors").is_file());
    let config: Value = serde_json::from_str(&std::fs::read_to_string(dst.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization"], serde_json::json!({"group_size": 64, "bits": 4, "mode": "affine"}));
    let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert_eq!(leftovers.len(), 1, "temporary folders left behind: {leftovers:?}");
}

#[test]
fn a_failed_conversion_leaves_nothing() {
    let dir = work("failed");
    let src = dir.join("src");
    common::copy_dir(&common::model("qwen2-f32"), &src);
    let st = src.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    let dst = dir.join("out");
    let out = ours_convert(&["--model", src.to_str().unwrap(), "--mlx-path", dst.to_str().unwrap(), "-q"]);
    assert_eq!(out.status.code(), Some(1), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim_end().lines().count(), 1);
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("src")], "a half-written output was left: {names:?}");
}

/// The synthetic llama GGUF of the import tests (tests/oracle/gguf_make_synthetic.py).
fn synthetic_gguf() -> PathBuf {
    let dir = work("gguf-synthetic");
    let out = Command::new(common::venv_python())
        .arg(common::oracle_dir().join("gguf_make_synthetic.py"))
        .arg(&dir)
        .stdin(Stdio::null())
        .output()
        .expect("run gguf_make_synthetic.py");
    assert!(out.status.success(), "gguf_make_synthetic.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
    dir.join("tiny.gguf")
}

#[test]
fn gguf_sources_convert_and_truncated_ones_fail_cleanly() {
    let gguf = synthetic_gguf();
    let dir = work("gguf");
    let dst = dir.join("out");
    let out = ours_convert(&["--model", gguf.to_str().unwrap(), "--mlx-path", dst.to_str().unwrap()]);
    assert!(out.status.success(), "convert from GGUF failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let config: Value = serde_json::from_str(&std::fs::read_to_string(dst.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization"]["bits"], 4, "{config}");
    assert!(config["quantization"].as_object().unwrap().contains_key("model.layers.0.self_attn.q_proj"), "{config}");

    // A truncated GGUF: one line, exit 1, no output folder, and nothing in mlx-gen's cache.
    let bytes = std::fs::read(&gguf).unwrap();
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let bad = dir.join("bad");
    let out = ours_convert(&["--model", cut.to_str().unwrap(), "--mlx-path", bad.to_str().unwrap()]);
    one_error_line(&out, "truncated");
    assert!(!bad.exists());
    let cache = dir.join("cache");
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-gen"))
        .args(["generate", "--model", cut.to_str().unwrap(), "--prompt", "hi", "--max-tokens", "2"])
        .env("MLX_GEN_CACHE", &cache)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    one_error_line(&out, "truncated");
    let models = cache.join("models");
    let left: Vec<_> = std::fs::read_dir(&models).map(|r| r.filter_map(|e| e.ok()).map(|e| e.file_name()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "the failed import left {left:?} in the cache");
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert!(names.iter().all(|n| !n.to_string_lossy().starts_with('.')), "temporary folders left: {names:?}");
}

/// `-d` (mlx_lm.convert's `--dequantize`): a 4-bit folder, one with per-layer bit widths and a
/// mixture of experts with its 8-bit router back to floats, tensor for tensor what mlx-lm writes.
#[test]
fn dequantize_equals_mlx_lm() {
    case("llama3-q4g64-dequantized", "llama3-q4g64", &["-d"]);
    case("qwen3-mixed-dequantized", "qwen3-mixed-custom", &["-d", "--dtype", "float32"]);
    case_from("qwen3moe-q4g32-dequantized", &common::moe_model("qwen3moe-q4g32"), &["-d"]);
}

#[test]
fn dequantize_misuse_is_a_one_line_error() {
    let dir = work("bad-dequantize");
    let dst = dir.join("out");
    let dst = dst.to_str().unwrap();
    let (quantized, float) = (common::model("llama3-q4g64"), common::model("llama3-f32"));
    let run = |src: &Path, flags: &[&str]| ours_convert(&[&["--model", src.to_str().unwrap(), "--mlx-path", dst][..], flags].concat());
    one_error_line(&run(&quantized, &["-q", "-d"]), "choose either -q (quantize) or -d (dequantize), not both");
    one_error_line(&run(&float, &["-d"]), "is not quantized");
    assert!(!dir.join("out").exists());
}
