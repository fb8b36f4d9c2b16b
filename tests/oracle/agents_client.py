"""Drives `mlx-gen serve` as agents do, with the official `openai` client and `jsonschema` (test-only).

Input (JSON on stdin):
  {"base_url": "http://127.0.0.1:PORT/v1",    # a tiny random model whose template has tools (Qwen2.5's)
   "plain_base_url": "http://.../v1",         # a tiny random model whose template has no tools
   "model": "<--model of the first>", "plain_model": "<--model of the second>",
   "model_dir": "<the first model's folder>"} # for transformers' apply_chat_template

Checks: the prompt with tools and tool messages has transformers' token count; forced tool calls
(`required`, named, parallel or not, greedy and sampled, streamed and not) parse and validate against
the tool's schema; 20 response_format schemas x streamed / not x greedy / temperature 1.0 + top-p,
sent 8 at a time (per-row masks in one batch), all parse and validate; errors name their field.
Output (JSON on stdout): {"checks": N, "failures": ["name: what", ...]}.
"""

import json
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
from transformers import AutoTokenizer

SPEC = json.load(sys.stdin)
CLIENT = openai.OpenAI(base_url=SPEC["base_url"], api_key="unused", max_retries=0, timeout=300)
PLAIN = openai.OpenAI(base_url=SPEC["plain_base_url"], api_key="unused", max_retries=0, timeout=300)
MODEL, PLAIN_MODEL = SPEC["model"], SPEC["plain_model"]

checks = 0
failures = []


def check(name, cond, what=""):
    global checks
    checks += 1
    if not cond:
        failures.append(f"{name}: {what}")


def case(fn):
    try:
        fn()
    except Exception:
        failures.append(f"{fn.__name__}: raised\n{traceback.format_exc()}")
    return fn


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": -100, "maximum": 100},
        "b": {"type": "integer", "minimum": -100, "maximum": 100}},
        "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def user(text):
    return [{"role": "user", "content": text}]


def collect_stream(**kw):
    """A streamed chat answer: (content, [(name, arguments)], finish_reason)."""
    content, calls, finish = "", {}, None
    for chunk in CLIENT.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            d = c.delta
            if d.content:
                content += d.content
            for tc in d.tool_calls or []:
                entry = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": None})
                if tc.id:
                    entry["id"] = tc.id
                if tc.function and tc.function.name:
                    entry["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    entry["arguments"] += tc.function.arguments
            if c.finish_reason:
                finish = c.finish_reason
    return content, [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)], finish, [calls[i]["id"] for i in sorted(calls)]


@case
def prompts_render_as_transformers():
    tok = AutoTokenizer.from_pretrained(SPEC["model_dir"])
    history = [
        {"role": "user", "content": "Weather in Oslo, and 2 + 3?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"celsius\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "5"},
    ]
    for name, messages, tools in [("tools", user("hi"), TOOLS), ("history", history, TOOLS), ("no tools", history, None)]:
        r = CLIENT.chat.completions.create(model=MODEL, messages=messages, tools=tools or openai.NOT_GIVEN, max_tokens=1)
        hf_messages = json.loads(json.dumps(messages))
        for m in hf_messages:
            for tc in m.get("tool_calls") or []:
                tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
            if m.get("content") is None:
                m["content"] = ""
        text = tok.apply_chat_template(hf_messages, tools=tools, add_generation_prompt=True, tokenize=False)
        ids = tok.encode(text, add_special_tokens=False)
        if tools:
            check(f"render {name}: tools shown", "<tools>" in text and "get_weather" in text, text[:200])
        check(f"render {name}", r.usage.prompt_tokens == len(ids), f"{r.usage.prompt_tokens} prompt tokens, transformers {len(ids)}")


def valid_call(name, args):
    try:
        jsonschema.validate(json.loads(args), SCHEMAS[name])
        return True
    except Exception:
        return False


@case
def forced_tool_calls():
    settings = [dict(temperature=0), dict(temperature=1.0, top_p=0.9, seed=7)]
    for choice in ["required", {"type": "function", "function": {"name": "add"}}]:
        for parallel in [False, True]:
            for s in settings:
                label = f"{choice if isinstance(choice, str) else 'named'} parallel={parallel} {s}"
                kw = dict(model=MODEL, messages=user("Use a tool."), tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel, max_tokens=200, **s)
                r = CLIENT.chat.completions.create(**kw)
                msg = r.choices[0].message
                calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
                check(f"{label}: calls", len(calls) >= 1 and (parallel or len(calls) == 1), f"{msg}")
                check(f"{label}: finish", r.choices[0].finish_reason == "tool_calls", r.choices[0].finish_reason)
                check(f"{label}: ids", all(c.id and c.type == "function" for c in msg.tool_calls or []), f"{msg.tool_calls}")
                for name, args in calls:
                    check(f"{label}: name", name in SCHEMAS and (choice == "required" or name == "add"), name)
                    check(f"{label}: arguments validate", name in SCHEMAS and valid_call(name, args), args)
                content, scalls, finish, ids = collect_stream(**kw)
                check(f"{label}: streamed equals non-streamed", scalls == calls and finish == "tool_calls", f"{scalls} vs {calls}, {finish}")
                check(f"{label}: streamed ids", all(i and i.startswith("call_") for i in ids), f"{ids}")


@case
def auto_and_none():
    r = CLIENT.chat.completions.create(model=MODEL, messages=user("hello"), tools=TOOLS, max_tokens=20)
    check("auto answers", r.choices[0].finish_reason in ("stop", "length", "tool_calls"), r.choices[0].finish_reason)
    r = CLIENT.chat.completions.create(model=MODEL, messages=user("hello"), tools=TOOLS, tool_choice="none", max_tokens=5)
    check("none: no calls", not r.choices[0].message.tool_calls and r.choices[0].finish_reason in ("stop", "length"), f"{r.choices[0]}")


FORMAT_SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"], "additionalProperties": False},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150}}, "required": ["age"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["ok", "n"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"], "additionalProperties": False},
    {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 4}}, "required": ["xs"], "additionalProperties": False},
    {"type": "object", "properties": {"m": {"type": "array", "items": {"type": "array", "items": {"enum": [0, 1]}, "maxItems": 3}, "maxItems": 3}}, "required": ["m"], "additionalProperties": False},
    {"type": "object", "properties": {"p": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5}, "y": {"type": "integer", "minimum": -5, "maximum": 5}}, "required": ["x", "y"], "additionalProperties": False}}, "required": ["p"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}, "b": {"type": "integer", "minimum": 0, "maximum": 3}}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, {"type": "boolean"}, {"type": "null"}]}}, "required": ["v"], "additionalProperties": False},
    {"type": "object", "properties": {"t": {"anyOf": [{"enum": ["x", "y"]}, {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}]}}, "required": ["t"], "additionalProperties": False},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["score"], "additionalProperties": False},
    {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90}, "lon": {"type": "number", "minimum": -180, "maximum": 180}}, "required": ["lat", "lon"], "additionalProperties": False},
    {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 3},
    {"type": "object", "properties": {"k": {"const": "fixed"}, "n": {"type": "integer", "minimum": 10, "maximum": 12}}, "required": ["k", "n"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}, "tag": {"enum": ["u", "v"]}}, "required": ["id", "tag"], "additionalProperties": False}, "maxItems": 2}}, "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"s": {"type": "string", "pattern": "^[a-z]{2,5}$"}}, "required": ["s"], "additionalProperties": False},
    {"type": "object", "properties": {"o": {"type": "integer", "minimum": 0, "maximum": 5}, "p": {"type": "boolean"}, "q": {"enum": [1, 2, 3]}}, "required": ["o"], "additionalProperties": False},
    {"type": "object", "properties": {"d": {"type": "string", "enum": ["2024-01-01", "2025-12-31"]}, "list": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2}}, "required": ["d", "list"], "additionalProperties": False},
    {"type": "object", "properties": {"level1": {"type": "object", "properties": {"level2": {"type": "object", "properties": {"z": {"type": "boolean"}}, "required": ["z"], "additionalProperties": False}}, "required": ["level2"], "additionalProperties": False}}, "required": ["level1"], "additionalProperties": False},
    {"anyOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["kind", "r"], "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["kind", "side"], "additionalProperties": False}]},
]


def one_format(job):
    i, schema, stream, s = job
    kw = dict(model=MODEL, messages=user(f"Answer in JSON ({i})."), max_tokens=200,
              response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}, **s)
    if stream:
        text, _, finish, _ = collect_stream(**kw)
    else:
        r = CLIENT.chat.completions.create(**kw)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    return i, stream, s, text, finish


@case
def response_format_schemas():
    settings = [dict(temperature=0), dict(temperature=1.0, top_p=0.9, seed=3)]
    jobs = [(i, schema, stream, s) for i, schema in enumerate(FORMAT_SCHEMAS) for stream in (False, True) for s in settings]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one_format, jobs))
    texts = {}
    for i, stream, s, text, finish in results:
        label = f"schema {i} stream={stream} {s}"
        try:
            jsonschema.validate(json.loads(text), FORMAT_SCHEMAS[i])
            ok, why = True, ""
        except Exception as e:
            ok, why = False, f"{type(e).__name__}: {e}"
        check(f"{label}: validates", ok, f"{text!r} ({finish}) {why}")
        check(f"{label}: finish", finish == "stop", finish)
        texts.setdefault((i, s.get("seed")), []).append(text)
    for key, both in texts.items():
        check(f"schema {key}: streamed equals non-streamed", len(set(both)) == 1, f"{both}")
    r = CLIENT.chat.completions.create(model=MODEL, messages=user("json"), max_tokens=200, response_format={"type": "json_object"})
    text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    # Free-form strings may not end within max_tokens on random weights: then only the start is checked.
    try:
        ok = isinstance(json.loads(text), dict) if finish == "stop" else text.startswith("{")
    except Exception:
        ok = False
    check("json_object", ok, f"{text!r} ({finish})")
    r = PLAIN.completions.create(model=PLAIN_MODEL, prompt="x", max_tokens=50, extra_body={"response_format": {"type": "json_schema", "json_schema": {"schema": FORMAT_SCHEMAS[3]}}})
    check("completions json_schema", json.loads(r.choices[0].text)["color"] in ("red", "green", "blue"), r.choices[0].text)


@case
def free_rows_beside_constrained_rows():
    """A free stream batched with constrained ones gets what it gets alone (per-row masks)."""
    free = dict(model=MODEL, messages=user("Tell me a story"), max_tokens=40, temperature=1.0, top_p=0.9, seed=11)
    alone = CLIENT.chat.completions.create(**free).choices[0].message.content
    jobs = [(i, FORMAT_SCHEMAS[i], False, dict(temperature=0)) for i in range(6)]
    with ThreadPoolExecutor(7) as pool:
        constrained = [pool.submit(one_format, j) for j in jobs]
        beside = pool.submit(lambda: CLIENT.chat.completions.create(**free).choices[0].message.content)
        texts = [c.result()[3] for c in constrained]
        got = beside.result()
    check("free row beside constrained rows", got == alone, f"{got!r} vs {alone!r}")
    for (i, schema, _, _), t in zip(jobs, texts):
        try:
            jsonschema.validate(json.loads(t), schema)
            ok = True
        except Exception:
            ok = False
        check(f"constrained row {i} beside a free row", ok, repr(t))


def error_param(fn):
    try:
        fn()
    except openai.BadRequestError as e:
        return e.response.json()["error"]["param"]
    return None


@case
def bad_input_names_the_field():
    def chat(client=CLIENT, model=MODEL, **kw):
        return lambda: client.chat.completions.create(model=model, max_tokens=4, **kw)
    cases = [
        ("response_format", chat(messages=user("x"), response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}})),
        ("response_format", chat(messages=user("x"), response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "string", "minLength": 5, "maxLength": 2}}, "required": ["a"]}, "strict": True}})),
        ("response_format", chat(messages=user("x"), response_format={"type": "xml"})),
        ("tool_choice", chat(messages=user("x"), tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})),
        ("tool_choice", chat(messages=user("x"), tools=TOOLS, tool_choice="sometimes")),
        ("tools[0].function.name", chat(messages=user("x"), tools=[{"type": "function", "function": {"name": "bad name!"}}])),
        ("tools[0].function.parameters", chat(messages=user("x"), tools=[{"type": "function", "function": {"name": "f", "parameters": [1]}}])),
        ("tools[0].function.parameters", chat(messages=user("x"), tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}])),
        ("messages[1].tool_call_id", chat(messages=user("x") + [{"role": "tool", "content": "5"}])),
        ("messages[1].tool_calls[0].function.arguments", chat(messages=user("x") + [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "add", "arguments": "{not json"}}]}])),
        ("messages[0].tool_calls", chat(messages=[{"role": "user", "content": "x", "tool_calls": []}])),
        ("tools", chat(client=PLAIN, model=PLAIN_MODEL, messages=user("x"), tools=TOOLS)),
    ]
    for param, fn in cases:
        got = error_param(fn)
        check(f"400 names {param}", got == param, f"got {got}")


print(json.dumps({"checks": checks, "failures": failures}))
