#!/usr/bin/env bash
# Creates (once) the test-only Python venv holding the reference implementation, Python mlx-lm 0.32.2
# on MLX 0.32.4, the official `openai` and `anthropic` clients the server tests drive `mlx-gen serve`
# with, and `jsonschema` to validate structured output; prints its python's path. Never used at run time.
# Location: $MLX_GEN_ORACLE_VENV, default <repo>/.venv-oracle. Safe to call from parallel tests.
# Three layers, each with its marker: the base (v2), the OpenAI client (v3), and the Anthropic client
# with jsonschema (v4), NVRTC to compile the engine's CUDA kernels without a GPU (v5), so that a venv
# made before a layer was added gains it without being rebuilt under tests that are using it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${MLX_GEN_ORACLE_VENV:-$root/.venv-oracle}
base_marker="$venv/.mlx-gen-oracle-v2"
openai_marker="$venv/.mlx-gen-oracle-v3"
anthropic_marker="$venv/.mlx-gen-oracle-v4"
marker="$venv/.mlx-gen-oracle-v5"
if [ ! -f "$marker" ]; then
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock 9
  pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
  if [ ! -f "$base_marker" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "${pip[@]}" mlx==0.32.4 mlx-cpu==0.32.4 mlx-lm==0.32.2 gguf==0.19.0 >&2
    touch "$base_marker"
  fi
  if [ ! -f "$openai_marker" ]; then
    "${pip[@]}" openai==1.109.1 httpx==0.28.1 >&2
    touch "$openai_marker"
  fi
  if [ ! -f "$anthropic_marker" ]; then
    "${pip[@]}" anthropic==2.16.0 jsonschema==4.26.0 httpx==0.28.1 >&2
    touch "$anthropic_marker"
  fi
  if [ ! -f "$marker" ]; then
    "${pip[@]}" nvidia-cuda-nvrtc==13.5.37 >&2
    touch "$marker"
  fi
fi
echo "$venv/bin/python"
