//! When speculative decoding pays: the speculative generator's fallback to plain decoding, decided
//! by measured wall time, so that speculation is never much slower than plain decoding.
//!
//! Generation alternates phases. A plain phase (pipelined plain decoding, as `Generator` runs it)
//! measures seconds per token; a speculative phase measures seconds per handed-out token of its
//! rounds (rejections, empty prompt-lookup rounds and the verification's host sync included) over
//! its last few rounds. Once a speculative phase has a few rounds measured and is slower than the
//! last plain phase by more than a small margin (one slow round, e.g. a KV buffer growing, must not
//! send it back), generation goes plain for a stretch, which doubles each time speculation loses
//! again (so probing a prompt where it never pays costs a few percent at most) and resets when it
//! wins. The first interval after a switch (pipeline fill, the draft model catching up) is not
//! measured. Each interval runs from one production event to the next, so the consumer's own time
//! per token counts the same in both modes.
use std::collections::VecDeque;
use std::time::Instant;

/// Speculative rounds measured before a phase is judged, and the rounds it is judged over.
const PROBE_ROUNDS: usize = 4;
const WINDOW: usize = 8;
/// Speculation is given up when its seconds per token exceed plain decoding's by this factor.
const MARGIN: f64 = 1.02;
/// Plain tokens measured first, and the first stretch after speculation loses.
const FIRST_STRETCH: usize = 16;
const MAX_STRETCH: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Plain decoding for this many more tokens.
    Plain { left: usize },
    Spec,
}

pub struct Pace {
    phase: Phase,
    /// Seconds per token of the last plain phase.
    plain: Option<f64>,
    /// This phase's measurement: seconds and tokens (plain), or the last rounds' (seconds,
    /// tokens) and the rounds measured (speculative).
    sum_s: f64,
    count: usize,
    window: VecDeque<(f64, usize)>,
    /// The first event of a phase is not measured.
    skip: bool,
    stretch: usize,
    last: Instant,
    /// Plain phases so far (for the statistics).
    pub fallbacks: usize,
}

impl Pace {
    /// Starts with a short plain phase, to know what speculation must beat.
    pub fn new() -> Pace {
        Pace {
            phase: Phase::Plain { left: FIRST_STRETCH },
            plain: None,
            sum_s: 0.0,
            count: 0,
            window: VecDeque::with_capacity(WINDOW),
            skip: true,
            stretch: FIRST_STRETCH,
            last: Instant::now(),
            fallbacks: 1,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether plain decoding goes on after the token about to be handed out (asked before that
    /// token is read, so that the next step can be queued first).
    pub fn plain_continues(&self) -> bool {
        matches!(self.phase, Phase::Plain { left } if left > 1)
    }

    fn switch(&mut self, phase: Phase) {
        self.phase = phase;
        self.sum_s = 0.0;
        self.count = 0;
        self.window.clear();
        self.skip = true;
    }

    /// The seconds since the previous production event (and restarts the clock); `None` for the
    /// first event of a phase.
    fn interval(&mut self) -> Option<f64> {
        let now = Instant::now();
        let dt = (now - self.last).as_secs_f64();
        self.last = now;
        if std::mem::take(&mut self.skip) {
            None
        } else {
            Some(dt)
        }
    }

    /// A plain token was handed out.
    pub fn plain_token(&mut self) {
        let dt = self.interval();
        let Phase::Plain { left } = self.phase else { return };
        if let Some(dt) = dt {
            self.sum_s += dt;
            self.count += 1;
        }
        if left > 1 {
            self.phase = Phase::Plain { left: left - 1 };
            return;
        }
        if self.count > 0 {
            self.plain = Some(self.sum_s / self.count as f64);
        }
        self.switch(Phase::Spec);
    }

    /// A speculative round handed out `tokens` tokens.
    pub fn round(&mut self, tokens: usize) {
        let Some(dt) = self.interval() else { return };
        if tokens == 0 {
            return;
        }
        if self.window.len() == WINDOW {
            self.window.pop_front();
        }
        self.window.push_back((dt, tokens));
        self.count += 1;
        if self.count < PROBE_ROUNDS {
            return;
        }
        let Some(plain) = self.plain else { return };
        let (s, n) = self.window.iter().fold((0.0, 0), |(s, n), &(dt, k)| (s + dt, n + k));
        if s / n as f64 > plain * MARGIN {
            let stretch = self.stretch;
            self.stretch = (2 * stretch).min(MAX_STRETCH);
            self.fallbacks += 1;
            self.switch(Phase::Plain { left: stretch });
        } else if self.count == PROBE_ROUNDS {
            self.stretch = FIRST_STRETCH;
        }
    }
}

impl Default for Pace {
    fn default() -> Self {
        Pace::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain_phase(p: &mut Pace) -> usize {
        let mut n = 0;
        while let Phase::Plain { .. } = p.phase() {
            p.plain_token();
            n += 1;
        }
        n
    }

    #[test]
    fn a_losing_speculation_falls_back_for_growing_stretches() {
        let mut p = Pace::new();
        assert_eq!(plain_phase(&mut p), FIRST_STRETCH);
        // Rounds are far slower per token than the plain tokens just measured (both ~0 s here,
        // so make the rounds take real time).
        p.plain = Some(1e-9);
        for _ in 0..PROBE_ROUNDS + 1 {
            std::thread::sleep(std::time::Duration::from_millis(1));
            p.round(1);
        }
        assert_eq!(p.phase(), Phase::Plain { left: FIRST_STRETCH });
        assert_eq!(plain_phase(&mut p), FIRST_STRETCH);
        p.plain = Some(1e-9);
        for _ in 0..PROBE_ROUNDS + 1 {
            std::thread::sleep(std::time::Duration::from_millis(1));
            p.round(1);
        }
        assert_eq!(p.phase(), Phase::Plain { left: 2 * FIRST_STRETCH });
        assert_eq!(p.fallbacks, 3);
    }

    #[test]
    fn a_winning_speculation_stays() {
        let mut p = Pace::new();
        plain_phase(&mut p);
        p.plain = Some(1.0); // a plain token took a second: every round here is faster
        for _ in 0..50 {
            p.round(3);
            assert_eq!(p.phase(), Phase::Spec);
        }
        assert_eq!(p.fallbacks, 1);
    }
}
