#!/usr/bin/env python3
"""mlx_lm.benchmark's measurement, printed as one JSON object with mlx-gen bench's keys.

Usage: mlx_lm_bench.py --model DIR -p 512 -g 256 -n 3 [--pacing]
Same steps as mlx_lm/benchmark.py (seed 0, random prompt, EOS ignored, one warm-up, stream_generate),
plus the load time, time to first token, and with --pacing every inter-token interval of one trial.
"""
import argparse
import json
import statistics
import time

t_start = time.perf_counter()
import mlx.core as mx  # noqa: E402
from mlx_lm import load, stream_generate  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("-p", "--prompt-tokens", type=int, default=512)
    ap.add_argument("-g", "--generation-tokens", type=int, default=1024)
    ap.add_argument("-n", "--num-trials", type=int, default=5)
    ap.add_argument("--prefill-step-size", type=int, default=2048)
    ap.add_argument("--pacing", action="store_true")
    args = ap.parse_args()

    mx.random.seed(0)
    tic = time.perf_counter()
    model, tokenizer, config = load(args.model, return_config=True)
    load_s = time.perf_counter() - tic
    tokenizer._eos_token_ids = {}
    prompt = mx.random.randint(0, config["vocab_size"], (1, args.prompt_tokens)).tolist()[0]

    def trial(record=False):
        marks = []
        t0 = time.perf_counter()
        for r in stream_generate(model, tokenizer, prompt, max_tokens=args.generation_tokens,
                                 prefill_step_size=args.prefill_step_size):
            marks.append(time.perf_counter())
        end = time.perf_counter()
        first = marks[0]
        out = {
            "ttft_s": first - t0,
            "prompt_tps": r.prompt_tps,
            "generation_tps": r.generation_tps,
            "peak_memory_gb": r.peak_memory,
            "total_s": end - t0,
        }
        if record:
            out["intervals_ms"] = [(b - a) * 1000 for a, b in zip(marks, marks[1:])]
        return out

    first_token_wall = None
    warm = trial()
    first_token_wall = t_start  # process start; start_to_first_token uses the warm-up's ttft
    trials = [trial() for _ in range(args.num_trials)]
    keys = ["ttft_s", "prompt_tps", "generation_tps", "peak_memory_gb", "total_s"]
    median = {k: statistics.median(t[k] for t in trials) for k in keys}
    report = {"tool": "mlx-lm", "load_s": load_s, "trials": trials, "median": median,
              "start_to_first_token_s": load_s + warm["ttft_s"] + (tic - first_token_wall)}
    if args.pacing:
        ms = sorted(trial(record=True)["intervals_ms"])
        at = lambda q: ms[round((len(ms) - 1) * q)] if ms else 0.0  # noqa: E731
        report["pacing"] = {"tokens": len(ms) + 1, "p50_ms": at(0.5), "p99_ms": at(0.99),
                            "max_ms": ms[-1] if ms else 0.0}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
