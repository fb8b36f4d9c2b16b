//! The conversation and its KV cache: each turn re-renders the chat template and prefills only the tokens after the longest common prefix with the cache.
//! A recurrent layer's state cannot be trimmed back to that prefix: for models with one, the states at the end of the
//! last user message are kept, and a turn whose prefix ends before the cache's end starts from them.
use anyhow::{bail, Result};
use engine::cache::{ArraysCache, KvCache};
use tokenizer::ChatMessage;
use engine::LoadedModel;

/// Messages so far, the cache and the token ids it holds.
pub struct Session {
    pub system: Option<String>,
    pub messages: Vec<ChatMessage>,
    cache: Vec<Box<dyn KvCache>>,
    /// The ids whose keys and values are in `cache`, in order.
    cache_ids: Vec<u32>,
    /// `--max-kv-size`: the cache never holds more positions (old turns are dropped first).
    max_kv_size: Option<usize>,
    /// The recurrent layers' states (`None` for the KV layers) after the first `.0` of `cache_ids`.
    snapshot: Option<(usize, Vec<Option<ArraysCache>>)>,
}

/// What a turn must prefill.
pub struct Prepared {
    /// The whole rendered conversation's ids.
    pub ids: Vec<u32>,
    /// How many leading ids are already in the cache.
    pub reused: usize,
    /// The most tokens the answer may have within `--max-kv-size`.
    pub max_tokens: usize,
    /// Old messages dropped to fit `--max-kv-size`.
    pub dropped: usize,
    /// The rendered prompt ends inside an open `<think>` block.
    pub starts_thinking: bool,
    /// Where to keep the recurrent layers' states while prefilling (the end of the last user
    /// message, which the next turn's rendering starts with), for models that have them.
    pub snapshot_at: Option<usize>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Session {
    pub fn new(loaded: &LoadedModel, system: Option<String>, max_kv_size: Option<usize>) -> Session {
        Session { system, messages: Vec::new(), cache: loaded.model.make_cache(), cache_ids: Vec::new(), max_kv_size, snapshot: None }
    }

    /// The conversation with the system message first, as rendered and saved.
    pub fn conversation(&self) -> Vec<ChatMessage> {
        let mut all = Vec::with_capacity(self.messages.len() + 1);
        if let Some(s) = &self.system {
            all.push(ChatMessage::new("system", s.clone()));
        }
        all.extend(self.messages.iter().cloned());
        all
    }

    /// Forgets the conversation (the system message stays) and empties the cache.
    pub fn reset(&mut self, loaded: &LoadedModel) {
        self.messages.clear();
        self.cache = loaded.model.make_cache();
        self.cache_ids.clear();
        self.snapshot = None;
    }

    fn render(&self, loaded: &LoadedModel) -> Result<(Vec<u32>, bool)> {
        let tok = &loaded.tokenizer;
        let text = tok.apply_chat_template(&self.conversation(), true)?;
        let starts_thinking = {
            let t = text.trim_end();
            t.rfind("<think>").is_some_and(|open| t.rfind("</think>").is_none_or(|close| close < open))
        };
        Ok((tok.encode(&text, false)?, starts_thinking))
    }

    /// Adds the user's message, renders the conversation, drops the oldest turns while it does not fit `--max-kv-size`,
    /// and trims the cache back to its longest common prefix with the new ids (one id at least is left to prefill).
    pub fn prepare(&mut self, loaded: &LoadedModel, user: String, max_tokens: usize) -> Result<Prepared> {
        self.messages.push(ChatMessage::new("user", user));
        let mut dropped = 0;
        let (ids, starts_thinking) = loop {
            let (ids, thinking) = self.render(loaded)?;
            let Some(limit) = self.max_kv_size else { break (ids, thinking) };
            // Room for the answer (capped by the limit itself); drop the oldest message otherwise.
            let want = ids.len() + max_tokens.min(limit / 2).max(1);
            if want <= limit || self.messages.len() < 3 {
                if ids.len() >= limit {
                    self.messages.pop();
                    bail!(
                        "the message needs {} tokens with the system prompt, more than --max-kv-size {limit} allows",
                        ids.len()
                    );
                }
                break (ids, thinking);
            }
            self.messages.drain(..2); // the oldest user message and its answer
            dropped += 2;
        };
        let mut reused = common_prefix(&self.cache_ids, &ids).min(ids.len() - 1);
        let offset = self.cache.first().map_or(0, |c| c.offset()) as usize;
        // Start over rather than attend to unknown positions: when the cache does not hold
        // exactly `cache_ids`, or cannot be trimmed back to `reused` (a rotating cache past its
        // window, a chunked one that dropped the front of a chunk the next positions may see).
        let mut ok = offset == self.cache_ids.len();
        if ok && offset > reused {
            // Recurrent states go back to the kept ones, if they are not past the common prefix.
            let back = self.cache.iter().any(|c| c.as_arrays().is_some());
            let mut to = reused;
            if back {
                match self.snapshot.as_ref().filter(|(at, _)| *at <= reused) {
                    Some((at, states)) => {
                        to = *at;
                        ArraysCache::restore(&mut self.cache, states);
                    }
                    None => ok = false,
                }
            }
            for c in &mut self.cache {
                ok &= c.trim(c.offset() - to as i32).is_ok() && c.offset() as usize == to && c.first_position() == 0;
            }
            reused = to;
        }
        if !ok {
            self.cache = loaded.model.make_cache();
            self.snapshot = None;
            reused = 0;
        }
        self.cache_ids.truncate(reused);
        let max_tokens = match self.max_kv_size {
            Some(limit) => max_tokens.min(limit - ids.len()),
            None => max_tokens,
        };
        let snapshot_at = match self.cache.iter().any(|c| c.as_arrays().is_some()) {
            true => {
                let text = loaded.tokenizer.apply_chat_template(&self.conversation(), false)?;
                Some(common_prefix(&loaded.tokenizer.encode(&text, false)?, &ids)).filter(|&at| at > reused && at < ids.len())
            }
            false => None,
        };
        Ok(Prepared { ids, reused, max_tokens, dropped, starts_thinking, snapshot_at })
    }

    /// Keeps the recurrent layers' states of `cache`, which holds the first `at` ids of the turn.
    pub fn keep_snapshot(&mut self, at: usize, cache: &[Box<dyn KvCache>]) {
        self.snapshot = ArraysCache::snapshot(cache).map(|states| (at, states));
    }

    /// Takes the cache for a generator.
    pub fn take_cache(&mut self) -> Vec<Box<dyn KvCache>> {
        std::mem::take(&mut self.cache)
    }

    /// Gives the cache back after a turn whose prompt was `ids` and whose generator handed out `handed` (EOS
    /// included). The generator queues one step ahead, so the cache may hold one more token than the caller
    /// consumed, or one fewer when generation hit its limit: the cache offset tells.
    pub fn restore(&mut self, cache: Vec<Box<dyn KvCache>>, ids: &[u32], handed: &[u32]) {
        self.cache = cache;
        let offset = self.cache.first().map_or(0, |c| c.offset()) as usize;
        let fed = offset.saturating_sub(ids.len()).min(handed.len());
        // A step queued past the last consumed token was fed the last handed token: keep what is known.
        let keep = ids.len() + fed;
        for c in &mut self.cache {
            // Growing caches always trim; a failure shows as a fresh start on the next turn.
            let _ = c.trim(c.offset() - keep as i32);
        }
        self.cache_ids = ids.iter().chain(&handed[..fed]).copied().collect();
    }

    /// Records the assistant's answer (complete or interrupted).
    pub fn answer(&mut self, text: String) {
        self.messages.push(ChatMessage::new("assistant", text));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn common_prefix_stops_at_first_difference() {
        assert_eq!(super::common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(super::common_prefix(&[], &[1]), 0);
        assert_eq!(super::common_prefix(&[1, 2], &[1, 2, 3]), 2);
    }
}
