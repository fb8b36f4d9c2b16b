#!/usr/bin/env bash
# The GPU measurements the open issues need, from the folder stage-gpu.sh fills (.gpubin/: mlx-gen +
# bench scripts), on a machine where `python3` has mlx (CUDA) and mlx-lm. One section per call
# (each under 10 minutes on an H200):
#   gpu_suite.sh perf   MLX CUDA-graph size sweep, then the side-by-side table (3 rounds, pacing)  (issue 13);
#                       SAME=N: the table alone, both tools with MLX_MAX_OPS_PER_BUFFER=N (PERF_SHAPES, ROUNDS)
#   gpu_suite.sh more   fused vs separate, paged vs growing cache (issue 5), prompt 4096, DeepSeek-V2-Lite (issue 8)
#   gpu_suite.sh spec   real Qwen2.5-Coder-0.5B pair: speculative decoding vs mlx-lm (issue 6);
#                       needs the GGUF at $GGUF (default /tmp/model.gguf)
#   gpu_suite.sh serve  server load at 1/8/32 streams vs mlx_lm.server (issue 7); 2 ranks over ring on one GPU (issue 11)
#   gpu_suite.sh serving  issue 20 item 1: server load at 1/8/32 streams vs mlx_lm.server on the Qwen3-0.6B and
#                       Llama-3.2-3B shapes (2 rounds), mlx-gen with MLX_GEN_TRACE (its stage split kept in
#                       $OUT/serving-SHAPE.mlx-gen.log), then (KB=N) mlx-gen alone with MLX_GEN_KEY_BUCKET=N at 8/32
#                       streams, (PS2048=1) mlx-gen alone with --prefill-step-size 2048, (LA=N) mlx-gen alone with
#                       and without MLX_GEN_PREFILL_LOOKAHEAD=N, 2 rounds each, alternating; SERVE_ARGS: mlx-gen
#                       serve's extra flags
#   gpu_suite.sh prompts  issue 20's 32 streams: serve --prompt-concurrency 8 / 16 / 32 and --prefill-step-size 2048 /
#                       4096 / 8192, with and without the prefix cache (stored at every prefill), mlx-gen alone at
#                       1, 8 and 32 streams, 2 alternating rounds (PROMPT_SHAPES, PROMPT_ROUNDS); then
#                       batch_step_cost's exit status after --forward and after a batch step (its exit segfault)
#   gpu_suite.sh big    the Qwen2.5-7B side-by-side row alone (3 rounds, pacing), and mlx-lm with mlx-gen's MLX tuning
#   gpu_suite.sh moe    Qwen3-30B-A3B (or SHAPE=mixtral-8x7b) side by side, same MLX settings (issue 17)
#   gpu_suite.sh hybrid Qwen3.5-9B (or SHAPE=qwen3.5-2b|qwen3.5-35b-a3b) side by side, prompt 512 and 4096 (PROMPTS,
#                       ROUNDS), same MLX settings, then mlx-gen without its recurrence kernel (issue 18)
#   gpu_suite.sh fidelity  greedy GPU tokens, fused and unfused, against mlx-lm's: the real models in $REAL
#                       (stage-real-models.sh), then the random shapes (issue 22)
#   gpu_suite.sh round  speculative rounds on the shapes (issue 19): a Llama-3.2-3B drafting for itself (round cost,
#                       every draft accepted, with MLX_GEN_TRACE's stage split), prompt lookup on the code-editing
#                       prompt and on a random one (the fallback), each against plain decoding in the same bench run
#   gpu_suite.sh constrained  JSON-schema decoding vs free, CLI and server at 1/8 streams (issue 21); $TOK = a
#                       folder with Qwen2.5's tokenizer.json + tokenizer_config.json (default /tmp/tok); CLI_ROUNDS,
#                       SERVER_ROUNDS ("" skips that half)
#   gpu_suite.sh stall  issue 20 item 2: 10 rounds of 8 streams (long prompts mixed in), worst vs median round TTFT
#   gpu_suite.sh memory issue 22 item 4: peak memory of both tools at prompt 4096 (Llama-3.2-3B) and 512 (Qwen3-0.6B),
#                       then mlx-gen's `bench --memory` breakdown
#   gpu_suite.sh realspec  issue 19 with the real Qwen2.5-Coder-0.5B-Instruct (bf16 target, its 4-bit draft, from
#                       $REAL as stage-real-models.sh stages it): vs mlx-lm, a low-acceptance prompt, the server
#   gpu_suite.sh diag   a decode step's time split (graph, queue, wait) in both tools, Qwen3-0.6B and Llama-3.2-3B
#                       shapes (also at the end of `moe`); the batch engine's newcomers' prefill cost against its rows,
#                       length and step budget (batch_step_cost --prefill)
#   gpu_suite.sh next   what was built after the sixth lease: the folded composed attention (the batch step at
#                       1/8/32 rows on both dense shapes, a verification round; the server's figures are `serving`'s),
#                       MLX_GEN_KEY_BUCKET, MLX_GEN_GDN_NOFMA's fidelity (run first)
#   gpu_suite.sh fallback  `round`'s prompt-lookup runs with the fallback alone (code-editing and random prompts)
#   gpu_suite.sh pgemm  prefill's products: MLX's quantized product against dequantize + cuBLAS (prefill_gemm.py), then
#                       the dequantized prefill (default) against MLX_GEN_PREFILL_GEMM=0: tokens, prefill, decode (issue 22)
#   gpu_suite.sh mailbox  issue 21 at 8 streams: constrained steps reading their tokens through the mailbox (one
#                       evaluation a step) against MLX_GEN_MAILBOX=0 and free decoding, CLI and server, with traces
#   gpu_suite.sh prefill  issue 22's prefill and peak at prompt 512 and 4096 against mlx-lm (3 alternating rounds), with
#                       the dequantized product from 512 rows as a third column at 512; its tokens from 128 rows
#   gpu_suite.sh pfsweep  time to the first token by prompt length (16-2048) in both tools, mlx-gen also without clearing
#                       MLX's buffer cache and without the prefill's lookahead bound: the fixed and per-position parts
#                       of prefill (issue 22; SW_SHAPE, SW_PROMPTS, SW_ROUNDS)
#   gpu_suite.sh gdnjit the gated-delta recurrence launched by our primitive (default) against MLX's cuda_kernel (=0):
#                       tokens (bit for bit expected), decode and prefill (GDN_SHAPES, issue 18)
#   gpu_suite.sh qmm    MLX's quantized matrix product by row count (1-9, 16, 32), as (rows, in) and (rows, 1, in),
#                       and 2-7 rows padded to 8; then the engine's batch step at 1-8 and 32 rows
#   gpu_suite.sh qmmk   our few-row quantized product and few-position attention against MLX's: error, time, then
#                       the batch step, verification and prompt lookup with and without them (MLX_GEN_QMM_KERNEL,
#                       MLX_GEN_ATTN_KERNEL)
#   gpu_suite.sh qmv    our quantized product of 1-7 rows (MLX_GEN_QMM_KERNEL: 1 = weights of 2^24+ elements, all =
#                       every weight) against MLX's: error, time and bandwidth a product; then decode (prompt 512, 256
#                       tokens) on the Qwen2.5-7B, Llama-3.2-3B and Qwen3-0.6B shapes with it off / 1 / all, alternating
#                       (QV_ROUNDS, default "1 2 3"; QV_SHAPES)
#   gpu_suite.sh qmvside  with MLX_GEN_QMM_KERNEL=${QV:-1}: side by side with mlx-lm (QV_SHAPES, 3 rounds, same MLX
#                       settings), greedy tokens against mlx-lm's (fidelity), the batch step at 1-8 rows
#   gpu_suite.sh auto   the few-row kernel's default (the model decides: every weight where its decode step is the
#                       device's, else weights of 2^24+ elements) against MLX_GEN_QMM_KERNEL=0, decode at prompt 512,
#                       Qwen2.5-7B and Llama-3.2-3B shapes (AUTO_SHAPES), alternating (AUTO_ROUNDS, default "1 2")
#   gpu_suite.sh gather our gathered product for a few tokens (MLX_GEN_GATHER_KERNEL=1) against MLX's gather_qmm on
#                       Mixtral-8x7B's experts (batch_step_cost --gather: error, time), then decode on the Mixtral-8x7B
#                       shape (SHAPE) with and without it, alternating (GATHER_ROUNDS, default "1 2"); KEEP=1 keeps it
#   gpu_suite.sh jit    the few-row kernels compiled once (jit.cpp) against ./mlx-gen-old (MLX's cuda_kernel, the
#                       previous binary): products' error and time, decode alternating (JIT_ROUNDS, JIT_SHAPES),
#                       default and every weight, then each binary's host split (MLX_GEN_TRACE)
#   gpu_suite.sh qmvcols  the few-row product with 1, 2, 4 (default) and 8 output columns a block (MLX_GEN_QMM_COLS:
#                       registers against x's reuse), batch_step_cost --qmm 1 2 4 7 each
#   gpu_suite.sh kserve the server with and without those kernels, 1/8/32 streams (KR rounds, KS_SHAPES)
#   gpu_suite.sh why    fixed costs: batch_step_cost's exit crash (native stack), a forward of L positions with keys
#                       fixed and growing, the batch step and the self-drafting round, each under key buckets / no CUDA
#                       graphs / our attention kernel; Llama-3.2-3B decode with every weight through the few-row kernel
#   gpu_suite.sh graphs MLX's CUDA graphs against direct launches on host-bound decode (three shapes)
#   gpu_suite.sh grouped  MoE prompts one expert at a time (MLX_GEN_MOE_GROUPED) against MLX's gathered product:
#                       tokens, prefill (SHAPE, default mixtral-8x7b), the load's split at 8/1/4/16 threads; the decode kernel's tokens
#   gpu_suite.sh warps  the tensor-core product with 16 warps splitting K for 8-16 rows against 8 (issues 19, 21):
#                       the product, the batch step, a forward of 8-9 positions, the self-drafting round, its tokens
#   gpu_suite.sh mma    the tensor-core product of 8-256 rows (MLX_GEN_QMM_MMA=1) against MLX's: error and time, the
#                       batch step, a few-position forward, the self-drafting round, the server (issues 19, 20)
#   gpu_suite.sh attn   our attention kernel for a few query positions against MLX's composed attention: batch step
#                       at 1/8/32 rows on both dense shapes, the server at 8 and 32 streams (ATTN_SERVE shapes)
#   gpu_suite.sh ahead  verify's short form (about 150 s): the draft step queued ahead, the attention kernel at 8
#                       positions, the product's tiles at 32 rows, batch_step_cost --forward's exit
#   gpu_suite.sh verify a verification's cost with the tensor-core product (default): our attention kernel for a few
#                       query positions against MLX's composed one (forward of 1/5/8/9 positions, self-drafting round,
#                       prompt lookup, tokens), the draft model's step queued ahead (MLX_GEN_SPEC_PIPELINE) against
#                       not, the product up to 32 rows against up to 64 (batch step of 32-64 rows), and
#                       batch_step_cost --forward's exit under MLX_GEN_CRASH_TRACE (issues 19, 20)
#   gpu_suite.sh route  the MoE router as one kernel against MLX's operations (batch_step_cost --route), greedy
#                       tokens with and without it, then Qwen3-30B-A3B (SHAPE) side by side with mlx-lm (issue 17)
#   gpu_suite.sh pacing the longest inter-token intervals and their tokens (Llama-3.2-3B, Qwen2.5-7B; issue 22 item 5)
#   gpu_suite.sh fusednorm  the residual add fused with the RMS norm (MLX_GEN_FUSED_NORM=1): its tokens and
#                       log-probabilities against MLX's two kernels, then decode with and without, 3 rounds
#   gpu_suite.sh check  the quick re-checks of the fixes made after the second H200 run: prompt lookup vs plain, paged vs
#                       growing, padded batch step cost, server at 8/32 streams (about 4 minutes)
# Prints and writes to $OUT (or ./gpu-results). $MODELS (default /tmp/models) caches the random-weight shapes.
set -u
cd "$(dirname "$0")/.."          # .gpubin/
out=${OUT:-gpu-results}; mkdir -p "$out"
models=${MODELS:-/tmp/models}
section=${1:-perf}
# MLX's CUDA backend commits a CUDA graph every MLX_MAX_OPS_PER_BUFFER operations (default 20).
tuned=$(cat /tmp/mlxgen-tuned-env 2>/dev/null || echo "")
# How far two `generate --output json --logprobs` runs (files $1, $2) agree: equal tokens, then the largest
# log-probability difference over them.
same_tokens() { python3 -c "
import json, sys; a, b = (json.load(open(f)) for f in sys.argv[1:3])
n = next((i for i, (x, y) in enumerate(zip(a['tokens'], b['tokens'])) if x != y), len(a['tokens']))
d = max((abs(x - y) for x, y in zip(a['logprobs'][:n], b['logprobs'][:n])), default=0.0)
print(f'{n}/{len(a[\"tokens\"])} tokens equal, max log-prob difference {d:.3g}')" "$1" "$2"; }
med() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); m=d['median']; print(f\"ttft {m['ttft_s']*1000:.1f} ms, prefill {m['prompt_tps']:.0f} tok/s, decode {m['generation_tps']:.1f} tok/s, peak {m['peak_memory_gb']:.3f} GB\")"; }
# A decode step's time split (graph building, MLX's queueing, waiting) in both tools, same MLX settings.
step_split() {
  for r in 1 2; do
    echo "== $(basename "$1") step split round $r, mlx-gen: $(MLX_MAX_OPS_PER_BUFFER=80 MLX_GEN_TRACE=1 ./mlx-gen bench --model "$1" -p 128 -g 256 -n 1 2>&1 | grep '^trace:' | tail -1)"
    echo "== $(basename "$1") step split round $r, $(MLX_MAX_OPS_PER_BUFFER=80 python3 bench/mlx_lm_step_split.py --model "$1" -p 128 -g 256 2>&1 | tail -1)"
  done
}
# The self-drafting round of the folder $1 (K = 4, every round speculative, -p 128 -g 256, 2 trials) under the
# environment given after it: its `Averages` and `Speculative` lines.
selfdraft() { local d=$1; shift; env "$@" ./mlx-gen bench -n 2 --model "$d" -p 128 -g 256 --draft-model "$d" --num-draft-tokens 4 \
    --always-speculate 2>&1 | grep -E "^(Averages|Speculative)"; }
# The MoE shape $1 with every layer in 4 bits (see `moe`), made once in $models.
moe_dir() { local d=$models/$1-4bit-bfloat16; [ -f "$d/config.json" ] || python3 bench/make_shape.py "$1" "$d" --bits 4 --dtype bfloat16 --uniform >/dev/null; echo "$d"; }
# `bench` of the folder $3 with the remaining arguments, the variable $1 at 0 then 1, in each round of $2.
alternate() {
  local var=$1 rounds=$2 d=$3; shift 3
  for r in $rounds; do
    for g in 0 1; do echo "== round $r $(basename "$d") $var=$g: $(env "$var=$g" ./mlx-gen bench --model "$d" "$@" --json | med)"; done
  done
}
# Issue 21's server rounds at 8 streams, free / JSON schema x a variable's settings: `server8 VAR ROUNDS LOG`, the
# rounds of free:V1 schema:V1 schema:V0 with VAR=V each, the engine's trace line after each (LOG: server logs' prefix).
server8() {
  local var=$1 rounds=$2 log=$3 r a extra
  for r in $rounds; do
    for a in free:1 schema:1 schema:0; do
      extra=(); [ "${a%%:*}" = free ] || extra=(--json-schema /tmp/schema.json)
      echo "-- round $r server, 8 streams, ${a%%:*}, $var=${a##*:}"
      env "$var=${a##*:}" MLX_GEN_TRACE=1 timeout 150 python3 bench/server_load.py --mlx-gen ./mlx-gen --model "$d" \
          --server mlx-gen --concurrency 8 --max-tokens 128 "${extra[@]}" --server-log "$log-$r-${a/:/-}" | grep "streams:"
      grep -E '^trace: engine' "$log-$r-${a/:/-}.mlx-gen.log" | tail -1
    done
  done
}
shape_dir() { local d=$models/$1-4bit-bfloat16; [ -f "$d/config.json" ] || python3 bench/make_shape.py "$1" "$d" --bits 4 --dtype bfloat16 >/dev/null; echo "$d"; }
{
case $section in
perf)
  if [ -n "${SAME:-}" ]; then
    # The side-by-side table alone, both tools under MLX_MAX_OPS_PER_BUFFER=$SAME (the brief's "same MLX settings").
    sh=${PERF_SHAPES:-smollm2-135m qwen3-0.6b llama-3.2-3b qwen2.5-7b}
    for s in $sh; do shape_dir $s >/dev/null; done
    MLX_MAX_OPS_PER_BUFFER=$SAME python3 bench/side_by_side.py --mlx-gen ./mlx-gen --models "$models" --shapes "${sh// /,}" \
        -p 512 -g 256 -n 2 --rounds ${ROUNDS:-3} --pacing-tokens 1024 --mlx-gen-env "MLX_MAX_OPS_PER_BUFFER=$SAME" \
        --out "$out/side_by_side_same.json"
    exit 0
  fi
  for s in smollm2-135m qwen3-0.6b llama-3.2-3b qwen2.5-7b; do shape_dir $s >/dev/null; done
  echo "== CUDA graph size sweep (decode tok/s, prompt 128, 256 tokens, llama-3.2-3b / qwen3-0.6b)"
  best=""; best_tps=0
  for ops in 20 40 80 160 250; do
    a=$(MLX_MAX_OPS_PER_BUFFER=$ops ./mlx-gen bench --model "$(shape_dir llama-3.2-3b)" -p 128 -g 256 -n 2 --json | python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['median']['generation_tps'])")
    b=$(MLX_MAX_OPS_PER_BUFFER=$ops ./mlx-gen bench --model "$(shape_dir qwen3-0.6b)" -p 128 -g 256 -n 2 --json | python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['median']['generation_tps'])")
    echo "MLX_MAX_OPS_PER_BUFFER=$ops: llama-3.2-3b $a, qwen3-0.6b $b"
    if python3 -c "import sys; sys.exit(0 if $a + 0.0 > $best_tps else 1)"; then best=$ops; best_tps=$a; fi
  done
  a=$(MLX_USE_CUDA_GRAPHS=0 ./mlx-gen bench --model "$(shape_dir llama-3.2-3b)" -p 128 -g 256 -n 2 --json | med)
  echo "MLX_USE_CUDA_GRAPHS=0: llama-3.2-3b $a"
  echo "MLX_MAX_OPS_PER_BUFFER=$best" > /tmp/mlxgen-tuned-env
  echo "== chosen for mlx-gen: MLX_MAX_OPS_PER_BUFFER=$best"
  python3 bench/side_by_side.py --mlx-gen ./mlx-gen --models "$models" -p 512 -g 256 -n 3 --rounds 3 \
      --pacing-tokens 1024 --mlx-gen-env "MLX_MAX_OPS_PER_BUFFER=$best" --out "$out/side_by_side.json"
  ;;
more)
  for s in smollm2-135m qwen3-0.6b llama-3.2-3b qwen2.5-7b; do
    d=$(shape_dir $s)
    echo "== $s fused:          $(env $tuned ./mlx-gen bench --model "$d" -p 512 -g 256 -n 3 --json | med)"
    echo "== $s separate:       $(env $tuned MLX_GEN_NO_FUSE=1 ./mlx-gen bench --model "$d" -p 512 -g 256 -n 3 --json | med)"
    echo "== $s paged cache:    $(env $tuned ./mlx-gen bench --model "$d" -p 512 -g 256 -n 3 --kv-cache paged --json | med)"
    echo "== $s p4096 mlx-gen:  $(env $tuned ./mlx-gen bench --model "$d" -p 4096 -g 16 -n 2 --json | med)"
    echo "== $s p4096 mlx-lm:   $(python3 bench/mlx_lm_bench.py --model "$d" -p 4096 -g 16 -n 2 | med)"
  done
  d=$(shape_dir llama-3.2-3b)
  echo "== llama-3.2-3b mlx-lm with $tuned too: $(env $tuned python3 bench/mlx_lm_bench.py --model "$d" -p 512 -g 256 -n 3 | med)"
  python3 bench/side_by_side.py --mlx-gen ./mlx-gen --models "$models" --shapes deepseek-v2-lite -p 512 -g 128 -n 2 \
      --rounds 1 --mlx-gen-env "$tuned"
  ;;
spec)
  gguf=${GGUF:-/tmp/model.gguf}
  [ -d /tmp/qc-bf16 ] || ./mlx-gen convert --model "$gguf" --dtype bfloat16 --mlx-path /tmp/qc-bf16
  [ -d /tmp/qc-q4 ] || ./mlx-gen convert --model /tmp/qc-bf16 -q --q-bits 4 --mlx-path /tmp/qc-q4
  env $tuned python3 bench/speculative.py --mlx-gen ./mlx-gen --model /tmp/qc-bf16 --draft /tmp/qc-q4 \
      --num-draft 2,3,4 --prompt-lookup 3 -g 256 --rounds 3 --out "$out/speculative.json"
  ;;
serve)
  d=$(shape_dir llama-3.2-3b)
  env $tuned python3 bench/server_load.py --mlx-gen ./mlx-gen --model "$d" --concurrency 1,8,32 --max-tokens 128 \
      --out "$out/server_load.json"
  d=$(shape_dir qwen2.5-7b)
  echo "== 2 ranks (ring, loopback) on one GPU vs one process, qwen2.5-7b shape, 64 greedy tokens"
  args=(generate --model "$d" --prompt "Write a story about a robot." -m 64 --temp 0 --ignore-chat-template --output json)
  env $tuned ./mlx-gen "${args[@]}" > /tmp/single.json
  env $tuned ./mlx-gen launch --hosts 127.0.0.1,127.0.0.1 --backend ring --timeout 120 -- "${args[@]}" > /tmp/tp2.json
  python3 - <<'EOF'
import json
a = json.load(open("/tmp/single.json")); b = json.load(open("/tmp/tp2.json"))
same = sum(x == y for x, y in zip(a["tokens"], b["tokens"]))
print(f"single: {a.get('generation_tps')} tok/s, tp2 ring: {b.get('generation_tps')} tok/s; "
      f"first {same} of {len(a['tokens'])} tokens equal" + (" (all)" if a["tokens"] == b["tokens"] else ""))
EOF
  env $tuned ./mlx-gen bench --model "$d" -p 512 -g 128 -n 2 --json | med
  env $tuned ./mlx-gen launch --hosts 127.0.0.1,127.0.0.1 --backend ring --timeout 120 -- bench --model "$d" -p 512 -g 128 -n 2 --json | med
  ;;
fallback)
  # Issue 19 item 3, the fallback's share of `round`: prompt lookup (K=4) on the code-editing prompt (high
  # acceptance) and on a random one (little to look up: it must go plain), each bench run against plain decoding.
  python3 bench/speculative.py --dump-prompt > /tmp/code_edit.txt
  for s in qwen3-0.6b llama-3.2-3b; do
    d=$(shape_dir $s)
    echo "== $s prompt lookup 3, K=4, code-editing prompt, with the fallback"
    ./mlx-gen bench -n 3 --model "$d" --prompt-file /tmp/code_edit.txt -g 256 --prompt-lookup 3 --num-draft-tokens 4 2>&1 | grep -E "^(Averages|Speculative)"
    echo "== $s prompt lookup 3, K=4, random prompt, with the fallback"
    ./mlx-gen bench -n 3 --model "$d" -p 512 -g 256 --prompt-lookup 3 --num-draft-tokens 4 2>&1 | grep -E "^(Averages|Speculative)"
  done
  ;;
serving)
  for s in qwen3-0.6b llama-3.2-3b; do
    d=$(shape_dir $s)
    echo "== $s: mlx-gen (MLX_GEN_TRACE) and mlx_lm.server, 1/8/32 streams, 128 tokens, ${ROUNDS:-2} rounds"
    env $tuned MLX_GEN_TRACE=1 python3 bench/server_load.py --mlx-gen ./mlx-gen --model "$d" --concurrency 1,8,32 \
        --max-tokens 128 --rounds ${ROUNDS:-2} --server-log "$out/serving-$s" --out "$out/serving-$s.json" \
        --mlx-gen-args "${SERVE_ARGS:-}"
    grep -E '^trace:|warmed up' "$out/serving-$s.mlx-gen.log" | tail -8
    if [ -n "${KB:-}" ]; then
      echo "== $s: mlx-gen with MLX_GEN_KEY_BUCKET=$KB at 8 and 32 streams, 1 round"
      MLX_GEN_KEY_BUCKET=$KB MLX_GEN_TRACE=1 timeout 120 python3 bench/server_load.py --server mlx-gen --mlx-gen ./mlx-gen \
          --model "$d" --concurrency 8,32 --max-tokens 128 --rounds 1 --server-log "$out/serving-kb-$s" | tail -3
      grep -E "^trace: engine" "$out/serving-kb-$s.mlx-gen.log" | tail -1
    fi
    if [ -n "${LA:-}" ]; then
      echo "== $s: mlx-gen with MLX_GEN_PREFILL_LOOKAHEAD=$LA (the CLI's CUDA default: serve's measure) and without, 1/8/32 streams"
      for la in "$LA" 0 "$LA" 0; do
        echo "-- MLX_GEN_PREFILL_LOOKAHEAD=$la"
        MLX_GEN_PREFILL_LOOKAHEAD=$la timeout 120 python3 bench/server_load.py --server mlx-gen --mlx-gen ./mlx-gen \
            --model "$d" --concurrency 1,8,32 --max-tokens 128 --rounds 1 | grep -E "streams:"
      done
    fi
    [ -n "${PS2048:-}" ] || continue
    echo "== $s: mlx-gen --prefill-step-size 2048"
    env $tuned python3 bench/server_load.py --server mlx-gen --mlx-gen ./mlx-gen --model "$d" --concurrency 1,8,32 \
        --max-tokens 128 --rounds 2 --mlx-gen-args "--prefill-step-size 2048" --out "$out/serving-$s-2048.json"
  done
  ;;
prompts)
  # Issue 20's 32 streams: how many prompts one prefill group takes (serve --prompt-concurrency, 8 as
  # mlx_lm.server) and the prompt positions a step (--prefill-step-size), mlx-gen alone at 1 and 32 streams,
  # alternating settings over 2 rounds; then the exit status of batch_step_cost --forward (its segfault at exit).
  for s in ${PROMPT_SHAPES:-llama-3.2-3b}; do
    d=$(shape_dir $s)
    for r in ${PROMPT_ROUNDS:-1 2}; do
      for a in "8 2048 1024" "16 2048 1024" "32 2048 1024" "32 4096 1024" "32 8192 1024" "8 2048 0" "32 4096 0"; do
        set -- $a
        tag=$s-$r-$1-$2-$3
        echo "-- $s round $r: --prompt-concurrency $1 --prefill-step-size $2 --prefix-cache-mb $3"
        env $tuned MLX_GEN_TRACE=1 timeout 150 python3 bench/server_load.py --server mlx-gen --mlx-gen ./mlx-gen --model "$d" \
            --concurrency 1,8,32 --max-tokens 128 --rounds 1 --server-log "$out/prompts-$tag" --out "$out/prompts-$tag.json" \
            --mlx-gen-args "--prompt-concurrency $1 --prefill-step-size $2 --prefix-cache-mb $3" | grep -E "streams:"
        grep -E "^trace: engine" "$out/prompts-$tag.mlx-gen.log" | tail -1
      done
    done
  done
  d=$(shape_dir llama-3.2-3b)
  ./batch_step_cost "$d" --forward 1 8 | tail -2; echo "batch_step_cost --forward exit status ${PIPESTATUS[0]}"
  ./batch_step_cost "$d" 1 8 | tail -1; echo "batch_step_cost exit status ${PIPESTATUS[0]}"
  ;;
big)
  python3 bench/side_by_side.py --mlx-gen ./mlx-gen --models "$models" --shapes qwen2.5-7b -p 512 -g 256 -n 3 \
      --rounds 3 --pacing-tokens 1024 --mlx-gen-env "MLX_MAX_OPS_PER_BUFFER=80" --out "$out/side_by_side_7b.json"
  d=$(shape_dir llama-3.2-3b)
  echo "== llama-3.2-3b mlx-lm with MLX_MAX_OPS_PER_BUFFER=80: $(MLX_MAX_OPS_PER_BUFFER=80 python3 bench/mlx_lm_bench.py --model "$d" -p 512 -g 256 -n 3 | med)"
  echo "== llama-3.2-3b mlx-gen (its default 80):          $(./mlx-gen bench --model "$d" -p 512 -g 256 -n 3 --json | med)"
  ;;
check)
  d=$(shape_dir qwen3-0.6b)
  p=$(python3 -c "print('one two three four five six seven eight nine ten ' * 30)")
  tps() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(round(d['generation_tps'],1), d.get('draft_tokens_accepted'), d.get('draft_tokens_proposed'))"; }
  echo "== plain:         $(./mlx-gen generate --model "$d" --prompt "$p" -m 200 --temp 0 --ignore-chat-template --output json | tps)"
  echo "== prompt lookup: $(./mlx-gen generate --model "$d" --prompt "$p" -m 200 --temp 0 --ignore-chat-template --prompt-lookup 3 --output json | tps)"
  echo "== growing:       $(./mlx-gen bench --model "$d" -p 512 -g 256 -n 2 --json | med)"
  echo "== paged:         $(./mlx-gen bench --model "$d" -p 512 -g 256 -n 2 --kv-cache paged --json | med)"
  [ -x ./batch_step_cost ] && ./batch_step_cost "$d" 1 8 32
  timeout 240 python3 bench/server_load.py --mlx-gen ./mlx-gen --model "$d" --server mlx-gen --concurrency 1,8,32 --max-tokens 64
  ;;
round)
  python3 bench/speculative.py --dump-prompt > /tmp/code_edit.txt
  d3=$(shape_dir llama-3.2-3b); d06=$(shape_dir qwen3-0.6b)
  b() { ./mlx-gen bench -n 3 "$@" 2>&1 | grep -E "^(Averages|Speculative|trace)"; }
  echo "== llama-3.2-3b drafting for itself, K=4, every round speculative (-p 128 -g 256)"
  b --model "$d3" -p 128 -g 256 --draft-model "$d3" --num-draft-tokens 4 --always-speculate
  echo "== the same with MLX_GEN_TRACE=1 (a device sync after the draft: stage split)"
  MLX_GEN_TRACE=1 b --model "$d3" -p 128 -g 256 --draft-model "$d3" --num-draft-tokens 4 --always-speculate
  echo "== the same, verification not padded (MLX_GEN_VERIFY_PAD=1): 5 positions instead of 8"
  MLX_GEN_VERIFY_PAD=1 b --model "$d3" -p 128 -g 256 --draft-model "$d3" --num-draft-tokens 4 --always-speculate
  MLX_GEN_TRACE=1 MLX_GEN_VERIFY_PAD=1 b --model "$d3" -p 128 -g 128 -n 1 --draft-model "$d3" --num-draft-tokens 4 --always-speculate
  echo "== the same, not padded, every weight's 5 rows through the few-row kernel (MLX_GEN_QMM_KERNEL=all)"
  MLX_GEN_QMM_KERNEL=all MLX_GEN_VERIFY_PAD=1 b --model "$d3" -p 128 -g 256 --draft-model "$d3" --num-draft-tokens 4 --always-speculate
  MLX_GEN_TRACE=1 MLX_GEN_QMM_KERNEL=all MLX_GEN_VERIFY_PAD=1 b --model "$d3" -p 128 -g 128 -n 1 --draft-model "$d3" --num-draft-tokens 4 --always-speculate
  echo "== plain decoding with every weight through the kernel, for the step's cost"
  MLX_GEN_QMM_KERNEL=all b --model "$d3" -p 128 -g 256
  for d in "$d06" "$d3"; do
    echo "== $(basename "$d") prompt lookup 3, K=4, code-editing prompt, pipelined rounds (MLX_GEN_SPEC_PIPELINE=1), every round"
    MLX_GEN_SPEC_PIPELINE=1 b --model "$d" --prompt-file /tmp/code_edit.txt -g 256 --prompt-lookup 3 --num-draft-tokens 4 --always-speculate
    for k in 4 8; do
      echo "== $(basename "$d") prompt lookup 3, K=$k, code-editing prompt, with the fallback / every round"
      b --model "$d" --prompt-file /tmp/code_edit.txt -g 256 --prompt-lookup 3 --num-draft-tokens $k
      b --model "$d" --prompt-file /tmp/code_edit.txt -g 256 --prompt-lookup 3 --num-draft-tokens $k --always-speculate
    done
    echo "== $(basename "$d") prompt lookup 3, K=4, random prompt (little to look up): with the fallback / every round"
    b --model "$d" -p 512 -g 256 --prompt-lookup 3 --num-draft-tokens 4
    b --model "$d" -p 512 -g 256 --prompt-lookup 3 --num-draft-tokens 4 --always-speculate
  done
  ;;
moe)
  # Issue 17's MoE shapes, both tools under the same MLX settings (MLX_MAX_OPS_PER_BUFFER=80 for both),
  # 3 alternating rounds; SHAPE=qwen3-30b-a3b (default) or mixtral-8x7b. KEEP=1 keeps the folder.
  # MLX 0.32.4's CUDA wheel cannot JIT-compile its 8-bit quantized matmul for prefill (the kernel
  # includes CUTLASS's cute headers, which the wheel does not ship), so qwen3_moe's 8-bit routers
  # fail in both tools there: the shape is made with every layer in 4 bits (--uniform).
  s=${SHAPE:-qwen3-30b-a3b}
  d=$(moe_dir "$s")
  MLX_MAX_OPS_PER_BUFFER=80 python3 bench/side_by_side.py --mlx-gen ./mlx-gen --models "$models" --shapes "$s" \
      -p 512 -g 256 -n 2 --rounds 3 --mlx-gen-env "MLX_MAX_OPS_PER_BUFFER=80" --out "$out/side_by_side_$s.json"
  step_split "$d"
  [ -n "${KEEP:-}" ] || rm -rf "$models/$s-4bit-bfloat16"
  ;;
hybrid)
  # Issue 18's hybrid shapes (gated DeltaNet + full attention), both tools under MLX_MAX_OPS_PER_BUFFER=80,
  # 3 alternating rounds at prompt 512 and 4096. KEEP=1 keeps the folder.
  # The MoE shape's routers and shared-expert gates are 8-bit by qwen3_5's quant_predicate, which MLX 0.32.4's CUDA
  # wheel cannot multiply for a prompt (see `moe`): that shape is made with every layer in 4 bits.
  s=${SHAPE:-qwen3.5-9b}
  d=$models/$s-4bit-bfloat16
  uni=(); [ "$s" != qwen3.5-35b-a3b ] || uni=(--uniform)
  [ -f "$d/config.json" ] || python3 bench/make_shape.py "$s" "$d" --bits 4 --dtype bfloat16 "${uni[@]}" >/dev/null
  for p in ${PROMPTS:-512 4096}; do
    rounds=${ROUNDS:-3}; [ "$p" -lt 4096 ] || rounds=${ROUNDS_4096:-$rounds}
    MLX_MAX_OPS_PER_BUFFER=80 python3 bench/side_by_side.py --mlx-gen ./mlx-gen --models "$models" --shapes "$s" \
        -p $p -g 256 -n 2 --rounds $rounds --mlx-gen-env "MLX_MAX_OPS_PER_BUFFER=80" --out "$out/side_by_side_${s}_p$p.json"
  done
  # GDN0=0 skips the run without the kernel (the 9B's figure is in BENCHMARKS.md).
  [ "${GDN0:-1}" = 0 ] || echo "== mlx-gen, the recurrence one compiled step per position (MLX_GEN_GDN_KERNEL=0), -p 512:" \
       "$(MLX_MAX_OPS_PER_BUFFER=80 MLX_GEN_GDN_KERNEL=0 ./mlx-gen bench --model "$d" -p 512 -g 256 -n 2 --json | med)"
  [ -n "${KEEP:-}" ] || rm -rf "$models/$s-4bit-bfloat16"
  ;;
fidelity)
  # Issue 22: mlx-gen's GPU tokens (fused and unfused) against mlx-lm's on the same GPU, greedy: the real
  # models stage-real-models.sh staged (joined into $REAL, default /tmp/real), then the random-weight shapes
  # SHAPES names (default: the small dense ones). Exits 1 when a split is not a near-tie.
  dirs=(); for d in "${REAL:-/tmp/real}"/*/; do [ -f "$d/config.json" ] && dirs+=("${d%/}"); done
  for s in ${SHAPES:-qwen3-0.6b llama-3.2-3b}; do dirs+=("$(shape_dir "$s")"); done
  python3 bench/gpu_fidelity.py --mlx-gen ./mlx-gen -m ${TOKENS:-256} "${dirs[@]}" | tee "$out/fidelity.jsonl"
  ;;
constrained)
  # Issue 21's cost: decode with a JSON schema (llguidance masks) against free decoding, Qwen3-0.6B shape with
  # Qwen2.5's real 151k-token vocabulary ($TOK holds tokenizer.json + tokenizer_config.json), 3 alternating
  # rounds of 256 tokens on the CLI, then the server at 1 and 8 streams, free and every request constrained.
  d=$models/qwen3-0.6b-qwentok
  [ -f "$d/config.json" ] || { python3 bench/make_shape.py qwen3-0.6b "$d" --bits 4 --dtype bfloat16 >/dev/null; cp "${TOK:-/tmp/tok}"/tokenizer*.json "$d/"; }
  echo '{"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}' > /tmp/schema.json
  tps() { python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['generation_tps'],1), d['generation_tokens'])"; }
  for r in ${CLI_ROUNDS-1 2 3}; do
    echo "round $r free:        $(./mlx-gen generate --model "$d" --prompt "Describe the sea" -m 256 --output json | tps)"
    echo "round $r json schema: $(./mlx-gen generate --model "$d" --prompt "Describe the sea" -m 256 --output json --json-schema /tmp/schema.json | tps)"
  done
  for r in ${SERVER_ROUNDS-1 2}; do
    timeout 150 python3 bench/server_load.py --mlx-gen ./mlx-gen --model "$d" --server mlx-gen --concurrency 1,8 --max-tokens 128 --out "$out/serve_free_$r.json" | tail -4
    timeout 150 python3 bench/server_load.py --mlx-gen ./mlx-gen --model "$d" --server mlx-gen --concurrency 1,8 --max-tokens 128 --json-schema /tmp/schema.json --out "$out/serve_schema_$r.json" | tail -4
  done
  # TRACE=1: the token mask by our kernel (words read from page-locked host memory) against MLX's operations
  # (MLX_GEN_MASK_KERNEL=0): greedy tokens and log-probabilities (each also against a second run of itself),
  # then where a token's time goes (MLX_GEN_TRACE: the wait for the token, the host's commit and mask, the
  # graphs), alternating rounds of free / JSON schema with each / a regex allowing every token (the engine's
  # masking without llguidance's work) on the CLI, then the server's engine at 8 streams.
  [ -n "${TRACE:-}" ] || exit 0
  rm -f /tmp/mk*.json
  for k in 0 0 1 1; do
    f=/tmp/mk$k.json; [ ! -f "$f" ] || f=/tmp/mk${k}b.json
    MLX_GEN_MASK_KERNEL=$k ./mlx-gen generate --model "$d" --prompt "Describe the sea" -m 256 --temp 0 --output json \
        --logprobs --json-schema /tmp/schema.json 2>/dev/null | tail -1 > "$f"
  done
  echo "== mask kernel against MLX's operations (JSON schema, greedy 256): $(same_tokens /tmp/mk0.json /tmp/mk1.json);" \
       "operations run twice: $(same_tokens /tmp/mk0.json /tmp/mk0b.json); kernel run twice: $(same_tokens /tmp/mk1.json /tmp/mk1b.json)"
  cli() {
    local label=$1 k=$2 out; shift 2
    out=$(MLX_GEN_MASK_KERNEL=$k MLX_GEN_TRACE=1 ./mlx-gen generate --model "$d" --prompt "Describe the sea" -m 256 \
        --output json "$@" 2>/tmp/cli.err | tps)
    echo "== round $r $label MLX_GEN_MASK_KERNEL=$k: $out | $(grep -E '^trace: [0-9]+ tokens' /tmp/cli.err)"
  }
  for r in ${TRACE_CLI_ROUNDS-1 2 3}; do
    cli free 1
    cli schema 1 --json-schema /tmp/schema.json
    cli schema 0 --json-schema /tmp/schema.json
    cli any 1 --regex '[\s\S]*'
  done
  # The server's engine at 8 streams: free, constrained with the mask kernel, constrained with MLX's operations
  # (MLX_GEN_MASK_KERNEL=0), TRACE_SERVER_ROUNDS alternating rounds.
  server8 MLX_GEN_MASK_KERNEL "${TRACE_SERVER_ROUNDS-1 2}" "$out/constrained-trace"
  ;;
mailbox)
  # Issue 21 at 8 streams: a constrained step's sampling and the forward pass over its tokens in one evaluation,
  # the tokens read through the mailbox (default), against the sampling in an evaluation of its own
  # (MLX_GEN_MAILBOX=0), and free decoding; Qwen3-0.6B shape with Qwen2.5's vocabulary as `constrained`. Greedy
  # tokens on vs off, then MB_CLI_ROUNDS alternating CLI rounds (256 tokens) and MB_ROUNDS server rounds at 8
  # streams (128 tokens), each with the trace (the wait for the tokens, the host's build+queue and masks).
  d=$models/qwen3-0.6b-qwentok
  [ -f "$d/config.json" ] || { python3 bench/make_shape.py qwen3-0.6b "$d" --bits 4 --dtype bfloat16 >/dev/null; cp "${TOK:-/tmp/tok}"/tokenizer*.json "$d/"; }
  echo '{"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}' > /tmp/schema.json
  tps() { python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['generation_tps'],1), d['generation_tokens'])"; }
  for m in 1 0; do
    MLX_GEN_MAILBOX=$m ./mlx-gen generate --model "$d" --prompt "Describe the sea" -m 256 --temp 0 --output json \
        --json-schema /tmp/schema.json 2>/dev/null | tail -1 > "$out/mailbox-$m.json"
  done
  echo "== JSON schema, greedy 256, mailbox on against off: $(same_tokens "$out/mailbox-1.json" "$out/mailbox-0.json")"
  for r in ${MB_CLI_ROUNDS-1 2 3}; do
    for a in free:1 schema:1 schema:0; do
      extra=(); [ "${a%%:*}" = free ] || extra=(--json-schema /tmp/schema.json)
      o=$(MLX_GEN_MAILBOX=${a##*:} MLX_GEN_TRACE=1 ./mlx-gen generate --model "$d" --prompt "Describe the sea" -m 256 \
          --output json "${extra[@]}" 2>/tmp/cli.err | tps)
      echo "== round $r CLI ${a%%:*} MLX_GEN_MAILBOX=${a##*:}: $o | $(grep -E '^trace: [0-9]+ tokens' /tmp/cli.err)"
    done
  done
  server8 MLX_GEN_MAILBOX "${MB_ROUNDS-1 2 3}" "$out/mailbox"
  ;;
stall)
  # Issue 20 item 2's regression on the GPU: 10 rounds of 8 streams (every 4th prompt long, arrivals 50 ms
  # apart, every round's prompts longer), worst round TTFT against the median round's (target <= 3x).
  for s in qwen3-0.6b llama-3.2-3b; do
    echo "== $s: 10 rounds of 8 streams, mlx-gen"
    timeout 200 python3 bench/server_load.py --server mlx-gen --mlx-gen ./mlx-gen --model "$(shape_dir $s)" \
        --concurrency 8 --rounds 10 --max-tokens 64 --long-every 4 --long-prompt-words 600 --stagger-ms 50 \
        --vary-words 5 --out "$out/stall-$s.json" | tail -5
  done
  ;;
memory)
  # Issue 22 item 4: peak memory of both tools (same MLX settings), mlx-gen's `bench --memory` breakdown, prompt
  # 4096 on the Llama-3.2-3B shape and 512 on Qwen3-0.6B.
  for sp in llama-3.2-3b:4096 qwen3-0.6b:512; do
    s=${sp%%:*}; p=${sp##*:}; d=$(shape_dir $s)
    for r in ${MEM_ROUNDS:-1 2}; do
      echo "== $s p$p round $r mlx-gen: $(MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$d" -p $p -g 16 -n 2 --json | med)"
      echo "== $s p$p round $r mlx-lm:  $(MLX_MAX_OPS_PER_BUFFER=80 python3 bench/mlx_lm_bench.py --model "$d" -p $p -g 16 -n 2 | med)"
    done
    MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$d" -p $p -g 16 -n 1 --memory 2>&1 | grep -iE "memory|peak|weights|cache|transient" | head -20
  done
  # Which GPU-only path holds the prefill's extra transient (the CPU's peaks are mlx-lm's): unfused projections,
  # smaller prefill chunks, and MLX's attention without cuDNN in both tools.
  d=$(shape_dir llama-3.2-3b)
  for v in MLX_GEN_NO_FUSE=1 "MLX_GEN_NO_FUSE=1 MLX_CUDA_USE_CUDNN_SDPA=0" MLX_CUDA_USE_CUDNN_SDPA=0; do
    echo "== llama-3.2-3b p4096 mlx-gen $v: $(env $v MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$d" -p 4096 -g 16 -n 1 --memory 2>&1 | grep '^Memory')"
  done
  echo "== llama-3.2-3b p4096 mlx-lm MLX_CUDA_USE_CUDNN_SDPA=0: $(MLX_CUDA_USE_CUDNN_SDPA=0 MLX_MAX_OPS_PER_BUFFER=80 python3 bench/mlx_lm_bench.py --model "$d" -p 4096 -g 16 -n 1 | med)"
  echo "== llama-3.2-3b p4096 mlx-gen --prefill-step-size 512: $(MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$d" -p 4096 -g 16 -n 1 --prefill-step-size 512 --memory 2>&1 | grep '^Memory')"
  # One chunk (no cache offset) against two, in both tools, and one 4095-position chunk: is the excess the second
  # chunk's attention over a cache it did not write?
  echo "== llama-3.2-3b p2048 mlx-gen: $(MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$d" -p 2048 -g 16 -n 1 --memory 2>&1 | grep '^Memory')"
  echo "== llama-3.2-3b p2048 mlx-lm:  $(MLX_MAX_OPS_PER_BUFFER=80 python3 bench/mlx_lm_bench.py --model "$d" -p 2048 -g 16 -n 1 | med)"
  echo "== llama-3.2-3b p4096 mlx-gen --prefill-step-size 4096: $(MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$d" -p 4096 -g 16 -n 1 --prefill-step-size 4096 --memory 2>&1 | grep '^Memory')"
  # The host queueing at most N layers ahead of the device inside a prefill chunk (MLX keeps each queued kernel's
  # arrays until it ran): peak and prefill speed against the unbounded default above.
  for n in 2 4 8; do
    echo "== llama-3.2-3b p4096 mlx-gen MLX_GEN_PREFILL_LOOKAHEAD=$n: $(MLX_GEN_PREFILL_LOOKAHEAD=$n MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$d" -p 4096 -g 16 -n 2 --memory 2>&1 | grep -E '^(Averages|Memory)' | tr '\n' ' ')"
  done
  ;;
realspec)
  # Issue 19 with real weights: Qwen2.5-Coder-0.5B-Instruct (stage-real-models.sh's 4-bit folder, the draft)
  # dequantized to bfloat16 by mlx_lm.convert -d (the target); the code-editing prompt (high acceptance), then a
  # free-form one (low acceptance: the never-slower check), then the server with --draft-model at 1 stream.
  q4=${REAL:-/tmp/real}/qwen2.5-coder-0.5b-instruct
  [ -f /tmp/qc-bf16/config.json ] || python3 -m mlx_lm convert --hf-path "$q4" -d --mlx-path /tmp/qc-bf16 >/dev/null
  python3 bench/speculative.py --mlx-gen ./mlx-gen --model /tmp/qc-bf16 --draft "$q4" --num-draft 2,3,4 \
      --prompt-lookup 3 -g 256 --rounds 3 --out "$out/speculative_real.json"
  echo "Write a short story about a fox who learns to sail, with dialogue, in the style of a fairy tale." > /tmp/story.txt
  echo "== free-form prompt"
  python3 bench/speculative.py --mlx-gen ./mlx-gen --model /tmp/qc-bf16 --draft "$q4" --num-draft 3 \
      --prompt-lookup 3 -g 256 --rounds 2 --prompt-file /tmp/story.txt --out "$out/speculative_real_story.json"
  for a in "" "--draft-model $q4 --num-draft-tokens 3"; do
    echo "== serve /tmp/qc-bf16 $a, 1 stream, 2 rounds"
    timeout 120 python3 bench/server_load.py --server mlx-gen --mlx-gen ./mlx-gen --model /tmp/qc-bf16 \
        --concurrency 1 --rounds 2 --max-tokens 128 --mlx-gen-args "$a" | tail -3
  done
  ;;
diag)
  # Where the time goes (issues 17, 20, 22): a decode step's split in both tools on the dense shapes; the batch
  # engine's newcomers' prefill (ROWSxLEN@STEP: rows at once, STEP padded positions a step) against one row.
  for s in qwen3-0.6b llama-3.2-3b; do step_split "$(shape_dir $s)"; done
  MLX_GEN_TRACE=1 ./batch_step_cost "$(shape_dir qwen3-0.6b)" 1 8 32
  # Is the batch step's growth in MLX's queueing (2.9 -> 9.8 ms from 1 to 32 rows, sixth lease) the CUDA graphs
  # rebuilt for the composed attention's key length growing every step? Keys in buckets, and no CUDA graphs:
  echo "== MLX_GEN_KEY_BUCKET=256"; MLX_GEN_KEY_BUCKET=256 MLX_GEN_TRACE=1 ./batch_step_cost "$(shape_dir qwen3-0.6b)" 1 8 32
  echo "== MLX_USE_CUDA_GRAPHS=0"; MLX_USE_CUDA_GRAPHS=0 MLX_GEN_TRACE=1 ./batch_step_cost "$(shape_dir qwen3-0.6b)" 1 8 32
  MLX_GEN_TRACE=1 timeout 200 ./batch_step_cost "$(shape_dir qwen3-0.6b)" --prefill 1x256 1x2048 8x256@512 8x256@2048 \
      8x256@8192 32x256@2048 32x256@8192 2>&1 | grep -E "trial [02]|rror"
  ;;
fusednorm)
  # The residual add fused with the RMS norm after it (MLX_GEN_FUSED_NORM=1: one kernel for two, twice a layer).
  # First its rounding: greedy tokens and log-probabilities with and without it, 64 tokens, on shapes whose
  # hidden sizes take each of MLX's rms_norm launch shapes (576, 1024, 3072, 3584; the real models too when
  # $REAL has them): equal log-probabilities mean bit-for-bit MLX's two kernels. Then decode and prefill,
  # alternating, 3 rounds, same MLX settings (FN_SHAPES to choose).
  dirs=(); for d in "${REAL:-/tmp/real}"/*/; do [ -f "$d/config.json" ] && dirs+=("${d%/}"); done
  for s in ${FN_SHAPES:-smollm2-135m qwen3-0.6b llama-3.2-3b qwen2.5-7b}; do dirs+=("$(shape_dir "$s")"); done
  for d in "${dirs[@]}"; do
    for f in 0 1; do
      MLX_GEN_FUSED_NORM=$f ./mlx-gen generate --model "$d" --prompt "The capital of France is" -m 64 --temp 0 \
        --ignore-chat-template --output json --logprobs 2>/dev/null | tail -1 > "/tmp/fn$f.json"
    done
    echo "== $(basename "$d") fused norm against MLX's two kernels: $(same_tokens /tmp/fn0.json /tmp/fn1.json)"
  done
  for s in ${FN_SHAPES:-qwen3-0.6b llama-3.2-3b qwen2.5-7b}; do
    d=$(shape_dir "$s")
    for r in 1 2 3; do
      for f in 0 1; do
        echo "== $s round $r MLX_GEN_FUSED_NORM=$f: $(MLX_GEN_FUSED_NORM=$f MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$d" -p 512 -g 256 -n 2 --json | med)"
      done
    done
  done
  ;;
pgemm)
  # Prefill's products (issue 22 item 2: prefill >= 1.5x mlx-lm's): MLX's quantized product against the weight
  # dequantized and multiplied by cuBLAS, by rows (prefill_gemm.py; PG_PROBE=0 skips it); then greedy tokens and
  # log-probabilities with the dequantized prefill (the default on CUDA) against MLX_GEN_PREFILL_GEMM=0, and prefill /
  # decode alternating, 3 rounds, prompt 512 and 2048 (PG_SHAPES, PG_PROMPTS), same MLX settings.
  [ "${PG_PROBE:-1}" = 0 ] || python3 bench/prefill_gemm.py
  for s in ${PG_SHAPES:-llama-3.2-3b qwen3-0.6b}; do
    d=$(shape_dir "$s")
    for g in 0 1; do
      MLX_GEN_PREFILL_GEMM=$g ./mlx-gen generate --model "$d" --prompt "$(python3 -c "print(' '.join(['The history of the city'] * 150))")" \
        -m 64 --temp 0 --ignore-chat-template --output json --logprobs 2>/dev/null | tail -1 > "/tmp/pg$g.json"
    done
    echo "== $s dequantized prefill against MLX's product: $(same_tokens /tmp/pg0.json /tmp/pg1.json)"
    for p in ${PG_PROMPTS:-512 2048}; do
      for r in 1 2 3; do
        for g in 0 1; do
          echo "== $s p$p round $r MLX_GEN_PREFILL_GEMM=$g: $(MLX_GEN_PREFILL_GEMM=$g MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$d" -p "$p" -g 64 -n 2 --json | med)"
        done
      done
    done
  done
  ;;
prefill)
  # Issue 22's prefill and peak targets side by side (>= 1.5x mlx-lm at prompt 512, >= 1.2x at 4096, peak <= 0.8x),
  # with the dequantized prefill on by default (chunks of 1,024+ rows): mlx-gen, mlx-gen with the dequantized product
  # from 512 rows (MLX_GEN_PREFILL_GEMM_ROWS=512, prompt 512 only) and mlx-lm, alternating, same MLX settings
  # (PF_SHAPES, PF_PROMPTS, PF_ROUNDS). First the tokens with the dequantized product from 128 rows against none.
  for s in ${PF_SHAPES:-llama-3.2-3b qwen3-0.6b}; do
    d=$(shape_dir "$s")
    for g in "MLX_GEN_PREFILL_GEMM=0" "MLX_GEN_PREFILL_GEMM_ROWS=128"; do
      env $g ./mlx-gen generate --model "$d" --prompt "$(python3 -c "print(' '.join(['The history of the city'] * 150))")" \
        -m 64 --temp 0 --ignore-chat-template --output json --logprobs 2>/dev/null | tail -1 > "/tmp/pf-${g%%=*}.json"
    done
    echo "== $s dequantized products from 128 rows against none: $(same_tokens /tmp/pf-MLX_GEN_PREFILL_GEMM.json /tmp/pf-MLX_GEN_PREFILL_GEMM_ROWS.json)"
    for p in ${PF_PROMPTS:-512 4096}; do
      for r in ${PF_ROUNDS:-1 2 3}; do
        echo "== $s p$p round $r mlx-gen: $(MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$d" -p "$p" -g 16 -n 2 --json | med)"
        [ "$p" = 512 ] && echo "== $s p$p round $r mlx-gen ROWS=512: $(MLX_GEN_PREFILL_GEMM_ROWS=512 MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$d" -p "$p" -g 16 -n 2 --json | med)"
        echo "== $s p$p round $r mlx-lm:  $(MLX_MAX_OPS_PER_BUFFER=80 python3 bench/mlx_lm_bench.py --model "$d" -p "$p" -g 16 -n 2 | med)"
      done
    done
  done
  ;;
pfsweep)
  # Issue 22's prefill at prompt 512: time to the first token against the prompt's length in both tools (same MLX
  # settings, alternating, SW_ROUNDS), to split a prompt's time into a fixed part and a part per position; mlx-gen
  # also without clearing MLX's buffer cache (MLX_GEN_CLEAR_CACHE=0: the next forward pass allocates every buffer
  # again after a clear), clearing only past 1 GiB cached (=1g), and without the prefill's lookahead bound (MLX_GEN_PREFILL_LOOKAHEAD=0), with the trace.
  d=$(shape_dir "${SW_SHAPE:-llama-3.2-3b}")
  for r in ${SW_ROUNDS:-1 2}; do
    for p in ${SW_PROMPTS:-16 128 512 2048}; do
      for v in "" MLX_GEN_CLEAR_CACHE=0 MLX_GEN_CLEAR_CACHE=1g MLX_GEN_PREFILL_LOOKAHEAD=0; do
        echo "== p$p round $r mlx-gen ${v:-default}: $(env $v MLX_MAX_OPS_PER_BUFFER=80 MLX_GEN_TRACE=1 ./mlx-gen bench --model "$d" -p "$p" -g 4 -n 3 --json 2>/tmp/sw.err | med) | $(grep -E '^trace: prefill' /tmp/sw.err | tail -1)"
      done
      echo "== p$p round $r mlx-lm: $(MLX_MAX_OPS_PER_BUFFER=80 python3 bench/mlx_lm_bench.py --model "$d" -p "$p" -g 4 -n 3 | med)"
    done
  done
  ;;
gdnjit)
  # The gated-delta recurrence launched by our primitive (jit.cpp, the default, MLX_GEN_GDN_JIT=1) against MLX's cuda_kernel (=0):
  # greedy tokens and log-probabilities (the same arithmetic: equal means bit for bit), then decode and prefill
  # alternating, 3 rounds (GDN_ROUNDS; "" for the tokens alone), prompt 512 (GDN_SHAPES: a shape `hybrid` kept with
  # KEEP=1 is taken as it is).
  for s in ${GDN_SHAPES:-qwen3.5-9b}; do
    d=$(shape_dir "$s")
    for j in 0 1; do
      MLX_GEN_GDN_JIT=$j ./mlx-gen generate --model "$d" --prompt "The capital of France is" -m 64 --temp 0 \
        --ignore-chat-template --output json --logprobs 2>/dev/null | tail -1 > "/tmp/gdn$j.json"
    done
    echo "== $s our recurrence launch against MLX's cuda_kernel: $(same_tokens /tmp/gdn0.json /tmp/gdn1.json)"
    for r in ${GDN_ROUNDS-1 2 3}; do
      for j in 0 1; do
        echo "== $s round $r MLX_GEN_GDN_JIT=$j: $(MLX_GEN_GDN_JIT=$j MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$d" -p 512 -g 256 -n 2 --json | med)"
      done
    done
  done
  ;;
qmm)
  # MLX's quantized product by row count (a batch step's rows, a verification's positions): 2-7 rows against 8,
  # padded to 8, and with a batch axis (issues 19, 20; BENCHMARKS.md 2026-12-06).
  python3 bench/qmm_rows.py
  # The engine's batch step at 1-8 and 32 rows (quantized products of (B, in), not (B, 1, in)).
  ./batch_step_cost "$(shape_dir qwen3-0.6b)" 1 2 4 7 8 32
  ./batch_step_cost "$(shape_dir llama-3.2-3b)" 1 8 32
  ;;
next)
  # What was built after the sixth lease, first on a fresh machine: the composed attention with each kv head's
  # query-head group folded into the query positions (it broadcast k/v, which MLX's CUDA matmul ran as one cuBLAS
  # product per row and kv head): the batch step at 1/8/32 rows on both dense shapes (sixth lease, Qwen3-0.6B:
  # 3.74 / 5.74 / 11.72 ms) and with MLX_GEN_KEY_BUCKET=256; a verification round (Llama-3.2-3B drafting for
  # itself, K=4: verify 11.1-11.6 ms against 3.3-3.7 for a plain step at the third lease); MLX_GEN_GDN_NOFMA's
  # fidelity. The server's figures: `serving` (KB=256 adds mlx-gen with the key bucket).
  d06=$(shape_dir qwen3-0.6b); d3=$(shape_dir llama-3.2-3b)
  for d in "$d06" "$d3"; do
    echo "== $(basename "$d") batch step"; MLX_GEN_TRACE=1 ./batch_step_cost "$d" 1 8 32
    echo "== $(basename "$d") batch step, MLX_GEN_KEY_BUCKET=256"; MLX_GEN_KEY_BUCKET=256 MLX_GEN_TRACE=1 ./batch_step_cost "$d" 1 8 32
  done
  echo "== llama-3.2-3b drafting for itself, K=4, every round speculative, MLX_GEN_TRACE=1 (stage split)"
  MLX_GEN_TRACE=1 ./mlx-gen bench -n 3 --model "$d3" -p 128 -g 256 --draft-model "$d3" --num-draft-tokens 4 --always-speculate 2>&1 | grep -E "^(Averages|Speculative|trace)"
  d35=$(shape_dir qwen3.5-2b)
  for nf in 0 1; do
    echo "== qwen3.5-2b GPU tokens against mlx-lm's, the recurrence kernel with MLX_GEN_GDN_NOFMA=$nf (1: no FMAs)"
    MLX_GEN_GDN_NOFMA=$nf timeout 150 python3 bench/gpu_fidelity.py --mlx-gen ./mlx-gen -m 64 "$d35" | cut -c1-300
  done
  ;;
qmmk)
  # Our kernels for a few rows or positions against MLX's: the quantized product of 2-32 rows
  # (MLX_GEN_QMM_KERNEL=1: a batch step's rows, a verification's positions) and the few-position attention
  # (MLX_GEN_ATTN_KERNEL=1: the batch step's masked attention, a verification's causal one). First each
  # kernel's error and time against MLX's, then the engine with neither, the product, and both, alternating:
  # the batch step at 1-32 rows on both dense shapes, a verification round (Llama-3.2-3B drafting for
  # itself, K=4, every round), prompt lookup K=8 on the code-editing prompt (QK_ROUNDS, default "1 2").
  ./batch_step_cost --qmm
  ./batch_step_cost --attn
  python3 bench/speculative.py --dump-prompt > /tmp/code_edit.txt
  cfgs=("MLX_GEN_QMM_KERNEL=0 MLX_GEN_ATTN_KERNEL=0" "MLX_GEN_QMM_KERNEL=1 MLX_GEN_ATTN_KERNEL=0" "MLX_GEN_QMM_KERNEL=1 MLX_GEN_ATTN_KERNEL=1")
  for s in qwen3-0.6b llama-3.2-3b; do
    d=$(shape_dir $s)
    for c in "${cfgs[@]}"; do echo "== $s batch step, $c"; env $c MLX_GEN_TRACE=1 ./batch_step_cost "$d" 1 2 4 8 16 32; done
  done
  d3=$(shape_dir llama-3.2-3b)
  for r in ${QK_ROUNDS:-1 2}; do
    for c in "${cfgs[@]}"; do
      echo "== round $r llama-3.2-3b drafting for itself K=4, $c: $(env $c ./mlx-gen bench -n 3 --model "$d3" -p 128 -g 256 --draft-model "$d3" --num-draft-tokens 4 --always-speculate 2>&1 | grep -E '^Speculative' | tail -1)"
      for s in llama-3.2-3b qwen3-0.6b; do
        echo "== round $r $s prompt lookup K=8, $c: $(env $c ./mlx-gen bench -n 3 --model "$(shape_dir $s)" --prompt-file /tmp/code_edit.txt -g 256 --prompt-lookup 3 --num-draft-tokens 8 2>&1 | grep -E '^(Averages|Speculative)' | tr '\n' ' ')"
      done
    done
  done
  ;;
jit)
  # The few-row kernels compiled once and launched through MLX's precompiled_cuda_kernel (jit.cpp) against the
  # previous binary, ./mlx-gen-old (MLX's cuda_kernel: the source text written again each call): the products'
  # error and time, then decode (prompt 512, 256 tokens) with the default and with every weight through the
  # kernel, binaries alternating (JIT_ROUNDS, default "1 2 3"; JIT_SHAPES), then each binary's host split.
  ./batch_step_cost --qmm 1 2 4
  for r in ${JIT_ROUNDS:-1 2 3}; do
    for s in ${JIT_SHAPES:-llama-3.2-3b qwen3-0.6b qwen2.5-7b}; do
      d=$(shape_dir $s)
      for k in default all; do
        kv=(); [ "$k" = default ] || kv=(MLX_GEN_QMM_KERNEL=$k)
        for b in mlx-gen mlx-gen-old; do
          echo "== round $r $s $b $k: $(env "${kv[@]}" ./$b bench --model "$d" -p 512 -g 256 -n 2 --json | med)"
        done
      done
    done
  done
  for s in ${JIT_SHAPES:-llama-3.2-3b qwen3-0.6b qwen2.5-7b}; do
    for b in mlx-gen mlx-gen-old; do
      echo "== $s $b host split: $(MLX_GEN_TRACE=1 ./$b bench --model "$(shape_dir $s)" -p 128 -g 256 -n 1 2>&1 | grep '^trace:' | tail -1)"
    done
  done
  ;;
qmvcols)
  for c in 4 2 8 1; do echo "== MLX_GEN_QMM_COLS=$c"; MLX_GEN_QMM_COLS=$c ./batch_step_cost --qmm 1 2 4 7; done
  ;;
gather)
  ./batch_step_cost --gather 1 2 4
  d=$(moe_dir "${SHAPE:-mixtral-8x7b}")
  alternate MLX_GEN_GATHER_KERNEL "${GATHER_ROUNDS:-1 2}" "$d" -p 512 -g 256 -n 2
  [ -n "${KEEP:-}" ] || rm -rf "$d"
  ;;
auto)
  for r in ${AUTO_ROUNDS:-1 2}; do
    for s in ${AUTO_SHAPES:-qwen2.5-7b llama-3.2-3b}; do
      d=$(shape_dir $s)
      echo "== round $r $s default: $(./mlx-gen bench --model "$d" -p 512 -g 256 -n 2 --json | med)"
      echo "== round $r $s MLX_GEN_QMM_KERNEL=0: $(MLX_GEN_QMM_KERNEL=0 ./mlx-gen bench --model "$d" -p 512 -g 256 -n 2 --json | med)"
    done
  done
  ;;
qmv)
  ./batch_step_cost --qmm 1 2 4 7
  for r in ${QV_ROUNDS:-1 2 3}; do
    for s in ${QV_SHAPES:-qwen2.5-7b llama-3.2-3b qwen3-0.6b}; do
      d=$(shape_dir $s)
      for k in 0 1 all; do
        echo "== round $r $s MLX_GEN_QMM_KERNEL=$k: $(MLX_GEN_QMM_KERNEL=$k ./mlx-gen bench --model "$d" -p 512 -g 256 -n 2 --json | med)"
      done
    done
  done
  ;;
qmvside)
  shapes=${QV_SHAPES:-qwen2.5-7b llama-3.2-3b qwen3-0.6b}
  for s in $shapes; do shape_dir $s >/dev/null; done
  MLX_MAX_OPS_PER_BUFFER=80 python3 bench/side_by_side.py --mlx-gen ./mlx-gen --models "$models" --shapes ${shapes// /,} \
      -p 512 -g 256 -n 2 --rounds 3 --mlx-gen-env "MLX_GEN_QMM_KERNEL=${QV:-1},MLX_MAX_OPS_PER_BUFFER=80" \
      --out "$out/side_by_side_qmv.json"
  dirs=(); for s in $shapes; do dirs+=("$(shape_dir $s)"); done
  MLX_GEN_QMM_KERNEL=${QV:-1} python3 bench/gpu_fidelity.py --mlx-gen ./mlx-gen -m 256 "${dirs[@]}" | tee "$out/fidelity-qmv.jsonl"
  for k in 0 ${QV:-1}; do echo "== llama-3.2-3b batch step, MLX_GEN_QMM_KERNEL=$k"; MLX_GEN_QMM_KERNEL=$k ./batch_step_cost "$(shape_dir llama-3.2-3b)" 1 2 4 8; done
  ;;
kserve)
  # The server with our few-row kernels (MLX_GEN_QMM_KERNEL=1 MLX_GEN_ATTN_KERNEL=1) and without, alternating,
  # 1/8/32 streams, 128 tokens (issue 20's 32-vs-1 scaling); KR rounds (default "1 2"), then the engine trace.
  for s in ${KS_SHAPES:-qwen3-0.6b llama-3.2-3b}; do
    d=$(shape_dir $s)
    for r in ${KR:-1 2}; do
      for k in 0 1; do
        echo "-- $s round $r, kernels $k"
        MLX_GEN_QMM_KERNEL=$k MLX_GEN_ATTN_KERNEL=$k MLX_GEN_TRACE=1 timeout 150 python3 bench/server_load.py --server mlx-gen \
            --mlx-gen ./mlx-gen --model "$d" --concurrency 1,8,32 --max-tokens 128 --rounds 1 \
            --server-log "$out/kserve-$s-$r-$k" 2>&1 | grep -E "streams:"
        grep -E "^trace: engine" "$out/kserve-$s-$r-$k.mlx-gen.log" | tail -1
      done
    done
  done
  ;;
why)
  # Where the fixed costs are (issues 19, 20), each knob against the default in one call: the segmentation
  # fault batch_step_cost met at exit after Qwen3-0.6B runs (its native stack); one forward pass of L positions,
  # unpipelined, keys fixed and growing (a verification's cost against a step's); the batch step at 1/8/32 rows
  # with the stage split (2 alternating rounds); the self-drafting round's split. Knobs: default, the composed
  # attention's keys in buckets of 256, no CUDA graphs, our few-position attention kernel. Then Llama-3.2-3B
  # decode, default against every weight through the few-row kernel (3 alternating rounds).
  d06=$(shape_dir qwen3-0.6b); d3=$(shape_dir llama-3.2-3b)
  echo "== batch_step_cost's exit after Qwen3-0.6B, with the crash trace"
  MLX_GEN_CRASH_TRACE=1 ./batch_step_cost "$d06" 1 8 2>&1 | tail -40; echo "exit status ${PIPESTATUS[0]}"
  knobs=("" "MLX_GEN_KEY_BUCKET=256" "MLX_USE_CUDA_GRAPHS=0" "MLX_GEN_ATTN_KERNEL=1")
  for d in "$d3" "$d06"; do
    for kn in "${knobs[@]}"; do echo "-- $(basename "$d") forward ${kn:-default}"; env $kn ./batch_step_cost "$d" --forward 1 5 8 9; done
  done
  for r in 1 2; do
    for kn in "${knobs[@]}"; do echo "-- llama-3.2-3b batch step round $r ${kn:-default}"; env $kn MLX_GEN_TRACE=1 ./batch_step_cost "$d3" 1 8 32; done
  done
  for kn in "${knobs[@]}"; do
    echo "-- llama-3.2-3b drafting for itself, K=4, ${kn:-default}"
    env $kn MLX_GEN_TRACE=1 ./mlx-gen bench -n 1 --model "$d3" -p 128 -g 256 --draft-model "$d3" --num-draft-tokens 4 \
        --always-speculate 2>&1 | grep -E "^(Speculative|trace: [0-9]+ rounds)"
  done
  for r in 1 2 3; do
    for k in default all; do
      kv=(); [ "$k" = default ] || kv=(MLX_GEN_QMM_KERNEL=$k)
      echo "-- llama-3.2-3b decode round $r MLX_GEN_QMM_KERNEL=$k: $(env "${kv[@]}" ./mlx-gen bench --model "$d3" -p 512 -g 256 -n 2 --json | med)"
    done
  done
  ;;
graphs)
  # MLX's CUDA graphs against direct launches (MLX_USE_CUDA_GRAPHS=0) where decode is host-bound on MLX's queueing
  # of kernels: Qwen3-0.6B, Llama-3.2-3B, DeepSeek-V2-Lite decode at prompt 512 (GRAPH_ROUNDS alternating rounds).
  for d in "$(shape_dir qwen3-0.6b)" "$(shape_dir llama-3.2-3b)" "$(moe_dir deepseek-v2-lite)"; do
    alternate MLX_USE_CUDA_GRAPHS "${GRAPH_ROUNDS:-1 2}" "$d" -p 512 -g 256 -n 2
  done
  ;;
grouped)
  # A prompt's experts one expert at a time (MLX_GEN_MOE_GROUPED=1) against MLX's sorted gathered product (issue
  # 17's prefill): greedy tokens and log-probabilities of a 64-token continuation of a long prompt, then prefill
  # at 512 in GROUPED_ROUNDS alternating rounds; first the load's split (SHAPE, default mixtral-8x7b; KEEP=1).
  s=${SHAPE:-mixtral-8x7b}; d=$(moe_dir "$s")
  for t in 8 1 4 16; do
    echo "== $s load, MLX_GEN_LOAD_THREADS=$t: $(MLX_GEN_LOAD_THREADS=$t MLX_GEN_TRACE=1 ./mlx-gen generate --model "$d" --prompt hi -m 1 2>&1 | grep 'trace: load' | head -1)"
  done
  python3 bench/speculative.py --dump-prompt > /tmp/code_edit.txt
  for g in 0 1; do
    MLX_GEN_MOE_GROUPED=$g ./mlx-gen generate --model "$d" --prompt "$(head -c 3000 /tmp/code_edit.txt)" -m 64 --temp 0 \
        --output json --logprobs > "$out/grouped-$s-$g.json" 2>/dev/null
  done
  echo "== $s grouped against gathered: $(same_tokens "$out/grouped-$s-0.json" "$out/grouped-$s-1.json")"
  # The gathered decode kernel (on by default) against MLX's gathered product, same prompt and tokens.
  MLX_GEN_GATHER_KERNEL=0 ./mlx-gen generate --model "$d" --prompt "$(head -c 3000 /tmp/code_edit.txt)" -m 64 --temp 0 \
      --output json --logprobs > "$out/gathered-mlx-$s.json" 2>/dev/null
  echo "== $s decode kernel against MLX's gathered product: $(same_tokens "$out/gathered-mlx-$s.json" "$out/grouped-$s-0.json")"
  alternate MLX_GEN_MOE_GROUPED "${GROUPED_ROUNDS:-1 2}" "$d" -p 512 -g 64 -n 2
  [ -n "${KEEP:-}" ] || rm -rf "$d"
  ;;
attn)
  # Our attention kernel for a few query positions (MLX_GEN_ATTN_KERNEL=1; one kernel a layer where the GPU composes
  # five of MLX's and two cuBLAS products for rows of different lengths) since it is launched by our own primitive:
  # the batch step at 1/8/32 rows on both dense shapes, alternating, 2 rounds, then the server at 8 and 32 streams
  # (1 round each, alternating twice). Last measured through MLX's custom-kernel API (2026-12-06c: mixed).
  for s in qwen3-0.6b llama-3.2-3b; do
    d=$(shape_dir $s)
    for r in 1 2; do
      for a in 0 1; do
        echo "-- $s round $r MLX_GEN_ATTN_KERNEL=$a"
        MLX_GEN_ATTN_KERNEL=$a MLX_GEN_TRACE=1 ./batch_step_cost "$d" 1 8 32 2>&1 | grep '^batch'
      done
    done
  done
  for s in ${ATTN_SERVE-qwen3-0.6b llama-3.2-3b}; do
    for a in 0 1 0 1; do
      echo "-- $s server MLX_GEN_ATTN_KERNEL=$a"
      MLX_GEN_ATTN_KERNEL=$a timeout 150 python3 bench/server_load.py --server mlx-gen --mlx-gen ./mlx-gen \
          --model "$(shape_dir $s)" --concurrency 8,32 --max-tokens 128 --rounds 1 2>&1 | grep -E "streams:"
    done
  done
  ;;
ahead)
  # The short form of `verify` (about 150 s): the draft model's next first step queued ahead (MLX_GEN_SPEC_PIPELINE=1)
  # against not, 2 alternating rounds of the self-drafting round; a forward of 1/8 positions with our attention
  # kernel and without; the batch step at 32 rows with 4 / 2 / 1 tiles a block; batch_step_cost --forward's exit.
  d3=$(shape_dir llama-3.2-3b)
  for r in 1 2; do
    for p in 0 1; do
      echo "-- round $r MLX_GEN_SPEC_PIPELINE=$p: $(selfdraft "$d3" MLX_GEN_SPEC_PIPELINE=$p | grep "^Speculative")"
    done
  done
  for a in 0 1; do echo "-- MLX_GEN_ATTN_KERNEL=$a $(MLX_GEN_ATTN_KERNEL=$a ./batch_step_cost "$d3" --forward 1 8 2>/dev/null | tr '\n' ' ')"; done
  for t in 4 2 1; do echo "-- MLX_GEN_QMM_MMA_TILES=$t $(MLX_GEN_QMM_MMA_TILES=$t ./batch_step_cost "$d3" 32 2>&1 | grep '^batch' | cut -c1-40)"; done
  MLX_GEN_CRASH_TRACE=1 ./batch_step_cost "$d3" --forward 1 2>&1 | tail -30; echo "batch_step_cost --forward exit status ${PIPESTATUS[0]}"
  ;;
verify)
  # Issue 19's verification after the tensor-core product (on by default for 8-32 rows): is the rest of a forward of
  # 8 positions (6.2 ms against 3.5-3.9 at one, 2026-12-07e) the composed attention's kernels (five of MLX's and two
  # cuBLAS products a layer)? Our attention kernel for a few query positions (MLX_GEN_ATTN_KERNEL=1) against it,
  # alternating, 2 rounds: the forward, the self-drafting round (K = 4), prompt lookup (K = 8), then greedy speculative
  # tokens with and without. Then the product up to 32 rows (default) against up to 64 (batch steps of 32-64 rows),
  # and batch_step_cost --forward's exit, a segmentation fault at 2026-12-07e, under MLX_GEN_CRASH_TRACE.
  python3 bench/speculative.py --dump-prompt > /tmp/code_edit.txt
  d3=$(shape_dir llama-3.2-3b)
  # Greedy self-drafting tokens with the variable $1 at 0 and at 1: equal up to a near-tie expected.
  spec_pair() {
    for g in 0 1; do
      env "$1=$g" ./mlx-gen generate --model "$d3" --draft-model "$d3" --num-draft-tokens 4 --prompt "The capital of France is" \
          -m 64 --temp 0 --ignore-chat-template --output json --logprobs 2>/dev/null | tail -1 > "$out/verify-$1-$g.json"
    done
    echo "== speculative tokens, $1=1 against 0: $(same_tokens "$out/verify-$1-0.json" "$out/verify-$1-1.json")"
  }
  for r in 1 2; do
    for a in 0 1; do
      echo "-- round $r MLX_GEN_ATTN_KERNEL=$a"
      MLX_GEN_ATTN_KERNEL=$a ./batch_step_cost "$d3" --forward 1 5 8 9 2>/dev/null | grep '^forward'
      selfdraft "$d3" MLX_GEN_ATTN_KERNEL=$a
      MLX_GEN_ATTN_KERNEL=$a ./mlx-gen bench -n 2 --model "$d3" --prompt-file /tmp/code_edit.txt -g 256 --prompt-lookup 3 \
          --num-draft-tokens 8 --always-speculate 2>&1 | grep -E "^(Averages|Speculative)"
    done
  done
  spec_pair MLX_GEN_ATTN_KERNEL
  # The draft model's next first step queued while the verification runs (MLX_GEN_SPEC_PIPELINE, on by default on
  # a GPU) against none, alternating, 2 rounds.
  for r in 1 2; do
    for p in 0 1; do
      echo "-- round $r MLX_GEN_SPEC_PIPELINE=$p"
      selfdraft "$d3" MLX_GEN_SPEC_PIPELINE=$p
    done
  done
  spec_pair MLX_GEN_SPEC_PIPELINE
  # The product's 8-row tiles a block (MLX_GEN_QMM_MMA_TILES, default 4: 172 registers a thread, so one block of
  # 8 warps an SM; 2 or 1 tiles take fewer registers and more blocks): the batch step at 16 and 32 rows, then the
  # product alone at 32 rows.
  for r in 1 2; do
    for t in 4 2 1; do
      echo "-- round $r MLX_GEN_QMM_MMA_TILES=$t"
      MLX_GEN_QMM_MMA_TILES=$t MLX_GEN_TRACE=1 ./batch_step_cost "$d3" 16 32 2>&1 | grep '^batch'
    done
  done
  for t in 4 2 1; do MLX_GEN_QMM_MMA_TILES=$t ./batch_step_cost --qmm 32 | sed "s/^/tiles $t: /"; done
  for v in 32 64 32 64; do
    echo "-- MLX_GEN_QMM_MMA=$v"
    MLX_GEN_QMM_MMA=$v MLX_GEN_TRACE=1 ./batch_step_cost "$d3" 32 48 64 2>&1 | grep '^batch'
  done
  MLX_GEN_CRASH_TRACE=1 ./batch_step_cost "$d3" --forward 1 2>&1 | tail -40; echo "batch_step_cost --forward exit status ${PIPESTATUS[0]}"
  ;;
warps)
  # The tensor-core product with 16 warps splitting K for 8-16 rows (MLX_GEN_QMM_MMA_WARPS=16) against 8: the
  # product alone at 8 and 16 rows, then on the Llama-3.2-3B shape alternating over 2 rounds the batch step at 1/8/16
  # rows, one forward of 1/8/9 positions, the self-drafting round (K = 4, every draft accepted) and its tokens.
  for w in 8 16; do
    echo "-- product alone, MLX_GEN_QMM_MMA_WARPS=$w"; MLX_GEN_QMM_MMA_WARPS=$w ./batch_step_cost --qmm 8 16
  done
  d3=$(shape_dir llama-3.2-3b)
  for r in 1 2; do
    for w in 8 16; do
      echo "-- llama-3.2-3b round $r MLX_GEN_QMM_MMA_WARPS=$w"
      MLX_GEN_QMM_MMA_WARPS=$w MLX_GEN_TRACE=1 ./batch_step_cost "$d3" 1 8 16 2>&1 | grep '^batch'
      MLX_GEN_QMM_MMA_WARPS=$w ./batch_step_cost "$d3" --forward 1 8 9
      MLX_GEN_QMM_MMA_WARPS=$w MLX_GEN_TRACE=1 ./mlx-gen bench -n 2 --model "$d3" -p 128 -g 256 --draft-model "$d3" \
          --num-draft-tokens 4 --always-speculate 2>&1 | grep -E "^(Speculative|trace: [0-9]+ rounds)"
    done
  done
  for w in 8 16; do
    MLX_GEN_QMM_MMA_WARPS=$w ./mlx-gen generate --model "$d3" --draft-model "$d3" --num-draft-tokens 4 --prompt "The capital of France is" \
        -m 64 --temp 0 --ignore-chat-template --output json --logprobs 2>/dev/null | tail -1 > "$out/warps-$w.json"
  done
  echo "== speculative tokens, 16 warps against 8: $(same_tokens "$out/warps-8.json" "$out/warps-16.json")"
  ;;
mma)
  # Issues 19 and 20: the quantized product of 8-256 rows on the tensor cores (MLX_GEN_QMM_MMA=1; the default for 8-32 rows since 2026-12-07e)
  # against MLX's tiled product: error and time at 8-64 rows (batch_step_cost --qmm), then on the Llama-3.2-3B
  # shape with and without it, alternating: the batch step at 1/8/32 rows, one forward of 1/5/8/9 positions, the
  # self-drafting round (K = 4, every draft accepted), greedy tokens of a speculative run (equal expected up to a
  # near-tie), then the server at 1/8/32 streams on both dense shapes (MMA_SERVE="" skips it).
  ./batch_step_cost --qmm 8 16 32 64; echo "batch_step_cost exit status $?"
  d3=$(shape_dir llama-3.2-3b); d06=$(shape_dir qwen3-0.6b)
  for r in 1 2; do
    for v in 0 1; do
      echo "-- llama-3.2-3b round $r MLX_GEN_QMM_MMA=$v"
      MLX_GEN_QMM_MMA=$v MLX_GEN_TRACE=1 ./batch_step_cost "$d3" 1 8 32 2>&1 | grep '^batch'
      MLX_GEN_QMM_MMA=$v ./batch_step_cost "$d3" --forward 1 5 8 9
    done
  done
  for v in 0 1; do
    echo "-- llama-3.2-3b drafting for itself, K=4, MLX_GEN_QMM_MMA=$v"
    MLX_GEN_QMM_MMA=$v MLX_GEN_TRACE=1 ./mlx-gen bench -n 2 --model "$d3" -p 128 -g 256 --draft-model "$d3" \
        --num-draft-tokens 4 --always-speculate 2>&1 | grep -E "^(Speculative|trace: [0-9]+ rounds)"
    MLX_GEN_QMM_MMA=$v ./mlx-gen generate --model "$d3" --draft-model "$d3" --num-draft-tokens 4 --prompt "The capital of France is" \
        -m 64 --temp 0 --ignore-chat-template --output json --logprobs 2>/dev/null | tail -1 > "$out/mma-spec-$v.json"
  done
  echo "== speculative tokens, tensor-core product against MLX's: $(same_tokens "$out/mma-spec-0.json" "$out/mma-spec-1.json")"
  for sh in ${MMA_SERVE-qwen3-0.6b llama-3.2-3b}; do
    for v in 0 1; do
      echo "-- $sh server MLX_GEN_QMM_MMA=$v"
      MLX_GEN_QMM_MMA=$v MLX_GEN_TRACE=1 timeout 150 python3 bench/server_load.py --server mlx-gen --mlx-gen ./mlx-gen \
          --model "$(shape_dir $sh)" --concurrency 1,8,32 --max-tokens 128 --rounds 1 --server-log "$out/mma-$sh-$v" 2>&1 | grep -E "streams:"
    done
  done
  ;;
route)
  # Issue 17's Qwen3-30B-A3B decode (1.24x mlx-lm at 2026-12-07d, host-bound on MLX's queueing of kernels): the
  # router as one kernel of ours (MLX_GEN_ROUTE_KERNEL, default on) and the experts' gate and up projections as one
  # stacked product. First the router kernel against MLX's operations (batch_step_cost --route: chosen experts,
  # weights, ties; its exit status, which was a segmentation fault at exit before 2026-12-07d's fix), then greedy
  # tokens with and without the kernel on the real shape, then the side-by-side table (3 alternating rounds, same
  # MLX settings) and (ROUTE_ROUNDS) decode with and without the kernel.
  ./batch_step_cost --route 1 4 64; echo "batch_step_cost exit status $?"
  s=${SHAPE:-qwen3-30b-a3b}; d=$(moe_dir "$s")
  for g in 0 1; do
    MLX_GEN_ROUTE_KERNEL=$g ./mlx-gen generate --model "$d" --prompt "The capital of France is" -m 64 --temp 0 \
        --ignore-chat-template --output json --logprobs 2>/dev/null | tail -1 > "$out/route-$s-$g.json"
  done
  echo "== $s router kernel against MLX's operations: $(same_tokens "$out/route-$s-0.json" "$out/route-$s-1.json")"
  MLX_MAX_OPS_PER_BUFFER=80 python3 bench/side_by_side.py --mlx-gen ./mlx-gen --models "$models" --shapes "$s" \
      -p 512 -g 256 -n 2 --rounds 3 --mlx-gen-env "MLX_MAX_OPS_PER_BUFFER=80" --out "$out/side_by_side_$s.json"
  [ -z "${ROUTE_ROUNDS:-}" ] || MLX_MAX_OPS_PER_BUFFER=80 alternate MLX_GEN_ROUTE_KERNEL "$ROUTE_ROUNDS" "$d" -p 512 -g 256 -n 2
  [ -n "${KEEP:-}" ] || rm -rf "$d"
  ;;
devmem)
  # Our kernels' outputs in device memory through MLX's own allocator (MLX_GEN_JIT_DEVICE_MEMORY=1, the default
  # since 2026-12-07c) against the exported allocator's managed memory (=0): greedy tokens and log-probabilities, then decode and pacing
  # (1,024 tokens: p99 / p50, the slow tokens' positions) in DM_ROUNDS alternating rounds, same MLX settings.
  for s in ${DM_SHAPES:-llama-3.2-3b qwen2.5-7b}; do
    d=$(shape_dir $s)
    for m in 0 1; do
      MLX_GEN_JIT_DEVICE_MEMORY=$m ./mlx-gen generate --model "$d" --prompt "The capital of France is" -m 128 --temp 0 \
          --ignore-chat-template --output json --logprobs 2>/dev/null | tail -1 > "/tmp/dm$m.json"
    done
    echo "== $s device memory against managed: $(same_tokens /tmp/dm0.json /tmp/dm1.json)"
    for r in ${DM_ROUNDS:-1 2 3}; do
      for m in 0 1; do
        echo "== $s round $r MLX_GEN_JIT_DEVICE_MEMORY=$m: $(MLX_GEN_JIT_DEVICE_MEMORY=$m MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$d" -p 128 -g 1024 -n 1 --pacing 2>&1 | grep -E "^Pacing" | head -1) | $(MLX_GEN_JIT_DEVICE_MEMORY=$m MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$d" -p 512 -g 256 -n 2 --json | med)"
      done
    done
  done
  ;;
pacing)
  # Issue 22 item 5: where the slow tokens are (p99 2.36x p50 on Llama-3.2-3B at the second lease of 2026-12-06,
  # mlx-lm 1.13x): each run lists its 12 longest inter-token intervals with the token they ended at (every 256th
  # token: the KV cache's growth and MLX's buffer cache cleared; anywhere: the host), each with its host stages
  # (MLX_GEN_TRACE: graph, MLX's queueing, the wait for the token). 2 rounds, then unfused.
  for s in llama-3.2-3b qwen2.5-7b; do
    for r in 1 2; do
      echo "== $s round $r: $(MLX_GEN_TRACE=1 MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$(shape_dir $s)" -p 128 -g 1024 -n 1 --pacing 2>&1 | grep '^Pacing')"
    done
    echo "== $s MLX_GEN_CLEAR_CACHE=0: $(MLX_GEN_TRACE=1 MLX_GEN_CLEAR_CACHE=0 MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$(shape_dir $s)" -p 128 -g 1024 -n 1 --pacing 2>&1 | grep '^Pacing')"
    echo "== $s MLX_GEN_NO_FUSE=1: $(MLX_GEN_TRACE=1 MLX_GEN_NO_FUSE=1 MLX_MAX_OPS_PER_BUFFER=80 ./mlx-gen bench --model "$(shape_dir $s)" -p 128 -g 1024 -n 1 --pacing 2>&1 | grep '^Pacing')"
  done
  ;;
*) echo "unknown section $section (mailbox, pfsweep, prefill, warps, mma, route, devmem, jit, qmvcols, gather, auto, qmv, qmvside, qmmk, kserve, pacing, next, qmm, fusednorm, fallback, diag, perf, more, spec, realspec, round, serve, serving, stall, memory, big, check, moe, hybrid, fidelity, constrained)"; exit 2 ;;
esac
} 2>&1 | tee -a "$out/suite-$section.txt"
