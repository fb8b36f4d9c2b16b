//! Helpers of the tokenizer tests: the oracle venv's python, temporary folders, the tokenizer
//! kinds tests/oracle/make_tokenizer.py builds and edits of their configs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The oracle venv's python; panics with the script's stderr when the venv cannot be made.
pub fn python() -> PathBuf {
    let script = repo_root().join("scripts/oracle-venv.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .expect("run oracle-venv.sh");
    assert!(
        out.status.success(),
        "oracle-venv.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let py = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
    assert!(
        py.is_file(),
        "oracle-venv.sh printed {stdout:?}, not a python path"
    );
    py
}

/// A unique folder under the system temp dir, removed on drop (also when a test fails).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("mlx-gen-tok-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run_python(py: &Path, args: &[&str], stdin: &str) -> String {
    use std::io::Write;
    let mut child = Command::new(py)
        .args(args)
        .env("TZ", "UTC") // strftime_now renders UTC in mlx-gen
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn python");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write request");
    let out = child.wait_with_output().expect("python output");
    assert!(
        out.status.success(),
        "python {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

pub fn make_tokenizer(py: &Path, dir: &Path, kind: &str) {
    let script = repo_root().join("tests/oracle/make_tokenizer.py");
    run_python(
        py,
        &[
            script.to_str().expect("path"),
            dir.to_str().expect("path"),
            "--kind",
            kind,
        ],
        "",
    );
}

pub fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write file");
}

pub fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let path = dir.join("tokenizer_config.json");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read config")).expect("json");
    f(cfg.as_object_mut().expect("config object"));
    write(&path, &serde_json::to_string_pretty(&cfg).expect("json"));
}

pub fn copy_kind(base: &Path, from: &str, to: &str) -> PathBuf {
    let dst = base.join(to);
    std::fs::create_dir_all(&dst).expect("mkdir");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(base.join(from).join(f), dst.join(f)).expect("copy");
    }
    dst
}
