//! Recorded outputs of each family's format (well-formed and malformed), streaming against whole
//! answers, and forced-call grammars walked at random through their masks.
use super::*;
use crate::constrain::{test_constraints, Grammar};
use engine::sample::TokenConstraint;

fn weather_tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city"]}}}),
        json!({"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}, "exact": {"type": "boolean"}}, "required": ["a", "b"]}}}),
    ]
}

fn calls(format: ToolFormat, text: &str) -> (String, Vec<(String, Value)>) {
    let (content, calls) = split(format, &weather_tools(), text);
    (content, calls.into_iter().map(|c| (c.name, serde_json::from_str(&c.arguments).expect("arguments are JSON"))).collect())
}

#[test]
fn detects_formats_from_templates() {
    assert_eq!(ToolFormat::detect("{{ '<tool_call>\\n' }}{{ tool_call.name }}"), Some(ToolFormat::JsonTools));
    assert_eq!(ToolFormat::detect("<tool_call>\n<function={{ tool_call.name }}>"), Some(ToolFormat::Qwen3Coder));
    assert_eq!(ToolFormat::detect("{{ '[TOOL_CALLS]' }}"), Some(ToolFormat::Mistral));
    assert_eq!(ToolFormat::detect("{{'<｜tool▁calls▁begin｜>'}}"), Some(ToolFormat::DeepSeek));
    assert_eq!(ToolFormat::detect("<|start_header_id|>{% if tools %}{\"name\": function name, \"parameters\": ...}"), Some(ToolFormat::Llama3));
    assert_eq!(ToolFormat::detect("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}"), None);
}

#[test]
fn hermes_json_calls_and_malformed_ones() {
    let (content, c) = calls(ToolFormat::JsonTools, "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>");
    assert_eq!(content, "Let me check.\n");
    assert_eq!(c, vec![("get_weather".into(), json!({"city": "Paris"})), ("add".into(), json!({"a": 1, "b": 2}))]);
    // Not JSON, no name, arguments not an object: content, not an error.
    for bad in ["<tool_call>\n{name: get_weather}\n</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>{\"name\": \"x\", \"arguments\": 3}</tool_call>"] {
        let (content, c) = calls(ToolFormat::JsonTools, bad);
        assert!(c.is_empty(), "{bad}");
        assert_eq!(content, bad);
    }
    // Truncated mid-call: content.
    let (content, c) = calls(ToolFormat::JsonTools, "<tool_call>\n{\"name\": \"get_w");
    assert!(c.is_empty());
    assert_eq!(content, "<tool_call>\n{\"name\": \"get_w");
    // String arguments (some models write them as a JSON string) are read as JSON.
    let (_, c) = calls(ToolFormat::JsonTools, "<tool_call>{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1, \\\"b\\\": 2}\"}</tool_call>");
    assert_eq!(c, vec![("add".into(), json!({"a": 1, "b": 2}))]);
}

#[test]
fn bare_json_calls_without_tags() {
    // Recorded from Qwen2.5-Coder-0.5B-Instruct (greedy, max_tokens 40): the tags left out, the call repeated.
    let recorded = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n{\"name\": \"get_weather\", \"arguments\": {\"city";
    let (content, c) = calls(ToolFormat::JsonTools, recorded);
    assert_eq!(c, vec![("get_weather".into(), json!({"city": "Paris"}))]);
    assert_eq!(content, "{\"name\": \"get_weather\", \"arguments\": {\"city");
    // JSON that is not a call, and text that only starts like JSON, stay content.
    for text in ["{\"answer\": 42}", "{oops", "{\"name\": 5}"] {
        let (content, c) = calls(ToolFormat::JsonTools, text);
        assert!(c.is_empty() && content == text, "{text}");
    }
    // Text first, then a tagged call: the tags are still found.
    let (content, c) = calls(ToolFormat::JsonTools, "Sure <tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}</tool_call>");
    assert_eq!((content.as_str(), c.len()), ("Sure ", 1));
}

#[test]
fn qwen3_coder_calls_convert_by_schema() {
    let text = "Sure.\n<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n2.5\n</parameter>\n<parameter=exact>\nTrue\n</parameter>\n</function>\n</tool_call>";
    let (content, c) = calls(ToolFormat::Qwen3Coder, text);
    assert_eq!(content, "Sure.\n");
    assert_eq!(c, vec![("add".into(), json!({"a": 2, "b": 2.5, "exact": true}))]);
    let (_, c) = calls(ToolFormat::Qwen3Coder, "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\nnull\n</parameter>\n</function>\n</tool_call>");
    assert_eq!(c, vec![("get_weather".into(), json!({"city": "New York", "days": null}))]);
    for bad in ["<tool_call>\n<function=add>\n<parameter=a>\n1.5\n</parameter>\n</tool_call>", "<tool_call>\nno function\n</tool_call>"] {
        let (content, c) = calls(ToolFormat::Qwen3Coder, bad);
        assert!(c.is_empty() && content == bad, "{bad}");
    }
    // An integer parameter that is not an integer: the call does not parse.
    let bad = "<tool_call>\n<function=get_weather>\n<parameter=days>\n1.5\n</parameter>\n</function>\n</tool_call>";
    assert!(calls(ToolFormat::Qwen3Coder, bad).1.is_empty());
}

#[test]
fn llama3_bare_json_calls() {
    let (content, c) = calls(ToolFormat::Llama3, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 1}}");
    assert_eq!(content, "");
    assert_eq!(c.len(), 2);
    assert_eq!(c[0], ("get_weather".into(), json!({"city": "Oslo"})));
    for text in ["The weather is nice.", "{\"answer\": 42}", "{not json", "  {\"name\": \"add\", \"parameters\": {}} and more"] {
        let (content, c) = calls(ToolFormat::Llama3, text);
        assert!(c.is_empty() && content == text, "{text}");
    }
}

#[test]
fn mistral_list_and_args_forms() {
    let (content, c) = calls(ToolFormat::Mistral, "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]");
    assert_eq!(content, "");
    assert_eq!(c.len(), 2);
    let (_, c) = calls(ToolFormat::Mistral, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}add[ARGS]{\"a\": 1, \"b\": 2}");
    assert_eq!(c, vec![("get_weather".into(), json!({"city": "Rome"})), ("add".into(), json!({"a": 1, "b": 2}))]);
    let bad = "[TOOL_CALLS]get_weather[ARGS]{\"city\": ";
    let (content, c) = calls(ToolFormat::Mistral, bad);
    assert!(c.is_empty() && content == bad);
}

#[test]
fn deepseek_v3_and_v31_forms() {
    let v3 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Lima\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let (content, c) = calls(ToolFormat::DeepSeek, &format!("Checking.{v3}"));
    assert_eq!(content, "Checking.");
    assert_eq!(c, vec![("get_weather".into(), json!({"city": "Lima"}))]);
    let v31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{\"a\": 1, \"b\": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    assert_eq!(calls(ToolFormat::DeepSeek, v31).1, vec![("add".into(), json!({"a": 1, "b": 2}))]);
    let bad = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\"\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let (content, c) = calls(ToolFormat::DeepSeek, bad);
    assert!(c.is_empty() && content == bad);
}

#[test]
fn streaming_matches_whole_answers() {
    let cases = [
        (ToolFormat::JsonTools, "Hi <tool_ <tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call> bye <tool_call>oops</tool_call> end <tool_c"),
        (ToolFormat::Qwen3Coder, "x<tool_call>\n<function=get_weather>\n<parameter=city>\nBern\n</parameter>\n</function>\n</tool_call>"),
        (ToolFormat::Llama3, "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}"),
        (ToolFormat::Llama3, "  plain text answer"),
        (ToolFormat::JsonTools, " {\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n{\"name\": \"add\""),
        (ToolFormat::JsonTools, "  Hello <tool_call>{\"name\": \"add\", \"arguments\": {}}</tool_call>"),
        (ToolFormat::Mistral, "ok [TOOL_CALLS]add[ARGS]{\"a\": 1, \"b\": 2}"),
        (ToolFormat::DeepSeek, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{\"a\": 1, \"b\": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>after"),
    ];
    for (format, text) in cases {
        let (whole_content, whole_calls) = split(format, &weather_tools(), text);
        for step in [1, 3, 7] {
            let mut s = ToolStream::new(format, weather_tools());
            let mut pieces = Vec::new();
            let chars: Vec<char> = text.chars().collect();
            for chunk in chars.chunks(step) {
                pieces.extend(s.push(&chunk.iter().collect::<String>()));
            }
            pieces.extend(s.finish());
            let content: String = pieces.iter().filter_map(|p| if let Piece::Content(c) = p { Some(c.as_str()) } else { None }).collect();
            let names: Vec<(String, String)> = pieces.iter().filter_map(|p| if let Piece::Call(c) = p { Some((c.name.clone(), c.arguments.clone())) } else { None }).collect();
            assert_eq!(content, whole_content, "{format:?} step {step}");
            assert_eq!(names, whole_calls.iter().map(|c| (c.name.clone(), c.arguments.clone())).collect::<Vec<_>>(), "{format:?} step {step}");
        }
    }
}

/// A tiny xorshift generator: the random walk is the same on every run.
fn walk(c: &mut dyn TokenConstraint, seed: u64) -> String {
    let mut state = seed | 1;
    let mut bytes = Vec::new();
    for _ in 0..400 {
        let allowed = c.allowed(260).expect("mask");
        let ids: Vec<usize> = (0..260).filter(|&i| allowed[i]).collect();
        assert!(!ids.is_empty(), "the grammar dead-ended after {:?}", String::from_utf8_lossy(&bytes));
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let t = ids[(state % ids.len() as u64) as usize];
        if t == 258 {
            return String::from_utf8_lossy(&bytes).into_owned();
        }
        c.commit(t as u32).expect("commit");
        match t {
            256 => bytes.extend_from_slice(b"{\""),
            257 => bytes.extend_from_slice(b"\"}"),
            b => bytes.push(b as u8),
        }
    }
    panic!("no end after 400 tokens: {:?}", String::from_utf8_lossy(&bytes));
}

#[test]
fn forced_grammars_give_calls_that_parse() {
    let cs = test_constraints();
    let tools = vec![json!({"type": "function", "function": {"name": "pick", "parameters": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}, "flag": {"type": "boolean"}}, "required": ["n", "flag"], "additionalProperties": false}}})];
    for format in [ToolFormat::JsonTools, ToolFormat::Qwen3Coder, ToolFormat::Llama3, ToolFormat::Mistral, ToolFormat::DeepSeek] {
        for parallel in [false, true] {
            let lark = format.forced_grammar(&tools, parallel, "", &|_| None);
            let mut c = cs.compile(&Grammar::Lark(lark.clone())).unwrap_or_else(|e| panic!("{format:?}: {e}\n{lark}"));
            for seed in 1..4 {
                let mut c2 = cs.compile(&Grammar::Lark(lark.clone())).expect("compiles");
                let text = walk(&mut c2, seed * 7919);
                let (content, calls) = split(format, &tools, &text);
                assert!(content.trim().is_empty(), "{format:?}: content {content:?} in {text:?}");
                assert!(!calls.is_empty() && (parallel || calls.len() == 1), "{format:?}: {text:?}");
                for call in calls {
                    assert_eq!(call.name, "pick");
                    let args: Value = serde_json::from_str(&call.arguments).expect("JSON");
                    assert!(args["n"].as_i64().is_some_and(|n| (0..=9).contains(&n)) && args["flag"].is_boolean(), "{format:?}: {args}");
                }
            }
            let _ = c.allowed(260);
        }
    }
}
