"""Drives a running `mlx-gen serve` with the official `openai` Python client (test-only).

Input (JSON on stdin):
  {"base_url": "http://127.0.0.1:PORT/v1",          # a server without an API key
   "keyed_base_url": "http://127.0.0.1:PORT2/v1",   # the same model served with --api-key
   "api_key": "KEY",
   "model": "<the --model string>",
   "mlx_gen": "<path of the mlx-gen binary>"}       # for `mlx-gen generate --output json`

Every check runs; the output (JSON on stdout) is {"checks": N, "failures": ["name: what", ...]}.
The Rust test crates/cli/tests/server_openai.rs asserts that no check failed.
"""

import json
import math
import subprocess
import sys
import traceback

import openai

SPEC = json.load(sys.stdin)
MODEL = SPEC["model"]
CLIENT = openai.OpenAI(base_url=SPEC["base_url"], api_key="unused", max_retries=0, timeout=120)

checks = 0
failures = []


def check(name, cond, what=""):
    global checks
    checks += 1
    if not cond:
        failures.append(f"{name}: {what}")


def close(a, b, tol=2e-3):
    return a is not None and b is not None and math.isfinite(a) and abs(a - b) <= tol


def generate(prompt, max_tokens, *flags, chat=True):
    """`mlx-gen generate --output json` with the same settings: the reference answer."""
    args = [SPEC["mlx_gen"], "generate", "--model", MODEL, "--prompt", prompt, "-m", str(max_tokens),
            "--output", "json", *[str(f) for f in flags]]
    if not chat:
        args.append("--ignore-chat-template")
    out = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {out.stderr}")
    return json.loads(out.stdout)


def user(text):
    return [{"role": "user", "content": text}]


def case(fn):
    """Runs one group of checks; an exception fails the group instead of the whole driver."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - every failure is reported with its traceback
        failures.append(f"{fn.__name__}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    return fn


def stream_chat(**kw):
    """A streamed chat: (content, chunks)."""
    chunks = list(CLIENT.chat.completions.create(model=MODEL, stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def stream_text(**kw):
    chunks = list(CLIENT.completions.create(model=MODEL, stream=True, **kw))
    text = "".join(c.choices[0].text or "" for c in chunks if c.choices)
    return text, chunks


@case
def models():
    ids = [m.id for m in CLIENT.models.list().data]
    check("models", ids == [MODEL], f"{ids}")


@case
def chat_greedy():
    want = generate("hello", 12)
    r = CLIENT.chat.completions.create(model=MODEL, messages=user("hello"), max_tokens=12)
    c = r.choices[0]
    check("chat_greedy.object", r.object == "chat.completion", r.object)
    check("chat_greedy.text", c.message.content == want["text"], f"{c.message.content!r} != {want['text']!r}")
    check("chat_greedy.role", c.message.role == "assistant", c.message.role)
    check("chat_greedy.finish", c.finish_reason == want["finish_reason"], c.finish_reason)
    check("chat_greedy.usage", (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens)
          == (want["prompt_tokens"], want["generation_tokens"], want["prompt_tokens"] + want["generation_tokens"]),
          f"{r.usage}")
    # max_completion_tokens (the newer name) means the same.
    r2 = CLIENT.chat.completions.create(model=MODEL, messages=user("hello"), max_completion_tokens=12)
    check("chat_greedy.max_completion_tokens", r2.choices[0].message.content == want["text"], r2.choices[0].message.content)
    # No `model` at all means the served one (through the raw client: the SDK requires it).
    raw = CLIENT.post("/chat/completions", body={"messages": user("hello"), "max_tokens": 12}, cast_to=object)
    check("chat_greedy.no_model", raw["choices"][0]["message"]["content"] == want["text"], f"{raw}")


@case
def chat_stream_usage():
    want = generate("hello", 12)
    text, chunks = stream_chat(messages=user("hello"), max_tokens=12, stream_options={"include_usage": True})
    check("chat_stream.text", text == want["text"], f"{text!r} != {want['text']!r}")
    check("chat_stream.object", all(c.object == "chat.completion.chunk" for c in chunks), "")
    check("chat_stream.id", len({c.id for c in chunks}) == 1, "one id for every chunk")
    check("chat_stream.role", chunks[0].choices[0].delta.role == "assistant", f"{chunks[0]}")
    last = chunks[-1]
    check("chat_stream.usage_chunk", last.choices == [] and last.usage is not None, f"{last}")
    if last.usage is not None:
        check("chat_stream.usage", (last.usage.prompt_tokens, last.usage.completion_tokens)
              == (want["prompt_tokens"], want["generation_tokens"]), f"{last.usage}")
    check("chat_stream.no_usage_before", all(c.usage is None for c in chunks[:-1]), "")
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check("chat_stream.finish", finishes == [want["finish_reason"]], f"{finishes}")
    # Without include_usage: no usage chunk, every chunk has its one choice.
    _, chunks = stream_chat(messages=user("hello"), max_tokens=12)
    check("chat_stream.no_usage", all(c.usage is None and len(c.choices) == 1 for c in chunks), "")


@case
def text_completions():
    want = generate("hello", 10, chat=False)
    r = CLIENT.completions.create(model=MODEL, prompt="hello", max_tokens=10)
    check("text.object", r.object == "text_completion", r.object)
    check("text.text", r.choices[0].text == want["text"], f"{r.choices[0].text!r} != {want['text']!r}")
    check("text.usage", (r.usage.prompt_tokens, r.usage.completion_tokens) == (want["prompt_tokens"], want["generation_tokens"]), f"{r.usage}")
    text, chunks = stream_text(prompt="hello", max_tokens=10, stream_options={"include_usage": True})
    check("text.stream", text == want["text"], f"{text!r}")
    check("text.stream_usage", chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == want["generation_tokens"], f"{chunks[-1]}")
    # A prompt of token ids (as the OpenAI API allows) is the same as its text.
    ids = CLIENT.completions.create(model=MODEL, prompt=[1, 2, 3, 4], max_tokens=4)
    check("text.token_prompt", ids.usage.prompt_tokens == 4 and ids.usage.completion_tokens <= 4, f"{ids.usage}")


@case
def logprobs():
    want = generate("hello", 6, "--logprobs", "--top-logprobs", 3)
    r = CLIENT.chat.completions.create(model=MODEL, messages=user("hello"), max_tokens=6, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    check("logprobs.chat.count", len(content) == want["generation_tokens"], f"{len(content)}")
    for i, (e, lp, top) in enumerate(zip(content, want["logprobs"], want["top_logprobs"])):
        check(f"logprobs.chat[{i}]", close(e.logprob, lp), f"{e.logprob} != {lp}")
        check(f"logprobs.chat[{i}].top", len(e.top_logprobs) == 3 and all(close(a.logprob, b[1]) for a, b in zip(e.top_logprobs, top)),
              f"{e.top_logprobs} vs {top}")
        check(f"logprobs.chat[{i}].bytes", e.bytes == list(e.token.encode()), f"{e}")
    # Streamed: the same entries, spread over the chunks.
    _, chunks = stream_chat(messages=user("hello"), max_tokens=6, logprobs=True, top_logprobs=3)
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    check("logprobs.chat_stream", [round(e.logprob, 4) for e in streamed] == [round(e.logprob, 4) for e in content],
          f"{[e.logprob for e in streamed]}")
    # Text completions: logprobs is the number of alternatives.
    want = generate("hello", 6, "--logprobs", "--top-logprobs", 2, chat=False)
    r = CLIENT.completions.create(model=MODEL, prompt="hello", max_tokens=6, logprobs=2)
    lp = r.choices[0].logprobs
    check("logprobs.text.count", len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == want["generation_tokens"], f"{lp}")
    check("logprobs.text.values", all(close(a, b) for a, b in zip(lp.token_logprobs, want["logprobs"])), f"{lp.token_logprobs} vs {want['logprobs']}")
    check("logprobs.text.top", all(len(t) <= 2 for t in lp.top_logprobs), f"{lp.top_logprobs}")
    check("logprobs.text.offsets", lp.text_offset[0] == 0 and all(a <= b for a, b in zip(lp.text_offset, lp.text_offset[1:])), f"{lp.text_offset}")


@case
def stop_strings():
    full = CLIENT.completions.create(model=MODEL, prompt="hello", max_tokens=16).choices[0].text
    chars = list(full)
    check("stop.long_enough", len(chars) >= 8, repr(full))
    for start, n in [(3, 2), (5, 3), (1, 1), (6, 1)]:
        stop = "".join(chars[start:start + n])
        expected = full[:full.find(stop)]
        r = CLIENT.completions.create(model=MODEL, prompt="hello", max_tokens=16, stop=[stop, "never-in-the-output"])
        check(f"stop[{stop!r}]", r.choices[0].text == expected and r.choices[0].finish_reason == "stop",
              f"{r.choices[0].text!r} ({r.choices[0].finish_reason}) != {expected!r} in {full!r}")
        text, chunks = stream_text(prompt="hello", max_tokens=16, stop=stop)
        check(f"stop[{stop!r}].stream", text == expected, f"{text!r} != {expected!r}")
        check(f"stop[{stop!r}].stream_finish", [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop", "")
    # Chat: a stop string in the middle of the greedy answer.
    want = generate("hello", 16)["text"]
    stop = want[4:6]
    r = CLIENT.chat.completions.create(model=MODEL, messages=user("hello"), max_tokens=16, stop=stop)
    check("stop.chat", r.choices[0].message.content == want[:want.find(stop)] and r.choices[0].finish_reason == "stop",
          f"{r.choices[0].message.content!r} vs {want!r} / {stop!r}")


@case
def seeds():
    flags = ("--temp", 0.9, "--top-p", 0.95, "--top-k", 40, "--seed", 7)
    want = generate("hello", 10, *flags)
    kw = dict(model=MODEL, messages=user("hello"), max_tokens=10, temperature=0.9, top_p=0.95, seed=7, extra_body={"top_k": 40})
    a = CLIENT.chat.completions.create(**kw)
    b = CLIENT.chat.completions.create(**kw)
    check("seed.equals_generate", a.choices[0].message.content == want["text"], f"{a.choices[0].message.content!r} != {want['text']!r}")
    check("seed.repeatable", a.choices[0].message.content == b.choices[0].message.content, "")
    text, _ = stream_chat(**{k: v for k, v in kw.items() if k != "model"})
    check("seed.stream", text == want["text"], f"{text!r}")
    # min_p and the penalties too, through extra_body / the SDK's own fields.
    flags = ("--temp", 1.2, "--min-p", 0.05, "--seed", 11, "--repetition-penalty", 1.3, "--presence-penalty", 0.5,
             "--frequency-penalty", 0.4, "--logit-bias", "5=3")
    want = generate("hello", 10, *flags)
    r = CLIENT.chat.completions.create(model=MODEL, messages=user("hello"), max_tokens=10, temperature=1.2, seed=11,
                                       presence_penalty=0.5, frequency_penalty=0.4, logit_bias={"5": 3},
                                       extra_body={"min_p": 0.05, "repetition_penalty": 1.3})
    check("seed.penalties", r.choices[0].message.content == want["text"], f"{r.choices[0].message.content!r} != {want['text']!r}")
    # Different seeds give different samples (over a few seeds at a high temperature).
    outs = {CLIENT.completions.create(model=MODEL, prompt="hello", max_tokens=12, temperature=1.5, seed=s).choices[0].text for s in range(4)}
    check("seed.differs", len(outs) > 1, f"{outs}")
    # Text completions, seeded, as generate --ignore-chat-template.
    want = generate("once", 8, "--temp", 0.7, "--seed", 3, chat=False)
    r = CLIENT.completions.create(model=MODEL, prompt="once", max_tokens=8, temperature=0.7, seed=3)
    check("seed.text", r.choices[0].text == want["text"], f"{r.choices[0].text!r} != {want['text']!r}")


@case
def n_choices():
    want = generate("hello", 8, "--temp", 0.9, "--seed", 5)
    kw = dict(model=MODEL, messages=user("hello"), max_tokens=8, temperature=0.9, seed=5, n=3)
    r = CLIENT.chat.completions.create(**kw)
    check("n.count", [c.index for c in r.choices] == [0, 1, 2], f"{[c.index for c in r.choices]}")
    check("n.first_is_generate", r.choices[0].message.content == want["text"], f"{r.choices[0].message.content!r} != {want['text']!r}")
    r2 = CLIENT.chat.completions.create(**kw)
    check("n.repeatable", [c.message.content for c in r.choices] == [c.message.content for c in r2.choices], "")
    check("n.usage", r.usage.completion_tokens == 24 or all(c.finish_reason == "stop" for c in r.choices), f"{r.usage}")
    # Streamed: every index gets its role, content and finish.
    chunks = list(CLIENT.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    texts = ["", "", ""]
    finishes = [None] * 3
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            finishes[ch.index] = ch.finish_reason or finishes[ch.index]
    check("n.stream", texts == [c.message.content for c in r.choices], f"{texts}")
    check("n.stream_finish", all(finishes), f"{finishes}")
    check("n.stream_usage", chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == r.usage.completion_tokens, f"{chunks[-1]}")
    # Greedy n=2: identical choices.
    r = CLIENT.completions.create(model=MODEL, prompt="hello", max_tokens=6, n=2)
    check("n.greedy", len(r.choices) == 2 and r.choices[0].text == r.choices[1].text, f"{r.choices}")


def expect_error(name, exc, status, call, param=None, code=None):
    try:
        call()
    except exc as e:
        check(f"{name}.status", e.status_code == status, f"{e.status_code}")
        body = e.body if isinstance(e.body, dict) else {}
        check(f"{name}.shape", isinstance(body.get("message"), str) and "type" in body and "param" in body and "code" in body, f"{e.body}")
        if param is not None:
            check(f"{name}.param", getattr(e, "param", None) == param, f"{getattr(e, 'param', None)} ({e})")
        if code is not None:
            check(f"{name}.code", getattr(e, "code", None) == code, f"{getattr(e, 'code', None)} ({e})")
        return
    except Exception as e:  # noqa: BLE001
        check(name, False, f"raised {type(e).__name__} instead of {exc.__name__}: {e}")
        return
    check(name, False, f"no error; wanted {exc.__name__}")


@case
def errors():
    chat = CLIENT.chat.completions.create
    m = user("hi")
    expect_error("unknown_model", openai.NotFoundError, 404, lambda: chat(model="no-such-model", messages=m), param="model", code="model_not_found")
    expect_error("unknown_model_text", openai.NotFoundError, 404, lambda: CLIENT.completions.create(model="gpt-4o", prompt="x"), param="model")
    for name, kw, param in [
        ("temperature", dict(temperature=-1), "temperature"),
        ("top_p", dict(top_p=1.5), "top_p"),
        ("max_tokens", dict(max_tokens=0), "max_tokens"),
        ("max_tokens_huge", dict(max_tokens=10**12), "max_tokens"),
        ("n", dict(n=0), "n"),
        ("presence_penalty", dict(presence_penalty=5), "presence_penalty"),
        ("top_logprobs", dict(logprobs=True, top_logprobs=99), "top_logprobs"),
        ("logit_bias", dict(logit_bias={"not-a-token": 1}), "logit_bias"),
        ("logit_bias_range", dict(logit_bias={"5": 500}), "logit_bias"),
        ("stop", dict(stop=[""]), "stop"),
        ("top_k", dict(extra_body={"top_k": -5}), "top_k"),
        ("min_p", dict(extra_body={"min_p": "lots"}), "min_p"),
        ("seed", dict(seed=-1), "seed"),
        ("empty_messages", dict(messages=[]), "messages"),
    ]:
        kw.setdefault("messages", m)
        expect_error(f"bad.{name}", openai.BadRequestError, 400, lambda kw=kw: chat(model=MODEL, **kw), param=param)
    # A prompt longer than the model's context (token ids: 4096 of them, the tiny models' context).
    expect_error("context", openai.BadRequestError, 400, lambda: CLIENT.completions.create(model=MODEL, prompt=[5] * 5000, max_tokens=2),
                 param="prompt", code="context_length_exceeded")
    # The key guards the keyed server: a wrong or missing key is a 401 AuthenticationError.
    keyed = SPEC["keyed_base_url"]
    wrong = openai.OpenAI(base_url=keyed, api_key="wrong", max_retries=0, timeout=60)
    expect_error("auth.wrong", openai.AuthenticationError, 401, lambda: wrong.chat.completions.create(model=MODEL, messages=m, max_tokens=2))
    expect_error("auth.models", openai.AuthenticationError, 401, lambda: wrong.models.list())
    expect_error("auth.stream", openai.AuthenticationError, 401, lambda: list(wrong.completions.create(model=MODEL, prompt="x", stream=True)))
    right = openai.OpenAI(base_url=keyed, api_key=SPEC["api_key"], max_retries=0, timeout=60)
    r = right.chat.completions.create(model=MODEL, messages=m, max_tokens=2)
    check("auth.right", r.usage.completion_tokens == 2, f"{r.usage}")
    check("auth.models_right", [x.id for x in right.models.list().data] == [MODEL], "")
    # The server serves after the errors.
    r = CLIENT.chat.completions.create(model=MODEL, messages=m, max_tokens=3)
    check("after_errors", r.usage.completion_tokens == 3, f"{r.usage}")


print(json.dumps({"checks": checks, "failures": failures}))
