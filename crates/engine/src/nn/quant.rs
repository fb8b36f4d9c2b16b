//! The `quantization` entry of config.json: defaults plus per-layer overrides, and how mlx-lm
//! decides each layer's parameters (present `scales` mean quantized; bits and group size from shapes
//! unless the layer's path is named in the entry).
use crate::error::{EngineError, Result};
use checkpoint::Vb;
use mlx::ops::QuantSpec;
use std::collections::HashMap;

#[derive(Clone, Debug, Default)]
pub struct QuantConfig {
    /// The top-level `group_size`/`bits`, if the model is quantized.
    pub default: Option<QuantSpec>,
    /// Layer path -> its own parameters, or `None` where the entry says `false`.
    pub overrides: HashMap<String, Option<QuantSpec>>,
}

impl QuantConfig {
    /// Parses `config["quantization"]` (or the identical `quantization_config`); a Hugging Face
    /// `quantization_config` (with a `quant_method`) as mlx-lm's `load_model` reads it.
    pub fn from_config(config: &serde_json::Value) -> Result<QuantConfig> {
        let q = match (config.get("quantization"), config.get("quantization_config")) {
            (Some(q), _) => q,
            (None, Some(hf)) if hf.get("quant_method").is_some() => return Self::from_hf(hf),
            (None, Some(q)) => q,
            (None, None) => return Ok(QuantConfig::default()),
        };
        let obj = q.as_object().ok_or_else(|| EngineError::Config("`quantization` is not an object".into()))?;
        if let Some(mode) = obj.get("mode").and_then(|m| m.as_str()) {
            if mode != "affine" {
                return Err(EngineError::Config(format!("quantization mode {mode:?} is not supported (only affine)")));
            }
        }
        let spec = |v: &serde_json::Value, what: &str| -> Result<QuantSpec> {
            let num = |k: &str| v.get(k).and_then(|x| x.as_i64()).map(|x| x as i32);
            match (num("group_size"), num("bits")) {
                (Some(group_size), Some(bits)) => Ok(QuantSpec { group_size, bits }),
                _ => Err(EngineError::Config(format!("quantization entry {what} needs group_size and bits"))),
            }
        };
        let mut overrides = HashMap::new();
        for (k, v) in obj {
            match v {
                serde_json::Value::Object(_) => {
                    overrides.insert(k.clone(), Some(spec(v, k)?));
                }
                serde_json::Value::Bool(false) => {
                    overrides.insert(k.clone(), None);
                }
                _ => {}
            }
        }
        Ok(QuantConfig { default: Some(spec(q, "(top level)")?), overrides })
    }

    /// mlx-lm's "legacy" `quantization_config` branch for the methods it maps to MLX affine
    /// quantization; FP8 block-scaled checkpoints stay unquantized here (the architecture's
    /// `sanitize` dequantizes them), and methods mlx-lm does not know are ignored as it ignores them.
    fn from_hf(hf: &serde_json::Value) -> Result<QuantConfig> {
        let method = hf.get("quant_method").and_then(|m| m.as_str()).unwrap_or_default();
        let unsupported =
            |what: String| Err(EngineError::Config(format!("quantization_config: {what} is not supported (only MLX affine quantization)")));
        match method {
            "fp8" => {
                let ue8m0 = hf.get("scale_fmt").and_then(|f| f.as_str()) == Some("ue8m0");
                let blocks32 = hf.get("weight_block_size") == Some(&serde_json::json!([32, 32]));
                if ue8m0 && blocks32 {
                    return unsupported("fp8 with ue8m0 scales over 32x32 blocks (MLX's mxfp8 mode)".into());
                }
                Ok(QuantConfig::default())
            }
            "compressed-tensors" => match hf.get("format").and_then(|f| f.as_str()) {
                Some("pack-quantized") => {
                    Ok(QuantConfig { default: Some(QuantSpec { group_size: 32, bits: 4 }), overrides: HashMap::new() })
                }
                Some(f @ ("nvfp4-pack-quantized" | "mxfp4-pack-quantized")) => unsupported(format!("compressed-tensors format {f:?}")),
                f => Err(EngineError::Config(format!(
                    "unsupported compressed-tensors format {}; dequantize to bf16 before converting",
                    f.map_or("(none)".to_owned(), |f| format!("{f:?}"))
                ))),
            },
            "bitnet" | "mxfp4" | "mxfp8" | "modelopt" | "awq" | "gptq" => unsupported(format!("quant_method {method:?}")),
            _ => Ok(QuantConfig::default()),
        }
    }

    /// The parameters of the layer at `vb` with `in_dims` inputs, or `None` if it is stored as floats.
    pub fn layer(&self, vb: &Vb<'_>, in_dims: i32) -> Result<Option<QuantSpec>> {
        let path = vb.path("");
        if !vb.contains("scales") {
            return Ok(None);
        }
        if let Some(over) = self.overrides.get(&path) {
            return over
                .ok_or_else(|| EngineError::Config(format!("{path} is marked unquantized but has scales")))
                .map(Some);
        }
        // As mlx-lm's infer_quant_config: from the packed weight and scales shapes.
        let (Some(w), Some(s)) = (vb.shape("weight"), vb.shape("scales")) else {
            return Err(EngineError::missing_tensor(vb.path("weight")));
        };
        let last = |v: &[i32]| v.last().copied().unwrap_or(0);
        let (packed, groups) = (last(&w), last(&s));
        if groups <= 0 || in_dims % groups != 0 || (packed * 32) % in_dims != 0 {
            return Err(EngineError::shape(vb.path("scales"), s, vec![-1, -1]));
        }
        let spec = QuantSpec { group_size: in_dims / groups, bits: packed * 32 / in_dims };
        if ![2, 3, 4, 5, 6, 8].contains(&spec.bits) {
            return Err(EngineError::Config(format!("{path}: {} bits is not a supported quantization", spec.bits)));
        }
        Ok(Some(spec))
    }
}

/// The packed weight, scales and biases of a quantized layer, shape-checked.
#[derive(Clone)]
pub(crate) struct Quantized {
    pub weight: mlx::Array, // (out, in * bits / 32) uint32
    pub scales: mlx::Array, // (out, in / group_size)
    pub biases: mlx::Array, // (out, in / group_size)
    pub spec: QuantSpec,
}

impl Quantized {
    pub fn load(vb: &Vb<'_>, out_dims: i32, in_dims: i32, spec: QuantSpec) -> Result<Quantized> {
        let groups = in_dims / spec.group_size;
        Ok(Quantized {
            weight: vb.get("weight", &[out_dims, in_dims * spec.bits / 32])?,
            scales: vb.get("scales", &[out_dims, groups])?,
            biases: vb.get("biases", &[out_dims, groups])?,
            spec,
        })
    }

    pub fn arrays(&self) -> [&mlx::Array; 3] {
        [&self.weight, &self.scales, &self.biases]
    }

    /// x @ Wᵀ for the packed W.
    pub fn matmul_t(&self, x: &mlx::Array) -> Result<mlx::Array> {
        Ok(mlx::ops::quantized_matmul(x, &self.weight, &self.scales, Some(&self.biases), true, self.spec)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hf(q: serde_json::Value) -> Result<QuantConfig> {
        QuantConfig::from_config(&json!({ "quantization_config": q }))
    }

    #[test]
    fn hugging_face_quantization_configs() {
        let fp8 = hf(json!({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]})).unwrap();
        assert_eq!(fp8.default, None, "FP8 block-scaled weights are dequantized by sanitize");
        let mx = hf(json!({"quant_method": "fp8", "scale_fmt": "ue8m0", "weight_block_size": [32, 32]}));
        assert!(mx.unwrap_err().to_string().contains("mxfp8"));
        let int4 = hf(json!({"quant_method": "compressed-tensors", "format": "pack-quantized"})).unwrap();
        assert_eq!(int4.default, Some(QuantSpec { group_size: 32, bits: 4 }));
        let f8 = hf(json!({"quant_method": "compressed-tensors", "format": "float-quantized"}));
        assert!(f8.unwrap_err().to_string().contains("float-quantized"));
        assert!(hf(json!({"quant_method": "awq", "bits": 4})).is_err());
        // MLX's own entry, with no quant_method, still reads as before.
        let mlx = hf(json!({"group_size": 64, "bits": 4})).unwrap();
        assert_eq!(mlx.default, Some(QuantSpec { group_size: 64, bits: 4 }));
    }
}
