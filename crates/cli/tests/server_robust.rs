//! `mlx-gen serve` when things go wrong: an engine thread that dies (the test hook
//! `MLX_GEN_SERVE_FAULT`) turns /health to 503 and ends the process with a non-zero status; a step
//! stuck past `--step-timeout` turns /health to 503 until the engine steps again; requests past
//! `--request-timeout` end with a 408; fields the server does not implement are 400s naming them;
//! the KV budget counts the padded batch (a request that can never fit is refused, one that does
//! not fit now waits) and `--max-batch-size` holds also against one request with a large `n`.
mod common;
mod server_harness;

use serde_json::{json, Value};
use server_harness::{chunks, Server};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

fn model() -> String {
    common::model("llama3-f32").to_string_lossy().into_owned()
}

/// Polls /health (up to `secs`) until its status is `want`; returns its body then.
fn health_becomes(s: &Server, want: u16, secs: u64) -> Option<Value> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        let a = s.call("GET", "/health", None);
        if a.status == want {
            return Some(serde_json::from_str(&a.body).expect("health JSON"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn a_dead_engine_fails_health_and_ends_the_process() {
    let mut s = Server::start_with_env(&model(), &[], &[("MLX_GEN_SERVE_FAULT", "panic@3")]);
    assert_eq!(s.call("GET", "/health", None).status, 200);
    // The request in flight when the engine dies gets a JSON error, not a cut answer.
    let a = s.call("POST", "/v1/completions", Some(&json!({"prompt": "hello", "max_tokens": 20}).to_string()));
    assert_eq!(a.status, 503, "{}", a.body);
    let e: Value = serde_json::from_str(&a.body).expect("JSON error");
    assert_eq!(e["error"]["code"], "engine_stopped", "{e}");
    let h = health_becomes(&s, 503, 5).expect("/health turns 503 once the engine died");
    assert!(h["reason"].as_str().unwrap_or("").contains("panicked"), "{h}");
    for _ in 0..300 {
        if let Some(status) = s.child.try_wait().expect("try_wait") {
            assert!(!status.success(), "a dead engine ends the process with a failure status, got {status}");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the server went on running for 15 s with a dead engine");
}

#[test]
fn a_stuck_step_fails_health_until_the_engine_steps_again() {
    let s = Server::start_with_env(&model(), &["--step-timeout", "1"], &[("MLX_GEN_SERVE_FAULT", "stall@3:4")]);
    std::thread::scope(|scope| {
        let answer = scope.spawn(|| s.call("POST", "/v1/completions", Some(&json!({"prompt": "hello", "max_tokens": 6}).to_string())));
        let h = health_becomes(&s, 503, 10).expect("/health turns 503 while a step is stuck");
        assert!(h["reason"].as_str().unwrap_or("").contains("one step"), "{h}");
        assert!(health_becomes(&s, 200, 10).is_some(), "/health is 200 again once the step ended");
        let a = answer.join().expect("client");
        assert_eq!(a.status, 200, "{}", a.body);
    });
}

#[test]
fn requests_past_the_timeout_end_with_408() {
    let s = Server::start(&model(), &["--request-timeout", "1"]);
    let t = Instant::now();
    let a = s.call("POST", "/v1/completions", Some(&json!({"prompt": "hello", "max_tokens": 1_000_000}).to_string()));
    assert_eq!(a.status, 408, "{}", a.body);
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
    let e: Value = serde_json::from_str(&a.body).expect("JSON error");
    assert_eq!(e["error"]["code"], "request_timeout");
    // A stream already under way ends with the error as its last chunk.
    let events = s.stream("/v1/completions", &json!({"prompt": "hello", "max_tokens": 1_000_000, "stream": true}));
    let last = chunks(&events).pop().expect("chunks");
    assert_eq!(last["error"]["code"], "request_timeout", "{last}");
    let (_, idle) = s.wait_for_metrics(&["mlxgen_running_requests 0", "mlxgen_kv_blocks_in_use 0"]);
    assert!(idle, "the timed-out requests gave their rows back");
}

#[test]
fn unimplemented_fields_and_missing_content_are_400s() {
    let s = Server::start(&model(), &[]);
    for (path, body, param) in [
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "user": "u"}), "user"),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "low"}), "reasoning_effort"),
        ("/v1/chat/completions", json!({"messages": [{"role": "user"}]}), "messages[0].content"),
        ("/v1/completions", json!({"prompt": "x", "suffix": "y"}), "suffix"),
        ("/v1/completions", json!({"prompt": "x", "best_of": 3}), "best_of"),
    ] {
        let a = s.call("POST", path, Some(&body.to_string()));
        assert_eq!(a.status, 400, "{body}: {}", a.body);
        let e: Value = serde_json::from_str(&a.body).expect("JSON error");
        assert_eq!(e["error"]["param"], param, "{body}: {e}");
    }
    // Anthropic's errors name the field in the message.
    let body = json!({"model": model(), "max_tokens": 2, "messages": [{"role": "user", "content": "x"}], "metadata": {"user_id": "u"}});
    let a = s.call("POST", "/v1/messages", Some(&body.to_string()));
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.body.contains("'metadata' is not supported"), "{}", a.body);
}

/// llama3-f32 holds 512 bytes of KV per position (2 layers, 2 KV heads of 16, float32), so 1 MiB
/// is 2048 positions; the padded batch counts each row as long as the longest plus the cache's
/// step of 256 positions.
#[test]
fn the_kv_budget_counts_the_padded_batch() {
    let s = Server::start(&model(), &["--kv-budget-mb", "1", "--max-batch-size", "4", "--prefix-cache-mb", "0"]);
    // 4 rows of ~305 positions: 1220 positions unpadded, 4 * 561 = 2244 padded: never fits.
    let a = s.call("POST", "/v1/completions", Some(&json!({"prompt": "hello", "max_tokens": 300, "n": 4}).to_string()));
    assert_eq!(a.status, 400, "{}", a.body);
    let e: Value = serde_json::from_str(&a.body).expect("JSON error");
    assert_eq!(e["error"]["code"], "context_length_exceeded", "{e}");
    // More choices than the batch holds: refused, never run past --max-batch-size.
    let a = s.call("POST", "/v1/completions", Some(&json!({"prompt": "hello", "max_tokens": 2, "n": 5}).to_string()));
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(serde_json::from_str::<Value>(&a.body).unwrap()["error"]["param"], "n");
    // Two requests that each fit (1061 positions) but not together (2122): the second waits.
    let long = json!({"prompt": "hello", "max_tokens": 800, "stream": true});
    let r = s.agent.post(&format!("{}/v1/completions", s.base)).send_string(&long.to_string()).expect("stream");
    let mut first = BufReader::new(r.into_reader());
    let mut line = String::new();
    first.read_line(&mut line).expect("first event");
    std::thread::scope(|scope| {
        let second = scope.spawn(|| s.call("POST", "/v1/completions", Some(&json!({"prompt": "hello", "max_tokens": 800}).to_string())));
        let (text, waited) = s.wait_for_metrics(&["mlxgen_queue_depth 1", "mlxgen_running_sequences 1"]);
        assert!(waited, "the second request did not wait for room: {}", text.lines().filter(|l| l.starts_with("mlxgen_")).collect::<Vec<_>>().join("; "));
        drop(first);
        let a = second.join().expect("client");
        assert_eq!(a.status, 200, "{}", a.body);
    });
    let (_, idle) = s.wait_for_metrics(&["mlxgen_queue_depth 0", "mlxgen_running_sequences 0", "mlxgen_kv_blocks_in_use 0"]);
    assert!(idle);
}

/// A client that leaves before a non-streaming answer frees its rows: the KV blocks in use go back
/// to zero long before its (endless) generation would have ended.
#[test]
fn a_client_that_leaves_before_the_answer_frees_its_blocks() {
    use std::io::Write;
    let s = Server::start(&model(), &[]);
    let body = json!({"prompt": "hello", "max_tokens": 1_000_000}).to_string();
    let mut conn = std::net::TcpStream::connect(&s.addr).expect("connect");
    write!(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let (text, running) = s.wait_for_metrics(&["mlxgen_running_sequences 1"]);
    assert!(running, "{text}");
    assert!(!text.contains("mlxgen_kv_blocks_in_use 0\n"), "a running sequence holds KV blocks");
    drop(conn);
    let (text, idle) = s.wait_for_metrics(&["mlxgen_running_sequences 0", "mlxgen_kv_blocks_in_use 0"]);
    assert!(idle, "the rows of a client that left are still held: {}", text.lines().filter(|l| l.starts_with("mlxgen_kv") || l.starts_with("mlxgen_running")).collect::<Vec<_>>().join("; "));
}
