//! Tool calls from a real model: Qwen2.5-Coder-0.5B-Instruct (fetched from PyPI on first use, as in
//! real_models.rs) behind `mlx-gen serve`, asked for the weather in Paris through the official
//! `openai` client (tests/oracle/real_tools_client.py): `auto` gives a parsed get_weather call,
//! `required` a constrained one that the grammar ends, `auto` streamed equal to non-streamed.
//! Slow like real_models.rs (a 0.5B 4-bit model on the CPU: about two minutes on a 2-core x86).
mod common;
mod server_harness;

use serde_json::{json, Value};
use server_harness::Server;
use std::io::Write;
use std::process::{Command, Stdio};

#[test]
fn qwen_coder_calls_get_weather() {
    let dir = formats::default_model::qwen_coder_dir(true).expect("fetch Qwen2.5-Coder-0.5B-Instruct");
    let model = dir.to_string_lossy().into_owned();
    let server = Server::start(&model, &[]);
    let spec = json!({"base_url": format!("{}/v1", server.base), "model": model});
    let mut child = Command::new(common::venv_python())
        .arg(common::oracle_dir().join("real_tools_client.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run real_tools_client.py");
    child.stdin.take().unwrap().write_all(spec.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().expect("wait for real_tools_client.py");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "real_tools_client.py failed ({}):\n{stderr}", out.status);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("no JSON ({e}):\n{stderr}"));
    let failures = report["failures"].as_array().expect("failures");
    assert!(failures.is_empty(), "{failures:?}\nanswers: {}", report["answer"]);
    assert_eq!(report["checks"].as_u64(), Some(8), "{report}");
}
