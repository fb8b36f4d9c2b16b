// mlx-gen's C ABI for the residual add fused with the RMS norm that follows it:
// h = x + y; out = rms_norm(h, w, eps). A decoder layer runs this pair twice (after attention and
// after the feed-forward part, the second into the next layer's input norm); MLX runs it as two
// kernels, each one more for the host to encode per token (decode on a GPU is host-bound). Here it
// is one kernel, on CUDA one of ours (jit.cpp: compiled once, launched by our own primitive),
// written to round exactly as MLX's two do:
// - the sum in the input dtype, rounded once (MLX's binary kernel's `+` on the CUDA type);
// - the sum of squares in float32, each thread over the same elements in the same order as MLX's
//   CUDA `rms_norm_small` / `rms_norm` kernels (N_READS = 16 bytes of elements per vector, the
//   vectors of a row dealt to BLOCK threads in CHUNKS rounds, chosen as RMSNorm::eval_gpu chooses
//   them), then a warp reduction and a reduction of the warps' partial sums (cooperative groups'
//   xor butterfly, 16 lanes apart first);
// - rsqrt(sum / D + eps), then w * T(x * normalizer) in the input dtype.
// Through MLX's custom-kernel API it was bit for bit MLX's on an H100 (`gpu_suite.sh fusednorm`:
// equal log-probabilities, 64 tokens, hidden sizes 1,024 and 3,072) but slower (decode 0.92-0.99x):
// that API writes the kernel's source again on every call, more host time than MLX's two built-in
// kernels. Launched by our primitive it is to be measured; until then the engine asks for it only
// with MLX_GEN_FUSED_NORM=1. The CPU takes MLX's two operations. The Metal kernel (MLX's metal_kernel,
// one threadgroup a row, simd sums) is written to the same formula; MLX's Metal reduction order is
// not replicated, and it runs only when MLX_GEN_FUSED_NORM=1 asks for it (not tried: no Mac here).
#include "internal.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace {

using shim::arr;
using shim::guard;
using shim::wrap;

// CUDA's kernel source: inputs x, y (rows, D) and w (D,), outputs h = x + y and out = the normed h,
// all of kernel type `t`; BLOCK threads a row, CHUNKS rounds of NR-element vectors a thread; eps
// written in as its float bits.
std::string cuda_source(const char* t, int d, int block, int chunks, int nr, uint32_t eps_bits) {
  return std::string(shim::jit_prelude()) + "using T = " + t + ";\nextern \"C\" __global__ void __launch_bounds__(" +
         std::to_string(block) + ") KNAME(const T* x, const T* y, const T* w, T* h, T* out) {\n  constexpr int D = " +
         std::to_string(d) + ";\n  constexpr int BLOCK = " + std::to_string(block) + ";\n  constexpr int CHUNKS = " +
         std::to_string(chunks) + ";\n  constexpr int NR = " + std::to_string(nr) +
         ";\n  const float eps = __int_as_float(" + std::to_string(eps_bits) + R"();
  __shared__ float partial[BLOCK / 32];
  const long long row = blockIdx.x;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const T* xr = x + row * D;
  const T* yr = y + row * D;
  T* hr = h + row * D;
  T* outr = out + row * D;
  T v[CHUNKS][NR];
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
    const int base = (BLOCK * i + tid) * NR;
#pragma unroll
    for (int j = 0; j < NR; ++j) {
      const int e = base + j;
      T s = from_f<T>(0.0f);
      if (e < D) {
        s = add_t(xr[e], yr[e]);
        hr[e] = s;
      }
      v[i][j] = s;
      float t = to_f(s);
      acc += t * t;
    }
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    acc += __shfl_xor_sync(0xffffffffu, acc, m);
  }
  if (lane == 0) {
    partial[tid >> 5] = acc;
  }
  __syncthreads();
  float sum = lane < BLOCK / 32 ? partial[lane] : 0.0f;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    sum += __shfl_xor_sync(0xffffffffu, sum, m);
  }
  const float normalizer = rsqrtf(sum / static_cast<float>(D) + eps);
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
    const int base = (BLOCK * i + tid) * NR;
#pragma unroll
    for (int j = 0; j < NR; ++j) {
      const int e = base + j;
      if (e < D) {
        const float yv = to_f(v[i][j]) * normalizer;
        outr[e] = mul_t(w[e], from_f<T>(yv));
      }
    }
  }
}
)";
}

// The Metal kernel: one threadgroup of BLOCK threads a row, each summing its strided elements,
// then simd sums and the simdgroups' partial sums.
std::string metal_body(uint32_t eps_bits) {
  return R"(
  const float eps = as_type<float>(uint()" + std::to_string(eps_bits) + R"(u));
  threadgroup float partial[32];
  const uint row = threadgroup_position_in_grid.x;
  const uint tid = thread_position_in_threadgroup.x;
  const uint lane = thread_index_in_simdgroup;
  const uint sg = simdgroup_index_in_threadgroup;
  float acc = 0.0f;
  for (int e = tid; e < D; e += BLOCK) {
    T s = x[row * D + e] + y[row * D + e];
    h[row * D + e] = s;
    float t = static_cast<float>(s);
    acc += t * t;
  }
  acc = simd_sum(acc);
  if (lane == 0) { partial[sg] = acc; }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float sum = lane < (BLOCK + 31) / 32 ? partial[lane] : 0.0f;
  sum = simd_sum(sum);
  const float normalizer = metal::precise::rsqrt(sum / static_cast<float>(D) + eps);
  for (int e = tid; e < D; e += BLOCK) {
    float yv = static_cast<float>(h[row * D + e]) * normalizer;
    out[row * D + e] = w[e] * static_cast<T>(yv);
  }
)";
}

// Metal's kernel for eps (MLX's metal_kernel), built once per eps value and never destroyed.
const mx::fast::CustomKernelFunction& metal_kernel_for(float eps) {
  static shim::KernelsByFloat kernels;
  return kernels.get(eps, [](uint32_t bits) {
    std::string body = metal_body(bits);
    return mx::fast::metal_kernel(shim::kernel_name("mlxgen_add_rms_norm", body), {"x", "y", "w"}, {"h", "out"}, body);
  });
}

std::string variant(const char* t, int d, int block, int chunks, int nr, uint32_t eps_bits) {
  char key[128];
  std::snprintf(key, sizeof key, "mlxgen_add_rms_norm_%s_d%d_b%d_c%d_n%d_e%08x", t, d, block, chunks, nr, eps_bits);
  return key;
}

// CUDA's kernel for x's type, D and eps (a JitKernel, jit.cpp).
shim::JitKernel& cuda_kernel_for(mx::Dtype dtype, int d, int block, int chunks, int nr, float eps) {
  uint32_t bits;
  std::memcpy(&bits, &eps, sizeof bits);
  const char* t = shim::jit_type(dtype);
  return shim::jit_kernel(variant(t, d, block, chunks, nr, bits),
                          [&] { return cuda_source(t, d, block, chunks, nr, bits); });
}

// MLX's CUDA RMSNorm::eval_gpu's choice of threads a row (BLOCK) and rounds (CHUNKS) of
// NR-element vectors for a row of d elements; false where a thread would hold too many.
bool cuda_launch(int d, int nr, int& block, int& chunks) {
  int nvec = (d + nr - 1) / nr;
  if (d > nr * 128 * 8) {
    block = 1024;
    chunks = (d + 1024 * nr - 1) / (1024 * nr);
  } else if (d <= nr * 64) {
    block = 64;
    chunks = 1;
  } else if (nvec % 128 == 0 && nvec / 128 <= 8) {
    block = 128;
    chunks = nvec / 128;
  } else if (nvec % 64 == 0 && nvec / 64 <= 8) {
    block = 64;
    chunks = nvec / 64;
  } else {
    block = 128;
    chunks = std::min((nvec + 127) / 128, 8);
  }
  return chunks <= 8;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> shim::add_rms_norm_sources() {
  std::vector<std::pair<std::string, std::string>> out;
  const uint32_t eps = 0x358637bdu;  // 1e-6
  for (const auto& [t, size, d] : {std::tuple{"bf16_t", 2, 1024}, std::tuple{"bf16_t", 2, 3072},
                                   std::tuple{"bf16_t", 2, 4096}, std::tuple{"f16_t", 2, 2048},
                                   std::tuple{"float", 4, 896}, std::tuple{"bf16_t", 2, 16384}}) {
    int block = 0, chunks = 0;
    const int nr = 16 / size;
    if (cuda_launch(d, nr, block, chunks)) {
      out.emplace_back(variant(t, d, block, chunks, nr, eps), cuda_source(t, d, block, chunks, nr, eps));
    }
  }
  return out;
}

int mlxs_add_rms_norm(mlxs_array* h, mlxs_array* out, const mlxs_array x, const mlxs_array y, const mlxs_array w,
                      float eps, int kernel) {
  return guard([&] {
    const auto &xa = arr(x), &ya = arr(y), &wa = arr(w);
    // The kernel's launch (CUDA: threads a row and rounds, as MLX's RMSNorm picks them); none where
    // it was not asked for, no GPU backend runs it, or the inputs do not suit it.
    const int backend = kernel == 0 ? 0 : shim::kernel_backend();
    const int d = xa.ndim() > 0 ? xa.shape(-1) : 0;
    const bool suits = ya.shape() == xa.shape() && ya.dtype() == xa.dtype() && wa.dtype() == xa.dtype() &&
                       wa.ndim() == 1 && wa.shape(0) == d && d > 0 &&
                       (xa.dtype() == mx::bfloat16 || xa.dtype() == mx::float16 || xa.dtype() == mx::float32);
    const bool cuda = backend == 1;
    int block = 0, chunks = 0, nr = 16 / static_cast<int>(xa.itemsize());
    const bool cuda_runs = cuda && shim::jit_available() && cuda_launch(d, nr, block, chunks) &&
                           (!wa.is_available() || wa.flags().row_contiguous);
    if (backend == 0 || !suits || (cuda && !cuda_runs)) {
      auto sum = mx::add(xa, ya);
      *out = wrap(mx::fast::rms_norm(sum, wa, eps));
      *h = wrap(std::move(sum));
      return;
    }
    const int rows = static_cast<int>(xa.size() / d);
    std::vector<mx::array> outs;
    if (cuda) {
      outs = cuda_kernel_for(xa.dtype(), d, block, chunks, nr, eps)
                 .launch({xa, ya, wa}, {xa.shape(), xa.shape()}, {xa.dtype(), xa.dtype()}, {}, {},
                         {unsigned(rows), 1, 1}, {unsigned(block), 1, 1});
    } else {
      block = std::min(1024, std::max(32, (d + 31) / 32 * 32));
      std::vector<std::pair<std::string, mx::fast::TemplateArg>> targs{{"T", xa.dtype()}, {"D", d}, {"BLOCK", block}};
      outs = metal_kernel_for(eps)({xa, ya, wa}, {xa.shape(), xa.shape()}, {xa.dtype(), xa.dtype()},
                                   {rows * block, 1, 1}, {block, 1, 1}, targs, std::nullopt, false, {});
    }
    *h = wrap(outs[0]);
    *out = wrap(outs[1]);
  });
}
