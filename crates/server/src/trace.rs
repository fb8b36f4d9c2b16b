//! `MLX_GEN_TRACE`: where the engine thread's serving steps spend their wall time. The worker
//! times its own stages (admitting jobs, of which preparing their prompts: template rendering,
//! tokenising and checks; handing tokens out: detokenising, stop strings, the events to the
//! handlers; flushing held events and publishing the gauges); the batch engine times the step's
//! (see `engine::batch::StepTrace`). Both go to stderr each time the engine falls idle, every
//! [`PERIOD`] of a longer busy stretch, and at shutdown, then start over.
use engine::batch::StepTrace;
use std::time::{Duration, Instant};

/// A busy stretch longer than this is reported in parts.
pub const PERIOD: Duration = Duration::from_secs(10);

#[derive(Default)]
pub struct WorkerTrace {
    /// Since the first job of this busy stretch arrived (or was taken).
    start: Option<Instant>,
    pub admit: Duration,
    pub prepare: Duration,
    pub step: Duration,
    pub on_token: Duration,
    pub flush: Duration,
    pub jobs: usize,
}

impl WorkerTrace {
    pub fn from_env() -> Option<WorkerTrace> {
        std::env::var_os("MLX_GEN_TRACE").map(|_| WorkerTrace::default())
    }

    /// Marks the start of a busy stretch (idempotent).
    pub fn busy(&mut self) {
        self.start.get_or_insert_with(Instant::now);
    }

    /// Whether this stretch has run for a [`PERIOD`] (report it and start over).
    pub fn due(&self) -> bool {
        self.start.is_some_and(|s| s.elapsed() >= PERIOD)
    }

    /// Prints this stretch (with the engine's `steps`) and starts over.
    pub fn report(&mut self, steps: Option<StepTrace>) {
        let Some(start) = self.start.take() else { return };
        let wall = start.elapsed();
        let ms = |d: Duration| 1e3 * d.as_secs_f64();
        let other = wall.saturating_sub(self.admit + self.step + self.on_token + self.flush);
        let mut line = format!(
            "trace: serve {} jobs in {:.1} ms: admit {:.1} (prepare {:.1}), step {:.1}, on_token {:.1}, flush+publish {:.1}, other {:.1}",
            self.jobs,
            ms(wall),
            ms(self.admit),
            ms(self.prepare),
            ms(self.step),
            ms(self.on_token),
            ms(self.flush),
            ms(other)
        );
        if let Some(s) = steps {
            line.push_str(&format!("\ntrace: engine {}", s.summary()));
            let total = |d: Duration| format!("{:.1}", ms(d));
            line.push_str(&format!(
                " (totals ms: drop {}, prefill {}, join {}, build+queue {}, wait {})",
                total(s.drop),
                total(s.prefill),
                total(s.join),
                total(s.build),
                total(s.wait)
            ));
        }
        eprintln!("{line}");
        *self = WorkerTrace::default();
    }
}

/// Adds the time since `since` to `stage` when tracing.
pub fn add(trace: &mut Option<WorkerTrace>, since: Instant, stage: fn(&mut WorkerTrace) -> &mut Duration) {
    if let Some(t) = trace.as_mut() {
        *stage(t) += since.elapsed();
    }
}
