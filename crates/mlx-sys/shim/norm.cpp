// mlx-gen's C ABI for the residual add fused with the RMS norm that follows it:
// h = x + y; out = rms_norm(h, w, eps). A decoder layer runs this pair twice (after attention and
// after the feed-forward part, the second into the next layer's input norm); MLX runs it as two
// kernels, each one more for the host to encode per token (decode on a GPU is host-bound). Here it
// is one kernel through MLX's custom-kernel API, written to round exactly as MLX's two do:
// - the sum in the input dtype (the same `+` on the CUDA type as MLX's binary kernel);
// - the sum of squares in float32, each thread over the same elements in the same order as MLX's
//   CUDA `rms_norm_small` / `rms_norm` kernels (N_READS = 16 bytes of elements per vector, the
//   vectors of a row dealt to BLOCK threads in CHUNKS rounds, chosen as RMSNorm::eval_gpu chooses
//   them), then a warp reduction and a reduction of the warps' partial sums (cooperative groups);
// - rsqrt(sum / D + eps), then w * T(x * normalizer) in the input dtype.
// On an H100 it is bit for bit MLX's (`gpu_suite.sh fusednorm`: equal log-probabilities, 64 tokens,
// hidden sizes 1,024 and 3,072) but slower (decode 0.92-0.99x): the custom-kernel call costs the host
// more than MLX's two built-in kernels, so the engine asks for it only with MLX_GEN_FUSED_NORM=1.
// The CPU takes MLX's two operations. The Metal kernel (one threadgroup a row, simd sums) is written to
// the same formula; MLX's Metal reduction order is not replicated, and it runs only when
// MLX_GEN_FUSED_NORM=1 asks for it (not tried: no Mac here).
#include "internal.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using shim::arr;
using shim::guard;
using shim::wrap;

// Inputs x, y (rows, D) and w (D,); outputs h = x + y and out = the normed h. Template arguments:
// T, D, BLOCK (threads a row), CHUNKS (rounds of NR-element vectors a thread takes), NR. eps is
// written into the source (one kernel per eps) as its float bits.
std::string cuda_body(uint32_t eps_bits) {
  return R"(
  const float eps = __int_as_float()" + std::to_string(eps_bits) + R"();
  namespace cg = cooperative_groups;
  auto block = cg::this_thread_block();
  auto warp = cg::tiled_partition<32>(block);
  __shared__ float partial[BLOCK / 32];
  const long long row = blockIdx.x;
  const int tid = threadIdx.x;
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
      T s = static_cast<T>(0.0f);
      if (e < D) {
        s = xr[e] + yr[e];
        hr[e] = s;
      }
      v[i][j] = s;
      float t = static_cast<float>(s);
      acc += t * t;
    }
  }
  float sum = cg::reduce(warp, acc, cg::plus<float>());
  if (warp.thread_rank() == 0) {
    partial[warp.meta_group_rank()] = sum;
  }
  block.sync();
  sum = warp.thread_rank() < warp.meta_group_size() ? partial[warp.thread_rank()] : 0.0f;
  sum = cg::reduce(warp, sum, cg::plus<float>());
  const float normalizer = rsqrt(sum / static_cast<float>(D) + eps);
#pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
    const int base = (BLOCK * i + tid) * NR;
#pragma unroll
    for (int j = 0; j < NR; ++j) {
      const int e = base + j;
      if (e < D) {
        float yv = static_cast<float>(v[i][j]) * normalizer;
        outr[e] = w[e] * static_cast<T>(yv);
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

// The kernel for eps on this backend, built once per eps value and never destroyed.
const mx::fast::CustomKernelFunction& kernel_for(float eps, bool cuda) {
  static shim::KernelsByFloat kernels;
  return kernels.get(eps, [cuda](uint32_t bits) {
    std::vector<std::string> in{"x", "y", "w"}, out{"h", "out"};
    std::string body = cuda ? cuda_body(bits) : metal_body(bits);
    std::string name = shim::kernel_name("mlxgen_add_rms_norm", body);
    return cuda ? mx::fast::cuda_kernel(name, in, out, body, "#include <cooperative_groups/reduce.h>\n")
                : mx::fast::metal_kernel(name, in, out, body);
  });
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
    if (backend == 0 || !suits || (cuda && !cuda_launch(d, nr, block, chunks))) {
      auto sum = mx::add(xa, ya);
      *out = wrap(mx::fast::rms_norm(sum, wa, eps));
      *h = wrap(std::move(sum));
      return;
    }
    const int rows = static_cast<int>(xa.size() / d);
    std::vector<std::pair<std::string, mx::fast::TemplateArg>> targs{{"T", xa.dtype()}, {"D", d}};
    if (cuda) {
      targs.insert(targs.end(), {{"BLOCK", block}, {"CHUNKS", chunks}, {"NR", nr}});
    } else {
      block = std::min(1024, std::max(32, (d + 31) / 32 * 32));
      targs.emplace_back("BLOCK", block);
    }
    auto outs = kernel_for(eps, cuda)({xa, ya, wa}, {xa.shape(), xa.shape()}, {xa.dtype(), xa.dtype()},
                                      {rows * block, 1, 1}, {block, 1, 1}, targs, std::nullopt, false, {});
    *h = wrap(outs[0]);
    *out = wrap(outs[1]);
  });
}
