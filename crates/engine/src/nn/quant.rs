//! The `quantization` entry of config.json: defaults plus per-layer overrides, and how mlx-lm
//! decides each layer's parameters (present `scales` mean quantized; bits and group size from shapes
//! unless the layer's path is named in the entry).
use crate::error::{EngineError, Result};
use crate::weights::Vb;
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
    /// Parses `config["quantization"]` (or the identical `quantization_config`).
    pub fn from_config(config: &serde_json::Value) -> Result<QuantConfig> {
        let Some(q) = config.get("quantization").or_else(|| config.get("quantization_config")) else {
            return Ok(QuantConfig::default());
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
            return Err(EngineError::MissingTensor(vb.path("weight")));
        };
        let last = |v: &[i32]| v.last().copied().unwrap_or(0);
        let (packed, groups) = (last(&w), last(&s));
        if groups <= 0 || in_dims % groups != 0 || (packed * 32) % in_dims != 0 {
            return Err(EngineError::Shape { name: vb.path("scales"), found: s, expected: vec![-1, -1] });
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
