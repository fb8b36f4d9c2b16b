//! Progress and status on stderr: an `indicatif` spinner while a model loads, hidden when stderr is not a terminal or with `--quiet`.
use anyhow::{Context, Result};
use engine::LoadedModel;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static QUIET: AtomicBool = AtomicBool::new(false);

/// Set once from the global `--quiet` flag.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether progress may be drawn: stderr is a terminal and `--quiet` was not given.
pub fn enabled() -> bool {
    !QUIET.load(Ordering::Relaxed) && std::io::stderr().is_terminal()
}

/// A spinner with `message` on stderr (a hidden one when progress is disabled).
pub fn spinner(message: impl Into<String>) -> ProgressBar {
    if !enabled() {
        return ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(ProgressStyle::with_template("{spinner} {msg} {elapsed}").unwrap_or_else(|_| ProgressStyle::default_spinner()));
    bar.set_message(message.into());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// Loads a model folder behind a spinner; returns the model and the load time in seconds.
pub fn load_model(dir: &Path) -> Result<(LoadedModel, f64)> {
    let bar = spinner(format!("Loading {}", dir.display()));
    let t0 = Instant::now();
    let loaded = LoadedModel::load(dir).with_context(|| format!("cannot load {}", dir.display()));
    bar.finish_and_clear();
    Ok((loaded?, t0.elapsed().as_secs_f64()))
}
