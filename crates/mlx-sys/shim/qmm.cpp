// mlx-gen's C ABI for a quantized product of a few rows, x (M, K) @ dequantize(w)ᵀ for 2 <= M <= 32,
// as one CUDA kernel through MLX's custom-kernel API. It is what a batch decode step (one row a
// sequence) and a speculative verification (K+1 positions) multiply by every weight. MLX 0.32's CUDA
// backend runs such products with its matrix-vector kernel once a row up to 7 rows (from 8 rows a tiled
// product). Measured on the H200 (`batch_step_cost --qmm`, 4-bit g64): ours is 1.2-2.8x faster than
// MLX's at 2-5 rows (12-51 us against 15-143 over Llama-3.2-3B's weights), slower from 8 rows (MLX's
// tiled product: 10-42 us at 32 rows), and its call costs the host more than MLX's product, so the
// engine asks for it only with MLX_GEN_QMM_KERNEL=1, for 2-7 rows of weights of 2^24 elements or more.
//
// Here each warp computes R output columns for all M rows: its lanes walk K one packed word at a time
// (coalesced, each weight word read once for all rows), dequantize the word's values as MLX's affine
// mode defines them (scale * q + bias, per group of GS values along K), and accumulate the M rows'
// dot products in float32; x is read straight from global memory (the same rows for every warp: L1
// hits), then a warp sum per output. The result rounds differently from MLX's kernels (another
// summation order): the engine uses it only where mlx-lm's tokens are not the reference (a batch
// step of several rows, a verification; never a single sequence's prompt or decode step).
// Other backends, dtypes, bit widths or modes take MLX's quantized_matmul.
#include "internal.h"

#include <mutex>
#include <string>
#include <vector>

namespace {

using shim::arr;
using shim::guard;
using shim::wrap;

// Template arguments: T (x, scales, biases, out), BITS (4 or 8), GS (group size), MMAX (rows the
// accumulators hold, M <= MMAX), R (output columns a warp), WARPS (warps a block). M, K from x's
// shape, N from w's. x's rows are read a pack of VALS elements at a time where its data starts on a
// pack's size (K is a multiple of VALS, so then every row does), else element by element.
const char* kCudaBody = R"(
  constexpr int VALS = 32 / BITS;
  constexpr unsigned QMASK = (1u << BITS) - 1u;
  struct alignas(sizeof(T) * VALS) Pack { T v[VALS]; };
  const int M = x_shape[0];
  const int K = x_shape[1];
  const int N = w_shape[0];
  const int KW = K / VALS;
  const int KG = K / GS;
  const bool aligned = (reinterpret_cast<unsigned long long>(x) % sizeof(Pack)) == 0;
  const int lane = threadIdx.x & 31;
  const int n0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * R;
  float acc[R][MMAX];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < MMAX; ++m) {
      acc[r][m] = 0.0f;
    }
  }
#pragma unroll 2
  for (int kw = lane; kw < KW; kw += 32) {
    const int g = (kw * VALS) / GS;
    float wv[R][VALS];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int n = n0 + r;
      if (n < N) {
        const uint32_t word = w[(long long)n * KW + kw];
        const float s = static_cast<float>(scales[(long long)n * KG + g]);
        const float b = static_cast<float>(biases[(long long)n * KG + g]);
#pragma unroll
        for (int j = 0; j < VALS; ++j) {
          wv[r][j] = fmaf(static_cast<float>((word >> (BITS * j)) & QMASK), s, b);
        }
      } else {
#pragma unroll
        for (int j = 0; j < VALS; ++j) {
          wv[r][j] = 0.0f;
        }
      }
    }
#pragma unroll
    for (int m = 0; m < MMAX; ++m) {
      if (m < M) {
        float xv[VALS];
        const T* xr = x + (long long)m * K + (long long)kw * VALS;
        if (aligned) {
          const Pack p = *reinterpret_cast<const Pack*>(xr);
#pragma unroll
          for (int j = 0; j < VALS; ++j) {
            xv[j] = static_cast<float>(p.v[j]);
          }
        } else {
#pragma unroll
          for (int j = 0; j < VALS; ++j) {
            xv[j] = static_cast<float>(xr[j]);
          }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int j = 0; j < VALS; ++j) {
            acc[r][m] = fmaf(xv[j], wv[r][j], acc[r][m]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < MMAX; ++m) {
      if (m < M) {
        float v = acc[r][m];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
          v += __shfl_xor_sync(0xffffffffu, v, off);
        }
        if (lane == 0 && n0 + r < N) {
          out[(long long)m * N + n0 + r] = static_cast<T>(v);
        }
      }
    }
  }
)";

constexpr int kWarps = 4;

const mx::fast::CustomKernelFunction& qmm_kernel() {
  static std::once_flag once;
  static const mx::fast::CustomKernelFunction* kernel = nullptr;
  std::call_once(once, [] {
    std::string name = shim::kernel_name("mlxgen_qmm_rows", kCudaBody);
    kernel = new mx::fast::CustomKernelFunction(
        mx::fast::cuda_kernel(name, {"x", "w", "scales", "biases"}, {"out"}, kCudaBody));
  });
  return *kernel;
}

// Whether the kernel takes this product: the CUDA backend, 2-D x of 2-32 rows in a 16-bit float
// type, affine 4- or 8-bit weights (out, in) with scales and biases of x's type and a group size
// of 32, 64 or 128 dividing K.
bool suits(const mx::array& x, const mx::array& w, const mx::array& s, const mx::array* b, int gs, int bits,
           const std::string& mode) {
  if (mode != "affine" || b == nullptr || (bits != 4 && bits != 8) || (gs != 32 && gs != 64 && gs != 128)) {
    return false;
  }
  if (x.ndim() != 2 || w.ndim() != 2 || s.ndim() != 2 || b->ndim() != 2 || w.dtype() != mx::uint32) {
    return false;
  }
  const int m = x.shape(0), k = x.shape(1), n = w.shape(0);
  if (m < 2 || m > 32 || k % gs != 0 || w.shape(1) * (32 / bits) != k) {
    return false;
  }
  if (x.dtype() != mx::bfloat16 && x.dtype() != mx::float16) {
    return false;
  }
  return s.dtype() == x.dtype() && b->dtype() == x.dtype() && s.shape(0) == n && s.shape(1) == k / gs &&
         b->shape() == s.shape() && shim::kernel_backend() == 1;
}

}  // namespace

int mlxs_qmm_rows(mlxs_array* out, const mlxs_array x, const mlxs_array w, const mlxs_array scales,
                  const mlxs_array biases, int group_size, int bits, const char* mode) {
  return guard([&] {
    const auto &xa = arr(x), &wa = arr(w), &sa = arr(scales);
    const mx::array* ba = biases == nullptr ? nullptr : &arr(biases);
    const std::string md = mode == nullptr ? "affine" : mode;
    if (!suits(xa, wa, sa, ba, group_size, bits, md)) {
      std::optional<mx::array> bopt;
      if (ba != nullptr) {
        bopt = *ba;
      }
      *out = wrap(mx::quantized_matmul(xa, wa, sa, bopt, true, group_size, bits, md));
      return;
    }
    const int m = xa.shape(0), n = wa.shape(0);
    const int mmax = m <= 4 ? 4 : m <= 8 ? 8 : m <= 16 ? 16 : 32;
    const int r = mmax >= 32 ? 2 : 4;
    const int cols = kWarps * r;
    const int blocks = (n + cols - 1) / cols;
    std::vector<std::pair<std::string, mx::fast::TemplateArg>> targs{
        {"T", xa.dtype()}, {"BITS", bits}, {"GS", group_size}, {"MMAX", mmax},
        {"R", r},          {"WARPS", kWarps}};
    auto outs = qmm_kernel()({xa, wa, sa, *ba}, {{m, n}}, {xa.dtype()}, {blocks * kWarps * 32, 1, 1},
                             {kWarps * 32, 1, 1}, targs, std::nullopt, false, {});
    *out = wrap(outs[0]);
  });
}
