//! Token samplers, as mlx-lm 0.32.2's `sample_utils.make_sampler`: greedy at temperature 0, else top-p, min-p, XTC, top-k (in that order) over the log-probabilities, then a categorical draw.
//!
//! Every filter is the same MLX op sequence as mlx-lm's (`@mx.compile`d there; on CPU the compiled
//! and uncompiled graphs give identical bits, checked in Python), with Python's weak scalar typing,
//! and the random draws (XTC's `uniform`, then `categorical`) split MLX's global key in the same
//! order, so one seed gives the same tokens. The logits processors live in [`processors`].
pub mod constraint;
pub mod logprobs;
pub mod processors;
pub mod rows;
pub mod seed;

use crate::error::{EngineError, Result};
use mlx::{ops, random, Array, Dtype};

pub use constraint::TokenConstraint;
pub use logprobs::{token_logprobs, TokenLogprobs};
pub use mlx::random::KeySeq;
pub use processors::LogitsProcessors;
pub use seed::{init_random_draws, key_seq_as_mlx_lm, seed_as_mlx_lm, xtc_special_tokens};

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplerConfig {
    /// 0: greedy (argmax).
    pub temp: f64,
    /// Nucleus mass; applied when 0 < top_p < 1.
    pub top_p: f64,
    /// Applied when != 0.
    pub min_p: f64,
    /// Tokens min-p never removes (>= 1).
    pub min_tokens_to_keep: i32,
    /// Applied when > 0.
    pub top_k: i32,
    /// XTC ("exclude top choices") is applied when > 0, with this probability per token.
    pub xtc_probability: f64,
    /// XTC removes every token above this probability but the least likely of them; in [0, 0.5].
    pub xtc_threshold: f64,
    /// Tokens XTC never removes; mlx_lm.generate uses `encode("\n") + eos_token_ids`
    /// ([`xtc_special_tokens`]).
    pub xtc_special_tokens: Vec<u32>,
    /// Logit bias and penalties, applied to the logits before the log-softmax (mlx-lm's
    /// `make_logits_processors`).
    pub processors: LogitsProcessors,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temp: 0.0,
            top_p: 0.0,
            min_p: 0.0,
            min_tokens_to_keep: 1,
            top_k: 0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            xtc_special_tokens: Vec::new(),
            processors: LogitsProcessors::default(),
        }
    }
}

fn invalid<T>(m: String) -> Result<T> {
    Err(EngineError::Invalid(m))
}

impl SamplerConfig {
    /// Rejects values mlx-lm would reject (or silently misuse).
    pub fn validate(&self) -> Result<()> {
        if !self.temp.is_finite() || self.temp < 0.0 {
            return invalid(format!("temperature must be a number >= 0, got {}", self.temp));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return invalid(format!("top_p must be in [0, 1] (0 or 1 turn it off), got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return invalid(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if self.min_tokens_to_keep < 1 {
            return invalid(format!("min_tokens_to_keep must be >= 1, got {}", self.min_tokens_to_keep));
        }
        if self.top_k < 0 {
            return invalid(format!("top_k must be >= 0 (0 turns it off), got {}", self.top_k));
        }
        if !(0.0..=1.0).contains(&self.xtc_probability) {
            return invalid(format!("xtc_probability must be in [0, 1] (0 turns it off), got {}", self.xtc_probability));
        }
        if !(0.0..=0.5).contains(&self.xtc_threshold) {
            return invalid(format!("xtc_threshold must be in [0, 0.5], got {}", self.xtc_threshold));
        }
        self.processors.validate()
    }

    /// Checks the settings that depend on the vocabulary size (top-k, token ids).
    pub fn validate_vocab(&self, vocab: i32) -> Result<()> {
        if self.temp != 0.0 && self.top_k > 0 && self.top_k >= vocab {
            return invalid(format!("top_k must be below the vocabulary size {vocab}, got {}", self.top_k));
        }
        self.processors.validate_vocab(vocab)
    }

    /// Whether sampling is the argmax (no random draws).
    pub fn is_greedy(&self) -> bool {
        self.temp == 0.0
    }

    /// The sampling chain every generator runs on a step's logits, as mlx-lm's `_step` and
    /// `_process_and_sample`: the logits processors (over the token `history`), the log-softmax,
    /// then the sampler, drawing from `keys` (else MLX's global key). logits (N, vocab) -> tokens
    /// (N,) and log-probabilities (N, vocab). One row's log-softmax reduces over the whole array,
    /// as `generate_step` writes it; several rows reduce over the last axis.
    pub fn process_and_sample(&self, logits: &Array, history: Option<&Array>, keys: Option<&mut random::KeySeq>) -> Result<(Array, Array)> {
        self.process_and_sample_masked(logits, history, keys, None)
    }

    /// [`Self::process_and_sample`] with constrained decoding's token mask (see [`constraint`]):
    /// every token `allowed` (N rows of vocab flags packed as `constraint::pack_bits` packs them,
    /// row after row) does not name is set to -inf after the logits processors, before the
    /// log-softmax.
    pub fn process_and_sample_masked(
        &self,
        logits: &Array,
        history: Option<&Array>,
        keys: Option<&mut random::KeySeq>,
        allowed: Option<&[u32]>,
    ) -> Result<(Array, Array)> {
        let logits = if self.processors.is_empty() { logits.clone() } else { self.processors.apply(history, logits)? };
        let logits = match allowed {
            Some(allowed) => constraint::apply_mask_bits(&logits, allowed)?,
            None => logits,
        };
        let axes: &[i32] = if logits.dim(0) == 1 { &[] } else { &[-1] };
        let logprobs = logits.sub(&logits.logsumexp(axes, true)?)?;
        let token = self.sample_keyed(&logprobs, keys)?;
        Ok((token, logprobs))
    }

    /// logprobs (1, vocab) -> token (1,), drawing from MLX's global key.
    pub fn sample(&self, logprobs: &Array) -> Result<Array> {
        self.sample_keyed(logprobs, None)
    }

    /// [`Self::sample`] drawing from `keys` when given (one request's own stream, so that requests
    /// batched together each draw as they would alone), else from MLX's global key.
    pub fn sample_keyed(&self, logprobs: &Array, mut keys: Option<&mut random::KeySeq>) -> Result<Array> {
        if self.temp == 0.0 {
            return Ok(logprobs.argmax(-1, false)?);
        }
        let mut lp = logprobs.clone();
        if 0.0 < self.top_p && self.top_p < 1.0 {
            lp = apply_top_p(&lp, self.top_p)?;
        }
        if self.min_p != 0.0 {
            lp = apply_min_p(&lp, self.min_p, self.min_tokens_to_keep)?;
        }
        if self.xtc_probability > 0.0 {
            let key = keys.as_deref_mut().map(random::KeySeq::next_key).transpose()?;
            lp = apply_xtc_keyed(&lp, self.xtc_probability, self.xtc_threshold, &self.xtc_special_tokens, key.as_ref())?;
        }
        if self.top_k > 0 {
            lp = apply_top_k(&lp, self.top_k)?;
        }
        let scaled = lp.mul_scalar(1.0 / self.temp)?;
        Ok(match keys {
            Some(k) => random::categorical_with_key(&scaled, -1, &k.next_key()?)?,
            None => random::categorical(&scaled, -1)?,
        })
    }
}

fn neg_inf_like(x: &Array) -> Result<Array> {
    Ok(Array::scalar(f64::NEG_INFINITY, x.dtype())?)
}

/// `apply_top_p`: drops the least likely tokens whose total mass stays below 1 - top_p.
pub fn apply_top_p(logprobs: &Array, top_p: f64) -> Result<Array> {
    apply_top_p_rows(logprobs, &Array::scalar(top_p, Dtype::F32)?)
}

/// [`apply_top_p`] with a float32 `top_p` per row ((B, 1), or a scalar for all).
pub fn apply_top_p_rows(logprobs: &Array, top_p: &Array) -> Result<Array> {
    let sorted = logprobs.sort(-1)?;
    let sorted_probs = sorted.astype(Dtype::F32)?.exp()?;
    let mass_above = sorted_probs.cumsum(-1, true, false)?;
    let total = mass_above.slice_axis(-1, 0, 1)?.add(&sorted_probs.slice_axis(-1, 0, 1)?)?;
    let num_dropped = mass_above.ge(&total.mul(top_p)?)?.sum(&[-1], true)?;
    let threshold = sorted.take_along_axis(&num_dropped, -1)?;
    Ok(ops::where_(&logprobs.lt(&threshold)?, &neg_inf_like(logprobs)?, logprobs)?)
}

/// `apply_min_p`: drops tokens less likely than `min_p` times the top one, keeping at least
/// `min_tokens_to_keep`.
pub fn apply_min_p(logprobs: &Array, min_p: f64, min_tokens_to_keep: i32) -> Result<Array> {
    apply_min_p_rows(logprobs, &Array::scalar(min_p.ln(), logprobs.dtype())?, min_tokens_to_keep)
}

/// [`apply_min_p`] with `ln(min_p)` per row ((B, 1) in the log-probabilities' dtype, or a scalar).
pub fn apply_min_p_rows(logprobs: &Array, ln_min_p: &Array, min_tokens_to_keep: i32) -> Result<Array> {
    let top = logprobs.max(&[-1], true)?;
    let scaled_min_p = top.add(ln_min_p)?;
    let mut remove = logprobs.lt(&scaled_min_p)?;
    if min_tokens_to_keep > 1 {
        let k = min_tokens_to_keep;
        let top_idx = logprobs.argpartition(-k, -1)?.slice_axis(-1, -k, i32::MAX)?;
        remove = remove.put_along_axis(&top_idx, &Array::scalar(0.0, Dtype::Bool)?, -1)?;
    }
    Ok(ops::where_(&remove, &neg_inf_like(logprobs)?, logprobs)?)
}

/// `apply_xtc`: with probability `probability` (one uniform draw), removes every token above
/// `threshold` but the least likely of them; `special` tokens are never removed.
pub fn apply_xtc(logits: &Array, probability: f64, threshold: f64, special: &[u32]) -> Result<Array> {
    apply_xtc_keyed(logits, probability, threshold, special, None)
}

/// [`apply_xtc`] with its draw made with `key` (else from MLX's global key).
fn apply_xtc_keyed(logits: &Array, probability: f64, threshold: f64, special: &[u32], key: Option<&Array>) -> Result<Array> {
    let probs = logits.softmax(&[-1], false)?;
    let inf = Array::scalar(f64::INFINITY, probs.dtype())?;
    let above = ops::where_(&probs.gt_scalar(threshold)?, &probs, &inf)?;
    let mut mask = probs.gt(&above.min(&[-1], true)?)?;
    if special.iter().any(|&t| (t as i64) < i64::from(logits.dim(-1))) {
        // Ids outside the vocabulary (undefined behaviour in mlx-lm's scatter) are skipped.
        let vocab = logits.dim(-1);
        let ids: Vec<i32> = special.iter().map(|&t| t as i32).filter(|&t| t >= 0 && t < vocab).collect();
        let rows = logits.dim(0);
        let idx = Array::from_slice(&ids.repeat(rows as usize), &[rows, ids.len() as i32])?;
        mask = mask.put_along_axis(&idx, &Array::scalar(0.0, Dtype::Bool)?, -1)?;
    }
    let draw = match key {
        Some(k) => random::uniform_with_key(&[], Dtype::F32, k)?,
        None => random::uniform(&[], Dtype::F32)?,
    };
    let removed = ops::where_(&mask, &neg_inf_like(logits)?, logits)?;
    Ok(ops::where_(&draw.gt_scalar(probability)?, logits, &removed)?)
}

/// `apply_top_k`: keeps the `top_k` most likely tokens.
pub fn apply_top_k(logprobs: &Array, top_k: i32) -> Result<Array> {
    let vocab = logprobs.dim(-1);
    if top_k >= vocab {
        return invalid(format!("top_k must be below the vocabulary size {vocab}, got {top_k}"));
    }
    let mask_idx = logprobs.neg()?.argpartition(top_k - 1, -1)?.slice_axis(-1, top_k, i32::MAX)?;
    Ok(logprobs.put_along_axis(&mask_idx, &neg_inf_like(logprobs)?, -1)?)
}
