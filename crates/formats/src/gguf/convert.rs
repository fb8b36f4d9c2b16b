//! From llama.cpp's view of a model to Hugging Face's: config.json from the `{arch}.*` metadata
//! (llama, qwen2, qwen3, qwen3moe; Llama 3.x `rope_freqs` back to `rope_scaling`), tensor names, and
//! undoing the Q/K row permutation llama.cpp applies to `llama` checkpoints.
use super::quants::{dequantize, GgmlType};
use super::reader::{GgufFile, Value};
use super::GgufError;
use serde_json::{json, Map, Value as Json};
use std::fs::File;

/// The GGUF architectures the import understands.
pub const ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3", "qwen3moe"];

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
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        // qwen3moe: the router and the experts stacked as [experts, out, in] (mlx-lm's sanitized names).
        "ffn_gate_inp" => "mlp.gate",
        "ffn_gate_exps" => "mlp.switch_mlp.gate_proj",
        "ffn_up_exps" => "mlp.switch_mlp.up_proj",
        "ffn_down_exps" => "mlp.switch_mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// GGUF tensors an import skips on purpose: precomputed rotary tables of old conversions, and
/// Llama 3.x's `rope_freqs`, which [`arch_config`] turns back into config.json's `rope_scaling`.
pub fn ignored(name: &str) -> bool {
    name.ends_with(".attn_rot_embd") || name.ends_with(".rope_freqs") || name == ROPE_FREQS
}

const ROPE_FREQS: &str = "rope_freqs.weight";

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

/// config.json's architecture fields from the metadata (tokenizer ids and quantization come later);
/// `file` is the GGUF itself, for the `rope_freqs` tensor.
pub fn arch_config(g: &GgufFile, file: &mut File) -> Result<Arch, GgufError> {
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
    let qwen3 = arch.starts_with("qwen3");
    let embd = g.tensor("token_embd.weight").ok_or_else(|| GgufError::Corrupt("no token_embd.weight tensor".into()))?;
    let vocab = *embd.dims.get(1).unwrap_or(&0);
    let mut c = Map::new();
    let (hf_arch, model_type, default_theta) = match arch.as_str() {
        "llama" => ("LlamaForCausalLM", "llama", 10000.0),
        "qwen2" => ("Qwen2ForCausalLM", "qwen2", 1e6),
        "qwen3" => ("Qwen3ForCausalLM", "qwen3", 1e6),
        _ => ("Qwen3MoeForCausalLM", "qwen3_moe", 1e6),
    };
    c.insert("architectures".into(), json!([hf_arch]));
    c.insert("model_type".into(), json!(model_type));
    c.insert("hidden_size".into(), json!(hidden));
    if arch == "qwen3moe" {
        // llama.cpp's names for Qwen3-MoE's hyper-parameters; every layer is sparse, and
        // llm_build_qwen3moe renormalises the chosen experts' weights.
        let moe_ffn = int("expert_feed_forward_length")?;
        c.insert("num_experts".into(), json!(int("expert_count")?));
        c.insert("num_experts_per_tok".into(), json!(int("expert_used_count")?));
        c.insert("moe_intermediate_size".into(), json!(moe_ffn));
        c.insert("decoder_sparse_step".into(), json!(1));
        c.insert("mlp_only_layers".into(), json!([]));
        let norm = key("expert_weights_norm").and_then(Value::as_bool).unwrap_or(true);
        c.insert("norm_topk_prob".into(), json!(norm));
        let ffn = key("feed_forward_length").and_then(Value::as_u64).unwrap_or(moe_ffn);
        c.insert("intermediate_size".into(), json!(ffn));
    } else {
        c.insert("intermediate_size".into(), json!(int("feed_forward_length")?));
    }
    c.insert("num_hidden_layers".into(), json!(int("block_count")?));
    c.insert("num_attention_heads".into(), json!(n_heads));
    c.insert("num_key_value_heads".into(), json!(n_kv_heads));
    let head_dim = key("attention.key_length").or_else(|| key("rope.dimension_count")).and_then(Value::as_u64);
    if qwen3 {
        // Qwen3 always names head_dim (mlx-lm requires it).
        c.insert("head_dim".into(), json!(head_dim.unwrap_or(hidden / n_heads)));
    } else if let Some(hd) = head_dim.filter(|&hd| hd != hidden / n_heads) {
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
        Some("llama3") => {}
        Some(other) => {
            return Err(GgufError::Unsupported(format!("rope scaling {other:?} (supported: none, linear, llama3)")))
        }
    }
    if let Some(t) = g.tensor(ROPE_FREQS) {
        if arch != "llama" || c.contains_key("rope_scaling") {
            return Err(GgufError::Unsupported(format!("{ROPE_FREQS} in a {arch} model with other rope scaling")));
        }
        let freqs = match t.ggml_type {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => dequantize(t.ggml_type, &g.read_tensor(file, t)?)?,
            other => return Err(GgufError::Unsupported(format!("{ROPE_FREQS} of type {other:?}"))),
        };
        let hd = head_dim.unwrap_or(hidden / n_heads);
        let param = |k: &str| key(&format!("rope.scaling.{k}")).and_then(Value::as_f64);
        let scaling = llama3_scaling(&freqs, hd, theta, &param)?;
        c.insert("rope_scaling".into(), scaling);
    } else if key("rope.scaling.type").and_then(Value::as_str) == Some("llama3") {
        return Err(GgufError::Corrupt(format!("llama3 rope scaling without a {ROPE_FREQS} tensor")));
    }
    Ok(Arch { name: arch, n_heads, n_kv_heads, config: c })
}

/// llama.cpp's `rope_freqs` (per frequency, the divisor Llama 3's rope scaling applies) from the
/// `rope_scaling` parameters, as `LlamaModel.generate_extra_tensors` in convert_hf_to_gguf.py computes it.
fn llama3_factors(head_dim: u64, base: f64, factor: f64, low: f64, high: f64, original: f64) -> Vec<f64> {
    let (low_wavelen, high_wavelen) = (original / low, original / high);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / base.powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

/// config.json's `rope_scaling` for a Llama 3.x GGUF. llama.cpp's converter writes only the
/// `rope_freqs` tensor, not the parameters it came from; those default to Llama 3.1/3.2's (low 1,
/// high 4, original context 8192; the factor is the largest entry, 8 or 32) unless the metadata has
/// `llama.rope.scaling.{factor,low_freq_factor,high_freq_factor,original_context_length}`. The tensor
/// must then equal what the parameters give (relative 1e-4), or the import is refused.
fn llama3_scaling(
    freqs: &[f32],
    head_dim: u64,
    base: f64,
    param: &dyn Fn(&str) -> Option<f64>,
) -> Result<Json, GgufError> {
    let max = freqs.iter().fold(f32::NAN, |m, &v| m.max(v)) as f64;
    let factor = param("factor").unwrap_or(max);
    let low = param("low_freq_factor").unwrap_or(1.0);
    let high = param("high_freq_factor").unwrap_or(4.0);
    let original = param("original_context_length").unwrap_or(8192.0);
    let want = llama3_factors(head_dim, base, factor, low, high, original);
    let sane = factor.is_finite() && factor >= 1.0 && high > low && low > 0.0 && original > 0.0;
    let close = want.len() == freqs.len()
        && want.iter().zip(freqs).all(|(&w, &g)| ((g as f64) - w).abs() <= 1e-4 * w.abs().max(1.0));
    if !sane || !close {
        return Err(GgufError::Unsupported(format!(
            "{ROPE_FREQS} ({} values) is not Llama 3 rope scaling with factor {factor}, low_freq_factor {low}, \
             high_freq_factor {high}, original_max_position_embeddings {original} and head_dim {head_dim}",
            freqs.len()
        )));
    }
    Ok(json!({
        "rope_type": "llama3",
        "factor": f32_to_decimal(factor),
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original as u64,
    }))
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
