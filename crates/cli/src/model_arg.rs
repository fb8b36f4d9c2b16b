//! What `--model` may name: a model folder, a `.gguf` file (imported once into the cache), a Hugging
//! Face repo id (downloaded into the HF cache), or nothing (the default model, fetched on first use).
use anyhow::{bail, Context, Result};
use formats::default_model;
use formats::gguf::{import_gguf, ImportOptions};
use formats::hub::{self, DownloadProgress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::{Path, PathBuf};

/// The model folder to load for `--model` (or its absence).
pub fn resolve(model: Option<&Path>) -> Result<PathBuf> {
    let quiet = !crate::progress::enabled();
    let Some(path) = model else {
        // The spinner says what happens; the fetcher's own notes would print across it.
        let bar = crate::progress::spinner("Preparing the default model, SmolLM2-135M-Instruct (fetched on first use)");
        let dir = default_model::default_model_dir(true).context("cannot prepare the default model");
        bar.finish_and_clear();
        return dir;
    };
    if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return imported_gguf(path, quiet);
    }
    if path.is_file() {
        bail!("{} is a file: --model takes a model folder, a .gguf file or a Hugging Face repo id", path.display());
    }
    if !path.exists() {
        if let Some(repo) = path.to_str().filter(|s| hub::is_repo_id(s)) {
            return hub_snapshot(repo);
        }
        bail!("{} does not exist (nor is it a Hugging Face repo id like org/name)", path.display());
    }
    Ok(path.to_owned())
}

/// The snapshot folder of a Hub repo, downloaded (with a progress bar) where needed.
pub fn hub_snapshot(repo: &str) -> Result<PathBuf> {
    let mut bar = Bar::new();
    let dir = hub::snapshot(repo, &mut bar);
    bar.0.finish_and_clear();
    Ok(dir?)
}

/// A byte progress bar on stderr for Hub downloads (hidden when progress is disabled).
struct Bar(ProgressBar);

impl Bar {
    fn new() -> Bar {
        if !crate::progress::enabled() {
            return Bar(ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden()));
        }
        let bar = ProgressBar::new(0);
        let style = ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        Bar(bar)
    }
}

impl DownloadProgress for Bar {
    fn start(&mut self, file: &str, size: u64) {
        self.0.set_message(format!("Downloading {file}"));
        self.0.set_length(size);
        self.0.set_position(0);
    }
    fn advance(&mut self, bytes: u64) {
        self.0.inc(bytes);
    }
    fn finish(&mut self) {}
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
    let bar = crate::progress::spinner(format!("Importing {}", path.display()));
    let imported = import_gguf(path, &dir, &ImportOptions::default());
    bar.finish_and_clear();
    imported.with_context(|| format!("cannot import {}", path.display()))?;
    Ok(dir)
}
