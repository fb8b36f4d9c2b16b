#!/usr/bin/env python3
"""Compares two MLX model folders tensor for tensor (for the `mlx-gen convert` tests).

convert_compare.py OURS THEIRS

Prints one JSON object: {"ok": bool, "problems": [...], "tensors": N}. Tensors are read with
mx.load from every model*.safetensors file; names, dtypes, shapes and the raw bytes must be equal;
config.json must parse to equal values, and model.safetensors.index.json's weight_map too.
"""

import glob
import json
import sys
from pathlib import Path


def tensors(folder):
    import mlx.core as mx

    out = {}
    for f in sorted(glob.glob(str(Path(folder) / "model*.safetensors"))):
        out.update(mx.load(f))
    return out


def main():
    import mlx.core as mx
    import numpy as np

    ours, theirs = Path(sys.argv[1]), Path(sys.argv[2])
    problems = []
    a, b = tensors(ours), tensors(theirs)
    if sorted(a) != sorted(b):
        problems.append(f"names differ: only ours {sorted(set(a) - set(b))}, only theirs {sorted(set(b) - set(a))}")
    for name in sorted(set(a) & set(b)):
        x, y = a[name], b[name]
        if x.dtype != y.dtype or x.shape != y.shape:
            problems.append(f"{name}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}")
            continue
        xb = np.array(x.view(mx.uint8)) if x.size else np.zeros(0, np.uint8)
        yb = np.array(y.view(mx.uint8)) if y.size else np.zeros(0, np.uint8)
        if xb.tobytes() != yb.tobytes():
            problems.append(f"{name}: values differ")
    for f in ["config.json"]:
        ca = json.loads((ours / f).read_text())
        cb = json.loads((theirs / f).read_text())
        if ca != cb:
            keys = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
            problems.append(f"{f} differs at {keys}: ours {[ca.get(k) for k in keys]} theirs {[cb.get(k) for k in keys]}")
    ia = json.loads((ours / "model.safetensors.index.json").read_text())
    ib = json.loads((theirs / "model.safetensors.index.json").read_text())
    if ia != ib:
        problems.append(f"model.safetensors.index.json differs: {ia.get('metadata')} vs {ib.get('metadata')}")
    print(json.dumps({"ok": not problems, "problems": problems, "tensors": len(a)}))


if __name__ == "__main__":
    main()
