//! `--model org/name` against a local stand-in for the Hugging Face Hub (127.0.0.1, std only): the
//! repo info API, `resolve` file endpoints with ETag/X-Repo-Commit, a 302 to a "CDN" with Range
//! support, downloads cut midway that must resume, a 404, HF_TOKEN, and HF_HUB_OFFLINE.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const REPO: &str = "tiny-org/tiny-model";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// The Hub stand-in: serves one repo (a copy of a tiny matrix model plus a file mlx-gen must skip).
struct Hub {
    url: String,
    files: Vec<(String, Vec<u8>)>,
    /// How many more body downloads of the big file to cut off halfway.
    cut: AtomicUsize,
    /// Every request: "METHOD PATH RANGE AUTHORIZATION".
    log: Mutex<Vec<String>>,
}

fn etag(bytes: &[u8]) -> String {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    format!("{h:016x}{:016x}{h:016x}{:016x}", bytes.len(), !h)
}

impl Hub {
    fn start(cut: usize) -> Arc<Hub> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let mut files = Vec::new();
        for e in std::fs::read_dir(common::model("qwen2-f32")).unwrap() {
            let p = e.unwrap().path();
            files.push((p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()));
        }
        files.push(("README.md".into(), b"# not needed\n".to_vec()));
        files.push(("onnx/model.onnx".into(), vec![7u8; 1000]));
        let hub = Arc::new(Hub { url, files, cut: AtomicUsize::new(cut), log: Mutex::new(Vec::new()) });
        let h = hub.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let h = h.clone();
                std::thread::spawn(move || h.serve(stream));
            }
        });
        hub
    }

    fn file(&self, name: &str) -> Option<&Vec<u8>> {
        self.files.iter().find(|(n, _)| n == name).map(|(_, b)| b)
    }

    fn serve(&self, mut stream: TcpStream) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
        let (mut range, mut auth) = (None, String::new());
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap_or((&h, ""));
            match k.trim().to_ascii_lowercase().as_str() {
                "range" => range = Some(v.trim().to_owned()),
                "authorization" => auth = v.trim().to_owned(),
                _ => {}
            }
        }
        self.log.lock().unwrap().push(format!("GET {path} {} {auth}", range.as_deref().unwrap_or("-")));
        let respond = |s: &mut TcpStream, status: &str, headers: &[(String, String)], body: &[u8]| {
            let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            let _ = s.write_all(format!("{head}\r\n").as_bytes());
            let _ = s.write_all(body);
        };
        let repo_api = format!("/api/models/{REPO}/revision/main");
        if path.split('?').next() == Some(repo_api.as_str()) {
            let siblings: Vec<_> =
                self.files.iter().map(|(n, b)| serde_json::json!({"rfilename": n, "size": b.len()})).collect();
            let body = serde_json::json!({"id": REPO, "sha": COMMIT, "siblings": siblings}).to_string();
            return respond(&mut stream, "200 OK", &[("Content-Type".into(), "application/json".into())], body.as_bytes());
        }
        let prefix = format!("/{REPO}/resolve/main/");
        if let Some(name) = path.strip_prefix(&prefix) {
            let Some(bytes) = self.file(name) else {
                return respond(&mut stream, "404 Not Found", &[], b"Entry not found");
            };
            let tag = etag(bytes);
            let mut headers = vec![("X-Repo-Commit".to_owned(), COMMIT.to_owned())];
            if name.ends_with(".safetensors") {
                // LFS files: a redirect to the CDN, with the content's ETag as X-Linked-Etag.
                headers.push(("X-Linked-Etag".into(), format!("\"{tag}\"")));
                headers.push(("ETag".into(), "\"redirect-etag\"".into()));
                headers.push(("Location".into(), format!("{}/cdn/{name}", self.url)));
                return respond(&mut stream, "302 Found", &headers, b"");
            }
            headers.push(("ETag".into(), format!("\"{tag}\"")));
            return self.ranged(&mut stream, bytes, range.as_deref(), headers, false);
        }
        if let Some(name) = path.strip_prefix("/cdn/") {
            let bytes = self.file(name).unwrap().clone();
            let body_request = range.as_deref() != Some("bytes=0-0");
            let cut = body_request
                && self.cut.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
            return self.ranged(&mut stream, &bytes, range.as_deref(), vec![("ETag".into(), "\"cdn\"".into())], cut);
        }
        let body = br#"{"error":"Repository not found"}"#;
        respond(&mut stream, "404 Not Found", &[("X-Error-Code".into(), "RepoNotFound".into())], body)
    }

    /// A 200 or (with `Range: bytes=a-[b]`) 206 answer; `cut`: send half the body and hang up.
    fn ranged(&self, s: &mut TcpStream, bytes: &[u8], range: Option<&str>, mut headers: Vec<(String, String)>, cut: bool) {
        let total = bytes.len();
        let (status, start, end) = match range.and_then(|r| r.strip_prefix("bytes=")) {
            Some(r) => {
                let (a, b) = r.split_once('-').unwrap();
                let a: usize = a.parse().unwrap();
                let b: usize = if b.is_empty() { total - 1 } else { b.parse::<usize>().unwrap().min(total - 1) };
                headers.push(("Content-Range".into(), format!("bytes {a}-{b}/{total}")));
                ("206 Partial Content", a, b + 1)
            }
            None => ("200 OK", 0, total),
        };
        let body = &bytes[start..end];
        let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nAccept-Ranges: bytes\r\nConnection: close\r\n", body.len());
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        let _ = s.write_all(format!("{head}\r\n").as_bytes());
        let sent = if cut { body.len() / 2 } else { body.len() };
        let _ = s.write_all(&body[..sent]);
        let _ = s.flush();
        let _ = s.shutdown(std::net::Shutdown::Both);
    }

    /// The Range headers of body downloads of the CDN file.
    fn cdn_ranges(&self) -> Vec<String> {
        let log = self.log.lock().unwrap();
        log.iter()
            .filter(|l| l.contains(" /cdn/") && !l.contains("bytes=0-0"))
            .map(|l| l.split_whitespace().nth(2).unwrap_or("-").to_owned())
            .collect()
    }
}

fn home(case: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hub").join(case);
    if d.exists() {
        std::fs::remove_dir_all(&d).unwrap();
    }
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn generate(hf_home: &Path, endpoint: &str, repo: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlx-gen"));
    cmd.args(["generate", "--model", repo, "--prompt", "hi", "--max-tokens", "2", "--output", "json"])
        .env("HF_HOME", hf_home)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_CACHE")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run mlx-gen")
}

fn ok(out: &Output) {
    assert!(out.status.success(), "mlx-gen failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert!(v["tokens"].as_array().is_some_and(|t| !t.is_empty()), "no tokens: {v}");
}

fn one_error_line(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "expected exit 1:\n{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "expected one line:\n{stderr}");
    assert!(stderr.starts_with("error:") && stderr.contains(needle), "{stderr:?} lacks {needle:?}");
}

fn repo_dir(hf_home: &Path) -> PathBuf {
    hf_home.join("hub").join(format!("models--{}", REPO.replace('/', "--")))
}

/// The snapshot holds exactly the needed files, byte for byte, as links into blobs/.
fn check_cache(hub: &Hub, hf_home: &Path) {
    let dir = repo_dir(hf_home);
    assert_eq!(std::fs::read_to_string(dir.join("refs/main")).unwrap().trim(), COMMIT);
    let snap = dir.join("snapshots").join(COMMIT);
    let mut names: Vec<String> =
        std::fs::read_dir(&snap).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    let mut expected: Vec<String> = hub.files.iter().map(|(n, _)| n.clone()).filter(|n| !n.contains('/') && n != "README.md").collect();
    expected.sort();
    assert_eq!(names, expected, "snapshot files");
    for n in &names {
        assert_eq!(&std::fs::read(snap.join(n)).unwrap(), hub.file(n).unwrap(), "{n} differs");
        assert!(std::fs::symlink_metadata(snap.join(n)).unwrap().file_type().is_symlink(), "{n} is not a link to a blob");
    }
    let parts: Vec<_> = std::fs::read_dir(dir.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".part"))
        .collect();
    assert!(parts.is_empty(), "partial downloads left: {parts:?}");
}

#[test]
fn downloads_follows_redirect_resumes_and_sends_token() {
    let hub = Hub::start(1);
    let hf_home = home("download");
    let out = generate(&hf_home, &hub.url, REPO, &[("HF_TOKEN", "hf_secret")]);
    ok(&out);
    check_cache(&hub, &hf_home);
    let ranges = hub.cdn_ranges();
    assert_eq!(ranges.len(), 2, "one cut download and one resumed: {ranges:?}");
    let resumed_at: usize = ranges[1].trim_start_matches("bytes=").trim_end_matches('-').parse().unwrap();
    assert!(resumed_at > 0, "the second request did not resume: {ranges:?}");
    let log = hub.log.lock().unwrap().clone();
    assert!(log.iter().filter(|l| l.contains("/resolve/")).all(|l| l.ends_with("Bearer hf_secret")), "{log:?}");
    assert!(!log.iter().any(|l| l.contains("README.md") || l.contains("onnx")), "unneeded files fetched: {log:?}");

    // Second run: everything is cached; only the repo info is asked for.
    let before = hub.log.lock().unwrap().len();
    ok(&generate(&hf_home, &hub.url, REPO, &[]));
    let log = hub.log.lock().unwrap();
    assert!(log[before..].iter().all(|l| l.contains("/api/models/")), "{:?}", &log[before..]);
}

#[test]
fn an_interrupted_process_leaves_a_part_file_and_the_next_run_resumes() {
    let hub = Hub::start(100);
    let hf_home = home("interrupted");
    let out = generate(&hf_home, &hub.url, REPO, &[]);
    one_error_line(&out, "model.safetensors");
    let dir = repo_dir(&hf_home);
    assert!(!dir.join("snapshots").join(COMMIT).join("model.safetensors").exists(), "a half file was linked");
    let blobs: Vec<String> = std::fs::read_dir(dir.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    let big = etag(hub.file("model.safetensors").unwrap());
    assert!(!blobs.contains(&big), "an unfinished blob is in place: {blobs:?}");
    assert!(blobs.contains(&format!("{big}.part")), "no .part file to resume: {blobs:?}");

    hub.cut.store(0, Ordering::SeqCst);
    let n = hub.cdn_ranges().len();
    ok(&generate(&hf_home, &hub.url, REPO, &[]));
    check_cache(&hub, &hf_home);
    let ranges = hub.cdn_ranges();
    assert_eq!(ranges.len(), n + 1, "{ranges:?}");
    assert_ne!(ranges[n], "bytes=0-", "the next run started over instead of resuming: {ranges:?}");
}

#[test]
fn unknown_repo_is_one_line_and_leaves_no_cache() {
    let hub = Hub::start(0);
    let hf_home = home("unknown");
    let out = generate(&hf_home, &hub.url, "tiny-org/no-such-model", &[]);
    one_error_line(&out, "tiny-org/no-such-model was not found");
    assert!(!hf_home.join("hub").join("models--tiny-org--no-such-model").exists());
}

#[test]
fn offline_without_and_with_cache() {
    let hf_home = home("offline");
    let nowhere = "http://127.0.0.1:9";
    let out = generate(&hf_home, nowhere, REPO, &[("HF_HUB_OFFLINE", "1")]);
    one_error_line(&out, "HF_HUB_OFFLINE");
    assert!(!repo_dir(&hf_home).exists(), "offline mode created cache folders");

    let hub = Hub::start(0);
    ok(&generate(&hf_home, &hub.url, REPO, &[]));
    let n = hub.log.lock().unwrap().len();
    ok(&generate(&hf_home, nowhere, REPO, &[("HF_HUB_OFFLINE", "1")]));
    assert_eq!(hub.log.lock().unwrap().len(), n);
    // Without HF_HUB_OFFLINE, an unreachable Hub falls back to the complete cached snapshot too.
    ok(&generate(&hf_home, nowhere, REPO, &[]));
}
