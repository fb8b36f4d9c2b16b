#!/usr/bin/env bash
# On the H200, call N of a lease staged by stage-lease.sh (run from the repository root there): takes in what
# this call carried, sets up MLX CUDA and our binary in /tmp/w (call 2), then runs the gpu_suite.sh sections
# given after N (VAR=value words become their environment) and packs $OUT into one file (at most 8 come back).
set -u
n=${1:?usage: lease-call.sh N [VAR=value...] [SECTION...]}; shift
mkdir -p /tmp/mlxparts /tmp/w/.gpubin /tmp/q /tmp/tok
case $n in
1) cp "$0" /tmp/w/lease-call.sh
   cp .gpu/a/* /tmp/mlxparts/ || exit 1
   for f in .gpu/bin/*.gz; do b=$(basename "$f" .gz); gunzip -c "$f" > "/tmp/w/.gpubin/$b" && chmod +x "/tmp/w/.gpubin/$b"; done
   cp .gpu/q0/* /tmp/q/; nvidia-smi --query-gpu=name,memory.used --format=csv; exit 0 ;;
2) whl=/tmp/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
   cat /tmp/mlxparts/cuda.part.aa .gpu/b/cuda.part.ab > "$whl" || exit 1
   echo "94cb48fba73e5ee39467e51c35c51c691123359ca17bafd1a24cf92ad6732bee  $whl" | sha256sum -c - >/dev/null || exit 1
   rm -rf /tmp/mlxsite && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/mlxsite \
     /tmp/mlxparts/*.whl "$whl" || exit 1
   cp -a .gpubin/. /tmp/w/.gpubin/ && cp .gpu/q1/* /tmp/q/
   for f in .gpu/tok/*.gz; do gunzip -c "$f" > "/tmp/tok/$(basename "$f" .gz)"; done ;;
*) cp ".gpu/q$((n - 1))"/* /tmp/q/ 2>/dev/null
   if [ "$n" -ge 6 ] && [ ! -d /tmp/real/qwen2.5-coder-0.5b-instruct ]; then
     mkdir -p /tmp/real && cat /tmp/q/part* | gunzip | tar -x -C /tmp/real
   fi ;;
esac
cd /tmp/w && source .gpubin/dev.sh && export OUT TOK=/tmp/tok REAL=/tmp/real
# Every 20 s and after each section everything so far is packed into $OUT/call$n.tgz (first in name order, so it
# comes back even when the call runs past its limit and the loose files pass the count that comes back).
# Each packing writes a file of its own (the 20 s loop and a section's end may pack at once).
pack() { (t=$(mktemp /tmp/res.XXXXXX) && cd "$OUT" && tar czf "$t" --exclude="call$n.tgz" . 2>/dev/null; [ -s "$t" ] && mv "$t" "$OUT/call$n.tgz"); }
(while sleep 20; do pack; done) & packer=$!
envs=()
for a in "$@"; do
  case $a in
    *=*) envs+=("$a") ;;
    *) env "${envs[@]}" bash .gpubin/bench/gpu_suite.sh "$a" >/dev/null 2>&1; envs=(); pack ;;
  esac
done
cat "$OUT"/suite-*.txt 2>/dev/null | grep -v '^\[transformers\]' | cut -c1-400
kill "$packer" 2>/dev/null; wait "$packer" 2>/dev/null
pack && find "$OUT" -mindepth 1 ! -name "call$n.tgz" -delete
