// What the shim's files share: the owned-array handle, the exception guard that reports through
// mlxs_last_error() (distributed.cpp keeps errors of its own), handle conversion, and what custom
// GPU kernels need (recurrent.cpp, norm.cpp, qmm.cpp, attention.cpp, jit.cpp).
#pragma once

#include "shim.h"

#include <mlx/backend/cuda/cuda.h>
#include <mlx/backend/metal/metal.h>
#include <mlx/mlx.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace mx = mlx::core;

// An owned mx::array.
struct mlxs_array_ {
  mx::array a;
};

// shim.cpp's: keeps the text read back by mlxs_last_error().
extern "C" void mlxs_keep_error(const char* what);

namespace shim {

// Runs f; a C++ exception becomes status 1 and its text is kept for mlxs_last_error().
template <class F>
int guard(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    mlxs_keep_error(e.what());
  } catch (...) {
    mlxs_keep_error("unknown C++ exception");
  }
  return 1;
}

inline const mx::array& arr(const mlxs_array a) {
  if (a == nullptr) {
    throw std::invalid_argument("null array handle");
  }
  return a->a;
}

// A nullable handle as an optional array (null: none).
inline std::optional<mx::array> opt(const mlxs_array a) {
  return a == nullptr ? std::nullopt : std::optional<mx::array>(a->a);
}

inline mlxs_array wrap(mx::array a) {
  return new mlxs_array_{std::move(a)};
}

// n handles as arrays.
inline std::vector<mx::array> arrays(const mlxs_array* a, size_t n) {
  std::vector<mx::array> v;
  v.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    v.push_back(arr(a[i]));
  }
  return v;
}

// The default device's GPU backend for custom kernels: 0 none (the CPU), 1 CUDA, 2 Metal.
inline int kernel_backend() {
  try {
    if (mx::default_device() != mx::Device::gpu) {
      return 0;
    }
    return mx::cu::is_available() ? 1 : mx::metal::is_available() ? 2 : 0;
  } catch (...) {
    return 0;
  }
}

// A custom kernel's name with a hash of its source appended: MLX's CUDA backend caches compiled
// kernels on disk by name (MLX_PTX_CACHE_DIR, default $TMPDIR/mlx/<version>/ptx), so a kernel
// whose source changed between mlx-gen versions must not keep its old name.
inline std::string kernel_name(const std::string& base, const std::string& source) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : source) {
    h = (h ^ c) * 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return base + "_" + hex;
}

// Custom kernels whose source depends on a float written into it (an epsilon, a scale): each built
// by `build` once per value, on first use, and never destroyed.
class KernelsByFloat {
 public:
  template <class F>
  const mx::fast::CustomKernelFunction& get(float value, F&& build) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    std::lock_guard<std::mutex> held(lock_);
    auto& slot = kernels_[bits];
    if (slot == nullptr) {
      slot = new mx::fast::CustomKernelFunction(build(bits));
    }
    return *slot;
  }

 private:
  std::mutex lock_;
  std::map<uint32_t, const mx::fast::CustomKernelFunction*> kernels_;
};

// A CUDA kernel of mlx-gen's own (jit.cpp): compiled with NVRTC and loaded on first use, launched
// by a primitive of ours at the host cost of one of MLX's primitives. Its source defines
// `extern "C" __global__ void KNAME(inputs..., outputs..., int scalars..., int strides...)` with no
// header (jit_prelude() gives the float types and their conversions, jit_type() their names).
class JitKernel {
 public:
  JitKernel(std::string name, std::string source) : name_(std::move(name)), source_(std::move(source)) {}
  // Outputs of `shapes` / `dtypes`; the kernel's parameters are the inputs' and outputs' device
  // pointers, with `host` words given the address of a copy of them in page-locked host memory the
  // kernel reads directly (data written by the host for one launch, without an MLX array: MLX's
  // CUDA arrays made from host data are managed memory, which the host's write and the device's
  // read each migrate), then `scalars`, then the strides (elements, one an axis, as ints) of each
  // input marked in `strided` (every other input must be row-contiguous); `grid` in blocks,
  // `block` a block's threads.
  std::vector<mx::array> launch(const std::vector<mx::array>& inputs, const std::vector<mx::Shape>& shapes,
                                const std::vector<mx::Dtype>& dtypes, std::vector<int> scalars,
                                std::vector<bool> strided, std::array<unsigned, 3> grid,
                                std::array<unsigned, 3> block, std::vector<uint32_t> host = {});
  // The loaded CUDA function (a CUfunction), compiled and loaded on first use.
  void* function();
  const std::string& name() const {
    return name_;
  }

 private:
  std::mutex lock_;
  std::string name_;
  std::string source_;
  void* function_ = nullptr;
};

// elf.cpp: the values (addresses relative to the load base) of the functions `names` in the symbol
// table of the ELF file at `path`, 0 for each it lacks (or where the file cannot be read).
std::vector<uint64_t> elf_function_values(const std::string& path, const std::vector<std::string>& names);
// The address of function `name` in the loaded library holding `anchor` (an exported function of
// it named `anchor_name`), from the library's symbol table; null unless the same lookup gives
// anchor's own address back.
void* local_function(void* anchor, const char* anchor_name, const char* name);

// The C ABI of a quantized product x @ dequantize(w)ᵀ by a kernel of ours (qmm.cpp, mma.cpp): `launch(x, w,
// scales, biases)` where `suits(x, w, scales, biases or null, mode)` takes the product, else MLX's
// quantized_matmul (transposed).
using QuantSuits = std::function<bool(const mx::array&, const mx::array&, const mx::array&, const mx::array*,
                                      const std::string&)>;
using QuantLaunch =
    std::function<mx::array(const mx::array&, const mx::array&, const mx::array&, const mx::array&)>;
int quantized_product(mlxs_array* out, const mlxs_array x, const mlxs_array w, const mlxs_array scales,
                      const mlxs_array biases, int group_size, int bits, const char* mode, const QuantSuits& suits,
                      const QuantLaunch& launch);

// Page-locked host memory mapped into the CUDA device's address space (jit.cpp), kept for the life
// of the process: `host` for the host's reads, `device` the address a kernel writes through.
struct MappedHost {
  void* host;
  unsigned long long device;
};
MappedHost mapped_host(size_t bytes);

// The kernel of variant `key` (a C identifier), its source written by `source` on first use; never
// destroyed.
JitKernel& jit_kernel(const std::string& key, const std::function<std::string()>& source);
const char* jit_prelude();
// The kernel type of an array of `dtype` (float32, bfloat16, float16, uint32, int32, bool).
const char* jit_type(mx::Dtype dtype);
// Whether JitKernels run here: a CUDA GPU by default and NVRTC in the process.
bool jit_available();
// The default GPU's compute capability as a number (90 for sm_90); only where jit_available().
int jit_sm();
// (key, source) of representative variants of each JitKernel, for mlxs_jit_check: the few-row and
// gathered products (qmm.cpp), the residual add with the RMS norm (norm.cpp), attention of a few
// query positions (attention.cpp), the gated-delta recurrence (recurrent.cpp), the token mask
// (mask.cpp), a mixture of experts' router (route.cpp), the tensor-core product of 8-256 rows (mma.cpp),
// the token mailbox's post (mailbox.cpp).
std::vector<std::pair<std::string, std::string>> qmm_sources();
std::vector<std::pair<std::string, std::string>> add_rms_norm_sources();
std::vector<std::pair<std::string, std::string>> sdpa_few_sources();
std::vector<std::pair<std::string, std::string>> gated_delta_sources();
std::vector<std::pair<std::string, std::string>> mask_tokens_sources();
std::vector<std::pair<std::string, std::string>> moe_route_sources();
std::vector<std::pair<std::string, std::string>> qmm_mma_sources();
std::vector<std::pair<std::string, std::string>> mailbox_sources();

}  // namespace shim
