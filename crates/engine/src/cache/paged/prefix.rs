//! The paged pool as a prefix cache for batched serving: finished or prefilled sequences leave
//! their keys and values in the pool's blocks ([`PagedPool::store`]), and a new prompt takes the
//! longest cached run of full blocks it starts with ([`PagedPool::lookup`]). Unreferenced blocks
//! stay cached until the byte budget needs them (least recently used first).
use super::{err, PagedCache, PagedPool};
use crate::error::Result;
use mlx::Array;

/// One sequence for [`PagedPool::store_all`]: its tokens and their keys and values per layer.
pub type StoredSeq<'a> = (&'a [u32], &'a [(Array, Array)]);

impl PagedPool {
    /// The longest cached prefix of `tokens` (whole blocks, at most `tokens.len() - 1` positions)
    /// and its keys and values per layer, (1, kv_heads, n, D) each; `(0, [])` when none.
    pub fn lookup(&self, tokens: &[u32]) -> Result<(usize, Vec<(Array, Array)>)> {
        let mut inner = self.lock();
        if inner.layers.iter().any(Option::is_none) {
            return Ok((0, Vec::new()));
        }
        let (seq, reused) = inner.alloc.allocate(tokens);
        let result = (|| {
            if reused == 0 {
                return Ok(Vec::new());
            }
            let table = inner.alloc.block_table(seq).unwrap_or(&[]).to_vec();
            (0..inner.layers.len()).map(|l| PagedCache::gather(&inner, &table, l, reused as i32)).collect::<Result<Vec<_>>>()
        })();
        inner.alloc.free(seq).map_err(err)?;
        Ok((reused, result?))
    }

    /// Writes the keys and values of the positions of `tokens` ((1, kv_heads, tokens.len(), D) per
    /// layer) into the pool, sharing the blocks already cached for the same prefix, and leaves them
    /// cached. Queues the pool's storage for evaluation (no graph builds up, no wait).
    pub fn store(&self, tokens: &[u32], kv: &[(Array, Array)]) -> Result<()> {
        self.store_all(&[(tokens, kv)])
    }

    /// [`PagedPool::store`] of several sequences, the pool's storage queued once (`async_eval`: a
    /// server's departing rows do not wait for the device mid-step); one that
    /// cannot be stored (a full pool) does not keep the others out (the first error is returned).
    pub fn store_all(&self, seqs: &[StoredSeq<'_>]) -> Result<()> {
        let mut first_error = None;
        for &(tokens, kv) in seqs {
            let (mut caches, reused) = self.new_sequence(tokens);
            if kv.len() != caches.len() || tokens.len() <= reused {
                continue;
            }
            let (start, stop) = (reused as i32, tokens.len() as i32);
            let written = caches.iter_mut().zip(kv).try_for_each(|(c, (k, v))| c.update_and_fetch(&k.slice_axis(2, start, stop)?, &v.slice_axis(2, start, stop)?).map(|_| ()));
            if let Err(e) = written {
                first_error.get_or_insert(e);
            }
        }
        let all: Vec<Array> = self.lock().layers.iter().flatten().flat_map(|(k, v)| [k.clone(), v.clone()]).collect();
        mlx::async_eval(&all.iter().collect::<Vec<_>>())?;
        first_error.map_or(Ok(()), Err)
    }
}
