//! `mlx-gen serve` as agents use it, driven by the official `openai` client with `jsonschema`
//! (tests/oracle/agents_client.py): tools rendered by the chat template (prompt tokens equal to
//! transformers'), forced tool calls and 20 `response_format` schemas on tiny random models that
//! parse and validate whatever the weights (constrained decoding), streamed equal to non-streamed,
//! and 400s naming the field; and `/v1/messages` driven by the official `anthropic` client
//! (tests/oracle/anthropic_client.py): text equal to chat completions', events, stop reasons, forced
//! tool use validating against the input schema, tool results in the history, errors.
mod common;
mod server_harness;

use serde_json::{json, Value};
use server_harness::Server;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A copy of test model `variant` with Qwen2.5's chat template (tools, tool calls, tool
/// responses). The caller removes it.
pub fn tool_model_copy(variant: &str, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mlx-gen-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    common::copy_dir(&common::model(variant), &dir);
    let cfg_path = dir.join("tokenizer_config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    let template = std::fs::read_to_string(common::oracle_dir().join("qwen25_tool_template.jinja")).unwrap();
    cfg["chat_template"] = Value::String(template);
    std::fs::write(&cfg_path, serde_json::to_string(&cfg).unwrap()).unwrap();
    let _ = std::fs::remove_file(dir.join("chat_template.jinja"));
    dir
}

fn run_driver(script: &str, spec: &Value) -> Value {
    let mut child = Command::new(common::venv_python())
        .arg(common::oracle_dir().join(script))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    child.stdin.take().unwrap().write_all(spec.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().expect("wait for the driver");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed ({}):\n{stderr}", out.status);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{script} printed no JSON ({e}):\n{stderr}"))
}

fn assert_no_failures(report: &Value, at_least: u64) {
    let failures = report["failures"].as_array().expect("failures");
    assert!(
        failures.is_empty(),
        "{} of {} checks failed:\n{}",
        failures.len(),
        report["checks"],
        failures.iter().map(|f| f.as_str().unwrap_or("")).collect::<Vec<_>>().join("\n")
    );
    assert!(report["checks"].as_u64().unwrap() >= at_least, "too few checks ran: {report}");
}

#[test]
fn agents_get_tool_calls_and_structured_output() {
    let dir = tool_model_copy("qwen2-f32", "agents");
    let model = dir.to_string_lossy().into_owned();
    let plain = common::model("llama3-f32").to_string_lossy().into_owned();
    let tools = Server::start(&model, &[]);
    let plain_server = Server::start(&plain, &[]);
    let spec = json!({
        "base_url": format!("{}/v1", tools.base),
        "plain_base_url": format!("{}/v1", plain_server.base),
        "model": model,
        "plain_model": plain,
        "model_dir": model,
    });
    let report = run_driver("agents_client.py", &spec);
    assert_eq!(tools.call("GET", "/health", None).status, 200);
    let _ = std::fs::remove_dir_all(&dir);
    assert_no_failures(&report, 200);
}

#[test]
fn the_anthropic_client_gets_messages() {
    let dir = tool_model_copy("qwen2-f32", "anthropic");
    let model = dir.to_string_lossy().into_owned();
    let open = Server::start(&model, &[]);
    let keyed = Server::start(&model, &["--api-key", "sk-ant-test"]);
    let spec = json!({
        "base_url": open.base,
        "openai_base_url": format!("{}/v1", open.base),
        "keyed_base_url": keyed.base,
        "api_key": "sk-ant-test",
        "model": model,
    });
    let report = run_driver("anthropic_client.py", &spec);
    let metrics = open.metrics();
    let _ = std::fs::remove_dir_all(&dir);
    assert_no_failures(&report, 60);
    assert!(metrics.contains("endpoint=\"messages\""), "no messages requests in /metrics:\n{metrics}");
}

/// `generate --json-schema / --regex / --grammar`: outputs follow them whatever the weights, sampled
/// or not, also with speculative decoding (greedy: the tokens of constrained plain decoding, drafts
/// checked against the grammar); bad grammars are one-line errors.
#[test]
fn generate_follows_schemas_regexes_and_grammars() {
    let model = common::model("qwen2-f32");
    let model = model.to_str().unwrap();
    let dir = std::env::temp_dir().join(format!("mlx-gen-constrain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = dir.join("schema.json");
    std::fs::write(&schema, r#"{"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 7}, "c": {"enum": ["x", "y"]}}, "required": ["n", "c"], "additionalProperties": false}"#).unwrap();
    let lark = dir.join("yes_no.lark");
    std::fs::write(&lark, "start: (\"yes\" | \"no\") \"!\"\n").unwrap();
    let run = |extra: &[&str]| -> Value {
        let mut args = vec!["generate", "--model", model, "--prompt", "hi", "-m", "60", "--output", "json"];
        args.extend_from_slice(extra);
        let out = common::mlx_gen(&args, None);
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("JSON output")
    };
    let schema_s = schema.to_str().unwrap();
    for sampling in [&[][..], &["--temp", "1.0", "--top-p", "0.9", "--seed", "5"][..]] {
        let r = run(&[&["--json-schema", schema_s][..], sampling].concat());
        let v: Value = serde_json::from_str(r["text"].as_str().unwrap()).unwrap_or_else(|e| panic!("{r}: {e}"));
        assert!(v["n"].as_i64().is_some_and(|n| (3..=7).contains(&n)) && (v["c"] == "x" || v["c"] == "y"), "{v}");
        assert_eq!(r["finish_reason"], "stop", "{r}");
        let r = run(&[&["--regex", "[0-9]{2}-[a-c]+"][..], sampling].concat());
        let t = r["text"].as_str().unwrap();
        let (digits, letters) = t.split_once('-').unwrap_or_else(|| panic!("{t:?}"));
        assert!(digits.len() == 2 && digits.chars().all(|c| c.is_ascii_digit()) && !letters.is_empty() && letters.chars().all(|c| "abc".contains(c)), "{t:?}");
        let r = run(&[&["--grammar", lark.to_str().unwrap()][..], sampling].concat());
        assert!(r["text"] == "yes!" || r["text"] == "no!", "{r}");
    }
    // A constrained token read through the mailbox while the forward pass behind it runs (one
    // evaluation a step) changes no token: greedy and seeded runs equal those with the mailbox off
    // (`MLX_GEN_MAILBOX=0`: the sampling an evaluation of its own) and those reading log-probabilities.
    let mailbox_off = |extra: &[&str]| -> Value {
        let mut args = vec!["generate", "--model", model, "--prompt", "hi", "-m", "60", "--output", "json"];
        args.extend_from_slice(extra);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mlx-gen")).args(&args).env("MLX_GEN_MAILBOX", "0").stdin(std::process::Stdio::null()).output().unwrap();
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("JSON output")
    };
    for sampling in [&[][..], &["--temp", "1.0", "--top-p", "0.9", "--seed", "5"][..]] {
        let args = [&["--json-schema", schema_s][..], sampling].concat();
        let on = run(&args);
        assert_eq!(on["tokens"], mailbox_off(&args)["tokens"], "{args:?}: the mailbox changed the tokens");
        assert_eq!(on["tokens"], run(&[&args[..], &["--logprobs"]].concat())["tokens"], "{args:?}: reading log-probabilities changed the tokens");
    }
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"type": "nope"}"#).unwrap();
    common::assert_error(&common::mlx_gen(&["generate", "--model", model, "--json-schema", bad.to_str().unwrap()], None), 1, &["--json-schema", "nope"]);
    // Speculative decoding under each constraint: greedy tokens as constrained plain decoding's;
    // sampled, the output still follows the grammar.
    let draft = common::model("llama3-q4g64");
    let draft = draft.to_str().unwrap();
    let lark_s = lark.to_str().unwrap();
    for constraint in [&["--json-schema", schema_s][..], &["--regex", "[0-9]{2}-[a-c]+"], &["--grammar", lark_s]] {
        let plain = run(constraint);
        for spec in [&["--prompt-lookup", "2", "--num-draft-tokens", "4"][..], &["--draft-model", draft, "--num-draft-tokens", "3"]] {
            let r = run(&[constraint, spec].concat());
            assert_eq!(r["tokens"], plain["tokens"], "{constraint:?} {spec:?}: tokens differ from constrained plain decoding");
            assert!(r["draft_tokens_proposed"].as_u64().is_some_and(|p| p > 0), "{constraint:?} {spec:?}: nothing drafted: {r}");
            let sampled = run(&[constraint, spec, &["--temp", "1.0", "--seed", "3"]].concat());
            let t = sampled["text"].as_str().unwrap();
            match constraint[0] {
                "--json-schema" => assert!(serde_json::from_str::<Value>(t).is_ok_and(|v| v["n"].is_i64()), "{t:?}"),
                "--regex" => assert!(t.len() >= 4 && t.as_bytes()[2] == b'-', "{t:?}"),
                _ => assert!(t == "yes!" || t == "no!", "{t:?}"),
            }
        }
    }
    let out = common::mlx_gen(&["generate", "--model", model, "--regex", "a", "--json-schema", schema_s], None);
    assert_eq!(out.status.code(), Some(2), "two constraints at once is a usage error");
    let _ = std::fs::remove_dir_all(&dir);
}
