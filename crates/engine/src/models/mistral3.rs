//! `mistral3` (Mistral Small 3.x, Ministral 3 and Mistral 4 multimodal checkpoints), as mlx-lm's
//! `models/mistral3.py`: the text model of `text_config` (its `model_type` picks it through the
//! registry: `ministral3` or `mistral4`; any other is Llama, as mlx-lm falls back to llama.py)
//! under `language_model.`, the vision tower and projector dropped. mlx-lm's `Model` has no
//! `make_cache`, so the caches are the default ones whatever the text model makes.
use super::{default_caches, Model};
use crate::cache::KvCache;
use crate::error::{EngineError, Result};
use crate::nn::QuantConfig;
use checkpoint::Weights;
use mlx::Array;
use serde_json::Value;
use std::collections::BTreeMap;

/// The text model's config: `text_config`, `tie_word_embeddings` false unless it says otherwise
/// (mistral3.py's `__post_init__`).
fn text_config(config: &Value) -> Result<Value> {
    let mut text = config.get("text_config").filter(|t| t.is_object()).cloned().ok_or_else(|| {
        EngineError::Config("mistral3 needs a text_config object in its config".into())
    })?;
    if text.get("tie_word_embeddings").is_none() {
        text["tie_word_embeddings"] = Value::Bool(false);
    }
    Ok(text)
}

/// mistral3.py's `__post_init__` sets `text_config.tie_word_embeddings` in the config dict itself,
/// so `mlx_lm.convert` saves it: the same for `convert`.
pub fn update_config(config: &mut serde_json::Map<String, Value>) {
    if let Some(Value::Object(text)) = config.get_mut("text_config") {
        text.entry("tie_word_embeddings").or_insert(Value::Bool(false));
    }
}

/// The text model's `model_type` as mistral3.py dispatches on it.
fn text_type(text: &Value) -> &str {
    match text.get("model_type").and_then(Value::as_str) {
        Some(t @ ("ministral3" | "mistral4")) => t,
        _ => "llama",
    }
}

/// The first half of mistral3.py's `sanitize`: no vision weights, and the text model's names
/// without `language_model.` (`model.language_model.X` -> `model.X`).
fn text_weights(weights: &mut BTreeMap<String, Array>) {
    let old = std::mem::take(weights);
    for (key, value) in old {
        if key.contains("vision_tower") || key.contains("multi_modal_projector") {
            continue;
        }
        let key = match key.strip_prefix("model.language_model.") {
            Some(rest) => format!("model.{rest}"),
            None => key.strip_prefix("language_model.").map(str::to_owned).unwrap_or(key),
        };
        weights.insert(key, value);
    }
}

/// mlx-lm's `sanitize` (for `convert`): the text model's tensors renamed, sanitized by the text
/// model's own `sanitize`, and put under `language_model.`.
pub fn sanitize(config: &Value, weights: &mut BTreeMap<String, Array>) -> Result<()> {
    let text = text_config(config)?;
    text_weights(weights);
    match text_type(&text) {
        "ministral3" => super::ministral3::sanitize(&text, weights)?,
        // text_config made sure it is an object.
        t @ ("llama" | "mistral4") => super::sanitize(t, text.as_object().unwrap_or(&serde_json::Map::new()), weights)?,
        other => {
            return Err(EngineError::UnsupportedModel {
                found: format!("mistral3 with a {other} text model"),
                supported: "ministral3, mistral4, llama".into(),
            })
        }
    }
    let old = std::mem::take(weights);
    weights.extend(old.into_iter().map(|(k, v)| (format!("language_model.{k}"), v)));
    Ok(())
}

/// The wrapper: the text model, with mistral3.py's (default) caches.
struct Mistral3 {
    text: Box<dyn Model>,
    layers: usize,
}

pub fn load(config: &Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    let text = text_config(config)?;
    super::sanitize_weights(weights, |w| {
        text_weights(w);
        Ok(())
    })?;
    // Per-layer quantization entries name the layers under `language_model.` as well.
    let overrides = q.overrides.iter().filter_map(|(k, v)| k.strip_prefix("language_model.").map(|k| (k.to_owned(), *v)));
    let q = QuantConfig { default: q.default, overrides: overrides.collect() };
    let model = super::load_as(text_type(&text), &text, weights, &q)?;
    let layers = model.make_cache().len();
    Ok(Box::new(Mistral3 { text: model, layers }))
}

impl Model for Mistral3 {
    fn model_type(&self) -> &str {
        "mistral3"
    }

    fn vocab_size(&self) -> i32 {
        self.text.vocab_size()
    }

    fn parameters(&self) -> Vec<&Array> {
        self.text.parameters()
    }

    fn make_cache(&self) -> Vec<Box<dyn KvCache>> {
        default_caches(self.layers, None)
    }

    fn make_prompt_cache(&self, max_kv_size: Option<i32>) -> Vec<Box<dyn KvCache>> {
        default_caches(self.layers, max_kv_size)
    }

    fn forward(&self, tokens: &Array, cache: &mut [Box<dyn KvCache>]) -> Result<Array> {
        self.text.forward(tokens, cache)
    }
}
