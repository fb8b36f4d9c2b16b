//! Loading a model folder: config.json, weights, tokenizer and the EOS ids mlx-lm would use.
use crate::error::{EngineError, Result};
use crate::models::{self, Model};
use crate::pipeline::Stage;
use tokenizer::Tokenizer;
use checkpoint::Weights;
use mlx::distributed::Group;
use mlx::Array;
use std::fs;
use std::path::{Path, PathBuf};

/// How a model is split over the ranks of a group, as mlx-lm's `sharded_load` offers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parallel {
    /// Every layer on every rank, each holding a slice of the heads and hidden units.
    Tensor,
    /// Contiguous ranges of layers, one per rank, activations passed along ([`crate::pipeline`]).
    Pipeline,
}

pub struct LoadedModel {
    pub model: Box<dyn Model>,
    /// Shared with the server's handlers, which tokenise prompts off the engine thread.
    pub tokenizer: std::sync::Arc<Tokenizer>,
    /// config's (or generation_config.json's) `eos_token_id`s plus the tokenizer's EOS token.
    pub eos_token_ids: Vec<u32>,
    pub config: serde_json::Value,
    pub path: PathBuf,
    /// How the checkpoint's tensors reached MLX (bytes, in place in the mapped files, copied).
    pub weights: checkpoint::LoadStats,
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = fs::read_to_string(path).map_err(|e| EngineError::file(path, e))?;
    serde_json::from_str(&text).map_err(|e| EngineError::file(path, format!("not valid JSON: {e}")))
}

/// `eos_token_id` as an int or a list of ints.
fn ids_of(v: Option<&serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
        _ => Vec::new(),
    }
}

impl LoadedModel {
    pub fn load(dir: &Path) -> Result<LoadedModel> {
        Self::load_with(dir, None)
    }

    /// Loads the model for tensor parallel over `group` (a group of one loads it whole): every
    /// rank keeps its slice of each attention and MLP projection (see [`crate::shard`]).
    pub fn load_sharded(dir: &Path, group: &Group) -> Result<LoadedModel> {
        Self::load_with(dir, Some((group, Parallel::Tensor)))
    }

    /// Loads this rank's part of the model for `how` over `group` (a group of one loads it whole).
    pub fn load_parallel(dir: &Path, group: &Group, how: Parallel) -> Result<LoadedModel> {
        Self::load_with(dir, Some((group, how)))
    }

    fn load_with(dir: &Path, group: Option<(&Group, Parallel)>) -> Result<LoadedModel> {
        if !dir.is_dir() {
            return Err(EngineError::NoModelDir(dir.to_owned()));
        }
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(EngineError::file(&config_path, "missing: a model folder needs config.json"));
        }
        let mut config = read_json(&config_path)?;
        if !config.is_object() {
            return Err(EngineError::file(&config_path, "not a JSON object"));
        }
        // As mlx-lm: generation_config.json's eos_token_id replaces config.json's.
        let gen_path = dir.join("generation_config.json");
        if gen_path.is_file() {
            if let Ok(gen) = read_json(&gen_path) {
                if let Some(eos) = gen.get("eos_token_id").filter(|v| !v.is_null() && v.as_bool() != Some(false)) {
                    config["eos_token_id"] = eos.clone();
                }
            }
        }
        // The tokenizer on a second thread (it touches no MLX state) while this one maps the
        // weights: each takes a few hundred milliseconds on a real model when the weights must be
        // read. The tokenizer's error first: it is the common one.
        let started = std::time::Instant::now();
        let (tokenizer, weights) = std::thread::scope(|s| {
            let tokenizer = s.spawn(|| Tokenizer::from_dir(dir));
            let weights = Weights::load_dir(dir);
            (tokenizer.join(), weights)
        });
        let tokenizer = tokenizer.map_err(|_| EngineError::Invalid("the tokenizer's loading thread panicked".into()))??;
        let mut weights = weights?;
        let group = group.filter(|(g, _)| g.size() > 1);
        // A pipeline stage takes only its layers' tensors: the others are never read.
        let stage = match group {
            Some((g, Parallel::Pipeline)) => {
                // The text model's, where a wrapper's config.json has a `text_config` (qwen3_5).
                let layers = config.get("num_hidden_layers").or_else(|| config.get("text_config").and_then(|t| t.get("num_hidden_layers")));
                let total = layers.and_then(|n| n.as_i64()).and_then(|n| i32::try_from(n).ok());
                let total = total.ok_or_else(|| EngineError::Config("pipeline parallel needs num_hidden_layers".into()))?;
                let stage = Stage::new(g, total)?;
                weights.keep_layers(stage.layers(), total);
                Some(stage)
            }
            _ => None,
        };
        let weight_stats = weights.load_stats();
        let mapped = started.elapsed();
        let mut model = models::build(&config, weights)?;
        if let Some(stage) = stage {
            model.pipeline(stage)?;
        }
        // Sharded before the weights are read: only the slices are kept (as mlx-lm's `shard`).
        if let Some((g, Parallel::Tensor)) = group {
            model.shard(g)?;
        }
        // Read every weight now, as mlx-lm's load does, so that load time is load time. A tensor-
        // parallel rank reads each whole tensor to keep its slice: a few at a time, so that the
        // whole ones are freed as it goes and its peak stays near its share, not the whole model.
        let params = model.parameters();
        let built = started.elapsed();
        let batch = if matches!(group, Some((_, Parallel::Tensor))) { 8 } else { params.len().max(1) };
        for chunk in params.chunks(batch) {
            mlx::eval(chunk)?;
        }
        if std::env::var_os("MLX_GEN_TRACE").is_some() {
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            let read = started.elapsed();
            eprintln!(
                "trace: load: tokenizer and weights mapped {:.1} ms, model built {:.1} ms, {} arrays read {:.1} ms ({} tensors in place, {} copied)",
                ms(mapped),
                ms(built - mapped),
                params.len(),
                ms(read - built),
                weight_stats.in_place,
                weight_stats.copied
            );
        }
        // The tokenizer's parse leaves tens of megabytes free in its thread's heap: give them back.
        mlx::runtime::trim_host_heap();
        let mut eos_token_ids = ids_of(config.get("eos_token_id"));
        for id in tokenizer.eos_token_ids() {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        Ok(LoadedModel { model, tokenizer: std::sync::Arc::new(tokenizer), eos_token_ids, config, path: dir.to_owned(), weights: weight_stats })
    }

    /// The last position's logits of one forward pass over `ids` with a fresh cache, as float32.
    pub fn prompt_logits(&self, ids: &[u32]) -> Result<Vec<f32>> {
        if ids.is_empty() {
            return Err(EngineError::Invalid("no tokens".into()));
        }
        let tokens: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
        let x = Array::from_slice(&tokens, &[1, tokens.len() as i32])?;
        let mut cache = self.model.make_cache();
        let logits = self.model.forward(&x, &mut cache)?; // (1, L, vocab)
        let last = logits.slice_axis(1, -1, i32::MAX)?;
        Ok(last.to_vec::<f32>()?)
    }

    pub fn is_eos(&self, token: u32) -> bool {
        self.eos_token_ids.contains(&token)
    }
}
