//! `mlx-gen launch`: one process per rank with MLX's distributed environment, and the rank side of it.
//!
//! The launcher writes the ring hostfile (MLX's JSON format: one list of `"ip:port"` per rank),
//! starts `mlx-gen <command>` once per rank with `MLX_RANK`, `MLX_HOSTFILE`, `MLX_GEN_DISTRIBUTED`
//! (the backend) and `MLX_GEN_DIST_TIMEOUT` (seconds), shows rank 0's standard output only, and
//! when a rank fails stops the others and exits non-zero. A rank started with `MLX_GEN_DISTRIBUTED`
//! joins the group before its command runs and loads its part of the model (tensor parallel, or
//! pipeline parallel with the command's `--pipeline`); a watchdog ends it with a message when
//! joining or one generation step takes longer than the timeout (a peer died). Every rank runs the
//! same forward passes: rank 0 alone reads standard input and hands what it read to the others.
use anyhow::{bail, Context, Result};
use engine::Parallel;
use mlx::distributed::{Backend, Group, Watchdog};
use std::net::{IpAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Comma-separated IP addresses, one per rank (only this machine's loopback addresses are
    /// started here; see the README for starting ranks on other machines by hand).
    #[arg(long, value_delimiter = ',', required_unless_present = "hostfile")]
    hosts: Vec<IpAddr>,
    /// A ring hostfile in MLX's JSON format (`[["ip:port"], ...]`), instead of --hosts.
    #[arg(long, conflicts_with = "hosts")]
    hostfile: Option<PathBuf>,
    /// The MLX distributed backend.
    #[arg(long, default_value = "ring", value_parser = ["ring", "mpi", "nccl", "jaccl", "any"])]
    backend: String,
    /// First TCP port of the ring (one port per rank); by default free ports chosen here.
    #[arg(long)]
    starting_port: Option<u16>,
    /// Seconds a rank waits for its peers (to join, or per generation step) before it gives up.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// The mlx-gen command each rank runs, after `--` (e.g. `-- generate --model M --prompt hi`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// The commands that run on several ranks.
pub const SHARDED_COMMANDS: [&str; 4] = ["generate", "chat", "bench", "serve"];

/// Starts the ranks and waits for them; the first failure stops the rest.
pub fn run(args: &Args) -> Result<()> {
    let sub = args.command.iter().find(|a| !a.starts_with('-') && *a != "cpu" && *a != "gpu");
    if !sub.is_some_and(|s| SHARDED_COMMANDS.contains(&s.as_str())) {
        bail!("launch runs {} only for now (got {:?})", SHARDED_COMMANDS.join(", "), args.command.join(" "));
    }
    if args.backend != "ring" {
        bail!("launch starts ring ranks only for now; start {} ranks with its own launcher (mpirun, ...)", args.backend);
    }
    let (hostfile, ranks) = match &args.hostfile {
        Some(f) => {
            let text = std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?;
            let hosts: Vec<Vec<String>> =
                serde_json::from_str(&text).with_context(|| format!("{}: not a JSON list of lists of \"ip:port\"", f.display()))?;
            for addr in hosts.iter().flatten() {
                let sa: std::net::SocketAddr = addr.parse().with_context(|| format!("{}: {addr:?} is not ip:port", f.display()))?;
                if !sa.ip().is_loopback() {
                    bail!("{}: {addr} is not this machine's loopback address: start remote ranks by hand (see the README)", f.display());
                }
            }
            (text, hosts.len())
        }
        None => {
            if let Some(h) = args.hosts.iter().find(|h| !h.is_loopback()) {
                bail!("{h} is not this machine's loopback address: start remote ranks by hand (see the README)");
            }
            let ports = ports(&args.hosts, args.starting_port)?;
            let hosts: Vec<Vec<String>> = args.hosts.iter().zip(&ports).map(|(h, p)| vec![format!("{h}:{p}")]).collect();
            (serde_json::to_string(&hosts)?, hosts.len())
        }
    };
    if ranks < 2 {
        bail!("a group needs at least 2 ranks, got {ranks}");
    }
    let file = std::env::temp_dir().join(format!("mlx-gen-hosts-{}.json", std::process::id()));
    std::fs::write(&file, &hostfile).with_context(|| format!("cannot write {}", file.display()))?;
    let exe = std::env::current_exe().context("cannot find the mlx-gen executable")?;
    let mut children: Vec<Child> = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        let child = Command::new(&exe)
            .args(&args.command)
            .env("MLX_RANK", rank.to_string())
            .env("MLX_HOSTFILE", &file)
            .env("MLX_GEN_DISTRIBUTED", &args.backend)
            .env("MLX_GEN_DIST_TIMEOUT", args.timeout.to_string())
            .stdin(if rank == 0 { Stdio::inherit() } else { Stdio::null() })
            .stdout(if rank == 0 { Stdio::inherit() } else { Stdio::null() })
            .spawn();
        match child {
            Ok(c) => children.push(c),
            Err(e) => {
                stop(&mut children);
                let _ = std::fs::remove_file(&file);
                bail!("cannot start rank {rank}: {e}");
            }
        }
    }
    // Ctrl-C or SIGTERM to the launcher: rank 0 is asked to stop (a server finishes its streams and
    // tells the other ranks), then whatever is left is stopped.
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, term.clone()).context("cannot install a signal handler")?;
    }
    let result = wait_all(&mut children, &term);
    let _ = std::fs::remove_file(&file);
    result
}

/// One port per rank: consecutive from `start`, or free ones found by binding port 0.
fn ports(hosts: &[IpAddr], start: Option<u16>) -> Result<Vec<u16>> {
    match start {
        Some(p) => (0..hosts.len())
            .map(|i| u16::try_from(usize::from(p) + i).context("--starting-port leaves no room for every rank"))
            .collect(),
        None => {
            // Held until all are chosen, so that no two ranks get the same port.
            let listeners = hosts.iter().map(|h| TcpListener::bind((*h, 0))).collect::<std::io::Result<Vec<_>>>()?;
            listeners.iter().map(|l| Ok(l.local_addr()?.port())).collect()
        }
    }
}

fn stop(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Polls the ranks until all succeed or one fails (then the others are killed), or until `term`
/// is set: then rank 0 gets SIGTERM and `STOP_GRACE` to end the group before the rest is killed.
fn wait_all(children: &mut [Child], term: &AtomicBool) -> Result<()> {
    let mut done = vec![false; children.len()];
    let mut stopping_since: Option<std::time::Instant> = None;
    loop {
        if term.load(Ordering::Relaxed) && stopping_since.is_none() {
            stopping_since = Some(std::time::Instant::now());
            if let Some(leader) = children.first() {
                let pid = nix::unistd::Pid::from_raw(leader.id() as i32);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            }
        }
        if stopping_since.is_some_and(|t| t.elapsed() > STOP_GRACE) {
            stop(children);
            bail!("stopped by a signal");
        }
        for (rank, c) in children.iter_mut().enumerate() {
            if done[rank] {
                continue;
            }
            if let Some(status) = c.try_wait()? {
                done[rank] = true;
                if !status.success() && stopping_since.is_none() {
                    stop(children);
                    bail!("rank {rank} failed ({status}); stopped the other ranks");
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

/// How long rank 0 has to end the group after the launcher was told to stop.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// This process's place in a launched group.
struct Rank {
    group: Group,
    watchdog: Watchdog,
    timeout: Duration,
}

static RANK: OnceLock<Rank> = OnceLock::new();

/// With `MLX_GEN_DISTRIBUTED=<backend>` in the environment, joins the group (strictly, within
/// `MLX_GEN_DIST_TIMEOUT` seconds, default 120); otherwise does nothing. Only the
/// [`SHARDED_COMMANDS`] run sharded for now: for other commands (`sharded_ok == false`) it refuses.
pub fn join_from_env(sharded_ok: bool) -> Result<()> {
    let Some(name) = std::env::var_os("MLX_GEN_DISTRIBUTED") else { return Ok(()) };
    let name = name.to_string_lossy();
    if !sharded_ok {
        bail!("MLX_GEN_DISTRIBUTED={name}: only {} run on several ranks for now", SHARDED_COMMANDS.join(", "));
    }
    let backend = Backend::parse(&name).with_context(|| format!("MLX_GEN_DISTRIBUTED={name}: expected ring, mpi, nccl, jaccl or any"))?;
    if !backend.is_available() {
        bail!("the {name} backend is not available in this MLX build");
    }
    let secs = match std::env::var("MLX_GEN_DIST_TIMEOUT") {
        Ok(s) => s.parse::<u64>().with_context(|| format!("MLX_GEN_DIST_TIMEOUT={s}: expected whole seconds"))?,
        Err(_) => 120,
    };
    let timeout = Duration::from_secs(secs.max(1));
    let watchdog = Watchdog::start();
    let who = std::env::var("MLX_RANK").map(|r| format!("rank {r}")).unwrap_or_else(|_| "this rank".into());
    watchdog.arm(timeout, format!("{who}: joining the {name} group ({secs} s)"));
    let group = Group::init(backend, true).with_context(|| format!("{who}: cannot join the {name} group"))?;
    watchdog.disarm();
    let _ = RANK.set(Rank { group, watchdog, timeout });
    Ok(())
}

/// The group this process joined, if it was launched as a rank.
pub fn group() -> Option<&'static Group> {
    RANK.get().map(|r| &r.group)
}

/// Gives the next step `what` the timeout (no-op outside a group).
pub fn heartbeat(what: &str) {
    if let Some(r) = RANK.get() {
        r.watchdog.arm(r.timeout, format!("rank {}: {what} ({} s)", r.group.rank(), r.timeout.as_secs()));
    }
}

/// No more collectives: the watchdog stands down.
pub fn finished() {
    if let Some(r) = RANK.get() {
        r.watchdog.disarm();
    }
}

/// Whether this process prints: it is not a rank, or it is rank 0.
pub fn is_leader() -> bool {
    group().is_none_or(|g| g.rank() == 0)
}

/// Rank 0's `bytes` on every rank (the others' are ignored); `bytes` itself outside a group. The
/// watchdog stands down first: the other ranks wait here for as long as rank 0's input takes.
pub fn share_from_leader(bytes: &[u8]) -> Result<Vec<u8>> {
    let Some(r) = RANK.get() else { return Ok(bytes.to_vec()) };
    r.watchdog.disarm();
    let g = &r.group;
    let leader = g.rank() == 0;
    // The length first (only rank 0's is non-zero), then the bytes, as i32 (summed over the group).
    let len = mlx::Array::from_slice(&[if leader { bytes.len() as i32 } else { 0 }], &[1])?;
    let len = usize::try_from(g.all_sum(&len)?.item::<i32>()?).context("a negative length from rank 0")?;
    if len == 0 {
        return Ok(Vec::new());
    }
    let data: Vec<i32> = if leader { bytes.iter().map(|&b| i32::from(b)).collect() } else { vec![0; len] };
    let data = g.all_sum(&mlx::Array::from_slice(&data, &[len as i32])?)?.to_vec::<i32>()?;
    Ok(data.into_iter().map(|b| b as u8).collect())
}

/// Loads the model whole, or this rank's part of it when launched as a rank (tensor parallel, or
/// pipeline parallel with `pipeline`); with the load time in seconds.
pub fn load_model(dir: &std::path::Path, pipeline: bool) -> Result<(engine::LoadedModel, f64)> {
    let Some(g) = group() else { return crate::progress::load_model(dir) };
    let (how, what) = if pipeline { (Parallel::Pipeline, "pipeline") } else { (Parallel::Tensor, "tensor") };
    let t0 = std::time::Instant::now();
    let loaded = engine::LoadedModel::load_parallel(dir, g, how)
        .with_context(|| format!("rank {}: cannot load {} {what}-parallel over {} ranks", g.rank(), dir.display(), g.size()))?;
    // As mlx-lm's sharded_load: every rank is ready before any starts timing out on the others.
    heartbeat("waiting for the other ranks to load");
    g.all_sum(&mlx::Array::from_slice(&[1.0f32], &[1])?)?.eval()?;
    finished();
    Ok((loaded, t0.elapsed().as_secs_f64()))
}
