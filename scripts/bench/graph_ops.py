#!/usr/bin/env python3
"""Counts the MLX operations of one decode step, mlx-gen against mlx-lm, on the same model folder.

Usage: graph_ops.py MODEL [--step-graph target/release/examples/step_graph] [--fused] [--prompt 32]
       [--json out.json]

Per-token decode time on a GPU is mostly host time spent building and dispatching the step's graph
(BENCHMARKS.md, "History"), so the number of primitives in one step is the figure to cut. Both tools
run the same prompt through the model, evaluate it, then build the forward pass of one more token
over that cache and export it unevaluated with MLX's `export_to_dot` (mlx-gen through its
`step_graph` example, built by `cargo build --release -p engine --example step_graph`). The graphs
are counted by primitive. `--fused` asks mlx-gen for the fused q/k/v and gate/up projections it uses
on a GPU (off on the CPU by default). Runs on the CPU; the counts do not depend on the device.
"""
import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

NODE = re.compile(r'^\{ \S+ \[label ="([^"]*)", shape=rectangle\]; \}$')


def count(dot_path):
    """Primitive name -> count, from an `export_to_dot` file."""
    ops = collections.Counter()
    for line in Path(dot_path).read_text().splitlines():
        m = NODE.match(line.strip())
        if m:
            ops[m.group(1).split(" ")[0]] += 1
    if not ops:
        sys.exit(f"error: no operations found in {dot_path}")
    return ops


def mlx_lm_graph(model_dir, prompt_len, out):
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = load(model_dir)
    cache = make_prompt_cache(model)
    prompt = [(t * 31) % 200 + 1 for t in range(prompt_len)]
    logits = model(mx.array([prompt]), cache=cache)
    mx.eval(logits, [c.state for c in cache])
    step = model(mx.array([[7]]), cache=cache)
    mx.export_to_dot(out, step)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--step-graph", default="target/release/examples/step_graph")
    ap.add_argument("--fused", action="store_true")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--json")
    a = ap.parse_args()
    config = json.loads((Path(a.model) / "config.json").read_text())
    layers = config.get("num_hidden_layers", 1)
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = f"{tmp}/mlx-gen.dot", f"{tmp}/mlx-lm.dot"
        cmd = [a.step_graph, a.model, ours, "--prompt", str(a.prompt)] + (["--fused"] if a.fused else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"error: {' '.join(cmd)} failed: {r.stderr.strip()}")
        mlx_lm_graph(a.model, a.prompt, theirs)
        g, l = count(ours), count(theirs)
    names = sorted(set(g) | set(l), key=lambda n: (-(g[n] + l[n]), n))
    print(f"one decode step of {a.model} ({config.get('model_type')}, {layers} layers, prompt {a.prompt}"
          f"{', mlx-gen fused projections' if a.fused else ''})")
    print(f"| primitive | mlx-gen | mlx-lm |\n| --- | --- | --- |")
    for n in names:
        print(f"| {n} | {g[n]} | {l[n]} |")
    tg, tl = sum(g.values()), sum(l.values())
    print(f"| **total** | **{tg}** | **{tl}** |")
    print(f"| per layer | {tg / layers:.1f} | {tl / layers:.1f} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "fused": a.fused, "layers": layers,
                                            "mlx_gen": dict(g), "mlx_lm": dict(l)}, indent=1))


if __name__ == "__main__":
    main()
