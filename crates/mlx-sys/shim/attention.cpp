// mlx-gen's C ABI for attention of a few query positions as one CUDA kernel through MLX's custom-kernel
// API: softmax(q kᵀ · scale + mask) v for q (B, Hq, L, D) against the caches' k, v (B, Hkv, S, D),
// read in place through their strides (a cache's keys are a view of a longer buffer). It is what a
// batch decode step (one position a row, an array mask over each row's left padding) and a
// speculative verification (K+1 positions, causal) compute in every layer. The engine composes these
// of MLX operations on the GPU (nn/sdpa.rs: MLX's CUDA backend would build a cuDNN graph per shape),
// five kernels and two cuBLAS products a layer, each of which MLX's host encodes (a 32-row step of a
// 28-layer model spends about 9 ms of host time a step); here it is one kernel a layer. Measured
// (BENCHMARKS.md, 2026-12-06 third session): a Qwen3-0.6B batch step of 2-4 rows 1.3-1.4x faster, but
// the server at 8 and 32 streams no faster and a 9-position verification slower (the scan of every key
// once a query and position costs the device more than cuBLAS's products there), so the engine asks for
// it only with MLX_GEN_ATTN_KERNEL=1.
//
// One block of WARPS warps a query (b, head, position): each warp takes every WARPS-th key, its lanes
// D/32 dimensions each; a key's score is a warp sum, the softmax is online (running maximum and sum
// in float32, the output rescaled as the maximum grows), then the warps' partial results are merged.
// Rounding: float32 throughout (MLX's composed path rounds scores and probabilities to the input
// dtype), so it parts from MLX's attention by a bfloat16 step now and then; the engine uses it only
// where mlx-lm's tokens are not the reference (batch steps, verification).
#include "internal.h"

#include <string>
#include <vector>

namespace {

using shim::arr;
using shim::guard;
using shim::wrap;

// Template arguments: T (q, k, v, out), D (head dims, a multiple of 32 up to 256), WARPS, MASK (0 none,
// 1 boolean keep, 2 additive), CAUSAL (key s is seen by position l iff s <= S - L + l). q, k, v have
// unit stride along D (the shim makes them so); the mask is (B|1, H|1, L|1, S) with its own strides.
std::string cuda_body(uint32_t scale_bits) {
  return R"(
  const float scale = __int_as_float()" + std::to_string(scale_bits) + R"();
  const float NEG_INF = __int_as_float(0xff800000u);
  constexpr int E = D / 32;
  const int B = q_shape[0], HQ = q_shape[1], L = q_shape[2];
  const int HKV = k_shape[1], S = k_shape[2];
  const int l = blockIdx.x % L;
  const int h = (blockIdx.x / L) % HQ;
  const int b = blockIdx.x / (L * HQ);
  const int hk = h / (HQ / HKV);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ float sm_m[WARPS], sm_l[WARPS];
  __shared__ float sm_o[WARPS][D];
  float qv[E], o[E];
  const T* qp = q + b * q_strides[0] + h * q_strides[1] + l * q_strides[2] + lane * E;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    qv[e] = static_cast<float>(qp[e]);
    o[e] = 0.0f;
  }
  const T* kb = k + b * k_strides[0] + hk * k_strides[1] + lane * E;
  const T* vb = v + b * v_strides[0] + hk * v_strides[1] + lane * E;
  long long mbase = 0;
  if (MASK != 0) {
    mbase = (mask_shape[0] > 1 ? b : 0) * mask_strides[0] + (mask_shape[1] > 1 ? h : 0) * mask_strides[1] +
            (mask_shape[2] > 1 ? l : 0) * mask_strides[2];
  }
  const int last = CAUSAL ? S - L + l : S - 1;
  float mx = NEG_INF, sum = 0.0f;
  for (int s = warp; s <= last; s += WARPS) {
    float add = 0.0f;
    if (MASK != 0) {
      const float mv = static_cast<float>(mask[mbase + (long long)s * mask_strides[3]]);
      if (MASK == 1) {
        if (mv == 0.0f) {
          continue;
        }
      } else {
        add = mv;
      }
    }
    const T* kp = kb + (long long)s * k_strides[2];
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      dot = fmaf(qv[e], static_cast<float>(kp[e]), dot);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      dot += __shfl_xor_sync(0xffffffffu, dot, off);
    }
    const float score = dot * scale + add;
    if (score == NEG_INF) {
      continue;
    }
    const float nm = fmaxf(mx, score);
    const float factor = __expf(mx - nm);
    const float p = __expf(score - nm);
    sum = sum * factor + p;
    const T* vp = vb + (long long)s * v_strides[2];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      o[e] = fmaf(p, static_cast<float>(vp[e]), o[e] * factor);
    }
    mx = nm;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    sm_o[warp][lane * E + e] = o[e];
  }
  if (lane == 0) {
    sm_m[warp] = mx;
    sm_l[warp] = sum;
  }
  __syncthreads();
  if (warp == 0) {
    float m = NEG_INF;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      m = fmaxf(m, sm_m[w]);
    }
    float total = 0.0f, acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      acc[e] = 0.0f;
    }
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float f = sm_m[w] == NEG_INF ? 0.0f : __expf(sm_m[w] - m);
      total += sm_l[w] * f;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        acc[e] += sm_o[w][lane * E + e] * f;
      }
    }
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    T* op = out + (((long long)b * HQ + h) * L + l) * D + lane * E;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      op[e] = static_cast<T>(acc[e] * inv);
    }
  }
)";
}

constexpr int kWarps = 4;

// The kernel for `scale` (written into its source), built once per value and never destroyed.
const mx::fast::CustomKernelFunction& kernel_for(float scale) {
  static shim::KernelsByFloat kernels;
  return kernels.get(scale, [](uint32_t bits) {
    std::string body = cuda_body(bits);
    std::string name = shim::kernel_name("mlxgen_sdpa_few", body);
    return mx::fast::cuda_kernel(name, {"q", "k", "v", "mask"}, {"out"}, body, "", /* ensure_row_contiguous */ false);
  });
}

// Unit stride along the last axis (a copy otherwise).
mx::array unit_last(const mx::array& x) {
  return x.strides().back() == 1 ? x : mx::contiguous(x);
}

}  // namespace

int mlxs_sdpa_few_available(const mlxs_array q, const mlxs_array k, const mlxs_array v) {
  try {
    const auto &qa = arr(q), &ka = arr(k), &va = arr(v);
    const int d = qa.shape(-1);
    const bool fits = qa.ndim() == 4 && ka.ndim() == 4 && va.ndim() == 4 && d % 32 == 0 && d <= 256 &&
                      ka.shape(-1) == d && va.shape(-1) == d && ka.shape(2) == va.shape(2) && ka.shape(1) == va.shape(1) &&
                      ka.shape(1) > 0 && qa.shape(1) % ka.shape(1) == 0 && qa.shape(0) == ka.shape(0) &&
                      ka.dtype() == qa.dtype() && va.dtype() == qa.dtype() &&
                      (qa.dtype() == mx::bfloat16 || qa.dtype() == mx::float16 || qa.dtype() == mx::float32);
    return fits && shim::kernel_backend() == 1 ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int mlxs_sdpa_few(mlxs_array* out, const mlxs_array q, const mlxs_array k, const mlxs_array v, float scale,
                  const mlxs_array mask, int causal) {
  return guard([&] {
    if (mlxs_sdpa_few_available(q, k, v) != 1) {
      throw std::invalid_argument("sdpa_few: these inputs need MLX's attention (a CUDA GPU, 16- or 32-bit floats, "
                                  "head dims a multiple of 32 up to 256, k and v of one shape)");
    }
    const auto qa = unit_last(arr(q)), ka = unit_last(arr(k)), va = unit_last(arr(v));
    const int b = qa.shape(0), hq = qa.shape(1), l = qa.shape(2), d = qa.shape(3);
    int kind = 0;
    // Without a mask the kernel reads none: a constant of one element (data, no kernel to fill it), 4-D
    // so that its shape and strides are among the kernel's parameters as the body names them.
    mx::array m = mx::array({0.0f}, {1, 1, 1, 1});
    if (mask != nullptr) {
      m = arr(mask);
      kind = m.dtype() == mx::bool_ ? 1 : 2;
      if (kind == 2 && m.dtype() != qa.dtype()) {
        m = mx::astype(m, qa.dtype());
      }
      if (m.ndim() > 4) {
        throw std::invalid_argument("sdpa_few: a mask of more than 4 axes");
      }
      while (m.ndim() < 4) {
        m = mx::expand_dims(m, 0);
      }
      // Broadcast along S would have stride 0: keep MLX's layout but make S a real axis.
      if (m.shape(3) != ka.shape(2)) {
        m = mx::broadcast_to(m, {m.shape(0), m.shape(1), m.shape(2), ka.shape(2)});
      }
    }
    std::vector<std::pair<std::string, mx::fast::TemplateArg>> targs{
        {"T", qa.dtype()}, {"D", d}, {"WARPS", kWarps}, {"MASK", kind}, {"CAUSAL", causal != 0}};
    auto outs = kernel_for(scale)({qa, ka, va, m}, {{b, hq, l, d}}, {qa.dtype()}, {b * hq * l * kWarps * 32, 1, 1},
                                  {kWarps * 32, 1, 1}, targs, std::nullopt, false, {});
    *out = wrap(outs[0]);
  });
}
