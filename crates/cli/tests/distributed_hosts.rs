//! Ranks on separate hosts: two network namespaces joined by a veth pair that the tests create,
//! ranks started by hand or by `mlx-gen launch` over ssh (a fake ssh that enters the namespace),
//! each giving the single-process tokens; unreachable hosts and killed launchers end every rank.
mod common;
mod dist;

use dist::*;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The ranks reach each other only over the veth pair (each namespace has its own loopback), as two
/// machines would: greedy tokens equal the single-process ones, tensor and pipeline parallel.
#[test]
fn two_hosts_in_network_namespaces_match_single_process() {
    let net = TwoHosts::new();
    let hosts: Vec<Vec<String>> = net.addrs.iter().map(|a| vec![format!("{a}:5530")]).collect();
    let file = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("hosts-netns-{}.json", std::process::id()));
    std::fs::write(&file, serde_json::to_string(&hosts).unwrap()).unwrap();
    for (variant, split) in [("llama3-f32", Split::Tensor), ("qwen2-f32", Split::Pipeline)] {
        let args = generate_args(&common::model(variant));
        let mut argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let single = json_of(&common::mlx_gen(&argv, None), "single-process generate");
        argv.extend(split.flags());
        let ranks = [rank_in(&net.names[0], 0, &file, &argv), rank_in(&net.names[1], 1, &file, &argv)];
        let [r0, r1] = run_pair(ranks, &format!("{variant} over the veth pair ({split:?})"));
        assert_eq!(tokens(&r0), tokens(&single), "{variant}: rank 0's tokens differ from the single-process ones");
        assert_eq!(tokens(&r1), tokens(&single), "{variant}: rank 1's tokens differ from the single-process ones");
    }
    let _ = std::fs::remove_file(file);
}

/// Both ranks on other "machines" (namespaces whose addresses this one does not have), started by
/// launch through the ssh stand-in: greedy tokens equal the single-process ones (tensor parallel);
/// rank 0 remote reads the launcher's standard input (chat, pipeline parallel).
#[test]
fn launch_over_ssh_to_two_hosts_matches_single_process() {
    let net = TwoHosts::new();
    let ssh = fake_ssh("ok", &[(&net.addrs[0], &net.names[0]), (&net.addrs[1], &net.names[1])]);
    let hosts = net.addrs.join(",");
    let args = generate_args(&common::model("llama3-f32"));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let single = json_of(&common::mlx_gen(&argv, None), "single-process generate");
    let child = launch_over(&ssh, &hosts, &argv, Stdio::null(), Stdio::piped());
    let sharded = json_of(&child.wait_with_output().unwrap(), "launch generate over ssh");
    assert_eq!(tokens(&sharded), tokens(&single), "tokens over ssh differ from the single-process ones");
    assert_eq!(tokens(&single).len(), 64);

    let model = common::model("qwen2-f32");
    let chat = ["--device", "cpu", "chat", "--model", model.to_str().unwrap(), "-m", "16", "--temp", "0"];
    let input: &[u8] = b"hello there\n/reset\nwhat next\n";
    let want = common::mlx_gen(&chat, Some(input));
    assert!(want.status.success(), "{}", String::from_utf8_lossy(&want.stderr));
    let mut argv = chat.to_vec();
    argv.push("--pipeline");
    let mut child = launch_over(&ssh, &hosts, &argv, Stdio::piped(), Stdio::piped());
    child.stdin.take().unwrap().write_all(input).unwrap();
    let got = child.wait_with_output().unwrap();
    assert!(got.status.success(), "chat over ssh failed:\n{}", String::from_utf8_lossy(&got.stderr));
    assert_eq!(String::from_utf8_lossy(&got.stdout), String::from_utf8_lossy(&want.stdout), "chat over ssh differs");

    // No mlx-gen at --remote-exe on the other machines: the shell there says so (127), launch too.
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-gen"))
        .args(["launch", "--hosts", &hosts, "--remote-exe", "/nonexistent/mlx-gen", "--"])
        .args(&argv)
        .env("MLX_GEN_SSH", &ssh)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("failed (exit status: 127)") && err.contains("--remote-exe"), "unclear error:\n{err}");
    let _ = std::fs::remove_file(ssh);
}

/// The launcher killed outright (SIGKILL: no chance to stop anything): its ssh clients' streams
/// close, and the remote ends kill their ranks.
#[test]
fn remote_ranks_end_when_the_launcher_is_killed() {
    let net = TwoHosts::new();
    let ssh = fake_ssh("kill", &[(&net.addrs[0], &net.names[0]), (&net.addrs[1], &net.names[1])]);
    let model = common::model("llama3-f32");
    let marker = format!("ssh-kill-{}", std::process::id());
    let argv = ["--device", "cpu", "generate", "--model", model.to_str().unwrap(), "--prompt", &marker, "-m", "3000", "--temp", "0", "--ignore-chat-template"];
    let mut child = launch_over(&ssh, &net.addrs.join(","), &argv, Stdio::null(), Stdio::piped());
    let mut out = child.stdout.take().unwrap();
    // Text streams: rank 0's first bytes show that the ring formed and generation runs.
    let mut first = [0u8; 1];
    let printed = out.read(&mut first).unwrap() == 1;
    let ranks = running(&marker);
    child.kill().unwrap();
    assert!(printed, "rank 0 printed nothing");
    assert!(ranks.lines().count() >= 2, "both ranks should have been running: {ranks}");
    let _ = child.wait();
    drop(out);
    let t0 = Instant::now();
    while !running(&marker).is_empty() || !running("launch --remote-rank").is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(10), "left running 10 s after the launcher died:\n{}", running(&marker));
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_file(ssh);
}

/// A host that does not answer (ssh exits 255): launch stops the local rank at once and names the
/// rank and the host. No namespaces needed.
#[test]
fn unreachable_ssh_host_fails_fast() {
    let ssh = fake_ssh("none", &[]);
    let model = common::model("llama3-f32");
    let argv = ["--device", "cpu", "generate", "--model", model.to_str().unwrap(), "-m", "4"];
    let t0 = Instant::now();
    let mut child = launch_over(&ssh, "127.0.0.1,192.0.2.7", &argv, Stdio::null(), Stdio::null());
    let (status, err) = wait_bounded(&mut child, Duration::from_secs(30), "launch to an unreachable host");
    assert!(!status.success());
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?} to give up", t0.elapsed());
    assert!(err.contains("No route to host"), "ssh's own message is not shown:\n{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: rank 1 (ssh 192.0.2.7) failed") && last.contains("could not reach 192.0.2.7"), "unclear error:\n{err}");

    // mlx.launch's hostfile: ssh names apart from the ring addresses.
    let file = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("hosts-mlx-launch-{}.json", std::process::id()));
    let hosts = r#"{"backend": "ring", "hosts": [{"ssh": "localhost", "ips": ["127.0.0.1"]}, {"ssh": "node-b", "ips": ["192.0.2.8"]}]}"#;
    std::fs::write(&file, hosts).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlx-gen"))
        .args(["launch", "--hostfile", file.to_str().unwrap(), "--"])
        .args(argv)
        .env("MLX_GEN_SSH", &ssh)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, err) = wait_bounded(&mut child, Duration::from_secs(30), "launch --hostfile to an unreachable host");
    assert!(!status.success());
    assert!(err.lines().last().unwrap_or_default().starts_with("error: rank 1 (ssh node-b) failed"), "unclear error:\n{err}");
    let _ = std::fs::remove_file(file);
    let _ = std::fs::remove_file(ssh);
}

/// SIGTERM to the launcher with rank 0 over ssh: the stop request travels down rank 0's stream,
/// the server there shuts down (and tells rank 1), and every rank ends.
#[test]
fn sigterm_reaches_remote_rank_0() {
    use std::io::{BufRead, BufReader};
    let net = TwoHosts::new();
    let ssh = fake_ssh("term", &[(&net.addrs[0], &net.names[0]), (&net.addrs[1], &net.names[1])]);
    // A name of its own for the model, to find this test's ranks by.
    let model = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("serve-ssh-{}", std::process::id()));
    let _ = std::fs::remove_file(&model);
    std::os::unix::fs::symlink(common::model("llama3-f32"), &model).unwrap();
    let m = model.to_str().unwrap();
    let argv = ["--device", "cpu", "serve", "--model", m, "--port", "0"];
    let mut child = launch_over(&ssh, &net.addrs.join(","), &argv, Stdio::null(), Stdio::null());
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("http://") {
                let _ = tx.send(());
            }
            all += &line;
            all.push('\n');
        }
        all
    });
    if rx.recv_timeout(Duration::from_secs(120)).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("serve over ssh did not report its address:\n{}", reader.join().unwrap());
    }
    let ranks = running(m);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = wait_bounded_quiet(&mut child, Duration::from_secs(30));
    let err = reader.join().unwrap();
    assert!(ranks.lines().count() >= 2, "both ranks should have been running: {ranks}");
    assert!(!status.success(), "a launcher stopped by a signal reports it");
    assert!(err.contains("shutting down"), "rank 0 was not asked to stop:\n{err}");
    let t0 = Instant::now();
    while !running(m).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(10), "ranks left running:\n{}", running(m));
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_file(model);
    let _ = std::fs::remove_file(ssh);
}
