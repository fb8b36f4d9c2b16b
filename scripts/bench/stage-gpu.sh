#!/usr/bin/env bash
# Builds the CUDA binary from the committed HEAD (in a throw-away worktree, so work in progress
# does not leak in) and gathers what a GPU machine without Rust needs into .gpubin/:
# the mlx-gen binary, the bench scripts and the test tokenizer maker. Then, on the GPU machine,
# with the mlx-cuda-13 wheel installed into a site folder S, `source .gpubin/dev.sh` (device-env.sh:
# PYTHONPATH, the CUDA libraries, the binary moved into S/mlx/bin), then:
#   python3 .gpubin/bench/side_by_side.py --mlx-gen .gpubin/mlx-gen --models /tmp/models \
#       -p 512 -g 256 -n 3 --rounds 3 --pacing-tokens 1024
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
wt=$(mktemp -d)
git -C "$root" worktree add -q --detach "$wt" HEAD
trap 'git -C "$root" worktree remove --force "$wt"' EXIT
(cd "$wt" && MLX_GEN_BACKEND=cuda CARGO_TARGET_DIR="$root/target-cuda" cargo build --release -q -p mlx-gen-rs \
    && MLX_GEN_BACKEND=cuda CARGO_TARGET_DIR="$root/target-cuda" cargo build --release -q -p engine --example batch_step_cost)
mkdir -p "$root/.gpubin/bench" "$root/.gpubin/oracle"
cp "$root/target-cuda/release/mlx-gen" "$root/target-cuda/release/examples/batch_step_cost" "$root/.gpubin/"
cp "$root"/scripts/bench/*.py "$root"/scripts/bench/gpu_suite.sh "$root/.gpubin/bench/"
cp "$root/scripts/bench/device-env.sh" "$root/.gpubin/dev.sh"
cp "$root/tests/oracle/make_tokenizer.py" "$root/.gpubin/oracle/"
grep -qx "/.gpubin/" "$root/.git/info/exclude" 2>/dev/null || echo "/.gpubin/" >> "$root/.git/info/exclude"
du -sh "$root/.gpubin"
