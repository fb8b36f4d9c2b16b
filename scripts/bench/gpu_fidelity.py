#!/usr/bin/env python3
"""Do mlx-gen's GPU tokens equal mlx-lm's? Greedy decoding of the same prompts, same folder, same device.

For each model folder and prompt: mlx-gen with its GPU defaults (fused projections), mlx-gen with
MLX_GEN_NO_FUSE=1 (mlx-lm's graph), and mlx-lm's own generate_step (argmax). Prints one JSON line per
case: how many leading tokens agree, and where they part, the gap between mlx-lm's two best
log-probabilities at that position (a gap within bf16 rounding means a near-tie, not a wrong model).

Usage: gpu_fidelity.py --mlx-gen ./mlx-gen DIR [DIR ...] [-m 256]
"""
import argparse
import json
import os
import subprocess

PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "def fibonacci(n):",
    "The capital of France is",
]


def ours(binary, model, prompt, max_tokens, fuse):
    env = dict(os.environ)
    env.pop("MLX_GEN_FUSE", None)
    env.pop("MLX_GEN_NO_FUSE", None)
    env["MLX_GEN_FUSE" if fuse else "MLX_GEN_NO_FUSE"] = "1"
    args = [binary, "generate", "--model", model, "--prompt", prompt, "-m", str(max_tokens), "--temp", "0",
            "--ignore-chat-template", "--output", "json"]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    return d["tokens"], d["prompt_tokens"]


def theirs(model, tokenizer, prompt, max_tokens):
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    ids = tokenizer.encode(prompt)
    toks, gaps = [], []
    for tok, logprobs in generate_step(mx.array(ids), model, max_tokens=max_tokens):
        top2 = mx.sort(logprobs.astype(mx.float32))[-2:].tolist()
        toks.append(int(tok))
        gaps.append(top2[1] - top2[0])
    return toks, gaps, len(ids)


def agree(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlx-gen", required=True)
    ap.add_argument("models", nargs="+")
    ap.add_argument("-m", "--max-tokens", type=int, default=256)
    args = ap.parse_args()
    from mlx_lm import load

    for d in args.models:
        model, tokenizer = load(d)
        for p in PROMPTS:
            ref, gaps, n_prompt = theirs(model, tokenizer, p, args.max_tokens)
            row = {"model": os.path.basename(d.rstrip("/")), "prompt": p[:24], "tokens": len(ref)}
            for name, fuse in (("fused", True), ("unfused", False)):
                toks, ours_prompt = ours(args.mlx_gen, d, p, args.max_tokens, fuse)
                n = agree(toks, ref)
                row[name] = {"agree": n, "all": toks == ref, "prompt_tokens_equal": ours_prompt == n_prompt}
                if n < min(len(toks), len(ref)):
                    row[name]["mlx_lm_top2_gap_at_split"] = round(gaps[n], 5)
            print(json.dumps(row), flush=True)
        del model


if __name__ == "__main__":
    main()
