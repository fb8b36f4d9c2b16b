#!/usr/bin/env bash
# Builds mlx-gen (release) and generates text. Until the real default model is wired in, it uses a
# tiny random Llama that the test oracle builds (so the text is gibberish, but every step is real).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
py=$(scripts/oracle-venv.sh)
dir=target/demo-models
[ -d "$dir/llama3-q4g64" ] || "$py" tests/oracle/make_models.py "$dir" --only llama3-f32 --only llama3-q4g64 >/dev/null
target/release/mlx-gen generate --model "$dir/llama3-q4g64" --prompt "${1:-Hello, how are you?}" --verbose
