//! A token mailbox (the shim's mailbox.cpp): sampled tokens read by the host as soon as the device
//! has sampled them, before the evaluation they belong to (a forward pass queued behind them) ends.

use crate::{check, ffi, make, Handle, Result};
use std::os::raw::c_int;
use std::ptr::{self, NonNull};

/// A block of host memory that posts write their tokens to. Like [`Handle`], neither `Send` nor
/// `Sync`: posts and reads belong to the thread that builds and evaluates the graphs.
pub struct Mailbox(NonNull<ffi::mlxs_mailbox_>);

impl Drop for Mailbox {
    fn drop(&mut self) {
        // SAFETY: we own this mailbox, created by the shim, freed once here.
        unsafe { ffi::mlxs_mailbox_free(self.0.as_ptr()) }
    }
}

impl Mailbox {
    /// A mailbox on the default device; an error where it has none (Metal).
    pub fn new() -> Result<Mailbox> {
        let mut out: ffi::mlxs_mailbox = ptr::null_mut();
        check(unsafe { ffi::mlxs_mailbox_new(&mut out) })?;
        NonNull::new(out).map(Mailbox).ok_or_else(|| "MLX returned no mailbox".to_owned())
    }

    /// tokens (n,) u32 or i32 -> (the same tokens, to use in their place downstream, the post's
    /// number for [`Mailbox::wait`]).
    pub fn post(&self, tokens: &Handle) -> Result<(Handle, u32)> {
        let mut seq = 0u32;
        let h = make(|o| unsafe { ffi::mlxs_mailbox_post(o, &mut seq, self.0.as_ptr(), tokens.raw()) })?;
        Ok((h, seq))
    }

    /// Post `seq`'s tokens into `dst` (as long as `posted`) once the device has written them;
    /// `false` where the caller must read `posted` itself (never queued, or a later post holds the
    /// block).
    pub fn wait(&self, seq: u32, posted: &Handle, dst: &mut [u32]) -> Result<bool> {
        let mut got: c_int = 0;
        check(unsafe { ffi::mlxs_mailbox_wait(&mut got, self.0.as_ptr(), seq, posted.raw(), dst.as_mut_ptr(), dst.len()) })?;
        Ok(got == 1)
    }
}
