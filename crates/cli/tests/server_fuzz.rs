//! `mlx-gen serve` against hostile input: a corpus of several hundred malformed requests, made
//! here programmatically (broken and truncated JSON, every field with wrong types and absurd
//! values, deep nesting, oversized bodies, wrong content types, unknown routes and methods, bad
//! API keys, unicode junk, prompts longer than the context). Every one must get a 4xx answer
//! with an OpenAI-shaped JSON error, while a stream running beside them goes on unchanged, and
//! the server still answers `/health` and good requests afterwards.
mod common;
mod server_harness;

use serde_json::{json, Value};
use server_harness::{chunks, clip, Answer, Server};

/// A request, sent as raw HTTP/1.1 so that anything can be put in it.
struct Case {
    name: String,
    method: String,
    path: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    /// The exact status wanted, or any 4xx.
    status: Option<u16>,
    /// The error's `param`, when it must name one.
    param: Option<String>,
}

impl Case {
    fn post(name: impl Into<String>, path: &str, body: impl Into<Vec<u8>>) -> Case {
        Case {
            name: name.into(),
            method: "POST".into(),
            path: path.into(),
            headers: vec![("Content-Type".into(), b"application/json".to_vec())],
            body: body.into(),
            status: None,
            param: None,
        }
    }
    fn status(mut self, s: u16) -> Case {
        self.status = Some(s);
        self
    }
    fn param(mut self, p: &str) -> Case {
        self.param = Some(p.into());
        self
    }
    fn header(mut self, k: &str, v: impl Into<Vec<u8>>) -> Case {
        self.headers.retain(|(h, _)| !h.eq_ignore_ascii_case(k));
        self.headers.push((k.into(), v.into()));
        self
    }
    fn method(mut self, m: &str) -> Case {
        self.method = m.into();
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n", self.method, self.path).into_bytes();
        let mut has_length = false;
        for (k, v) in &self.headers {
            has_length |= k.eq_ignore_ascii_case("content-length") || k.eq_ignore_ascii_case("transfer-encoding");
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
        if !has_length {
            out.extend_from_slice(format!("Content-Length: {}\r\n", self.body.len()).as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
        out
    }
}

const CHAT: &str = "/v1/chat/completions";
const TEXT: &str = "/v1/completions";

/// A good body for `path` with `field` set to `value` (raw JSON text).
fn with_field(path: &str, field: &str, value: &str) -> String {
    let base = if path == CHAT { r#""messages":[{"role":"user","content":"hi"}],"max_tokens":2"# } else { r#""prompt":"hi","max_tokens":2"# };
    format!("{{{base},\"{field}\":{value}}}")
}

/// Values of the wrong type for any numeric field.
const NOT_NUMBERS: &[&str] = &[r#""1""#, "true", "[]", "{}", "[1]", r#"{"v":1}"#, r#""NaN""#, r#""Infinity""#, r#""-Infinity""#, r#""""#, r#""1e3""#];

/// The corpus; `max_body` is the server's --max-body-bytes.
fn corpus(max_body: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    let good_chat = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#;

    // Every numeric field: wrong types, then out-of-range and absurd values.
    let numeric: &[(&str, &[&str])] = &[
        ("max_tokens", &["0", "-1", "1.5", "1e30", "99999999999", "18446744073709551616", "-9223372036854775809", "1048577"]),
        ("max_completion_tokens", &["0", "-5", "2.5", "1e300", "4294967296"]),
        ("temperature", &["-0.01", "100.5", "1e308", "-1e308"]),
        ("top_p", &["-0.1", "1.01", "7", "1e100"]),
        ("min_p", &["-1", "1.5", "1e9"]),
        ("top_k", &["-2", "1.5", "1e20", "99999999999", "-99999999999"]),
        ("seed", &["-1", "1.5", "1e20", "18446744073709551616", "-9223372036854775808"]),
        ("repetition_penalty", &["-1", "101", "1e308"]),
        ("presence_penalty", &["-2.5", "3", "1e10"]),
        ("frequency_penalty", &["-3", "2.01", "-1e10"]),
        ("n", &["0", "-1", "65", "1.5", "1e6"]),
    ];
    for path in [CHAT, TEXT] {
        for (field, bad) in numeric {
            for v in NOT_NUMBERS.iter().chain(bad.iter()) {
                cases.push(Case::post(format!("{path} {field}={v}"), path, with_field(path, field, v)).status(400).param(field));
            }
        }
        for v in ["1", r#""true""#, "[]", "{}", "0"] {
            cases.push(Case::post(format!("{path} stream={v}"), path, with_field(path, "stream", v)).status(400).param("stream"));
        }
        for v in ["true", "1", r#""yes""#, "[]", r#"{"include_usage":"yes"}"#, r#"{"include_usage":1}"#] {
            cases.push(Case::post(format!("{path} stream_options={v}"), path, with_field(path, "stream_options", v)).status(400).param("stream_options"));
        }
        for v in ["7", r#"[1]"#, r#"[""]"#, r#""""#, "[null]", r#"{"a":"b"}"#, "true", &format!("[{}]", vec![r#""x""#; 17].join(","))] {
            cases.push(Case::post(format!("{path} stop={v}"), path, with_field(path, "stop", v)).status(400).param("stop"));
        }
        for v in [
            r#"{"abc":1}"#, r#"{"-1":1}"#, r#"{"1.5":1}"#, r#"{"":1}"#, r#"{"99999999999":1}"#, r#"{"1e3":1}"#, r#"{"0x10":1}"#,
            r#"{"5":101}"#, r#"{"5":-101}"#, r#"{"5":"1"}"#, r#"{"5":[]}"#, r#"{"5":{}}"#, r#"{"5":true}"#, r#"{"99999":1}"#, r#"{"512":1}"#,
            "[]", "5", r#""5=1""#, "true",
        ] {
            cases.push(Case::post(format!("{path} logit_bias={v}"), path, with_field(path, "logit_bias", v)).status(400).param("logit_bias"));
        }
        for v in ["5", "true", "[]", "{}", "1.5", r#"["m"]"#] {
            cases.push(Case::post(format!("{path} model={v}"), path, with_field(path, "model", v)).status(400).param("model"));
        }
        let long_name = format!("\"{}\"", "m".repeat(5000));
        for v in [r#""other""#, r#""""#, r#""../../etc/passwd""#, r#""gpt-4o""#, r#""\u0000""#, long_name.as_str()] {
            cases.push(Case::post(format!("{path} model={}", clip(v, 20)), path, with_field(path, "model", v)).status(404).param("model"));
        }
        // OpenAI fields the server ignores, with the wrong type.
        for (field, v) in [("user", "7"), ("tools", "5"), ("tools", r#""x""#), ("response_format", r#""json""#), ("tool_choice", "5"), ("metadata", "[]"), ("store", r#""no""#), ("suffix", "5"), ("best_of", "1.5"), ("parallel_tool_calls", "1")] {
            cases.push(Case::post(format!("{path} {field}={v}"), path, with_field(path, field, v)).status(400).param(field));
        }
        // A sampler the vocabulary cannot satisfy.
        let body = with_field(path, "top_k", "100000").replacen('{', r#"{"temperature":1,"#, 1);
        cases.push(Case::post(format!("{path} top_k beyond the vocabulary"), path, body).status(400).param("top_k"));
    }
    // Log-probabilities: a boolean for chat, a count for text.
    for v in [r#""yes""#, "1", "[]"] {
        cases.push(Case::post(format!("chat logprobs={v}"), CHAT, with_field(CHAT, "logprobs", v)).status(400).param("logprobs"));
    }
    for v in ["-1", "21", "1.5", "99999999999", r#""3""#, "true"] {
        cases.push(Case::post(format!("chat top_logprobs={v}"), CHAT, format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],"logprobs":true,"top_logprobs":{v}}}"#)).status(400).param("top_logprobs"));
        cases.push(Case::post(format!("text logprobs={v}"), TEXT, with_field(TEXT, "logprobs", v)).status(400).param("logprobs"));
    }
    cases.push(Case::post("chat top_logprobs without logprobs", CHAT, with_field(CHAT, "top_logprobs", "3")).status(400).param("top_logprobs"));
    cases.push(Case::post("text echo", TEXT, with_field(TEXT, "echo", "true")).status(400).param("echo"));

    // Messages of every wrong shape.
    for (param, v) in [
        ("messages", "null"), ("messages", "[]"), ("messages", r#""hi""#), ("messages", "5"), ("messages", "{}"), ("messages", r#"{"role":"user"}"#),
        ("messages[0]", "[null]"), ("messages[0]", "[5]"), ("messages[0]", r#"["hi"]"#), ("messages[0]", "[[]]"),
        ("messages[0].role", r#"[{"content":"x"}]"#), ("messages[0].role", r#"[{"role":null,"content":"x"}]"#), ("messages[0].role", r#"[{"role":5,"content":"x"}]"#),
        ("messages[0].role", r#"[{"role":"","content":"x"}]"#), ("messages[0].role", r#"[{"role":["user"],"content":"x"}]"#),
        ("messages[0].content", r#"[{"role":"user","content":5}]"#), ("messages[0].content", r#"[{"role":"user","content":true}]"#),
        ("messages[0].content", r#"[{"role":"user","content":{"text":"x"}}]"#),
        ("messages[0].content[0]", r#"[{"role":"user","content":[5]}]"#), ("messages[0].content[0]", r#"[{"role":"user","content":["x"]}]"#),
        ("messages[0].content[0]", r#"[{"role":"user","content":[{}]}]"#), ("messages[0].content[0]", r#"[{"role":"user","content":[[]]}]"#),
        ("messages[0].content[0]", r#"[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]"#),
        ("messages[0].content[0]", r#"[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA"}}]}]"#),
        ("messages[0].content[0].text", r#"[{"role":"user","content":[{"type":"text"}]}]"#),
        ("messages[0].content[0].text", r#"[{"role":"user","content":[{"type":"text","text":{"deep":[1,2]}}]}]"#),
        ("messages[1].role", r#"[{"role":"user","content":"x"},{"content":"y"}]"#),
    ] {
        cases.push(Case::post(format!("messages={v}"), CHAT, format!(r#"{{"messages":{v}}}"#)).status(400).param(param));
    }
    cases.push(Case::post("chat without messages", CHAT, r#"{"prompt":"hi"}"#).status(400).param("messages"));
    cases.push(Case::post("chat with a misspelt messages", CHAT, "{\"m\u{435}ssages\":[{\"role\":\"user\",\"content\":\"hi\"}]}").status(400).param("messages"));
    // Prompts of every wrong shape.
    for v in ["null", "5", "true", "{}", "[]", r#""""#, r#"[""]"#, r#"["a","b"]"#, "[-1]", "[1.5]", "[4294967296]", "[[1,2]]", r#"[1,"a"]"#, "[512]", "[99999]"] {
        cases.push(Case::post(format!("prompt={v}"), TEXT, format!(r#"{{"prompt":{v}}}"#)).status(400).param("prompt"));
    }
    // Prompts longer than the context (4096 for the test models).
    cases.push(Case::post("token prompt over the context", TEXT, format!(r#"{{"prompt":[{}]}}"#, vec!["5"; 4200].join(","))).status(400).param("prompt"));
    cases.push(Case::post("text prompt over the context", TEXT, json!({"prompt": "xq7 ".repeat(1100)}).to_string()).status(400).param("prompt"));
    let many = vec![json!({"role": "user", "content": "hello world ".repeat(40)}); 60];
    cases.push(Case::post("chat over the context", CHAT, json!({"messages": many}).to_string()).status(400).param("messages"));

    // Bodies that are not JSON, or not an object.
    let good = good_chat.as_bytes();
    for cut in (0..good.len() - 1).step_by(3) {
        cases.push(Case::post(format!("truncated at {cut}"), CHAT, &good[..cut]).status(400));
    }
    for (name, body) in [
        ("trailing garbage", format!("{good_chat} xyz")),
        ("two objects", format!("{good_chat}{good_chat}")),
        ("single quotes", good_chat.replace('"', "'")),
        ("trailing comma", good_chat.replace("3}", "3,}")),
        ("comment", format!("// c\n{good_chat}")),
        ("bare NaN", good_chat.replace("3}", "NaN}")),
        ("bare Infinity", good_chat.replace("3}", "Infinity}")),
        ("huge exponent", good_chat.replace("3}", "1e400}")),
        ("lone surrogate", good_chat.replace("hi", "\\ud800")),
        ("bad escape", good_chat.replace("hi", "\\q")),
        ("raw control char", good_chat.replace("hi", "a\u{1}b")),
        ("byte order mark", format!("\u{feff}{good_chat}")),
        ("null", "null".into()),
        ("array", "[1,2]".into()),
        ("string", "\"hi\"".into()),
        ("number", "42".into()),
        ("true", "true".into()),
        ("empty object", "{}".into()),
        ("whitespace", "   \n\t ".into()),
        ("empty", String::new()),
        ("form encoded", "messages=hi&max_tokens=3".into()),
        ("xml", "<messages><m>hi</m></messages>".into()),
        ("nested arrays", format!("{}{}", "[".repeat(5000), "]".repeat(5000))),
        ("nested objects", format!("{}1{}", r#"{"a":"#.repeat(3000), "}".repeat(3000))),
        ("deep unknown field", format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],"x":{}{}}}"#, "[".repeat(2000), "]".repeat(2000))),
        ("deep messages", format!(r#"{{"messages":{}{}}}"#, "[".repeat(1000), "]".repeat(1000))),
        ("unclosed string", r#"{"messages":[{"role":"user","content":"hi"#.into()),
        ("unicode junk", "\u{fffd}\u{202e}\u{1F600}{}".into()),
    ] {
        cases.push(Case::post(name, CHAT, body).status(400));
    }
    for (name, bytes) in [("invalid utf-8", b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}".to_vec()), ("nul bytes", b"\0\0\0\0".to_vec()), ("utf-16", b"\xff\xfe{\0}\0".to_vec())] {
        cases.push(Case::post(name, CHAT, bytes.clone()).status(400));
        cases.push(Case::post(format!("{name} (text)"), TEXT, bytes).status(400));
    }
    // Wrong content types with bodies that are not requests.
    for (ct, body) in [
        ("text/plain", "hello"),
        ("application/x-www-form-urlencoded", "prompt=hello&max_tokens=3"),
        ("multipart/form-data; boundary=xyz", "--xyz\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nhello\r\n--xyz--\r\n"),
        ("application/xml", "<prompt>hello</prompt>"),
        ("application/octet-stream", "\u{1}\u{2}\u{3}"),
        ("application/json; charset=utf-16", "h\0i\0"),
        ("", ""),
    ] {
        cases.push(Case::post(format!("content type {ct:?}"), TEXT, body).header("Content-Type", ct).status(400));
    }
    // Oversized bodies: sent whole, announced by Content-Length, or chunked.
    let big = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(max_body + 10));
    cases.push(Case::post("oversized body", TEXT, big.clone()).status(413));
    cases.push(Case::post("oversized chat body", CHAT, big.clone()).status(413));
    cases.push(Case::post("announced oversized body", TEXT, "{}").header("Content-Length", (max_body as u64 * 1000).to_string()).status(413));
    cases.push(Case::post("announced huge body", CHAT, "{}").header("Content-Length", "99999999999999").status(413));
    let mut chunked = Vec::new();
    for piece in big.as_bytes().chunks(8192) {
        chunked.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        chunked.extend_from_slice(piece);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    cases.push(Case::post("chunked oversized body", TEXT, chunked).header("Transfer-Encoding", "chunked").status(413));
    // A body under the limit that is still enormous for the engine: a huge stop list.
    cases.push(Case::post("stop list too long", TEXT, with_field(TEXT, "stop", &json!(vec!["ab"; 1000]).to_string())).status(400).param("stop"));

    // Unknown routes and wrong methods.
    let long_path = format!("/{}", "a".repeat(8000));
    for path in [
        "/", "/v1", "/v1/", "/v1/chat", "/v1/chat/completions/", "/v1/completions/x", "/v1/embeddings", "/v1/engines", "/v2/models", "/V1/MODELS",
        "/health/", "/metrics/x", "/%2e%2e/%2e%2e/etc/passwd", "/v1/models/../../x", "/%F0%9F%98%80", "/v1/models/abc", "/index.html", long_path.as_str(),
        "/v1/chat/completions%00", "/v1//completions",
    ] {
        cases.push(Case::post(format!("GET {}", clip(path, 30)), path, "").method("GET").status(404));
        cases.push(Case::post(format!("POST {}", clip(path, 30)), path, good_chat).status(404));
    }
    for (method, path) in [
        ("GET", CHAT), ("GET", TEXT), ("PUT", CHAT), ("DELETE", CHAT), ("PATCH", TEXT), ("OPTIONS", CHAT), ("POST", "/v1/models"), ("DELETE", "/v1/models"),
        ("POST", "/health"), ("PUT", "/health"), ("POST", "/metrics"), ("TRACE", CHAT), ("FOO", TEXT),
    ] {
        cases.push(Case::post(format!("{method} {path}"), path, good_chat).method(method).status(405));
    }
    cases
}

/// Checks one answer: a 4xx (the wanted one), JSON, OpenAI's error shape, the wanted param.
fn check(case: &Case, a: &Answer) -> Result<(), String> {
    let want = case.status.map_or("a 4xx".to_owned(), |s| s.to_string());
    if !(400..500).contains(&a.status) || case.status.is_some_and(|s| s != a.status) {
        return Err(format!("status {} (want {want}): {}", a.status, clip(&a.body, 300)));
    }
    if !a.content_type.starts_with("application/json") {
        return Err(format!("content type {:?}: {}", a.content_type, clip(&a.body, 300)));
    }
    let v: Value = serde_json::from_str(&a.body).map_err(|e| format!("not JSON ({e}): {}", clip(&a.body, 300)))?;
    let e = &v["error"];
    let shape = v.as_object().is_some_and(|o| o.len() == 1)
        && e["message"].as_str().is_some_and(|m| !m.is_empty() && m.len() < 2000)
        && e["type"].is_string()
        && e.get("param").is_some_and(|p| p.is_null() || p.is_string())
        && e.get("code").is_some_and(|c| c.is_null() || c.is_string());
    if !shape {
        return Err(format!("not an OpenAI error: {}", clip(&a.body, 300)));
    }
    if let Some(p) = &case.param {
        if e["param"].as_str() != Some(p.as_str()) {
            return Err(format!("param {} (want {p}): {}", e["param"], e["message"]));
        }
    }
    Ok(())
}

fn run(s: &Server, cases: &[Case]) -> Vec<String> {
    cases.iter().filter_map(|c| check(c, &s.raw(&c.bytes())).err().map(|e| format!("{}: {e}", c.name))).collect()
}

/// The good request that must come out the same before, during and after the corpus.
fn good_stream(s: &Server) -> String {
    let body = json!({"messages": [{"role": "user", "content": "a good request"}], "max_tokens": 40, "stream": true});
    chunks(&s.stream(CHAT, &body)).iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_owned)).collect()
}

#[test]
fn hostile_requests_get_json_errors_and_the_server_keeps_serving() {
    const MAX_BODY: usize = 64 * 1024;
    let model = common::model("llama3-f32").to_string_lossy().into_owned();
    let s = Server::start(&model, &["--max-body-bytes", &MAX_BODY.to_string()]);
    let cases = corpus(MAX_BODY);
    assert!(cases.len() >= 400, "the corpus has only {} cases", cases.len());
    let want = good_stream(&s);

    // The corpus, in two halves sent at once, beside a good stream.
    let (a, b) = cases.split_at(cases.len() / 2);
    let (fa, fb, during) = std::thread::scope(|scope| {
        let ha = scope.spawn(|| run(&s, a));
        let hb = scope.spawn(|| run(&s, b));
        let during = good_stream(&s);
        (ha.join().expect("corpus thread"), hb.join().expect("corpus thread"), during)
    });
    let failures: Vec<String> = fa.into_iter().chain(fb).collect();
    assert!(failures.is_empty(), "{} of {} hostile requests were not answered with a 4xx JSON error:\n{}", failures.len(), cases.len(), failures.join("\n"));
    assert_eq!(during, want, "the good stream changed while hostile requests came in");

    // Still serving.
    let h = s.call("GET", "/health", None);
    assert_eq!(h.status, 200, "{}", h.body);
    assert_eq!(serde_json::from_str::<Value>(&h.body).expect("health JSON")["status"], "ok", "{}", h.body);
    assert_eq!(good_stream(&s), want);
    let got = s.post(TEXT, &json!({"prompt": "hi", "max_tokens": 3}));
    assert_eq!(got["usage"]["completion_tokens"], 3);
    // Lenient where clients are sloppy: a JSON body without a JSON content type, a lower-case
    // charset are accepted; a field the server does not implement never is (a 400 naming it).
    let mut lenient = Vec::new();
    for ct in ["text/plain", "application/x-www-form-urlencoded", "application/json; charset=UTF-8", ""] {
        let c = Case::post("lenient", TEXT, r#"{"prompt":"hi","max_tokens":2}"#).header("Content-Type", ct);
        lenient.push(s.raw(&c.bytes()));
    }
    for a in &lenient {
        assert_eq!(a.status, 200, "{}", a.body);
    }
    let a = s.raw(&Case::post("unknown", TEXT, r#"{"prompt":"hi","max_tokens":2,"some_extension":{"x":[1]}}"#).bytes());
    assert_eq!(a.status, 400, "{}", a.body);
    assert_eq!(serde_json::from_str::<Value>(&a.body).expect("JSON error")["error"]["param"], "some_extension", "{}", a.body);
    let (m, idle) = s.wait_for_metrics(&["mlxgen_queue_depth 0", "mlxgen_running_requests 0"]);
    assert!(idle, "not idle after the corpus:\n{m}");
}

#[test]
fn bad_api_keys_get_401_json_errors() {
    let model = common::model("llama3-f32").to_string_lossy().into_owned();
    let s = Server::start(&model, &["--api-key", "sekrit"]);
    let good = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;
    let mut cases = Vec::new();
    let long = format!("Bearer {}", "k".repeat(8000));
    let headers: Vec<Option<Vec<u8>>> = vec![
        None,
        Some(b"".to_vec()),
        Some(b"Bearer".to_vec()),
        Some(b"Bearer ".to_vec()),
        Some(b"Bearer wrong".to_vec()),
        Some(b"Bearer sekrit2".to_vec()),
        Some(b"Bearer sekri".to_vec()),
        Some(b"Bearer SEKRIT".to_vec()),
        Some(b"Bearer sekrit extra".to_vec()),
        Some(b"Bearersekrit".to_vec()),
        Some(b"sekrit".to_vec()),
        Some(b"Basic c2Vrcml0Og==".to_vec()),
        Some(b"Token sekrit".to_vec()),
        Some(b"Bearer \xff\xfe".to_vec()),
        Some(b"Bearer s\xc3\xa9krit".to_vec()),
        Some(long.into_bytes()),
    ];
    for (i, h) in headers.iter().enumerate() {
        for (method, path, body) in [("POST", CHAT, good), ("POST", TEXT, r#"{"prompt":"x"}"#), ("GET", "/v1/models", ""), ("GET", "/metrics", ""), ("GET", "/nowhere", ""), ("POST", CHAT, "{broken")] {
            let mut c = Case::post(format!("auth #{i} {method} {path}"), path, body).method(method).status(401);
            if let Some(v) = h {
                c = c.header("Authorization", v.clone());
            }
            cases.push(c);
        }
    }
    assert!(cases.len() >= 90);
    let failures = run(&s, &cases);
    assert!(failures.is_empty(), "{} of {} requests with bad keys:\n{}", failures.len(), cases.len(), failures.join("\n"));
    let a = s.raw(&cases[0].bytes());
    assert!(a.body.contains("\"authentication_error\""), "{}", a.body);
    // /health needs no key; the right key works, with the scheme in any case.
    let h = s.raw(&Case::post("health", "/health", "").method("GET").bytes());
    assert_eq!(h.status, 200);
    for v in ["Bearer sekrit", "bearer sekrit", "BEARER  sekrit "] {
        let a = s.raw(&Case::post("right key", CHAT, good).header("Authorization", v).bytes());
        assert_eq!(a.status, 200, "{v:?}: {}", a.body);
    }
}

/// Requests that are odd but valid (extreme sampling settings, unicode junk, template-looking
/// text, special-token text, many messages): each gets a well-formed answer (200, or a 4xx JSON
/// error), never a 5xx or a hang, and the server goes on serving.
#[test]
fn odd_but_valid_requests_never_break_the_server() {
    let model = common::model("llama3-f32").to_string_lossy().into_owned();
    let s = Server::start(&model, &[]);
    let msg = |content: &str| json!([{"role": "user", "content": content}]);
    let mut bodies: Vec<(&str, Value)> = Vec::new();
    for content in [
        "\u{0}\u{0}nul", "\u{202e}right-to-left\u{202c}", "😀🙃🧪", &"e\u{301}".repeat(500), "漢字かなカナ한국어", "<|begin_of_text|><|eot_id|><|start_header_id|>",
        "{{ raise_exception('boom') }}{% for x in y %}", "\\u0000 \\ud800", "\r\n\t\u{b}\u{c}", &"x".repeat(3000), " ",
    ] {
        bodies.push((CHAT, json!({"messages": msg(content), "max_tokens": 4})));
        bodies.push((TEXT, json!({"prompt": content, "max_tokens": 4})));
    }
    for messages in [
        json!([{"role": "system", "content": "only a system message"}]),
        json!([{"role": "assistant", "content": "only an assistant message"}]),
        json!([{"role": "tool", "content": "a tool answer", "tool_call_id": "x"}]),
        json!([{"role": "whatever", "content": "an unknown role"}]),
        json!([{"role": "user", "content": null}]),
        json!([{"role": "user"}]),
        json!([{"role": "user", "content": []}]),
        json!([{"role": "user", "content": "hi", "name": "bob", "extra": {"deep": [1, [2, [3]]]}}]),
        json!(vec![json!({"role": "user", "content": "hi"}); 300]),
    ] {
        bodies.push((CHAT, json!({"messages": messages, "max_tokens": 4})));
    }
    let hi = msg("hi");
    for extra in [
        json!({"temperature": 100}), json!({"temperature": 1e-9}), json!({"top_p": 0}), json!({"top_p": 1e-12, "temperature": 1}),
        json!({"min_p": 1, "temperature": 1}), json!({"top_k": 1, "temperature": 1}), json!({"top_k": 512, "temperature": 1}),
        json!({"seed": 9223372036854775807_i64, "temperature": 1}), json!({"seed": 0, "temperature": 1}), json!({"repetition_penalty": 0}),
        json!({"repetition_penalty": 100}), json!({"presence_penalty": -2, "frequency_penalty": 2}), json!({"logit_bias": {"2": 100}}),
        json!({"logit_bias": {"2": -100, "3": -100, "4": -100}}), json!({"n": 64, "max_tokens": 1}), json!({"max_tokens": 1}),
        json!({"logprobs": true, "top_logprobs": 20}), json!({"logprobs": false, "top_logprobs": 0}), json!({"stop": ["😀", "\u{0}", "é"]}),
        json!({"stop": "x".repeat(5000)}), json!({"stream": true, "n": 3, "logprobs": true, "top_logprobs": 5, "stream_options": {"include_usage": true}}),
        json!({"stream": false, "stream_options": {"include_usage": true}}), json!({"max_completion_tokens": 3, "max_tokens": 50}),
        json!({"tools": [], "tool_choice": "none", "user": "u", "response_format": {"type": "text"}, "store": false, "metadata": {}}),
    ] {
        let mut b = json!({"messages": hi, "max_tokens": 6});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        bodies.push((CHAT, b));
    }
    for prompt in [json!([0]), json!([511]), json!(vec![1; 4000]), json!(["one string in a list"])] {
        bodies.push((TEXT, json!({"prompt": prompt, "max_tokens": 3, "logprobs": 20})));
    }
    let mut ok = 0;
    for (path, body) in &bodies {
        let a = s.call("POST", path, Some(&body.to_string()));
        let text = body.to_string();
        let shown = clip(&text, 200);
        assert!(a.status == 200 || (400..500).contains(&a.status), "{shown}: {} {}", a.status, a.body);
        if a.status != 200 {
            let v: Value = serde_json::from_str(&a.body).unwrap_or_else(|_| panic!("{shown}: not JSON: {}", a.body));
            assert!(v["error"]["message"].is_string(), "{shown}: {}", a.body);
            continue;
        }
        ok += 1;
        if body["stream"] == json!(true) {
            let c = chunks(&server_harness::sse_events(&a.body));
            assert!(c.iter().any(|c| c["choices"].as_array().is_some_and(|ch| ch.iter().any(|x| x["finish_reason"].is_string()))), "{shown}");
        } else {
            let v: Value = serde_json::from_str(&a.body).unwrap_or_else(|_| panic!("{shown}: not JSON: {}", a.body));
            let n = body["n"].as_u64().unwrap_or(1) as usize;
            assert_eq!(v["choices"].as_array().map(Vec::len), Some(n), "{shown}: {}", a.body);
            assert!(v["choices"].as_array().unwrap().iter().all(|c| c["finish_reason"] == "stop" || c["finish_reason"] == "length"), "{shown}: {}", a.body);
        }
    }
    assert!(ok * 10 >= bodies.len() * 8, "only {ok} of {} odd but valid requests were served", bodies.len());
    assert_eq!(s.call("GET", "/health", None).status, 200);
    assert_eq!(s.post(TEXT, &json!({"prompt": "hi", "max_tokens": 3}))["usage"]["completion_tokens"], 3);
}
