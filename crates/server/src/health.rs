//! The engine thread's health as `/health` reports it: stepping (200), or dead or stuck in one
//! step past a deadline (503 with the reason). The engine thread beats at every step; the HTTP side
//! reads the beat. A dead engine also ends the process (see `crate::serve`), so a supervisor
//! restarts it rather than a server answering 503 forever.
//!
//! Test hook: `MLX_GEN_SERVE_FAULT=panic@N` makes the engine thread panic at its N-th step and
//! `stall@N:SECS` makes that step take SECS seconds longer (the dead- and stuck-engine tests).
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct State {
    /// When the step under way began (`None` while the engine waits for work).
    stepping_since: Option<Instant>,
    /// Why the engine thread ended, once it has.
    dead: Option<String>,
    steps: u64,
}

/// Shared by the engine thread (which reports) and the HTTP handlers (which read).
pub struct EngineHealth {
    state: Mutex<State>,
    /// Longest a step may take before the engine counts as stuck.
    deadline: Duration,
}

/// What `/health` says.
#[derive(Debug, PartialEq)]
pub enum Status {
    Ok { stepping: bool, steps: u64 },
    Dead(String),
    Stuck(Duration),
}

impl EngineHealth {
    pub fn new(deadline: Duration) -> EngineHealth {
        EngineHealth { state: Mutex::new(State { stepping_since: None, dead: None, steps: 0 }), deadline }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A step begins (the previous one, if any, ended).
    pub fn step_begins(&self) {
        self.with(|s| {
            s.stepping_since = Some(Instant::now());
            s.steps += 1;
        });
    }

    /// The engine has nothing to do and waits for work.
    pub fn waiting(&self) {
        self.with(|s| s.stepping_since = None);
    }

    /// The engine thread ended for `reason`.
    pub fn died(&self, reason: String) {
        self.with(|s| s.dead = Some(reason));
    }

    /// Why the engine thread ended, if it has.
    pub fn dead(&self) -> Option<String> {
        self.with(|s| s.dead.clone())
    }

    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    pub fn status(&self) -> Status {
        self.with(|s| match (&s.dead, s.stepping_since) {
            (Some(reason), _) => Status::Dead(reason.clone()),
            (None, Some(t)) if t.elapsed() > self.deadline => Status::Stuck(t.elapsed()),
            (None, t) => Status::Ok { stepping: t.is_some(), steps: s.steps },
        })
    }
}

/// A fault the test hook asks for (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    Panic { step: u64 },
    Stall { step: u64, seconds: u64 },
}

impl Fault {
    /// The fault `MLX_GEN_SERVE_FAULT` names, if any (an unreadable value is an error).
    pub fn from_env() -> anyhow::Result<Option<Fault>> {
        let Ok(v) = std::env::var("MLX_GEN_SERVE_FAULT") else { return Ok(None) };
        Fault::parse(&v).map(Some).ok_or_else(|| anyhow::anyhow!("MLX_GEN_SERVE_FAULT must be 'panic@STEP' or 'stall@STEP:SECONDS', got {v:?}"))
    }

    fn parse(v: &str) -> Option<Fault> {
        let (kind, at) = v.split_once('@')?;
        match kind {
            "panic" => Some(Fault::Panic { step: at.parse().ok()? }),
            "stall" => {
                let (step, secs) = at.split_once(':')?;
                Some(Fault::Stall { step: step.parse().ok()?, seconds: secs.parse().ok()? })
            }
            _ => None,
        }
    }

    /// Applies the fault if `step` is its step.
    pub fn at(self, step: u64) {
        match self {
            Fault::Panic { step: s } if s == step => panic!("MLX_GEN_SERVE_FAULT: the engine thread panics at step {step}"),
            Fault::Stall { step: s, seconds } if s == step => std::thread::sleep(Duration::from_secs(seconds)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_step_is_stuck_and_a_death_is_reported() {
        let h = EngineHealth::new(Duration::from_millis(30));
        assert_eq!(h.status(), Status::Ok { stepping: false, steps: 0 });
        h.step_begins();
        assert_eq!(h.status(), Status::Ok { stepping: true, steps: 1 });
        std::thread::sleep(Duration::from_millis(60));
        assert!(matches!(h.status(), Status::Stuck(d) if d >= Duration::from_millis(60)));
        h.waiting();
        assert_eq!(h.status(), Status::Ok { stepping: false, steps: 1 });
        h.died("gone".into());
        assert_eq!(h.status(), Status::Dead("gone".into()));
    }

    #[test]
    fn faults_parse() {
        assert_eq!(Fault::parse("panic@3"), Some(Fault::Panic { step: 3 }));
        assert_eq!(Fault::parse("stall@2:5"), Some(Fault::Stall { step: 2, seconds: 5 }));
        assert_eq!(Fault::parse("stall@2"), None);
        assert_eq!(Fault::parse("boom@1"), None);
    }
}
