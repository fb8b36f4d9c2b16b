//! Checkpoint tensors by name: safetensors files (sharded via `model.safetensors.index.json`),
//! prefix views so a layer loads itself, and a strict `finish` naming every unused tensor.
//!
//! This crate owns reading a model folder's weights into a strict weight map and nothing else: it
//! never builds or runs a model (the engine does), never downloads or imports other formats (the
//! `formats` crate does). Its only MLX use is reading safetensors into arrays: memory-mapped, each
//! tensor used in place by MLX where the backend can (see [`safetensors`]).
#![forbid(unsafe_code)]
pub mod safetensors;

pub use safetensors::LoadStats;
use mlx::Array;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// What can be wrong with a checkpoint, each naming the file or tensor at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("tensor {0} is missing from the checkpoint")]
    MissingTensor(String),
    #[error("the checkpoint has tensors the model does not use: {0}")]
    UnusedTensors(String),
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    Shape { name: String, found: Vec<i32>, expected: Vec<i32> },
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    pub fn file(path: impl Into<PathBuf>, message: impl std::fmt::Display) -> Self {
        Error::File { path: path.into(), message: message.to_string() }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// All tensors of a checkpoint not yet taken by the model, and the names of those taken. A taken
/// tensor leaves the map, so that a layer which transforms its weights at load (fusing, say) can
/// free the originals at once rather than when loading ends.
pub struct Weights {
    tensors: RefCell<HashMap<String, Array>>,
    taken: RefCell<BTreeSet<String>>,
    /// A pipeline stage's layers: the only ones the model loads (see [`Weights::keep_layers`]).
    layers: Option<Range<i32>>,
    /// How the files' tensors reached MLX (zero for a map built in memory).
    stats: LoadStats,
}

impl Weights {
    pub fn from_map(tensors: HashMap<String, Array>) -> Self {
        Weights { tensors: RefCell::new(tensors), taken: RefCell::new(BTreeSet::new()), layers: None, stats: LoadStats::default() }
    }

    /// The tensors not taken yet, by name (for `convert`, after an architecture's `sanitize`).
    pub fn into_map(self) -> HashMap<String, Array> {
        self.tensors.into_inner()
    }

    /// Restricts loading to the layers `keep` of a model of `total` layers (a pipeline stage): the
    /// tensors of its other layers (named `...layers.N....`, as mlx-lm matches them, N < `total`)
    /// leave the checkpoint unread, so that strict loading accepts them while still naming any
    /// tensor that belongs to no layer of the model. MLX reads a safetensors tensor only when it is
    /// evaluated, so a dropped tensor is never read from the file.
    pub fn keep_layers(&mut self, keep: Range<i32>, total: i32) {
        self.tensors.get_mut().retain(|name, _| match layer_of(name) {
            Some(n) if n < i64::from(total) => n >= i64::from(keep.start) && n < i64::from(keep.end),
            _ => true,
        });
        self.layers = Some(keep);
    }

    /// Whether the model loads layer `i` (every layer unless [`Weights::keep_layers`] was called).
    pub fn loads_layer(&self, i: i32) -> bool {
        self.layers.as_ref().is_none_or(|r| r.contains(&i))
    }

    /// The index of the first layer the model loads.
    pub fn first_layer(&self) -> i32 {
        self.layers.as_ref().map_or(0, |r| r.start)
    }

    /// Maps `model*.safetensors` in `dir` (the files an index names, or all that match); every
    /// header is checked against its file before any tensor is made.
    pub fn load_dir(dir: &Path) -> Result<Weights> {
        let mut tensors = HashMap::new();
        let mut stats = LoadStats::default();
        for file in weight_files(dir)? {
            let loaded = safetensors::load(&file)?;
            stats.add(loaded.stats);
            for (name, a) in loaded.tensors {
                tensors.insert(name, a);
            }
        }
        Ok(Weights { stats, ..Weights::from_map(tensors) })
    }

    /// How the checkpoint's tensors reached MLX: bytes, in place and copied.
    pub fn load_stats(&self) -> LoadStats {
        self.stats
    }

    /// Drops tensors the architecture knows it does not need (mlx-lm's `sanitize`).
    pub fn drop_where(&mut self, unwanted: impl Fn(&str) -> bool) {
        self.tensors.get_mut().retain(|name, _| !unwanted(name));
    }

    /// Whether the checkpoint has (or had, before the model took it) this tensor.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.borrow().contains_key(name) || self.taken.borrow().contains(name)
    }

    /// The names of the tensors not taken yet, sorted (for `sanitize` passes over the checkpoint).
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.tensors.borrow().keys().cloned().collect();
        v.sort_unstable();
        v
    }

    /// The shape of a tensor not taken yet.
    pub fn shape(&self, name: &str) -> Option<Vec<i32>> {
        self.tensors.borrow().get(name).map(Array::shape)
    }

    /// The dtype of a tensor not taken yet.
    pub fn dtype(&self, name: &str) -> Option<mlx::Dtype> {
        self.tensors.borrow().get(name).map(Array::dtype)
    }

    /// Takes a tensor out of the checkpoint (for `sanitize` rewrites such as stacking experts).
    pub fn remove(&mut self, name: &str) -> Option<Array> {
        self.tensors.get_mut().remove(name)
    }

    /// Adds a tensor made by a `sanitize` rewrite.
    pub fn insert(&mut self, name: String, a: Array) {
        self.tensors.get_mut().insert(name, a);
    }

    /// Takes a tensor, checking its shape where one is expected.
    pub fn get(&self, name: &str, expected: Option<&[i32]>) -> Result<Array> {
        let mut tensors = self.tensors.borrow_mut();
        let a = tensors.get(name).ok_or_else(|| {
            if self.taken.borrow().contains(name) {
                Error::Invalid(format!("tensor {name} is used twice by the model"))
            } else {
                Error::MissingTensor(name.to_owned())
            }
        })?;
        if let Some(shape) = expected {
            let found = a.shape();
            if found != shape {
                return Err(Error::Shape { name: name.to_owned(), found, expected: shape.to_vec() });
            }
        }
        self.taken.borrow_mut().insert(name.to_owned());
        Ok(tensors.remove(name).expect("present: checked above"))
    }

    pub fn view(&self, prefix: &str) -> Vb<'_> {
        Vb { w: self, prefix: prefix.to_owned() }
    }

    /// Fails, naming them, if any tensor was never taken.
    pub fn finish(&self) -> Result<()> {
        let tensors = self.tensors.borrow();
        let unused: BTreeSet<&String> = tensors.keys().collect();
        if unused.is_empty() {
            return Ok(());
        }
        let list: Vec<&str> = unused.iter().take(10).map(|s| s.as_str()).collect();
        let more = if unused.len() > 10 { format!(" and {} more", unused.len() - 10) } else { String::new() };
        Err(Error::UnusedTensors(format!("{}{more}", list.join(", "))))
    }
}

/// A view of the weights under one prefix, e.g. `model.layers.3`.
#[derive(Clone)]
pub struct Vb<'a> {
    w: &'a Weights,
    prefix: String,
}

impl<'a> Vb<'a> {
    pub fn pp(&self, name: impl std::fmt::Display) -> Vb<'a> {
        let prefix = if self.prefix.is_empty() { name.to_string() } else { format!("{}.{name}", self.prefix) };
        Vb { w: self.w, prefix }
    }

    /// The full name of `name` under this prefix (or the prefix itself when `name` is empty).
    pub fn path(&self, name: &str) -> String {
        match (self.prefix.is_empty(), name.is_empty()) {
            (true, _) => name.to_owned(),
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}.{name}", self.prefix),
        }
    }

    pub fn get(&self, name: &str, shape: &[i32]) -> Result<Array> {
        self.w.get(&self.path(name), Some(shape))
    }

    /// The shape of a tensor under this prefix that has not been taken yet.
    pub fn shape(&self, name: &str) -> Option<Vec<i32>> {
        self.w.shape(&self.path(name))
    }

    /// The dtype of a tensor under this prefix that has not been taken yet.
    pub fn dtype(&self, name: &str) -> Option<mlx::Dtype> {
        self.w.dtype(&self.path(name))
    }

    /// A tensor whose shape the caller checks itself.
    pub fn get_any(&self, name: &str) -> Result<Array> {
        self.w.get(&self.path(name), None)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.w.contains(&self.path(name))
    }
}

/// N in a tensor name holding `layers.N.` at its start or after a dot (mlx-lm's
/// `(?:^|\.)layers\.(\d+)\.`).
fn layer_of(name: &str) -> Option<i64> {
    // `rest` always starts the name or follows a dot.
    let mut rest = name;
    loop {
        if let Some(tail) = rest.strip_prefix("layers.") {
            let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
            if digits > 0 && tail.as_bytes().get(digits) == Some(&b'.') {
                return tail[..digits].parse().ok();
            }
        }
        rest = &rest[rest.find('.')? + 1..];
    }
}

/// The safetensors files of a model folder, in a stable order.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = fs::read_to_string(&index).map_err(|e| Error::file(&index, e))?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::file(&index, e))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| Error::file(&index, "no weight_map object"))?;
        let files: BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
        let paths: Vec<PathBuf> = files.into_iter().map(|f| dir.join(f)).collect();
        if let Some(missing) = paths.iter().find(|p| !p.is_file()) {
            return Err(Error::file(missing, "named by model.safetensors.index.json but missing"));
        }
        return Ok(paths);
    }
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| Error::file(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            name.starts_with("model") && name.ends_with(".safetensors")
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::file(dir, "no model*.safetensors weights in this folder"));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_layers_drops_only_other_layers_of_the_model() {
        let a = || Array::from_slice(&[0.0f32], &[1]).unwrap();
        let names = ["model.layers.0.mlp.w", "model.layers.1.mlp.w", "model.layers.2.mlp.w", "model.layers.61.x", "model.norm.weight", "model.xlayers.0.y"];
        let mut w = Weights::from_map(names.iter().map(|n| (n.to_string(), a())).collect());
        w.keep_layers(1..2, 3);
        let mut left: Vec<String> = w.tensors.borrow().keys().cloned().collect();
        left.sort();
        // Layer 61 is past the model's 3 layers (a multi-token-prediction layer): not ours to drop.
        assert_eq!(left, ["model.layers.1.mlp.w", "model.layers.61.x", "model.norm.weight", "model.xlayers.0.y"]);
        assert!(w.loads_layer(1) && !w.loads_layer(0) && !w.loads_layer(2));
        assert_eq!(w.first_layer(), 1);
        assert_eq!(layer_of("layers.12.a"), Some(12));
        assert_eq!(layer_of("model.layers.x.a"), None);
        assert_eq!(layer_of("model.layers.3"), None);
    }
}
