#!/usr/bin/env bash
# Stages one H200 lease of six calls (as the fifth lease ran, BENCHMARKS.md): MLX CUDA's wheels, our CUDA binary
# (gzip, 7.5 MiB) and the real Qwen2.5-Coder-0.5B-Instruct (4-bit, 241 MiB gzip) cut so that each call carries
# under 64 MiB and the model's parts ride along with the measuring calls:
#   call 1 carry [.gpu/a, .gpu/bin, .gpu/q0]          bash .gpu/bin/lease-call.sh 1   (copies, ~30 s)
#   call 2 carry [.gpu/b, .gpubin, .gpu/q1, .gpu/tok] bash /tmp/w/lease-call.sh 2 SECTION...
#   call N carry [.gpu/qN-1]                          bash /tmp/w/lease-call.sh N SECTION...  (N = 3..6)
# From call 6 on the real model is in /tmp/real (REAL for `fidelity` and `realspec`); $TOK (/tmp/tok) holds
# Qwen2.5's tokenizer for `constrained`. Sections are gpu_suite.sh's, with VAR=value words passed as environment
# (e.g. `SHAPES=qwen3.5-2b fidelity`). Needs the real models in the cache (scripts/test.sh fetches them) and
# pip access to PyPI for the pinned wheels (mlx, mlx-cuda-13 0.32.4, mlx-lm 0.32.2).
set -euo pipefail
# The pinned mlx-cuda-13 0.32.4 wheel (manylinux_2_35_x86_64); lease-call.sh checks it again once joined.
MLX_CUDA_SHA256=94cb48fba73e5ee39467e51c35c51c691123359ca17bafd1a24cf92ad6732bee
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# MLX CUDA's 90 MB wheel split in two (call 1 carries the first part with mlx and mlx-lm, call 2 the rest).
rm -rf .gpu/a .gpu/b .gpu/dl && mkdir -p .gpu/a .gpu/b .gpu/dl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_35_x86_64 -d .gpu/dl mlx==0.32.4 mlx-cuda-13==0.32.4 mlx-lm==0.32.2
echo "$MLX_CUDA_SHA256  $(ls .gpu/dl/mlx_cuda_13-0.32.4-*.whl)" | sha256sum -c - >/dev/null
split -b 46000000 .gpu/dl/mlx_cuda_13-0.32.4-*.whl .gpu/a/cuda.part.
mv .gpu/a/cuda.part.ab .gpu/b/
cp .gpu/dl/mlx-0.32.4-*.whl .gpu/dl/mlx_lm-0.32.2-*.whl .gpu/a/
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
bash scripts/bench/stage-gpu.sh >/dev/null
bash scripts/bench/stage-real-models.sh >/dev/null
mkdir -p .gpu/bin .gpu/tok
for b in mlx-gen batch_step_cost; do
  strip ".gpubin/$b" && gzip -9 -c ".gpubin/$b" > ".gpu/bin/$b.gz" && rm ".gpubin/$b"
done
cp scripts/bench/lease-call.sh .gpu/bin/
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cat .gpu/r/part* | tar -x -C "$work"
tar -C "$work" -cf - qwen2.5-coder-0.5b-instruct | gzip -6 > "$work/qwen.tgz"
for f in tokenizer.json tokenizer_config.json; do gzip -9 -c "$work/qwen2.5-coder-0.5b-instruct/$f" > ".gpu/tok/$f.gz"; done
rm -rf .gpu/r .gpu/q?
python3 - "$work/qwen.tgz" .gpu <<'PY'
import os, sys
data, out, mib = open(sys.argv[1], "rb").read(), sys.argv[2], 1 << 20
sizes, off = [4 * mib, 16 * mib, 60 * mib, 60 * mib, 60 * mib], 0
for i in range(6):
    chunk = data[off:off + sizes[i]] if i < 5 else data[off:]
    os.makedirs(f"{out}/q{i}", exist_ok=True)
    open(f"{out}/q{i}/part{i:02d}", "wb").write(chunk)
    off += len(chunk)
assert off == len(data), "the model does not fit in six calls"
PY
du -sh .gpu/a .gpu/b .gpu/bin .gpu/tok .gpu/q? .gpubin
