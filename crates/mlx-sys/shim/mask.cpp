// mlx-gen's C ABI for constrained decoding's token mask as one CUDA kernel of ours (jit.cpp):
// logits (rows, vocab) with every token whose bit is clear in the row's packed words set to -inf
// (bit t % 32 of word t / 32, the layout of llguidance's token sets). The engine's MLX operations
// for it (engine `sample::constraint::apply_mask_bits`) are five kernels over the vocabulary and an
// array made from the host's words, which MLX's CUDA backend puts in managed memory: each step the
// host's write and then the device's read migrate its pages (and where MLX's buffer cache hands the
// array a device buffer, the allocator first moves that buffer to managed memory with a synchronous
// copy). Here the words go to page-locked host memory the kernel reads directly, and the mask is one
// kernel. The values are MLX's `where(bit, logits, -inf)` exactly. CUDA only: elsewhere (and with
// MLX_GEN_MASK_KERNEL=0) the caller keeps its MLX operations.
#include "internal.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using shim::arr;
using shim::guard;
using shim::wrap;

constexpr int kBlock = 256;

// One thread a logit: inputs x (rows, vocab) read through its strides (s0, s1), the words (rows,
// per_row) from the host, output (rows, vocab) row-contiguous.
std::string source(const char* t) {
  return std::string(shim::jit_prelude()) + "using T = " + t + R"(;
extern "C" __global__ void KNAME(const T* x, T* out, const u32* words, int rows, int vocab, int per_row, int s0, int s1) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<long long>(rows) * vocab) {
    return;
  }
  const int r = static_cast<int>(i / vocab);
  const int t = static_cast<int>(i - static_cast<long long>(r) * vocab);
  const u32 w = words[static_cast<long long>(r) * per_row + (t >> 5)];
  out[i] = ((w >> (t & 31)) & 1u) ? x[static_cast<long long>(r) * s0 + static_cast<long long>(t) * s1]
                                  : from_f<T>(__int_as_float(0xff800000u));
}
)";
}

std::string variant(const char* t) {
  return std::string("mlxgen_mask_tokens_") + t;
}

// MLX_GEN_MASK_KERNEL=0 keeps MLX's operations on CUDA too.
bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MLX_GEN_MASK_KERNEL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> shim::mask_tokens_sources() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* t : {"float", "bf16_t", "f16_t"}) {
    out.emplace_back(variant(t), source(t));
  }
  return out;
}

int mlxs_mask_tokens(mlxs_array* out, const mlxs_array logits, const uint32_t* words, size_t n_words) {
  return guard([&] {
    *out = nullptr;
    const auto& x = arr(logits);
    if (!enabled() || !shim::jit_available() || x.ndim() != 2 ||
        !(x.dtype() == mx::float32 || x.dtype() == mx::bfloat16 || x.dtype() == mx::float16)) {
      return;
    }
    const int rows = x.shape(0), vocab = x.shape(1);
    const int per_row = (vocab + 31) / 32;
    const long long total = static_cast<long long>(rows) * vocab;
    if (rows <= 0 || vocab <= 0 || n_words != static_cast<size_t>(rows) * per_row || total > INT32_MAX) {
      throw std::invalid_argument("a packed token mask of " + std::to_string(n_words) + " words for logits of " +
                                  std::to_string(rows) + " x " + std::to_string(vocab));
    }
    const char* t = shim::jit_type(x.dtype());
    auto& kernel = shim::jit_kernel(variant(t), [&] { return source(t); });
    const auto grid = static_cast<unsigned>((total + kBlock - 1) / kBlock);
    auto outs = kernel.launch({x}, {x.shape()}, {x.dtype()}, {rows, vocab, per_row}, {true}, {grid, 1, 1},
                              {unsigned(kBlock), 1, 1}, std::vector<uint32_t>(words, words + n_words));
    *out = wrap(outs[0]);
  });
}
