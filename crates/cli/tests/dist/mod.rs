//! Helpers of the distributed tests (`distributed.rs`, `distributed_hosts.rs`): launching ranks,
//! reading rank 0's JSON, two network namespaces joined by a veth pair, a fake ssh.
#![allow(dead_code)]

use crate::common;
use serde_json::Value;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const TOKENS: &str = "64";

pub fn json_of(out: &std::process::Output, what: &str) -> Value {
    assert!(out.status.success(), "{what} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Rank 0 alone prints: exactly one JSON line.
    assert_eq!(stdout.lines().count(), 1, "{what}: expected one JSON line, got {stdout:?}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{what}: {e}: {stdout}"))
}

pub fn generate_args(model: &Path) -> Vec<String> {
    let m = model.to_str().unwrap().to_owned();
    ["--device", "cpu", "generate", "--model", &m, "--prompt", "hello", "-m", TOKENS, "--temp", "0"]
        .iter()
        .map(|s| s.to_string())
        .chain(["--ignore-chat-template", "--output", "json", "--logprobs"].map(String::from))
        .collect()
}

pub fn tokens(v: &Value) -> Vec<u64> {
    v["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect()
}

pub fn logprobs(v: &Value) -> Vec<f64> {
    v["logprobs"].as_array().unwrap().iter().map(|t| t.as_f64().unwrap()).collect()
}

/// How the 2 ranks split the model.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Split {
    Tensor,
    Pipeline,
}

impl Split {
    /// The flags the generate/chat/bench command takes for this split.
    pub fn flags(self) -> &'static [&'static str] {
        match self {
            Split::Tensor => &[],
            Split::Pipeline => &["--pipeline"],
        }
    }
}

/// `mlx-gen launch` on 2 loopback ranks running `argv` (rank 0's single JSON line).
pub fn launch2(argv: &[&str], what: &str) -> Value {
    let mut launch = vec!["launch", "--hosts", "127.0.0.1,127.0.0.1", "--backend", "ring", "--timeout", "60", "--"];
    launch.extend(argv);
    json_of(&common::mlx_gen(&launch, None), what)
}

/// Greedy tokens of the 2-rank run equal the single-process ones. Tensor parallel: the
/// log-probabilities may differ in the last bits: each rank sums half of every o/down dot product
/// and the all_sum adds the two halves, a different summation order than one f32 dot product (error
/// ~ n·eps·|terms| ≈ 1e-6 for these sizes); 1e-4 leaves margin while a wrong shard (wrong heads or
/// columns) is off by > 0.1. Pipeline parallel runs every layer whole, in the same order: its
/// log-probabilities are bit-identical.
pub fn sharded_matches_single(model: &Path, split: Split) {
    sharded_matches_single_within(model, split, if split == Split::Tensor { 1e-4 } else { 0.0 });
}

/// [`sharded_matches_single`] with the log-probabilities within `tol` of the single process's.
pub fn sharded_matches_single_within(model: &Path, split: Split, tol: f64) {
    let name = model.file_name().unwrap().to_string_lossy().into_owned();
    let args = generate_args(model);
    let mut argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let single = json_of(&common::mlx_gen(&argv, None), "single-process generate");
    argv.extend(split.flags());
    let sharded = launch2(&argv, &format!("launch generate ({split:?})"));

    let (a, b) = (tokens(&single), tokens(&sharded));
    assert!(a.len() >= 32, "{name}: only {} tokens generated: pick a longer-running prompt", a.len());
    assert_eq!(a, b, "{name}: {split:?}-parallel tokens differ from the single-process ones");
    for (i, (x, y)) in logprobs(&single).iter().zip(logprobs(&sharded)).enumerate() {
        assert!((x - y).abs() <= tol, "{name}: token {i}: logprob {x} single vs {y} {split:?}-parallel");
    }
    // Each rank holds half of the layers' weights: rank 0's peak is below the whole model's.
    let (p1, p2) = (single["peak_memory_gb"].as_f64().unwrap(), sharded["peak_memory_gb"].as_f64().unwrap());
    eprintln!("{name} ({split:?}): peak memory single {:.0} KB, rank 0 of 2 {:.0} KB", p1 * 1e6, p2 * 1e6);
    assert!(p2 < p1, "{name}: rank 0 peak {p2} GB is not below the single-process {p1} GB");
}

/// A ring hostfile with free loopback ports for `n` ranks, written under the test tmp dir.
pub fn hostfile(n: usize, tag: &str) -> std::path::PathBuf {
    let listeners: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let hosts: Vec<Vec<String>> = listeners.iter().map(|l| vec![format!("127.0.0.1:{}", l.local_addr().unwrap().port())]).collect();
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hosts-{tag}-{}.json", std::process::id()));
    std::fs::write(&path, serde_json::to_string(&hosts).unwrap()).unwrap();
    path
}

/// One rank started by hand, as the README documents.
pub fn rank(r: usize, hosts: &Path, timeout_s: u64, args: &[&str]) -> Child {
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
pub fn wait_bounded(child: &mut Child, limit: Duration, what: &str) -> (std::process::ExitStatus, String) {
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

/// Two network namespaces joined by a veth pair (10.213.x.1 and 10.213.x.2), removed on drop.
pub struct TwoHosts {
    pub names: [String; 2],
    pub addrs: [String; 2],
}

pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| panic!("cannot run `ip`: {e}"));
    assert!(
        out.status.success(),
        "`ip {}` failed: this test creates network namespaces and needs root (CAP_NET_ADMIN): {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TwoHosts {
    pub fn new() -> TwoHosts {
        // Unique per instance: tests of one process run in parallel.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let c = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = std::process::id();
        let names = [format!("mlxg{id}x{c}a"), format!("mlxg{id}x{c}b")];
        let (va, vb) = (format!("mg{}x{c}a", id % 100_000), format!("mg{}x{c}b", id % 100_000));
        let net = (id % 50 * 5 + c % 5) % 250 + 1;
        let addrs = [format!("10.213.{net}.1"), format!("10.213.{net}.2")];
        let hosts = TwoHosts { names: names.clone(), addrs: addrs.clone() };
        for n in &names {
            ip(&["netns", "add", n]);
        }
        ip(&["link", "add", &va, "netns", &names[0], "type", "veth", "peer", "name", &vb, "netns", &names[1]]);
        for (n, (dev, addr)) in names.iter().zip([(&va, &addrs[0]), (&vb, &addrs[1])]) {
            ip(&["-n", n, "addr", "add", &format!("{addr}/24"), "dev", dev]);
            ip(&["-n", n, "link", "set", dev, "up"]);
            ip(&["-n", n, "link", "set", "lo", "up"]);
        }
        hosts
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth pair, and so the pair.
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

/// One rank inside network namespace `ns`, started by hand as the README documents.
pub fn rank_in(ns: &str, r: usize, hosts: &Path, args: &[&str]) -> Child {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(env!("CARGO_BIN_EXE_mlx-gen"))
        .args(args)
        .env("MLX_RANK", r.to_string())
        .env("MLX_HOSTFILE", hosts)
        .env("MLX_GEN_DISTRIBUTED", "ring")
        .env("MLX_GEN_DIST_TIMEOUT", "60")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a rank in a network namespace")
}

/// Both ranks' results: each rank prints its own JSON line (started by hand, not through launch).
pub fn run_pair(mut ranks: [Child; 2], what: &str) -> [Value; 2] {
    let mut outs = Vec::new();
    for (r, c) in ranks.iter_mut().enumerate() {
        let (status, err) = wait_bounded(c, Duration::from_secs(120), &format!("{what}: rank {r}"));
        let mut out = String::new();
        c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        assert!(status.success(), "{what}: rank {r} failed ({status}):\n{err}");
        outs.push(serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{what}: rank {r}: {e}: {out}")));
    }
    [outs.remove(0), outs.remove(0)]
}

/// A stand-in for ssh (`MLX_GEN_SSH`): `fake-ssh HOST COMMAND...` runs COMMAND with `sh -c` in the
/// network namespace of HOST (one of `hosts`, pairs of address and namespace), as sshd would run
/// it on that machine; any other host does not answer (ssh's status 255). Like the ssh client it
/// stays a process of its own, so that killing it leaves the remote end to notice its stream close.
pub fn fake_ssh(tag: &str, hosts: &[(&str, &str)]) -> PathBuf {
    let mut script = String::from("#!/bin/sh\nhost=$1\nshift\ncase \"$host\" in\n");
    for (addr, ns) in hosts {
        script += &format!("  {addr}) ns={ns} ;;\n");
    }
    script += "  *) echo \"ssh: connect to host $host port 22: No route to host\" >&2; exit 255 ;;\nesac\n";
    script += "ip netns exec \"$ns\" sh -c \"$*\"\n";
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fake-ssh-{tag}-{}", std::process::id()));
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// `mlx-gen launch --hosts HOSTS ... -- argv` with `ssh` as MLX_GEN_SSH, not yet waited for.
pub fn launch_over(ssh: &Path, hosts: &str, argv: &[&str], stdin: Stdio, stdout: Stdio) -> Child {
    Command::new(env!("CARGO_BIN_EXE_mlx-gen"))
        .args(["launch", "--hosts", hosts, "--backend", "ring", "--timeout", "60", "--"])
        .args(argv)
        .env("MLX_GEN_SSH", ssh)
        .stdin(stdin)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mlx-gen launch")
}

/// Processes whose command line contains `marker` (other than pgrep itself).
pub fn running(marker: &str) -> String {
    let out = Command::new("pgrep").args(["-a", "-f", marker]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits at most `limit` for `child` (whose stderr is read elsewhere); kills it and fails past that.
pub fn wait_bounded_quiet(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
