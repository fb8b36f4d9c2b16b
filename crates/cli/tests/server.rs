//! `mlx-gen serve` end to end: the real binary on a free 127.0.0.1 port with a tiny model, driven over HTTP (JSON, SSE, errors, auth, metrics).
mod common;
mod server_harness;

use serde_json::{json, Value};
use server_harness::{chunks, Server};
use std::io::{BufRead, BufReader, Read};
use std::process::Command;
use std::time::Duration;

fn model_path() -> String {
    common::model("llama3-f32").to_string_lossy().into_owned()
}

/// The server on the test model.
fn start(extra: &[&str]) -> Server {
    Server::start(&model_path(), extra)
}

fn generate_json(args: &[&str]) -> Value {
    let model = model_path();
    let mut all = vec!["generate", "--model", &model, "--output", "json"];
    all.extend_from_slice(args);
    let out = common::mlx_gen(&all, None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("generate JSON")
}

#[test]
fn chat_and_completions_match_generate() {
    let s = start(&[]);
    let want = generate_json(&["--prompt", "hello", "-m", "12"]);
    let text = want["text"].as_str().unwrap();
    let body = json!({"model": model_path(), "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12});
    let got = s.post("/v1/chat/completions", &body);
    assert_eq!(got["object"], "chat.completion");
    assert_eq!(got["choices"][0]["message"]["content"], text);
    assert_eq!(got["choices"][0]["message"]["role"], "assistant");
    assert_eq!(got["choices"][0]["finish_reason"], want["finish_reason"]);
    assert_eq!(got["usage"]["prompt_tokens"], want["prompt_tokens"]);
    assert_eq!(got["usage"]["completion_tokens"], want["generation_tokens"]);
    assert_eq!(got["usage"]["total_tokens"].as_u64(), Some(want["prompt_tokens"].as_u64().unwrap() + want["generation_tokens"].as_u64().unwrap()));

    // Streaming: a role chunk, content deltas, a finish chunk, the usage chunk, [DONE].
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let c = chunks(&s.stream("/v1/chat/completions", &sbody));
    assert!(c.iter().all(|x| x["object"] == "chat.completion.chunk" && x["id"] == c[0]["id"]));
    assert_eq!(c[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = c.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, text);
    let last = &c[c.len() - 1];
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], want["generation_tokens"]);
    assert_eq!(c[c.len() - 2]["choices"][0]["finish_reason"], want["finish_reason"]);
    assert!(c[..c.len() - 1].iter().all(|c| c["usage"].is_null()));
    // Without include_usage: no usage chunk.
    sbody["stream_options"] = json!({"include_usage": false});
    let c = chunks(&s.stream("/v1/chat/completions", &sbody));
    assert!(c.iter().all(|c| c.get("usage").is_none() && c["choices"].as_array().is_some_and(|a| a.len() == 1)));

    // Text completions: the raw prompt, as `generate --ignore-chat-template`.
    let want = generate_json(&["--prompt", "hello", "-m", "10", "--ignore-chat-template"]);
    let got = s.post("/v1/completions", &json!({"prompt": "hello", "max_tokens": 10, "logprobs": 2}));
    assert_eq!(got["object"], "text_completion");
    assert_eq!(got["choices"][0]["text"], want["text"]);
    assert_eq!(got["usage"]["completion_tokens"], want["generation_tokens"]);
    let lp = &got["choices"][0]["logprobs"];
    assert_eq!(lp["token_logprobs"].as_array().map(Vec::len), want["generation_tokens"].as_u64().map(|n| n as usize));
    assert!(lp["top_logprobs"][0].as_object().is_some_and(|o| o.len() <= 2 && !o.is_empty()));
    let c = chunks(&s.stream("/v1/completions", &json!({"prompt": "hello", "max_tokens": 10, "stream": true})));
    let streamed: String = c.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(streamed, want["text"].as_str().unwrap());

    // Seeded sampling: as `generate --temp --seed`, and n choices.
    let want = generate_json(&["--prompt", "hello", "-m", "8", "--temp", "0.9", "--seed", "7"]);
    let body = json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0.9, "seed": 7, "n": 2});
    let got = s.post("/v1/chat/completions", &body);
    assert_eq!(got["choices"][0]["message"]["content"], want["text"]);
    assert_eq!(got["choices"].as_array().map(Vec::len), Some(2));
    assert_eq!(s.post("/v1/chat/completions", &body)["choices"][0]["message"]["content"], want["text"]);
}

#[test]
fn stop_strings_are_never_emitted_partially() {
    let s = start(&[]);
    let base = json!({"prompt": "hello", "max_tokens": 16});
    let full = s.post("/v1/completions", &base)["choices"][0]["text"].as_str().unwrap().to_owned();
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 8, "{full:?}");
    for (from, len) in [(3, 2), (5, 3), (1, 1)] {
        let stop: String = chars[from..from + len].iter().collect();
        let expected = &full[..full.find(&stop).unwrap()];
        let mut body = base.clone();
        body["stop"] = json!([stop, "never-in-the-output"]);
        let got = s.post("/v1/completions", &body);
        assert_eq!(got["choices"][0]["text"], expected, "stop {stop:?} in {full:?}");
        assert_eq!(got["choices"][0]["finish_reason"], "stop");
        body["stream"] = json!(true);
        let c = chunks(&s.stream("/v1/completions", &body));
        let streamed: String = c.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
        assert_eq!(streamed, expected, "streamed, stop {stop:?} in {full:?}");
        assert_eq!(c.last().unwrap()["choices"][0]["finish_reason"], "stop");
    }
}

#[test]
fn bad_requests_get_json_errors() {
    let s = start(&["--max-body-bytes", "4096"]);
    let check = |method: &str, path: &str, body: Option<&str>, status: u16, param: Option<&str>| {
        let a = s.call(method, path, body);
        let (got, text) = (a.status, a.body);
        assert_eq!(got, status, "{method} {path} {body:?}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
        let e = &v["error"];
        assert!(e["message"].is_string() && e["type"].is_string() && e.get("code").is_some(), "{text}");
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{body:?}: {text}");
        }
    };
    let chat = "/v1/chat/completions";
    let m = r#""messages":[{"role":"user","content":"hi"}]"#;
    check("POST", chat, Some(&format!(r#"{{"model":"other",{m}}}"#)), 404, Some("model"));
    for (field, extra) in [
        ("temperature", r#""temperature":"hot""#),
        ("temperature", r#""temperature":-0.5"#),
        ("top_p", r#""top_p":1.5"#),
        ("min_p", r#""min_p":[]"#),
        ("top_k", r#""top_k":-7"#),
        ("max_tokens", r#""max_tokens":0"#),
        ("max_tokens", r#""max_tokens":99999999999"#),
        ("max_completion_tokens", r#""max_completion_tokens":"10""#),
        ("n", r#""n":0"#),
        ("seed", r#""seed":1.5"#),
        ("stop", r#""stop":["ok",""]"#),
        ("stop", r#""stop":7"#),
        ("logit_bias", r#""logit_bias":{"abc":1}"#),
        ("logit_bias", r#""logit_bias":{"5":1000}"#),
        ("logit_bias", r#""logit_bias":{"99999999":1}"#),
        ("top_k", r#""temperature":1,"top_k":99999999,"logit_bias":{"1":1}"#),
        ("top_logprobs", r#""logprobs":true,"top_logprobs":50"#),
        ("logprobs", r#""logprobs":"yes""#),
        ("repetition_penalty", r#""repetition_penalty":-1"#),
        ("presence_penalty", r#""presence_penalty":3"#),
        ("frequency_penalty", r#""frequency_penalty":"x""#),
        ("stream", r#""stream":1"#),
        ("stream_options", r#""stream_options":true"#),
        ("model", r#""model":5"#),
    ] {
        check("POST", chat, Some(&format!("{{{m},{extra}}}")), 400, Some(field));
    }
    check("POST", chat, Some(r#"{"messages":[]}"#), 400, Some("messages"));
    check("POST", chat, Some(r#"{"messages":"hi"}"#), 400, Some("messages"));
    check("POST", chat, Some(r#"{"messages":[{"role":"user","content":5}]}"#), 400, Some("messages[0].content"));
    check("POST", chat, Some(r#"{"prompt":"hi"}"#), 400, Some("messages"));
    check("POST", chat, Some("{not json"), 400, None);
    check("POST", chat, Some("[1,2]"), 400, None);
    check("POST", chat, Some(""), 400, None);
    check("POST", "/v1/completions", Some(r#"{"prompt":""}"#), 400, Some("prompt"));
    check("POST", "/v1/completions", Some(r#"{"prompt":[1,-2]}"#), 400, Some("prompt"));
    check("POST", "/v1/completions", Some(r#"{"prompt":[4000000000]}"#), 400, Some("prompt"));
    check("POST", "/v1/completions", Some(&format!(r#"{{"prompt":"{}"}}"#, "x".repeat(5000))), 413, None);
    check("GET", "/v1/nothing", None, 404, None);
    check("GET", chat, None, 405, None);
    // The server still serves after all that.
    let health = s.call("GET", "/health", None);
    let h: Value = serde_json::from_str(&health.body).expect("health JSON");
    assert_eq!((health.status, &h["status"], &h["engine"]), (200, &json!("ok"), &json!("idle")), "{}", health.body);
    let models: Value = serde_json::from_str(&s.call("GET", "/v1/models", None).body).unwrap();
    assert_eq!(models["data"][0]["id"], model_path());
    let got = s.post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 3}));
    assert_eq!(got["usage"]["completion_tokens"], 3);
    assert_eq!(got["choices"][0]["finish_reason"], "length");

    // The engine thread updates its gauges just after the answer's last event: poll briefly.
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics = s.metrics();
        if metrics.contains("mlxgen_running_requests 0") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for want in [
        "mlxgen_requests_total{endpoint=\"completions\",status=\"200\"} 1",
        "mlxgen_requests_total{endpoint=\"chat_completions\",status=\"400\"}",
        "mlxgen_requests_total{endpoint=\"chat_completions\",status=\"404\"} 1",
        "mlxgen_generation_tokens_total 3",
        "mlxgen_time_to_first_token_seconds_count 1",
        "mlxgen_inter_token_latency_seconds_count 2",
        "mlxgen_queue_depth 0",
        "mlxgen_running_requests 0",
    ] {
        assert!(metrics.contains(want), "{want} missing from:\n{metrics}");
    }
}

#[test]
fn api_key_guards_every_route_but_health() {
    let s = start(&["--api-key", "sekrit"]);
    assert_eq!(s.call_as("GET", "/health", None, Some("wrong")).status, 200);
    for (method, path) in [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/chat/completions"), ("GET", "/nowhere")] {
        let a = s.call_as(method, path, Some("{}").filter(|_| method == "POST"), Some("wrong"));
        let (status, text) = (a.status, a.body);
        assert_eq!(status, 401, "{path}: {text}");
        assert!(text.contains("\"authentication_error\""), "{text}");
    }
    assert_eq!(s.call("GET", "/v1/models", None).status, 200);
    let got = s.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}));
    assert_eq!(got["usage"]["completion_tokens"], 2);
}

/// Reads `/metrics` until `line` is in it (bounded); returns whether it showed up.
fn wait_for_metric(s: &Server, line: &str) -> bool {
    for _ in 0..250 {
        if s.call("GET", "/metrics", None).body.contains(line) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn a_client_that_goes_away_cancels_and_ctrl_c_stops() {
    let mut s = start(&[]);
    let body = json!({"prompt": "hello", "max_tokens": 1_000_000, "stream": true});
    let r = s.agent.post(&format!("{}/v1/completions", s.base)).send_string(&body.to_string()).expect("stream");
    let mut reader = BufReader::new(r.into_reader());
    let mut line = String::new();
    reader.read_line(&mut line).expect("first event");
    assert!(line.starts_with("data: {"), "{line:?}");
    assert!(wait_for_metric(&s, "mlxgen_running_requests 1"));
    drop(reader);
    assert!(wait_for_metric(&s, "mlxgen_running_requests 0"), "generation went on after the client left");
    // Still serving; then SIGINT stops the server cleanly, even with a long stream running.
    assert_eq!(s.post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 2}))["usage"]["completion_tokens"], 2);
    let r = s.agent.post(&format!("{}/v1/completions", s.base)).send_string(&body.to_string()).expect("stream");
    let mut reader = BufReader::new(r.into_reader());
    line.clear();
    reader.read_line(&mut line).expect("first event");
    assert!(wait_for_metric(&s, "mlxgen_running_requests 1"));
    let pid = s.child.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().expect("kill").success());
    for _ in 0..200 {
        if let Some(status) = s.child.try_wait().expect("try_wait") {
            assert!(status.success(), "exit status {status}");
            let mut rest = String::new();
            let _ = reader.read_to_string(&mut rest);
            assert!(rest.ends_with("data: [DONE]\n\n"), "the stream ends properly: {rest:?}");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the server did not stop within 10 s of SIGINT");
}

#[test]
fn concurrent_requests_each_get_their_own_answer() {
    let s = start(&[]);
    let body = |i: usize| json!({"prompt": format!("prompt number {i}"), "max_tokens": 6 + i, "stream": i.is_multiple_of(2)});
    let text_of = |i: usize| -> String {
        let b = body(i);
        if i.is_multiple_of(2) {
            chunks(&s.stream("/v1/completions", &b)).iter().filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_owned)).collect()
        } else {
            s.post("/v1/completions", &b)["choices"][0]["text"].as_str().unwrap().to_owned()
        }
    };
    let alone: Vec<String> = (0..6).map(text_of).collect();
    let together: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..6).map(|i| scope.spawn(move || text_of(i))).collect();
        handles.into_iter().map(|h| h.join().expect("client thread")).collect()
    });
    assert_eq!(alone, together);
    assert!(wait_for_metric(&s, "mlxgen_queue_depth 0"));
}

/// A reasoning model (its template ends the prompt inside `<think>`): chat answers carry the
/// reasoning in `reasoning_content` and the rest in `content`, streamed or not, as `generate
/// --output json` splits them.
#[test]
fn reasoning_content_is_split_out() {
    let dir = common::reasoning_model_copy("qwen3-f32", "server-think");
    let d = dir.to_str().unwrap();

    let out = common::mlx_gen(&["generate", "--model", d, "--prompt", "Hi", "--max-tokens", "24", "--output", "json"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let want: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(want["reasoning"].is_string(), "{want}");

    let s = Server::start(d, &[]);
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 24});
    let v = s.post("/v1/chat/completions", &body);
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["reasoning_content"], want["reasoning"], "{v}");
    assert_eq!(msg["content"], want["answer"], "{v}");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (mut reasoning, mut content) = (String::new(), String::new());
    for c in chunks(&s.stream("/v1/chat/completions", &streamed)) {
        let delta = &c["choices"][0]["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(delta["content"].as_str().unwrap_or(""));
    }
    assert_eq!(Some(reasoning.trim()), want["reasoning"].as_str(), "streamed reasoning");
    assert_eq!(Some(content.as_str()), want["answer"].as_str(), "streamed answer");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
