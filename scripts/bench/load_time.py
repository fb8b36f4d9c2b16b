#!/usr/bin/env python3
"""Model load time and resident memory after load: mlx-gen against mlx-lm's load() on the same folders.

Usage: load_time.py --mlx-gen PATH --models DIR[,DIR...] [--rounds 5] [--out results.json]
Each round runs, alternating, one fresh `mlx-gen bench --json -p 1 -g 1 -n 1` process (its `load_s`:
config, tokenizer, weights, every parameter evaluated; and its VmRSS right after load) and one fresh
Python process that imports mlx_lm (not timed) and times `mlx_lm.load(DIR)` (config, weights with
every parameter evaluated, tokenizer), reading VmRSS after it. Page cache warm for both: every file
of the folder is read once first, and one untimed round of each tool runs before the timed ones.
Prints medians per folder: load seconds and the ratio, RSS after load against the weights' bytes,
and mlx-gen's tensors in place / copied and its RSS after its trial (weights touched by a forward).
Run it with the Python of the oracle venv (mlx-lm 0.32.2 on MLX 0.32.4).
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

MLX_LM_LOAD = r"""
import json, sys, time
import mlx.core as mx
from mlx_lm import load
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
before = rss()
t = time.perf_counter()
model, tokenizer = load(sys.argv[1])
load_s = time.perf_counter() - t
print(json.dumps({"load_s": load_s, "rss_before_load_bytes": before, "rss_after_load_bytes": rss()}))
"""


def run_json(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ours(mlx_gen, model):
    r = run_json([mlx_gen, "bench", "--model", model, "-p", "1", "-g", "1", "-n", "1", "--json"])
    return {"load_s": r["load_s"], **r["load"]}


def theirs(model):
    return run_json([sys.executable, "-c", MLX_LM_LOAD, model])


def warm_cache(model):
    for f in Path(model).iterdir():
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlx-gen", required=True)
    ap.add_argument("--models", required=True, help="comma-separated model folders")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    med = statistics.median
    results = []
    for model in args.models.split(","):
        warm_cache(model)
        ours(args.mlx_gen, model), theirs(model)  # untimed warm-up of each
        a, b = [], []
        for _ in range(args.rounds):
            a.append(ours(args.mlx_gen, model))
            b.append(theirs(model))
        weights = a[0]["weights_bytes"]
        r = {
            "model": model,
            "rounds": args.rounds,
            "weights_bytes": weights,
            "tensors_in_place": a[0]["tensors_in_place"],
            "tensors_copied": a[0]["tensors_copied"],
            "mlx_gen_load_s": med(x["load_s"] for x in a),
            "mlx_lm_load_s": med(x["load_s"] for x in b),
            "mlx_gen_rss_after_load_bytes": med(x["rss_after_load_bytes"] for x in a),
            "mlx_gen_rss_after_trial_bytes": med(x["rss_after_trials_bytes"] for x in a),
            "mlx_lm_rss_before_load_bytes": med(x["rss_before_load_bytes"] for x in b),
            "mlx_lm_rss_after_load_bytes": med(x["rss_after_load_bytes"] for x in b),
            "load_ratios": sorted(x["load_s"] / y["load_s"] for x, y in zip(a, b)),
        }
        r["load_ratio"] = r["mlx_gen_load_s"] / r["mlx_lm_load_s"]
        results.append(r)
    mb = lambda n: n / 1e6  # noqa: E731
    print("| folder | weights MB | in place / copied | load s mlx-gen / mlx-lm (ratio, spread) | RSS after load MB mlx-gen / mlx-lm (mlx-lm before load) | mlx-gen RSS after a trial MB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        lo, hi = r["load_ratios"][0], r["load_ratios"][-1]
        print(
            f"| {Path(r['model']).name} | {mb(r['weights_bytes']):.1f} | {r['tensors_in_place']} / {r['tensors_copied']} "
            f"| {r['mlx_gen_load_s']:.3f} / {r['mlx_lm_load_s']:.3f} ({r['load_ratio']:.2f}x, {lo:.2f}-{hi:.2f}) "
            f"| {mb(r['mlx_gen_rss_after_load_bytes']):.1f} / {mb(r['mlx_lm_rss_after_load_bytes']):.1f} ({mb(r['mlx_lm_rss_before_load_bytes']):.1f}) "
            f"| {mb(r['mlx_gen_rss_after_trial_bytes']):.1f} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
