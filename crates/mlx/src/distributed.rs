//! MLX distributed: a [`Group`] of processes over a backend (ring, MPI, NCCL, JACCL), its
//! collectives (`all_sum`, `all_gather`, `send`, `recv_like`), and a [`Watchdog`] that ends the
//! process with a message when a peer stops answering (MLX itself waits forever).
//!
//! The ring backend reads `MLX_RANK` (this process's rank) and `MLX_HOSTFILE` (a path to a JSON
//! list with one entry per rank, each a list of `"ip:port"` strings), as `mlx.launch` writes them.
use crate::error::{ctx, Result};
use crate::Array;
use mlx_sys::distributed as sys;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The communication backends MLX knows; `Any` takes the first available.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Ring,
    Mpi,
    Nccl,
    Jaccl,
    Any,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Ring => "ring",
            Backend::Mpi => "mpi",
            Backend::Nccl => "nccl",
            Backend::Jaccl => "jaccl",
            Backend::Any => "any",
        }
    }

    pub fn parse(s: &str) -> Option<Backend> {
        [Backend::Ring, Backend::Mpi, Backend::Nccl, Backend::Jaccl, Backend::Any].into_iter().find(|b| b.name() == s)
    }

    /// Whether this MLX build can use the backend.
    pub fn is_available(self) -> bool {
        sys::dist_is_available(self.name())
    }
}

/// A group of communicating processes; cloning shares it.
#[derive(Clone)]
pub struct Group(Arc<sys::GroupHandle>);

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Group(rank {} of {})", self.rank(), self.size())
    }
}

impl Group {
    /// `distributed::init`: strict fails when the backend cannot start; otherwise a failed start
    /// gives the singleton group (rank 0 of 1), whose collectives are no-ops.
    pub fn init(backend: Backend, strict: bool) -> Result<Group> {
        Ok(Group(Arc::new(ctx("distributed init", sys::dist_init(strict, backend.name()))?)))
    }

    pub fn rank(&self) -> i32 {
        sys::group_rank(&self.0)
    }

    pub fn size(&self) -> i32 {
        sys::group_size(&self.0)
    }

    /// Processes with the same `color` form one new group, ordered by `key` (negative: by rank).
    pub fn split(&self, color: i32, key: i32) -> Result<Group> {
        Ok(Group(Arc::new(ctx("distributed split", sys::group_split(&self.0, color, key))?)))
    }

    /// The element-wise sum of `x` over every rank.
    pub fn all_sum(&self, x: &Array) -> Result<Array> {
        ctx("all_sum", sys::dist_all_sum(x.handle(), &self.0)).map(Array::from_handle)
    }

    /// Every rank's `x`, concatenated along axis 0 in rank order.
    pub fn all_gather(&self, x: &Array) -> Result<Array> {
        ctx("all_gather", sys::dist_all_gather(x.handle(), &self.0)).map(Array::from_handle)
    }

    /// Sends `x` to rank `dst` when the returned array is evaluated.
    pub fn send(&self, x: &Array, dst: i32) -> Result<Array> {
        ctx("send", sys::dist_send(x.handle(), dst, &self.0)).map(Array::from_handle)
    }

    /// Receives from rank `src` an array of `like`'s shape and dtype.
    pub fn recv_like(&self, like: &Array, src: i32) -> Result<Array> {
        ctx("recv", sys::dist_recv_like(like.handle(), src, &self.0)).map(Array::from_handle)
    }
}

/// The exit status of a process that a [`Watchdog`] ends.
pub const WATCHDOG_EXIT_CODE: i32 = 75;

type Deadline = Option<(Instant, String)>;

/// A thread that ends the process (status [`WATCHDOG_EXIT_CODE`], with a message on standard
/// error) when an armed deadline passes: MLX's collectives have no timeout of their own.
#[derive(Clone)]
pub struct Watchdog {
    state: Arc<(Mutex<Deadline>, Condvar)>,
}

impl Watchdog {
    /// Starts the (disarmed) watchdog thread.
    pub fn start() -> Watchdog {
        let state: Arc<(Mutex<Deadline>, Condvar)> = Arc::new((Mutex::new(None), Condvar::new()));
        let s = Arc::clone(&state);
        std::thread::Builder::new()
            .name("mlx-gen-watchdog".into())
            .spawn(move || watch(&s))
            .expect("cannot start the watchdog thread");
        Watchdog { state }
    }

    /// From now, `timeout` for `what` to finish (replacing any earlier deadline).
    pub fn arm(&self, timeout: Duration, what: impl Into<String>) {
        let (lock, cv) = &*self.state;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now() + timeout, what.into()));
        cv.notify_all();
    }

    pub fn disarm(&self) {
        let (lock, cv) = &*self.state;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = None;
        cv.notify_all();
    }
}

fn watch(state: &(Mutex<Deadline>, Condvar)) {
    let (lock, cv) = state;
    let mut guard = lock.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let wait = match &*guard {
            None => Duration::from_secs(3600),
            Some((deadline, what)) => {
                let now = Instant::now();
                if now >= *deadline {
                    eprintln!("error: {what}: no answer from a peer in time (a rank died or cannot be reached); exiting");
                    sys::exit_now(WATCHDOG_EXIT_CODE);
                }
                *deadline - now
            }
        };
        guard = cv.wait_timeout(guard, wait).unwrap_or_else(|e| e.into_inner()).0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn singleton_group_collectives_are_identity() {
        let g = Group::init(Backend::Any, false).unwrap();
        assert_eq!((g.rank(), g.size()), (0, 1));
        let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
        assert_eq!(g.all_sum(&x).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
        assert_eq!(g.all_gather(&x).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
        // MLX refuses to split the singleton group; the error must come back, not abort.
        assert!(g.split(0, -1).unwrap_err().message.contains("split"));
        assert_eq!(Backend::parse("ring"), Some(Backend::Ring));
        assert!(Backend::parse("tcp").is_none());
    }
}
