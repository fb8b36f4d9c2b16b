//! From llama.cpp's view of a model to Hugging Face's: config.json from the `{arch}.*` metadata,
//! tensor names, and undoing the Q/K row permutation llama.cpp applies to `llama` checkpoints.
use super::reader::{GgufFile, Value};
use super::GgufError;
use serde_json::{json, Map, Value as Json};

/// The GGUF architectures the import understands.
pub const ARCHITECTURES: &[&str] = &["llama", "qwen2"];

/// The Hugging Face name of a GGUF tensor, or `None` for tensors the model does not use.
pub fn hf_name(name: &str) -> Option<String> {
    let fixed = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_owned());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: u32 = layer.parse().ok()?;
    let (part, suffix) = rest.rsplit_once('.')?;
    let hf = match part {
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// GGUF tensors an import skips on purpose (precomputed rotary tables of old conversions).
pub fn ignored(name: &str) -> bool {
    name.ends_with(".attn_rot_embd") || name.ends_with(".rope_freqs")
}

/// Row `r` of the GGUF tensor holds row `source_row(r)` of the Hugging Face tensor: llama.cpp's
/// `permute` turns each head's `[2, D/2]` row halves into `[D/2, 2]`.
fn gguf_row_of_hf(hf_row: usize, head_dim: usize) -> usize {
    let (h, r) = (hf_row / head_dim, hf_row % head_dim);
    let (i, j) = (r / (head_dim / 2), r % (head_dim / 2));
    h * head_dim + j * 2 + i
}

/// (rows, rows per head) of `len` elements in rows of `row_len`, checked for a permutation.
fn heads_of(len: usize, n_heads: usize, row_len: usize) -> Result<(usize, usize), GgufError> {
    let rows = len / row_len.max(1);
    if n_heads == 0 || !rows.is_multiple_of(n_heads) || !(rows / n_heads).is_multiple_of(2) || rows * row_len != len {
        return Err(GgufError::Corrupt(format!("cannot split {rows} rows into {n_heads} heads of row pairs")));
    }
    Ok((rows, rows / n_heads))
}

/// Undoes llama.cpp's Q/K permutation on `rows` rows of `row_len` elements each (any element type,
/// so packed quantized rows and their scales too): HF row (h, i, j) = GGUF row (h, j, i).
pub fn unpermute_rows<T: Copy>(data: &[T], n_heads: usize, row_len: usize) -> Result<Vec<T>, GgufError> {
    let (rows, hd) = heads_of(data.len(), n_heads, row_len)?;
    let mut out = Vec::with_capacity(data.len());
    for r in 0..rows {
        let src = gguf_row_of_hf(r, hd);
        out.extend_from_slice(&data[src * row_len..(src + 1) * row_len]);
    }
    Ok(out)
}

/// llama.cpp's permutation itself (the inverse of [`unpermute_rows`]), for tests.
pub fn permute_rows<T: Copy>(data: &[T], n_heads: usize, row_len: usize) -> Result<Vec<T>, GgufError> {
    let (rows, hd) = heads_of(data.len(), n_heads, row_len)?;
    let mut out = data.to_vec();
    for r in 0..rows {
        let dst = gguf_row_of_hf(r, hd);
        out[dst * row_len..(dst + 1) * row_len].copy_from_slice(&data[r * row_len..(r + 1) * row_len]);
    }
    Ok(out)
}

/// The model hyper-parameters the import needs besides config.json.
pub struct Arch {
    pub name: String,
    pub n_heads: u64,
    pub n_kv_heads: u64,
    pub config: Map<String, Json>,
}

/// config.json's architecture fields from the metadata (tokenizer ids and quantization come later).
pub fn arch_config(g: &GgufFile) -> Result<Arch, GgufError> {
    let arch = g
        .get("general.architecture")
        .and_then(Value::as_str)
        .ok_or_else(|| GgufError::Corrupt("no general.architecture in the metadata".into()))?
        .to_owned();
    if !ARCHITECTURES.contains(&arch.as_str()) {
        return Err(GgufError::Unsupported(format!(
            "GGUF architecture {arch:?} (supported: {})",
            ARCHITECTURES.join(", ")
        )));
    }
    let key = |k: &str| g.get(&format!("{arch}.{k}"));
    let int = |k: &str| -> Result<u64, GgufError> {
        key(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| GgufError::Corrupt(format!("metadata {arch}.{k} is missing or not an integer")))
    };
    let hidden = int("embedding_length")?;
    let n_heads = int("attention.head_count")?;
    let n_kv_heads = key("attention.head_count_kv").and_then(Value::as_u64).unwrap_or(n_heads);
    if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
        return Err(GgufError::Corrupt(format!("{n_heads} attention heads with {n_kv_heads} KV heads")));
    }
    let embd = g.tensor("token_embd.weight").ok_or_else(|| GgufError::Corrupt("no token_embd.weight tensor".into()))?;
    let vocab = *embd.dims.get(1).unwrap_or(&0);
    let mut c = Map::new();
    let (hf_arch, default_theta) =
        if arch == "llama" { ("LlamaForCausalLM", 10000.0) } else { ("Qwen2ForCausalLM", 1e6) };
    c.insert("architectures".into(), json!([hf_arch]));
    c.insert("model_type".into(), json!(arch));
    c.insert("hidden_size".into(), json!(hidden));
    c.insert("intermediate_size".into(), json!(int("feed_forward_length")?));
    c.insert("num_hidden_layers".into(), json!(int("block_count")?));
    c.insert("num_attention_heads".into(), json!(n_heads));
    c.insert("num_key_value_heads".into(), json!(n_kv_heads));
    let head_dim = key("attention.key_length").or_else(|| key("rope.dimension_count")).and_then(Value::as_u64);
    if let Some(hd) = head_dim.filter(|&hd| hd != hidden / n_heads) {
        if arch != "llama" {
            return Err(GgufError::Unsupported(format!("{arch} with head_dim {hd} != hidden_size / heads")));
        }
        c.insert("head_dim".into(), json!(hd));
    }
    let eps = key("attention.layer_norm_rms_epsilon").and_then(Value::as_f64).unwrap_or(1e-6);
    c.insert("rms_norm_eps".into(), json!(f32_to_decimal(eps)));
    let theta = key("rope.freq_base").and_then(Value::as_f64).unwrap_or(default_theta);
    c.insert("rope_theta".into(), json!(f32_to_decimal(theta)));
    if let Some(ctx) = key("context_length").and_then(Value::as_u64) {
        c.insert("max_position_embeddings".into(), json!(ctx));
    }
    c.insert("vocab_size".into(), json!(vocab));
    c.insert("tie_word_embeddings".into(), json!(g.tensor("output.weight").is_none()));
    if arch == "llama" {
        let bias = g.tensors.iter().any(|t| t.name.ends_with("attn_q.bias"));
        c.insert("attention_bias".into(), json!(bias));
        c.insert("mlp_bias".into(), json!(false));
    }
    match key("rope.scaling.type").and_then(Value::as_str) {
        None | Some("none") => {}
        Some("linear") => {
            let factor = key("rope.scaling.factor").and_then(Value::as_f64).unwrap_or(1.0);
            c.insert("rope_scaling".into(), json!({"type": "linear", "rope_type": "linear", "factor": factor}));
        }
        Some(other) => return Err(GgufError::Unsupported(format!("rope scaling {other:?}"))),
    }
    if g.tensor("rope_freqs.weight").is_some() {
        return Err(GgufError::Unsupported(
            "rope_freqs (Llama 3.1-style rope scaling factors) cannot be imported yet".into(),
        ));
    }
    Ok(Arch { name: arch, n_heads, n_kv_heads, config: c })
}

/// A float32 metadata value (widened to f64) as the shortest decimal that rounds back to it, so
/// 1e-5 stored as f32 is written `1e-5`, as Hugging Face configs spell it.
fn f32_to_decimal(v: f64) -> f64 {
    let f = v as f32;
    if f as f64 == v {
        format!("{f}").parse().unwrap_or(v)
    } else {
        v
    }
}
