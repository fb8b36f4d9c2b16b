"""Asks a real model (Qwen2.5-Coder-0.5B-Instruct behind `mlx-gen serve`) for the weather, with the
official `openai` client (test-only): with `tool_choice` auto it must answer with a parsed
get_weather call for Paris, streamed and not alike; with `required` the call is constrained.

Input (JSON on stdin): {"base_url": "http://127.0.0.1:PORT/v1", "model": "<--model>"}
Output (JSON on stdout): {"checks": N, "failures": [...], "answer": {...}}.
"""

import json
import sys

import openai

SPEC = json.load(sys.stdin)
CLIENT = openai.OpenAI(base_url=SPEC["base_url"], api_key="unused", max_retries=0, timeout=600)
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}}, "required": ["city"]}}}]
MESSAGES = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
checks, failures = 0, []


def check(name, cond, what=""):
    global checks
    checks += 1
    if not cond:
        failures.append(f"{name}: {what}")


def streamed(**kw):
    calls, finish = {}, None
    for chunk in CLIENT.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                e = calls.setdefault(tc.index, ["", ""])
                e[0] += tc.function.name or ""
                e[1] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    return [tuple(calls[i]) for i in sorted(calls)], finish


answer = {}
# Sequential, so that each request after the first prefills only what the prefix cache lacks. The
# streamed form is compared for `auto` only (the tiny-model tests compare it for forced calls).
for choice, max_tokens, stream_too in [("auto", 20, True), ("required", 40, False)]:
    # One forced call (parallel_tool_calls false): the grammar then allows only the end of the answer.
    kw = dict(model=SPEC["model"], messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=max_tokens,
              parallel_tool_calls=choice == "auto")
    r = CLIENT.chat.completions.create(**kw)
    msg = r.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
    answer[choice] = {"content": msg.content, "calls": calls, "finish": r.choices[0].finish_reason}
    check(f"{choice}: a call", len(calls) >= 1, f"{msg}")
    if calls:
        name, args = calls[0]
        check(f"{choice}: get_weather", name == "get_weather", name)
        check(f"{choice}: Paris", json.loads(args).get("city", "").lower() == "paris", args)
    if choice == "required":
        check("required: the grammar ends the call", r.choices[0].finish_reason == "tool_calls", r.choices[0].finish_reason)
    if stream_too:
        scalls, finish = streamed(**kw)
        check(f"{choice}: streamed equals", scalls == calls and finish == r.choices[0].finish_reason, f"{scalls} {finish} vs {calls} {r.choices[0].finish_reason}")

print(json.dumps({"checks": checks, "failures": failures, "answer": answer}))
