# Sourced on the GPU machine from the repository root, after install-on-device: MLX CUDA from the
# folder it was installed into ($MLX_SITE, default /tmp/mlxsite) for mlx-lm and for our binary.
# The binary moves into the wheel's own folder (mlx/bin/, with .gpubin/mlx-gen a link to it): MLX
# finds the headers it JIT-compiles kernels with (CUTLASS, CCCL) relative to libmlx, and its rpath
# ($ORIGIN/../lib) then takes that libmlx.
MLX_SITE=${MLX_SITE:-/tmp/mlxsite}
export PYTHONPATH=$MLX_SITE
# The CUDA libraries MLX needs (cuBLAS, cuDNN, NCCL, NVRTC) from the machine's nvidia pip packages.
NV=$(python3 -c 'import nvidia, glob; print(":".join(d for p in nvidia.__path__ for d in glob.glob(p + "/*/lib")))' 2>/dev/null)
export LD_LIBRARY_PATH=$MLX_SITE/mlx/lib:${NV:+$NV:}${LD_LIBRARY_PATH:-}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export MODELS=${MODELS:-/tmp/models}
mkdir -p "$MLX_SITE/mlx/bin"
if [ ! -L .gpubin/mlx-gen ]; then
  mv .gpubin/mlx-gen "$MLX_SITE/mlx/bin/mlx-gen"
  ln -s "$MLX_SITE/mlx/bin/mlx-gen" .gpubin/mlx-gen
fi
