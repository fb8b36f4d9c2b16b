//! The hook for constrained decoding (JSON schemas, grammars, regexes): a [`TokenConstraint`] says
//! which tokens may come next, the mask is applied to the logits before the sampling chain (after the
//! logits processors, before the log-softmax), and every chosen token is committed back to it.
//!
//! The mask for position n+1 needs token n, so a constrained step queues the forward pass first,
//! then reads token n (the one host sync a step already has), commits it and computes the next mask
//! on the CPU while the device runs that forward pass; only the masked sampling waits for the mask.
use crate::error::{EngineError, Result};
use mlx::{ops, Array};

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
    /// [`TokenConstraint::allowed`] packed as [`pack_bits`] packs it ([`mask_words`] words):
    /// a thirty-second of the flags to build on the CPU and to send to the device.
    fn allowed_bits(&mut self, vocab: usize) -> Result<Vec<u32>> {
        Ok(pack_bits(&self.allowed(vocab)?))
    }
}

/// Words a packed mask of `vocab` tokens takes ([`pack_bits`]).
pub fn mask_words(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

/// Token flags as words: bit `t % 32` of word `t / 32` is token t's flag (the layout of
/// llguidance's token sets); [`mask_words`] of `flags.len()` words.
pub fn pack_bits(flags: &[bool]) -> Vec<u32> {
    flags.chunks(32).map(|c| c.iter().enumerate().fold(0u32, |w, (i, &f)| w | (u32::from(f) << i))).collect()
}

/// The first `vocab` flags of words packed by [`pack_bits`].
pub fn unpack_bits(words: &[u32], vocab: usize) -> Vec<bool> {
    (0..vocab as u32).map(|t| bit_is_set(words, t)).collect()
}

thread_local! {
    /// Per vocabulary size: each token's word (vocab,) and its bit's value 2^(t % 32) (vocab,), on
    /// the device once (arrays stay on the thread that made them).
    static UNPACK: std::cell::RefCell<Option<(i32, Array, Array)>> = const { std::cell::RefCell::new(None) };
}

/// `logits` (rows, vocab) with every token the packed masks `words` (rows x [`mask_words`]
/// words, row after row, see [`pack_bits`]) do not allow set to -inf. On a CUDA GPU one kernel
/// reads the words from page-locked host memory (`mlx::fast::mask_tokens`); elsewhere the bits are
/// unpacked by MLX operations (a word gathered per token, divided by its bit's value, modulo 2).
pub fn apply_mask_bits(logits: &Array, words: &[u32]) -> Result<Array> {
    let (rows, vocab) = (logits.dim(0), logits.dim(-1));
    let per_row = mask_words(vocab as usize);
    if logits.ndim() != 2 || words.len() != rows as usize * per_row {
        return Err(EngineError::Invalid(format!("a packed token mask of {} words for logits of shape {:?}", words.len(), logits.shape())));
    }
    if let Some(masked) = mlx::fast::mask_tokens(logits, words)? {
        return Ok(masked);
    }
    let (word_of, bit) = UNPACK.with(|u| -> Result<(Array, Array)> {
        let mut u = u.borrow_mut();
        if u.as_ref().is_none_or(|(v, _, _)| *v != vocab) {
            let word_of: Vec<i32> = (0..vocab).map(|t| t / 32).collect();
            let bit: Vec<u32> = (0..vocab).map(|t| 1u32 << (t % 32)).collect();
            *u = Some((vocab, Array::from_slice(&word_of, &[vocab])?, Array::from_slice(&bit, &[vocab])?));
        }
        let (_, w, b) = u.as_ref().expect("set above");
        Ok((w.clone(), b.clone()))
    })?;
    let packed = Array::from_slice(words, &[rows, per_row as i32])?; // (rows, words)
    let mask = packed.take(&word_of, 1)?.floor_divide(&bit)?.remainder_scalar(2.0)?.ne_scalar(0.0)?; // (rows, vocab)
    let neg_inf = Array::scalar(f64::NEG_INFINITY, logits.dtype())?;
    Ok(ops::where_(&mask, logits, &neg_inf)?)
}

/// How long [`commit_and_mask`] goes through rows one after another before it hands the rest to
/// threads. llguidance's mask over Qwen2.5's 151,936 ids inside a JSON string takes about 15 us a
/// row (`mask_host_cost`), far less than starting a thread: 8 rows took 123-290 us a step one after
/// another and 830-2,150 us on a thread each (2 loaded cores; BENCHMARKS.md, 2026-12-06d).
/// A grammar whose masks are slow still gets threads for all but its first rows.
const SERIAL_BUDGET: std::time::Duration = std::time::Duration::from_micros(200);

/// Commits each row's chosen token to its constraint and computes the row's next mask (packed, see
/// [`pack_bits`]): `rows` pairs each constraint (none for a free row) with its token. Rows are
/// taken in order until 200 us (`SERIAL_BUDGET`) have passed; then, if two or more are left, each of those
/// runs on its own thread (a batch step waits for the slowest mask).
pub fn commit_and_mask(rows: Vec<(Option<&mut Box<dyn TokenConstraint>>, u32)>, vocab: usize) -> Result<Vec<Option<Vec<u32>>>> {
    let step = |c: Option<&mut Box<dyn TokenConstraint>>, token: u32| -> Result<Option<Vec<u32>>> {
        match c {
            Some(c) => {
                c.commit(token)?;
                Ok(Some(c.allowed_bits(vocab)?))
            }
            None => Ok(None),
        }
    };
    let start = std::time::Instant::now();
    let mut out = Vec::with_capacity(rows.len());
    let mut rows = rows.into_iter();
    for (c, t) in rows.by_ref() {
        out.push(step(c, t)?);
        if start.elapsed() >= SERIAL_BUDGET {
            break;
        }
    }
    let rest: Vec<_> = rows.collect();
    if rest.iter().filter(|(c, _)| c.is_some()).count() < 2 {
        for (c, t) in rest {
            out.push(step(c, t)?);
        }
        return Ok(out);
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = rest.into_iter().map(|(c, t)| scope.spawn(move || step(c, t))).collect();
        for h in handles {
            out.push(h.join().unwrap_or_else(|_| Err(EngineError::Invalid("a constraint's mask computation panicked".into())))?);
        }
        Ok(out)
    })
}

/// Whether token `t` is allowed by one row of packed flags ([`pack_bits`]).
pub fn bit_is_set(words: &[u32], t: u32) -> bool {
    words.get(t as usize / 32).is_some_and(|w| w >> (t % 32) & 1 == 1)
}

/// The masks of a speculative round's positions (the pending token's, then one after each draft
/// token), `drafted.len() + 1` rows of `vocab` flags packed as [`pack_bits`] packs them
/// ([`mask_words`] a row), from `c` advanced along the drafts while it allows them;
/// past a draft it refuses, the rows repeat the last mask (that draft is rejected at its
/// position, so they are never used). `c` is left as it was.
pub fn draft_masks(c: &mut dyn TokenConstraint, drafted: &[u32], vocab: usize) -> Result<Vec<u32>> {
    let per_row = mask_words(vocab);
    let mut masks = Vec::with_capacity((drafted.len() + 1) * per_row);
    let mut last = c.allowed_bits(vocab)?;
    let mut committed = 0;
    for &d in drafted {
        masks.extend_from_slice(&last);
        if !bit_is_set(&last, d) || d as usize >= vocab {
            break;
        }
        c.commit(d)?;
        committed += 1;
        last = c.allowed_bits(vocab)?;
    }
    while masks.len() < (drafted.len() + 1) * per_row {
        masks.extend_from_slice(&last);
    }
    c.rollback(committed)?;
    Ok(masks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx::Dtype;

    /// `logits` (rows, vocab) with every token `allowed` (rows * vocab flags, row after row) does
    /// not name set to -inf (in the logits' dtype): the flags packed, then [`apply_mask_bits`].
    fn apply_mask(logits: &Array, allowed: &[bool]) -> Result<Array> {
        let (rows, vocab) = (logits.dim(0), logits.dim(-1));
        if logits.ndim() != 2 || allowed.len() != (rows * vocab) as usize {
            return Err(EngineError::Invalid(format!("a token mask of {} entries for logits of shape {:?}", allowed.len(), logits.shape())));
        }
        apply_mask_bits(logits, &allowed.chunks(vocab as usize).flat_map(pack_bits).collect::<Vec<_>>())
    }

    /// Allows the tokens that differ from the last committed one; refuses token 99. Each mask takes
    /// at least the given time.
    struct NotAgain(Option<u32>, std::time::Duration);

    impl TokenConstraint for NotAgain {
        fn allowed(&mut self, vocab: usize) -> Result<Vec<bool>> {
            std::thread::sleep(self.1);
            Ok((0..vocab as u32).map(|t| Some(t) != self.0).collect())
        }
        fn commit(&mut self, token: u32) -> Result<()> {
            if token == 99 {
                return Err(EngineError::Invalid("token 99 refused".into()));
            }
            self.0 = Some(token);
            Ok(())
        }
        fn rollback(&mut self, _: usize) -> Result<()> {
            Ok(())
        }
        fn note(&self) -> Option<String> {
            None
        }
    }

    #[test]
    fn rows_are_committed_and_masked_in_order_one_after_another_or_on_threads() {
        // Cheap masks run one after another; masks of 150 us each spend the serial budget after
        // two rows, and the last five run on threads: the same masks, in the rows' order.
        for cost in [0u64, 150] {
            let cost = std::time::Duration::from_micros(cost);
            let mut cs: Vec<Box<dyn TokenConstraint>> = (0..6).map(|_| Box::new(NotAgain(None, cost)) as Box<dyn TokenConstraint>).collect();
            let mut it = cs.iter_mut();
            // Rows: constrained, free, constrained x 5, each with its own token.
            let mut rows: Vec<(Option<&mut Box<dyn TokenConstraint>>, u32)> = vec![(it.next(), 0), (None, 1)];
            rows.extend(it.enumerate().map(|(i, c)| (Some(c), i as u32 + 2)));
            let masks = commit_and_mask(rows, 8).expect("masks");
            assert_eq!(masks.len(), 7);
            assert!(masks[1].is_none());
            for (row, token) in [(0usize, 0usize), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6)] {
                let m = unpack_bits(masks[row].as_ref().expect("a constrained row's mask"), 8);
                assert!(!m[token] && m.iter().filter(|&&a| a).count() == 7, "{cost:?}, row {row}: {m:?}");
            }
            // A row's error is the call's error, one after another or on threads.
            let mut r: Vec<Box<dyn TokenConstraint>> = (0..4).map(|_| Box::new(NotAgain(None, cost)) as Box<dyn TokenConstraint>).collect();
            assert!(commit_and_mask(vec![(Some(&mut r[0]), 99)], 8).is_err());
            let rows: Vec<(Option<&mut Box<dyn TokenConstraint>>, u32)> = r.iter_mut().zip([1, 2, 3, 99]).map(|(c, t)| (Some(c), t)).collect();
            assert!(commit_and_mask(rows, 8).is_err(), "{cost:?}");
        }
    }

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

    /// Packed masks unpacked on the device mask exactly what the flags say (computed on the host): 3
    /// rows over a vocabulary that 32 does not divide, every bit position of a word included.
    #[test]
    fn packed_masks_equal_the_flags() {
        let (rows, vocab) = (3usize, 77usize);
        let flags: Vec<bool> = (0..rows * vocab).map(|i| (i * 7919 + i / 5) % 3 != 0).collect();
        let words: Vec<u32> = flags.chunks(vocab).flat_map(pack_bits).collect();
        assert_eq!(words.len(), rows * mask_words(vocab));
        for (r, chunk) in flags.chunks(vocab).enumerate() {
            assert_eq!(unpack_bits(&words[r * 3..r * 3 + 3], vocab), chunk);
        }
        let logits = mlx::random::uniform_with_key(&[rows as i32, vocab as i32], Dtype::F32, &mlx::random::key(3).expect("key")).expect("logits");
        let masked = |values: Vec<f32>, flags: &[bool]| -> Vec<f32> { values.iter().zip(flags).map(|(&v, &a)| if a { v } else { f32::NEG_INFINITY }).collect() };
        let want = masked(logits.to_vec::<f32>().expect("read"), &flags);
        assert_eq!(apply_mask(&logits, &flags).expect("flags").to_vec::<f32>().expect("read"), want);
        let got = apply_mask_bits(&logits, &words).expect("words").to_vec::<f32>().expect("read");
        assert_eq!(want, got);
        // Twice, from the unpacking tables kept for this vocabulary, and for another one.
        assert_eq!(apply_mask_bits(&logits, &words).expect("again").to_vec::<f32>().expect("read"), want);
        let small = logits.slice_axis(1, 0, 40).expect("slice");
        let words40: Vec<u32> = flags.chunks(vocab).flat_map(|c| pack_bits(&c[..40])).collect();
        let flags40: Vec<bool> = flags.chunks(vocab).flat_map(|c| c[..40].to_vec()).collect();
        assert_eq!(apply_mask_bits(&small, &words40).expect("40").to_vec::<f32>().expect("read"), masked(small.to_vec::<f32>().expect("read"), &flags40));
        assert!(apply_mask_bits(&logits, &words[..5]).is_err());
    }
}
