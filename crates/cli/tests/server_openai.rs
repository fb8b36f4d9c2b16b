//! `mlx-gen serve` driven by the official `openai` Python client (tests/oracle/openai_client.py,
//! from the oracle venv): chat and text completions, streamed and not, usage, stop strings,
//! logprobs, n, seeds (equal to `mlx-gen generate`), and errors raised as the client's exceptions.
mod common;
mod server_harness;

use serde_json::{json, Value};
use server_harness::Server;
use std::io::Write;
use std::process::{Command, Stdio};

#[test]
fn the_openai_client_gets_what_generate_gives() {
    let model = common::model("llama3-f32").to_string_lossy().into_owned();
    let open = Server::start(&model, &[]);
    let keyed = Server::start(&model, &["--api-key", "sk-test-key"]);
    let spec = json!({
        "base_url": format!("{}/v1", open.base),
        "keyed_base_url": format!("{}/v1", keyed.base),
        "api_key": "sk-test-key",
        "model": model,
        "mlx_gen": env!("CARGO_BIN_EXE_mlx-gen"),
    });
    let mut child = Command::new(common::venv_python())
        .arg(common::oracle_dir().join("openai_client.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run openai_client.py");
    child.stdin.take().unwrap().write_all(spec.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().expect("wait for openai_client.py");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "openai_client.py failed ({}):\n{stderr}", out.status);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("openai_client.py printed no JSON ({e}):\n{stderr}"));
    let failures = report["failures"].as_array().expect("failures");
    assert!(failures.is_empty(), "{} of {} checks failed:\n{}", failures.len(), report["checks"], failures.iter().map(|f| f.as_str().unwrap_or("")).collect::<Vec<_>>().join("\n"));
    assert!(report["checks"].as_u64().unwrap() >= 100, "too few checks ran: {report}");
    // Both servers still answer.
    assert_eq!(open.call("GET", "/health", None).status, 200);
    assert_eq!(keyed.call("GET", "/v1/models", None).status, 200);
}
