//! Hugging Face Hub downloads into the standard cache (`$HF_HOME/hub/models--org--name`) via `hf-hub`.
//!
//! `hf-hub` 0.4 (sync, `ureq` + rustls) provides the cache layout (blobs, snapshots, refs), the
//! file endpoint protocol (`/{repo}/resolve/{rev}/{file}`, ETag, X-Repo-Commit, redirects), resume
//! of `.part` files by HTTP Range, and retries. mlx-gen adds what it lacks: `HF_TOKEN` and
//! `HF_HUB_OFFLINE`, the list of files the engine needs, a size check of every finished blob (a
//! short blob goes back to `.part` so that the next run resumes it), and one-line errors.
use hf_hub::api::sync::{Api, ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};
use std::fs;
use std::path::{Path, PathBuf};

/// Why a repository could not be fetched; each message is one line naming the problem.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("repository {repo} was not found on {endpoint} (HTTP {status}; for a private or gated repo set HF_TOKEN)")]
    NotFound { repo: String, endpoint: String, status: u16 },
    #[error("HF_HUB_OFFLINE is set and {repo} is not in the Hugging Face cache ({dir})")]
    NotCached { repo: String, dir: PathBuf },
    #[error("{0}")]
    Other(String),
}

/// Reports download progress (the CLI draws a bar with it).
pub trait DownloadProgress {
    /// A file of `size` bytes starts (or restarts, on a retry) downloading.
    fn start(&mut self, file: &str, size: u64);
    /// `bytes` more bytes arrived.
    fn advance(&mut self, bytes: u64);
    fn finish(&mut self);
}

/// No progress report.
pub struct NoProgress;

impl DownloadProgress for NoProgress {
    fn start(&mut self, _: &str, _: u64) {}
    fn advance(&mut self, _: u64) {}
    fn finish(&mut self) {}
}

struct Adapter<'a>(&'a mut dyn DownloadProgress);

impl hf_hub::api::Progress for Adapter<'_> {
    fn init(&mut self, size: usize, filename: &str) {
        self.0.start(filename, size as u64);
    }
    fn update(&mut self, size: usize) {
        self.0.advance(size as u64);
    }
    fn finish(&mut self) {
        self.0.finish();
    }
}

/// Whether `s` has the shape of a Hub repo id, `org/name` (letters, digits, `-`, `_`, `.`).
pub fn is_repo_id(s: &str) -> bool {
    let ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with(['.', '-'])
            && !p.ends_with('.')
            && !p.contains("..")
            && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    matches!(s.split_once('/'), Some((org, name)) if ok(org) && ok(name) && !name.contains('/'))
}

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.trim().is_empty())
}

/// The hub cache folder: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
pub fn cache_dir() -> PathBuf {
    if let Some(p) = env("HF_HUB_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(h) = env("HF_HOME") {
        return Path::new(&h).join("hub");
    }
    Cache::default().path().clone()
}

/// `$HF_ENDPOINT` without a trailing slash, else `https://huggingface.co`.
pub fn endpoint() -> String {
    env("HF_ENDPOINT").map_or_else(|| "https://huggingface.co".to_owned(), |e| e.trim_end_matches('/').to_owned())
}

/// Whether `HF_HUB_OFFLINE` asks for no network (`1`, `true`, `yes`, `on`).
pub fn offline() -> bool {
    env("HF_HUB_OFFLINE").is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

/// The files of a model folder besides config.json and the weights: generation config, tokenizer
/// files and chat templates (what `hub` downloads and `convert` carries over).
pub const SIDE_FILES: &[&str] = &[
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
];

/// Whether the engine needs `file` of a repo (config, generation config, tokenizer, weights).
pub fn needed(file: &str) -> bool {
    let exact = ["config.json", "model.safetensors.index.json"].contains(&file) || SIDE_FILES.contains(&file);
    !file.contains('/') && (exact || (file.starts_with("model") && file.ends_with(".safetensors")))
}

/// The model folder of `repo` (its snapshot in the hub cache), downloading the files the engine
/// needs unless they are there. Offline (`HF_HUB_OFFLINE`), or when the Hub cannot be reached, a
/// complete cached snapshot is used.
pub fn snapshot(repo: &str, progress: &mut dyn DownloadProgress) -> Result<PathBuf, HubError> {
    let cache = cache_dir();
    let folder = cache.join(format!("models--{}", repo.replace('/', "--")));
    if offline() {
        return cached_snapshot(&folder).ok_or_else(|| HubError::NotCached { repo: repo.to_owned(), dir: folder });
    }
    let endpoint = endpoint();
    let mut builder = ApiBuilder::from_cache(Cache::new(cache.clone()))
        .with_endpoint(endpoint.clone())
        .with_progress(false)
        .with_retries(3)
        .with_user_agent("mlx-gen", env!("CARGO_PKG_VERSION"));
    if let Some(token) = env("HF_TOKEN") {
        builder = builder.with_token(Some(token));
    }
    let api = builder.build().map_err(|e| HubError::Other(format!("cannot set up the Hub client: {e}")))?;
    let info = match repo_info(&api, repo, &endpoint) {
        Ok(info) => info,
        Err(HubError::Other(msg)) => {
            // No network: a complete cached snapshot still serves, as in huggingface_hub.
            return cached_snapshot(&folder).ok_or(HubError::Other(msg));
        }
        Err(e) => return Err(e),
    };
    let snap = folder.join("snapshots").join(&info.sha);
    let files: Vec<&(String, Option<u64>)> = info.files.iter().filter(|(f, _)| needed(f)).collect();
    if !files.iter().any(|(f, _)| f == "config.json") {
        return Err(HubError::Other(format!("{repo} has no config.json: it is not a model folder mlx-gen can load")));
    }
    if !files.iter().any(|(f, _)| f.ends_with(".safetensors")) {
        return Err(HubError::Other(format!("{repo} has no model*.safetensors weights (GGUF repos: download the .gguf file and pass its path)")));
    }
    let api_repo = api.repo(Repo::new(repo.to_owned(), RepoType::Model));
    for (file, size) in files {
        let target = snap.join(file);
        if target.is_file() && size.is_none_or(|s| fs::metadata(&target).is_ok_and(|m| m.len() == s)) {
            continue;
        }
        let path = api_repo
            .download_with_progress(file, Adapter(&mut *progress))
            .map_err(|e| HubError::Other(format!("downloading {file} of {repo} from {endpoint}: {}", api_error(&e))))?;
        if let Some(size) = *size {
            check_size(&path, file, size)?;
        }
        if path != target {
            return Err(HubError::Other(format!("{repo} changed on the Hub during the download; run the command again")));
        }
    }
    write_ref(&folder, &info.sha)?;
    Ok(snap)
}

struct RepoInfo {
    sha: String,
    files: Vec<(String, Option<u64>)>,
}

/// `GET /api/models/{repo}/revision/main?blobs=true`: the commit and the files with their sizes.
fn repo_info(api: &Api, repo: &str, endpoint: &str) -> Result<RepoInfo, HubError> {
    let request = api.model(repo.to_owned()).info_request().query("blobs", "true");
    let response = match request.call() {
        Ok(r) => r,
        Err(ureq::Error::Status(status @ (401 | 403 | 404), _)) => {
            return Err(HubError::NotFound { repo: repo.to_owned(), endpoint: endpoint.to_owned(), status })
        }
        Err(ureq::Error::Status(status, _)) => {
            return Err(HubError::Other(format!("the Hub at {endpoint} answered HTTP {status} for {repo}")))
        }
        Err(e) => return Err(HubError::Other(format!("cannot reach the Hub at {endpoint}: {e}"))),
    };
    let json: serde_json::Value = response
        .into_json()
        .map_err(|e| HubError::Other(format!("the Hub at {endpoint} sent an unreadable answer for {repo}: {e}")))?;
    let sha = json.get("sha").and_then(|s| s.as_str()).filter(|s| !s.is_empty() && !s.contains(['/', '.']));
    let sha = sha.ok_or_else(|| HubError::Other(format!("the Hub's answer for {repo} has no commit sha")))?.to_owned();
    let files = json
        .get("siblings")
        .and_then(|s| s.as_array())
        .map(|list| {
            list.iter()
                .filter_map(|s| {
                    let name = s.get("rfilename")?.as_str()?.to_owned();
                    Some((name, s.get("size").and_then(|v| v.as_u64())))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(RepoInfo { sha, files })
}

/// One line for an hf-hub error (ureq's status errors say which URL failed).
fn api_error(e: &ApiError) -> String {
    match e {
        ApiError::RequestError(r) => match r.as_ref() {
            ureq::Error::Status(status, resp) => format!("HTTP {status} for {}", resp.get_url()),
            other => other.to_string(),
        },
        ApiError::TooManyRetries(inner) => format!("gave up after retries: {}", api_error(inner)),
        other => other.to_string(),
    }
}

/// A finished file must have the size the Hub announced; a short one is moved back to its `.part`
/// file (so the next run resumes it) and its snapshot link removed.
fn check_size(path: &Path, file: &str, size: u64) -> Result<(), HubError> {
    let got = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    if got == size {
        return Ok(());
    }
    if let Ok(blob) = fs::canonicalize(path) {
        let _ = fs::remove_file(path);
        if got < size {
            let _ = fs::rename(&blob, blob.with_extension("part"));
        } else {
            let _ = fs::remove_file(&blob);
        }
    }
    Err(HubError::Other(format!(
        "download of {file} is incomplete ({got} of {size} bytes); run the command again to resume it"
    )))
}

fn write_ref(folder: &Path, sha: &str) -> Result<(), HubError> {
    let refs = folder.join("refs");
    let io = |e: std::io::Error| HubError::Other(format!("{}: {e}", refs.display()));
    fs::create_dir_all(&refs).map_err(io)?;
    let tmp = refs.join(format!(".main.{}", std::process::id()));
    fs::write(&tmp, sha).map_err(io)?;
    fs::rename(&tmp, refs.join("main")).map_err(io)
}

/// The snapshot `refs/main` names, if it holds a config.json and every weight file it needs.
fn cached_snapshot(folder: &Path) -> Option<PathBuf> {
    let sha = fs::read_to_string(folder.join("refs").join("main")).ok()?;
    let snap = folder.join("snapshots").join(sha.trim());
    if !snap.join("config.json").is_file() {
        return None;
    }
    let index = snap.join("model.safetensors.index.json");
    if index.is_file() {
        let json: serde_json::Value = serde_json::from_str(&fs::read_to_string(&index).ok()?).ok()?;
        let map = json.get("weight_map")?.as_object()?;
        return map.values().filter_map(|v| v.as_str()).all(|f| snap.join(f).is_file()).then_some(snap);
    }
    let has_weights = fs::read_dir(&snap).ok()?.filter_map(|e| e.ok()).any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.starts_with("model") && name.ends_with(".safetensors") && e.path().is_file()
    });
    has_weights.then_some(snap)
}
