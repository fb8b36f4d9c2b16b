//! What `--model` may name: a model folder, a `.gguf` file (imported once into the cache), or
//! nothing (the default model, SmolLM2-135M-Instruct, fetched and imported on first use).
use anyhow::{bail, Context, Result};
use engine::default_model;
use engine::gguf::{import_gguf, ImportOptions};
use std::path::{Path, PathBuf};

/// The model folder to load for `--model` (or its absence).
pub fn resolve(model: Option<&Path>) -> Result<PathBuf> {
    let quiet = !crate::progress::enabled();
    let Some(path) = model else {
        return default_model::default_model_dir(quiet).context("cannot prepare the default model");
    };
    if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return imported_gguf(path, quiet);
    }
    if path.is_file() {
        bail!("{} is a file: --model takes a model folder or a .gguf file", path.display());
    }
    Ok(path.to_owned())
}

/// Imports a GGUF file once; the cache entry is keyed by the file's name, size and modification time.
fn imported_gguf(path: &Path, quiet: bool) -> Result<PathBuf> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs());
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    let key = format!("gguf-{stem}-{}-{mtime}", meta.len());
    let dir = default_model::cache_dir().context("cannot find the cache folder")?.join("models").join(key);
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    if !quiet {
        eprintln!("Importing {} into {} (once)...", path.display(), dir.display());
    }
    import_gguf(path, &dir, &ImportOptions::default()).with_context(|| format!("cannot import {}", path.display()))?;
    Ok(dir)
}
