#!/usr/bin/env python3
"""Cost of MLX's quantized matrix product by the number of rows it multiplies (the GPU's kernel choice).

Usage: qmm_rows.py [--rows 1,2,...] [--shapes 3072x3072,...] [--chain 200] [--repeats 5]

A batch decode step multiplies B rows (one position per sequence) and a speculative verification K+1 positions
by every weight; MLX's CUDA backend picks its kernel by the row count (a matrix-vector kernel for few rows, a
tiled product for more), and the second H200 lease saw 2-7 rows cost more than 8 (BENCHMARKS.md, 2026-12-03
second lease). This times a chain of `--chain` products, each fed the previous one's output (so the device runs
them one after another and the host queues them all before waiting), for each row count: microseconds per
product, the median of `--repeats` chains, after a warm-up chain. 4-bit, group 64, bfloat16, as the shapes'
folders. Also one row against the same rows padded to 8 with zeros and sliced back (the padding's own cost
included), which says whether a batch or a verification of 2-7 rows should be padded; and the rows as a batch
of one position each, (rows, 1, k), the shape a batch decode step multiplies (is it one product or one a row?).
"""
import argparse
import time

import mlx.core as mx


def chain_us(w, s, b, rows, k, chain, repeats, pad_to=0, lead=False):
    # lead: the rows as a batch of one position each, (rows, 1, k), as a batch decode step has them
    x0 = mx.random.normal((rows, 1, k) if lead else (rows, k)).astype(mx.bfloat16)
    mx.eval(x0)

    def run():
        x = x0
        for _ in range(chain):
            xin = mx.pad(x, [(0, pad_to - rows), (0, 0)]) if pad_to > rows else x
            y = mx.quantized_matmul(xin, w, s, b, transpose=True, group_size=64, bits=4)
            y = y[:rows] if pad_to > rows else y
            x = y * 0.01  # (rows, k): square weights, so the output feeds the next product
        mx.eval(x)

    run()  # warm-up: kernel compiles and plans
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) / chain * 1e6)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,3,4,5,6,7,8,9,16,32")
    ap.add_argument("--shapes", default="1024x1024,3072x3072,3584x3584")
    ap.add_argument("--chain", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    rows = [int(r) for r in a.rows.split(",")]
    print(f"MLX {mx.__version__}, {mx.default_device()}; us per product (median of {a.repeats} chains of {a.chain})")
    for shape in a.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        w = mx.random.normal((n, k)).astype(mx.bfloat16)
        wq, s, b = mx.quantize(w, group_size=64, bits=4)
        mx.eval(wq, s, b)
        plain = {r: chain_us(wq, s, b, r, k, a.chain, a.repeats) for r in rows}
        lead = {r: chain_us(wq, s, b, r, k, a.chain, a.repeats, lead=True) for r in rows if r > 1}
        padded = {r: chain_us(wq, s, b, r, k, a.chain, a.repeats, pad_to=8) for r in rows if 1 < r < 8}
        print(f"{n}x{k} rows: " + ", ".join(f"{r}: {plain[r]:.1f}" for r in rows))
        print(f"{n}x{k} rows as (rows, 1, {k}): " + ", ".join(f"{r}: {lead[r]:.1f}" for r in lead))
        print(f"{n}x{k} padded to 8 (pad + product + slice): " + ", ".join(f"{r}: {padded[r]:.1f}" for r in padded))
        # The elementwise scale in the chain is one kernel too: its share, for reading the figures.
        x = mx.random.normal((8, k)).astype(mx.bfloat16)
        mx.eval(x)
        t = time.perf_counter()
        for _ in range(a.chain):
            x = x * 0.01
        mx.eval(x)
        print(f"{n}x{k} the chain's scale alone: {(time.perf_counter() - t) / a.chain * 1e6:.1f} us")


if __name__ == "__main__":
    main()
