#!/usr/bin/env python3
"""Greedy tokens of Python mlx-lm for a model folder, ignoring EOS, for the GGUF import tests.

gguf_mlx_lm.py MODEL_DIR PROMPT N

Loads the folder with `mlx_lm.load`, encodes PROMPT with `tokenizer.encode` (no chat template) and
prints {"prompt_ids": [...], "tokens": [...]}: N tokens of `generate_step` at temperature 0.
"""

import json
import sys


def main():
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model_dir, prompt, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    model, tokenizer = load(model_dir)
    ids = tokenizer.encode(prompt)
    tokens = []
    for token, _ in generate_step(mx.array(ids), model, max_tokens=n):
        tokens.append(int(token))
    json.dump({"prompt_ids": ids, "tokens": tokens}, sys.stdout)


if __name__ == "__main__":
    main()
