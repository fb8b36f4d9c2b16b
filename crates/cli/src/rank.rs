//! The rank side of `mlx-gen launch`: a process started with `MLX_GEN_DISTRIBUTED` joins its
//! group before its command runs ([`join_from_env`]), loads its part of the model ([`load_model`]:
//! tensor parallel, or pipeline parallel with `--pipeline`), and keeps in step with the others:
//! rank 0 alone reads input and hands it on ([`share_from_leader`]), and a watchdog ends a rank
//! with a message when joining or one step takes longer than the timeout (a peer died). Used by
//! `generate`, `chat`, `bench` and `serve`; the launcher itself is `commands::launch`.
use anyhow::{bail, Context, Result};
use engine::Parallel;
use mlx::distributed::{Backend, Group, Watchdog};
use std::sync::OnceLock;
use std::time::Duration;

/// The commands that run on several ranks.
pub const SHARDED_COMMANDS: [&str; 4] = ["generate", "chat", "bench", "serve"];

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
