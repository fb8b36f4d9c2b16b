#!/usr/bin/env python3
"""Reference token ids of transformers' own GGUF tokenizer conversion, for the GGUF import tests.

gguf_tokenize.py GGUF_PATH OUT_JSON [N_LINES]

Builds a deterministic, varied corpus (English, code, Chinese, emoji, numbers, whitespace runs,
special-token text; at least 2,000 entries) and writes {"lines": [...], "ids": [[...], ...]} where
ids are `AutoTokenizer.from_pretrained(dir, gguf_file=...)(line)["input_ids"]`.

transformers' GGUF path imports `torch` only for tensor dtypes it never uses when reading a
tokenizer; torch is not in the oracle venv, so a stand-in module is registered for that import.
"""

import json
import os
import random
import sys
import types

WORDS = (
    "the of and to in is you that it he was for on are as with his they I at be this have from or one had "
    "by word but not what all were we when your can said there use an each which she do how their if will "
    "up other about out many then them these so some her would make like him into time has look two more "
    "write go see number no way could people my than first water been call who oil its now find long down "
    "day did get come made may part Paris France capital London Tokyo internationalization tokenizer"
).split()
CODE = [
    "def f(x):\n    return x * 2  # double",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "fn main() { println!(\"{}\", 1 + 2); }",
    "const x = await fetch(`/api/v1/items?id=${id}`);",
    "SELECT name, COUNT(*) FROM users WHERE age >= 21 GROUP BY name;",
    "if __name__ == '__main__':\n\tmain()",
    "<div class=\"row\"><span>&nbsp;</span></div>",
    "x = {'a': [1, 2, 3], \"b\": None}",
]
CHINESE = "我们今天去北京大学参观了图书馆和博物馆天气很好大家都非常高兴中文分词测试机器学习模型"
EMOJI = ["😀", "🚀", "👍🏽", "🇫🇷", "❤️", "👨‍👩‍👧‍👦", "🤖", "✨", "🎉"]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", " \n ", "\r\n", "    ", "\u3000", "\u00a0"]


def number(rng):
    kind = rng.randrange(5)
    if kind == 0:
        return str(rng.randrange(10 ** rng.randrange(1, 12)))
    if kind == 1:
        return f"{rng.uniform(-1e4, 1e4):.{rng.randrange(0, 6)}f}"
    if kind == 2:
        return f"{rng.randrange(1, 10**9):,}"
    if kind == 3:
        return f"{rng.randrange(1900, 2100)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    return f"{rng.uniform(0, 1):.3e}"


def line(rng):
    parts = []
    for _ in range(rng.randrange(1, 12)):
        k = rng.randrange(10)
        if k < 4:
            w = rng.choice(WORDS)
            parts.append(w.upper() if rng.random() < 0.1 else w.capitalize() if rng.random() < 0.2 else w)
        elif k == 4:
            parts.append(rng.choice(CODE))
        elif k == 5:
            i = rng.randrange(len(CHINESE) - 8)
            parts.append(CHINESE[i : i + rng.randrange(1, 8)])
        elif k == 6:
            parts.append("".join(rng.choice(EMOJI) for _ in range(rng.randrange(1, 4))))
        elif k == 7:
            parts.append(number(rng))
        elif k == 8:
            parts.append(rng.choice(["don't", "I'LL", "we're", "it's", "they've", "Ü̈ber", "naïve", "café", "—", "…", "!?", "..."]))
        else:
            parts.append(rng.choice(SPECIAL) if rng.random() < 0.3 else rng.choice(SPACES))
    out = ""
    for p in parts:
        out += p + (rng.choice(SPACES) if rng.random() < 0.25 else " ")
    return out.rstrip(" ") if rng.random() < 0.7 else out


def corpus(n):
    rng = random.Random(20250207)
    lines = [line(rng) for _ in range(n)]
    lines += ["", " ", "  leading", "trailing  ", "\n\n\n", "a" * 300, "1234567890" * 5, "Hello world"]
    return lines


def main():
    gguf_path, out = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    from transformers import AutoTokenizer

    sys.modules.setdefault("torch", _torch_stand_in())
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    gguf_utils.is_torch_available = lambda: True
    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(gguf_path)), gguf_file=os.path.basename(gguf_path))
    lines = corpus(n)
    ids = [tok(t)["input_ids"] for t in lines]
    with open(out, "w") as f:
        json.dump({"lines": lines, "ids": ids}, f, ensure_ascii=False)


def _torch_stand_in():
    class Anything:
        def __getattr__(self, name):
            return Anything()

        def __call__(self, *args, **kwargs):
            return args[0] if len(args) == 1 and callable(args[0]) else Anything()

        def __or__(self, other):
            return self

        __ror__ = __or__

        def __getitem__(self, key):
            return self

    class Module(types.ModuleType):
        def __getattr__(self, name):
            return Anything()

    return Module("torch")


if __name__ == "__main__":
    main()
