//! `mlx-gen convert`: a Hugging Face float model folder (or a GGUF file) to an MLX model folder,
//! tensor for tensor what `mlx_lm.convert` writes (sanitize, dtype cast, quantization in any of
//! MLX's modes, mixed-precision recipes).
use crate::{FormatError, Result};
use crate::gguf::{import_gguf, ImportOptions};
use crate::mixed_quant::{MixedPredicate, MixedRecipe};
use mlx::ops::{QuantMode, QuantSpec};
use mlx::{Array, Dtype};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// What `mlx_lm.convert`'s flags ask for.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    /// `-q`: quantize every linear and embedding layer whose input size the group size divides.
    pub quantize: bool,
    /// `--q-bits`/`--q-group-size`; `None`: the mode's defaults (affine 64/4, mxfp4 32/4,
    /// nvfp4 16/4, mxfp8 32/8).
    pub q_bits: Option<i32>,
    pub q_group_size: Option<i32>,
    /// `--q-mode`.
    pub q_mode: QuantMode,
    /// `--quant-predicate`: a mixed-precision recipe (affine only) instead of the model's own
    /// per-layer choices; every quantized layer is then recorded in config.json.
    pub quant_predicate: Option<MixedRecipe>,
    /// `--dtype`; `None`: config.json's `torch_dtype` when it is one of the three float types.
    pub dtype: Option<Dtype>,
    /// `-d`: an MLX-quantized folder back to floats (mlx-lm's `dequantize_model`).
    pub dequantize: bool,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            quantize: false,
            q_bits: None,
            q_group_size: None,
            q_mode: QuantMode::Affine,
            quant_predicate: None,
            dtype: None,
            dequantize: false,
        }
    }
}

impl ConvertOptions {
    /// The conversion's quantization (the mode's defaults where not given), checked as MLX
    /// and mlx-lm check it.
    pub fn spec(&self) -> Result<QuantSpec> {
        let d = self.q_mode.defaults();
        let spec =
            QuantSpec { group_size: self.q_group_size.unwrap_or(d.group_size), bits: self.q_bits.unwrap_or(d.bits), mode: self.q_mode };
        if self.quant_predicate.is_some() && self.q_mode != QuantMode::Affine {
            return Err(FormatError::Invalid(format!(
                "--quant-predicate recipes quantize in the affine mode only, not --q-mode {}",
                self.q_mode
            )));
        }
        if !self.q_mode.supports(spec.group_size, spec.bits) {
            return Err(FormatError::Invalid(match self.q_mode {
                QuantMode::Affine => format!(
                    "cannot quantize with {} bits, group size {} (bits 2, 3, 4, 5, 6 or 8; group size 32, 64 or 128)",
                    spec.bits, spec.group_size
                ),
                m => format!(
                    "--q-mode {m} quantizes with {} bits and group size {} only (got {} bits, group size {})",
                    d.bits, d.group_size, spec.bits, spec.group_size
                ),
            }));
        }
        Ok(spec)
    }
}

/// What a model architecture does to its Hugging Face checkpoint before it is written: mlx-lm's
/// `Model.sanitize` (renames, dropped rotary buffers, tied heads, stacked experts) and what its
/// config class writes into config.json. The caller supplies it from the engine's model registry,
/// so that this crate never builds a model.
pub trait ModelRules {
    /// Rewrites `weights` (by name) as `model_type`'s `sanitize` does; an architecture the caller
    /// cannot convert is an error whose message says so (and lists the ones it can).
    fn sanitize(
        &self,
        model_type: &str,
        config: &Map<String, Value>,
        weights: &mut BTreeMap<String, Array>,
    ) -> std::result::Result<(), String>;

    /// The architecture's own quantization for the layer at `path` (mlx-lm's per-model
    /// `quant_predicate`, e.g. qwen3_moe's 8-bit routers), recorded in config.json; `None`: the
    /// conversion's bits and group size. A `--quant-predicate` recipe replaces it, as in mlx-lm.
    fn quant_override(&self, model_type: &str, path: &str) -> Option<QuantSpec> {
        let _ = (model_type, path);
        None
    }

    /// The changes `model_type`'s config class makes to the config dict itself, which
    /// `mlx_lm.convert` therefore saves (e.g. mistral3's `text_config.tie_word_embeddings`);
    /// by default none.
    /// Whether the tensor `{layer}.weight` belongs to a layer mlx-lm's `nn.quantize` quantizes (a
    /// Linear, Embedding, SwitchLinear or MultiLinear); by default every 2-D or 3-D weight does.
    fn quantizable(&self, model_type: &str, layer: &str) -> bool {
        let _ = (model_type, layer);
        true
    }

    /// Whether the float parameter `name` keeps its dtype rather than taking the conversion's
    /// (mlx-lm's per-model `cast_predicate`); by default every float parameter is cast.
    fn keeps_dtype(&self, model_type: &str, name: &str) -> bool {
        let _ = (model_type, name);
        false
    }

    fn update_config(&self, model_type: &str, config: &mut Map<String, Value>) {
        let _ = (model_type, config);
    }

    /// The quantization a quantized folder's config.json gives its layers, as the engine reads it
    /// when loading (the `quantization` entry's top level, a layer's own entry, `false` for a float
    /// layer): a function from a layer's path to its parameters, or why the entry is invalid.
    fn layer_quant(&self, config: &Map<String, Value>) -> std::result::Result<LayerQuant, String>;
}

/// A layer's path -> its quantization (`None`: stored as floats); see [`ModelRules::layer_quant`].
pub type LayerQuant = Box<dyn Fn(&str) -> Option<QuantSpec>>;

/// What a conversion wrote.
#[derive(Clone, Debug, Default)]
pub struct ConvertSummary {
    pub tensors: usize,
    pub quantized: usize,
    pub dtype: Option<String>,
}

/// The files besides weights and config.json that a converted folder keeps (`mlx_lm.convert`
/// writes the tokenizer with `save_pretrained`): the ones the Hub download fetches too.
const COPIED: &[&str] = crate::hub::SIDE_FILES;

/// mlx-lm writes one safetensors file up to this size, then shards (`MAX_FILE_SIZE_GB`).
const MAX_SHARD_BYTES: usize = 5 << 30;

fn io(path: &Path, e: impl std::fmt::Display) -> FormatError {
    FormatError::file(path, e)
}

/// Builds `dst` with `build` (which gets an empty temporary sibling folder to fill), then renames
/// it into place; on failure the temporary folder is removed. An existing `dst` is an error
/// unless `force`, in which case it is replaced only once the new folder is complete.
pub fn write_atomically(dst: &Path, force: bool, build: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    if dst.exists() && !force {
        return Err(FormatError::Invalid(format!(
            "{} already exists; remove it, pick another --mlx-path, or pass --force",
            dst.display()
        )));
    }
    let name = dst.file_name().ok_or_else(|| io(dst, "not a folder name"))?.to_string_lossy().into_owned();
    let parent = dst.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
    let tmp = parent.join(format!(".{name}.partial-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    }
    let result = build(&tmp).and_then(|()| {
        let old = parent.join(format!(".{name}.old-{}", std::process::id()));
        let replaced = dst.exists();
        if replaced {
            fs::rename(dst, &old).map_err(|e| io(dst, e))?;
        }
        fs::rename(&tmp, dst).map_err(|e| io(dst, format!("moving the finished folder into place: {e}")))?;
        if replaced {
            let _ = if old.is_dir() { fs::remove_dir_all(&old) } else { fs::remove_file(&old) };
        }
        Ok(())
    });
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    result
}

/// Converts a GGUF file (see [`import_gguf`]): Q4_0/Q4_1/Q8_0 kept exactly, other types
/// requantized with `q_bits`/`q_group_size`, or everything float with `--dtype` and no `-q`.
pub fn convert_gguf(gguf: &Path, out: &Path, opts: &ConvertOptions) -> Result<()> {
    let dtype = if opts.quantize { None } else { opts.dtype };
    let spec = opts.spec()?;
    if spec.mode != QuantMode::Affine || opts.quant_predicate.is_some() {
        return Err(FormatError::Invalid("a GGUF source is requantized in the affine mode only (no --q-mode, --quant-predicate)".into()));
    }
    if opts.dequantize {
        return Err(FormatError::Invalid("-d dequantizes MLX-quantized folders; a GGUF source is imported with its tensors as floats by --dtype (without -q)".into()));
    }
    let import = ImportOptions { dtype, q_bits: spec.bits, q_group_size: spec.group_size };
    import_gguf(gguf, out, &import)?;
    Ok(())
}

fn read_json(path: &Path) -> Result<Map<String, Value>> {
    let text = fs::read_to_string(path).map_err(|e| io(path, e))?;
    match serde_json::from_str(&text).map_err(|e| io(path, e))? {
        Value::Object(m) => Ok(m),
        _ => Err(io(path, "not a JSON object")),
    }
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    use serde::Serialize;
    let mut buf = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, serde_json::ser::PrettyFormatter::with_indent(b"    "));
    v.serialize(&mut ser).map_err(|e| io(path, e))?;
    fs::write(path, buf).map_err(|e| io(path, e))
}

/// mlx-lm's `load_config`: config.json, with `eos_token_id` from generation_config.json when set.
fn load_config(dir: &Path) -> Result<Map<String, Value>> {
    let mut config = read_json(&dir.join("config.json"))?;
    let gen = dir.join("generation_config.json");
    if gen.is_file() {
        if let Ok(g) = read_json(&gen) {
            let truthy = match g.get("eos_token_id") {
                Some(Value::Number(n)) => n.as_f64() != Some(0.0),
                Some(Value::Array(a)) => !a.is_empty(),
                _ => false,
            };
            if truthy {
                config.insert("eos_token_id".into(), g["eos_token_id"].clone());
            }
        }
    }
    Ok(config)
}

/// The dtype mlx-lm casts float parameters to: `--dtype`, else `torch_dtype`, else `text_config.dtype`.
fn target_dtype(opts: &ConvertOptions, config: &Map<String, Value>) -> Option<Dtype> {
    if opts.dtype.is_some() {
        return opts.dtype;
    }
    let named = match config.get("torch_dtype") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => None,
        None => config.get("text_config").and_then(|t| t.get("dtype")).and_then(Value::as_str).map(str::to_owned),
    };
    named.and_then(|n| matches!(n.as_str(), "float16" | "bfloat16" | "float32").then(|| Dtype::parse_float(&n)).flatten())
}

/// mlx-lm's `dequantize_model` over the (already cast) tensors: every `{layer}.weight` that has
/// `{layer}.scales` becomes `mx.dequantize(weight, scales, biases)` with the layer's parameters
/// (`layer_quant`, the engine's reading of config.json); returns the names it dequantized.
fn dequantize_all(
    weights: &mut BTreeMap<String, Array>,
    layer_quant: &dyn Fn(&str) -> Option<QuantSpec>,
    cast: &dyn Fn(&str, Array) -> Result<Array>,
) -> Result<std::collections::HashSet<String>> {
    let layers: Vec<String> =
        weights.keys().filter_map(|n| n.strip_suffix(".scales")).filter(|l| weights.contains_key(&format!("{l}.weight"))).map(str::to_owned).collect();
    let mut done = std::collections::HashSet::new();
    for layer in layers {
        let own = layer_quant(&layer).ok_or_else(|| FormatError::Invalid(format!("{layer} has scales but config.json's `quantization` stores it as floats")))?;
        let (wn, sn, bn) = (format!("{layer}.weight"), format!("{layer}.scales"), format!("{layer}.biases"));
        let scales = weights.remove(&sn).map(|s| cast(&sn, s)).transpose()?.ok_or_else(|| FormatError::Invalid(format!("{sn} is missing")))?;
        let biases = weights.remove(&bn).map(|b| cast(&bn, b)).transpose()?;
        if own.mode.has_biases() != biases.is_some() {
            return Err(FormatError::Invalid(format!(
                "{layer}: {} quantization {} biases, but the folder {}",
                own.mode,
                if own.mode.has_biases() { "has" } else { "has no" },
                if biases.is_some() { "has them" } else { "has none" }
            )));
        }
        let w = weights.remove(&wn).ok_or_else(|| FormatError::Invalid(format!("{wn} is missing")))?;
        let f = mlx::ops::dequantize(&w, &scales, biases.as_ref(), own)?;
        f.eval()?;
        weights.insert(wn.clone(), f);
        done.insert(wn);
    }
    Ok(done)
}

/// Converts the Hugging Face model folder `src` into the (new, empty) folder `out` (`rules`: the
/// architecture's `sanitize` and config updates), calling `progress(done, total)` after each tensor.
pub fn convert_folder(
    src: &Path,
    out: &Path,
    opts: &ConvertOptions,
    rules: &dyn ModelRules,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ConvertSummary> {
    let spec = opts.spec()?;
    let mut config = load_config(src)?;
    let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or("").to_owned();
    if opts.quantize && opts.dequantize {
        return Err(FormatError::Invalid("choose either -q (quantize) or -d (dequantize), not both".into()));
    }
    if opts.quantize && config.contains_key("quantization") {
        return Err(FormatError::Invalid(format!("{} is already quantized", src.display())));
    }
    let dequantize = match (opts.dequantize, config.get("quantization").or_else(|| config.get("quantization_config"))) {
        (false, _) => false,
        (true, None) => return Err(FormatError::Invalid(format!("{} is not quantized (config.json has no `quantization`): nothing to dequantize", src.display()))),
        (true, Some(q)) if q.get("quant_method").is_some() => {
            return Err(FormatError::Invalid(format!(
                "-d dequantizes MLX-quantized folders; {} has a Hugging Face quantization_config (quant_method {})",
                src.display(),
                q["quant_method"]
            )))
        }
        (true, Some(_)) => true,
    };
    // The files an index names, or every model*.safetensors; each checked before it is read.
    let mut weights: BTreeMap<String, Array> = checkpoint::Weights::load_dir(src)?.into_map().into_iter().collect();
    rules.sanitize(&model_type, &config, &mut weights).map_err(FormatError::Invalid)?;
    rules.update_config(&model_type, &mut config);
    let dtype = target_dtype(opts, &config);
    // mlx-lm casts the float parameters (scales and biases too), then dequantizes.
    let cast = |name: &str, w: Array| -> Result<Array> {
        Ok(match dtype {
            Some(d) if w.dtype().is_float() && !rules.keeps_dtype(&model_type, name) => w.astype(d)?,
            _ => w,
        })
    };
    let dequantized = if dequantize {
        let layer_quant = rules.layer_quant(&config).map_err(FormatError::Invalid)?;
        config.remove("quantization");
        config.remove("quantization_config");
        dequantize_all(&mut weights, layer_quant.as_ref(), &cast)?
    } else {
        std::collections::HashSet::new()
    };
    let recipe = opts
        .quant_predicate
        .map(|r| MixedPredicate::new(r, weights.keys().filter_map(|n| n.strip_suffix(".weight")), &config))
        .transpose()?;

    fs::create_dir_all(out).map_err(|e| io(out, e))?;
    let total = weights.len();
    // mlx-lm's `get_total_parameters` counts the parameters of leaf modules only: not a tensor
    // that sits beside child modules (a gated DeltaNet's `A_log` and `dt_bias`).
    let parents: std::collections::HashSet<&str> = weights
        .keys()
        .flat_map(|n| n.match_indices('.').map(move |(i, _)| &n[..i]).collect::<Vec<_>>().into_iter().rev().skip(1))
        .collect();
    let counted: std::collections::HashSet<String> =
        weights.keys().filter(|n| n.rsplit_once('.').is_none_or(|(m, _)| !parents.contains(m))).cloned().collect();
    let mut summary = ConvertSummary { dtype: dtype.map(|d| d.name().to_owned()), ..Default::default() };
    let mut tensors: Vec<(String, Array)> = Vec::new();
    let mut parameters = 0usize;
    let mut overrides = Map::new();
    for (i, (name, w)) in std::mem::take(&mut weights).into_iter().enumerate() {
        let w = if dequantized.contains(&name) { w } else { cast(&name, w)? };
        // nn.quantize: Linear and Embedding layers (the 2-D `.weight`s of these architectures),
        // the experts' SwitchLinear (3-D `.experts.`, llama4) and MLA's MultiLinear (3-D); the
        // model's quant_predicate may give a layer its own parameters, recorded in the config.
        let layer = name.strip_suffix(".weight").filter(|l| (w.ndim() == 2 || w.ndim() == 3) && rules.quantizable(&model_type, l));
        let quantize = opts.quantize && w.dim(-1) % spec.group_size == 0;
        match layer.filter(|_| quantize) {
            Some(layer) => {
                parameters += w.size();
                let own = match &recipe {
                    // mlx-lm records the recipe's group size as given (null when not).
                    Some(r) => {
                        let bits = r.bits(layer);
                        overrides.insert(
                            layer.to_owned(),
                            serde_json::json!({"group_size": opts.q_group_size, "bits": bits, "mode": "affine"}),
                        );
                        Some(QuantSpec::affine(spec.group_size, bits))
                    }
                    None => rules.quant_override(&model_type, layer).inspect(|o| {
                        overrides.insert(layer.to_owned(), serde_json::json!({"group_size": o.group_size, "bits": o.bits}));
                    }),
                };
                let (q, s, b) = mlx::ops::quantize(&w, own.unwrap_or(spec))?;
                mlx::eval(&[&q, &s].into_iter().chain(b.as_ref()).collect::<Vec<_>>())?;
                tensors.push((name.clone(), q));
                tensors.push((format!("{layer}.scales"), s));
                if let Some(b) = b {
                    tensors.push((format!("{layer}.biases"), b));
                }
                summary.quantized += 1;
            }
            None => {
                if counted.contains(&name) {
                    parameters += w.size();
                }
                w.eval()?;
                tensors.push((name, w));
            }
        }
        summary.tensors += 1;
        progress(i + 1, total);
    }

    write_weights(out, &tensors, parameters)?;
    drop(tensors);
    if opts.quantize {
        let mut q = Map::new();
        q.insert("group_size".into(), spec.group_size.into());
        q.insert("bits".into(), spec.bits.into());
        q.insert("mode".into(), spec.mode.name().into());
        q.extend(overrides);
        config.insert("quantization".into(), Value::Object(q));
    }
    // mlx-lm's save_config: no _name_or_path or vision_config, quantization_config mirrors
    // quantization, keys sorted.
    config.remove("_name_or_path");
    config.remove("vision_config");
    if let Some(q) = config.get("quantization").cloned() {
        config.insert("quantization_config".into(), q);
    }
    let sorted: BTreeMap<String, Value> = config.into_iter().collect();
    write_json(&out.join("config.json"), &serde_json::to_value(sorted).map_err(|e| io(out, e))?)?;
    for f in COPIED {
        let from = src.join(f);
        if from.is_file() {
            fs::copy(&from, out.join(f)).map_err(|e| io(&from, e))?;
        }
    }
    Ok(summary)
}

/// mlx-lm's `save_model`: shards of at most 5 GiB (`model.safetensors` when one) and an index;
/// each tensor page-aligned in its file ([`crate::aligned`]) so that loading maps it in place.
fn write_weights(out: &Path, tensors: &[(String, Array)], parameters: usize) -> Result<()> {
    let mut shards: Vec<Vec<&(String, Array)>> = Vec::new();
    let mut size = 0usize;
    for t in tensors {
        if shards.is_empty() || size + t.1.nbytes() > MAX_SHARD_BYTES {
            shards.push(Vec::new());
            size = 0;
        }
        if let Some(s) = shards.last_mut() {
            s.push(t);
        }
        size += t.1.nbytes();
    }
    let count = shards.len();
    let mut weight_map = BTreeMap::new();
    for (i, shard) in shards.iter().enumerate() {
        let file =
            if count > 1 { format!("model-{:05}-of-{count:05}.safetensors", i + 1) } else { "model.safetensors".to_owned() };
        let refs: Vec<(&str, &Array)> = shard.iter().map(|(n, a)| (n.as_str(), a)).collect();
        let path = out.join(&file);
        crate::aligned::save(&path, &refs, &[("format", "mlx")])?;
        for (n, _) in shard {
            weight_map.insert(n.clone(), Value::String(file.clone()));
        }
    }
    let total: usize = tensors.iter().map(|(_, a)| a.nbytes()).sum();
    let index = serde_json::json!({
        "metadata": {"total_size": total, "total_parameters": parameters},
        "weight_map": weight_map,
    });
    write_json(&out.join("model.safetensors.index.json"), &index)
}
