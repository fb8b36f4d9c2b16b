#!/usr/bin/env bash
# Cost of constrained decoding (a JSON schema through llguidance) against free decoding, on a random
# model of the Qwen3-0.6B shape (4-bit) with a real 151k-token vocabulary (Qwen2.5's tokenizer, the
# one Qwen3 uses too, copied from Qwen2.5-Coder-0.5B-Instruct: the mask's cost grows with the vocabulary).
#
# Usage: scripts/bench/constrained_decode.sh TOKENIZER_DIR [MODEL_DIR] [TOKENS] [ROUNDS]
# TOKENIZER_DIR holds tokenizer.json and tokenizer_config.json (e.g. ~/.cache/mlx-gen/models/Qwen2.5-Coder-*).
# Prints the median decode tok/s of each over ROUNDS interleaved runs and the difference. The schema
# keeps the model inside a free JSON string, where the mask allows most of the vocabulary (the
# costliest case for the mask), so that random weights run to TOKENS.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tokdir=${1:?usage: constrained_decode.sh TOKENIZER_DIR [MODEL_DIR] [TOKENS] [ROUNDS]}
model=${2:-$root/target/bench-models/qwen3-0.6b-q4-f32-qwentok}
tokens=${3:-64}
rounds=${4:-3}
py=$("$root/scripts/oracle-venv.sh")
if [ ! -f "$model/config.json" ]; then
  # float32 activations and scales (${DTYPE:-float32}): bfloat16 is ~10x slower on an x86 CPU.
  "$py" "$root/scripts/bench/make_shape.py" qwen3-0.6b "$model" --dtype "${DTYPE:-float32}" >&2
fi
cp "$tokdir/tokenizer.json" "$tokdir/tokenizer_config.json" "$model/"
bin=${MLX_GEN_BIN:-$root/target/release/mlx-gen}
[ -n "${MLX_GEN_BIN:-}" ] || (cd "$root" && cargo build --release -q -p mlx-gen-rs)
schema=$(mktemp --suffix .json)
trap 'rm -f "$schema"' EXIT
echo '{"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}' > "$schema"
tps() { # flags... -> "generation tok/s"
  "$bin" generate --model "$model" --prompt "Describe the sea" -m "$tokens" --output json "$@" |
    "$py" -c 'import json,sys; d=json.load(sys.stdin); print(d["generation_tps"] if d["generation_tokens"] > 1 else "nan", d["generation_tokens"])'
}
free=(); constrained=()
for _ in $(seq "$rounds"); do
  read -r t n < <(tps); free+=("$t"); echo "free: $t tok/s ($n tokens)" >&2
  read -r t n < <(tps --json-schema "$schema"); constrained+=("$t"); echo "json schema: $t tok/s ($n tokens)" >&2
done
"$py" - "${free[*]}" "${constrained[*]}" <<'PY'
import statistics, sys
free = statistics.median(float(x) for x in sys.argv[1].split())
con = statistics.median(float(x) for x in sys.argv[2].split())
print(f"decode tok/s, median: free {free:.2f}, json schema {con:.2f} ({100 * (con / free - 1):+.1f}%)")
PY
