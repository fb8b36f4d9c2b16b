#!/usr/bin/env bash
# Creates (once) the test-only Python venv holding the reference implementation, Python mlx-lm 0.32.2
# on MLX 0.32.4, and prints its python's path. Never used at run time.
# Location: $MLX_GEN_ORACLE_VENV, default <repo>/.venv-oracle. Safe to call from parallel tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${MLX_GEN_ORACLE_VENV:-$root/.venv-oracle}
marker="$venv/.mlx-gen-oracle-v2"
if [ ! -f "$marker" ]; then
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock 9
  if [ ! -f "$marker" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      mlx==0.32.4 mlx-cpu==0.32.4 mlx-lm==0.32.2 gguf==0.19.0 >&2
    touch "$marker"
  fi
fi
echo "$venv/bin/python"
