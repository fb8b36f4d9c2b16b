//! Seeding as `mlx_lm.generate --seed` does: `mx.random.seed` runs before the model is built, and building it draws from MLX's global key (one split per random initializer), so the sampler starts from a key advanced by that many splits.
//!
//! mlx-lm builds every `nn.Linear` (one `uniform` for the weight, one more for a bias) and
//! `nn.Embedding` (one `normal`) with random values before loading the checkpoint over them, and
//! `nn.quantize` builds each quantized layer again (one more draw). The count is read from the
//! checkpoint's tensor names and shapes: every matrix `*.weight` (or quantized one, with
//! `*.scales`) is one draw, plus one for its `*.bias` and one if it is quantized.
use crate::error::{EngineError, Result};
use crate::load::LoadedModel;
use mlx::{random, Dtype};
use std::collections::HashMap;
use std::path::Path;

/// Seeds MLX's global key and advances it past the draws mlx-lm makes while loading `model`.
pub fn seed_as_mlx_lm(seed: u64, model: &LoadedModel) -> Result<()> {
    let draws = init_random_draws(&model.path, &model.config)?;
    random::seed(seed)?;
    for _ in 0..draws {
        // Splits the global key; the draw itself is never evaluated.
        drop(random::uniform(&[], Dtype::F32)?);
    }
    Ok(())
}

/// A request's own key sequence, as MLX's global one after [`seed_as_mlx_lm`] (`draws` from
/// [`init_random_draws`]): drawing from it gives `mlx-gen generate --seed`'s tokens.
pub fn key_seq_as_mlx_lm(seed: u64, draws: usize) -> Result<random::KeySeq> {
    let mut keys = random::KeySeq::new(seed)?;
    for _ in 0..draws {
        keys.next_key()?;
    }
    Ok(keys)
}

/// The tokens XTC never removes in mlx_lm.generate: `tokenizer.encode("\n") + eos_token_ids`.
pub fn xtc_special_tokens(model: &LoadedModel) -> Result<Vec<u32>> {
    let mut ids = model.tokenizer.encode("\n", true)?;
    ids.extend(model.eos_token_ids.iter().copied());
    Ok(ids)
}

/// (name -> (shape)) of every tensor in `dir`'s `model*.safetensors` headers.
fn tensor_shapes(dir: &Path) -> Result<HashMap<String, Vec<i64>>> {
    let mut shapes = HashMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(shapes) };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("model") && name.ends_with(".safetensors")) {
            continue;
        }
        let path = e.path();
        let bytes = read_header(&path).map_err(|m| EngineError::file(&path, m))?;
        let header: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| EngineError::file(&path, format!("bad safetensors header: {e}")))?;
        for (k, v) in header.as_object().into_iter().flatten() {
            if let Some(s) = v.get("shape").and_then(|s| s.as_array()) {
                shapes.insert(k.clone(), s.iter().filter_map(|x| x.as_i64()).collect());
            }
        }
    }
    Ok(shapes)
}

fn read_header(path: &Path) -> std::result::Result<Vec<u8>, String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|e| e.to_string())?;
    let len = u64::from_le_bytes(len);
    if len > 100_000_000 {
        return Err(format!("safetensors header of {len} bytes"));
    }
    let mut buf = vec![0u8; len as usize];
    f.read_exact(&mut buf).map_err(|e| e.to_string())?;
    Ok(buf)
}

/// How many times mlx-lm's `load` splits MLX's global key for the model in `dir`.
pub fn init_random_draws(dir: &Path, config: &serde_json::Value) -> Result<usize> {
    let tied = config.get("tie_word_embeddings").and_then(|v| v.as_bool()) == Some(true);
    let model_type = config.get("model_type").and_then(|v| v.as_str()).unwrap_or_default();
    let shapes = crate::models::sanitized_shapes(config, tensor_shapes(dir)?);
    let mut draws = 0;
    for (name, shape) in &shapes {
        if let Some(n) = hybrid_draws(name, shape, &shapes) {
            draws += n;
            continue;
        }
        let Some(base) = name.strip_suffix(".weight") else { continue };
        if tied && base.ends_with("lm_head") {
            continue; // sanitize drops it: no module
        }
        let quantized = shapes.contains_key(&format!("{base}.scales"));
        let per_module = 1 + usize::from(quantized) + usize::from(shapes.contains_key(&format!("{base}.bias")));
        draws += crate::models::init_modules(model_type, base, shape.len(), quantized) * per_module;
    }
    Ok(draws)
}

/// The draws of tensors that are not one `nn.Linear` / `nn.Embedding` each: a Conv1d's weight and
/// a gated DeltaNet's `A_log` (one `uniform` each, whatever their shape), stacked experts (one
/// `SwitchLinear` per projection: Hugging Face's per-expert tensors count once, at expert 0;
/// `experts.gate_up_proj` is two), and what `sanitize` drops (`mtp.`, the vision tower): none.
fn hybrid_draws(name: &str, shape: &[i64], shapes: &HashMap<String, Vec<i64>>) -> Option<usize> {
    if name.contains("mtp.") || name.starts_with("vision_tower") || name.starts_with("model.visual") {
        return Some(0);
    }
    if name.ends_with("linear_attn.conv1d.weight") || name.ends_with("linear_attn.A_log") {
        return Some(1);
    }
    if name.ends_with(".experts.gate_up_proj") {
        return Some(2);
    }
    if name.ends_with(".experts.down_proj") {
        return Some(1);
    }
    if let Some(base) = name.strip_suffix(".weight").filter(|b| b.contains("switch_mlp.") && shape.len() == 3) {
        if !shapes.contains_key(&format!("{base}.scales")) {
            return Some(1); // float stacked experts (quantized ones count as quantized layers)
        }
    }
    let (_, rest) = name.split_once(".experts.")?;
    let (e, _) = rest.split_once('.')?;
    e.parse::<u32>().ok().filter(|&e| e != 0).map(|_| 0)
}
