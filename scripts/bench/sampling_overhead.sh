#!/usr/bin/env bash
# Cost of the full sampler stack (processors, top-p, min-p, XTC, top-k, categorical) against greedy decoding, on a random 150k-vocabulary model (qwen3-0.6b shape, 4-bit).
#
# Usage: scripts/bench/sampling_overhead.sh [MODEL_DIR] [TOKENS] [ROUNDS]
# Prints the median decode tok/s of each setting over ROUNDS interleaved runs, the end-to-end
# overhead of the full stack, and the host-side graph-building time per token
# (crates/engine/examples/sampling_host_cost.rs) as a share of the greedy decode time per token.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
model=${1:-$root/target/bench-models/qwen3-0.6b-q4}
tokens=${2:-64}
rounds=${3:-3}
py=$("$root/scripts/oracle-venv.sh")
if [ ! -f "$model/config.json" ]; then
  "$py" "$root/scripts/bench/make_shape.py" qwen3-0.6b "$model" >&2
fi
(cd "$root" && cargo build --release -q -p mlx-gen-rs && cargo build --release -q -p engine --example sampling_host_cost)
bin=$root/target/release/mlx-gen
full=(--temp 0.8 --top-p 0.95 --min-p 0.02 --min-tokens-to-keep 3 --top-k 40 --xtc-probability 0.5
      --xtc-threshold 0.1 --repetition-penalty 1.1 --presence-penalty 0.2 --frequency-penalty 0.1
      --logit-bias 9=1.5,42=-2 --seed 0)
tps() { # settings... -> generation tok/s
  "$bin" generate --model "$model" --prompt "The quick brown fox jumps over the lazy dog" \
    --ignore-chat-template -m "$tokens" --output json "$@" |
    "$py" -c 'import json,sys; d=json.load(sys.stdin); print(d["generation_tps"] if d["generation_tokens"] > 1 else "nan")'
}
greedy=(); stack=()
for _ in $(seq "$rounds"); do
  greedy+=("$(tps)")
  stack+=("$(tps "${full[@]}")")
done
host=$("$root/target/release/examples/sampling_host_cost" 151936 1000)
"$py" - "${greedy[*]}" "${stack[*]}" "$host" "$tokens" <<'PY'
import statistics, sys, re
g = statistics.median(map(float, sys.argv[1].split()))
s = statistics.median(map(float, sys.argv[2].split()))
host = sys.argv[3]
print(f"decode, {sys.argv[4]} tokens, median of {len(sys.argv[1].split())} runs:")
print(f"  greedy:      {g:8.2f} tok/s  ({sys.argv[1]})")
print(f"  full stack:  {s:8.2f} tok/s  ({sys.argv[2]})")
print(f"  end-to-end overhead of the full stack: {100 * (1 - s / g):.2f}% (host + device work)")
us = {k: float(v) for k, v in re.findall(r"^(.*?): ([0-9.]+) us", host, re.M)}
step_us = 1e6 / g
for k, v in us.items():
    print(f"  host-side graph building, {k}: {v:.1f} us/token = {100 * v / step_us:.3f}% of a {step_us / 1000:.2f} ms decode step")
PY
