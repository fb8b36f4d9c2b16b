"""Drives `mlx-gen serve`'s `/v1/messages` with the official `anthropic` client (test-only).

Input (JSON on stdin): {"base_url": "http://127.0.0.1:PORT", "model": "<--model>",
  "keyed_base_url": "http://...", "api_key": "KEY",       # the same model served with --api-key
  "openai_base_url": "http://127.0.0.1:PORT/v1"}           # for comparing with chat completions
The model's template has tools (Qwen2.5's). Checks: text answers equal OpenAI chat completions'
(greedy), stop_reason / stop_sequence / usage, streamed events equal the whole message, forced
tool use (`any`, named) validates against the input_schema, tool_result history, errors.
Output (JSON on stdout): {"checks": N, "failures": ["name: what", ...]}.
"""

import json
import sys
import traceback

import anthropic
import jsonschema
import openai

SPEC = json.load(sys.stdin)
MODEL = SPEC["model"]
CLIENT = anthropic.Anthropic(base_url=SPEC["base_url"], api_key="unused", max_retries=0, timeout=300)
OPENAI = openai.OpenAI(base_url=SPEC["openai_base_url"], api_key="unused", max_retries=0, timeout=300)

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


WEATHER = {"name": "get_weather", "description": "The weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}
ADD = {"name": "add", "input_schema": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": -9, "maximum": 9}, "b": {"type": "integer", "minimum": -9, "maximum": 9}},
    "required": ["a", "b"], "additionalProperties": False}}
SCHEMAS = {"get_weather": WEATHER["input_schema"], "add": ADD["input_schema"]}


def streamed(**kw):
    """The message a stream builds, and the event types in order."""
    with CLIENT.messages.stream(**kw) as s:
        kinds = [e.type for e in s]
        return s.get_final_message(), kinds


@case
def text_matches_chat_completions():
    for sys_prompt in [None, "Be brief."]:
        kw = dict(model=MODEL, max_tokens=24, messages=[{"role": "user", "content": "Tell me a story"}])
        if sys_prompt:
            kw["system"] = sys_prompt
        m = CLIENT.messages.create(**kw)
        msgs = ([{"role": "system", "content": sys_prompt}] if sys_prompt else []) + kw["messages"]
        o = OPENAI.chat.completions.create(model=MODEL, max_tokens=24, messages=msgs)
        text = "".join(b.text for b in m.content if b.type == "text")
        check(f"text equals chat ({sys_prompt})", text == o.choices[0].message.content, f"{text!r} vs {o.choices[0].message.content!r}")
        want = {"length": "max_tokens", "stop": "end_turn"}[o.choices[0].finish_reason]
        check(f"stop_reason ({sys_prompt})", m.stop_reason == want, f"{m.stop_reason} vs {want}")
        check(f"usage ({sys_prompt})", m.usage.output_tokens == o.usage.completion_tokens and m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == o.usage.prompt_tokens, f"{m.usage} vs {o.usage}")
        check(f"ids ({sys_prompt})", m.id.startswith("msg_") and m.type == "message" and m.role == "assistant", m.id)
        s, kinds = streamed(**kw)
        stext = "".join(b.text for b in s.content if b.type == "text")
        check(f"streamed text ({sys_prompt})", stext == text and s.stop_reason == m.stop_reason and s.usage.output_tokens == m.usage.output_tokens, f"{stext!r} {s.stop_reason} {s.usage}")
        check(f"event order ({sys_prompt})", kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds and "content_block_start" in kinds, f"{kinds}")


@case
def stop_sequences():
    base = CLIENT.messages.create(model=MODEL, max_tokens=30, messages=[{"role": "user", "content": "count"}])
    text = "".join(b.text for b in base.content if b.type == "text")
    if len(text) < 6:
        check("stop sequence: long enough answer", False, repr(text))
        return
    stop = text[3:6]
    m = CLIENT.messages.create(model=MODEL, max_tokens=30, messages=[{"role": "user", "content": "count"}], stop_sequences=[stop])
    got = "".join(b.text for b in m.content if b.type == "text")
    check("stop_sequence reason", m.stop_reason == "stop_sequence" and m.stop_sequence == stop, f"{m.stop_reason} {m.stop_sequence!r}")
    check("stop_sequence text", got == text[:text.find(stop)], f"{got!r}")


@case
def forced_tool_use():
    for choice in [{"type": "any"}, {"type": "tool", "name": "add"}]:
        for disable in [False, True]:
            for temp in [0.0, 1.0]:
                label = f"{choice['type']} disable_parallel={disable} temp={temp}"
                kw = dict(model=MODEL, max_tokens=200, tools=[WEATHER, ADD], tool_choice={**choice, "disable_parallel_tool_use": disable},
                          extra_body={"temperature": temp, "seed": 5}, messages=[{"role": "user", "content": "Use a tool"}])
                m = CLIENT.messages.create(**kw)
                uses = [b for b in m.content if b.type == "tool_use"]
                check(f"{label}: tool_use blocks", len(uses) >= 1 and (not disable or len(uses) == 1), f"{m.content}")
                check(f"{label}: stop_reason", m.stop_reason == "tool_use", m.stop_reason)
                for u in uses:
                    check(f"{label}: id", u.id.startswith("toolu_"), u.id)
                    try:
                        jsonschema.validate(u.input, SCHEMAS[u.name])
                        ok = choice["type"] == "any" or u.name == "add"
                    except Exception as e:
                        ok = False
                    check(f"{label}: input validates", ok, f"{u.name} {u.input}")
                if temp == 1.0:
                    # `seed` (mlx-gen's own field): the same sampled calls again.
                    again = CLIENT.messages.create(**kw)
                    check(f"{label}: seeded again", [(b.name, b.input) for b in again.content if b.type == "tool_use"] == [(u.name, u.input) for u in uses], f"{again.content}")
                if temp == 0.0:
                    s, _ = streamed(**kw)
                    suses = [(b.name, b.input) for b in s.content if b.type == "tool_use"]
                    check(f"{label}: streamed equals", suses == [(u.name, u.input) for u in uses] and s.stop_reason == "tool_use", f"{suses}")


@case
def structured_output():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"}}, "required": ["n", "ok"], "additionalProperties": False}
    for stream in [False, True]:
        kw = dict(model=MODEL, max_tokens=60, messages=[{"role": "user", "content": "json"}], output_config={"format": {"type": "json_schema", "schema": schema}})
        m = streamed(**kw)[0] if stream else CLIENT.messages.create(**kw)
        text = "".join(b.text for b in m.content if b.type == "text")
        try:
            jsonschema.validate(json.loads(text), schema)
            ok = True
        except Exception:
            ok = False
        check(f"output_config.format stream={stream}", ok and m.stop_reason == "end_turn", f"{text!r} {m.stop_reason}")


@case
def tool_results_in_history():
    m = CLIENT.messages.create(model=MODEL, max_tokens=5, tools=[ADD], messages=[
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Adding."}, {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"}]}])
    o = OPENAI.chat.completions.create(model=MODEL, max_tokens=5, tools=[{"type": "function", "function": {"name": "add", "parameters": ADD["input_schema"]}}], messages=[
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "Adding.", "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "5"}])
    check("tool_result prompt equals the OpenAI one", m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == o.usage.prompt_tokens, f"{m.usage} vs {o.usage}")


@case
def errors():
    def status_of(fn):
        try:
            fn()
        except anthropic.APIStatusError as e:
            return e.status_code, str(e)
        return None, ""
    for needle, kw in [
        ("max_tokens", dict(model=MODEL, max_tokens=0, messages=[{"role": "user", "content": "x"}])),
        ("tool_choice", dict(model=MODEL, max_tokens=5, tools=[ADD], tool_choice={"type": "tool", "name": "nope"}, messages=[{"role": "user", "content": "x"}])),
        ("messages[0].content[0]", dict(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])),
        ("tools[0].input_schema", dict(model=MODEL, max_tokens=5, tools=[{"name": "f", "input_schema": {"type": "nope"}}], messages=[{"role": "user", "content": "x"}])),
    ]:
        code, text = status_of(lambda: CLIENT.messages.create(**kw))
        check(f"400 names {needle}", code == 400 and needle in text, f"{code} {text}")
    code, _ = status_of(lambda: CLIENT.messages.create(model="other", max_tokens=5, messages=[{"role": "user", "content": "x"}]))
    check("unknown model is 404", code == 404, f"{code}")
    keyed = anthropic.Anthropic(base_url=SPEC["keyed_base_url"], api_key=SPEC["api_key"], max_retries=0, timeout=60)
    m = keyed.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x"}])
    check("x-api-key accepted", m.usage.output_tokens >= 1, f"{m}")
    wrong = anthropic.Anthropic(base_url=SPEC["keyed_base_url"], api_key="wrong", max_retries=0, timeout=60)
    code, _ = status_of(lambda: wrong.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "x"}]))
    check("a wrong key is 401", code == 401, f"{code}")


print(json.dumps({"checks": checks, "failures": failures}))
