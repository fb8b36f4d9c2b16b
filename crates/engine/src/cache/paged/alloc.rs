//! Block accounting of the paged KV cache, without any arrays: a fixed number of blocks, block
//! tables per sequence, reference counts, prefix sharing of full blocks, copy-on-write, and
//! least-recently-used eviction of cached blocks no sequence holds.
//!
//! A full block is found by a chained hash of its tokens but shared only after its own tokens and
//! its parent (the block before it, in the generation it had when this one was registered) are
//! checked equal: two different prompts never share keys and values, even when their hashes
//! collide.
use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

pub type BlockId = usize;
pub type SeqId = usize;

/// Why an allocation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocError {
    /// Every block is held by a sequence: the byte budget is spent.
    OutOfBlocks,
    UnknownSequence(SeqId),
}

impl std::fmt::Display for AllocError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AllocError::OutOfBlocks => f.write_str("the paged KV cache is full (every block is in use; raise its byte budget)"),
            AllocError::UnknownSequence(s) => write!(f, "no sequence {s} in the paged KV cache"),
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Seq {
    blocks: Vec<BlockId>,
    /// Positions held.
    len: usize,
    /// Known token ids of the first positions (for prefix hashing); may be shorter than `len`.
    tokens: Vec<u32>,
}

#[derive(Clone, Debug, Default)]
struct Block {
    refs: usize,
    /// The prefix hash under which this full block is registered.
    hash: Option<u64>,
    /// LRU stamp while cached and unreferenced.
    stamp: Option<u64>,
    /// While registered: the tokens of its positions.
    tokens: Vec<u32>,
    /// While registered: the block before it and that block's generation then (`None`: the first).
    parent: Option<(BlockId, u64)>,
    /// Changes whenever the block's contents stop being the ones registered (reused, rewritten).
    generation: u64,
}

/// The allocator: blocks `0..capacity`, handed out lowest-fresh-first so storage can grow lazily.
#[derive(Debug)]
pub struct BlockAllocator {
    block_size: usize,
    capacity: usize,
    blocks: Vec<Block>,
    free: Vec<BlockId>,
    /// Unreferenced registered blocks by LRU stamp.
    lru: BTreeMap<u64, BlockId>,
    by_hash: HashMap<u64, BlockId>,
    seqs: HashMap<SeqId, Seq>,
    next_seq: SeqId,
    clock: u64,
    /// The last generation handed out (see [`Block::generation`]).
    generations: u64,
    /// The prefix hash of a block's tokens after its parent's hash.
    hash: fn(u64, &[u32]) -> u64,
}

/// A block that must be copied before writing (copy-on-write): copy `src` into `dst`.
pub type Copy = (BlockId, BlockId);

fn chain(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl BlockAllocator {
    pub fn new(block_size: usize, capacity: usize) -> Self {
        assert!(block_size > 0, "block size must be positive");
        BlockAllocator {
            block_size,
            capacity,
            blocks: Vec::new(),
            free: Vec::new(),
            lru: BTreeMap::new(),
            by_hash: HashMap::new(),
            seqs: HashMap::new(),
            next_seq: 0,
            clock: 0,
            generations: 0,
            hash: chain,
        }
    }

    /// An allocator whose prefix hash is `hash` (tests force collisions with it).
    #[cfg(test)]
    pub(crate) fn with_hash(block_size: usize, capacity: usize, hash: fn(u64, &[u32]) -> u64) -> Self {
        BlockAllocator { hash, ..BlockAllocator::new(block_size, capacity) }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sets the number of blocks (not below those already handed out).
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(self.blocks.len());
    }

    /// Blocks ever handed out (the storage that must exist: ids below this).
    pub fn high_water(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks held by at least one sequence.
    pub fn used_blocks(&self) -> usize {
        self.blocks.iter().filter(|b| b.refs > 0).count()
    }

    /// Unreferenced blocks kept for prefix reuse.
    pub fn cached_blocks(&self) -> usize {
        self.lru.len()
    }

    pub fn num_sequences(&self) -> usize {
        self.seqs.len()
    }

    pub fn block_table(&self, seq: SeqId) -> Option<&[BlockId]> {
        self.seqs.get(&seq).map(|s| s.blocks.as_slice())
    }

    pub fn seq_len(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.len)
    }

    fn take_block(&mut self) -> Result<BlockId, AllocError> {
        let id = if let Some(id) = self.free.pop() {
            id
        } else if self.blocks.len() < self.capacity {
            self.blocks.push(Block::default());
            self.blocks.len() - 1
        } else if let Some((&stamp, &id)) = self.lru.iter().next() {
            self.lru.remove(&stamp);
            self.unregister(id);
            id
        } else {
            return Err(AllocError::OutOfBlocks);
        };
        self.generations += 1;
        self.blocks[id] = Block { refs: 1, generation: self.generations, ..Block::default() };
        Ok(id)
    }

    /// Takes block `id` out of the prefix index; blocks registered after it stop matching.
    fn unregister(&mut self, id: BlockId) {
        let b = &mut self.blocks[id];
        if let Some(h) = b.hash.take() {
            self.by_hash.remove(&h);
        }
        b.tokens.clear();
        b.parent = None;
        self.generations += 1;
        b.generation = self.generations;
    }

    /// The registered block for the `i`-th full block `tokens` of a prompt whose blocks before it
    /// are `before`: found by hash `h`, taken only if its tokens and parent are those.
    fn matching(&self, h: u64, tokens: &[u32], before: Option<BlockId>) -> Option<BlockId> {
        let &id = self.by_hash.get(&h)?;
        let b = &self.blocks[id];
        let parent = before.map(|p| (p, self.blocks[p].generation));
        (b.tokens == tokens && b.parent == parent).then_some(id)
    }

    fn retain(&mut self, id: BlockId) {
        let b = &mut self.blocks[id];
        if let Some(stamp) = b.stamp.take() {
            self.lru.remove(&stamp);
        }
        b.refs += 1;
    }

    fn release(&mut self, id: BlockId) {
        let b = &mut self.blocks[id];
        b.refs -= 1;
        if b.refs == 0 {
            if b.hash.is_some() {
                self.clock += 1;
                b.stamp = Some(self.clock);
                self.lru.insert(self.clock, id);
            } else {
                self.free.push(id);
            }
        }
    }

    /// Prefix hashes of the full blocks of `tokens`.
    fn hashes(&self, tokens: &[u32]) -> Vec<u64> {
        let mut parent = 0u64;
        tokens
            .chunks_exact(self.block_size)
            .map(|c| {
                parent = (self.hash)(parent, c);
                parent
            })
            .collect()
    }

    /// A new sequence whose prompt is `tokens`: full blocks already cached under the same prefix are
    /// shared. Returns the sequence and how many leading positions it already holds (at most
    /// `tokens.len() - 1`, so that one token is left to compute).
    pub fn allocate(&mut self, tokens: &[u32]) -> (SeqId, usize) {
        let usable = tokens.len().saturating_sub(1) / self.block_size;
        let mut seq = Seq { tokens: tokens.to_vec(), ..Seq::default() };
        for (h, chunk) in self.hashes(tokens).into_iter().zip(tokens.chunks_exact(self.block_size)).take(usable) {
            let Some(id) = self.matching(h, chunk, seq.blocks.last().copied()) else { break };
            self.retain(id);
            seq.blocks.push(id);
        }
        seq.len = seq.blocks.len() * self.block_size;
        let (id, len) = (self.next_seq, seq.len);
        self.next_seq += 1;
        self.seqs.insert(id, seq);
        (id, len)
    }

    /// Makes room for `n` more positions of `seq`, returning the copies to make first (shared
    /// blocks about to be written). Full blocks whose tokens are known get registered for sharing.
    pub fn extend(&mut self, seq: SeqId, n: usize) -> Result<Vec<Copy>, AllocError> {
        let mut s = self.seqs.remove(&seq).ok_or(AllocError::UnknownSequence(seq))?;
        let r = self.extend_seq(&mut s, n);
        self.seqs.insert(seq, s);
        r
    }

    fn extend_seq(&mut self, s: &mut Seq, n: usize) -> Result<Vec<Copy>, AllocError> {
        let bs = self.block_size;
        let mut copies = Vec::new();
        if n == 0 {
            return Ok(copies);
        }
        // The partly filled last block is written: copy it if shared, unregister it if cached.
        if !s.len.is_multiple_of(bs) {
            let last = s.blocks.len() - 1;
            let id = s.blocks[last];
            if self.blocks[id].refs > 1 {
                let new = self.take_block()?;
                self.release(id);
                s.blocks[last] = new;
                copies.push((id, new));
            } else if self.blocks[id].hash.is_some() {
                self.unregister(id);
            }
        }
        let need = (s.len + n).div_ceil(bs);
        while s.blocks.len() < need {
            match self.take_block() {
                Ok(id) => s.blocks.push(id),
                Err(e) => {
                    while s.blocks.len() > s.len.div_ceil(bs) {
                        if let Some(id) = s.blocks.pop() {
                            self.release(id);
                        }
                    }
                    return Err(e);
                }
            }
        }
        let before = s.len / bs;
        s.len += n;
        let known = s.tokens.len().min(s.len) / bs;
        if known > before {
            let hashes = self.hashes(&s.tokens[..known * bs]);
            for (i, &h) in hashes.iter().enumerate().skip(before) {
                let id = s.blocks[i];
                if self.blocks[id].hash.is_none() && !self.by_hash.contains_key(&h) {
                    let parent = i.checked_sub(1).map(|p| (s.blocks[p], self.blocks[s.blocks[p]].generation));
                    let b = &mut self.blocks[id];
                    b.hash = Some(h);
                    b.tokens = s.tokens[i * bs..(i + 1) * bs].to_vec();
                    b.parent = parent;
                    self.by_hash.insert(h, id);
                }
            }
        }
        Ok(copies)
    }

    /// Records known token ids of `seq` (generated ones), for later prefix registration.
    pub fn push_tokens(&mut self, seq: SeqId, tokens: &[u32]) {
        if let Some(s) = self.seqs.get_mut(&seq) {
            s.tokens.extend_from_slice(tokens);
        }
    }

    /// A new sequence sharing all of `seq`'s blocks (the last, partial one is copied on write).
    pub fn fork(&mut self, seq: SeqId) -> Result<SeqId, AllocError> {
        let s = self.seqs.get(&seq).cloned().ok_or(AllocError::UnknownSequence(seq))?;
        for &id in &s.blocks {
            self.retain(id);
        }
        let id = self.next_seq;
        self.next_seq += 1;
        self.seqs.insert(id, s);
        Ok(id)
    }

    /// Shortens `seq` to `len` positions, releasing the blocks past it.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), AllocError> {
        let mut s = self.seqs.remove(&seq).ok_or(AllocError::UnknownSequence(seq))?;
        if len < s.len {
            let keep = len.div_ceil(self.block_size);
            for id in s.blocks.drain(keep..).collect::<Vec<_>>() {
                self.release(id);
            }
            s.len = len;
            s.tokens.truncate(len);
        }
        self.seqs.insert(seq, s);
        Ok(())
    }

    /// Ends `seq`: its blocks are released (registered full ones stay cached for reuse).
    pub fn free(&mut self, seq: SeqId) -> Result<(), AllocError> {
        let s = self.seqs.remove(&seq).ok_or(AllocError::UnknownSequence(seq))?;
        for id in s.blocks {
            self.release(id);
        }
        Ok(())
    }

    /// Drops every cached unreferenced block.
    pub fn clear_cached(&mut self) {
        for (_, id) in std::mem::take(&mut self.lru) {
            self.unregister(id);
            self.blocks[id].stamp = None;
            self.free.push(id);
        }
    }

    /// Checks the bookkeeping: reference counts equal table entries, every block is exactly one of
    /// used, cached or free, and the hash index points at registered blocks.
    pub fn check(&self) -> Result<(), String> {
        let mut refs = vec![0usize; self.blocks.len()];
        for s in self.seqs.values() {
            if s.blocks.len() != s.len.div_ceil(self.block_size) {
                return Err(format!("a sequence of {} positions holds {} blocks", s.len, s.blocks.len()));
            }
            for &b in &s.blocks {
                refs[b] += 1;
            }
        }
        for (i, b) in self.blocks.iter().enumerate() {
            if b.refs != refs[i] {
                return Err(format!("block {i}: refcount {} but {} references", b.refs, refs[i]));
            }
            let in_free = self.free.contains(&i);
            let in_lru = b.stamp.is_some_and(|t| self.lru.get(&t) == Some(&i));
            let states = usize::from(b.refs > 0) + usize::from(in_free) + usize::from(in_lru);
            if states != 1 {
                return Err(format!("block {i} is in {states} states (refs {}, free {in_free}, cached {in_lru})", b.refs));
            }
            if let Some(h) = b.hash {
                if self.by_hash.get(&h) != Some(&i) {
                    return Err(format!("block {i} is registered under a hash that points elsewhere"));
                }
            }
        }
        if self.lru.len() + self.free.len() + refs.iter().filter(|&&r| r > 0).count() != self.blocks.len() {
            return Err("blocks lost".into());
        }
        Ok(())
    }
}
