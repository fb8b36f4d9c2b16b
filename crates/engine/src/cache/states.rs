//! The prefix cache of batched serving for models with recurrent layers (qwen3_next, qwen3_5): a
//! recurrent state holds no positions, so it cannot be cut back to a shared prefix as keys and
//! values can. Instead a prompt's prefill stops at every block boundary and leaves a snapshot of
//! the whole sequence's caches there (each KV layer's filled keys and values, each recurrent
//! layer's state); a later prompt starts from the longest snapshot whose tokens it begins with.
//! Snapshots share the arrays of the caches they come from; the least recently used go first
//! once their bytes pass the budget.
use super::{ArraysCache, Caches, GrowingCache, KvCache, StateNode};
use crate::error::{EngineError, Result};
use mlx::Array;

/// One layer's cache at a block boundary.
enum Layer {
    /// Keys and values (1, kv_heads, n, D).
    Kv(Array, Array),
    State(ArraysCache),
}

struct Entry {
    tokens: Vec<u32>,
    layers: Vec<Layer>,
    bytes: usize,
    last_use: u64,
}

pub struct StatePrefixCache {
    block: usize,
    budget: usize,
    entries: Vec<Entry>,
    clock: u64,
}

impl StatePrefixCache {
    /// Snapshots every `block` positions, at most `budget` bytes of them.
    pub fn new(block: usize, budget: usize) -> StatePrefixCache {
        StatePrefixCache { block: block.max(1), budget, entries: Vec::new(), clock: 0 }
    }

    pub fn block_size(&self) -> usize {
        self.block
    }

    /// Keeps `cache` (one sequence, holding exactly `tokens`) as it is now.
    pub fn store(&mut self, tokens: &[u32], cache: &[Box<dyn KvCache>]) -> Result<()> {
        if tokens.is_empty() || self.entries.iter().any(|e| e.tokens == tokens) {
            return Ok(());
        }
        let mut layers = Vec::with_capacity(cache.len());
        let mut bytes = 0;
        for c in cache {
            let layer = match c.as_arrays() {
                Some(a) => Layer::State(a.clone()),
                None => match c.saved_state()?.1.as_slice() {
                    [StateNode::Array(k), StateNode::Array(v), StateNode::Int(n), ..] if *n as usize == tokens.len() => {
                        let n = *n as i32;
                        Layer::Kv(k.slice_axis(2, 0, n)?, v.slice_axis(2, 0, n)?)
                    }
                    _ => return Err(EngineError::Invalid("a prefix snapshot of a cache that is not a plain KV cache".into())),
                },
            };
            bytes += match &layer {
                Layer::Kv(k, v) => k.nbytes() + v.nbytes(),
                Layer::State(a) => a.nbytes(),
            };
            layers.push(layer);
        }
        self.clock += 1;
        self.entries.push(Entry { tokens: tokens.to_vec(), layers, bytes, last_use: self.clock });
        while self.entries.iter().map(|e| e.bytes).sum::<usize>() > self.budget {
            let Some(oldest) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.last_use).map(|(i, _)| i) else { break };
            self.entries.swap_remove(oldest);
        }
        Ok(())
    }

    /// The longest snapshot that `prompt` begins with (at most `prompt.len() - 1` positions: the
    /// last one gives the first token's logits), as fresh caches of one sequence.
    pub fn lookup(&mut self, prompt: &[u32]) -> Result<Option<(usize, Caches)>> {
        let best = self
            .entries
            .iter_mut()
            .filter(|e| e.tokens.len() < prompt.len() && prompt.starts_with(&e.tokens))
            .max_by_key(|e| e.tokens.len());
        let Some(e) = best else { return Ok(None) };
        self.clock += 1;
        e.last_use = self.clock;
        let n = e.tokens.len();
        let caches = e
            .layers
            .iter()
            .map(|l| {
                Ok(match l {
                    Layer::Kv(k, v) => Box::new(GrowingCache::from_state(Some(k.clone()), Some(v.clone()), n as i32)?) as Box<dyn KvCache>,
                    Layer::State(a) => Box::new(a.clone()) as Box<dyn KvCache>,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some((n, caches)))
    }
}
