//! `mlx_lm.convert --quant-predicate`: the mixed-precision recipes `mixed_2_6`, `mixed_3_4`,
//! `mixed_3_6` and `mixed_4_6` (mlx-lm's `mixed_quant_predicate_builder`, after llama.cpp's
//! Q4_K_M): v/down projections of the first and last eighth of the layers and of every third
//! layer between, and the output head, get the high bits; every other layer the low bits.
use crate::{FormatError, Result};
use serde_json::{Map, Value};

/// One of mlx-lm's `QUANT_RECIPES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixedRecipe {
    Mixed2_6,
    Mixed3_4,
    Mixed3_6,
    Mixed4_6,
}

impl MixedRecipe {
    pub const ALL: [MixedRecipe; 4] = [MixedRecipe::Mixed2_6, MixedRecipe::Mixed3_4, MixedRecipe::Mixed3_6, MixedRecipe::Mixed4_6];

    pub fn name(self) -> &'static str {
        match self {
            MixedRecipe::Mixed2_6 => "mixed_2_6",
            MixedRecipe::Mixed3_4 => "mixed_3_4",
            MixedRecipe::Mixed3_6 => "mixed_3_6",
            MixedRecipe::Mixed4_6 => "mixed_4_6",
        }
    }

    pub fn parse(name: &str) -> Option<MixedRecipe> {
        MixedRecipe::ALL.into_iter().find(|r| r.name() == name)
    }

    /// (low bits, high bits).
    pub fn bits(self) -> (i32, i32) {
        match self {
            MixedRecipe::Mixed2_6 => (2, 6),
            MixedRecipe::Mixed3_4 => (3, 4),
            MixedRecipe::Mixed3_6 => (3, 6),
            MixedRecipe::Mixed4_6 => (4, 6),
        }
    }
}

/// The recipe bound to one model: where the layer index sits in a path and how many layers there are.
#[derive(Clone, Debug)]
pub struct MixedPredicate {
    recipe: MixedRecipe,
    layer_location: usize,
    num_layers: i64,
}

impl MixedPredicate {
    /// `layers`: the model's layer paths (weight names without `.weight`), in any order; the
    /// layer count is config.json's `num_hidden_layers` (or its `text_config`'s), as `len(model.layers)`.
    pub fn new<'a>(
        recipe: MixedRecipe,
        layers: impl IntoIterator<Item = &'a str>,
        config: &Map<String, Value>,
    ) -> Result<MixedPredicate> {
        let mut down: Vec<&str> = layers.into_iter().filter(|k| k.contains("down_proj")).collect();
        down.sort_by_key(|k| (layer_index_of(k), *k));
        let first = down.first().ok_or_else(|| FormatError::Invalid("Model does not have expected keys for mixed quant.".into()))?;
        // Python's loop variable after a loop without a break: the last position.
        let parts: Vec<&str> = first.split('.').collect();
        let layer_location = parts.iter().position(|p| is_digits(p)).unwrap_or(parts.len().saturating_sub(1));
        let layers_of = |c: &Map<String, Value>| c.get("num_hidden_layers").and_then(Value::as_i64);
        let num_layers = layers_of(config)
            .or_else(|| config.get("text_config").and_then(Value::as_object).and_then(layers_of))
            .ok_or_else(|| FormatError::Config("no num_hidden_layers for the mixed quantization recipe".into()))?;
        Ok(MixedPredicate { recipe, layer_location, num_layers })
    }

    /// The bits of the layer at `path`.
    pub fn bits(&self, path: &str) -> i32 {
        let parts: Vec<&str> = path.split('.').collect();
        let index = parts.get(self.layer_location).map_or(Some(0), |p| p.parse::<i64>().ok());
        let (low, high) = self.recipe.bits();
        // mlx-lm's int() of a component that is not a number fails the conversion; such a path
        // (never a layer of these architectures) gets the low bits here.
        let Some(index) = index else { return low };
        let n = self.num_layers;
        let more = index < n / 8 || index >= 7 * n / 8 || (index - n / 8).rem_euclid(3) == 2;
        let v = ["v_proj", "v_a_proj", "v_b_proj"].iter().any(|k| path.contains(k));
        if (v || path.contains("down_proj")) && more || path.contains("lm_head") {
            high
        } else {
            low
        }
    }
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_digit())
}

/// Sorts paths as `named_modules` meets them closely enough for picking the first down projection:
/// by where the first numeric component is, so that a layer path comes before others.
fn layer_index_of(path: &str) -> usize {
    path.split('.').position(is_digits).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_3_6_picks_mlx_lms_layers() {
        let config: Map<String, Value> = serde_json::from_str(r#"{"num_hidden_layers": 16}"#).unwrap();
        let names: Vec<String> = (0..16).map(|i| format!("model.layers.{i}.mlp.down_proj")).collect();
        let p = MixedPredicate::new(MixedRecipe::Mixed3_6, names.iter().map(String::as_str), &config).unwrap();
        let high: Vec<i32> = (0..16).filter(|i| p.bits(&format!("model.layers.{i}.mlp.down_proj")) == 6).collect();
        // n // 8 = 2: layers 0, 1, 14, 15 and (i - 2) % 3 == 2: 4, 7, 10, 13.
        assert_eq!(high, [0, 1, 4, 7, 10, 13, 14, 15]);
        assert_eq!(p.bits("model.layers.4.self_attn.q_proj"), 3);
        assert_eq!(p.bits("model.layers.4.self_attn.v_proj"), 6);
        assert_eq!(p.bits("lm_head"), 6);
        assert_eq!(p.bits("model.embed_tokens"), 3);
        assert_eq!(MixedRecipe::parse("mixed_3_4").map(MixedRecipe::bits), Some((3, 4)));
    }

    #[test]
    fn a_model_without_down_projections_is_refused() {
        let e = MixedPredicate::new(MixedRecipe::Mixed2_6, ["model.layers.0.mlp.fc1"], &Map::new()).unwrap_err();
        assert!(e.to_string().contains("expected keys"), "{e}");
    }
}
