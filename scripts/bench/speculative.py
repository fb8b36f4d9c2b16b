#!/usr/bin/env python3
"""Speculative decoding benchmark: mlx-gen plain / draft model (fixed and adaptive K) / prompt lookup, against mlx-lm plain / draft model.

Usage: speculative.py --mlx-gen PATH --model TARGET --draft DRAFT [--num-draft 2,3,4] [--prompt-lookup 3]
                      [-g 256] [--rounds 3] [--device gpu] [--prompt-file F] [--out results.json]
       speculative.py --dump-prompt      (the code-editing prompt, e.g. for `mlx-gen bench --prompt-file`)
TARGET and DRAFT share a vocabulary (e.g. Qwen2.5-Coder-0.5B-Instruct bf16 or 8-bit, and the same
model at 4 bits). Every run is greedy (--temp 0) on a code-editing prompt (or --prompt-file), with
the chat template; each configuration runs --rounds times (alternating mlx-gen and mlx-lm) after a
warm-up, and the median decode tok/s is reported with the acceptance rate (accepted / proposed draft
tokens; for mlx-lm, drafted tokens / (rounds x K) as counted from its from_draft flags) and the
speed-up over plain decoding of the same engine. Also checks that every greedy run of an engine
gives the same tokens as its plain run. Run it with a Python that has mlx and mlx-lm.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

PROMPT = """Rename the function `area` to `rectangle_area` everywhere in this file, add type hints, and return the whole file:

```python
import math


def area(width, height):
    \"\"\"The area of a width x height rectangle.\"\"\"
    return width * height


def total_area(rectangles):
    total = 0
    for width, height in rectangles:
        total += area(width, height)
    return total


def largest(rectangles):
    best = None
    best_area = -1
    for width, height in rectangles:
        a = area(width, height)
        if a > best_area:
            best, best_area = (width, height), a
    return best


def circle_area(radius):
    return math.pi * radius * radius


if __name__ == "__main__":
    shapes = [(3, 4), (5, 6), (2, 9)]
    print(total_area(shapes))
    print(largest(shapes))
    print(area(7, 8), circle_area(2.0))
```"""


def mlx_lm_worker(args):
    """One mlx-lm run in this process: prints {tokens, generation_tps, from_draft, rounds_k}."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler

    if args.device == "cpu":
        mx.set_default_device(mx.cpu)
    model, tok = load(args.model)
    draft = load(args.draft)[0] if args.worker_k > 0 else None
    prompt = tok.apply_chat_template([{"role": "user", "content": args.prompt_text}], tokenize=False,
                                     add_generation_prompt=True)
    ids = tok.encode(prompt, add_special_tokens=False)
    kw = {"draft_model": draft, "num_draft_tokens": args.worker_k} if draft is not None else {}
    out = None
    for _ in range(2):  # warm-up, then the measured run
        tokens, drafted = [], 0
        for r in stream_generate(model, tok, ids, max_tokens=args.g, sampler=make_sampler(0.0), **kw):
            tokens.append(int(r.token))
            drafted += bool(r.from_draft)
            last = r
        out = {"tokens": tokens, "generation_tps": last.generation_tps, "drafted": drafted}
    print(json.dumps(out))


def run_json(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlx-gen")
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--num-draft", default="2,3,4")
    ap.add_argument("--prompt-lookup", type=int, default=3)
    ap.add_argument("--lookup-k", type=int, default=8, help="draft tokens per prompt-lookup round")
    ap.add_argument("-g", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--prompt-file")
    ap.add_argument("--out")
    ap.add_argument("--worker-k", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--dump-prompt", action="store_true", help="print the code-editing prompt and exit")
    if "--dump-prompt" in sys.argv:
        return print(PROMPT)
    args = ap.parse_args()
    args.prompt_text = open(args.prompt_file).read() if args.prompt_file else PROMPT
    if args.worker_k >= 0:
        return mlx_lm_worker(args)
    if not args.mlx_gen:
        sys.exit("--mlx-gen PATH is required")

    ks = [int(k) for k in args.num_draft.split(",")]
    ours_cfgs = [("plain", [])]
    ours_cfgs += [(f"draft K={k}", ["--draft-model", args.draft, "--num-draft-tokens", str(k)]) for k in ks]
    ours_cfgs += [(f"draft adaptive K0={ks[0]}", ["--draft-model", args.draft, "--num-draft-tokens", str(ks[0]),
                                                   "--adaptive-draft"])]
    ours_cfgs += [(f"prompt lookup {args.prompt_lookup} K={args.lookup_k}",
                   ["--prompt-lookup", str(args.prompt_lookup), "--num-draft-tokens", str(args.lookup_k)])]
    ours_cfgs += [(f"prompt lookup {args.prompt_lookup} adaptive",
                   ["--prompt-lookup", str(args.prompt_lookup), "--num-draft-tokens", str(args.lookup_k), "--adaptive-draft"])]
    theirs_cfgs = [("plain", 0)] + [(f"draft K={k}", k) for k in ks]

    base = [args.mlx_gen, "--device", args.device, "generate", "--model", args.model, "--prompt", "-",
            "--max-tokens", str(args.g), "--temp", "0", "--output", "json"]
    worker = [sys.executable, __file__, "--model", args.model, "--draft", args.draft, "-g", str(args.g),
              "--device", args.device] + (["--prompt-file", args.prompt_file] if args.prompt_file else [])

    def ours(flags):
        out = subprocess.run(base + flags, input=args.prompt_text, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"failed: mlx-gen {' '.join(flags)}\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    results = {"mlx-gen": {}, "mlx-lm": {}}
    ours(ours_cfgs[1][1])  # warm-up (loads, kernels)
    for rnd in range(args.rounds):
        # Each run as it ends (flushed), so that a run cut off by a time limit still shows what it measured.
        for name, flags in ours_cfgs:
            r = ours(flags)
            results["mlx-gen"].setdefault(name, []).append(r)
            print(f"round {rnd + 1} mlx-gen {name}: {r['generation_tps']:.1f} tok/s", flush=True)
        for name, k in theirs_cfgs:
            r = run_json(worker + ["--worker-k", str(k)])
            results["mlx-lm"].setdefault(name, []).append(r)
            print(f"round {rnd + 1} mlx-lm {name}: {r['generation_tps']:.1f} tok/s", flush=True)

    rows = []
    for engine, cfgs in results.items():
        plain = cfgs["plain"]
        plain_tps = statistics.median(r["generation_tps"] for r in plain)
        for name, runs in cfgs.items():
            tps = statistics.median(r["generation_tps"] for r in runs)
            same = all(r["tokens"] == plain[0]["tokens"] for r in runs)
            if engine == "mlx-gen" and "draft_tokens_proposed" in runs[0]:
                prop, acc = runs[0]["draft_tokens_proposed"], runs[0]["draft_tokens_accepted"]
                rate = acc / prop if prop else 0.0
            elif engine == "mlx-lm" and name != "plain":
                k = int(name.split("=")[1])
                n, d = len(runs[0]["tokens"]), runs[0]["drafted"]
                rate = d / (k * (n - d) or 1)  # one verify pass per non-drafted token, K proposals each
            else:
                rate = None
            rows.append({"engine": engine, "config": name, "decode_tps": tps, "speedup": tps / plain_tps,
                         "acceptance": rate, "tokens": len(runs[0]["tokens"]), "same_tokens_as_plain": same})

    print(f"{'engine':8} {'config':32} {'decode tok/s':>12} {'x plain':>8} {'accept':>7} {'tokens':>6} same")
    for r in rows:
        acc = f"{100 * r['acceptance']:.1f}%" if r["acceptance"] is not None else "-"
        print(f"{r['engine']:8} {r['config']:32} {r['decode_tps']:12.1f} {r['speedup']:8.2f} {acc:>7} {r['tokens']:6d} "
              f"{'yes' if r['same_tokens_as_plain'] else 'NO'}")
    ours_best = max((r for r in rows if r["engine"] == "mlx-gen" and r["config"].startswith("draft K")),
                    key=lambda r: r["decode_tps"])
    theirs_best = max((r for r in rows if r["engine"] == "mlx-lm" and r["config"] != "plain"),
                      key=lambda r: r["decode_tps"])
    print(f"best draft-model decode: mlx-gen {ours_best['decode_tps']:.1f} ({ours_best['config']}), "
          f"mlx-lm {theirs_best['decode_tps']:.1f} ({theirs_best['config']}): "
          f"{ours_best['decode_tps'] / theirs_best['decode_tps']:.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"time": time.time(), "args": {k: v for k, v in vars(args).items() if k != "prompt_text"},
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
