//! `mlx-gen launch`: one process per rank with MLX's distributed environment (the rank side of it
//! is [`crate::rank`]).
//!
//! The launcher writes the ring hostfile (MLX's JSON format: one list of `"ip:port"` per rank),
//! starts `mlx-gen <command>` once per rank with `MLX_RANK`, `MLX_HOSTFILE`, `MLX_GEN_DISTRIBUTED`
//! (the backend) and `MLX_GEN_DIST_TIMEOUT` (seconds), shows rank 0's standard output only, and
//! when a rank fails stops the others and exits non-zero. A rank on another machine starts over ssh
//! (as `mlx.launch` does): `ssh HOST 'mlx-gen' launch --remote-rank`, whose standard input carries
//! the rank's description (hostfile, working directory, command), then rank 0's standard input and
//! the request to stop; when that stream ends (the launcher or its ssh client died) the remote end
//! kills its rank. A rank started with `MLX_GEN_DISTRIBUTED` joins the group before its command
//! runs and loads its part of the model (tensor parallel, or pipeline parallel with the command's
//! `--pipeline`); a watchdog ends it with a message when joining or one generation step takes
//! longer than the timeout (a peer died). Every rank runs the same forward passes: rank 0 alone
//! reads standard input and hands what it read to the others.
use crate::rank::SHARDED_COMMANDS;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Comma-separated hosts (IP addresses or names), one per rank. This machine's addresses start
    /// here; any other host over ssh (MLX_GEN_SSH names another ssh program), in the same working
    /// directory with the same mlx-gen path (see --remote-exe).
    #[arg(long, value_delimiter = ',', required_unless_present_any = ["hostfile", "remote_rank"])]
    hosts: Vec<String>,
    /// A hostfile instead of --hosts: MLX's ring file (`[["ip:port"], ...]`, one list per rank) or
    /// mlx.launch's (`[{"ssh": "name", "ips": ["ip"]}, ...]`, ports from --starting-port).
    #[arg(long, conflicts_with = "hosts")]
    hostfile: Option<PathBuf>,
    /// The MLX distributed backend.
    #[arg(long, default_value = "ring", value_parser = ["ring", "mpi", "nccl", "jaccl", "any"])]
    backend: String,
    /// First TCP port of the ring (one port per rank); by default free ports chosen here when every
    /// rank is on this machine, else 32323 (as mlx.launch).
    #[arg(long)]
    starting_port: Option<u16>,
    /// Seconds a rank waits for its peers (to join, or per generation step) before it gives up.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// The mlx-gen executable on the other machines (default: this one's path).
    #[arg(long)]
    remote_exe: Option<String>,
    /// The remote end of a rank started over ssh (reads its description from standard input).
    #[arg(long, hide = true)]
    remote_rank: bool,
    /// The mlx-gen command each rank runs, after `--` (e.g. `-- generate --model M --prompt hi`).
    #[arg(last = true, required_unless_present = "remote_rank")]
    command: Vec<String>,
}


/// mlx.launch's first ring port, used when some rank is on another machine (its free ports are
/// not known here).
const DEFAULT_PORT: u16 = 32323;

/// Where one rank runs.
struct Place {
    /// Its ring addresses (MLX_HOSTFILE's list for this rank).
    addrs: Vec<SocketAddr>,
    /// `None`: this machine; `Some(destination)`: started with `ssh destination`.
    ssh: Option<String>,
}

/// Starts the ranks and waits for them; the first failure stops the rest.
pub fn run(args: &Args) -> Result<()> {
    if args.remote_rank {
        return remote_rank();
    }
    let sub = args.command.iter().find(|a| !a.starts_with('-') && *a != "cpu" && *a != "gpu");
    if !sub.is_some_and(|s| SHARDED_COMMANDS.contains(&s.as_str())) {
        bail!("launch runs {} only for now (got {:?})", SHARDED_COMMANDS.join(", "), args.command.join(" "));
    }
    if args.backend != "ring" {
        bail!("launch starts ring ranks only for now; start {} ranks with its own launcher (mpirun, ...)", args.backend);
    }
    let places = match &args.hostfile {
        Some(f) => places_from_file(f, args.starting_port)?,
        None => places_from_hosts(&args.hosts, args.starting_port)?,
    };
    let ranks = places.len();
    if ranks < 2 {
        bail!("a group needs at least 2 ranks, got {ranks}");
    }
    let ring: Vec<Vec<String>> = places.iter().map(|p| p.addrs.iter().map(SocketAddr::to_string).collect()).collect();
    let hostfile = serde_json::to_string(&ring)?;
    let file = std::env::temp_dir().join(format!("mlx-gen-hosts-{}.json", std::process::id()));
    std::fs::write(&file, &hostfile).with_context(|| format!("cannot write {}", file.display()))?;
    let exe = std::env::current_exe().context("cannot find the mlx-gen executable")?;
    let remote_exe = match &args.remote_exe {
        Some(e) => e.clone(),
        None => exe.to_str().context("the mlx-gen path is not UTF-8: pass --remote-exe")?.to_owned(),
    };
    let cwd = std::env::current_dir().context("cannot read the working directory")?;
    let cwd = cwd.to_str().context("the working directory's path is not UTF-8")?.to_owned();
    let mut children: Vec<RankProc> = Vec::with_capacity(ranks);
    for (rank, place) in places.iter().enumerate() {
        let started = match &place.ssh {
            None => Command::new(&exe)
                .args(&args.command)
                .env("MLX_RANK", rank.to_string())
                .env("MLX_HOSTFILE", &file)
                .env("MLX_GEN_DISTRIBUTED", &args.backend)
                .env("MLX_GEN_DIST_TIMEOUT", args.timeout.to_string())
                .stdin(if rank == 0 { Stdio::inherit() } else { Stdio::null() })
                .stdout(if rank == 0 { Stdio::inherit() } else { Stdio::null() })
                .spawn()
                .map(|child| RankProc { child, ctl: None, name: format!("rank {rank}"), ssh: None }),
            Some(dest) => {
                let spec = serde_json::json!({
                    "rank": rank, "hostfile": hostfile, "cwd": cwd, "backend": args.backend,
                    "timeout": args.timeout, "command": args.command,
                });
                spawn_remote(rank, dest, &remote_exe, &spec, args.timeout)
            }
        };
        match started {
            Ok(c) => children.push(c),
            Err(e) => {
                stop(&mut children);
                let _ = std::fs::remove_file(&file);
                bail!("cannot start rank {rank}: {e}");
            }
        }
    }
    if let Some(ctl) = children.first().and_then(|c| c.ctl.clone()) {
        forward_stdin(ctl);
    }
    // Ctrl-C or SIGTERM to the launcher: rank 0 is asked to stop (a server finishes its streams and
    // tells the other ranks), then whatever is left is stopped.
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, term.clone()).context("cannot install a signal handler")?;
    }
    let result = wait_all(&mut children, &term, &remote_exe);
    let _ = std::fs::remove_file(&file);
    result
}

/// `--hosts`: each host's address (a name resolved here), local or over ssh, with one port each.
fn places_from_hosts(hosts: &[String], start: Option<u16>) -> Result<Vec<Place>> {
    let ips = hosts.iter().map(|h| resolve(h)).collect::<Result<Vec<_>>>()?;
    let local: Vec<bool> = ips.iter().map(|ip| is_local(*ip)).collect();
    let ports = match start {
        None if local.iter().all(|&l| l) => free_ports(&ips)?,
        _ => consecutive(start.unwrap_or(DEFAULT_PORT), ips.len())?,
    };
    Ok(hosts
        .iter()
        .zip(ips.iter().zip(ports))
        .zip(local)
        .map(|((h, (ip, port)), local)| Place { addrs: vec![SocketAddr::new(*ip, port)], ssh: (!local).then(|| h.clone()) })
        .collect())
}

/// `--hostfile`: MLX's ring file (ports given; ssh to each rank's first address) or mlx.launch's
/// (`{"ssh", "ips"}` per rank, bare or under `"hosts"`; ports from `start`).
fn places_from_file(f: &Path, start: Option<u16>) -> Result<Vec<Place>> {
    let text = std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?;
    let data: Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", f.display()))?;
    let bad = || format!("{}: expected [[\"ip:port\", ...], ...] or [{{\"ssh\": \"host\", \"ips\": [\"ip\"]}}, ...]", f.display());
    let hosts = data.get("hosts").unwrap_or(&data).as_array().with_context(bad)?;
    let mut port = usize::from(start.unwrap_or(DEFAULT_PORT));
    let mut places = Vec::with_capacity(hosts.len());
    for h in hosts {
        let (addrs, dest) = if let Some(list) = h.as_array() {
            let addrs = list
                .iter()
                .map(|a| {
                    let a = a.as_str().with_context(bad)?;
                    a.parse::<SocketAddr>().with_context(|| format!("{}: {a:?} is not ip:port", f.display()))
                })
                .collect::<Result<Vec<_>>>()?;
            let dest = addrs.first().with_context(bad)?.ip().to_string();
            (addrs, dest)
        } else {
            let dest = h.get("ssh").and_then(Value::as_str).with_context(bad)?.to_owned();
            let mut ips = Vec::new();
            for ip in h.get("ips").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default() {
                let ip = ip.as_str().with_context(bad)?;
                ips.push(ip.parse::<IpAddr>().with_context(|| format!("{}: {ip:?} is not an IP address", f.display()))?);
            }
            if ips.is_empty() {
                ips.push(resolve(&dest)?);
            }
            let mut addrs = Vec::with_capacity(ips.len());
            for ip in ips {
                addrs.push(SocketAddr::new(ip, u16::try_from(port).context("--starting-port leaves no room for every rank")?));
                port += 1;
            }
            (addrs, dest)
        };
        let local = is_local(addrs[0].ip());
        places.push(Place { addrs, ssh: (!local).then_some(dest) });
    }
    for p in &places {
        if let Some(d) = p.ssh.as_deref().filter(|d| d.starts_with('-')) {
            bail!("{}: {d:?} is not a host", f.display());
        }
    }
    Ok(places)
}

/// An IP address, or a host name's address as seen from here (IPv4 first).
fn resolve(host: &str) -> Result<IpAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ip);
    }
    if host.is_empty() || host.starts_with('-') {
        bail!("{host:?} is not a host");
    }
    let addrs: Vec<IpAddr> = (host, 0).to_socket_addrs().with_context(|| format!("cannot resolve host {host}"))?.map(|a| a.ip()).collect();
    addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()).copied().with_context(|| format!("host {host} has no address"))
}

/// Whether `ip` is one of this machine's addresses (it can be bound here).
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || TcpListener::bind((ip, 0)).is_ok()
}

/// `n` consecutive ports from `start`.
fn consecutive(start: u16, n: usize) -> Result<Vec<u16>> {
    (0..n).map(|i| u16::try_from(usize::from(start) + i).context("--starting-port leaves no room for every rank")).collect()
}

/// One free port per rank, found by binding port 0 (all on this machine).
fn free_ports(hosts: &[IpAddr]) -> Result<Vec<u16>> {
    // Held until all are chosen, so that no two ranks get the same port.
    let listeners = hosts.iter().map(|h| TcpListener::bind((*h, 0))).collect::<std::io::Result<Vec<_>>>()?;
    listeners.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

/// A rank's process here: the rank itself, or the ssh client that started it elsewhere.
struct RankProc {
    child: Child,
    /// Over ssh: the stream to the remote end (the ssh client's standard input); `None` once closed.
    ctl: Option<Arc<Mutex<Option<ChildStdin>>>>,
    /// "rank 1", or "rank 1 (ssh 10.0.0.2)".
    name: String,
    /// The ssh destination, for a rank on another machine.
    ssh: Option<String>,
}

// The stream to a remote rank's end: frames of one kind byte, a little-endian u32 length, the bytes.
/// The rank's description (JSON: rank, hostfile, cwd, backend, timeout, command); the first frame.
const FRAME_SPEC: u8 = b'S';
/// Bytes for rank 0's standard input.
const FRAME_DATA: u8 = b'D';
/// Rank 0's standard input ends.
const FRAME_EOF: u8 = b'E';
/// The launcher was told to stop: SIGTERM to the rank.
const FRAME_TERM: u8 = b'T';

fn write_frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(payload.len()).map_err(|_| std::io::Error::other("frame too long"))?;
    let mut buf = Vec::with_capacity(5 + payload.len());
    buf.push(kind);
    buf.extend(len.to_le_bytes());
    buf.extend(payload);
    w.write_all(&buf)?;
    w.flush()
}

/// The next frame, or `None` when the stream ended between frames.
fn read_frame(r: &mut impl Read) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    match r.read_exact(&mut head) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        r => r?,
    }
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Some((head[0], payload)))
}

/// A POSIX shell word for `s` (quoted unless it is plainly safe).
fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@%".contains(&b)) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// `ssh dest 'exe' launch --remote-rank`, then the rank's description down its standard input.
fn spawn_remote(rank: usize, dest: &str, exe: &str, spec: &Value, timeout: u64) -> std::io::Result<RankProc> {
    let custom = std::env::var_os("MLX_GEN_SSH").filter(|s| !s.is_empty());
    let mut cmd = Command::new(custom.as_deref().unwrap_or("ssh".as_ref()));
    if custom.is_none() {
        // No terminal, no password or host-key prompts (they would hang the rank), and a connect
        // bounded well within the ranks' timeout, so that an unreachable host is named as such.
        cmd.args(["-T", "-o", "BatchMode=yes", "-o", &format!("ConnectTimeout={}", (timeout / 2).clamp(1, 30))]);
    }
    let mut child = cmd
        .arg(dest)
        .arg(format!("{} launch --remote-rank", shell_quote(exe)))
        .stdin(Stdio::piped())
        .stdout(if rank == 0 { Stdio::inherit() } else { Stdio::null() })
        // Its own process group: a Ctrl-C at the terminal reaches the launcher, which stops rank 0
        // first, rather than the ssh client, which would drop the rank at once.
        .process_group(0)
        .spawn()?;
    let mut ctl = child.stdin.take().expect("piped");
    // A failed write means ssh already ended: its exit status tells why.
    let _ = write_frame(&mut ctl, FRAME_SPEC, spec.to_string().as_bytes());
    Ok(RankProc { child, ctl: Some(Arc::new(Mutex::new(Some(ctl)))), name: format!("rank {rank} (ssh {dest})"), ssh: Some(dest.to_owned()) })
}

/// Rank 0 runs over ssh: the launcher's standard input goes to it, framed, until it ends.
fn forward_stdin(ctl: Arc<Mutex<Option<ChildStdin>>>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let mut input = std::io::stdin();
        loop {
            let n = match input.read(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Ok(n) => n,
                Err(_) => 0,
            };
            let mut guard = ctl.lock().unwrap_or_else(|e| e.into_inner());
            let Some(w) = guard.as_mut() else { return };
            if n == 0 {
                let _ = write_frame(w, FRAME_EOF, &[]);
                return;
            }
            if write_frame(w, FRAME_DATA, &buf[..n]).is_err() {
                return;
            }
        }
    });
}

/// Kills every rank; a remote one's stream is closed first, so that its end kills the rank there
/// (killing the ssh client closes the connection, which does the same).
fn stop(children: &mut [RankProc]) {
    for c in children.iter_mut() {
        if let Some(ctl) = &c.ctl {
            drop(ctl.lock().unwrap_or_else(|e| e.into_inner()).take());
        }
        let _ = c.child.kill();
        let _ = c.child.wait();
    }
}

/// Asks rank 0 to stop: SIGTERM here, or through its stream over ssh.
fn ask_to_stop(leader: &RankProc) {
    match &leader.ctl {
        Some(ctl) => {
            if let Some(w) = ctl.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                let _ = write_frame(w, FRAME_TERM, &[]);
            }
        }
        None => {
            let pid = nix::unistd::Pid::from_raw(leader.child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
    }
}

/// What a failed exit status says about a rank started over ssh.
fn why(c: &RankProc, status: ExitStatus, exe: &str) -> String {
    match (&c.ssh, status.code()) {
        (Some(dest), Some(255)) => format!(": ssh could not reach {dest}, or lost it (ssh's message is above)"),
        (Some(dest), Some(127)) => format!(": no {exe} on {dest}? (--remote-exe sets its path there)"),
        _ => String::new(),
    }
}

/// Polls the ranks until all succeed or one fails (then the others are killed), or until `term`
/// is set: then rank 0 is asked to stop and gets `STOP_GRACE` to end the group before the rest is
/// killed.
fn wait_all(children: &mut [RankProc], term: &AtomicBool, exe: &str) -> Result<()> {
    let mut done = vec![false; children.len()];
    let mut stopping_since: Option<std::time::Instant> = None;
    loop {
        if term.load(Ordering::Relaxed) && stopping_since.is_none() {
            stopping_since = Some(std::time::Instant::now());
            if let Some(leader) = children.first() {
                ask_to_stop(leader);
            }
        }
        if stopping_since.is_some_and(|t| t.elapsed() > STOP_GRACE) {
            stop(children);
            bail!("stopped by a signal");
        }
        for rank in 0..children.len() {
            if done[rank] {
                continue;
            }
            if let Some(status) = children[rank].child.try_wait()? {
                done[rank] = true;
                if !status.success() && stopping_since.is_none() {
                    let (name, why) = (children[rank].name.clone(), why(&children[rank], status, exe));
                    stop(children);
                    bail!("{name} failed ({status}){why}; stopped the other ranks");
                }
            }
        }
        if done.iter().all(|&d| d) {
            return if stopping_since.is_some() { Err(anyhow::anyhow!("stopped by a signal")) } else { Ok(()) };
        }
        if stopping_since.is_some() && done[0] {
            // Rank 0 is done; the others follow it or are stopped.
            std::thread::sleep(Duration::from_millis(200));
            stop(children);
            bail!("stopped by a signal");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The remote end of a rank started over ssh (`launch --remote-rank`): reads the rank's
/// description, writes its hostfile here, starts it in the launcher's working directory, feeds it
/// rank 0's input, and kills it when the stream from the launcher ends. Exits with its status.
fn remote_rank() -> Result<()> {
    let mut input = std::io::stdin();
    let spec: Value = match read_frame(&mut input).context("launch --remote-rank: cannot read the rank's description")? {
        Some((FRAME_SPEC, bytes)) => serde_json::from_slice(&bytes).context("launch --remote-rank: a malformed description")?,
        _ => bail!("launch --remote-rank is started by `mlx-gen launch` over ssh (it reads the rank's description from standard input)"),
    };
    let field = |k: &str| spec.get(k).with_context(|| format!("launch --remote-rank: no {k:?} in the description"));
    let rank = field("rank")?.as_u64().context("launch --remote-rank: rank")?;
    let hostfile = field("hostfile")?.as_str().context("launch --remote-rank: hostfile")?;
    let cwd = field("cwd")?.as_str().context("launch --remote-rank: cwd")?;
    let backend = field("backend")?.as_str().context("launch --remote-rank: backend")?;
    let timeout = field("timeout")?.as_u64().context("launch --remote-rank: timeout")?;
    let command: Vec<String> = serde_json::from_value(field("command")?.clone()).context("launch --remote-rank: command")?;
    if !Path::new(cwd).is_dir() {
        bail!("rank {rank}: no directory {cwd} here (every rank runs in the launcher's working directory)");
    }
    let leader = rank == 0;
    let file = std::env::temp_dir().join(format!("mlx-gen-hosts-{}-rank{rank}.json", std::process::id()));
    std::fs::write(&file, hostfile).with_context(|| format!("rank {rank}: cannot write {}", file.display()))?;
    let exe = std::env::current_exe().context("cannot find the mlx-gen executable")?;
    let child = Command::new(&exe)
        .args(&command)
        .current_dir(cwd)
        .env("MLX_RANK", rank.to_string())
        .env("MLX_HOSTFILE", &file)
        .env("MLX_GEN_DISTRIBUTED", backend)
        .env("MLX_GEN_DIST_TIMEOUT", timeout.to_string())
        .stdin(if leader { Stdio::piped() } else { Stdio::null() })
        .stdout(if leader { Stdio::inherit() } else { Stdio::null() })
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_file(&file);
            bail!("rank {rank}: cannot start {}: {e}", exe.display());
        }
    };
    let rank_in = child.stdin.take();
    let child = Arc::new(Mutex::new(child));
    let control = child.clone();
    std::thread::spawn(move || follow_launcher(input, rank_in, &control));
    let status = loop {
        if let Some(status) = child.lock().unwrap_or_else(|e| e.into_inner()).try_wait()? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = std::fs::remove_file(&file);
    std::process::exit(status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

/// The remote end's side of the stream: rank 0's input, the request to stop, and the end of the
/// stream (the launcher or its ssh client is gone), which kills the rank.
fn follow_launcher(mut input: std::io::Stdin, mut rank_in: Option<ChildStdin>, child: &Mutex<Child>) {
    loop {
        match read_frame(&mut input) {
            Ok(Some((FRAME_DATA, bytes))) => {
                if rank_in.as_mut().is_some_and(|w| w.write_all(&bytes).and_then(|()| w.flush()).is_err()) {
                    rank_in = None;
                }
            }
            Ok(Some((FRAME_EOF, _))) => rank_in = None,
            Ok(Some((FRAME_TERM, _))) => {
                // Held while signalling: the rank cannot be reaped (and its pid reused) meanwhile.
                let mut c = child.lock().unwrap_or_else(|e| e.into_inner());
                if matches!(c.try_wait(), Ok(None)) {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGTERM);
                }
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                let _ = child.lock().unwrap_or_else(|e| e.into_inner()).kill();
                return;
            }
        }
    }
}

/// How long rank 0 has to end the group after the launcher was told to stop.
const STOP_GRACE: Duration = Duration::from_secs(15);
