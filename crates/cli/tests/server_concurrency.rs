//! `mlx-gen serve` under concurrent load: 32 streaming clients at once, each with its own prompt
//! and settings, get exactly what their request yields alone (greedy); clients that leave
//! mid-stream free what they held; a repeated long prefix is served from the prefix cache. After
//! each, `/metrics` shows an idle server: nothing queued or running, no KV blocks in use.
//!
//! Metric names these tests rely on: `mlxgen_queue_depth`, `mlxgen_running_requests`,
//! `mlxgen_running_sequences`, `mlxgen_kv_blocks_in_use`, `mlxgen_prefix_cache_hits_total`.
mod common;
mod server_harness;

use serde_json::{json, Value};
use server_harness::{chunks, clip, Server};
use std::sync::Barrier;

fn model() -> String {
    common::model("llama3-f32").to_string_lossy().into_owned()
}

/// What the server is expected to show once every request has ended.
const IDLE: &[&str] = &["mlxgen_queue_depth 0", "mlxgen_running_requests 0", "mlxgen_running_sequences 0", "mlxgen_kv_blocks_in_use 0"];

#[track_caller]
fn assert_idle(s: &Server) {
    let (text, ok) = s.wait_for_metrics(IDLE);
    let shown: Vec<&str> = text.lines().filter(|l| IDLE.iter().any(|w| l.starts_with(w.split(' ').next().unwrap_or("")))).collect();
    assert!(ok, "the server is not idle after all requests ended; want {IDLE:?}, /metrics shows {shown:?}");
}

/// One choice of a streamed answer, put together from its chunks.
#[derive(Debug, Clone, PartialEq)]
struct Choice {
    text: String,
    finish_reason: String,
    /// The tokens of the log-probability entries (empty unless asked for).
    lp_tokens: Vec<String>,
    lp_values: Vec<f64>,
}

/// A whole streamed answer.
#[derive(Debug, Clone)]
struct Streamed {
    choices: Vec<Choice>,
    usage: Option<Value>,
}

impl Streamed {
    /// Equal to `other` but for rounding of the log-probabilities (batched matmuls may differ in
    /// the last bits).
    fn same_as(&self, other: &Streamed) -> Result<(), String> {
        if self.choices.len() != other.choices.len() {
            return Err(format!("{} choices vs {}", self.choices.len(), other.choices.len()));
        }
        for (i, (a, b)) in self.choices.iter().zip(&other.choices).enumerate() {
            if (&a.text, &a.finish_reason, &a.lp_tokens) != (&b.text, &b.finish_reason, &b.lp_tokens) {
                return Err(format!("choice {i}: {a:?}\n   vs {b:?}"));
            }
            if a.lp_values.len() != b.lp_values.len() || a.lp_values.iter().zip(&b.lp_values).any(|(x, y)| (x - y).abs() > 1e-3) {
                return Err(format!("choice {i} logprobs: {:?} vs {:?}", a.lp_values, b.lp_values));
            }
        }
        // The counts, not `prompt_tokens_details`: how much of a prompt the prefix cache held
        // depends on what ran before.
        let counts = |u: &Option<Value>| u.as_ref().map(|u| [&u["prompt_tokens"], &u["completion_tokens"], &u["total_tokens"]].map(Value::clone));
        if counts(&self.usage) != counts(&other.usage) {
            return Err(format!("usage {:?} vs {:?}", self.usage, other.usage));
        }
        Ok(())
    }
}

/// Streams `body` to `path` and puts the answer together, checking the stream's shape on the way.
fn stream(s: &Server, path: &str, body: &Value) -> Streamed {
    let chat = path.contains("chat");
    let c = chunks(&s.stream(path, body));
    assert!(!c.is_empty(), "no chunks for {body}");
    let n = body["n"].as_u64().unwrap_or(1) as usize;
    let mut choices = vec![Choice { text: String::new(), finish_reason: String::new(), lp_tokens: Vec::new(), lp_values: Vec::new() }; n];
    let mut usage = None;
    for chunk in &c {
        assert_eq!(chunk["id"], c[0]["id"], "one id per stream");
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            assert!(usage.is_none(), "two usage chunks: {body}");
            usage = Some(u.clone());
        }
        for ch in chunk["choices"].as_array().expect("choices") {
            let i = ch["index"].as_u64().expect("index") as usize;
            assert!(i < n, "choice index {i} of {n}");
            let out = &mut choices[i];
            assert!(out.finish_reason.is_empty(), "choice {i} goes on after its finish: {chunk}");
            let text = if chat { &ch["delta"]["content"] } else { &ch["text"] };
            out.text.push_str(text.as_str().unwrap_or(""));
            if let Some(r) = ch["finish_reason"].as_str() {
                out.finish_reason = r.to_owned();
            }
            let lp = &ch["logprobs"];
            if chat {
                for e in lp["content"].as_array().into_iter().flatten() {
                    out.lp_tokens.push(e["token"].as_str().unwrap_or("").to_owned());
                    out.lp_values.push(e["logprob"].as_f64().unwrap_or(f64::NAN));
                }
            } else {
                for t in lp["tokens"].as_array().into_iter().flatten() {
                    out.lp_tokens.push(t.as_str().unwrap_or("").to_owned());
                }
                for v in lp["token_logprobs"].as_array().into_iter().flatten() {
                    out.lp_values.push(v.as_f64().unwrap_or(f64::NAN));
                }
            }
        }
    }
    for (i, ch) in choices.iter().enumerate() {
        assert!(ch.finish_reason == "stop" || ch.finish_reason == "length", "choice {i} did not finish: {body} -> {ch:?}");
    }
    if body["stream_options"]["include_usage"] == json!(true) {
        let u = usage.as_ref().unwrap_or_else(|| panic!("no usage chunk for {body}"));
        assert_eq!(u["total_tokens"].as_u64(), Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()));
    }
    Streamed { choices, usage }
}

/// Request `i` of the 32: chat or text, short or long prompts (long ones take several prefill
/// chunks), different lengths, stop strings, logprobs, n = 2, penalties and biases; all greedy.
fn request(i: usize) -> (&'static str, Value) {
    let chat = i.is_multiple_of(2);
    let filler = match i % 8 {
        3 => "the quick brown fox jumps over the lazy dog ".repeat(40),
        6 => "lorem ipsum ".repeat(12),
        _ => "word ".repeat(i % 5),
    };
    let prompt = format!("request {i}: {filler}tell me something about the number {}", i * 37 % 101);
    let mut body = if chat {
        json!({"messages": [{"role": "user", "content": prompt}]})
    } else {
        json!({"prompt": prompt})
    };
    body["max_tokens"] = json!(4 + (i * 5) % 29);
    body["stream"] = json!(true);
    if i.is_multiple_of(3) {
        body["stream_options"] = json!({"include_usage": true});
    }
    if i % 5 == 1 {
        body["stop"] = json!(["e", "never-there"]);
    }
    if i % 4 == 2 {
        if chat {
            body["logprobs"] = json!(true);
            body["top_logprobs"] = json!(2);
        } else {
            body["logprobs"] = json!(2);
        }
    }
    if i % 8 == 5 {
        body["n"] = json!(2);
    }
    match i % 7 {
        1 => body["repetition_penalty"] = json!(1.3),
        2 => body["presence_penalty"] = json!(0.8),
        3 => body["frequency_penalty"] = json!(0.6),
        4 => body["logit_bias"] = json!({"7": 4.0, "11": -100}),
        _ => {}
    }
    (if chat { "/v1/chat/completions" } else { "/v1/completions" }, body)
}

#[test]
fn thirty_two_streams_at_once_each_get_what_they_get_alone() {
    let s = Server::start(&model(), &[]);
    let requests: Vec<(&str, Value)> = (0..32).map(request).collect();
    let alone: Vec<Streamed> = requests.iter().map(|(path, body)| stream(&s, path, body)).collect();
    assert_idle(&s);
    let barrier = Barrier::new(requests.len());
    let together: Vec<Streamed> = std::thread::scope(|scope| {
        let handles: Vec<_> = requests
            .iter()
            .map(|(path, body)| {
                let (s, barrier) = (&s, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    stream(s, path, body)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("client thread")).collect()
    });
    let mismatches: Vec<String> = (0..requests.len())
        .filter_map(|i| together[i].same_as(&alone[i]).err().map(|e| format!("request {i} {}: {e}", clip(&requests[i].1.to_string(), 300).to_owned())))
        .collect();
    assert!(mismatches.is_empty(), "{} of 32 streams differ from their request alone:\n{}", mismatches.len(), mismatches.join("\n"));
    // Some of the 32 really did stop on their stop string, and both n = 2 choices are the same (greedy).
    assert!(alone.iter().any(|a| a.choices[0].finish_reason == "stop"));
    for (i, a) in alone.iter().enumerate().filter(|(_, a)| a.choices.len() == 2) {
        assert_eq!(a.choices[0], a.choices[1], "request {i}: greedy choices differ");
    }
    assert_idle(&s);
    let m = s.metrics();
    for endpoint in ["chat_completions", "completions"] {
        let line = format!("mlxgen_requests_total{{endpoint=\"{endpoint}\",status=\"200\"}} 32");
        assert!(m.lines().any(|l| l == line), "{line} missing from /metrics");
    }
}

/// Seeded sampling is per request: under load each seeded stream still draws what it draws alone.
#[test]
fn seeded_streams_keep_their_samples_under_load() {
    let s = Server::start(&model(), &[]);
    let requests: Vec<Value> = (0..12)
        .map(|i| {
            json!({"prompt": format!("story {i} begins"), "max_tokens": 10 + i, "stream": true,
                   "temperature": 0.7 + 0.05 * i as f64, "top_p": 0.95, "top_k": 50, "seed": 1000 + i})
        })
        .collect();
    let alone: Vec<Streamed> = requests.iter().map(|b| stream(&s, "/v1/completions", b)).collect();
    let barrier = Barrier::new(requests.len());
    let together: Vec<Streamed> = std::thread::scope(|scope| {
        let handles: Vec<_> = requests
            .iter()
            .map(|b| {
                let (s, barrier) = (&s, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    stream(s, "/v1/completions", b)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("client thread")).collect()
    });
    for i in 0..requests.len() {
        if let Err(e) = together[i].same_as(&alone[i]) {
            panic!("seeded request {i} {} differs under load: {e}", requests[i]);
        }
    }
    assert_idle(&s);
}

/// Clients that disconnect mid-stream stop their generation and give back their KV blocks, while
/// the streams running beside them go on unchanged.
#[test]
fn clients_that_leave_free_their_blocks() {
    use std::io::{BufRead, BufReader};
    let s = Server::start(&model(), &[]);
    let keep: Vec<Value> = (0..6).map(|i| json!({"prompt": format!("kept stream {i}"), "max_tokens": 24, "stream": true})).collect();
    let alone: Vec<Streamed> = keep.iter().map(|b| stream(&s, "/v1/completions", b)).collect();
    // Six long streams (4000 tokens: as much as the context allows), each read up to its first
    // event, then dropped.
    let endless: Vec<_> = (0..6)
        .map(|i| {
            let body = json!({"messages": [{"role": "user", "content": format!("leaving {i}")}], "max_tokens": 4000, "stream": true});
            let r = s.agent.post(&format!("{}/v1/chat/completions", s.base)).send_string(&body.to_string()).expect("stream");
            let mut reader = BufReader::new(r.into_reader());
            let mut line = String::new();
            reader.read_line(&mut line).expect("first event");
            assert!(line.starts_with("data: {"), "{line:?}");
            reader
        })
        .collect();
    let together: Vec<Streamed> = std::thread::scope(|scope| {
        let handles: Vec<_> = keep.iter().map(|b| scope.spawn(|| stream(&s, "/v1/completions", b))).collect();
        drop(endless);
        handles.into_iter().map(|h| h.join().expect("client thread")).collect()
    });
    for i in 0..keep.len() {
        if let Err(e) = together[i].same_as(&alone[i]) {
            panic!("kept stream {i} changed when others left: {e}");
        }
    }
    assert_idle(&s);
}

/// A long shared prefix (a system prompt resent with each turn) is processed once: the second
/// request reports cached prompt tokens and counts a prefix-cache hit, and answers exactly as a
/// server that never saw the first request.
#[test]
fn a_resent_long_prefix_is_served_from_the_prefix_cache() {
    let system = format!("You are a careful assistant. {}", "Always answer briefly and check every fact twice before you answer. ".repeat(40));
    let turn = |q: &str| json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}], "max_tokens": 12});
    let fresh = Server::start(&model(), &[]);
    let want = fresh.post("/v1/chat/completions", &turn("and the second question?"));
    drop(fresh);

    let s = Server::start(&model(), &[]);
    let first = s.post("/v1/chat/completions", &turn("first question?"));
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 600, "the shared prefix should span several KV blocks: {prompt_tokens} tokens");
    let second = s.post("/v1/chat/completions", &turn("and the second question?"));
    assert_eq!(second["choices"], want["choices"], "prefix reuse changed the answer");
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    let total = second["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached.is_some_and(|c| c >= 256 && c < total), "cached_tokens {cached:?} of {total}: {}", second["usage"]);
    // Streamed, with the usage chunk: the same count.
    let mut body = turn("and the second question?");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let streamed = stream(&s, "/v1/chat/completions", &body);
    assert_eq!(streamed.choices[0].text, want["choices"][0]["message"]["content"].as_str().unwrap());
    let u = streamed.usage.expect("usage chunk");
    assert!(u["prompt_tokens_details"]["cached_tokens"].as_u64().is_some_and(|c| c >= 256), "{u}");
    let m = s.metrics();
    let hits = m
        .lines()
        .find_map(|l| l.strip_prefix("mlxgen_prefix_cache_hits_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("mlxgen_prefix_cache_hits_total missing from /metrics"));
    assert!(hits >= 2.0, "mlxgen_prefix_cache_hits_total {hits}");
    assert_idle(&s);
}

/// `serve --warmup on` runs the batch engine over dummy sequences before it listens (on the GPU the
/// first batched shapes compile kernels: issue 20's stall); it leaves nothing behind: the same
/// requests get the same answers as from a server that skipped it, nothing is running, no KV block
/// is in use and no request is counted. Constrained requests too (the warm-up builds the
/// vocabulary's token trie beside it).
#[test]
fn a_warmed_up_server_answers_as_one_that_was_not() {
    let warm = Server::start(&model(), &["--warmup", "on"]);
    let said = |s: &Server| s.log.lock().expect("log").iter().any(|l| l.contains("batch engine warmed up in"));
    assert!(said(&warm), "no warm-up reported: {:?}", warm.log.lock().expect("log"));
    assert_idle(&warm);
    let m = warm.metrics();
    assert!(!m.lines().any(|l| l.starts_with("mlxgen_requests_total") && !l.ends_with(" 0")), "the warm-up counted as requests:\n{m}");
    let cold = Server::start(&model(), &["--warmup", "off"]);
    assert!(!said(&cold), "--warmup off warmed up");
    let mut requests: Vec<(&str, Value)> = (0..6).map(request).collect();
    for i in [0, 3] {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        let mut r = request(i);
        r.1["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "n", "schema": schema}});
        r.1["max_tokens"] = json!(24);
        requests.push(r);
    }
    let together = |s: &Server| -> Vec<Streamed> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = requests.iter().map(|(path, body)| scope.spawn(move || stream(s, path, body))).collect();
            handles.into_iter().map(|h| h.join().expect("client thread")).collect()
        })
    };
    let (a, b) = (together(&warm), together(&cold));
    for i in 0..requests.len() {
        if let Err(e) = a[i].same_as(&b[i]) {
            panic!("request {i} differs after the warm-up: {e}");
        }
    }
    for r in &a[6..] {
        assert!(r.choices[0].text.starts_with('{'), "a constrained answer that is not JSON: {:?}", r.choices[0].text);
    }
    assert_idle(&warm);
}
