//! Sampled tokens read before their evaluation ends. MLX signals every array of one evaluation
//! together, when all of it is done; a step that queues token n's sampling with forward pass n+1
//! over it would otherwise read token n only after forward n+1. Tokens posted through a
//! [`Mailbox`] are written to host memory the moment they are sampled, so such a step reads them
//! while the device runs the forward pass (on the CPU and on a CUDA GPU; not on Metal, where
//! [`Mailbox::new`] gives `None`).
use crate::array::count_wait;
use crate::error::ctx;
use crate::{Array, Result};

/// One thread's mailbox (posts and reads belong to the thread that evaluates the graphs).
pub struct Mailbox(mlx_sys::Mailbox);

/// One post's ticket, for [`Mailbox::read`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u32);

impl Mailbox {
    /// A mailbox on the default device: `None` where it has none (Metal) or `MLX_GEN_MAILBOX=0`
    /// asks for none (the engine then queues sampling in an evaluation of its own).
    pub fn new() -> Option<Mailbox> {
        if std::env::var("MLX_GEN_MAILBOX").is_ok_and(|v| v == "0") {
            return None;
        }
        mlx_sys::Mailbox::new().ok().map(Mailbox)
    }

    /// tokens (n,) u32 or i32 -> (the same tokens, to be used in their place by whatever reads them
    /// on the device, so that the post runs as soon as they are sampled; the post's ticket).
    #[track_caller]
    pub fn post(&self, tokens: &Array) -> Result<(Array, Ticket)> {
        let (h, seq) = ctx("mailbox post", self.0.post(tokens.handle()))?;
        Ok((Array::from_handle(h), Ticket(seq)))
    }

    /// The tokens of the post `ticket` (whose output is `posted`), as soon as the device has
    /// written them; read from `posted` itself where the post was never queued.
    #[track_caller]
    pub fn read(&self, ticket: Ticket, posted: &Array) -> Result<Vec<u32>> {
        count_wait();
        let mut out = vec![0u32; posted.size()];
        if ctx("mailbox read", self.0.wait(ticket.0, posted.handle(), &mut out))? {
            Ok(out)
        } else {
            posted.to_vec::<u32>()
        }
    }
}
