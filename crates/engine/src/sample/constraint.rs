//! The hook for constrained decoding (JSON schemas, grammars, regexes): a [`TokenConstraint`] says
//! which tokens may come next, the mask is applied to the logits before the sampling chain (after the
//! logits processors, before the log-softmax), and every chosen token is committed back to it.
//!
//! The mask for position n+1 needs token n, so a constrained step queues the forward pass first,
//! then reads token n (the one host sync a step already has), commits it and computes the next mask
//! on the CPU while the device runs that forward pass; only the masked sampling waits for the mask.
use crate::error::{EngineError, Result};
use mlx::{ops, Array, Dtype};

/// A grammar (or any rule) over the generated tokens. Implementations live outside the engine
/// (the server's llguidance matcher); the engine only asks for masks and reports tokens.
pub trait TokenConstraint: Send {
    /// The tokens allowed at the next position: one flag per token id below `vocab` (ids past the
    /// tokenizer's vocabulary are never allowed). A constraint that dead-ends (nothing allowed)
    /// allows only its end-of-sequence tokens and says why in [`TokenConstraint::note`].
    fn allowed(&mut self, vocab: usize) -> Result<Vec<bool>>;
    /// Moves past the chosen token.
    fn commit(&mut self, token: u32) -> Result<()>;
    /// Undoes the last `n` commits (speculative decoding checks draft tokens ahead, then goes back),
    /// and any note they or the masks after them caused.
    fn rollback(&mut self, n: usize) -> Result<()>;
    /// Why the constraint ended generation early (it dead-ended or rejected a token), if it did.
    fn note(&self) -> Option<String>;
}

/// `logits` (rows, vocab) with every token `allowed` (rows * vocab flags, row after row) does not
/// name set to -inf (in the logits' dtype).
pub fn apply_mask(logits: &Array, allowed: &[bool]) -> Result<Array> {
    let (rows, vocab) = (logits.dim(0), logits.dim(-1));
    if logits.ndim() != 2 || allowed.len() != (rows * vocab) as usize {
        return Err(EngineError::Invalid(format!("a token mask of {} entries for logits of shape {:?}", allowed.len(), logits.shape())));
    }
    let flags: Vec<u8> = allowed.iter().map(|&a| u8::from(a)).collect();
    let mask = Array::from_slice(&flags, &[rows, vocab])?.astype(Dtype::Bool)?; // (rows, vocab)
    let neg_inf = Array::scalar(f64::NEG_INFINITY, logits.dtype())?;
    Ok(ops::where_(&mask, logits, &neg_inf)?)
}

/// The masks of a speculative round's positions (the pending token's, then one after each draft
/// token), `drafted.len() + 1` rows of `vocab` flags, from `c` advanced along the drafts while it
/// allows them; past a draft it refuses, the rows repeat the last mask (that draft is rejected at
/// its position, so they are never used). `c` is left as it was.
pub fn draft_masks(c: &mut dyn TokenConstraint, drafted: &[u32], vocab: usize) -> Result<Vec<bool>> {
    let mut masks = Vec::with_capacity((drafted.len() + 1) * vocab);
    let mut last = c.allowed(vocab)?;
    let mut committed = 0;
    for &d in drafted {
        masks.extend_from_slice(&last);
        if !last.get(d as usize).copied().unwrap_or(false) {
            break;
        }
        c.commit(d)?;
        committed += 1;
        last = c.allowed(vocab)?;
    }
    while masks.len() < (drafted.len() + 1) * vocab {
        masks.extend_from_slice(&last);
    }
    c.rollback(committed)?;
    Ok(masks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_tokens_become_neg_inf_and_keep_dtype() {
        let logits = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[1, 4]).expect("array");
        let out = apply_mask(&logits, &[true, false, true, false]).expect("mask");
        assert_eq!(out.dtype(), Dtype::F32);
        let v = out.to_vec::<f32>().expect("read");
        assert_eq!(v[0], 1.0);
        assert_eq!(v[2], 3.0);
        assert!(v[1] == f32::NEG_INFINITY && v[3] == f32::NEG_INFINITY);
        assert!(apply_mask(&logits, &[true]).is_err());
    }
}
