//! `MLX_GEN_TRACE`: where the batch engine's steps spend their wall time, stage by stage (rows
//! leaving, newcomers' prefill, joining, building and queueing the step's graph, waiting for the
//! step's tokens). The server adds its own stages around them (see `server::trace`).
use std::time::{Duration, Instant};

/// Seconds per stage of the steps so far, and what they did.
#[derive(Clone, Debug, Default)]
pub struct StepTrace {
    pub steps: usize,
    /// Rows handed out (tokens) and prompt positions prefilled (padding included).
    pub tokens: usize,
    pub prefill_positions: usize,
    /// Prefill forwards run (each chunk of a group of newcomers counts once).
    pub prefill_forwards: usize,
    /// Rows leaving, their keys and values stored in the prefix pool.
    pub drop: Duration,
    /// Newcomers' prompts through the model (chunks, their last position, their first tokens).
    pub prefill: Duration,
    /// Prefilled rows merged into the running batch.
    pub join: Duration,
    /// The batched forward and sampling graph built and queued.
    pub build: Duration,
    /// Of `build`, building the graph alone (the rest is MLX queueing it); in a constrained step
    /// the masked sampling, the mailbox's post and the forward pass queued ahead.
    pub graph: Duration,
    /// Waiting for the current step's tokens (the device's time not hidden behind the host's).
    pub wait: Duration,
    /// Constrained steps: committing the tokens and computing the next masks on the host.
    pub mask: Duration,
    /// Calls that could wait for the device (`mlx::host_waits`: evaluations and host reads).
    pub waits: u64,
}

impl StepTrace {
    /// A trace when `MLX_GEN_TRACE` is set.
    pub fn from_env() -> Option<StepTrace> {
        std::env::var_os("MLX_GEN_TRACE").map(|_| StepTrace::default())
    }

    /// One line: milliseconds per step of each stage.
    pub fn summary(&self) -> String {
        let per = |d: Duration| 1e3 * d.as_secs_f64() / self.steps.max(1) as f64;
        format!(
            "{} steps, {} tokens, {} prompt positions in {} prefill forwards; ms/step: drop {:.3}, prefill {:.3}, join {:.3}, build+queue {:.3} (graph {:.3}), wait {:.3}, mask {:.3}; {:.2} evaluations and host reads/step",
            self.steps,
            self.tokens,
            self.prefill_positions,
            self.prefill_forwards,
            per(self.drop),
            per(self.prefill),
            per(self.join),
            per(self.build),
            per(self.graph),
            per(self.wait),
            per(self.mask),
            self.waits as f64 / self.steps.max(1) as f64
        )
    }
}

/// Adds the time since `*since` to `stage` and restarts the clock.
pub(super) fn lap(stage: &mut Duration, since: &mut Instant) {
    let now = Instant::now();
    *stage += now.duration_since(*since);
    *since = now;
}
