//! A rotating window in the paged pool: "a window is a ring of blocks". It keeps mlx-lm's
//! `RotatingKVCache` layout (the first `keep` positions, then a ring written in place one position
//! at a time; several positions at once are rewritten in temporal order, as that cache does), but
//! its buffer lives in pool blocks: buffer slot `s` is slot `s % block_size` of block
//! `table[s / block_size]`. Once the window is full, a new position overwrites the oldest one's
//! slot in its block, so the sequence holds the same `ceil(max_size / block_size)` blocks from
//! then on. Keys and values come back in the rotating cache's physical order (attention sums over
//! them in that order), so a model generates the rotating cache's tokens exactly.
use super::super::rotating::{rotating_mask, rotating_trim, temporal_order, trim_buf};
use super::{err, AllocError, BlockId, Inner, PagedCache, PagedPool, SeqHandle, SeqId};
use crate::cache::{CacheMask, KvCache, StateNode};
use crate::error::{EngineError, Result};
use mlx::ops::{self, QuantSpec};
use mlx::Array;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Mutex;

/// Positions a buffer grows by until it holds the window (mlx-lm's `RotatingKVCache.step`).
const STEP: i32 = 256;

/// The allocator sequence of the ring layers of one window size. Layers update one after another,
/// and a multi-position update can make a buffer longer than the window for a while, so the
/// sequence holds the blocks of the largest layer buffer.
struct RingHandle {
    pool: PagedPool,
    seq: SeqId,
    /// Buffer length (slots) per model layer; 0 for layers not in this ring.
    caps: Mutex<Vec<usize>>,
}

impl Drop for RingHandle {
    fn drop(&mut self) {
        let _ = self.pool.lock().alloc.free(self.seq);
    }
}

/// One layer's rotating window of one sequence in a [`PagedPool`]. Batch size 1.
pub struct PagedRingCache {
    ring: Rc<RingHandle>,
    layer: usize,
    /// Positions seen (the RoPE offset).
    offset: i32,
    /// The ring's write index, as `RotatingKVCache._idx`.
    idx: i32,
    /// Slots of this layer's buffer (the rotating cache's `keys.shape[2]`).
    cap: i32,
    keep: i32,
    max_size: i32,
}

impl PagedPool {
    /// One cache per layer for a new sequence: layer `l` is a rotating window (a ring of blocks)
    /// when `windows[l]` is `Some((max_size, keep))` (as [`KvCache::window`] reports it), and holds
    /// every position otherwise. With any window, no prompt prefix is shared (`0` reused).
    pub fn new_windowed_sequence(&self, tokens: &[u32], windows: &[Option<(i32, i32)>]) -> Result<(Vec<Box<dyn KvCache>>, usize)> {
        if windows.iter().all(Option::is_none) {
            return Ok(self.new_sequence(tokens));
        }
        let n = self.lock().layers.len();
        if windows.len() != n {
            return Err(EngineError::Invalid(format!("{} cache layouts for a pool of {n} layers", windows.len())));
        }
        if let Some((max_size, keep)) = windows.iter().flatten().find(|(m, k)| *m <= 0 || *k < 0 || k >= m) {
            return Err(EngineError::Invalid(format!(
                "a rotating KV cache of {max_size} positions cannot keep its first {keep}: the window must be larger"
            )));
        }
        let mut full: Option<Rc<SeqHandle>> = None;
        let mut rings: BTreeMap<(i32, i32), Rc<RingHandle>> = BTreeMap::new();
        let mut caches: Vec<Box<dyn KvCache>> = Vec::with_capacity(n);
        for (layer, w) in windows.iter().enumerate() {
            caches.push(match *w {
                None => {
                    let seq = full.get_or_insert_with(|| {
                        let (seq, _) = self.lock().alloc.allocate(&[]);
                        Rc::new(SeqHandle { pool: self.clone(), seq })
                    });
                    Box::new(PagedCache { seq: seq.clone(), layer, offset: 0 })
                }
                Some((max_size, keep)) => {
                    let ring = rings.entry((max_size, keep)).or_insert_with(|| {
                        let (seq, _) = self.lock().alloc.allocate(&[]);
                        Rc::new(RingHandle { pool: self.clone(), seq, caps: Mutex::new(vec![0; n]) })
                    });
                    Box::new(PagedRingCache { ring: ring.clone(), layer, offset: 0, idx: 0, cap: 0, keep, max_size })
                }
            });
        }
        Ok((caches, 0))
    }
}

impl PagedRingCache {
    fn table(&self, inner: &Inner) -> Result<Vec<BlockId>> {
        let t = inner.alloc.block_table(self.ring.seq).ok_or_else(|| err(AllocError::UnknownSequence(self.ring.seq)))?;
        Ok(t.to_vec())
    }

    /// Makes this layer's buffer `cap` slots: the sequence grows to (or shrinks back to) the blocks
    /// of the largest layer buffer, and this layer's storage holds them. Returns the block table.
    fn resize(&mut self, inner: &mut Inner, cap: i32, keys: &Array, values: &Array) -> Result<Vec<BlockId>> {
        let want = {
            let mut caps = self.ring.caps.lock().unwrap_or_else(|p| p.into_inner());
            caps[self.layer] = cap as usize;
            caps.iter().copied().max().unwrap_or(0)
        };
        let seq = self.ring.seq;
        let held = inner.alloc.seq_len(seq).ok_or_else(|| err(AllocError::UnknownSequence(seq)))?;
        if want > held {
            let copies = inner.alloc.extend(seq, want - held).map_err(err)?;
            inner.apply_copies(&copies)?;
        } else if want < held {
            inner.alloc.truncate(seq, want).map_err(err)?;
        }
        self.cap = cap;
        let table = self.table(inner)?;
        let max_block = table.iter().copied().max().map_or(0, |b| b + 1);
        inner.ensure_storage(self.layer, max_block, keys, values)?;
        Ok(table)
    }

    /// The first `len` buffer slots, (1, kv_heads, len, D) keys and values.
    fn read(&self, inner: &Inner, table: &[BlockId], len: i32) -> Result<(Array, Array)> {
        let used = (len as usize).div_ceil(inner.alloc.block_size());
        PagedCache::gather(inner, &table[..used.min(table.len())], self.layer, len)
    }

    /// Replaces the whole buffer by `k`/`v` (1, kv_heads, S, D).
    fn rewrite(&mut self, inner: &mut Inner, k: &Array, v: &Array) -> Result<Vec<BlockId>> {
        let table = self.resize(inner, k.dim(2), k, v)?;
        inner.write_slots(self.layer, &table, 0, k, v)?;
        Ok(table)
    }

    /// `_update_concat`: several positions at once.
    fn update_concat(&mut self, inner: &mut Inner, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let (k, v) = if self.cap > 0 {
            let table = self.table(inner)?;
            let (k, v) = self.read(inner, &table, self.cap)?;
            let k = temporal_order(&k, self.keep, self.idx, self.offset)?;
            let v = temporal_order(&v, self.keep, self.idx, self.offset)?;
            self.idx = k.dim(2);
            let trim_size = self.idx - self.max_size + 1;
            (trim_buf(&k, trim_size, self.keep, Some(keys))?, trim_buf(&v, trim_size, self.keep, Some(values))?)
        } else {
            (keys.clone(), values.clone())
        };
        self.rewrite(inner, &k, &v)?;
        self.offset += keys.dim(2);
        self.idx = k.dim(2);
        Ok((k, v))
    }

    /// `_update_in_place`: one position, written at the ring index.
    fn update_in_place(&mut self, inner: &mut Inner, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let prev = self.offset;
        let mut table = self.table(inner)?;
        if self.cap == 0 || (prev >= self.cap && self.cap < self.max_size) {
            // Grow by a step of zeroed slots (the rotating cache concatenates zeros).
            let (old, new_size) = (self.cap, STEP.min(self.max_size - prev));
            table = self.resize(inner, old + new_size, keys, values)?;
            let zk = ops::zeros(&[1, keys.dim(1), new_size, keys.dim(3)], keys.dtype())?;
            let zv = ops::zeros(&[1, values.dim(1), new_size, values.dim(3)], values.dtype())?;
            inner.write_slots(self.layer, &table, old, &zk, &zv)?;
            self.idx = prev;
        }
        let trim_size = self.cap - self.max_size;
        if trim_size > 0 {
            // After a multi-position update: back to the window, the oldest positions dropped.
            let (k, v) = self.read(inner, &table, self.cap)?;
            let (k, v) = (trim_buf(&k, trim_size, self.keep, None)?, trim_buf(&v, trim_size, self.keep, None)?);
            table = self.rewrite(inner, &k, &v)?;
            self.idx = self.max_size;
        }
        if self.idx == self.max_size {
            // The ring wraps: the oldest slot after the kept ones is overwritten in its block.
            self.idx = self.keep;
        }
        inner.write_slots(self.layer, &table, self.idx, keys, values)?;
        self.offset += 1;
        self.idx += 1;
        self.read(inner, &table, self.offset.min(self.cap))
    }
}

impl KvCache for PagedRingCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        if keys.dim(0) != 1 {
            return Err(EngineError::Invalid("the paged KV cache holds one sequence per cache (batch size 1)".into()));
        }
        let pool = self.ring.pool.clone();
        let mut guard = pool.lock();
        let inner = &mut *guard;
        inner.fix_capacity(keys, values);
        if keys.dim(2) == 1 {
            self.update_in_place(inner, keys, values)
        } else {
            self.update_concat(inner, keys, values)
        }
    }

    fn window(&self) -> Option<(i32, i32)> {
        Some((self.max_size, self.keep))
    }

    fn is_trimmable(&self) -> bool {
        self.offset < self.max_size
    }

    fn trim(&mut self, n: i32) -> Result<i32> {
        rotating_trim(n, &mut self.offset, &mut self.idx, self.max_size)
    }

    fn make_mask(&self, n: i32, window_size: Option<i32>) -> Result<CacheMask> {
        rotating_mask(n, window_size, self.offset, self.max_size, self.idx)
    }

    fn state(&self) -> Vec<Array> {
        let inner = self.ring.pool.lock();
        inner.layers[self.layer].iter().flat_map(|(k, v)| [k.clone(), v.clone()]).collect()
    }

    /// This layer's buffer blocks' bytes.
    fn nbytes(&self) -> usize {
        let inner = self.ring.pool.lock();
        let blocks = (self.cap as usize).div_ceil(inner.alloc.block_size());
        inner.block_bytes(self.layer) * blocks
    }

    fn to_quantized(&self, _spec: QuantSpec) -> Result<Option<Box<dyn KvCache>>> {
        Err(EngineError::Invalid(
            "a rotating KV cache (--max-kv-size or sliding-window layers) cannot be quantized (--kv-bits), as in mlx-lm".into(),
        ))
    }

    /// Saved as mlx-lm's `RotatingKVCache` (the buffer gathered in slot order).
    fn saved_state(&self) -> Result<(&'static str, Vec<StateNode>)> {
        let inner = self.ring.pool.lock();
        let (keys, values) = if self.cap == 0 || inner.layers[self.layer].is_none() {
            (StateNode::None, StateNode::None)
        } else {
            let (k, v) = self.read(&inner, &self.table(&inner)?, self.cap)?;
            (StateNode::Array(k), StateNode::Array(v))
        };
        let int = |x: i32| StateNode::Int(i64::from(x));
        Ok(("RotatingKVCache", vec![keys, values, int(self.offset), int(self.keep), int(self.max_size), int(self.idx)]))
    }
}
