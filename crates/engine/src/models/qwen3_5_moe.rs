//! `qwen3_5_moe` (Qwen3.5-35B-A3B, Qwen3.5-397B-A17B), as mlx-lm's `models/qwen3_5_moe.py`:
//! qwen3_5.py's model ([`super::qwen3_5`]) with routed experts and a shared expert on every layer;
//! its `sanitize` also splits Hugging Face's fused `experts.gate_up_proj` (E, 2 I, hidden) into
//! `switch_mlp.gate_proj` / `up_proj` and renames `experts.down_proj`.
use super::Model;
use crate::error::{EngineError, Result};
use crate::nn::QuantConfig;
use checkpoint::Weights;
use mlx::Array;
use serde_json::Value;
use std::collections::BTreeMap;

/// The experts' part of `sanitize`, over the text model's names.
fn split_experts(weights: &mut BTreeMap<String, Array>) -> Result<()> {
    let layers: Vec<String> = weights
        .keys()
        .filter_map(|k| k.strip_suffix(".experts.gate_up_proj").map(str::to_owned))
        .collect();
    for prefix in layers {
        let Some(gate_up) = weights.remove(&format!("{prefix}.experts.gate_up_proj")) else { continue };
        let mid = gate_up.dim(-2) / 2;
        let down = weights
            .remove(&format!("{prefix}.experts.down_proj"))
            .ok_or_else(|| EngineError::Config(format!("{prefix}.experts.gate_up_proj without {prefix}.experts.down_proj")))?;
        weights.insert(format!("{prefix}.switch_mlp.gate_proj.weight"), gate_up.slice_axis(-2, 0, mid)?);
        weights.insert(format!("{prefix}.switch_mlp.up_proj.weight"), gate_up.slice_axis(-2, mid, 2 * mid)?);
        weights.insert(format!("{prefix}.switch_mlp.down_proj.weight"), down);
    }
    Ok(())
}

/// mlx-lm's `sanitize` for `convert`: as qwen3_5's, with the experts split first.
pub fn sanitize(weights: &mut BTreeMap<String, Array>) -> Result<()> {
    super::qwen3_5::sanitize_as(weights, Some(split_experts))
}

pub fn load(config: &Value, weights: &mut Weights, q: &QuantConfig) -> Result<Box<dyn Model>> {
    super::qwen3_5::load_as(config, weights, q, Some(split_experts))
}
