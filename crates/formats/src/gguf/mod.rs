//! GGUF import: reads a llama.cpp GGUF file (architectures `llama` incl. Llama 3.x rope scaling,
//! `qwen2`, `qwen3`, `qwen3moe`) and writes an MLX model folder (config.json, model.safetensors,
//! tokenizer.json, tokenizer_config.json) that mlx-lm and the engine's `LoadedModel` load, keeping
//! Q4_0/Q4_1/Q8_0 weights bit-exact and requantizing the other types ([`SUPPORTED`]).
mod convert;
mod quants;
mod reader;
mod tokenizer;

pub use convert::{hf_name, permute_rows, unpermute_rows, ARCHITECTURES};
pub use quants::{dequantize, repack_lossless, GgmlType, Packed, SUPPORTED};
pub use reader::{GgufFile, TensorInfo, Value};

use mlx::ops::QuantSpec;
use mlx::{Array, Dtype};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Why a GGUF could not be read or imported; every message names the problem.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("not a GGUF file: {0}")]
    NotGguf(String),
    #[error("corrupt or truncated GGUF: {0}")]
    Corrupt(String),
    #[error("unsupported GGUF: {0}")]
    Unsupported(String),
    #[error("{0}")]
    Io(String),
    #[error("MLX failed during the GGUF import: {0}")]
    Mlx(String),
    #[error("{0}")]
    Download(String),
}

impl From<mlx::Error> for GgufError {
    fn from(e: mlx::Error) -> Self {
        GgufError::Mlx(e.to_string())
    }
}

/// How tensors that cannot be kept bit-exact are stored.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// `Some(dtype)`: store every weight dequantized, as floats of this dtype. `None` (the default):
    /// keep Q4_0/Q4_1/Q8_0 exactly and requantize other 2-D weights with `q_bits`/`q_group_size`;
    /// floats (scales, norms, biases, unquantizable weights) are then float32, which holds GGUF's
    /// float16 scales and float32 norms exactly.
    pub dtype: Option<Dtype>,
    pub q_bits: i32,
    pub q_group_size: i32,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions { dtype: None, q_bits: 4, q_group_size: 64 }
    }
}

/// What an import wrote.
#[derive(Clone, Debug, Default)]
pub struct ImportSummary {
    pub out_dir: PathBuf,
    pub architecture: String,
    /// Tensors written (a quantized layer counts once).
    pub tensors: usize,
    /// Weights repacked bit-exactly from Q4_0/Q4_1/Q8_0.
    pub lossless: usize,
    /// Weights dequantized and quantized again with MLX.
    pub requantized: usize,
    /// Tensors stored as floats.
    pub float: usize,
    pub vocab_size: usize,
}

fn io(path: &Path, e: impl std::fmt::Display) -> GgufError {
    GgufError::Io(format!("{}: {e}", path.display()))
}

/// Imports `gguf` into the model folder `out_dir`, which must not exist yet. Everything is written
/// into a temporary sibling folder first and renamed into place, so no half-written folder is left.
pub fn import_gguf(gguf: &Path, out_dir: &Path, opts: &ImportOptions) -> Result<ImportSummary, GgufError> {
    if out_dir.exists() {
        return Err(GgufError::Io(format!("{} already exists; not overwriting it", out_dir.display())));
    }
    if let Some(d) = opts.dtype.filter(|d| !d.is_float()) {
        return Err(GgufError::Unsupported(format!("dtype {d} is not a float type")));
    }
    if ![2, 3, 4, 5, 6, 8].contains(&opts.q_bits) || ![32, 64, 128].contains(&opts.q_group_size) {
        return Err(GgufError::Unsupported(format!(
            "quantization {} bits, group {} (bits 2-6 or 8; group 32, 64 or 128)",
            opts.q_bits, opts.q_group_size
        )));
    }
    let name = out_dir.file_name().ok_or_else(|| io(out_dir, "not a folder name"))?;
    let parent = out_dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
    let tmp = parent.join(format!(".{}.partial-{}", name.to_string_lossy(), std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    }
    fs::create_dir(&tmp).map_err(|e| io(&tmp, e))?;
    let result = write_folder(gguf, &tmp, opts).and_then(|mut summary| {
        fs::rename(&tmp, out_dir).map_err(|e| io(out_dir, format!("moving the finished import into place: {e}")))?;
        summary.out_dir = out_dir.to_owned();
        Ok(summary)
    });
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    result
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<(), GgufError> {
    let text = serde_json::to_string_pretty(v).map_err(|e| io(path, e))?;
    fs::write(path, text + "\n").map_err(|e| io(path, e))
}

fn f16_array(bits: &[u16], shape: &[i32]) -> Result<Array, GgufError> {
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    Ok(Array::from_bytes(&bytes, shape, Dtype::F16)?)
}

/// The whole import into the (empty) folder `dir`.
fn write_folder(gguf: &Path, dir: &Path, opts: &ImportOptions) -> Result<ImportSummary, GgufError> {
    let g = GgufFile::open(gguf)?;
    let mut file = fs::File::open(gguf).map_err(|e| io(gguf, e))?;
    let arch = convert::arch_config(&g, &mut file)?;
    // Refuse a tensor type the import cannot read before the long part.
    if let Some(t) = g.tensors.iter().find(|t| !convert::ignored(&t.name) && !t.ggml_type.is_supported()) {
        return Err(match t.ggml_type.unsupported() {
            GgufError::Unsupported(m) => GgufError::Unsupported(format!("tensor {}: {m}", t.name)),
            e => e,
        });
    }
    let tok = tokenizer::build(&g)?;
    // Refuse a tokenizer.json the tokenizers crate cannot load, before the long part.
    let tok_text = serde_json::to_string(&tok.tokenizer_json).map_err(|e| GgufError::Io(e.to_string()))?;
    tokenizers::Tokenizer::from_bytes(tok_text.as_bytes())
        .map_err(|e| GgufError::Unsupported(format!("the converted tokenizer does not load: {e}")))?;

    // float32 keeps GGUF's f16 scales and f32 norms exactly, and is what MLX's CPU backend runs fast.
    let float_dtype = opts.dtype.unwrap_or(Dtype::F32);
    let requant = QuantSpec::affine(opts.q_group_size, opts.q_bits);
    // mlx-lm's qwen3_moe quant_predicate keeps each router at 8 bits, group 64.
    let router = QuantSpec::affine(64, 8);
    let mut out: Vec<(String, Array)> = Vec::new();
    let mut specs: BTreeMap<String, QuantSpec> = BTreeMap::new();
    let mut summary = ImportSummary { architecture: arch.name.clone(), ..Default::default() };
    for t in &g.tensors {
        if convert::ignored(&t.name) {
            continue;
        }
        let hf = hf_name(&t.name).ok_or_else(|| {
            GgufError::Unsupported(format!("tensor {} has no place in a {} model", t.name, arch.name))
        })?;
        let heads = match t.name.rsplit('.').nth(1) {
            Some("attn_q") if arch.name == "llama" => Some(arch.n_heads as usize),
            Some("attn_k") if arch.name == "llama" => Some(arch.n_kv_heads as usize),
            _ => None,
        };
        // Only stacked experts ([experts, out, in]) have three dimensions.
        let ndim = t.dims.len();
        if ndim > 3 || (ndim == 3 && !hf.contains(".switch_mlp.")) {
            return Err(GgufError::Unsupported(format!("tensor {} has {ndim} dimensions", t.name)));
        }
        let data = g.read_tensor(&mut file, t)?;
        let shape = t.shape();
        let matrix = ndim >= 2;
        let cols = if matrix { t.dims[0] as usize } else { 1 };
        // The leading dimensions of a matrix (or stack of matrices), then the columns.
        let lead: Vec<i32> = shape[..shape.len().saturating_sub(1)].to_vec();
        let with_last = |last: usize| -> Vec<i32> { lead.iter().copied().chain([last as i32]).collect() };
        let layer = hf.strip_suffix(".weight").map(str::to_owned);
        let packed = match (&layer, opts.dtype, matrix) {
            (Some(_), None, true) if t.ggml_type.is_lossless() => repack_lossless(t.ggml_type, &data),
            _ => None,
        };
        if let (Some(p), Some(layer)) = (packed, &layer) {
            let (wcols, groups) = (cols * p.bits as usize / 32, cols / 32);
            let (mut w, mut s, mut b) = (p.weight, p.scales, p.biases);
            if let Some(h) = heads {
                w = unpermute_rows(&w, h, wcols)?;
                s = unpermute_rows(&s, h, groups)?;
                b = unpermute_rows(&b, h, groups)?;
            }
            out.push((hf.clone(), Array::from_slice(&w, &with_last(wcols))?));
            out.push((format!("{layer}.scales"), f16_array(&s, &with_last(groups))?.astype(float_dtype)?));
            out.push((format!("{layer}.biases"), f16_array(&b, &with_last(groups))?.astype(float_dtype)?));
            specs.insert(layer.clone(), QuantSpec::affine(32, p.bits));
            summary.lossless += 1;
            summary.tensors += 1;
            continue;
        }
        let mut values = dequantize(t.ggml_type, &data).map_err(|e| match e {
            GgufError::Unsupported(m) => GgufError::Unsupported(format!("tensor {}: {m}", t.name)),
            e => e,
        })?;
        drop(data);
        if let Some(h) = heads {
            values = unpermute_rows(&values, h, cols)?;
        }
        let a = Array::from_slice(&values, &shape)?.astype(float_dtype)?;
        drop(values);
        let spec = if hf.ends_with(".mlp.gate.weight") { router } else { requant };
        let quantize = opts.dtype.is_none() && matrix && layer.is_some() && cols % spec.group_size as usize == 0;
        if let (true, Some(layer)) = (quantize, &layer) {
            let (w, s, b) = mlx::ops::quantize_affine(&a, spec)?;
            mlx::eval(&[&w, &s, &b])?;
            out.push((hf.clone(), w));
            out.push((format!("{layer}.scales"), s));
            out.push((format!("{layer}.biases"), b));
            specs.insert(layer.clone(), spec);
            summary.requantized += 1;
        } else {
            a.eval()?;
            out.push((hf, a));
            summary.float += 1;
        }
        summary.tensors += 1;
    }
    drop(file);

    // The most common quantization is the default; layers that differ get their own entry.
    let mut config = arch.config;
    if let Some(default) = most_common(specs.values()) {
        let mut q = serde_json::Map::new();
        q.insert("group_size".into(), default.group_size.into());
        q.insert("bits".into(), default.bits.into());
        q.insert("mode".into(), "affine".into());
        for (layer, spec) in specs.iter().filter(|(_, s)| **s != default) {
            q.insert(layer.clone(), serde_json::json!({"group_size": spec.group_size, "bits": spec.bits}));
        }
        config.insert("quantization".into(), q.clone().into());
        config.insert("quantization_config".into(), q.into());
    }
    if let Some(id) = tok.bos_id {
        config.insert("bos_token_id".into(), id.into());
    }
    if let Some(id) = tok.eos_id {
        config.insert("eos_token_id".into(), id.into());
    }
    config.insert("torch_dtype".into(), float_dtype.name().into());
    summary.vocab_size = config.get("vocab_size").and_then(|v| v.as_u64()).unwrap_or(0) as usize;

    let st = dir.join("model.safetensors");
    let refs: Vec<(&str, &Array)> = out.iter().map(|(n, a)| (n.as_str(), a)).collect();
    crate::aligned::save(&st, &refs, &[("format", "mlx")]).map_err(|e| GgufError::Io(e.to_string()))?;
    drop(refs);
    drop(out);
    fs::write(dir.join("tokenizer.json"), tok_text).map_err(|e| io(&dir.join("tokenizer.json"), e))?;
    write_json(&dir.join("tokenizer_config.json"), &tok.tokenizer_config)?;
    write_json(&dir.join("config.json"), &serde_json::Value::Object(config))?;
    Ok(summary)
}

fn most_common<'a>(specs: impl Iterator<Item = &'a QuantSpec>) -> Option<QuantSpec> {
    let mut counts: Vec<(QuantSpec, usize)> = Vec::new();
    for s in specs {
        match counts.iter_mut().find(|(c, _)| c == s) {
            Some((_, n)) => *n += 1,
            None => counts.push((*s, 1)),
        }
    }
    counts.into_iter().max_by_key(|(_, n)| *n).map(|(s, _)| s)
}
