#!/usr/bin/env python3
"""Side-by-side benchmark of mlx-gen and Python mlx-lm on the same machine, same MLX, same models.

Usage: side_by_side.py --mlx-gen PATH --models DIR [--shapes smollm2-135m,qwen3-0.6b,...]
                       [-p 512] [-g 256] [-n 3] [--rounds 2] [--bits 4] [--out results.json]
For each shape it makes (once) a random-weight model folder under DIR with make_shape.py, then runs
`mlx-gen bench --json` and mlx_lm_bench.py alternately (--rounds times each), and prints one table:
TTFT, prefill and decode tok/s, peak memory, load time, ratios, and decode / bandwidth limit.
Run it with a Python that has mlx and mlx-lm (the test venv here, the wheel site on the H200).
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BANDWIDTH = {"cpu": None, "gpu": 4.8e12}  # bytes/s: H200 HBM3e


def run_json(cmd, env=None):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlx-gen", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--shapes", default="smollm2-135m,qwen3-0.6b,llama-3.2-3b,qwen2.5-7b")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-g", type=int, default=256)
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--pacing-tokens", type=int, default=0,
                    help="also time every inter-token interval of a decode this long (prompt 128)")
    ap.add_argument("--mlx-gen-env", default="",
                    help="K=V[,K=V...]: environment for the mlx-gen runs only (e.g. MLX tuning it sets itself)")
    ap.add_argument("--out")
    args = ap.parse_args()
    import os
    ours_env = dict(os.environ)
    for kv in filter(None, args.mlx_gen_env.split(",")):
        k, v = kv.split("=", 1)
        ours_env[k] = v

    rows = []
    for shape in args.shapes.split(","):
        d = Path(args.models) / f"{shape}-{args.bits}bit-{args.dtype}"
        if not (d / "config.json").exists():
            subprocess.run([sys.executable, str(HERE / "make_shape.py"), shape, str(d), "--bits", str(args.bits),
                            "--dtype", args.dtype], check=True, stdout=subprocess.DEVNULL)
        weight_bytes = sum(f.stat().st_size for f in d.glob("*.safetensors"))
        common = ["-p", str(args.p), "-g", str(args.g), "-n", str(args.n)]
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(run_json([args.mlx_gen, "--device", args.device, "bench", "--model", str(d), "--json"] + common, ours_env))
            theirs.append(run_json([sys.executable, str(HERE / "mlx_lm_bench.py"), "--model", str(d)] + common))
        row = {"shape": shape, "weight_gb": weight_bytes / 1e9}
        for name, reps in (("mlx-gen", ours), ("mlx-lm", theirs)):
            trials = [t for r in reps for t in r["trials"]]
            row[name] = {k: statistics.median(t[k] for t in trials)
                         for k in ("ttft_s", "prompt_tps", "generation_tps", "peak_memory_gb")}
            row[name]["load_s"] = statistics.median(r["load_s"] for r in reps)
        if args.pacing_tokens:
            pace = ["-p", "128", "-g", str(args.pacing_tokens), "-n", "1", "--pacing"]
            row["mlx-gen"]["pacing"] = run_json(
                [args.mlx_gen, "--device", args.device, "bench", "--model", str(d), "--json"] + pace, ours_env)["pacing"]
            row["mlx-lm"]["pacing"] = run_json(
                [sys.executable, str(HERE / "mlx_lm_bench.py"), "--model", str(d)] + pace)["pacing"]
        bw = BANDWIDTH.get(args.device)
        row["decode_limit_tps"] = bw / weight_bytes if bw else None
        rows.append(row)
        print(json.dumps(row), flush=True)

    print()
    print(f"prompt {args.p}, generate {args.g}, {args.bits}-bit {args.dtype}, medians of {args.rounds}x{args.n} trials")
    print("| shape | tool | TTFT ms | prefill tok/s | decode tok/s | peak GB | load s | decode vs mlx-lm | decode / limit |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        for name in ("mlx-gen", "mlx-lm"):
            m = r[name]
            ratio = m["generation_tps"] / r["mlx-lm"]["generation_tps"]
            lim = f"{100 * m['generation_tps'] / r['decode_limit_tps']:.1f}%" if r["decode_limit_tps"] else "-"
            print(f"| {r['shape']} | {name} | {1000 * m['ttft_s']:.1f} | {m['prompt_tps']:.0f} | "
                  f"{m['generation_tps']:.1f} | {m['peak_memory_gb']:.3f} | {m['load_s']:.2f} | {ratio:.2f}x | {lim} |")
    if args.pacing_tokens:
        print()
        print(f"token pacing over {args.pacing_tokens} tokens (prompt 128): inter-token ms")
        print("| shape | tool | p50 | p99 | max | p99/p50 | max/p50 |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            for name in ("mlx-gen", "mlx-lm"):
                p = r[name]["pacing"]
                print(f"| {r['shape']} | {name} | {p['p50_ms']:.2f} | {p['p99_ms']:.2f} | {p['max_ms']:.1f} | "
                      f"{p['p99_ms'] / p['p50_ms']:.2f} | {p['max_ms'] / p['p50_ms']:.1f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
