//! deepseek_v41.py's `sanitize`: the checkpoint as DeepSeek publishes it (its own tensor names,
//! FP8 / FP4 weights with ue8m0 scales) renamed and repacked into MLX's layout.
use super::parse;
use crate::error::{EngineError, Result};
use checkpoint::Weights;
use mlx::{ops, Array, Dtype};
use std::collections::{BTreeMap, HashMap};

/// The parts of a published checkpoint the text model does not have (`_DROP_PREFIXES`).
const DROP: [&str; 4] = ["vision.", "aligner.", "image_", "mtp."];

/// `_EXPERT_PROJ`: a routed expert's projection by its DeepSeek name.
fn expert_proj(proj: &str) -> &'static str {
    match proj {
        "w1" => "gate_proj",
        "w2" => "down_proj",
        _ => "up_proj",
    }
}

/// `_rename`: one DeepSeek checkpoint name as its MLX name.
fn rename(key: &str) -> String {
    match key {
        "head.weight" => return "lm_head.weight".into(),
        "embed.weight" => return "model.embed_tokens.weight".into(),
        _ => {}
    }
    let mut key = format!("model.{key}");
    for (from, to) in [
        (".attn.", ".self_attn."), (".ffn.", ".mlp."), (".attn_norm.", ".input_layernorm."),
        (".ffn_norm.", ".post_attention_layernorm."), (".hc_attn_", ".attn_hc."), (".hc_ffn_", ".ffn_hc."),
        (".attn_sink", ".sinks"), (".wq_a.", ".q_a_proj."), (".wq_b.", ".q_b_proj."), (".wkv.", ".kv_proj."),
        (".wgate.", ".gate_proj."), (".wo_a.", ".o_a_proj."), (".wo_b.", ".o_b_proj."), (".q_norm.", ".q_a_norm."),
        (".compressor.norm.", ".compressor.kv_norm."), (".indexer.wk.", ".indexer.k_proj."),
        (".gate.bias", ".gate.e_score_correction_bias"), (".shared_experts.w1.", ".shared_experts.gate_proj."),
        (".shared_experts.w2.", ".shared_experts.down_proj."), (".shared_experts.w3.", ".shared_experts.up_proj."),
    ] {
        key = key.replace(from, to);
    }
    key
}

/// `_repack`: an FP8 or FP4 weight and its ue8m0 scale in MLX's mxfp8 / mxfp4 layout (the weight's
/// bytes as uint32 words; float scales as biased exponents; FP8's 32x32 tile scales per row).
fn repack(weight: &Array, scale: &Array) -> Result<(Array, Array)> {
    let mut scale = match scale.dtype() {
        Dtype::U8 => scale.clone(),
        _ => scale.astype(Dtype::F32)?.log2()?.add_scalar(127.0)?.astype(Dtype::U8)?,
    };
    let rows = weight.dim(-2);
    if scale.dim(-2) != rows {
        scale = scale.repeat(32, -2)?.slice_axis(-2, 0, rows)?;
    }
    Ok((weight.view(Dtype::U32)?, scale))
}

/// One published expert projection: its weight and its scale (FP4 checkpoints).
type ExpertParts = [Option<Array>; 2];

/// mlx-lm's `sanitize`: a checkpoint with DeepSeek's own names (no key starts with `model.`) is
/// renamed, its vision / multi-token-prediction / engram parts and the image router bias dropped,
/// FP8 and FP4 weights kept packed (mxfp8 / mxfp4) with their scales, `wo_a` split into its groups
/// and the routed experts stacked. A converted (MLX-named) checkpoint stays as it is.
pub fn sanitize(config: &serde_json::Value, weights: &mut Weights) -> Result<()> {
    let c = parse(config)?;
    if weights.names().iter().any(|k| k.starts_with("model.")) {
        return Ok(());
    }
    weights.drop_where(|k| DROP.iter().any(|p| k.starts_with(p)) || k.contains(".engram.") || k.ends_with(".gate.bias_vl"));
    let names = weights.names();
    let has = |k: &str| names.iter().any(|n| n == k);
    let mut experts: BTreeMap<(i32, String), BTreeMap<i32, ExpertParts>> = BTreeMap::new();
    for key in &names {
        let parts: Vec<&str> = key.split('.').collect();
        if let ["layers", layer, "ffn", "experts", e, proj @ ("w1" | "w2" | "w3"), kind @ ("weight" | "scale")] = parts[..] {
            let (Ok(layer), Ok(e)) = (layer.parse::<i32>(), e.parse::<i32>()) else { continue };
            let value = weights.remove(key).expect("listed by names()");
            experts.entry((layer, proj.to_owned())).or_default().entry(e).or_default()[usize::from(kind == "scale")] = Some(value);
            continue;
        }
        if key.strip_suffix(".scale").is_some_and(|b| has(&format!("{b}.weight"))) {
            continue;
        }
        let Some(mut value) = weights.remove(key) else { continue };
        let mut scale = key.strip_suffix(".weight").and_then(|b| weights.remove(&format!("{b}.scale")));
        let name = rename(key);
        if let Some(s) = &scale {
            let (w, s) = repack(&value, s)?;
            (value, scale) = (w, Some(s));
        }
        if name.ends_with(".o_a_proj.weight") {
            // wo_a is block diagonal: its groups one by one.
            value = value.reshape(&[c.o_groups, -1, value.dim(-1)])?;
            scale = scale.map(|s| s.reshape(&[c.o_groups, -1, s.dim(-1)])).transpose()?;
        }
        if let Some(s) = scale {
            weights.insert(format!("{}scales", name.trim_end_matches("weight")), s);
        }
        weights.insert(name, value);
    }
    for ((layer, proj), rows) in experts {
        if rows.len() != c.n_routed_experts as usize {
            return Err(EngineError::Config(format!(
                "layer {layer} has {} {proj} expert weights, but the config declares {} experts",
                rows.len(),
                c.n_routed_experts
            )));
        }
        let missing = || EngineError::missing_tensor(format!("layers.{layer}.ffn.experts.N.{proj}.weight"));
        let values = rows.values().map(|r| r[0].as_ref().ok_or_else(missing)).collect::<Result<Vec<_>>>()?;
        let name = format!("model.layers.{layer}.mlp.experts.switch_mlp.{}", expert_proj(&proj));
        let mut value = ops::stack(&values, 0)?;
        if rows.values().next().is_some_and(|r| r[1].is_some()) {
            let scales = rows.values().map(|r| r[1].as_ref().ok_or_else(missing)).collect::<Result<Vec<_>>>()?;
            let (w, s) = repack(&value, &ops::stack(&scales, 0)?)?;
            value = w;
            weights.insert(format!("{name}.scales"), s);
        }
        weights.insert(format!("{name}.weight"), value);
    }
    Ok(())
}

/// The tensor shapes of a checkpoint as mlx-lm's modules hold them after `sanitize` (`--seed`
/// counts the draws those modules make at load): DeepSeek's names renamed, `X.scale` as
/// `X.scales`, each routed projection as one stacked tensor, the dropped parts left out.
pub fn sanitized_shapes(shapes: HashMap<String, Vec<i64>>) -> HashMap<String, Vec<i64>> {
    if shapes.keys().any(|k| k.starts_with("model.")) {
        return shapes;
    }
    let mut out = HashMap::new();
    for (k, shape) in &shapes {
        if DROP.iter().any(|p| k.starts_with(p)) || k.contains(".engram.") || k.ends_with(".gate.bias_vl") {
            continue;
        }
        let parts: Vec<&str> = k.split('.').collect();
        if let ["layers", layer, "ffn", "experts", e, proj, kind] = parts[..] {
            if e == "0" {
                let kind = if kind == "scale" { "scales" } else { kind };
                let stacked = [&[0][..], shape].concat();
                out.insert(format!("model.layers.{layer}.mlp.experts.switch_mlp.{}.{kind}", expert_proj(proj)), stacked);
            }
            continue;
        }
        let name = match k.strip_suffix(".scale").filter(|b| shapes.contains_key(&format!("{b}.weight"))) {
            Some(b) => format!("{}scales", rename(&format!("{b}.weight")).trim_end_matches("weight")),
            None => rename(k),
        };
        out.insert(name, shape.clone());
    }
    out
}
