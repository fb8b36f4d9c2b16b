//! Prompt-cache files in mlx-lm's `save_prompt_cache` / `load_prompt_cache` format: safetensors
//! whose tensors are the flattened cache states (`"{layer}.{i}[.{j}]"`, scalars as 0-d int32,
//! `None` as an empty array) and whose metadata is the flattened `[metadata, classes, scalars]`.
use super::{ArraysCache, ChunkedCache, GrowingCache, KvCache, ListCache, QuantTriple, QuantizedCache, RotatingCache, StateNode};
use crate::error::{EngineError, Result};
use mlx::ops::QuantSpec;
use mlx::Array;
use std::collections::HashMap;
use std::path::Path;

/// A loaded prompt cache: one cache per layer and the user metadata (`model`, `tokenizer_config`).
pub struct PromptCacheFile {
    pub cache: Vec<Box<dyn KvCache>>,
    pub metadata: Vec<(String, String)>,
}

impl PromptCacheFile {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

fn flatten(prefix: String, node: &StateNode, tensors: &mut Vec<(String, Array)>, scalars: &mut Vec<(String, &'static str)>) -> Result<()> {
    match node {
        StateNode::Array(a) => tensors.push((prefix, a.clone())),
        StateNode::Int(x) => {
            let v = i32::try_from(*x).map_err(|_| EngineError::Invalid(format!("cache scalar {x} does not fit int32")))?;
            tensors.push((prefix.clone(), Array::from_slice(&[v], &[])?));
            scalars.push((prefix, "scalar"));
        }
        StateNode::Str(text) => {
            let codes: Vec<i32> = text.chars().map(|c| c as i32).collect();
            tensors.push((prefix.clone(), Array::from_slice(&codes, &[codes.len() as i32])?));
            scalars.push((prefix, "string"));
        }
        StateNode::None => {
            tensors.push((prefix.clone(), Array::from_slice::<f32>(&[], &[0])?));
            scalars.push((prefix, "none"));
        }
        StateNode::List(items) => {
            for (i, n) in items.iter().enumerate() {
                flatten(format!("{prefix}.{i}"), n, tensors, scalars)?;
            }
        }
    }
    Ok(())
}

/// Writes `cache` (one per layer) and `metadata` as mlx-lm's `save_prompt_cache` does.
pub fn save_prompt_cache(path: &Path, cache: &[Box<dyn KvCache>], metadata: &[(String, String)]) -> Result<()> {
    let (mut tensors, mut scalars, mut classes) = (Vec::new(), Vec::new(), Vec::new());
    for (i, c) in cache.iter().enumerate() {
        let (class, nodes) = c.saved_state()?;
        classes.push(class);
        flatten(i.to_string(), &StateNode::List(nodes), &mut tensors, &mut scalars)?;
    }
    let mut meta: Vec<(String, String)> = metadata.iter().map(|(k, v)| (format!("0.{k}"), v.clone())).collect();
    meta.extend(classes.iter().enumerate().map(|(i, c)| (format!("1.{i}"), (*c).to_owned())));
    meta.push(("2.0".into(), String::new()));
    for (j, (p, t)) in scalars.iter().enumerate() {
        meta.push((format!("2.{}.0", j + 1), p.clone()));
        meta.push((format!("2.{}.1", j + 1), (*t).to_owned()));
    }
    let t: Vec<(&str, &Array)> = tensors.iter().map(|(n, a)| (n.as_str(), a)).collect();
    let m: Vec<(&str, &str)> = meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    mlx::io::save_safetensors(path, &t, &m)?;
    Ok(())
}

struct Reader {
    tensors: HashMap<String, Array>,
    kinds: HashMap<String, String>,
}

impl Reader {
    fn bad(what: &str) -> EngineError {
        EngineError::Invalid(format!("prompt-cache file: {what}"))
    }

    fn array(&self, name: &str) -> Result<Option<Array>> {
        if self.kinds.get(name).map(String::as_str) == Some("none") {
            return Ok(None);
        }
        self.tensors.get(name).cloned().map(Some).ok_or_else(|| Self::bad(&format!("no tensor {name}")))
    }

    fn int(&self, name: &str) -> Result<i32> {
        let a = self.tensors.get(name).ok_or_else(|| Self::bad(&format!("no scalar {name}")))?;
        Ok(a.item::<i32>()?)
    }

    /// A "string" scalar: its character codes.
    fn string(&self, name: &str) -> Result<String> {
        let a = self.tensors.get(name).ok_or_else(|| Self::bad(&format!("no string {name}")))?;
        a.to_vec::<i32>()?.into_iter().map(|c| char::from_u32(c as u32).ok_or_else(|| Self::bad(&format!("{name} is not text")))).collect()
    }

    /// The cache of mlx-lm class `class` whose state is under `prefix`.
    fn cache(&self, class: &str, prefix: &str) -> Result<Box<dyn KvCache>> {
        let p = |j: usize| format!("{prefix}.{j}");
        Ok(match class {
            "KVCache" => Box::new(GrowingCache::from_state(self.array(&p(0))?, self.array(&p(1))?, self.int(&p(2))?)?),
            "RotatingKVCache" => Box::new(RotatingCache::from_state(
                self.array(&p(0))?,
                self.array(&p(1))?,
                self.int(&p(2))?,
                self.int(&p(3))?,
                self.int(&p(4))?,
                self.int(&p(5))?,
            )?),
            "ChunkedKVCache" => Box::new(ChunkedCache::from_state(
                self.array(&p(0))?,
                self.array(&p(1))?,
                self.int(&p(2))?,
                self.int(&p(3))?,
                self.int(&p(4))?,
            )?),
            "QuantizedKVCache" => {
                let spec = QuantSpec::affine(self.int(&p(3))?, self.int(&p(4))?);
                Box::new(QuantizedCache::from_state(self.triple(&p(0))?, self.triple(&p(1))?, self.int(&p(2))?, spec)?)
            }
            "ArraysCache" => {
                let slot = |j: usize| format!("{prefix}.0.{j}");
                let n = (0..).take_while(|j| self.tensors.contains_key(&slot(*j))).count();
                let slots = (0..n).map(|j| self.array(&slot(j))).collect::<Result<Vec<_>>>()?;
                Box::new(ArraysCache::from_state(slots, 0))
            }
            // [(part state, part class), ...]
            "CacheList" => {
                let mut parts = Vec::new();
                while self.tensors.contains_key(&format!("{}.1", p(parts.len()))) {
                    let part = p(parts.len());
                    parts.push(self.cache(&self.string(&format!("{part}.1"))?, &format!("{part}.0"))?);
                }
                Box::new(ListCache::new(parts)?)
            }
            other => return Err(Self::bad(&format!("cache class {other} is not supported"))),
        })
    }

    fn triple(&self, name: &str) -> Result<Option<QuantTriple>> {
        if self.kinds.get(name).map(String::as_str) == Some("none") {
            return Ok(None);
        }
        let get = |j: usize| self.array(&format!("{name}.{j}"))?.ok_or_else(|| Self::bad(&format!("{name}.{j} is None")));
        Ok(Some([get(0)?, get(1)?, get(2)?]))
    }
}

/// Reads a file written by mlx-lm's `save_prompt_cache` (or ours).
pub fn load_prompt_cache(path: &Path) -> Result<PromptCacheFile> {
    let st = mlx::io::load_safetensors(path)?;
    let mut classes: Vec<(usize, String)> = Vec::new();
    let mut metadata = Vec::new();
    let mut scalar_paths: HashMap<String, String> = HashMap::new();
    let mut scalar_kinds: HashMap<String, String> = HashMap::new();
    for (k, v) in &st.metadata {
        if let Some(key) = k.strip_prefix("0.") {
            metadata.push((key.to_owned(), v.clone()));
        } else if let Some(i) = k.strip_prefix("1.") {
            let i = i.parse().map_err(|_| Reader::bad(&format!("bad class key {k}")))?;
            classes.push((i, v.clone()));
        } else if let Some(rest) = k.strip_prefix("2.") {
            if let Some(j) = rest.strip_suffix(".0") {
                scalar_paths.insert(j.to_owned(), v.clone());
            } else if let Some(j) = rest.strip_suffix(".1") {
                scalar_kinds.insert(j.to_owned(), v.clone());
            }
        }
    }
    classes.sort_by_key(|(i, _)| *i);
    if classes.is_empty() || classes.iter().enumerate().any(|(n, (i, _))| n != *i) {
        return Err(Reader::bad("no cache classes in its metadata (not written by save_prompt_cache?)"));
    }
    let kinds = scalar_paths.iter().filter_map(|(j, p)| scalar_kinds.get(j).map(|t| (p.clone(), t.clone()))).collect();
    let r = Reader { tensors: st.tensors.into_iter().collect(), kinds };
    let mut cache: Vec<Box<dyn KvCache>> = classes.iter().map(|(i, class)| r.cache(class, &i.to_string())).collect::<Result<_>>()?;
    // mlx-lm's ArraysCache keeps no position count: the positions are those of the model's KV caches.
    let offset = cache.iter().find(|c| c.as_arrays().is_none()).map_or(0, |c| c.offset());
    for c in cache.iter_mut() {
        if let Some(a) = c.as_arrays_mut() {
            a.set_offset(offset);
        }
    }
    Ok(PromptCacheFile { cache, metadata })
}
