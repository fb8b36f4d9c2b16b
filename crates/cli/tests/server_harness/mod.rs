//! A running `mlx-gen serve` for the server tests (server_openai, server_concurrency,
//! server_fuzz): the real binary on a free 127.0.0.1 port, plain HTTP calls, SSE reading and
//! `/metrics` polling.
#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running `mlx-gen serve`, killed when dropped.
pub struct Server {
    pub child: Child,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    /// `127.0.0.1:PORT`
    pub addr: String,
    pub model: String,
    pub agent: ureq::Agent,
    pub key: Option<String>,
    /// Every line the server wrote to stderr so far.
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One answer: status, content type and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

impl Server {
    /// Starts `mlx-gen serve --model MODEL --port 0 EXTRA...` and reads the address it listens on
    /// from its stderr.
    pub fn start(model: &str, extra: &[&str]) -> Server {
        Server::start_with_env(model, extra, &[])
    }

    /// [`Server::start`] with environment variables `env` set for the server (test hooks).
    pub fn start_with_env(model: &str, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mlx-gen"))
            .args(["serve", "--model", model, "--host", "127.0.0.1", "--port", "0"])
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mlx-gen serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut l) = kept.lock() {
                    l.push(line.clone());
                }
                if let Some(at) = line.find("http://") {
                    let _ = tx.send(line[at..].split_whitespace().next().unwrap_or("").to_owned());
                }
                // Anything the server says past its address (panics above all) shows in the test's output.
                if line.contains("panicked") {
                    eprintln!("mlx-gen serve: {line}");
                }
            }
        });
        let base = rx.recv_timeout(Duration::from_secs(120)).expect("the server did not report its address in time");
        let addr = base.strip_prefix("http://").expect("http address").to_owned();
        assert!(addr.starts_with("127.0.0.1:"), "{base}");
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build();
        let key = extra.iter().position(|a| *a == "--api-key").map(|i| extra[i + 1].to_owned());
        Server { child, base, addr, model: model.to_owned(), agent, key, log }
    }

    /// Sends a request with the server's key (if any); any status comes back as an `Answer`.
    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> Answer {
        self.call_as(method, path, body, None)
    }

    /// [`Server::call`] with `key` as the bearer key instead of the server's own.
    pub fn call_as(&self, method: &str, path: &str, body: Option<&str>, key: Option<&str>) -> Answer {
        let mut req = self.agent.request(method, &format!("{}{path}", self.base)).set("Content-Type", "application/json");
        if let Some(k) = key.or(self.key.as_deref()) {
            req = req.set("Authorization", &format!("Bearer {k}"));
        }
        let result = match body {
            Some(b) => req.send_string(b),
            None => req.call(),
        };
        let r = match result {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let status = r.status();
        let content_type = r.header("Content-Type").unwrap_or("").to_owned();
        let mut body = String::new();
        r.into_reader().take(1 << 26).read_to_string(&mut body).expect("read the body");
        Answer { status, content_type, body }
    }

    /// A POST that must succeed with JSON.
    pub fn post(&self, path: &str, body: &Value) -> Value {
        let a = self.call("POST", path, Some(&body.to_string()));
        assert_eq!(a.status, 200, "{body}: {}", a.body);
        serde_json::from_str(&a.body).expect("JSON answer")
    }

    /// Sends raw bytes (a whole HTTP/1.1 request) and reads the answer until the server closes
    /// or `Content-Length` is satisfied. For requests ureq cannot make (odd headers, lying lengths).
    pub fn raw(&self, request: &[u8]) -> Answer {
        let mut s = TcpStream::connect(&self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
        // The server may answer (and close) before it has read everything: a failed write is fine.
        let _ = s.write_all(request);
        let _ = s.flush();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 65536];
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match s.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(_) => break,
            }
            if let Some(a) = parse_raw(&buf) {
                return a;
            }
            assert!(Instant::now() < deadline, "no full answer within 30 s");
        }
        parse_raw(&buf).unwrap_or_else(|| panic!("no HTTP answer to a raw request: {:?}", String::from_utf8_lossy(&buf)))
    }

    /// A streamed request: the `data:` payloads in order (the last must be `[DONE]`).
    pub fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let mut req = self.agent.post(&format!("{}{path}", self.base));
        if let Some(k) = &self.key {
            req = req.set("Authorization", &format!("Bearer {k}"));
        }
        let r = req.send_string(&body.to_string()).unwrap_or_else(|e| panic!("stream request {body}: {e}"));
        assert_eq!(r.header("Content-Type"), Some("text/event-stream"));
        let mut text = String::new();
        r.into_reader().take(1 << 26).read_to_string(&mut text).expect("read stream");
        sse_events(&text)
    }

    /// The `/metrics` text.
    pub fn metrics(&self) -> String {
        let a = self.call("GET", "/metrics", None);
        assert_eq!(a.status, 200, "{}", a.body);
        a.body
    }

    /// Polls `/metrics` (up to ~10 s) until every `line` is in it; returns the last text read
    /// and whether they all showed up.
    pub fn wait_for_metrics(&self, lines: &[&str]) -> (String, bool) {
        let mut text = String::new();
        for _ in 0..500 {
            text = self.metrics();
            if lines.iter().all(|l| text.lines().any(|t| t == *l)) {
                return (text, true);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (text, false)
    }
}

/// The `data:` payloads of a whole SSE body; panics unless it is well formed and ends in `[DONE]`.
pub fn sse_events(text: &str) -> Vec<String> {
    assert!(text.ends_with("\n\n"), "events end with a blank line: {text:?}");
    let events: Vec<String> = text
        .split_terminator("\n\n")
        .map(|e| e.strip_prefix("data: ").unwrap_or_else(|| panic!("not an SSE data line: {e:?}")).to_owned())
        .collect();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{text}");
    events
}

/// The JSON chunks of a stream (all events but `[DONE]`).
pub fn chunks(events: &[String]) -> Vec<Value> {
    events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap_or_else(|_| panic!("chunk JSON: {e}"))).collect()
}

/// Parses a complete HTTP/1.1 answer (Content-Length bodies, or chunked); None while incomplete.
fn parse_raw(buf: &[u8]) -> Option<Answer> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let mut content_type = String::new();
    let mut length = None;
    let mut chunked = false;
    for l in lines {
        let (k, v) = l.split_once(':')?;
        match k.trim().to_ascii_lowercase().as_str() {
            "content-type" => content_type = v.trim().to_owned(),
            "content-length" => length = v.trim().parse::<usize>().ok(),
            "transfer-encoding" => chunked = v.to_ascii_lowercase().contains("chunked"),
            _ => {}
        }
    }
    let rest = &buf[end + 4..];
    let body = if chunked {
        let mut out = Vec::new();
        let mut at = 0;
        loop {
            let nl = rest[at..].windows(2).position(|w| w == b"\r\n")? + at;
            let size = usize::from_str_radix(String::from_utf8_lossy(&rest[at..nl]).trim(), 16).ok()?;
            if size == 0 {
                break;
            }
            if rest.len() < nl + 2 + size {
                return None;
            }
            out.extend_from_slice(&rest[nl + 2..nl + 2 + size]);
            at = nl + 2 + size + 2;
        }
        out
    } else {
        let n = length.unwrap_or(0);
        if rest.len() < n {
            return None;
        }
        rest[..n].to_vec()
    };
    Some(Answer { status, content_type, body: String::from_utf8_lossy(&body).into_owned() })
}

/// At most `n` bytes of `s`, cut at a character boundary (for messages).
pub fn clip(s: &str, n: usize) -> &str {
    let mut end = s.len().min(n);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
