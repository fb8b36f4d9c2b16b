//! The tokenizer crate against Python mlx-lm 0.32.2 (the oracle venv): encode, decode, chat templates, the
//! streaming detokenizers' segments and the loading errors, on the three tokenizer kinds that
//! tests/oracle/make_tokenizer.py builds (byte-level BPE, SentencePiece BPE, Metaspace Unigram) and on
//! variants of their configs. Needs the oracle venv (scripts/oracle-venv.sh); fails, never skips.

mod tok_common;

use tok_common::*;
use std::path::{Path, PathBuf};

use tokenizer::{ChatMessage, DetokenizerKind, Tokenizer};
use serde_json::{json, Value};

/// Qwen3's template, shortened: namespaces, reversed loops, Python string methods, `enable_thinking`.
const QWEN3_LIKE: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"##;

/// Many Jinja features whose output differs between naive engines and Jinja2.
const ZOO: &str = r##"{%- set ns = namespace(count=0) %}
{%- for m in messages %}
{%- if m.content == 'skip' %}{% continue %}{% endif %}
{%- if m.content == 'stop' %}{% break %}{% endif %}
{%- if m.content == 'boom' %}{{ raise_exception('boom at ' ~ loop.index) }}{% endif %}
{%- set ns.count = ns.count + 1 %}
[{{ loop.index }}/{{ loop.length }}] {{ m.role | upper }}: {{ m.content | tojson }} {{ m | tojson }}
{{ m | tojson(indent=2) }} {{ m | tojson(sort_keys=true, separators=(',', ':')) }} {{ m.content | tojson(ensure_ascii=true) }}
  split={{ m.content.split() }} first={{ m.content.split(' ')[0] }} upper={{ m.content.upper() }} title={{ m.content.title() }}
  strip={{ m.content.strip() }}|{{ m.content.lstrip() }}|{{ m.content.rstrip() }}|{{ m.content | trim }}
  starts={{ m.content.startswith('H') }} ends={{ m.content.endswith('!') }} replace={{ m.content.replace(' ', '_') }} len={{ m.content | length }}
  {%- if loop.previtem is defined %} prev={{ loop.previtem.role }}{% endif %}

  {% generation %}gen-{{ m.role }}{% endgeneration %}
{% endfor %}
count={{ ns.count }} bools={{ true }} {{ false }} {{ none }} {{ add_generation_prompt }} num={{ 2.5 }} {{ 10 // 3 }} {{ 1e-5 }}
list={{ [1, 'a', none, true, 2.5] }} dict={{ {'k': 'v', 'n': 1} }}
tools={{ tools }} docs={{ documents is none }} bos={{ bos_token is defined }} eos={{ eos_token }} pad={{ pad_token }} think={{ enable_thinking }}
{{ dict(a=1, b='x') | tojson }} {{ range(3) | list }} {{ messages | map(attribute='role') | join(',') }} {{ messages[-1]['content'] }}
{{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages[0].get('role') }} {{ messages[0].missing is defined }}
date={{ strftime_now('%Y-%m-%d') }}
B={{ 7 / 2 }}|{{ 1.0 }}|{{ 2 ** 10 }}|{{ undefined_var|default('dflt') }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ 0.1 + 0.2 }}|{{ 1e100 }}
C={{ "%s-%d"|format('a', 3) }}|{{ 'hello world'|capitalize }}|{{ [3,1,2]|sort }}|{{ [1,2,3]|sum }}|{{ 3|string + 'x' }}
E={{ 'yes' if messages else 'no' }}|{{ true and 'x' }}|{{ false or 0 }}|{{ 'x' ~ true ~ none }}|{{ 'b' in 'abc' }}|{{ '%05d'|format(42) }}
G={% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %}|{{ range(1, 10, 3)|list }}|{{ [none, 1]|select|list }}|{{ 'xxhixx'.strip('x') }}
    {% if add_generation_prompt %}
GEN
    {% endif %}
{% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %}
tail
"##;

const TEXTS: &[&str] = &[
    "Hello world",
    "",
    " ",
    "  leading and trailing  ",
    "\n\n\n",
    "\t\tTabs\tand  spaces   everywhere\t",
    "def f(x):\n    return x  *  2\n\n\tif x:\n\t\tpass\n",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
    "你好，世界！今天天气很好。",
    "机器学习是人工智能的一个分支。",
    "未见过的汉字：龘靐齉",
    "Emoji 😀🚀 family 👨‍👩‍👧‍👦 skin 👍🏽 flag 🇯🇵 heart ❤️",
    "1234567890 3.14159 -42 1e10 0x1F 2024-06-01",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<s>[INST] hi [/INST] ok</s>",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<start_of_turn>user\nhey<end_of_turn>",
    "Ünïcödé café naïve Zürich",
    "e\u{301} composed? A\u{30a}",
    "windows\r\nline\rendings",
    "ctrl \u{0} \u{7} \u{1b}[0m",
    "a ,b . c ! d ? e 's f n't g 're h 've i 'm",
    "Русский текст, ελληνικά, العربية, हिन्दी, 日本語のテキスト, 한국어",
    "<unk> <0x41> <pad> </s> <bos>",
    "the the the the the the the the the the the the the the the the the the the the",
];

fn chats(kind: &str) -> Vec<Value> {
    let m = |role: &str, content: &str| json!({"role": role, "content": content});
    let mut out = vec![
        json!({"messages": [m("user", "Hello!")]}),
        json!({"messages": [m("user", "Hello!")], "add_generation_prompt": false}),
        json!({"messages": [m("system", "You are terse."), m("user", "What is 2+2?")]}),
        json!({"messages": [m("user", "  padded  \n"), m("assistant", "你好 😀"), m("user", "again\tand again")]}),
        json!({"messages": [m("user", "<|im_start|>inject<|im_end|><s></s>")]}),
        json!({"messages": []}),
    ];
    if kind == "spm" {
        out.push(json!({"messages": [m("user", "a"), m("user", "b")]}));
    }
    out
}

fn json_chats() -> Vec<Value> {
    let m = |role: &str, content: &str| json!({"role": role, "content": content});
    vec![
        json!({"messages": [m("user", "Hi"), {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello", "tool_calls": null}, m("user", "And?")]}),
        json!({"messages": [m("user", "Hi"), {"role": "assistant", "content": "Hello", "reasoning_content": "because"}]}),
        json!({"messages": [m("user", "Hi")], "kwargs": {"enable_thinking": false}}),
        json!({"messages": [m("system", "sys"), m("user", "<tool_response>x</tool_response>"), m("user", "q")]}),
        json!({"messages": [m("system", "sys"), m("user", "Weather?")], "kwargs": {"tools": [WEATHER_TOOL.clone()]}}),
        json!({"messages": [m("user", "Weather?"), TOOL_CALL.clone(), {"role": "tool", "content": "sunny", "tool_call_id": "abcdefghi"}]}),
    ]
}

static WEATHER_TOOL: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, °C",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1.5}},
        "required": ["city"]}}})
});

static TOOL_CALL: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| {
    json!({"role": "assistant", "content": null, "tool_calls": [{"id": "abcdefghi", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]})
});

/// Conversations for real-world templates (the opt-in `templates_in_dir_match_mlx_lm`).
fn real_chats() -> Vec<Value> {
    let m = |role: &str, content: &str| json!({"role": role, "content": content});
    vec![
        json!({"messages": [m("user", "Hello")]}),
        json!({"messages": [m("system", "Be brief."), m("user", "Hi"), m("assistant", "Hello!"), m("user", "Bye")]}),
        json!({"messages": [m("system", "Be brief."), m("user", "Hi"), m("assistant", "Hello!")], "add_generation_prompt": false}),
        json!({"messages": [m("user", "Q"), m("assistant", "<think>\nr\n</think>\n\nA"), m("user", "Q2")]}),
        json!({"messages": [m("user", "Q")], "kwargs": {"enable_thinking": true}}),
        json!({"messages": [m("user", "Weather?"), TOOL_CALL.clone(), {"role": "tool", "content": "sunny", "tool_call_id": "abcdefghi"}]}),
        json!({"messages": [m("user", "Weather in Paris?")], "kwargs": {"tools": [WEATHER_TOOL.clone()]}}),
    ]
}

fn zoo_chats() -> Vec<Value> {
    let m = |role: &str, content: &str| json!({"role": role, "content": content});
    vec![
        json!({"messages": [m("user", "Hello world!"), m("assistant", "  Spaced out  "), m("user", "skip"),
            m("user", "中文 😀 \"quoted\" \\ back\ttab\nnew 'single'"), m("user", "stop"), m("user", "never")]}),
        json!({"messages": [m("user", "Hello world!")], "add_generation_prompt": false}),
        json!({"messages": [m("user", "fine"), m("user", "boom")]}),
    ]
}

/// A deterministic pseudo-random generator (64-bit LCG), so failures reproduce.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// Id sequences that split multi-byte characters over byte tokens, end mid-character, or are invalid UTF-8.
fn byte_sequences(tok: &Tokenizer, kind: &str) -> Vec<Vec<u32>> {
    let byte_token = |b: u8| -> Option<u32> {
        match kind {
            "bpe" => {
                let printable = |b: u32| {
                    (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b)
                };
                let n = (0..u32::from(b)).filter(|x| !printable(*x)).count() as u32;
                let c = if printable(u32::from(b)) {
                    u32::from(b)
                } else {
                    256 + n
                };
                tok.token_to_id(&char::from_u32(c)?.to_string())
            }
            "spm" => tok.token_to_id(&format!("<0x{b:02X}>")),
            _ => None,
        }
    };
    let seqs: [&[u8]; 9] = [
        "😀".as_bytes(),
        "a😀b".as_bytes(),
        "中文".as_bytes(),
        &[0xF0, 0x9F, 0x98],
        &[0x80, 0x41, 0xE4, 0xB8],
        &[0xF0, 0x41, 0x9F],
        &[0x00, 0x41, 0x00],
        &[0xED, 0xA0, 0x80, 0x20, 0x20],
        &[0x20, 0x20, 0xC3, 0xA9, 0x20],
    ];
    seqs.iter()
        .filter_map(|s| {
            s.iter()
                .map(|b| byte_token(*b))
                .collect::<Option<Vec<u32>>>()
        })
        .collect()
}

struct Case {
    name: String,
    dir: PathBuf,
    req: Value,
}

fn request(tok: &Tokenizer, kind: &str, chats: Vec<Value>, seed: u64) -> Value {
    let mut streams: Vec<Vec<u32>> = Vec::new();
    for t in TEXTS {
        streams.push(tok.encode(t, false).expect("encode"));
    }
    streams.extend(byte_sequences(tok, kind));
    let mut rng = Lcg(seed);
    let n = tok.vocab_size() as u64;
    for _ in 0..40 {
        let len = 1 + rng.below(30) as usize;
        streams.push((0..len).map(|_| rng.below(n) as u32).collect());
    }
    let space = ["\u{120}", "\u{2581}"]
        .iter()
        .filter_map(|t| tok.token_to_id(t))
        .collect::<Vec<_>>();
    if let Some(&s) = space.first() {
        let hello = tok.encode("Hello", false).expect("encode");
        streams.push([vec![s, s], hello.clone(), vec![s], hello, vec![s]].concat());
    }
    if kind == "bpe" {
        // Ids past the vocab (a padded embedding): the BPE detokenizer prints "!", decode drops them.
        streams.push(vec![5, n as u32 + 3, 6, 99_999]);
    }
    let mut decode = streams.clone();
    decode.push(vec![]);
    json!({
        "encode": TEXTS,
        "decode": decode,
        "stream": streams,
        "chat": chats,
        "tokens": ["<|im_end|>", "<think>", "Hello", "\u{120}the", "\u{2581}the", "<0x41>", "nope-not-a-token", "<image>", "<tool>"],
    })
}

fn check(case: &Case, resp: &Value) {
    let name = &case.name;
    let tok = Tokenizer::from_dir(&case.dir).unwrap_or_else(|e| panic!("{name}: load: {e}"));
    assert_eq!(
        tok.vocab_size() as u64,
        resp["vocab_size"].as_u64().expect("vocab_size"),
        "{name}: vocab_size"
    );
    let mut eos = tok.eos_token_ids();
    eos.sort_unstable();
    assert_eq!(json!(eos), resp["eos_token_ids"], "{name}: eos_token_ids");
    assert_eq!(
        json!(tok.bos_token()),
        resp["bos_token"],
        "{name}: bos_token"
    );
    assert_eq!(
        json!(tok.has_chat_template()),
        resp["has_chat_template"],
        "{name}: has_chat_template"
    );
    assert_eq!(
        json!(tok.has_thinking()),
        resp["has_thinking"],
        "{name}: has_thinking"
    );
    let kind = match tok.detokenizer_kind() {
        DetokenizerKind::Naive => ("NaiveStreamingDetokenizer", Value::Null),
        DetokenizerKind::Spm { trim_space } => ("SPMStreamingDetokenizer", json!(trim_space)),
        DetokenizerKind::Bpe => ("BPEStreamingDetokenizer", Value::Null),
    };
    assert_eq!(
        (json!(kind.0), kind.1),
        (resp["detokenizer"].clone(), resp["trim_space"].clone()),
        "{name}"
    );

    for key in ["encode", "decode", "stream", "chat", "tokens"] {
        let (asked, got) = (
            case.req[key].as_array().map(Vec::len),
            resp[key].as_array().map(Vec::len),
        );
        assert_eq!(
            asked, got,
            "{name}: the reference answered every {key} item"
        );
    }
    for (text, want) in case.req["encode"]
        .as_array()
        .expect("texts")
        .iter()
        .zip(resp["encode"].as_array().expect("encode"))
    {
        let text = text.as_str().expect("text");
        assert_eq!(
            json!(tok.encode(text, true).expect("encode")),
            want["with"],
            "{name}: encode({text:?}, true)"
        );
        assert_eq!(
            json!(tok.encode(text, false).expect("encode")),
            want["without"],
            "{name}: encode({text:?}, false)"
        );
    }
    for (ids, want) in case.req["decode"]
        .as_array()
        .expect("decode")
        .iter()
        .zip(resp["decode"].as_array().expect("d"))
    {
        let ids: Vec<u32> = serde_json::from_value(ids.clone()).expect("ids");
        assert_eq!(
            json!(tok.decode(&ids, false).expect("decode")),
            want["keep"],
            "{name}: decode({ids:?})"
        );
        assert_eq!(
            json!(tok.decode(&ids, true).expect("decode")),
            want["skip"],
            "{name}: decode({ids:?}, skip)"
        );
    }
    let mut detok = tok.detokenizer();
    for (ids, want) in case.req["stream"]
        .as_array()
        .expect("stream")
        .iter()
        .zip(resp["stream"].as_array().expect("s"))
    {
        let ids: Vec<u32> = serde_json::from_value(ids.clone()).expect("ids");
        detok.reset();
        let mut segments = Vec::new();
        for &id in &ids {
            detok.add_token(id);
            segments.push(detok.last_segment());
        }
        detok.finalize();
        segments.push(detok.last_segment());
        assert_eq!(
            json!(segments),
            want["segments"],
            "{name}: stream segments of {ids:?}"
        );
        assert_eq!(
            json!(detok.text()),
            want["text"],
            "{name}: stream text of {ids:?}"
        );
        assert_eq!(detok.tokens(), &ids[..], "{name}: tokens");
    }
    for (chat, want) in case.req["chat"]
        .as_array()
        .expect("chat")
        .iter()
        .zip(resp["chat"].as_array().expect("c"))
    {
        let agp = chat
            .get("add_generation_prompt")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let extra: Vec<(String, Value)> = chat
            .get("kwargs")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let tools = extra
            .iter()
            .find(|(k, _)| k == "tools")
            .map(|(_, v)| v.clone());
        let extra: Vec<(String, Value)> = extra.into_iter().filter(|(k, _)| k != "tools").collect();
        let got = tok.apply_chat_template_json(&chat["messages"], agp, tools.as_ref(), &extra);
        let only_role_content = chat["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .all(|m| m.as_object().is_some_and(|o| o.len() == 2));
        let plain: Option<Vec<ChatMessage>> = serde_json::from_value(chat["messages"].clone())
            .ok()
            .filter(|_| only_role_content);
        if let (Some(msgs), true) = (plain, extra.is_empty() && tools.is_none()) {
            let simple = tok.apply_chat_template(&msgs, agp);
            assert_eq!(
                format!("{simple:?}"),
                format!("{got:?}"),
                "{name}: both chat template entry points agree"
            );
        }
        match (got, want.get("error")) {
            (Ok(text), None) => {
                assert_eq!(json!(text), want["text"], "{name}: chat template of {chat}");
                let ids = tok.encode(&text, false).expect("encode chat");
                assert_eq!(
                    json!(ids),
                    want["ids"],
                    "{name}: encoded chat prompt of {chat}"
                );
            }
            (Err(e), Some(_)) => assert!(!e.to_string().is_empty()),
            (got, _) => panic!("{name}: chat {chat}: mlx-gen gave {got:?}, mlx-lm gave {want}"),
        }
    }
    let tokens: Vec<Option<u32>> = case.req["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| tok.token_to_id(t.as_str().expect("t")))
        .collect();
    assert_eq!(json!(tokens), resp["tokens"], "{name}: token_to_id");
}

#[test]
fn matches_mlx_lm() {
    let py = python();
    let tmp = TempDir::new("oracle");
    let base = &tmp.0;
    for kind in ["bpe", "spm", "unigram"] {
        make_tokenizer(&py, &base.join(kind), kind);
    }
    let mut cases: Vec<(String, PathBuf, &str, Vec<Value>)> = Vec::new();
    for kind in ["bpe", "spm", "unigram"] {
        cases.push((kind.to_string(), base.join(kind), kind, chats(kind)));
    }
    // chat_template.jinja wins over the config's template; a Qwen3-like template with thinking.
    let qwen = copy_kind(base, "bpe", "bpe-jinja");
    write(&qwen.join("chat_template.jinja"), QWEN3_LIKE);
    cases.push((
        "bpe-jinja".into(),
        qwen,
        "bpe",
        [chats("bpe"), json_chats()].concat(),
    ));
    // Template list form: "default" is used when no tools are given.
    let listed = copy_kind(base, "bpe", "bpe-list");
    edit_config(&listed, |c| {
        c.insert("chat_template".into(), json!([{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": ZOO}]));
    });
    cases.push(("bpe-list".into(), listed, "bpe", zoo_chats()));
    // Template list without a default: an error on both sides.
    let nodefault = copy_kind(base, "bpe", "bpe-nodefault");
    edit_config(&nodefault, |c| {
        c.insert(
            "chat_template".into(),
            json!([{"name": "tool_use", "template": "TOOLS"}]),
        );
    });
    cases.push((
        "bpe-nodefault".into(),
        nodefault,
        "bpe",
        chats("bpe")[..1].to_vec(),
    ));
    // No template at all.
    let none = copy_kind(base, "bpe", "bpe-notemplate");
    edit_config(&none, |c| {
        c.remove("chat_template");
    });
    cases.push((
        "bpe-notemplate".into(),
        none,
        "bpe",
        chats("bpe")[..1].to_vec(),
    ));
    // The SentencePiece decoder without its Strip step: mlx-lm's SPM detokenizer with trim_space=False.
    let nostrip = copy_kind(base, "spm", "spm-nostrip");
    let tj_path = nostrip.join("tokenizer.json");
    let mut tj: Value =
        serde_json::from_str(&std::fs::read_to_string(&tj_path).expect("read")).expect("json");
    tj["decoder"]["decoders"]
        .as_array_mut()
        .expect("decoders")
        .pop();
    write(&tj_path, &tj.to_string());
    cases.push((
        "spm-nostrip".into(),
        nostrip,
        "spm",
        chats("spm")[..1].to_vec(),
    ));
    // Legacy special_tokens_map.json (read without added_tokens_decoder), a new named token, extra specials.
    let legacy = copy_kind(base, "spm", "spm-legacy");
    edit_config(&legacy, |c| {
        c.remove("added_tokens_decoder");
        c.remove("eos_token");
        c.insert("image_token".into(), json!("<image>"));
        c.insert("additional_special_tokens".into(), json!(["<tool>", "<s>"]));
    });
    write(
        &legacy.join("special_tokens_map.json"),
        r#"{"eos_token": {"content": "</s>", "lstrip": false, "normalized": false, "rstrip": false, "single_word": false}, "pad_token": "<unk>"}"#,
    );
    cases.push(("spm-legacy".into(), legacy, "spm", chats("spm")));
    for (name, _, kind, _) in &cases {
        let tok = Tokenizer::from_dir(&base.join(name)).expect("load");
        let want = if *kind == "unigram" { 0 } else { 9 };
        assert_eq!(
            byte_sequences(&tok, kind).len(),
            want,
            "{name}: byte tokens found for every byte"
        );
    }

    run_cases(&py, base, cases);
}

/// Builds each case's request with our tokenizer, asks the reference about all of them in one Python run,
/// then checks every answer.
fn run_cases(py: &Path, base: &Path, cases: Vec<(String, PathBuf, &str, Vec<Value>)>) {
    let cases: Vec<Case> = cases
        .into_iter()
        .enumerate()
        .map(|(i, (name, dir, kind, chats))| {
            let tok = Tokenizer::from_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
            let req = request(&tok, kind, chats, 42 + i as u64);
            Case { name, dir, req }
        })
        .collect();
    let requests: Vec<Value> = cases
        .iter()
        .map(|c| {
            let mut r = c.req.clone();
            r["dir"] = json!(c.dir);
            r
        })
        .collect();
    let script = repo_root().join("tests/oracle/tokenizer_reference.py");
    let out = run_python(
        py,
        &[script.to_str().expect("path"), base.to_str().expect("path")],
        &json!({"requests": requests}).to_string(),
    );
    let resp: Value = serde_json::from_str(&out).expect("reference output is JSON");
    let responses = resp["responses"].as_array().expect("responses");
    assert_eq!(responses.len(), cases.len());
    for (case, resp) in cases.iter().zip(responses) {
        check(case, resp);
    }
}

/// Opt-in: renders every `*.jinja` of $MLX_GEN_TEMPLATE_DIR (e.g. real models' chat templates) with the
/// BPE test tokenizer, against mlx-lm. `MLX_GEN_TEMPLATE_DIR=dir cargo test -p tokenizer --test tokenizer --
/// --ignored templates_in_dir`.
#[test]
#[ignore = "needs MLX_GEN_TEMPLATE_DIR"]
fn templates_in_dir_match_mlx_lm() {
    let Some(src) = std::env::var_os("MLX_GEN_TEMPLATE_DIR").map(PathBuf::from) else {
        eprintln!("MLX_GEN_TEMPLATE_DIR is not set: nothing to compare");
        return;
    };
    let py = python();
    let tmp = TempDir::new("templates");
    let base = &tmp.0;
    make_tokenizer(&py, &base.join("bpe"), "bpe");
    edit_config(&base.join("bpe"), |c| {
        c.insert("bos_token".into(), json!("<|endoftext|>"));
    });
    let mut files: Vec<PathBuf> = std::fs::read_dir(&src)
        .expect("read MLX_GEN_TEMPLATE_DIR")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .jinja files in {}", src.display());
    let mut cases = Vec::new();
    for f in files {
        let name = f
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("file name")
            .to_string();
        let dir = copy_kind(base, "bpe", &name);
        std::fs::copy(&f, dir.join("chat_template.jinja")).expect("copy template");
        cases.push((name, dir, "bpe", real_chats()));
    }
    run_cases(&py, base, cases);
}

/// Opt-in: the whole comparison on real tokenizer folders (tokenizer.json and its config; models are not
/// needed). `MLX_GEN_TOKENIZER_DIRS=dir1:dir2 cargo test -p tokenizer --test tokenizer -- --ignored
/// tokenizer_dirs`.
#[test]
#[ignore = "needs MLX_GEN_TOKENIZER_DIRS"]
fn tokenizer_dirs_match_mlx_lm() {
    let Some(dirs) = std::env::var_os("MLX_GEN_TOKENIZER_DIRS") else {
        eprintln!("MLX_GEN_TOKENIZER_DIRS is not set: nothing to compare");
        return;
    };
    let py = python();
    let tmp = TempDir::new("dirs");
    let cases = std::env::split_paths(&dirs)
        .map(|dir| {
            let tok =
                Tokenizer::from_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            let kind = match tok.detokenizer_kind() {
                DetokenizerKind::Bpe => "bpe",
                DetokenizerKind::Spm { .. } => "spm",
                DetokenizerKind::Naive => "unigram",
            };
            (
                dir.display().to_string(),
                dir,
                kind,
                [chats(kind), real_chats()].concat(),
            )
        })
        .collect();
    run_cases(&py, &tmp.0, cases);
}

