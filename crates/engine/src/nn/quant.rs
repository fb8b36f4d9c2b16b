//! The `quantization` entry of config.json: defaults plus per-layer overrides, and how mlx-lm
//! decides each layer's parameters (present `scales` mean quantized; bits and group size from shapes
//! unless the layer's path is named in the entry).
use crate::error::{EngineError, Result};
use checkpoint::Vb;
use mlx::ops::{QuantMode, QuantSpec};
use std::collections::HashMap;

/// One entry of the `quantization` object: its `mode` (default affine) and `group_size`/`bits`,
/// which the top level (`nn.quantize`'s arguments) must give and a layer's own entry
/// (`to_quantized`'s keyword arguments) may leave out or null for the mode's defaults.
fn spec(v: &serde_json::Value, what: &str, top: bool) -> Result<QuantSpec> {
    let mode = match v.get("mode") {
        None | Some(serde_json::Value::Null) => QuantMode::Affine,
        Some(m) => m.as_str().and_then(QuantMode::parse).ok_or_else(|| {
            EngineError::Config(format!("quantization entry {what}: mode {m} is not one of affine, mxfp4, nvfp4, mxfp8"))
        })?,
    };
    let num = |k: &str| -> Result<Option<i32>> {
        match v.get(k) {
            None | Some(serde_json::Value::Null) if !top => Ok(None),
            None => Err(EngineError::Config(format!("quantization entry {what} needs group_size and bits"))),
            Some(x) => x
                .as_i64()
                .and_then(|x| i32::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| EngineError::Config(format!("quantization entry {what}: {k} is not an integer"))),
        }
    };
    let d = mode.defaults();
    let (group_size, bits) = (num("group_size")?.unwrap_or(d.group_size), num("bits")?.unwrap_or(d.bits));
    if group_size <= 0 || bits <= 0 || mode != QuantMode::Affine && !mode.supports(group_size, bits) {
        return Err(EngineError::Config(format!(
            "quantization entry {what}: {mode} quantization with {bits} bits and group size {group_size} is not supported"
        )));
    }
    Ok(QuantSpec { group_size, bits, mode })
}

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
        let default = spec(q, "(top level)", true)?;
        let mut overrides = HashMap::new();
        for (k, v) in obj {
            match v {
                serde_json::Value::Object(_) => {
                    overrides.insert(k.clone(), Some(spec(v, k, false)?));
                }
                serde_json::Value::Bool(false) => {
                    overrides.insert(k.clone(), None);
                }
                _ => {}
            }
        }
        Ok(QuantConfig { default: Some(default), overrides })
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
                // Power-of-two scales over 32x32 blocks are mxfp8: the architecture's sanitize
                // keeps those weights packed; other FP8 checkpoints it dequantizes.
                let default = (ue8m0 && blocks32).then_some(QuantSpec { group_size: 32, bits: 8, mode: QuantMode::Mxfp8 });
                Ok(QuantConfig { default, overrides: HashMap::new() })
            }
            "compressed-tensors" => match hf.get("format").and_then(|f| f.as_str()) {
                Some("pack-quantized") => {
                    Ok(QuantConfig { default: Some(QuantSpec::affine(32, 4)), overrides: HashMap::new() })
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
        // As mlx-lm's infer_quant_config: from the packed weight and scales shapes, and the mode
        // from the scales' dtype (uint8 for the float modes, each with its one group size and bits).
        let (Some(w), Some(s)) = (vb.shape("weight"), vb.shape("scales")) else {
            return Err(EngineError::missing_tensor(vb.path("weight")));
        };
        let last = |v: &[i32]| v.last().copied().unwrap_or(0);
        let (packed, groups) = (last(&w), last(&s));
        if groups <= 0 || in_dims % groups != 0 || (packed * 32) % in_dims != 0 {
            return Err(EngineError::shape(vb.path("scales"), s, vec![-1, -1]));
        }
        let (group_size, bits) = (in_dims / groups, packed * 32 / in_dims);
        let mode = if vb.dtype("scales") == Some(mlx::Dtype::U8) {
            [QuantMode::Mxfp4, QuantMode::Nvfp4, QuantMode::Mxfp8].into_iter().find(|m| m.supports(group_size, bits))
        } else {
            Some(QuantMode::Affine).filter(|_| [2, 3, 4, 5, 6, 8].contains(&bits))
        };
        let mode = mode.ok_or_else(|| {
            EngineError::Config(format!("{path}: cannot infer the quantization mode of {bits} bits with group size {group_size}"))
        })?;
        Ok(Some(QuantSpec { group_size, bits, mode }))
    }
}

/// The packed weight, scales and (affine mode only) biases of a quantized layer, shape-checked;
/// leading axes (experts, heads) before the (out, in) matrix are allowed.
#[derive(Clone)]
pub(crate) struct Quantized {
    pub weight: mlx::Array,         // (..., out, in * bits / 32) uint32
    pub scales: mlx::Array,         // (..., out, in / group_size)
    pub biases: Option<mlx::Array>, // (..., out, in / group_size), affine only
    pub spec: QuantSpec,
}

impl Quantized {
    pub fn load(vb: &Vb<'_>, out_dims: i32, in_dims: i32, spec: QuantSpec) -> Result<Quantized> {
        Self::load_stacked(vb, &[], out_dims, in_dims, spec)
    }

    /// A layer of `lead`-shaped stacked (out, in) matrices: exactly `weight`, `scales` and, in
    /// the affine mode, `biases`.
    pub fn load_stacked(vb: &Vb<'_>, lead: &[i32], out_dims: i32, in_dims: i32, spec: QuantSpec) -> Result<Quantized> {
        let shape = |last: i32| [lead, &[out_dims, last]].concat();
        let groups = shape(in_dims / spec.group_size);
        Ok(Quantized {
            weight: vb.get("weight", &shape(in_dims * spec.bits / 32))?,
            scales: vb.get("scales", &groups)?,
            biases: if spec.mode.has_biases() { Some(vb.get("biases", &groups)?) } else { None },
            spec,
        })
    }

    /// Whether the product of x (..., in) by this weight takes [`mlx::fast::qmm_rows`]: 1-7 rows
    /// (MLX's CUDA backend multiplies them one row at a time with a matrix-vector kernel that reads
    /// the weight at a fraction of the memory bandwidth; from 8 rows its tiled product takes over) of
    /// a weight large enough on a CUDA GPU ([`with_device_bound_decode`] tells which).
    pub fn few_rows_pays(&self, x: &mlx::Array) -> bool {
        // The switch first: off (not a CUDA GPU) it costs a decode step's products nothing.
        let Some(min_elements) = few_rows_kernel() else { return false };
        (1..=7).contains(&super::rows(x)) && self.matrix_elements() >= min_elements
    }

    /// Whether x's rows take [`mlx::fast::qmm_mma`]'s tensor-core kernel: on a CUDA GPU, affine 4-bit
    /// weights, 8-32 rows by default (a batch step's or a padded verification's products, where MLX's
    /// tiled product reads a weight at about 100 GB/s). Measured on an H100 (BENCHMARKS.md 2026-12-07e):
    /// the Llama-3.2-3B shape's batch step 4.55 against 8.37 ms at 8 rows and 7.9 against 13.9 at 32,
    /// a forward of 8 positions 6.2 against 10.2 ms. `MLX_GEN_QMM_MMA=0` turns it off; `=N` (8-256)
    /// takes it up to N rows (above 32 rows it is not measured in the engine yet).
    fn mma_rows_pays(&self, x: &mlx::Array) -> bool {
        static MAX_ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let max = *MAX_ROWS.get_or_init(|| {
            if !mlx::fast::qmm_rows_available() {
                return 0;
            }
            match std::env::var("MLX_GEN_QMM_MMA").ok().as_deref() {
                None | Some("1") => MMA_DEFAULT_MAX_ROWS,
                Some(v) => v.parse::<usize>().map_or(MMA_DEFAULT_MAX_ROWS, |n| if n >= 8 { n.min(256) } else { 0 }),
            }
        });
        max > 0 && (8..=max).contains(&super::rows(x)) && self.spec.mode == QuantMode::Affine && self.spec.bits == 4
    }

    /// Whether the product of x (..., in) by this (out, in) weight is cheaper as the weight
    /// dequantized to x's type and multiplied by the device's dense product (cuBLAS): on a CUDA
    /// GPU, a prompt's chunk of 1,024+ rows whose rows x weight elements reach 4e9. Timed on an H100
    /// (`prefill_gemm.py`, BENCHMARKS.md 2026-12-06f), MLX's tiled quantized product
    /// runs at 90-147 TFLOPS at 512-2048 rows, the dequantized copy and cuBLAS at 150-510: Llama-3.2-3B's
    /// 8,192 x 3,072 weight at 2,048 rows 200.9 against 699.8 us, at 512 rows 111.7 against 184.9;
    /// below 512 rows, or for small weights at 512, MLX's is faster. From 128 rows the two gave
    /// the same values bit for bit, so a prompt's tokens stay mlx-lm's. Each dequantized weight is
    /// a transient (Llama-3.2-3B: about 200 MB a layer, held while the layers queued ahead run):
    /// from 1,024 rows, where the products gain 2x and more, not at a 512-token prompt, whose
    /// peak is 0.77x mlx-lm's today against issue 22's 0.8x. `MLX_GEN_PREFILL_GEMM=0` turns it off.
    fn dequantized_pays(&self, x: &mlx::Array) -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        static MIN_ROWS: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
        let on = *ON.get_or_init(|| {
            std::env::var("MLX_GEN_PREFILL_GEMM").map_or(true, |v| v != "0") && mlx::fast::qmm_rows_available()
        });
        // `MLX_GEN_PREFILL_GEMM_ROWS=N` moves the rows' bound (a measurement knob: a 512-token
        // prompt's products against its peak memory, `gpu_suite.sh prefill`).
        let min_rows = *MIN_ROWS.get_or_init(|| {
            std::env::var("MLX_GEN_PREFILL_GEMM_ROWS").ok().and_then(|v| v.parse().ok()).filter(|&n: &i64| n >= 128).unwrap_or(DEQUANT_MIN_ROWS)
        });
        let rows = super::rows(x) as i64;
        on && rows >= min_rows
            && rows.saturating_mul(self.matrix_elements()) >= DEQUANT_MIN_WORK
            && self.spec.mode == QuantMode::Affine
    }

    /// The values of one (out, in) matrix (an expert's, when stacked).
    fn matrix_elements(&self) -> i64 {
        i64::from(self.weight.dim(-2)) * i64::from(self.weight.dim(-1)) * 32 / i64::from(self.spec.bits)
    }

    /// Whether this layer's stacked experts (E, out, in) take [`mlx::fast::gather_qmm_rows`]'s
    /// kernel for a few tokens on a CUDA GPU (`MLX_GEN_GATHER_KERNEL=0` turns it off), experts of
    /// 2^24+ elements (Mixtral's 14336 x 4096; not Qwen3-30B-A3B's 768 x 2048, whose step is the
    /// host's). Measured on an H100 (BENCHMARKS.md 2026-12-07c): the product 1.3-1.9x MLX's gathered
    /// one at 1-4 tokens, Mixtral-8x7B's decode 137-139 tok/s against 101-103 without it, 1.40x
    /// mlx-lm's in the same run (3 alternating rounds).
    pub fn gathered_rows_pay(&self) -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let on = *ON.get_or_init(|| std::env::var("MLX_GEN_GATHER_KERNEL").map_or(true, |v| v != "0") && mlx::fast::qmm_rows_available());
        on && self.weight.ndim() == 3 && self.matrix_elements() >= LARGE_WEIGHT
    }

    pub fn arrays(&self) -> Vec<&mlx::Array> {
        [&self.weight, &self.scales].into_iter().chain(self.biases.as_ref()).collect()
    }

    /// The same layer with `f` applied to each of its arrays (a shard, a slice).
    pub fn map(&self, f: impl Fn(&mlx::Array) -> Result<mlx::Array>) -> Result<Quantized> {
        Ok(Quantized {
            weight: f(&self.weight)?,
            scales: f(&self.scales)?,
            biases: self.biases.as_ref().map(&f).transpose()?,
            spec: self.spec,
        })
    }

    /// The layers `parts` (all with this spec) side by side along the output axis.
    pub fn concat(parts: &[&Quantized], spec: QuantSpec) -> Result<Quantized> {
        let cat = |pick: fn(&Quantized) -> Option<&mlx::Array>| -> Result<Option<mlx::Array>> {
            let arrays: Option<Vec<&mlx::Array>> = parts.iter().map(|q| pick(q)).collect();
            Ok(arrays.map(|a| mlx::ops::concatenate(&a, -2)).transpose()?)
        };
        let missing = || EngineError::Invalid("fusing quantized layers without their arrays".into());
        Ok(Quantized {
            weight: cat(|q| Some(&q.weight))?.ok_or_else(missing)?,
            scales: cat(|q| Some(&q.scales))?.ok_or_else(missing)?,
            biases: cat(|q| q.biases.as_ref())?,
            spec,
        })
    }

    /// `x @ Wᵀ` (`transpose`) or `x @ W` for the packed W.
    pub fn matmul(&self, x: &mlx::Array, transpose: bool) -> Result<mlx::Array> {
        Ok(mlx::ops::quantized_matmul(x, &self.weight, &self.scales, self.biases.as_ref(), transpose, self.spec)?)
    }

    /// x @ Wᵀ for the packed W, x (..., in) -> (..., out). Leading axes are folded into the rows,
    /// (B, 1, in) as (B, in): MLX's CUDA backend takes a batch decode step's (B, 1, in) as B
    /// products of one row, timed on the H100 (`gpu_suite.sh qmm`, 3072 x 3072, 4-bit) at 135 us
    /// for 32 rows against 60 us as one product of 32 rows. A single sequence's (1, L, in) is the
    /// same product either way. A few rows of a large weight (a decode step, a batch step, a
    /// verification) take [`mlx::fast::qmm_rows`] on a CUDA GPU ([`Quantized::few_rows_pays`]),
    /// except in a single sequence's prompt prefill, which keeps MLX's kernels as mlx-lm; a
    /// prompt's chunk of many rows takes the dequantized weight ([`Quantized::dequantized_pays`]).
    pub fn matmul_t(&self, x: &mlx::Array) -> Result<mlx::Array> {
        if self.weight.ndim() != 2 || x.ndim() == 0 {
            return self.matmul(x, true);
        }
        if self.dequantized_pays(x) {
            let w = mlx::ops::dequantize(&self.weight, &self.scales, self.biases.as_ref(), self.spec)?; // (out, in)
            return Ok(x.matmul(&w.t()?)?); // (..., out)
        }
        let ours_only = !crate::nn::sdpa::mlx_kernels_only();
        let few = self.few_rows_pays(x) && ours_only;
        let mma = !few && ours_only && self.mma_rows_pays(x);
        // A single sequence's (1, L, in) needs no reshape (two primitives a product, 20 a layer of
        // Qwen3.5-35B-A3B's decode step): MLX's product and our kernels take it as it is.
        let one_matrix = x.ndim() <= 2 || (x.ndim() == 3 && x.dim(0) == 1);
        let product = |x: &mlx::Array| -> Result<mlx::Array> {
            let (w, s, b, q) = (&self.weight, &self.scales, self.biases.as_ref(), self.spec);
            Ok(if few {
                mlx::fast::qmm_rows(x, w, s, b, q)?
            } else if mma {
                mlx::fast::qmm_mma(x, w, s, b, q)?
            } else {
                self.matmul(x, true)?
            })
        };
        if one_matrix && ((!few && !mma) || x.ndim() >= 2) {
            return product(x); // (..., out)
        }
        let mut shape = x.shape();
        let x2 = x.reshape(&[-1, x.dim(-1)])?; // (rows, in)
        let y = product(&x2)?; // (rows, out)
        *shape.last_mut().expect("x has an axis") = y.dim(-1);
        Ok(y.reshape(&shape)?) // (..., out)
    }
}

/// Where [`mlx::fast::qmm_rows`]'s kernel runs: `MLX_GEN_QMM_KERNEL=0` nowhere, `=1` products of
/// weights of 2^24+ elements, `=all` every weight; unset, the model decides
/// ([`with_device_bound_decode`]). Never where the kernel does not run (not a CUDA GPU).
#[derive(Clone, Copy)]
enum Switch {
    Off,
    Auto,
    Min(i64),
}

fn switch() -> Switch {
    static ON: std::sync::OnceLock<Switch> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        if !mlx::fast::qmm_rows_available() {
            return Switch::Off;
        }
        match std::env::var("MLX_GEN_QMM_KERNEL").as_deref() {
            Ok("0") => Switch::Off,
            Ok("1") => Switch::Min(LARGE_WEIGHT),
            Ok("all") => Switch::Min(0),
            _ => Switch::Auto,
        }
    })
}

/// Rows from which a product may take the dequantized weight ([`Quantized::dequantized_pays`]).
const DEQUANT_MIN_ROWS: i64 = 1024;

/// Rows x weight elements from which it does (2,047 rows of a 2,048 x 1,024 weight: 4.3e9, 1.5x
/// faster at 2,048 rows; not 1,024 of a 1,024 x 3,072 one: 3.2e9).
const DEQUANT_MIN_WORK: i64 = 4_000_000_000;

/// The most rows [`Quantized::mma_rows_pays`] gives the tensor-core kernel by default.
const MMA_DEFAULT_MAX_ROWS: usize = 32;

/// Weights of this many elements or more take the few-row kernel in every model. Since the kernel
/// is launched by a primitive of ours (the shim's jit.cpp) a call costs the host what MLX's product
/// does, and every weight through it is as fast as this default on Llama-3.2-3B and Qwen3.5-9B and
/// 1.5% slower on Qwen3-0.6B (BENCHMARKS.md, 2026-12-06e): small weights gain nothing.
const LARGE_WEIGHT: i64 = 1 << 24;

thread_local! {
    /// Inside [`with_device_bound_decode`] with `true`.
    static DEVICE_BOUND: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` (a model's forward pass) with every weight's products of a few rows through the
/// few-row kernel where `device_bound` (the model's decode step is the device's, so the kernel's
/// host cost is hidden), else only those of weights of 2^24+ elements. Measured on the H100
/// (BENCHMARKS.md, 2026-12-06d, decode at prompt 512, 3 rounds): Qwen2.5-7B 1.12-1.48x
/// faster with the large weights through it, 1.44-1.66x with every weight; Llama-3.2-3B 1.01-1.07x
/// with the large weights; Qwen3-0.6B unchanged. Launched by our own primitive (2026-12-06e):
/// Llama-3.2-3B 1.07x and Qwen3.5-9B 1.13x faster again, Qwen3-0.6B unchanged.
pub fn with_device_bound_decode<T>(device_bound: bool, f: impl FnOnce() -> T) -> T {
    let before = DEVICE_BOUND.with(|c| c.replace(device_bound));
    let out = f();
    DEVICE_BOUND.with(|c| c.set(before));
    out
}

/// The smallest weight (in elements) whose products of a few rows take the kernel, or none.
fn few_rows_kernel() -> Option<i64> {
    match switch() {
        Switch::Off => None,
        Switch::Min(m) => Some(m),
        Switch::Auto => Some(if DEVICE_BOUND.with(std::cell::Cell::get) { 0 } else { LARGE_WEIGHT }),
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
    fn leading_axes_folded_into_rows_give_the_same_products() {
        let w = mlx::random::uniform(&[64, 128], mlx::Dtype::F32).unwrap();
        let (wq, scales, biases) = mlx::ops::quantize(&w, QuantSpec::affine(64, 4)).unwrap();
        let q = Quantized { weight: wq, scales, biases, spec: QuantSpec::affine(64, 4) };
        for shape in [&[3, 128][..], &[2, 1, 128], &[1, 5, 128], &[1, 1, 128], &[2, 3, 1, 128]] {
            let x = mlx::random::uniform(shape, mlx::Dtype::F32).unwrap();
            let (a, b) = (q.matmul(&x, true).unwrap(), q.matmul_t(&x).unwrap());
            assert_eq!(a.shape(), b.shape());
            assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap(), "{shape:?}");
        }
    }

    #[test]
    fn hugging_face_quantization_configs() {
        let fp8 = hf(json!({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]})).unwrap();
        assert_eq!(fp8.default, None, "FP8 block-scaled weights are dequantized by sanitize");
        let mx = hf(json!({"quant_method": "fp8", "scale_fmt": "ue8m0", "weight_block_size": [32, 32]})).unwrap();
        assert_eq!(mx.default, Some(QuantSpec { group_size: 32, bits: 8, mode: QuantMode::Mxfp8 }), "ue8m0 32x32 blocks stay packed as mxfp8");
        let int4 = hf(json!({"quant_method": "compressed-tensors", "format": "pack-quantized"})).unwrap();
        assert_eq!(int4.default, Some(QuantSpec::affine(32, 4)));
        let f8 = hf(json!({"quant_method": "compressed-tensors", "format": "float-quantized"}));
        assert!(f8.unwrap_err().to_string().contains("float-quantized"));
        assert!(hf(json!({"quant_method": "awq", "bits": 4})).is_err());
        let mx = QuantConfig::from_config(&json!({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}})).unwrap();
        assert_eq!(mx.default, Some(QuantMode::Mxfp4.defaults()));
        let bad = QuantConfig::from_config(&json!({"quantization": {"group_size": 64, "bits": 4, "mode": "nvfp4"}}));
        assert!(bad.unwrap_err().to_string().contains("not supported"));
        // mlx_lm.convert --quant-predicate writes a null group size per layer: the mode's default.
        let mixed = json!({"quantization": {"group_size": 64, "bits": 4, "mode": "affine",
            "lm_head": {"group_size": null, "bits": 6, "mode": "affine"}}});
        let mixed = QuantConfig::from_config(&mixed).unwrap();
        assert_eq!(mixed.overrides["lm_head"], Some(QuantSpec::affine(64, 6)));
        // MLX's own entry, with no quant_method, still reads as before.
        let mlx = hf(json!({"group_size": 64, "bits": 4})).unwrap();
        assert_eq!(mlx.default, Some(QuantSpec::affine(64, 4)));
    }
}
