//! Logits processors, as mlx-lm 0.32.2's `make_logits_processors`: logit bias, then the repetition, presence and frequency penalties over the token history.
//!
//! Each is the same MLX op sequence as mlx-lm's: `logits.at[:, ids].add(bias)` (a scatter-add),
//! `logits[:, t] = where(l < 0, l * p, l / p)` (gather, then scatter), `logits[:, t] -= p`, and
//! `logits.at[:, t].subtract(p)` (one subtraction per occurrence), with penalties as weak Python
//! scalars (in the logits' dtype). The history is every prompt token then every sampled one, of
//! which each penalty looks at the last `context_size` (0: all of it, as Python's `tokens[-0:]`).
use crate::error::{EngineError, Result};
use mlx::{ops, Array, Dtype};

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LogitsProcessors {
    /// (token id, additive bias), each id at most once.
    pub logit_bias: Vec<(u32, f64)>,
    /// Sign-aware multiplicative penalty; `None` or 0: off.
    pub repetition_penalty: Option<f64>,
    pub repetition_context_size: usize,
    /// Subtracted once from every token of the context; `None` or 0: off.
    pub presence_penalty: Option<f64>,
    pub presence_context_size: usize,
    /// Subtracted once per occurrence in the context; `None` or 0: off.
    pub frequency_penalty: Option<f64>,
    pub frequency_context_size: usize,
}

impl Default for LogitsProcessors {
    fn default() -> Self {
        LogitsProcessors {
            logit_bias: Vec::new(),
            repetition_penalty: None,
            repetition_context_size: 20,
            presence_penalty: None,
            presence_context_size: 20,
            frequency_penalty: None,
            frequency_context_size: 20,
        }
    }
}

fn on(p: Option<f64>) -> Option<f64> {
    p.filter(|&p| p != 0.0)
}

impl LogitsProcessors {
    /// True when no processor is active (mlx-lm then keeps no token history).
    pub fn is_empty(&self) -> bool {
        self.logit_bias.is_empty() && self.penalties().next().is_none()
    }

    /// The active penalties as (kind, value, context size), in mlx-lm's order.
    fn penalties(&self) -> impl Iterator<Item = (Penalty, f64, usize)> {
        [
            (Penalty::Repetition, self.repetition_penalty, self.repetition_context_size),
            (Penalty::Presence, self.presence_penalty, self.presence_context_size),
            (Penalty::Frequency, self.frequency_penalty, self.frequency_context_size),
        ]
        .into_iter()
        .filter_map(|(k, p, c)| on(p).map(|p| (k, p, c)))
    }

    /// How many of the latest history tokens the penalties read; `None`: all of them (a context
    /// size of 0); `Some(0)`: none (no penalty).
    pub fn history_needed(&self) -> Option<usize> {
        let mut need = 0;
        for (_, _, c) in self.penalties() {
            if c == 0 {
                return None;
            }
            need = need.max(c);
        }
        Some(need)
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::Invalid(m));
        for (name, p) in [
            ("repetition_penalty", self.repetition_penalty),
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if let Some(p) = p {
                if !p.is_finite() {
                    return bad(format!("{name} must be a finite number, got {p}"));
                }
            }
        }
        if let Some(p) = self.repetition_penalty {
            if p < 0.0 {
                return bad(format!("repetition_penalty must be >= 0 (0 turns it off), got {p}"));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for &(id, b) in &self.logit_bias {
            if b.is_nan() {
                return bad(format!("logit bias of token {id} is not a number"));
            }
            if !seen.insert(id) {
                return bad(format!("logit bias for token {id} is given twice"));
            }
        }
        Ok(())
    }

    /// Token ids must lie in the vocabulary.
    pub fn validate_vocab(&self, vocab: i32) -> Result<()> {
        match self.logit_bias.iter().find(|(id, _)| i64::from(*id) >= i64::from(vocab)) {
            Some((id, _)) => Err(EngineError::Invalid(format!(
                "logit bias token id {id} is outside the vocabulary (ids 0..{})",
                vocab - 1
            ))),
            None => Ok(()),
        }
    }

    /// Applies every active processor to `logits` (1, vocab), in mlx-lm's order; `history` (n,)
    /// holds at least the last [`Self::history_needed`] tokens.
    pub fn apply(&self, history: Option<&Array>, logits: &Array) -> Result<Array> {
        let mut logits = logits.clone();
        if !self.logit_bias.is_empty() {
            let ids: Vec<i32> = self.logit_bias.iter().map(|&(id, _)| id as i32).collect();
            // mx.array(list of Python floats): float32, cast to the logits' dtype by the scatter.
            let values: Vec<f32> = self.logit_bias.iter().map(|&(_, b)| b as f32).collect();
            let n = ids.len() as i32;
            let idx = Array::from_slice(&ids, &[1, n])?;
            let values = Array::from_slice(&values, &[1, n])?.astype(logits.dtype())?;
            logits = logits.scatter_add_axis(&idx, &values, -1)?;
        }
        let Some(history) = history else { return Ok(logits) };
        let len = history.dim(0);
        if len == 0 {
            return Ok(logits);
        }
        for (kind, p, context) in self.penalties() {
            let t = if context == 0 || context as i64 >= i64::from(len) {
                history.clone()
            } else {
                history.slice_axis(0, len - context as i32, len)?
            };
            let idx = t.reshape(&[1, -1])?;
            logits = match kind {
                Penalty::Repetition => {
                    let sel = logits.take_along_axis(&idx, -1)?;
                    let sel = ops::where_(&sel.lt_scalar(0.0)?, &sel.mul_scalar(p)?, &sel.div_scalar(p)?)?;
                    logits.put_along_axis(&idx, &sel, -1)?
                }
                Penalty::Presence => {
                    let sel = logits.take_along_axis(&idx, -1)?.sub_scalar(p)?;
                    logits.put_along_axis(&idx, &sel, -1)?
                }
                Penalty::Frequency => {
                    // negative(updates): -p in the logits' dtype, added once per occurrence.
                    let updates = ops::full(&idx.shape(), -p, logits.dtype())?;
                    logits.scatter_add_axis(&idx, &updates, -1)?
                }
            };
        }
        Ok(logits)
    }
}

/// Appends `input` (any integer dtype) to `history`, keeping only the last `keep` tokens
/// (`None`: all). Lazy: no evaluation.
pub fn extend_history(history: Option<Array>, input: &Array, keep: Option<usize>) -> Result<Array> {
    let input = input.reshape(&[-1])?.astype(Dtype::I32)?;
    let all = match history {
        Some(h) => ops::concatenate(&[&h, &input], 0)?,
        None => input,
    };
    let len = all.dim(0);
    match keep {
        Some(k) if (k as i64) < i64::from(len) => Ok(all.slice_axis(0, len - k as i32, len)?),
        _ => Ok(all),
    }
}

#[derive(Clone, Copy, Debug)]
enum Penalty {
    Repetition,
    Presence,
    Frequency,
}
