#!/usr/bin/env python3
"""Builds small, deterministic Hugging Face tokenizers for tests (test-only; run with the oracle venv).

Usage: make_tokenizer.py OUTDIR [--kind bpe|spm|unigram]

  bpe     : Qwen2-style byte-level BPE (NFC, Qwen split regex, ByteLevel decoder), ChatML template,
            specials <|endoftext|> <|im_start|> <|im_end|>, plain added tokens <think> </think>,
            eos <|im_end|>, bos null. mlx-lm streams it with BPEStreamingDetokenizer.
  spm     : Llama-2-style SentencePiece BPE (Prepend/Replace "\u2581" normalizer, <0xXX> byte fallback,
            Replace/ByteFallback/Fuse/Strip decoder), <unk> <s> </s>, add_bos_token, Mistral-style
            template. mlx-lm streams it with SPMStreamingDetokenizer.
  unigram : T5-style Metaspace Unigram with clean_up_tokenization_spaces. mlx-lm streams it with
            NaiveStreamingDetokenizer.

Importable: `from make_tokenizer import make_tokenizer; make_tokenizer(outdir, kind="bpe")`. The same
kind always produces the same bytes.
"""

import argparse
import json
import os

KINDS = ("bpe", "spm", "unigram")

_CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.",
    "Hello, world! How are you today? I'm fine, thanks. We'll see what they've done.",
    "Machine learning models generate text one token at a time, and they don't stop until told.",
    "In 1969, 3 astronauts flew 384,400 km to the Moon; the trip took about 76 hours.",
    "Prices: $12.50, 7%, 1/2 cup, 3.14159, 2024-06-01, 10:45 PM, +1 (555) 010-9999.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < 10; ++i) {\n\tprintf(\"%d\\n\", i);\n}\n",
    "fn main() {\n    let xs: Vec<u32> = (0..10).collect();\n    println!(\"{:?}\", xs);\n}\n",
    "import json\nwith open('data.json') as f:\n    data = json.load(f)\nprint(data['key'])\n",
    "<html><body><p class=\"note\">Hello &amp; welcome</p></body></html>",
    "SELECT name, COUNT(*) FROM users WHERE age >= 21 GROUP BY name ORDER BY 2 DESC;",
    "你好，世界！今天天气很好。我们一起去公园散步吧。",
    "机器学习是人工智能的一个分支。语言模型可以生成文本。",
    "中文、English 和 code 混合在一起：print(\"你好\")。",
    "Emoji time 😀😃😄 🚀 ✨ 👍🏽 ❤️ 🇺🇸 — done!",
    "Ünïcödé àccents: café, naïve, coöperate, São Paulo, Zürich, Ångström.",
    "Русский текст и ελληνικά γράμματα тоже бывают.",
    "   leading spaces, trailing spaces   \n\n\nmultiple newlines\r\nwindows line\ttabs\t\there",
    "a ,b . c ! d ? e 's f n't g 're h 've i 'm",
    "User: What is 2 + 2?\nAssistant: 2 + 2 = 4.\nUser: Thanks!\nAssistant: You're welcome.",
]

_RARE = (_CORPUS[12], _CORPUS[14], _CORPUS[16])


def corpus(skip_rare=False):
    """The fixed training corpus (repeated so that merges get frequent enough).

    With skip_rare, the emoji, Cyrillic/Greek and second Chinese lines are left out, so that their characters
    are missing from the vocab and must go through byte fallback.
    """
    lines = [line for line in _CORPUS if not (skip_rare and line in _RARE)]
    return [line for _ in range(8) for line in lines]


CHATML_TEMPLATE = (
    "{%- for message in messages %}\n"
    "    {%- if loop.first and message['role'] != 'system' %}\n"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'].strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'].strip() + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)

GEMMA_LIKE_TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(turns=0) %}
{%- for message in messages %}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}
    {%- set ns.turns = ns.turns + 1 %}
<start_of_turn>{{ role }}
{{ message['content'] | trim }}<end_of_turn>
{% endfor %}
{%- if add_generation_prompt %}
<start_of_turn>model
{% endif %}"""


def _write_json(path, obj):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2, sort_keys=False)
        f.write("\n")


def _added_decoder(tokenizer_json):
    out = {}
    for t in tokenizer_json["added_tokens"]:
        out[str(t["id"])] = {
            "content": t["content"],
            "lstrip": t["lstrip"],
            "normalized": t["normalized"],
            "rstrip": t["rstrip"],
            "single_word": t["single_word"],
            "special": t["special"],
        }
    return out


def _build_bpe():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors, trainers

    qwen_regex = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(qwen_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    tj = json.loads(tok.to_str())
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": _added_decoder(tj),
        "bos_token": None,
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    return tj, config


def _build_spm():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    byte_tokens = ["<0x%02X>" % b for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    trainer = trainers.BpeTrainer(
        vocab_size=620,
        min_frequency=2,
        show_progress=False,
        special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens,
    )
    tok.train_from_iterator(corpus(skip_rare=True), trainer=trainer)
    tj = json.loads(tok.to_str())
    tj["added_tokens"] = [t for t in tj["added_tokens"] if t["content"] not in byte_tokens]
    for t in tj["added_tokens"]:
        t["normalized"] = False
    tj["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        ],
    }
    tj["pre_tokenizer"] = None
    tj["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<s>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [
            {"SpecialToken": {"id": "<s>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": "<s>", "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }
    tj["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": _added_decoder(tj),
        "bos_token": "<s>",
        "chat_template": MISTRAL_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "legacy": False,
        "model_max_length": 4096,
        "pad_token": None,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
    }
    return tj, config


def _build_unigram():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=400,
        show_progress=False,
        special_tokens=["<pad>", "</s>", "<unk>"],
        unk_token="<unk>",
        max_piece_length=8,
        n_sub_iterations=2,
        shrinking_factor=0.75,
    )
    parallelism = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # Unigram's EM sums floats in parallel otherwise
    try:
        tok.train_from_iterator(corpus(skip_rare=True), trainer=trainer)
    finally:
        if parallelism is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = parallelism
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<start_of_turn>", "<end_of_turn>", "<bos>")]
    )
    tj = json.loads(tok.to_str())
    # The trainer breaks ties between equally frequent characters at random, so the scores are rounded and the
    # pieces after the 3 special ones sorted, which makes the file the same on every run.
    vocab = tj["model"]["vocab"]
    rest = sorted(((piece, round(score, 3)) for piece, score in vocab[3:]), key=lambda ps: (-ps[1], ps[0]))
    tj["model"]["vocab"] = [list(ps) for ps in vocab[:3]] + [list(ps) for ps in rest]
    config = {
        "added_tokens_decoder": _added_decoder(tj),
        "bos_token": "<bos>",
        "chat_template": GEMMA_LIKE_TEMPLATE,
        "clean_up_tokenization_spaces": True,
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
    }
    return tj, config


def make_tokenizer(outdir, kind="bpe"):
    """Writes tokenizer.json and tokenizer_config.json of the given kind into outdir (created if needed)."""
    builders = {"bpe": _build_bpe, "spm": _build_spm, "unigram": _build_unigram}
    if kind not in builders:
        raise ValueError(f"unknown tokenizer kind {kind!r}, expected one of {KINDS}")
    tokenizer_json, config = builders[kind]()
    os.makedirs(outdir, exist_ok=True)
    _write_json(os.path.join(outdir, "tokenizer.json"), tokenizer_json)
    _write_json(os.path.join(outdir, "tokenizer_config.json"), config)
    return outdir


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--kind", choices=KINDS, default="bpe")
    args = ap.parse_args()
    make_tokenizer(args.outdir, args.kind)


if __name__ == "__main__":
    main()
