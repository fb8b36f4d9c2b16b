#!/usr/bin/env python3
"""A prompt's products: MLX's quantized matrix product against the weight dequantized and multiplied by cuBLAS.

Usage: prefill_gemm.py [--rows 64,128,...] [--shapes 3072x3072,...] [--repeats 5] [--calls 40]

Prefill multiplies a chunk of prompt positions (hundreds to thousands of rows) by every weight. On an H100 the
side-by-side prefill figures (BENCHMARKS.md) are 75-85 TFLOPS of products, a tenth of the device's bfloat16
rate, in both tools: the quantized product's tiled kernel may be what bounds it. This times, per row count and
weight shape, `--calls` independent products of one input (queued together, one wait), the median of
`--repeats` after a warm-up, for: (q) `mx.quantized_matmul` (4-bit, group 64, bfloat16, as the shapes'
folders); (d) `mx.dequantize` of the weight then `x @ w.T` (the dequantized copy is made every call, as an
engine that keeps only the 4-bit weight would); (g) the product alone with the weight already in bfloat16 (the
bound). TFLOPS and the largest difference of (d) from (q), relative to (q)'s largest magnitude, per line. Then
the same for a mixture of experts' projection (`--moe`): MLX's gathered quantized product over the routed rows
sorted by expert (its CUDA backend runs it as a matrix-vector product a row) against every expert dequantized and
MLX's gathered dense product (a grouped product).
"""
import argparse
import time

import mlx.core as mx


def timed(fn, calls, repeats):
    mx.eval(fn())  # warm-up: kernels compile, plans are made
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        mx.eval([fn() for _ in range(calls)])
        times.append((time.perf_counter() - t) / calls * 1e6)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="16,32,64,128,256,512,2048")
    # Llama-3.2-3B's q/o, k/v, gate/up, down; Qwen3-0.6B's q, gate/up, down
    ap.add_argument("--shapes", default="3072x3072,1024x3072,8192x3072,3072x8192,2048x1024,3072x1024,1024x3072")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=5)
    # Mixtral-8x7B's, Qwen3-30B-A3B's and Qwen3.5-35B-A3B's experts (gate/up projection): experts x out x in x top-k
    ap.add_argument("--moe", default="8x14336x4096x2,128x768x2048x8,256x512x2048x8")
    ap.add_argument("--moe-tokens", default="512")
    a = ap.parse_args()
    print(f"MLX {mx.__version__}, {mx.default_device()}; us per product (median of {a.repeats} x {a.calls} calls)")
    print("shape rows: quantized / dequantize+matmul / matmul alone (us); TFLOPS q / d / g; d's rel. diff")
    for shape in dict.fromkeys(a.shapes.split(",")):
        n, k = (int(v) for v in shape.split("x"))
        w = (mx.random.normal((n, k)) * 0.02).astype(mx.bfloat16)
        wq, s, b = mx.quantize(w, group_size=64, bits=4)
        wd = mx.dequantize(wq, s, b, group_size=64, bits=4)
        mx.eval(wq, s, b, wd)
        for r in (int(v) for v in a.rows.split(",")):
            x = mx.random.normal((r, k)).astype(mx.bfloat16)
            mx.eval(x)
            q = lambda: mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=4)  # noqa: E731
            d = lambda: x @ mx.dequantize(wq, s, b, group_size=64, bits=4).T  # noqa: E731
            g = lambda: x @ wd.T  # noqa: E731
            tq, td, tg = (timed(f, a.calls, a.repeats) for f in (q, d, g))
            yq, yd = q(), d()
            diff = (mx.abs(yq.astype(mx.float32) - yd.astype(mx.float32)).max()
                    / mx.abs(yq.astype(mx.float32)).max()).item()
            fl = 2 * r * n * k / 1e6  # MFLOP; / us = TFLOPS
            print(f"{n}x{k} {r}: {tq:.1f} / {td:.1f} / {tg:.1f}; {fl / tq:.0f} / {fl / td:.0f} / {fl / tg:.0f}; "
                  f"{diff:.2e}", flush=True)
    for spec in filter(None, a.moe.split(",")):
        for t in (int(v) for v in a.moe_tokens.split(",")):
            moe(tuple(int(v) for v in spec.split("x")), t, max(a.calls // 4, 4), a.repeats)


def moe(spec, tokens, calls, repeats):
    """One expert projection of a prompt's tokens routed top-k, sorted by expert as mlx-lm's SwitchGLU sorts them
    (64+ routed rows): MLX's gathered quantized product against every expert dequantized and multiplied by the
    gathered dense product (a grouped product over the sorted rows)."""
    e, n, k, top = spec
    w = (mx.random.normal((e, n, k)) * 0.02).astype(mx.bfloat16)
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    del w
    x = mx.random.normal((tokens, k)).astype(mx.bfloat16)
    idx = mx.argpartition(mx.random.normal((tokens, e)), kth=-top, axis=-1)[:, -top:].astype(mx.uint32)
    flat = idx.flatten()
    order = mx.argsort(flat)
    xs = x[order // top][:, None, :]  # (tokens * top, 1, k), grouped by expert
    rs = flat[order]
    mx.eval(wq, s, b, xs, rs)
    q = lambda: mx.gather_qmm(xs, wq, s, b, rhs_indices=rs, transpose=True, group_size=64, bits=4,  # noqa: E731
                              sorted_indices=True)
    d = lambda: mx.gather_mm(xs, mx.swapaxes(mx.dequantize(wq, s, b, group_size=64, bits=4), -1, -2),  # noqa: E731
                             rhs_indices=rs, sorted_indices=True)
    tq = timed(q, calls, repeats)
    try:
        td = timed(d, calls, repeats)
    except RuntimeError as err:  # MLX's CPU backend multiplies gathered float32 only
        print(f"experts {e}x{n}x{k} top-{top}, {tokens} tokens: {tq:.1f} us quantized; dense: {err}", flush=True)
        return
    yq, yd = q().astype(mx.float32), d().astype(mx.float32)
    diff = (mx.abs(yq - yd).max() / mx.abs(yq).max()).item()
    fl = 2 * tokens * top * n * k / 1e6
    print(f"experts {e}x{n}x{k} top-{top}, {tokens} tokens: {tq:.1f} / {td:.1f} us; {fl / tq:.1f} / {fl / td:.1f} "
          f"TFLOPS; {diff:.2e}", flush=True)


if __name__ == "__main__":
    main()
