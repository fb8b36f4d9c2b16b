#!/usr/bin/env bash
# Every GPU measurement the open issues need, in one go, from the folder stage-gpu.sh fills
# (.gpubin/: mlx-gen + bench scripts), on a machine where `python3` has mlx (CUDA) and mlx-lm.
# Writes what it prints to $OUT (or ./gpu-results) as well. Expect about 10-15 minutes on an H200.
set -u
cd "$(dirname "$0")/.."          # .gpubin/
out=${OUT:-gpu-results}; mkdir -p "$out"
models=${MODELS:-/tmp/models}
med() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); m=d['median']; print(f\"ttft {m['ttft_s']*1000:.1f} ms, prefill {m['prompt_tps']:.0f} tok/s, decode {m['generation_tps']:.1f} tok/s, peak {m['peak_memory_gb']:.3f} GB\")"; }
{
  # Issue 13: the side-by-side table with token pacing, three rounds.
  python3 bench/side_by_side.py --mlx-gen ./mlx-gen --models "$models" -p 512 -g 256 -n 3 --rounds 3 \
      --pacing-tokens 1024 --out "$out/side_by_side.json"
  for s in smollm2-135m qwen3-0.6b llama-3.2-3b qwen2.5-7b; do
    d=$models/$s-4bit-bfloat16
    echo "== $s fused:          $(./mlx-gen bench --model "$d" -p 512 -g 256 -n 3 --json | med)"
    echo "== $s separate:       $(MLX_GEN_NO_FUSE=1 ./mlx-gen bench --model "$d" -p 512 -g 256 -n 3 --json | med)"
    # Issue 5: the paged cache must stay within 5% of the growing one.
    echo "== $s paged cache:    $(./mlx-gen bench --model "$d" -p 512 -g 256 -n 3 --kv-cache paged --json | med)"
    echo "== $s p4096 mlx-gen:  $(./mlx-gen bench --model "$d" -p 4096 -g 16 -n 2 --json | med)"
    echo "== $s p4096 mlx-lm:   $(python3 bench/mlx_lm_bench.py --model "$d" -p 4096 -g 16 -n 2 | med)"
  done
  # Issue 8: the MoE shape.
  python3 bench/side_by_side.py --mlx-gen ./mlx-gen --models "$models" --shapes deepseek-v2-lite -p 512 -g 128 -n 2 --rounds 1
} 2>&1 | tee "$out/suite.txt"
# Issue 6 needs a real target/draft pair (Qwen2.5-Coder bf16 + 4-bit): see scripts/bench/speculative.py.
