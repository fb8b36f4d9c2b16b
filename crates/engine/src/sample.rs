//! Token samplers, as mlx-lm's `sample_utils.make_sampler`: greedy at temperature 0, otherwise the
//! filters top-p, min-p, top-k over the untempered log-probabilities (in that order), then a
//! categorical draw from `logprobs * (1 / temp)` that splits MLX's global random key.
use crate::error::{EngineError, Result};
use mlx::{ops, random, Array};

#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    pub temp: f64,
    pub top_p: f64,
    pub min_p: f64,
    pub min_tokens_to_keep: i32,
    pub top_k: i32,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig { temp: 0.0, top_p: 0.0, min_p: 0.0, min_tokens_to_keep: 1, top_k: 0 }
    }
}

impl SamplerConfig {
    /// Rejects values mlx-lm would reject (or silently misuse).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::Invalid(m));
        if !self.temp.is_finite() || self.temp < 0.0 {
            return bad(format!("temperature must be a number >= 0, got {}", self.temp));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return bad(format!("top_p must be in [0, 1] (0 or 1 turn it off), got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if self.min_tokens_to_keep < 1 {
            return bad(format!("min_tokens_to_keep must be >= 1, got {}", self.min_tokens_to_keep));
        }
        if self.top_k < 0 {
            return bad(format!("top_k must be >= 0 (0 turns it off), got {}", self.top_k));
        }
        Ok(())
    }

    /// logprobs (1, vocab) -> token (1,)
    pub fn sample(&self, logprobs: &Array) -> Result<Array> {
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
        if self.top_k > 0 {
            lp = apply_top_k(&lp, self.top_k)?;
        }
        Ok(random::categorical(&lp.mul_scalar(1.0 / self.temp)?, -1)?)
    }
}

fn neg_inf_like(x: &Array) -> Result<Array> {
    Ok(Array::scalar(f64::NEG_INFINITY, x.dtype())?)
}

fn apply_top_p(logprobs: &Array, top_p: f64) -> Result<Array> {
    let sorted = logprobs.sort(-1)?;
    let sorted_probs = sorted.astype(mlx::Dtype::F32)?.exp()?;
    let mass_above = sorted_probs.cumsum(-1, true, false)?;
    let total = mass_above.slice_axis(-1, 0, 1)?.add(&sorted_probs.slice_axis(-1, 0, 1)?)?;
    let num_dropped = mass_above.ge(&total.mul_scalar(top_p)?)?.sum(&[-1], true)?;
    let threshold = sorted.take_along_axis(&num_dropped, -1)?;
    Ok(ops::where_(&logprobs.lt(&threshold)?, &neg_inf_like(logprobs)?, logprobs)?)
}

fn apply_min_p(logprobs: &Array, min_p: f64, min_tokens_to_keep: i32) -> Result<Array> {
    let top = logprobs.max(&[-1], true)?;
    let scaled_min_p = top.add_scalar(min_p.ln())?;
    let mut remove = logprobs.lt(&scaled_min_p)?;
    if min_tokens_to_keep > 1 {
        let k = min_tokens_to_keep;
        let top_idx = logprobs.argpartition(-k, -1)?.slice_axis(-1, -k, i32::MAX)?;
        remove = remove.put_along_axis(&top_idx, &Array::scalar(0.0, mlx::Dtype::Bool)?, -1)?;
    }
    Ok(ops::where_(&remove, &neg_inf_like(logprobs)?, logprobs)?)
}

fn apply_top_k(logprobs: &Array, top_k: i32) -> Result<Array> {
    let vocab = logprobs.dim(-1);
    if top_k >= vocab {
        return Err(EngineError::Invalid(format!("top_k must be below the vocabulary size {vocab}, got {top_k}")));
    }
    let mask_idx = logprobs.neg()?.argpartition(top_k - 1, -1)?.slice_axis(-1, top_k, i32::MAX)?;
    Ok(logprobs.put_along_axis(&mask_idx, &neg_inf_like(logprobs)?, -1)?)
}
