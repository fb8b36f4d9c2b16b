//! Safe wrappers over MLX distributed (`shim/distributed.cpp`): groups and collectives.
use super::{cstring, ffi, Handle, Result};
use std::ffi::{c_int, CStr};
use std::ptr::{self, NonNull};

/// An owned `mlx::core::distributed::Group`.
pub struct GroupHandle(NonNull<ffi::mlxs_group_>);

// SAFETY: a Group is a shared_ptr to the backend's communicator; moving it between threads is safe.
// Sharing it is safe too: rank/size/split only read it, and the collectives only build graph nodes
// (the communication happens when the graph is evaluated, on the thread that evaluates it).
unsafe impl Send for GroupHandle {}
// SAFETY: see above.
unsafe impl Sync for GroupHandle {}

impl Drop for GroupHandle {
    fn drop(&mut self) {
        // SAFETY: we own this handle, created by the shim, freed once here.
        unsafe { ffi::mlxs_group_free(self.0.as_ptr()) }
    }
}

fn dist_check(status: c_int) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        // SAFETY: the shim returns a pointer to a thread-local, NUL-terminated string.
        Err(unsafe { CStr::from_ptr(ffi::mlxs_dist_last_error()) }.to_string_lossy().into_owned())
    }
}

fn dist_make(f: impl FnOnce(*mut ffi::mlxs_array) -> c_int) -> Result<Handle> {
    let mut out: ffi::mlxs_array = ptr::null_mut();
    dist_check(f(&mut out))?;
    NonNull::new(out).map(Handle).ok_or_else(|| "MLX returned no array".to_owned())
}

fn group_make(f: impl FnOnce(*mut ffi::mlxs_group) -> c_int) -> Result<GroupHandle> {
    let mut out: ffi::mlxs_group = ptr::null_mut();
    dist_check(f(&mut out))?;
    NonNull::new(out).map(GroupHandle).ok_or_else(|| "MLX returned no group".to_owned())
}

/// Whether MLX was built with `backend` ("ring", "mpi", "nccl", "jaccl" or "any") and can use it.
pub fn dist_is_available(backend: &str) -> bool {
    match cstring(backend) {
        Ok(b) => unsafe { ffi::mlxs_dist_is_available(b.as_ptr()) != 0 },
        Err(_) => false,
    }
}

/// `distributed::init(strict, backend)`: the group of every process the backend finds.
pub fn dist_init(strict: bool, backend: &str) -> Result<GroupHandle> {
    let b = cstring(backend)?;
    group_make(|o| unsafe { ffi::mlxs_dist_init(o, c_int::from(strict), b.as_ptr()) })
}

pub fn group_rank(g: &GroupHandle) -> i32 {
    unsafe { ffi::mlxs_group_rank(g.0.as_ptr()) }
}

pub fn group_size(g: &GroupHandle) -> i32 {
    unsafe { ffi::mlxs_group_size(g.0.as_ptr()) }
}

pub fn group_split(g: &GroupHandle, color: i32, key: i32) -> Result<GroupHandle> {
    group_make(|o| unsafe { ffi::mlxs_group_split(o, g.0.as_ptr(), color, key) })
}

pub fn dist_all_sum(x: &Handle, g: &GroupHandle) -> Result<Handle> {
    dist_make(|o| unsafe { ffi::mlxs_dist_all_sum(o, x.raw(), g.0.as_ptr()) })
}

pub fn dist_all_gather(x: &Handle, g: &GroupHandle) -> Result<Handle> {
    dist_make(|o| unsafe { ffi::mlxs_dist_all_gather(o, x.raw(), g.0.as_ptr()) })
}

pub fn dist_send(x: &Handle, dst: i32, g: &GroupHandle) -> Result<Handle> {
    dist_make(|o| unsafe { ffi::mlxs_dist_send(o, x.raw(), dst, g.0.as_ptr()) })
}

pub fn dist_recv_like(like: &Handle, src: i32, g: &GroupHandle) -> Result<Handle> {
    dist_make(|o| unsafe { ffi::mlxs_dist_recv_like(o, like.raw(), src, g.0.as_ptr()) })
}

extern "C" {
    fn _exit(code: c_int) -> !;
}

/// Ends the process at once with `code`, running no destructors or exit handlers: for a watchdog
/// whose main thread is blocked inside a collective that will never finish.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` takes an int and never returns; skipping destructors is the point.
    unsafe { _exit(code) }
}
