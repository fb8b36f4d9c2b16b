//! The paged KV cache: keys and values of all sequences live in fixed-size blocks of one pool per
//! process (one storage array per layer, grown as blocks are first used, capped by a byte budget);
//! a sequence holds a block table; identical prompt prefixes share full blocks (see [`alloc`]).
pub mod alloc;
mod prefix;
mod ring;

pub use alloc::{AllocError, BlockAllocator, BlockId, SeqId};
pub use ring::PagedRingCache;
pub use prefix::StoredSeq;

use super::{KvCache, StateNode};
use crate::error::{EngineError, Result};
use mlx::{ops, Array};
use std::rc::Rc;
use std::sync::{Mutex, MutexGuard};

/// Positions added to a layer's storage at a time (whole blocks; as the growing cache's step).
const GROW_POSITIONS: usize = 256;

struct Inner {
    alloc: BlockAllocator,
    /// Per layer: keys and values storage (1, kv_heads, blocks * block_size, dim): block b holds
    /// positions b*bs..(b+1)*bs of axis 2, so a sequence on consecutive blocks reads as one slice.
    layers: Vec<Option<(Array, Array)>>,
    budget_bytes: usize,
}

/// The shared block pool. Clone it to share; sequences made from it share prefixes.
#[derive(Clone)]
pub struct PagedPool(Rc<Mutex<Inner>>);

fn err(e: AllocError) -> EngineError {
    EngineError::Invalid(e.to_string())
}

impl PagedPool {
    /// A pool for a model of `num_layers` layers, blocks of `block_size` positions, and at most
    /// `budget_bytes` of key/value storage over all layers.
    pub fn new(num_layers: usize, block_size: usize, budget_bytes: usize) -> PagedPool {
        let inner = Inner {
            alloc: BlockAllocator::new(block_size.max(1), usize::MAX),
            layers: (0..num_layers).map(|_| None).collect(),
            budget_bytes,
        };
        PagedPool(Rc::new(Mutex::new(inner)))
    }

    /// [`PagedPool::new`] with the allocator's prefix hash replaced (tests force collisions).
    #[cfg(test)]
    pub(crate) fn with_hash(num_layers: usize, block_size: usize, budget_bytes: usize, hash: fn(u64, &[u32]) -> u64) -> PagedPool {
        let pool = PagedPool::new(num_layers, block_size, budget_bytes);
        pool.lock().alloc = BlockAllocator::with_hash(block_size.max(1), usize::MAX, hash);
        pool
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One cache per layer for a new sequence with prompt `tokens`, and how many leading prompt
    /// positions are already in it (shared from an earlier sequence): prefill only the rest.
    pub fn new_sequence(&self, tokens: &[u32]) -> (Vec<Box<dyn KvCache>>, usize) {
        let mut inner = self.lock();
        let (seq, reused) = inner.alloc.allocate(tokens);
        let n = inner.layers.len();
        drop(inner);
        let handle = Rc::new(SeqHandle { pool: self.clone(), seq });
        let caches = (0..n)
            .map(|layer| Box::new(PagedCache { seq: handle.clone(), layer, offset: reused as i32 }) as Box<dyn KvCache>)
            .collect();
        (caches, reused)
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.lock().alloc.block_size()
    }

    /// The most bytes of storage the pool may hold.
    pub fn budget_bytes(&self) -> usize {
        self.lock().budget_bytes
    }

    /// Bytes of storage the pool holds now (all layers).
    pub fn nbytes(&self) -> usize {
        self.lock().layers.iter().flatten().map(|(k, v)| k.nbytes() + v.nbytes()).sum()
    }

    /// (blocks held by sequences, cached unreferenced blocks, live sequences).
    pub fn usage(&self) -> (usize, usize, usize) {
        let inner = self.lock();
        (inner.alloc.used_blocks(), inner.alloc.cached_blocks(), inner.alloc.num_sequences())
    }

    /// Cached blocks no sequence holds (cheap: what a server's gauge reads every step).
    pub fn cached_blocks(&self) -> usize {
        self.lock().alloc.cached_blocks()
    }

    /// Drops the cached prefixes no sequence holds.
    pub fn clear_cached(&self) {
        self.lock().alloc.clear_cached();
    }
}

/// Frees its sequence when the last layer cache of it goes.
struct SeqHandle {
    pool: PagedPool,
    seq: SeqId,
}

impl Drop for SeqHandle {
    fn drop(&mut self) {
        let _ = self.pool.lock().alloc.free(self.seq);
    }
}

/// One layer's view of one sequence in a [`PagedPool`]. Batch size 1.
pub struct PagedCache {
    seq: Rc<SeqHandle>,
    layer: usize,
    offset: i32,
}

impl Inner {
    /// The first write fixes the block shapes, hence how many blocks the byte budget holds.
    fn fix_capacity(&mut self, keys: &Array, values: &Array) {
        if self.alloc.capacity() == usize::MAX {
            let bs = self.alloc.block_size();
            let per_block = bs * (keys.dim(1) * (keys.dim(3) + values.dim(3))) as usize * keys.dtype().size() * self.layers.len();
            self.alloc.set_capacity((self.budget_bytes / per_block.max(1)).max(1));
        }
    }

    /// Grows a layer's storage to hold blocks `0..blocks`.
    fn ensure_storage(&mut self, layer: usize, blocks: usize, keys: &Array, values: &Array) -> Result<()> {
        let bs = self.alloc.block_size() as i32;
        let (heads, k_dim, v_dim) = (keys.dim(1), keys.dim(3), values.dim(3));
        let have = self.blocks_stored(layer);
        if have >= blocks {
            return Ok(());
        }
        let step = (GROW_POSITIONS / self.alloc.block_size()).max(1);
        let want = (blocks.div_ceil(step) * step).min(self.alloc.capacity().max(blocks));
        let add = (want - have) as i32;
        let zk = ops::zeros(&[1, heads, add * bs, k_dim], keys.dtype())?;
        let zv = ops::zeros(&[1, heads, add * bs, v_dim], values.dtype())?;
        self.layers[layer] = Some(match self.layers[layer].take() {
            Some((k, v)) => (ops::concatenate(&[&k, &zk], 2)?, ops::concatenate(&[&v, &zv], 2)?),
            None => (zk, zv),
        });
        Ok(())
    }
}

impl Inner {
    /// Blocks a layer's storage holds.
    fn blocks_stored(&self, layer: usize) -> usize {
        self.layers[layer].as_ref().map_or(0, |(k, _)| k.dim(2) as usize / self.alloc.block_size())
    }

    /// Bytes one block takes in a layer (keys and values).
    fn block_bytes(&self, layer: usize) -> usize {
        self.layers[layer].as_ref().map_or(0, |(k, v)| (k.nbytes() + v.nbytes()) / self.blocks_stored(layer).max(1))
    }

    /// Copy-on-write: block `src`'s contents into block `dst`, in every layer.
    fn apply_copies(&mut self, copies: &[alloc::Copy]) -> Result<()> {
        for &(src, dst) in copies {
            for l in 0..self.layers.len() {
                if let Some((k, v)) = self.layers[l].take() {
                    let bs = self.alloc.block_size() as i32;
                    let (src, dst) = (src as i32 * bs, dst as i32 * bs);
                    let cp = |a: &Array| -> Result<Array> {
                        let blk = a.slice_axis(2, src, src + bs)?;
                        let mut stop = a.shape();
                        stop[2] = dst + bs;
                        Ok(a.slice_update(&blk, &[0, 0, dst, 0], &stop)?)
                    };
                    self.layers[l] = Some((cp(&k)?, cp(&v)?));
                }
            }
        }
        Ok(())
    }

    /// Writes keys/values (1, kv_heads, n, D) of one layer at positions `start..start + n` of the
    /// sequence whose blocks are `table` (storage must hold them): one slice update per run of
    /// positions that lie side by side in storage (a sequence's fresh blocks come in order, so
    /// usually one for the whole write, where a block at a time cost a server's departing row
    /// hundreds of operations per layer).
    fn write_slots(&mut self, layer: usize, table: &[BlockId], start: i32, keys: &Array, values: &Array) -> Result<()> {
        let (n, bs) = (keys.dim(2), self.alloc.block_size() as i32);
        // (position in `keys`, position in storage, length) of each run.
        let mut runs: Vec<(i32, i32, i32)> = Vec::new();
        let mut pos = start;
        while pos < start + n {
            let blk = *table
                .get((pos / bs) as usize)
                .ok_or_else(|| EngineError::Invalid(format!("paged KV cache: position {pos} is past the sequence's blocks")))?;
            let (slot, i) = (pos % bs, pos - start);
            let run = (bs - slot).min(start + n - pos);
            let at = blk as i32 * bs + slot;
            match runs.last_mut() {
                Some((_, last_at, len)) if *last_at + *len == at => *len += run,
                _ => runs.push((i, at, run)),
            }
            pos += run;
        }
        let (mut pk, mut pv) = self.layers[layer].take().ok_or_else(|| EngineError::Invalid("no storage".into()))?;
        for (i, at, run) in runs {
            let (kk, vv) = if run == n { (keys.clone(), values.clone()) } else { (keys.slice_axis(2, i, i + run)?, values.slice_axis(2, i, i + run)?) };
            pk = pk.slice_update(&kk, &[0, 0, at, 0], &[1, pk.dim(1), at + run, pk.dim(3)])?;
            pv = pv.slice_update(&vv, &[0, 0, at, 0], &[1, pv.dim(1), at + run, pv.dim(3)])?;
        }
        self.layers[layer] = Some((pk, pv));
        Ok(())
    }
}

impl PagedCache {
    /// The first `len` positions of the sequence on blocks `table`: (1, kv_heads, len, D) keys and
    /// values. On consecutive blocks (a sequence that got fresh blocks in order, the usual case for
    /// one stream) this is a slice of the storage, no copy, as the growing cache reads; otherwise
    /// the positions are gathered.
    fn gather(inner: &Inner, table: &[BlockId], layer: usize, len: i32) -> Result<(Array, Array)> {
        let (k, v) = inner.layers[layer].as_ref().ok_or_else(|| EngineError::Invalid("empty paged cache".into()))?;
        let bs = inner.alloc.block_size() as i32;
        let first = table.first().map_or(0, |&b| b as i32);
        if table.iter().enumerate().all(|(i, &b)| b as i32 == first + i as i32) {
            let start = first * bs;
            return Ok((k.slice_axis(2, start, start + len)?, v.slice_axis(2, start, start + len)?));
        }
        let positions: Vec<i32> = table.iter().flat_map(|&b| (0..bs).map(move |s| b as i32 * bs + s)).take(len as usize).collect();
        let idx = Array::from_slice(&positions, &[positions.len() as i32])?;
        Ok((k.take(&idx, 2)?, v.take(&idx, 2)?))
    }
}

impl KvCache for PagedCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        if keys.dim(0) != 1 {
            return Err(EngineError::Invalid("the paged KV cache holds one sequence per cache (batch size 1)".into()));
        }
        let n = keys.dim(2);
        let mut guard = self.seq.pool.lock();
        let inner = &mut *guard;
        let seq = self.seq.seq;
        inner.fix_capacity(keys, values);
        let held = inner.alloc.seq_len(seq).ok_or_else(|| err(AllocError::UnknownSequence(seq)))? as i32;
        if self.offset + n > held {
            if self.offset < held {
                inner.alloc.truncate(seq, self.offset as usize).map_err(err)?;
            }
            let copies = inner.alloc.extend(seq, (self.offset + n - inner.alloc.seq_len(seq).unwrap_or(0) as i32) as usize).map_err(err)?;
            inner.apply_copies(&copies)?;
        }
        let table = inner.alloc.block_table(seq).unwrap_or(&[]).to_vec();
        let max_block = table.iter().copied().max().map_or(0, |b| b + 1);
        inner.ensure_storage(self.layer, max_block, keys, values)?;
        inner.write_slots(self.layer, &table, self.offset, keys, values)?;
        self.offset += n;
        let used = (self.offset as usize).div_ceil(inner.alloc.block_size());
        Self::gather(inner, &table[..used], self.layer, self.offset)
    }

    fn trim(&mut self, n: i32) -> Result<i32> {
        let n = n.min(self.offset).max(0);
        self.offset -= n;
        let mut inner = self.seq.pool.lock();
        let held = inner.alloc.seq_len(self.seq.seq).unwrap_or(0);
        if (self.offset as usize) < held {
            inner.alloc.truncate(self.seq.seq, self.offset as usize).map_err(err)?;
        }
        Ok(n)
    }

    fn state(&self) -> Vec<Array> {
        let inner = self.seq.pool.lock();
        inner.layers[self.layer].iter().flat_map(|(k, v)| [k.clone(), v.clone()]).collect()
    }

    /// This sequence's share: its blocks' bytes in this layer.
    fn nbytes(&self) -> usize {
        let inner = self.seq.pool.lock();
        let blocks = inner.alloc.block_table(self.seq.seq).map_or(0, <[BlockId]>::len);
        inner.block_bytes(self.layer) * blocks
    }

    /// Saved as mlx-lm's `KVCache` (the blocks gathered in order).
    fn saved_state(&self) -> Result<(&'static str, Vec<StateNode>)> {
        let inner = self.seq.pool.lock();
        let table = inner.alloc.block_table(self.seq.seq).unwrap_or(&[]).to_vec();
        if self.offset == 0 || inner.layers[self.layer].is_none() {
            return Ok(("KVCache", vec![StateNode::None, StateNode::None, StateNode::Int(0)]));
        }
        let used = (self.offset as usize).div_ceil(inner.alloc.block_size());
        let (k, v) = Self::gather(&inner, &table[..used], self.layer, self.offset)?;
        Ok(("KVCache", vec![StateNode::Array(k), StateNode::Array(v), StateNode::Int(i64::from(self.offset))]))
    }
}

#[cfg(test)]
mod tests;
