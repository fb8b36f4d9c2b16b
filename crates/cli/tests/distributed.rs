//! Tensor parallel over MLX's ring backend on loopback: 2 ranks give the single-process greedy
//! tokens, and a rank that dies or never comes makes the others exit non-zero in bounded time.
mod common;

use serde_json::Value;
use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKENS: &str = "64";

fn json_of(out: &std::process::Output, what: &str) -> Value {
    assert!(out.status.success(), "{what} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Rank 0 alone prints: exactly one JSON line.
    assert_eq!(stdout.lines().count(), 1, "{what}: expected one JSON line, got {stdout:?}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{what}: {e}: {stdout}"))
}

fn generate_args(model: &Path) -> Vec<String> {
    let m = model.to_str().unwrap().to_owned();
    ["--device", "cpu", "generate", "--model", &m, "--prompt", "hello", "-m", TOKENS, "--temp", "0"]
        .iter()
        .map(|s| s.to_string())
        .chain(["--ignore-chat-template", "--output", "json", "--logprobs"].map(String::from))
        .collect()
}

/// Greedy tokens of the 2-rank run equal the single-process ones. The log-probabilities may differ
/// in the last bits: each rank sums half of every o/down dot product and the all_sum adds the two
/// halves, a different summation order than one f32 dot product (error ~ n·eps·|terms| ≈ 1e-6 for
/// these sizes); 1e-4 leaves margin while a wrong shard (wrong heads or columns) is off by > 0.1.
fn tp2_matches_single(variant: &str) {
    let model = common::model(variant);
    let args = generate_args(&model);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let single = json_of(&common::mlx_gen(&argv, None), "single-process generate");
    let mut launch = vec!["launch", "--hosts", "127.0.0.1,127.0.0.1", "--backend", "ring", "--timeout", "60", "--"];
    launch.extend(&argv);
    let sharded = json_of(&common::mlx_gen(&launch, None), "launch generate");

    let tokens = |v: &Value| -> Vec<u64> { v["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect() };
    let (a, b) = (tokens(&single), tokens(&sharded));
    assert!(a.len() >= 32, "{variant}: only {} tokens generated: pick a longer-running prompt", a.len());
    assert_eq!(a, b, "{variant}: tensor-parallel tokens differ from the single-process ones");
    let lps = |v: &Value| -> Vec<f64> { v["logprobs"].as_array().unwrap().iter().map(|t| t.as_f64().unwrap()).collect() };
    for (i, (x, y)) in lps(&single).iter().zip(lps(&sharded)).enumerate() {
        assert!((x - y).abs() <= 1e-4, "{variant}: token {i}: logprob {x} single vs {y} sharded");
    }
    // Each rank holds half of every projection: rank 0's peak is below the whole model's.
    let (p1, p2) = (single["peak_memory_gb"].as_f64().unwrap(), sharded["peak_memory_gb"].as_f64().unwrap());
    eprintln!("{variant}: peak memory single {:.0} KB, rank 0 of 2 {:.0} KB", p1 * 1e6, p2 * 1e6);
    assert!(p2 < p1, "{variant}: rank 0 peak {p2} GB is not below the single-process {p1} GB");
}

#[test]
fn tp2_ring_llama3_matches_single_process() {
    tp2_matches_single("llama3-f32");
}

#[test]
fn tp2_ring_qwen2_matches_single_process() {
    tp2_matches_single("qwen2-f32");
}

/// A ring hostfile with free loopback ports for `n` ranks, written under the test tmp dir.
fn hostfile(n: usize, tag: &str) -> std::path::PathBuf {
    let listeners: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let hosts: Vec<Vec<String>> = listeners.iter().map(|l| vec![format!("127.0.0.1:{}", l.local_addr().unwrap().port())]).collect();
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hosts-{tag}-{}.json", std::process::id()));
    std::fs::write(&path, serde_json::to_string(&hosts).unwrap()).unwrap();
    path
}

/// One rank started by hand, as the README documents.
fn rank(r: usize, hosts: &Path, timeout_s: u64, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_mlx-gen"))
        .args(args)
        .env("MLX_RANK", r.to_string())
        .env("MLX_HOSTFILE", hosts)
        .env("MLX_GEN_DISTRIBUTED", "ring")
        .env("MLX_GEN_DIST_TIMEOUT", timeout_s.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a rank")
}

/// Waits at most `limit` for `child`; kills it and fails the test past that.
fn wait_bounded(child: &mut Child, limit: Duration, what: &str) -> (std::process::ExitStatus, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (status, err);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
    // Only generate runs sharded for now: other commands are refused up front.
    let out = common::mlx_gen(&["launch", "--hosts", "127.0.0.1,127.0.0.1", "--", "chat"], None);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("generate"));
}
