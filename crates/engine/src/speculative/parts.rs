//! The pieces of a speculative round that are not the generator itself: the logits processors'
//! token history, mlx-lm's `_step` (one forward pass, the last positions sampled), rewinding the
//! caches after a rejection (a trim, or layers that cannot be trimmed back put back and the kept tokens run again),
//! and prompt lookup's n-gram match.
use crate::cache::{maybe_quantize_kv_cache, trim_prompt_cache, KvCache};
use crate::error::{EngineError, Result};
use crate::generate::GenerateConfig;
use crate::models::Model;
use mlx::random::KeySeq;
use mlx::{ops, Array, Dtype};

/// The logits processors' token history, mlx-lm's `prev_tokens`: a lazy int32 array, kept only
/// when a penalty reads it, cut at the front to what the penalties read at the end of a round.
pub(super) struct History {
    pub(super) tokens: Option<Array>,
    pub(super) track: bool,
    pub(super) keep: Option<usize>,
}

impl History {
    pub(super) fn push(&mut self, t: &Array) -> Result<()> {
        if !self.track {
            return Ok(());
        }
        let t = t.reshape(&[-1])?.astype(Dtype::I32)?;
        self.tokens = Some(match self.tokens.take() {
            Some(h) => ops::concatenate(&[&h, &t], 0)?,
            None => t,
        });
        Ok(())
    }

    /// `prev_tokens[: size - n]` (`[:-n]` for n > 0).
    pub(super) fn drop_last(&mut self, n: usize) -> Result<()> {
        if let (Some(h), true) = (&self.tokens, n > 0) {
            let len = h.dim(0);
            let end = (i64::from(len) - n as i64).max(0) as i32;
            self.tokens = Some(h.slice_axis(0, 0, end)?);
        }
        Ok(())
    }

    /// Forgets what no penalty will read again (every later trim removes only newer tokens).
    pub(super) fn cut_front(&mut self) -> Result<()> {
        if let (Some(h), Some(k)) = (&self.tokens, self.keep) {
            let len = h.dim(0);
            if (k as i64) < i64::from(len) {
                self.tokens = Some(h.slice_axis(0, len - k as i32, len)?);
            }
        }
        Ok(())
    }
}

/// mlx-lm's `_step`: one forward pass over `input` (L,), then the last `n_predict` positions are
/// processed and sampled: tokens (n_predict,) and log-probabilities (n_predict, vocab), drawing
/// from `keys` when given (a sequence's own random stream) or else MLX's global key. With
/// `padded`, the input's first `len - padded` positions are its own and the rest padding (causal
/// attention keeps them out of the real positions; the caller trims them from the cache).
pub(super) fn step(
    model: &dyn Model,
    cache: &mut [Box<dyn KvCache>],
    input: &Array,
    n_predict: i32,
    config: &GenerateConfig,
    history: &mut History,
    keys: Option<&mut KeySeq>,
) -> Result<(Array, Array)> {
    step_padded(model, cache, input, 0, n_predict, config, history, None, keys)
}

/// [`step`] over an input whose last `padded` positions are padding, with constrained decoding's
/// masks (`n_predict` rows of vocab flags, packed: `constraint::pack_bits`) applied to the sampled
/// positions.
#[allow(clippy::too_many_arguments)]
pub(super) fn step_padded(
    model: &dyn Model,
    cache: &mut [Box<dyn KvCache>],
    input: &Array,
    padded: i32,
    n_predict: i32,
    config: &GenerateConfig,
    history: &mut History,
    masks: Option<&[u32]>,
    mut keys: Option<&mut KeySeq>,
) -> Result<(Array, Array)> {
    let full = input.dim(0);
    let logits = model.forward(&input.reshape(&[1, full])?, cache)?; // (1, L, vocab)
    let (len, input) = (full - padded, &input.slice_axis(0, 0, full - padded)?);
    let logits = logits.slice_axis(1, len - n_predict, len)?; // (1, n_predict, vocab)
    maybe_quantize_kv_cache(cache, config.kv_quant.as_ref())?;
    let sampler = &config.sampler;
    if sampler.processors.is_empty() {
        // All positions in one sampler call (one random draw for all of them).
        return sampler.process_and_sample_masked(&logits.squeeze(&[0])?, None, keys, masks);
    }
    let per_row = crate::sample::constraint::mask_words(logits.dim(-1) as usize);
    let mut y = input.slice_axis(0, 0, len - (n_predict - 1))?;
    let (mut ys, mut lps) = (Vec::new(), Vec::new());
    for i in 0..n_predict {
        history.push(&y)?;
        let row = logits.slice_axis(1, i, i + 1)?.squeeze(&[1])?; // (1, vocab)
        let mask = masks.map(|m| &m[i as usize * per_row..(i as usize + 1) * per_row]);
        let (t, lp) = sampler.process_and_sample_masked(&row, history.tokens.as_ref(), keys.as_deref_mut(), mask)?;
        ys.push(t.clone());
        lps.push(lp);
        y = t;
    }
    let ys: Vec<&Array> = ys.iter().collect();
    let lps: Vec<&Array> = lps.iter().collect();
    Ok((ops::concatenate(&ys, 0)?, ops::concatenate(&lps, 0)?))
}

/// Layer caches to put back after a forward pass that may be rejected in part, one per layer
/// (`None` for a layer a trim rewinds), or `None` when every layer trims.
pub(super) type Checkpoint = Option<Vec<Option<Box<dyn KvCache>>>>;

/// The [`Checkpoint`] of `cache` before a forward pass of up to `upcoming` positions: the
/// recurrent states and the rotating windows that will have wrapped.
pub(super) fn checkpoint(cache: &[Box<dyn KvCache>], upcoming: usize) -> Checkpoint {
    let layers: Vec<_> = cache.iter().map(|c| c.checkpoint(upcoming as i32)).collect();
    layers.iter().any(Option::is_some).then_some(layers)
}

/// Whether a layer cache keeps a rotating window (itself or a part of its cache list): it trims
/// only until it wraps.
fn windowed(c: &dyn KvCache) -> bool {
    c.window().is_some() || c.parts().is_some_and(|parts| parts.iter().any(|p| windowed(p.as_ref())))
}

/// Whether every layer of `cache` rewinds by a trim at any length (padded verification and
/// pipelined rounds rewind that way): no recurrent state, no rotating window.
pub(super) fn trims_only(cache: &[Box<dyn KvCache>]) -> bool {
    cache.iter().all(|c| c.is_trimmable() && !windowed(c.as_ref()))
}

/// Whether speculation can rewind `cache`: every layer trims at any length or can be put back.
pub(super) fn rewindable(cache: &[Box<dyn KvCache>]) -> bool {
    unrewindable(cache).is_none()
}

/// The class (mlx-lm's name) of the first layer cache speculation cannot rewind, if any.
pub(super) fn unrewindable(cache: &[Box<dyn KvCache>]) -> Option<&'static str> {
    let c = cache.iter().find(|c| !((c.is_trimmable() && !windowed(c.as_ref())) || c.checkpoint(i32::MAX).is_some()))?;
    Some(c.saved_state().map_or("layer cache", |(class, _)| class))
}

/// The error for a `whose` cache that speculation cannot rewind.
pub(super) fn cannot_rewind(whose: &str, cache: &[Box<dyn KvCache>]) -> EngineError {
    EngineError::Invalid(format!(
        "speculative decoding needs caches it can rewind, and the {whose}'s {} cannot be trimmed or put back (a cache list with a rotating window)",
        unrewindable(cache).unwrap_or("cache")
    ))
}

/// Leaves `cache`, which was just fed `fed`, holding only the first `kept` of them: a trim of the
/// rest, or, with layers that cannot be trimmed back (recurrent states, wrapped rotating windows),
/// those layers from `before` (taken before `fed`), the other layers trimmed back as far, and the
/// kept tokens run through `model` again.
pub(super) fn rewind(
    model: &dyn Model,
    cache: &mut [Box<dyn KvCache>],
    before: Checkpoint,
    fed: &[u32],
    kept: usize,
    config: &GenerateConfig,
) -> Result<()> {
    if kept >= fed.len() {
        return Ok(());
    }
    let Some(layers) = before else {
        trim_prompt_cache(cache, (fed.len() - kept) as i32)?;
        return Ok(());
    };
    for (c, before) in cache.iter_mut().zip(layers) {
        match before {
            Some(b) => *c = b,
            None => {
                c.trim(fed.len() as i32)?;
            }
        }
    }
    if kept > 0 {
        let ids: Vec<i32> = fed[..kept].iter().map(|&t| t as i32).collect();
        model.forward(&Array::from_slice(&ids, &[1, kept as i32])?, cache)?;
        maybe_quantize_kv_cache(cache, config.kv_quant.as_ref())?;
    }
    Ok(())
}

/// The continuation (`max` tokens) of the latest earlier occurrence of the last n-gram of `seq`,
/// for n from `ngram` down to 1; empty when there is none. A continuation that reaches the end of
/// `seq` goes on with itself (the pattern from the match to the end repeats: a run of one token
/// proposes that token `max` times rather than once).
pub fn prompt_lookup(seq: &[u32], ngram: usize, max: usize) -> Vec<u32> {
    let len = seq.len();
    if max == 0 || len < 2 {
        return Vec::new();
    }
    for n in (1..=ngram.min(len - 1)).rev() {
        let tail = &seq[len - n..];
        if let Some(i) = (0..len - n).rev().find(|&i| &seq[i..i + n] == tail) {
            let start = i + n;
            let mut out: Vec<u32> = Vec::with_capacity(max);
            for p in start..start + max {
                // p - len < out.len(), as start < len.
                out.push(if p < len { seq[p] } else { out[p - len] });
            }
            return out;
        }
    }
    Vec::new()
}
