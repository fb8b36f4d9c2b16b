//! The soak benchmark's two-minute mode (scripts/bench/soak.py --short) against the real binary:
//! mixed traffic (streaming and not, n > 1, stop strings, clients leaving mid-stream and before
//! the answer, oversized, malformed and unimplemented requests) with the server's RSS flat after
//! warm-up, no KV block held at the end, and every answer a completion or a 4xx/503 JSON error.
mod common;

use std::process::Command;

#[test]
fn two_minutes_of_mixed_traffic_leave_memory_flat_and_no_block_held() {
    let model = common::model("llama3-f32");
    let script = common::repo_root().join("scripts/bench/soak.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(["--short", "--model"])
        .arg(&model)
        .args(["--mlx-gen", env!("CARGO_BIN_EXE_mlx-gen")])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the soak failed ({}):\n{log}", out.status);
    assert!(log.contains("violations: 0"), "{log}");
}
