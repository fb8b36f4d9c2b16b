//! `mlx-gen convert`: a Hugging Face float model (folder or repo id) or a GGUF file to an MLX model
//! folder, as `mlx_lm.convert` does it (`-q`, `--q-bits`, `--q-group-size`, `--q-mode`,
//! `--quant-predicate`, `--dtype`, `-d`).
use anyhow::{bail, Context, Result};
use formats::convert::{convert_folder, convert_gguf, write_atomically, ConvertOptions, ModelRules};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use formats::mixed_quant::MixedRecipe;
use mlx::ops::QuantMode;
use mlx::Dtype;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// The source: a Hugging Face model folder, a repo id (org/name) or a .gguf file.
    #[arg(long, visible_alias = "hf-path")]
    model: PathBuf,
    /// The MLX model folder to write (must not exist, unless --force).
    #[arg(long, default_value = "mlx_model")]
    mlx_path: PathBuf,
    /// Quantize the weights. `-q` after `convert` means this, as in mlx_lm.convert (see [`argv`]).
    #[arg(long)]
    quantize: bool,
    /// Bits per weight when quantizing (default: 4, or 8 for mxfp8).
    #[arg(long)]
    q_bits: Option<i32>,
    /// Group size when quantizing (default: 64 affine, 32 mxfp4/mxfp8, 16 nvfp4).
    #[arg(long)]
    q_group_size: Option<i32>,
    /// The quantization mode: affine (scales and biases), or the microscaling float formats.
    #[arg(long, default_value = "affine", value_parser = ["affine", "mxfp4", "nvfp4", "mxfp8"])]
    q_mode: String,
    /// A mixed-precision recipe (affine): more bits for the v/down projections of some layers and the head.
    #[arg(long, value_parser = ["mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6"])]
    quant_predicate: Option<String>,
    /// Type of the float parameters (default: config.json's torch_dtype).
    #[arg(long, value_parser = ["float16", "bfloat16", "float32"])]
    dtype: Option<String>,
    /// Dequantize an MLX-quantized folder back to floats (`--dtype`, else config.json's torch_dtype).
    #[arg(short = 'd', long)]
    dequantize: bool,
    /// Replace an existing --mlx-path (only once the new folder is complete).
    #[arg(long)]
    force: bool,
}

/// The engine's architectures' `sanitize` and config updates, as `formats::convert` asks for them.
struct EngineRules;

impl ModelRules for EngineRules {
    fn sanitize(
        &self,
        model_type: &str,
        config: &serde_json::Map<String, serde_json::Value>,
        weights: &mut std::collections::BTreeMap<String, mlx::Array>,
    ) -> std::result::Result<(), String> {
        engine::models::sanitize(model_type, config, weights).map_err(|e| e.to_string())
    }

    fn quant_override(&self, model_type: &str, path: &str) -> Option<mlx::ops::QuantSpec> {
        engine::models::quant_override(model_type, path)
    }

    fn quantizable(&self, model_type: &str, layer: &str) -> bool {
        engine::models::quantizable(model_type, layer)
    }

    fn keeps_dtype(&self, model_type: &str, name: &str) -> bool {
        engine::models::keeps_dtype(model_type, name)
    }

    fn update_config(&self, model_type: &str, config: &mut serde_json::Map<String, serde_json::Value>) {
        engine::models::update_config(model_type, config);
    }

    fn layer_quant(&self, config: &serde_json::Map<String, serde_json::Value>) -> std::result::Result<formats::convert::LayerQuant, String> {
        let q = engine::nn::QuantConfig::from_config(&serde_json::Value::Object(config.clone())).map_err(|e| e.to_string())?;
        Ok(Box::new(move |layer| match q.overrides.get(layer) {
            Some(own) => *own,
            None => q.default,
        }))
    }
}

pub fn run(args: Args) -> Result<()> {
    let opts = ConvertOptions {
        quantize: args.quantize,
        q_bits: args.q_bits,
        q_group_size: args.q_group_size,
        q_mode: QuantMode::parse(&args.q_mode).unwrap_or_default(),
        quant_predicate: args.quant_predicate.as_deref().and_then(MixedRecipe::parse),
        dtype: args.dtype.as_deref().and_then(Dtype::parse_float),
        dequantize: args.dequantize,
    };
    let dst = &args.mlx_path;
    if dst.exists() && !args.force {
        bail!("{} already exists; remove it, pick another --mlx-path, or pass --force", dst.display());
    }
    let src = &args.model;
    let is_gguf = src.is_file() && src.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    let bar = bar();
    if is_gguf {
        bar.set_message(format!("Importing {}", src.display()));
        bar.enable_steady_tick(std::time::Duration::from_millis(100));
        write_atomically(dst, args.force, |tmp| convert_gguf(src, tmp, &opts))
            .with_context(|| format!("cannot convert {}", src.display()))?;
    } else {
        let folder = source_folder(src)?;
        bar.set_message(format!("Converting {}", src.display()));
        let mut progress = |done: usize, total: usize| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        };
        write_atomically(dst, args.force, |tmp| convert_folder(&folder, tmp, &opts, &EngineRules, &mut progress).map(|_| ()))
            .with_context(|| format!("cannot convert {}", src.display()))?;
    }
    bar.finish_and_clear();
    if crate::progress::enabled() {
        eprintln!("Wrote {}", dst.display());
    }
    Ok(())
}

/// The command line, with `-q` after `convert` read as `--quantize` (mlx_lm.convert's meaning)
/// rather than the global `-q/--quiet`.
pub fn argv() -> Vec<std::ffi::OsString> {
    let mut seen_convert = false;
    std::env::args_os()
        .enumerate()
        .map(|(i, a)| {
            if i > 0 && !seen_convert && a == "convert" {
                seen_convert = true;
            } else if seen_convert && a == "-q" {
                return "--quantize".into();
            }
            a
        })
        .collect()
}

/// A local folder, or the snapshot of a Hub repo id.
fn source_folder(src: &Path) -> Result<PathBuf> {
    if src.is_dir() {
        return Ok(src.to_owned());
    }
    if src.is_file() {
        bail!("{} is a file: convert takes a model folder, a repo id or a .gguf file", src.display());
    }
    match src.to_str().filter(|s| formats::hub::is_repo_id(s)) {
        Some(repo) => crate::model_arg::hub_snapshot(repo),
        None => bail!("{} does not exist (nor is it a Hugging Face repo id like org/name)", src.display()),
    }
}

fn bar() -> ProgressBar {
    if !crate::progress::enabled() {
        return ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    }
    let bar = ProgressBar::new(0);
    let style = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} tensors {elapsed}")
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}
