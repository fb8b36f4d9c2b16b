// mlx-gen's C ABI for a mixture-of-experts router's choice as one CUDA kernel of ours (jit.cpp: compiled
// once, launched by our own primitive): the router's logits (rows, E) -> each row's k experts (uint32) and
// their weights. mlx-lm runs it as four to six MLX kernels a layer (softmax, argpartition, take_along_axis,
// then sum and divide where the weights are renormalised); a decode step on a GPU is bound by the host's
// cost of encoding kernels (Qwen3-30B-A3B: 48 such layers), so here it is one. Two forms:
// - mode 0, qwen3_moe / qwen2_moe: softmax(logits, precise) in the logits' dtype, the k largest, then
//   optionally `w / w.sum(-1)`;
// - mode 1, mixtral: the k largest logits, then softmax (precise) over those k;
// each then times a scaling factor where the model has one (deepseek_v2's routed_scaling_factor).
// Written to round as MLX's CUDA kernels do: the softmax as MLX's `cu::softmax` (blocks of 4 adjacent
// values a thread, BLOCK threads as Softmax::eval_gpu picks them, an online normaliser with `__expf`,
// cooperative groups' xor butterflies, `1 / normaliser` times each exponential, rounded to the dtype);
// the choice in the order MLX's argpartition gives on CUDA (a stable sort of the row): from_top = 1
// (qwen3_moe's `argpartition(g, kth=-k)[..., -k:]`) the k largest in ascending order, equal values
// by ascending index (so the larger index wins a tie at the boundary); from_top = 0 (the others'
// `argpartition(-g, kth=k-1)[..., :k]`) in descending order, equal values by ascending index; the
// renormalising sum as MLX's row reduction sums a short row (in the dtype itself, 8 values a thread
// in order, then the threads' sums), each weight divided by it in float32 and rounded (`__hdiv`); the factor cast to the dtype, the product rounded once. Other backends, dtypes and shapes leave the outputs null
// (the engine composes MLX's operations).
#include "internal.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace {

using shim::arr;
using shim::guard;
using shim::wrap;

// The softmax of MLX's cu::softmax over n values v[0..n) (float, from the dtype) by NT threads
// (a multiple of 32, the block's first NT), each thread `tid`: returns the row's max and writes
// nothing; `inv` gets 1 / the normaliser. Values past n read as -inf, as cub's LoadDirectBlocked
// with MLX's out-of-bounds default.
const char* kSoftmaxFn = R"(
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, m);
    v = v > o ? v : o;
  }
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, m);
  }
  return v;
}
// MLX's cu::softmax's reductions over v[0..n) with NT threads (tid < NT): (max, 1 / normaliser).
template <int NT>
__device__ __forceinline__ void softmax_stats(const float* v, int n, int tid, float* smax, float* ssum,
                                              float& maxval, float& inv) {
  const float neg_inf = -__int_as_float(0x7f800000);
  const float finite_min = -__int_as_float(0x7f7fffff);
  float prevmax;
  maxval = finite_min;
  float normalizer = 0.0f;
  const int rounds = (n + NT * 4 - 1) / (NT * 4);
  for (int r = 0; r < rounds; ++r) {
    float vals[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = (r * NT + tid) * 4 + i;
      vals[i] = e < n ? v[e] : neg_inf;
    }
    float tmax = vals[0];
#pragma unroll
    for (int i = 1; i < 4; ++i) {
      tmax = tmax > vals[i] ? tmax : vals[i];
    }
    prevmax = maxval;
    maxval = maxval > tmax ? maxval : tmax;
    normalizer = normalizer * __expf(prevmax - maxval);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      normalizer = normalizer + __expf(vals[i] - maxval);
    }
  }
  prevmax = maxval;
  maxval = warp_max(maxval);
  normalizer = normalizer * __expf(prevmax - maxval);
  normalizer = warp_sum(normalizer);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  prevmax = maxval;
  if (lane == 0) {
    smax[warp] = maxval;
  }
  __syncthreads();
  maxval = lane < NT / 32 ? smax[lane] : neg_inf;
  maxval = warp_max(maxval);
  normalizer = normalizer * __expf(prevmax - maxval);
  if (lane == 0) {
    ssum[warp] = normalizer;
  }
  __syncthreads();
  normalizer = lane < NT / 32 ? ssum[lane] : 0.0f;
  normalizer = warp_sum(normalizer);
  inv = 1.0f / normalizer;
}
)";

// Kernel: one block of BLOCK threads a row of E logits (type T); outputs inds (rows, K) u32, w (rows, K) T.
std::string cuda_source(const char* t, int e, int k, int block, int mode, int from_top, int normalize) {
  std::string head = std::string(shim::jit_prelude()) + kSoftmaxFn + "using T = " + t +
                     ";\nconstexpr int E = " + std::to_string(e) + ";\nconstexpr int K = " + std::to_string(k) +
                     ";\nconstexpr int BLOCK = " + std::to_string(block) + ";\nconstexpr int MODE = " +
                     std::to_string(mode) + ";\nconstexpr bool FROM_TOP = " + (from_top ? "true" : "false") +
                     ";\nconstexpr bool NORMALIZE = " + (normalize ? "true" : "false") + ";\n";
  return head + R"(
// Whether (va, ia) comes before (vb, ib) in the choice: the larger value, a tie by the index the
// stable sort puts last (FROM_TOP) or first.
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
  if (ib < 0) {
    return ia >= 0;
  }
  if (ia < 0) {
    return false;
  }
  return va > vb || (va == vb && (FROM_TOP ? ia > ib : ia < ib));
}
// The chosen weight `v` (a value of T) times the scaling factor (its bits; 0x3f800000, 1.0, for none) as
// a value of T, the product rounded once to T (as `scores * factor` in T).
__device__ __forceinline__ T scaled(float v, int scale_bits) {
  return from_f<T>(v * to_f(from_f<T>(__int_as_float(scale_bits))));
}
extern "C" __global__ void __launch_bounds__(BLOCK) KNAME(const T* logits, u32* inds, T* w, int scale_bits) {
  __shared__ float v[E];
  __shared__ unsigned char taken[E];
  __shared__ float smax[BLOCK / 32];
  __shared__ float ssum[BLOCK / 32];
  __shared__ int pick[K];
  __shared__ float chosen[K];
  const long long row = blockIdx.x;
  const int tid = threadIdx.x;
  const T* g = logits + row * E;
  for (int e = tid; e < E; e += BLOCK) {
    v[e] = to_f(g[e]);
    taken[e] = 0;
  }
  __syncthreads();
  if (MODE == 0) {
    float maxval, inv;
    softmax_stats<BLOCK>(v, E, tid, smax, ssum, maxval, inv);
    __syncthreads();
    for (int e = tid; e < E; e += BLOCK) {
      v[e] = to_f(from_f<T>(__expf(v[e] - maxval) * inv));
    }
    __syncthreads();
  }
  if (tid < 32) {
    for (int j = 0; j < K; ++j) {
      float bv = 0.0f;
      int bi = -1;
      for (int e = tid; e < E; e += 32) {
        if (!taken[e] && better(v[e], e, bv, bi)) {
          bv = v[e];
          bi = e;
        }
      }
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, m);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, m);
        if (better(ov, oi, bv, bi)) {
          bv = ov;
          bi = oi;
        }
      }
      if (tid == 0) {
        // MLX's order: FROM_TOP ascending (the best last), else descending (the best first).
        const int slot = FROM_TOP ? K - 1 - j : j;
        pick[slot] = bi;
        chosen[slot] = bv;
        taken[bi] = 1;
      }
      __syncwarp();
    }
  }
  __syncthreads();
  if (MODE == 1) {
    // softmax (precise) over the chosen logits in their order: the block is one warp (BLOCK = 32).
    float maxval, inv;
    softmax_stats<32>(chosen, K, tid, smax, ssum, maxval, inv);
    if (tid < K) {
      inds[row * K + tid] = static_cast<u32>(pick[tid]);
      w[row * K + tid] = scaled(to_f(from_f<T>(__expf(chosen[tid] - maxval) * inv)), scale_bits);
    }
    return;
  }
  if (tid < K) {
    inds[row * K + tid] = static_cast<u32>(pick[tid]);
    float out = chosen[tid];
    if (NORMALIZE) {
      // MLX's row_reduce_simple: blocks of 8 values a thread summed in order in T itself, then the
      // threads' sums by the xor butterfly (K <= 32: at most 4 of them).
      T part[4];
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        part[p] = from_f<T>(0.0f);
      }
      for (int j = 0; j < K; ++j) {
        part[j / 8] = add_t(part[j / 8], from_f<T>(chosen[j]));
      }
      const T sum = add_t(add_t(part[0], part[2]), add_t(part[1], part[3]));
      out = to_f(from_f<T>(out / to_f(sum)));
    }
    w[row * K + tid] = scaled(out, scale_bits);
  }
}
)";
}

std::string variant(const char* t, int e, int k, int block, int mode, int from_top, int normalize) {
  char key[128];
  std::snprintf(key, sizeof key, "mlxgen_moe_route_%s_e%d_k%d_b%d_m%d_t%d_n%d", t, e, k, block, mode, from_top,
                normalize);
  return key;
}

// MLX's Softmax::eval_gpu's threads a row for n values (4 a thread): the next power of two from 32 to 1024.
int softmax_block(int n) {
  int b = 32;
  while (b < 1024 && b * 4 < n) {
    b *= 2;
  }
  return b;
}

// Rows of up to this many experts (shared memory a block: 5 bytes an expert).
constexpr int kMaxExperts = 4096;
// The most experts chosen a row (mode 1's softmax over them is one warp's, 4 values a lane).
constexpr int kMaxChosen = 32;

}  // namespace

std::vector<std::pair<std::string, std::string>> shim::moe_route_sources() {
  std::vector<std::pair<std::string, std::string>> out;
  // qwen3_moe (128 experts, top 8, renormalised), qwen2_moe (60, top 4), mixtral (8, top 2), float32.
  for (const auto& [t, e, k, mode, top, norm] :
       {std::tuple{"bf16_t", 128, 8, 0, 1, 1}, std::tuple{"bf16_t", 60, 4, 0, 0, 0}, std::tuple{"bf16_t", 8, 2, 1, 0, 0},
        std::tuple{"float", 128, 8, 0, 1, 1}, std::tuple{"f16_t", 512, 10, 0, 1, 1}}) {
    const int block = mode == 0 ? softmax_block(e) : 32;
    out.emplace_back(variant(t, e, k, block, mode, top, norm), cuda_source(t, e, k, block, mode, top, norm));
  }
  return out;
}

int mlxs_moe_route(mlxs_array* inds, mlxs_array* weights, const mlxs_array logits, int k, int mode, int from_top,
                   int normalize, float scale) {
  return guard([&] {
    *inds = nullptr;
    *weights = nullptr;
    const auto& g = arr(logits);
    const int e = g.ndim() > 0 ? g.shape(-1) : 0;
    const bool suits = shim::jit_available() && e > 0 && e <= kMaxExperts && k >= 1 && k <= e &&
                       k <= kMaxChosen && (mode == 0 || mode == 1) &&
                       (g.dtype() == mx::bfloat16 || g.dtype() == mx::float16 || g.dtype() == mx::float32) &&
                       // a product's output, row-contiguous (the primitive checks it at evaluation)
                       (!g.is_available() || g.flags().row_contiguous);
    if (!suits) {
      return;
    }
    const long long rows = static_cast<long long>(g.size() / e);
    if (rows <= 0 || rows > 0x7fffffffLL) {
      return;
    }
    const int block = mode == 0 ? softmax_block(e) : 32;
    const char* t = shim::jit_type(g.dtype());
    auto& kernel = shim::jit_kernel(variant(t, e, k, block, mode, from_top, normalize),
                                    [&] { return cuda_source(t, e, k, block, mode, from_top, normalize); });
    mx::Shape shape = g.shape();
    shape.back() = k;
    int scale_bits;
    std::memcpy(&scale_bits, &scale, sizeof scale_bits);
    auto outs = kernel.launch({g}, {shape, shape}, {mx::uint32, g.dtype()}, {scale_bits}, {}, {unsigned(rows), 1, 1},
                              {unsigned(block), 1, 1});
    *inds = wrap(outs[0]);
    *weights = wrap(outs[1]);
  });
}
