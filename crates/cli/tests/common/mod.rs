//! Shared helpers of the integration tests: the oracle venv (Python mlx-lm), the matrix of tiny
//! test models built by `tests/oracle/make_models.py`, and running our `mlx-gen` binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repo root")
}

pub fn oracle_dir() -> PathBuf {
    repo_root().join("tests/oracle")
}

/// The oracle venv's python (creates the venv once via scripts/oracle-venv.sh). Panics with a
/// clear message when the venv cannot be made: the oracle tests never skip silently.
pub fn venv_python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let script = repo_root().join("scripts/oracle-venv.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        if !out.status.success() {
            panic!(
                "the oracle venv (Python mlx-lm, the reference these tests compare against) could not be \
                 made by {} ({}):\n{}",
                script.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let py = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
        assert!(py.is_file(), "oracle-venv.sh printed {stdout:?}, not a python path");
        py
    })
}

/// FNV-1a, 64 bits: a stable content hash for the cache folder's name.
fn fnv1a(h: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x100_0000_01b3);
    }
}

/// The folder holding the whole model matrix (one subfolder per variant, plus `variants.json`).
/// Built once per content of the Python scripts that make it, under the cargo target dir; a file
/// lock makes parallel test threads and processes build it only once.
pub fn models_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let py = venv_python();
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for f in ["make_models.py", "reference.py", "make_tokenizer.py"] {
            let p = oracle_dir().join(f);
            fnv1a(&mut h, f.as_bytes());
            if let Ok(bytes) = std::fs::read(&p) {
                fnv1a(&mut h, &bytes);
            }
        }
        let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        std::fs::create_dir_all(&base).expect("create CARGO_TARGET_TMPDIR");
        let dir = base.join(format!("oracle-models-{h:016x}"));
        let marker = dir.join(".complete");
        if marker.exists() {
            return dir;
        }
        let lock_path = base.join(format!("oracle-models-{h:016x}.lock"));
        let lock = std::fs::File::create(&lock_path).expect("create lock file");
        lock.lock().expect("lock the model matrix");
        if !marker.exists() {
            if dir.exists() {
                std::fs::remove_dir_all(&dir).expect("remove a partial model matrix");
            }
            let t = std::time::Instant::now();
            let out = Command::new(py)
                .arg(oracle_dir().join("make_models.py"))
                .arg(&dir)
                .stdin(Stdio::null())
                .output()
                .expect("run make_models.py");
            if !out.status.success() {
                panic!(
                    "make_models.py failed ({}):\n{}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            eprintln!("built the oracle model matrix in {:.1}s: {}", t.elapsed().as_secs_f64(), dir.display());
            std::fs::write(&marker, b"").expect("write marker");
        }
        drop(lock);
        dir
    })
}

/// The names of all the variants in the matrix (from variants.json).
pub fn variants() -> serde_json::Map<String, serde_json::Value> {
    let p = models_dir().join("variants.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    match serde_json::from_str(&text).expect("variants.json") {
        serde_json::Value::Object(m) => m,
        v => panic!("variants.json is not an object: {v}"),
    }
}

/// The folder of one variant; panics if the matrix has no such variant.
pub fn model(name: &str) -> PathBuf {
    let d = models_dir().join(name);
    assert!(d.join("config.json").is_file(), "variant {name} missing from the model matrix at {}", d.display());
    d
}

/// Runs our binary with `args`, stdin from `stdin` (empty if None).
pub fn mlx_gen(args: &[&str], stdin: Option<&[u8]>) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlx-gen"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mlx-gen");
    {
        let mut sin = child.stdin.take().unwrap();
        if let Some(bytes) = stdin {
            let _ = sin.write_all(bytes);
        }
    }
    child.wait_with_output().expect("wait for mlx-gen")
}

/// Copies a directory (flat: model folders have no subfolders).
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
}

/// The shape of every user-facing error: exit `code`, exactly one `error:` line on stderr that
/// mentions every needle (case-insensitively), and no panic.
#[track_caller]
pub fn assert_error(out: &Output, code: i32, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "mlx-gen panicked:\n{stderr}");
    assert_eq!(out.status.code(), Some(code), "exit status (stderr: {stderr})");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "want exactly one line on stderr, got:\n{stderr}");
    assert!(lines[0].starts_with("error:"), "stderr does not start with `error:`: {stderr}");
    let lower = stderr.to_lowercase();
    for n in needles {
        assert!(lower.contains(&n.to_lowercase()), "stderr does not mention {n:?}: {stderr}");
    }
}

/// Runs one of the batched reference scripts in tests/oracle (`sample_reference.py`,
/// `cache_reference.py`, ...) once: the cases go in as a JSON array on stdin, one answer per case
/// comes back as a JSON array.
pub fn batched_reference(script: &str, cases: &[serde_json::Value]) -> Vec<serde_json::Value> {
    use std::io::Write;
    let mut child = Command::new(venv_python())
        .arg(oracle_dir().join(script))
        .current_dir(oracle_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    child.stdin.take().unwrap().write_all(serde_json::to_string(cases).unwrap().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("wait for {script}: {e}"));
    assert!(out.status.success(), "{script} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    match serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{script} output is not JSON: {e}")) {
        serde_json::Value::Array(v) => v,
        v => panic!("{script} printed {v}"),
    }
}

/// A copy of test model `variant` whose chat template ends the prompt inside `<think>`, as the
/// DeepSeek-R1 distills' does (for the reasoning tests). The caller removes it.
pub fn reasoning_model_copy(variant: &str, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mlx-gen-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(&model(variant), &dir);
    let cfg_path = dir.join("tokenizer_config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["chat_template"] = serde_json::Value::String(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
            .into(),
    );
    std::fs::write(&cfg_path, serde_json::to_string(&cfg).unwrap()).unwrap();
    let _ = std::fs::remove_file(dir.join("chat_template.jinja"));
    dir
}

/// The folder of one DeepSeek test model (tests/oracle/make_deepseek.py).
pub fn deepseek_model(name: &str) -> PathBuf {
    let dir = deepseek_models_dir();
    let d = dir.join(name);
    assert!(d.join("config.json").is_file(), "DeepSeek variant {name} missing from {}", dir.display());
    d
}

/// The folder of all DeepSeek test models, built once per content of the scripts that make them
/// (a file lock makes parallel test processes build it once).
pub fn deepseek_models_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| script_models_dir("make_deepseek.py", &[], "deepseek-models"))
}

/// The folder of all DeepSeek sparse-attention test models (tests/oracle/make_deepseek_sparse.py).
pub fn deepseek_sparse_models_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| script_models_dir("make_deepseek_sparse.py", &["make_deepseek.py"], "deepseek-sparse-models"))
}

/// The folder of all mixture-of-experts test models (tests/oracle/make_moe.py).
pub fn moe_models_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| script_models_dir("make_moe.py", &["make_deepseek.py"], "moe-models"))
}

/// The folder of all hybrid linear-attention test models (tests/oracle/make_qwen35.py).
pub fn qwen35_models_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| script_models_dir("make_qwen35.py", &[], "qwen35-models"))
}

/// The folder of one mixture-of-experts test model (tests/oracle/make_moe.py).
pub fn moe_model(name: &str) -> PathBuf {
    let d = moe_models_dir().join(name);
    assert!(d.join("config.json").is_file(), "MoE variant {name} missing from {}", moe_models_dir().display());
    d
}

/// The models that `script` (in tests/oracle, run as `script OUTDIR`) builds, under the cargo
/// target dir in `tag-HASH`: built once per content of the scripts that make them (`script`, the
/// scripts it imports beyond make_models.py and make_tokenizer.py, and reference.py); a file lock
/// makes parallel test processes build it once.
fn script_models_dir(script: &str, imports: &[&str], tag: &str) -> PathBuf {
    let py = venv_python();
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for f in [&[script, "make_models.py", "make_tokenizer.py", "reference.py"][..], imports].concat() {
        fnv1a(&mut h, f.as_bytes());
        fnv1a(&mut h, &std::fs::read(oracle_dir().join(f)).unwrap_or_default());
    }
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).expect("create CARGO_TARGET_TMPDIR");
    let dir = base.join(format!("{tag}-{h:016x}"));
    let marker = dir.join(".complete");
    let lock = std::fs::File::create(base.join(format!("{tag}-{h:016x}.lock"))).expect("lock file");
    lock.lock().expect("lock the test models");
    if !marker.exists() {
        let out = Command::new(py)
            .arg(oracle_dir().join(script))
            .arg(&dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {script}: {e}"));
        assert!(out.status.success(), "{script} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        std::fs::write(&marker, b"").expect("write marker");
    }
    dir
}

fn id_list(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("token id") as u32).collect()
}

/// One oracle comparison of the model folder `dir` (whose activations are float32 when `f32`):
/// `mlx-gen generate` gives mlx-lm's greedy tokens and text for `max_tokens` tokens, and the
/// engine's last-position prompt logits are within 1e-5 of mlx-lm's (float32; 1e-2 x the logit
/// range otherwise). Returns the prompt's token count.
pub fn check_against_reference(dir: &Path, f32: bool, prompt: &str, ignore_chat_template: bool, max_tokens: usize) -> usize {
    let case = format!("{} (prompt {prompt:?}, ignore_chat_template={ignore_chat_template})", dir.display());
    let max = max_tokens.to_string();
    let mut args = vec!["--prompt", prompt, "--max-tokens", &max];
    if ignore_chat_template {
        args.push("--ignore-chat-template");
    }
    let out = Command::new(venv_python())
        .arg(oracle_dir().join("reference.py"))
        .arg("--model")
        .arg(dir)
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .expect("run reference.py");
    assert!(out.status.success(), "{case}: reference.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("reference.py JSON");
    let (ref_prompt, ref_tokens) = (id_list(&r["prompt_ids"]), id_list(&r["tokens"]));
    let ref_logits: Vec<f32> = r["logits"].as_array().expect("logits").iter().map(|x| x.as_f64().unwrap() as f32).collect();

    let dir_s = dir.to_str().unwrap();
    let mut cli = vec!["generate", "--model", dir_s, "--output", "json"];
    cli.extend(&args);
    let o = mlx_gen(&cli, None);
    assert!(o.status.success(), "{case}: mlx-gen failed:\n{}", String::from_utf8_lossy(&o.stderr));
    let o: serde_json::Value = serde_json::from_slice(&o.stdout).expect("mlx-gen JSON");
    assert_eq!(id_list(&o["tokens"]), ref_tokens, "{case}: generated tokens differ from mlx-lm's");
    assert_eq!(o["text"], r["text"], "{case}: text differs from mlx-lm's");
    assert_eq!(o["prompt_tokens"].as_u64(), Some(ref_prompt.len() as u64), "{case}: prompt_tokens");

    let max_diff = assert_prompt_logits(&case, dir, &ref_prompt, &ref_logits, f32);
    eprintln!("{case}: {} tokens equal, logits max |diff| {max_diff:e}", ref_tokens.len());
    ref_prompt.len()
}

/// The engine's last-position logits for `prompt` on the model folder `dir` are within 1e-5 of
/// mlx-lm's `ref_logits` (float32 activations, `f32`), or 1e-2 x their range otherwise; returns the
/// largest difference (NaN counts as the largest).
pub fn assert_prompt_logits(case: &str, dir: &Path, prompt: &[u32], ref_logits: &[f32], f32: bool) -> f32 {
    let model = engine::LoadedModel::load(dir).unwrap_or_else(|e| panic!("{case}: load: {e:?}"));
    let logits = model.prompt_logits(prompt).unwrap_or_else(|e| panic!("{case}: prompt_logits: {e:?}"));
    assert_eq!(logits.len(), ref_logits.len(), "{case}: logits length");
    let max_diff = logits.iter().zip(ref_logits).map(|(a, b)| (a - b).abs()).fold(0f32, |m, d| if d.is_nan() || d > m { d } else { m });
    let tol = if f32 {
        1e-5
    } else {
        let (lo, hi) = ref_logits.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        1e-2 * (hi - lo)
    };
    assert!(max_diff <= tol, "{case}: prompt logits differ from mlx-lm's by up to {max_diff:e} (tolerance {tol:e})");
    max_diff
}

/// tests/oracle/convert_compare.py: the two model folders are equal tensor for tensor (names,
/// dtypes, shapes, bytes), with equal config.json and weight maps.
pub fn assert_same_model_folder(ours: &Path, theirs: &Path) {
    let out = Command::new(venv_python())
        .arg(oracle_dir().join("convert_compare.py"))
        .args([ours, theirs])
        .stdin(Stdio::null())
        .output()
        .expect("run convert_compare.py");
    assert!(out.status.success(), "convert_compare.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("convert_compare.py JSON");
    assert_eq!(v["ok"], true, "{} vs {}: {}", ours.display(), theirs.display(), v["problems"]);
    assert!(v["tensors"].as_u64().unwrap_or(0) > 0);
}

/// The folder of the Ministral 3 / Mistral 3 / Llama 4 test models
/// (tests/oracle/make_llama4_mistral3.py).
pub fn llama4_mistral3_models_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| script_models_dir("make_llama4_mistral3.py", &[], "llama4-mistral3-models"))
}

/// Continuous batching against each sequence alone: sequence i joins the batch (room for
/// `max_batch` rows) at step `joins[i]`, is decoded greedily and leaves after `lens[i]` tokens;
/// asserts that each gives the tokens of its run alone, and returns how many ran at once at most.
pub fn assert_batched_equal_alone(m: &engine::LoadedModel, label: &str, prompts: &[Vec<u32>], joins: &[usize], lens: &[usize], max_batch: usize) -> usize {
    use engine::batch::{BatchEngine, SeqParams, StepToken};
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .zip(lens)
        .map(|(p, &n)| {
            let config = engine::GenerateConfig { max_tokens: Some(n), ..engine::GenerateConfig::default() };
            engine::Generator::new(m.model.as_ref(), p, m.model.make_cache(), config).unwrap().map(|g| g.unwrap().token).collect()
        })
        .collect();
    let mut batch = BatchEngine::new(m.model.as_ref(), max_batch, None);
    let mut got = vec![Vec::new(); prompts.len()];
    let (mut most, last_join) = (0, joins.iter().copied().max().unwrap_or(0));
    for step in 0..400 {
        for i in (0..prompts.len()).filter(|&i| joins[i] == step) {
            batch.add(i as u64, prompts[i].clone(), SeqParams { sampler: Default::default(), keys: None, logprobs: false }).unwrap();
        }
        for StepToken { id, token, .. } in batch.step().unwrap() {
            let g = &mut got[id as usize];
            g.push(token);
            if g.len() == lens[id as usize] {
                batch.finish(id);
            }
        }
        most = most.max(batch.len().0);
        if batch.is_idle() && step > last_join {
            break;
        }
    }
    assert_eq!(got, alone, "{label}: batched sequences differ from their runs alone");
    most
}
