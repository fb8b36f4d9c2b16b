//! Log-probabilities to report: the chosen token's and the top-k alternatives, read from the (vocab,) vector a generation step returns.
use crate::error::{EngineError, Result};
use mlx::{Array, Dtype};

/// One generated token's log-probability and the `k` most likely tokens of that step.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// (id, logprob), most likely first; equal log-probabilities by increasing id.
    pub top: Vec<(u32, f32)>,
}

/// The log-probability of `token` in `logprobs` (vocab,) and the `top_k` largest entries.
/// A few small device ops on the already evaluated vector; nothing of vocabulary size is copied
/// to the host.
pub fn token_logprobs(logprobs: &Array, token: u32, top_k: usize) -> Result<TokenLogprobs> {
    let vocab = logprobs.dim(-1);
    if i64::from(token) >= i64::from(vocab) {
        return Err(EngineError::Invalid(format!("token {token} is outside the vocabulary of {vocab}")));
    }
    let lp = logprobs.reshape(&[-1])?;
    let t = token as i32;
    let chosen = lp.slice_axis(0, t, t + 1)?.astype(Dtype::F32)?;
    let mut top = Vec::new();
    if top_k > 0 {
        let k = (top_k as i32).min(vocab);
        let idx = lp.neg()?.argpartition(k - 1, 0)?.slice_axis(0, 0, k)?;
        let vals = lp.take(&idx, 0)?.astype(Dtype::F32)?;
        let idx = idx.astype(Dtype::U32)?;
        mlx::eval(&[&chosen, &idx, &vals])?;
        let ids: Vec<u32> = idx.to_vec()?;
        let vals: Vec<f32> = vals.to_vec()?;
        top = ids.into_iter().zip(vals).collect();
        top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    }
    Ok(TokenLogprobs { token, logprob: chosen.item::<f32>()?, top })
}
