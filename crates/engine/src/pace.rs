//! When speculative decoding pays: the speculative generator's fallback to plain decoding, decided
//! by measured wall time, so that speculation is never much slower than plain decoding.
//!
//! Generation alternates phases. A plain phase (pipelined plain decoding, as `Generator` runs it)
//! measures seconds per token, as the median of its tokens' intervals (a one-time cost in a few of
//! them, such as the GPU compiling a kernel at its first use right after the prompt, must not make
//! plain decoding look slow: with the mean, a speculation at 0.6x plain once looked like a win and
//! never fell back); a speculative phase measures seconds per handed-out token of its rounds
//! (rejections, empty prompt-lookup rounds and the verification's host sync included) over its
//! last few rounds. Once a speculative phase is slower than the last plain phase, generation goes
//! plain for a stretch: a close call is judged after a few rounds with a small margin (one slow
//! round, e.g. a KV buffer growing, must not send it back) and the stretch doubles each time; a
//! clear loss is judged after two rounds (1.25x plain's time per token) and runs four stretches at
//! once; at 1.5x it goes plain for the longest stretch, judged after one round where no draft was
//! accepted (a draft that is rarely accepted costs a round of several steps per token: each probe
//! of it is expensive, and it will not turn around soon). A win resets the stretch. The first
//! interval after a switch (pipeline fill, the draft model catching up) is not measured. Each
//! interval runs from one production event to the next, so the consumer's own time per token
//! counts the same in both modes. A loss that would stand even if every proposed draft had been
//! accepted (full-length drafts in every round judged) is the rounds' own cost, not the prompt's:
//! [`Pace::structural_loss`] says so, and the batch engine starts its next sequence alone with the
//! same draft length plain ([`Pace::after_structural_loss`]).
use std::collections::VecDeque;
use std::time::Instant;

/// Speculative rounds measured before a close call is judged, and the rounds it is judged over.
const PROBE_ROUNDS: usize = 4;
const WINDOW: usize = 8;
/// Speculation is given up when its seconds per token exceed plain decoding's by this factor.
const MARGIN: f64 = 1.02;
/// A clear loss (seconds per token over plain's): judged after 2 rounds, and the plain phase runs
/// four stretches at once.
const CLEAR: f64 = 1.25;
/// Speculation at two thirds of plain's speed or worse (a draft model whose drafts are rarely
/// accepted: a round of several steps per token; or one as deep as the target on a device where a
/// step's cost is the host's, however small the model) goes plain for the longest stretch at once,
/// since every probe of it costs several tokens' time: judged after 2 rounds, or after 1 where
/// drafts were proposed and none accepted (a round that hands out several tokens may have paid a
/// one-time cost, a kernel compiled at its first use, and is not judged alone; nor is a round
/// without drafts, prompt lookup finding nothing: it says nothing of the drafts to come).
const HOPELESS: f64 = 1.5;
/// Plain tokens measured first, and the first stretch after speculation loses.
const FIRST_STRETCH: usize = 16;
const MAX_STRETCH: usize = 1024;

/// One measured speculative round.
#[derive(Clone, Copy, Debug)]
struct Round {
    seconds: f64,
    /// Tokens it handed out.
    tokens: usize,
    /// Draft tokens it proposed (prompt lookup may find none).
    proposed: usize,
    /// It proposed the full draft length.
    full: bool,
}

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
    /// A plain phase's measurement: each token's seconds.
    intervals: Vec<f64>,
    /// A speculative phase's measurement: its last rounds, at most `WINDOW` (fewer: the rounds
    /// measured so far).
    window: VecDeque<Round>,
    /// The last judgement: `Some(true)` when speculation lost even counting every proposed draft
    /// as accepted (the rounds' cost alone loses: no prompt can do better), `Some(false)` for a
    /// loss to the acceptance or a win, `None` before any.
    verdict: Option<bool>,
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
            intervals: Vec::with_capacity(FIRST_STRETCH),
            window: VecDeque::with_capacity(WINDOW),
            verdict: None,
            skip: true,
            stretch: FIRST_STRETCH,
            last: Instant::now(),
            fallbacks: 1,
        }
    }

    /// Starts with the longest plain stretch: an earlier sequence found speculation losing even
    /// at full acceptance with the same drafter and draft length (see [`Pace::structural_loss`]).
    pub fn after_structural_loss() -> Pace {
        Pace { phase: Phase::Plain { left: MAX_STRETCH }, stretch: MAX_STRETCH, verdict: Some(true), ..Pace::new() }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The last judgement (`None` before any): whether speculation lost even counting every
    /// proposed draft as accepted, with full-length drafts in every round judged. Such a loss is
    /// the rounds' cost (a draft model as deep as the target on a device where a step's cost is the
    /// host's), not the prompt's: a server's next sequence with the same settings starts plain.
    pub fn structural_loss(&self) -> Option<bool> {
        self.verdict
    }

    /// Whether plain decoding goes on after the token about to be handed out (asked before that
    /// token is read, so that the next step can be queued first).
    pub fn plain_continues(&self) -> bool {
        matches!(self.phase, Phase::Plain { left } if left > 1)
    }

    fn switch(&mut self, phase: Phase) {
        self.phase = phase;
        self.intervals.clear();
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
        self.plain_token_after(dt);
    }

    /// A plain token handed out `dt` seconds after the previous event (`None`: not measured).
    fn plain_token_after(&mut self, dt: Option<f64>) {
        let Phase::Plain { left } = self.phase else { return };
        if let Some(dt) = dt {
            self.intervals.push(dt);
        }
        if left > 1 {
            self.phase = Phase::Plain { left: left - 1 };
            return;
        }
        if !self.intervals.is_empty() {
            self.intervals.sort_by(f64::total_cmp);
            self.plain = Some(self.intervals[self.intervals.len() / 2]);
        }
        self.switch(Phase::Spec);
    }

    /// A speculative round handed out `tokens` tokens after proposing `proposed` drafts (prompt
    /// lookup may find none); `full`: as many as the draft length.
    pub fn round(&mut self, tokens: usize, proposed: usize, full: bool) {
        let dt = self.interval();
        self.round_after(dt, tokens, proposed, full);
    }

    /// A speculative round that handed out `tokens` tokens in `dt` seconds (`None`: not measured).
    fn round_after(&mut self, dt: Option<f64>, tokens: usize, proposed: usize, full: bool) {
        let Some(seconds) = dt else { return };
        if tokens == 0 {
            return;
        }
        if self.window.len() == WINDOW {
            self.window.pop_front();
        }
        self.window.push_back(Round { seconds, tokens, proposed, full });
        let rounds = self.window.len();
        let Some(plain) = self.plain else { return };
        let s: f64 = self.window.iter().map(|r| r.seconds).sum();
        let n: usize = self.window.iter().map(|r| r.tokens).sum();
        let ratio = s / n as f64 / plain;
        let all_rejected = self.window.iter().all(|r| r.proposed > 0 && r.tokens == 1);
        let lost = if ratio > HOPELESS && (rounds >= 2 || all_rejected) {
            Some(MAX_STRETCH)
        } else if ratio > CLEAR && rounds >= 2 {
            Some(4)
        } else if ratio > MARGIN && rounds >= PROBE_ROUNDS {
            Some(1)
        } else {
            None
        };
        if let Some(times) = lost {
            let best: usize = self.window.iter().map(|r| r.proposed + 1).sum();
            self.verdict = Some(self.window.iter().all(|r| r.full) && s / best as f64 / plain > MARGIN);
            let left = self.stretch.saturating_mul(times).min(MAX_STRETCH);
            self.stretch = (2 * left).min(MAX_STRETCH);
            self.fallbacks += 1;
            self.switch(Phase::Plain { left });
        } else if rounds == PROBE_ROUNDS {
            self.stretch = FIRST_STRETCH;
            self.verdict = Some(false);
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

    /// A plain phase whose measured tokens take `dt` seconds each (the first is never measured);
    /// the tokens it ran.
    fn plain_phase(p: &mut Pace, dt: f64) -> usize {
        let mut n = 0;
        while let Phase::Plain { .. } = p.phase() {
            p.plain_token_after((n > 0).then_some(dt));
            n += 1;
        }
        n
    }

    /// Speculative rounds of `tokens` tokens in `dt` seconds each (the first not measured) until the
    /// phase ends or `max` rounds ran; the rounds measured.
    fn spec_phase(p: &mut Pace, dt: f64, tokens: usize, max: usize) -> usize {
        p.round_after(None, tokens, 3, true);
        let mut n = 0;
        while p.phase() == Phase::Spec && n < max {
            p.round_after(Some(dt), tokens, 3, true);
            n += 1;
        }
        n
    }

    #[test]
    fn plain_speed_is_the_median_of_its_tokens() {
        let mut p = Pace::new();
        // The first measured plain token paid a one-time cost (a kernel compiled at first use).
        p.plain_token_after(None);
        p.plain_token_after(Some(0.5));
        while let Phase::Plain { .. } = p.phase() {
            p.plain_token_after(Some(0.005));
        }
        assert_eq!(p.plain, Some(0.005));
        // A speculation at 0.6x plain (one token per 8.3 ms) falls back, a hopeless loss after one
        // round; against the mean plain time (38 ms) it would have looked a win.
        assert_eq!(spec_phase(&mut p, 0.0083, 1, 50), 1);
        assert!(matches!(p.phase(), Phase::Plain { .. }));
    }

    #[test]
    fn a_close_loss_is_judged_after_a_few_rounds_and_doubles_the_stretch() {
        let mut p = Pace::new();
        assert_eq!(plain_phase(&mut p, 0.010), FIRST_STRETCH);
        // 1.1x plain per token: a close call.
        assert_eq!(spec_phase(&mut p, 0.033, 3, 50), PROBE_ROUNDS);
        assert_eq!(plain_phase(&mut p, 0.010), FIRST_STRETCH);
        assert_eq!(spec_phase(&mut p, 0.033, 3, 50), PROBE_ROUNDS);
        assert_eq!(plain_phase(&mut p, 0.010), 2 * FIRST_STRETCH);
        assert_eq!(p.fallbacks, 3);
    }

    #[test]
    fn a_clear_loss_is_judged_sooner_and_goes_plain_longer() {
        // 1.4x plain: judged after two rounds, the stretch run 4x, then doubled.
        let mut p = Pace::new();
        plain_phase(&mut p, 0.010);
        assert_eq!(spec_phase(&mut p, 0.028, 2, 50), 2);
        assert_eq!(plain_phase(&mut p, 0.010), 4 * FIRST_STRETCH);
        assert_eq!(spec_phase(&mut p, 0.028, 2, 50), 2);
        assert_eq!(plain_phase(&mut p, 0.010), MAX_STRETCH.min(32 * FIRST_STRETCH));
        // 3x plain (hopeless): the longest stretch at once, judged after one round where no draft was
        // accepted (one token a round), after two where drafts were (a first round may have paid
        // a one-time cost).
        for (tokens, rounds) in [(1, 1), (4, 2)] {
            let mut p = Pace::new();
            plain_phase(&mut p, 0.010);
            for _ in 0..3 {
                assert_eq!(spec_phase(&mut p, 0.030 * tokens as f64, tokens, 50), rounds, "{tokens} tokens a round");
                assert_eq!(plain_phase(&mut p, 0.010), MAX_STRETCH);
            }
        }
    }

    #[test]
    fn a_winning_speculation_stays_and_resets_the_stretch() {
        let mut p = Pace::new();
        plain_phase(&mut p, 0.010);
        assert_eq!(spec_phase(&mut p, 0.028, 2, 50), 2); // 1.4x: a clear loss
        assert_eq!(plain_phase(&mut p, 0.010), 4 * FIRST_STRETCH);
        // Now 3 tokens in 15 ms a round: 0.5x plain's time per token, for as long as it lasts.
        assert_eq!(spec_phase(&mut p, 0.015, 3, 50), 50);
        assert_eq!(p.phase(), Phase::Spec);
        assert_eq!(p.stretch, FIRST_STRETCH);
        assert_eq!(p.fallbacks, 2);
    }

    #[test]
    fn a_round_without_drafts_is_not_judged_alone() {
        // Prompt lookup found nothing: one slow round of one token is not a hopeless draft.
        let mut p = Pace::new();
        plain_phase(&mut p, 0.010);
        p.round_after(None, 1, 0, false);
        p.round_after(Some(0.030), 1, 0, false);
        assert_eq!(p.phase(), Phase::Spec);
        // A second such round is (3x plain over two rounds: the longest stretch).
        p.round_after(Some(0.030), 1, 0, false);
        assert_eq!(p.phase(), Phase::Plain { left: MAX_STRETCH });
    }

    #[test]
    fn a_loss_even_at_full_acceptance_is_structural() {
        // Rounds of 3 drafts (4 tokens at best) taking 60 ms against 10 ms a plain token: even with
        // every draft accepted 15 ms a token, whatever the prompt.
        let mut p = Pace::new();
        plain_phase(&mut p, 0.010);
        assert_eq!(p.structural_loss(), None);
        spec_phase(&mut p, 0.060, 4, 50);
        assert_eq!(p.structural_loss(), Some(true));
        // Rounds of 3 drafts taking 30 ms lose with one accepted (2 tokens a round) but would win
        // with all 4: the acceptance's loss, not the rounds'.
        let mut p = Pace::new();
        plain_phase(&mut p, 0.010);
        spec_phase(&mut p, 0.030, 2, 50);
        assert_eq!(p.structural_loss(), Some(false));
        // Short drafts (prompt lookup finding 1 of 3) say nothing of full-length ones.
        let mut p = Pace::new();
        plain_phase(&mut p, 0.010);
        p.round_after(None, 2, 1, false);
        p.round_after(Some(0.060), 2, 1, false);
        p.round_after(Some(0.060), 2, 1, false);
        assert!(matches!(p.phase(), Phase::Plain { .. }));
        assert_eq!(p.structural_loss(), Some(false));
        // A win clears it; a sequence after a structural loss starts with the longest plain stretch.
        let mut p = Pace::after_structural_loss();
        assert_eq!(plain_phase(&mut p, 0.010), MAX_STRETCH);
        assert_eq!(spec_phase(&mut p, 0.015, 3, PROBE_ROUNDS), PROBE_ROUNDS);
        assert_eq!(p.structural_loss(), Some(false));
    }
}
