//! Sampling a batch of sequences at once, each with its own settings, as one graph: the
//! log-softmax, greedy rows' argmax, and the top-p and min-p filters and the temperature with
//! per-row values as (B, 1) arrays, computed for every row together (one sort of the batch, not one
//! per row); then one categorical draw per sampled row from its own key stream (each sequence
//! draws as it would alone, as mlx-lm's per-request samplers). A row whose chain the batch cannot
//! share (logits processors over its own history, top-k, XTC, `min_tokens_to_keep` > 1) runs
//! [`SamplerConfig::process_and_sample_masked`] on its own row, as before.
use super::{apply_min_p_rows, apply_top_p_rows, constraint, SamplerConfig};
use crate::error::Result;
use mlx::random::{self, KeySeq};
use mlx::{ops, Array, Dtype};

/// One row of [`sample_rows`].
pub struct RowSampling<'a> {
    pub sampler: &'a SamplerConfig,
    /// The tokens its logits processors read.
    pub history: Option<&'a Array>,
    /// Its own random stream; `None` draws from MLX's global key.
    pub keys: Option<&'a mut KeySeq>,
    /// Constrained decoding: the tokens it may take (vocab flags packed in words, see
    /// `constraint::pack_bits`).
    pub allowed: Option<&'a [u32]>,
}

impl RowSampling<'_> {
    /// Whether the batch's shared chain samples this row (else it runs its own).
    fn shared(&self) -> bool {
        let s = self.sampler;
        s.processors.is_empty() && (s.is_greedy() || (s.xtc_probability <= 0.0 && s.top_k <= 0 && s.min_tokens_to_keep == 1))
    }
}

/// The rows' tokens and log-probabilities.
pub struct Sampled {
    pub tokens: Array, // (B,)
    /// (B, vocab) of the shared chain.
    logprobs: Array,
    /// A row that ran its own chain: its (1, vocab).
    own: Vec<Option<Array>>,
}

impl Sampled {
    /// Row `i`'s log-probabilities (vocab,).
    pub fn row_logprobs(&self, i: usize) -> Result<Array> {
        let row = match &self.own[i] {
            Some(lp) => lp.clone(),
            None => self.logprobs.slice_axis(0, i as i32, i as i32 + 1)?,
        };
        Ok(row.squeeze(&[0])?)
    }
}

/// logits (B, vocab) -> each row's token and log-probabilities, by its own settings.
pub fn sample_rows(rows: &mut [RowSampling<'_>], logits: &Array) -> Result<Sampled> {
    let b = rows.len();
    let vocab = logits.dim(-1);
    let shared_logits = match rows.iter().any(|r| r.allowed.is_some()) {
        true => {
            let all = vec![u32::MAX; constraint::mask_words(vocab as usize)];
            constraint::apply_mask_bits(logits, &rows.iter().flat_map(|r| r.allowed.unwrap_or(&all).iter().copied()).collect::<Vec<_>>())?
        }
        false => logits.clone(),
    };
    let logprobs = shared_logits.sub(&shared_logits.logsumexp(&[-1], true)?)?; // (B, vocab)
    let own = vec![None; b];
    if rows.iter().all(|r| r.sampler.is_greedy() && r.shared()) {
        return Ok(Sampled { tokens: logprobs.argmax(-1, false)?, logprobs, own });
    }
    let mut sampled = Sampled { tokens: logprobs.argmax(-1, false)?, logprobs, own };
    let shared_sampled: Vec<bool> = rows.iter().map(|r| r.shared() && !r.sampler.is_greedy()).collect();
    let scaled = shared_filters(rows, &sampled.logprobs, &shared_sampled)?;
    let mut tokens = Vec::with_capacity(b);
    for (i, row) in rows.iter_mut().enumerate() {
        let one = |a: &Array| a.slice_axis(0, i as i32, i as i32 + 1);
        tokens.push(if !row.shared() {
            let (t, lp) = row.sampler.process_and_sample_masked(&one(logits)?, row.history, row.keys.as_deref_mut(), row.allowed)?;
            sampled.own[i] = Some(lp);
            t
        } else if row.sampler.is_greedy() {
            one(&sampled.tokens)?
        } else {
            let scaled = one(scaled.as_ref().expect("sampled rows have scaled log-probabilities"))?;
            match row.keys.as_deref_mut() {
                Some(k) => random::categorical_with_key(&scaled, -1, &k.next_key()?)?,
                None => random::categorical(&scaled, -1)?,
            }
        });
    }
    sampled.tokens = ops::concatenate(&tokens.iter().collect::<Vec<_>>(), 0)?;
    Ok(sampled)
}

/// The shared chain's filtered log-probabilities times each row's 1 / temperature (B, vocab), for
/// the rows `sampled` marks (`None` when there is none): top-p, then min-p, each with per-row
/// values and kept only on the rows that ask for it, as [`SamplerConfig::sample_keyed`] does row
/// by row.
fn shared_filters(rows: &[RowSampling<'_>], logprobs: &Array, sampled: &[bool]) -> Result<Option<Array>> {
    if !sampled.iter().any(|&s| s) {
        return Ok(None);
    }
    let b = rows.len() as i32;
    let column = |values: Vec<f32>, dtype: Dtype| -> Result<Array> { Ok(Array::from_slice(&values, &[b, 1])?.astype(dtype)?) };
    let flags = |on: &[bool]| -> Result<Array> { Ok(Array::from_slice(&on.iter().map(|&o| u8::from(o)).collect::<Vec<_>>(), &[b, 1])?.astype(Dtype::Bool)?) };
    let mut lp = logprobs.clone();
    let top_p: Vec<bool> = rows.iter().zip(sampled).map(|(r, &s)| s && 0.0 < r.sampler.top_p && r.sampler.top_p < 1.0).collect();
    if top_p.iter().any(|&t| t) {
        let p = column(rows.iter().map(|r| r.sampler.top_p as f32).collect(), Dtype::F32)?;
        lp = ops::where_(&flags(&top_p)?, &apply_top_p_rows(&lp, &p)?, &lp)?;
    }
    let min_p: Vec<bool> = rows.iter().zip(sampled).map(|(r, &s)| s && r.sampler.min_p != 0.0).collect();
    if min_p.iter().any(|&m| m) {
        let ln = column(rows.iter().map(|r| if r.sampler.min_p > 0.0 { r.sampler.min_p.ln() as f32 } else { 0.0 }).collect(), lp.dtype())?;
        lp = ops::where_(&flags(&min_p)?, &apply_min_p_rows(&lp, &ln, 1)?, &lp)?;
    }
    let inv_temp = column(rows.iter().map(|r| if r.sampler.temp > 0.0 { (1.0 / r.sampler.temp) as f32 } else { 1.0 }).collect(), lp.dtype())?;
    Ok(Some(lp.mul(&inv_temp)?))
}
