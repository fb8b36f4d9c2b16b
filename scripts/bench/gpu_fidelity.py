#!/usr/bin/env python3
"""Do mlx-gen's GPU tokens equal mlx-lm's? Greedy decoding of the same prompts, same folder, same device.

For each model folder and prompt: mlx-gen with its GPU defaults (fused projections), mlx-gen with
MLX_GEN_NO_FUSE=1 (mlx-lm's graph), and mlx-lm's own generate_step (argmax). Prints one JSON line per
case: how many leading tokens agree, the largest difference of the chosen tokens' log-probabilities
over the agreeing positions, and where they part, the gap between mlx-lm's two best log-probabilities
at that position. A split is a near-tie when that gap is at most one bfloat16 step at the top value's
magnitude (the two candidates are equal or adjacent bf16 numbers: any change of summation order may
pick either); anything else is a failure, and the script exits 1.

Usage: gpu_fidelity.py --mlx-gen ./mlx-gen DIR [DIR ...] [-m 256]
"""
import math
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
            "--ignore-chat-template", "--output", "json", "--logprobs"]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    return d["tokens"], d["logprobs"], d["prompt_tokens"]


def bf16_step(x):
    """The distance from |x| to the next bfloat16 number (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x != 0 else 2.0 ** -133


def theirs(model, tokenizer, prompt, max_tokens):
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    ids = tokenizer.encode(prompt)
    toks, gaps, chosen = [], [], []
    for tok, logprobs in generate_step(mx.array(ids), model, max_tokens=max_tokens):
        if int(tok) in tokenizer.eos_token_ids:
            break  # as stream_generate ends (mlx-gen leaves the EOS token out too)
        lp = logprobs.astype(mx.float32)
        top2 = mx.sort(lp)[-2:].tolist()
        toks.append(int(tok))
        chosen.append(lp[int(tok)].item())
        gaps.append((top2[1] - top2[0], bf16_step(top2[1])))
    return toks, gaps, chosen, len(ids)


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

    failed = 0
    for d in args.models:
        model, tokenizer = load(d)
        for p in PROMPTS:
            ref, gaps, ref_lp, n_prompt = theirs(model, tokenizer, p, args.max_tokens)
            row = {"model": os.path.basename(d.rstrip("/")), "prompt": p[:24], "tokens": len(ref)}
            for name, fuse in (("fused", True), ("unfused", False)):
                toks, lps, ours_prompt = ours(args.mlx_gen, d, p, args.max_tokens, fuse)
                n = agree(toks, ref)
                diff = max((abs(a - b) for a, b in zip(lps[:n], ref_lp[:n])), default=0.0)
                r = {"agree": n, "all": toks == ref, "prompt_tokens_equal": ours_prompt == n_prompt,
                     "max_logprob_diff": round(diff, 6)}
                if n < min(len(toks), len(ref)):
                    gap, step = gaps[n]
                    r.update(mlx_lm_top2_gap_at_split=round(gap, 5), bf16_step=step, near_tie=gap <= step)
                elif len(toks) != len(ref):
                    r["near_tie"] = False  # one stopped at an EOS the other did not pick
                ok = ours_prompt == n_prompt and (toks == ref or r.get("near_tie", False))
                r["ok"] = ok
                failed += not ok
                row[name] = r
            print(json.dumps(row), flush=True)
        del model
    print(json.dumps({"cases": 2 * len(PROMPTS) * len(args.models), "failed": failed}), flush=True)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
