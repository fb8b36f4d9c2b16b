// mlx-gen's C ABI for attention of a few query positions as one CUDA kernel of ours (jit.cpp: compiled
// once, launched by our own primitive): softmax(q kᵀ · scale + mask) v for q (B, Hq, L, D) against the caches' k, v (B, Hkv, S, D),
// read in place through their strides (a cache's keys are a view of a longer buffer). It is what a
// batch decode step (one position a row, an array mask over each row's left padding) and a
// speculative verification (K+1 positions, causal) compute in every layer. The engine composes these
// of MLX operations on the GPU (nn/sdpa.rs: MLX's CUDA backend would build a cuDNN graph per shape),
// five kernels and two cuBLAS products a layer, each of which MLX's host encodes (a 32-row step of a
// 28-layer model spends about 9 ms of host time a step); here it is one kernel a layer. Measured
// (BENCHMARKS.md, 2026-12-06c, through MLX's custom-kernel API, which wrote its source
// again on every call): a Qwen3-0.6B batch step of 2-4 rows 1.3-1.4x faster, but the server at 8 and
// 32 streams no faster and a 9-position verification slower (the scan of every key once a query and
// position costs the device more than cuBLAS's products there), so the engine asks for it only with
// MLX_GEN_ATTN_KERNEL=1 (to be measured again with our launch).
//
// One block of WARPS warps a query (b, head, position): each warp takes every WARPS-th key, its lanes
// D/32 dimensions each; a key's score is a warp sum, the softmax is online (running maximum and sum
// in float32, the output rescaled as the maximum grows), then the warps' partial results are merged.
// Rounding: float32 throughout (MLX's composed path rounds scores and probabilities to the input
// dtype), so it parts from MLX's attention by a bfloat16 step now and then; the engine uses it only
// where mlx-lm's tokens are not the reference (batch steps, verification).
#include "internal.h"

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace {

using shim::arr;
using shim::guard;
using shim::wrap;

// Constants: T (q, k, v, out), MT (the mask's type), D (head dims, a multiple of 32 up to 256), WARPS,
// MASK (0 none, 1 boolean keep, 2 additive), CAUSAL (key s is seen by position l iff s <= S - L + l).
// Scalars: q (B, HQ, L, D), k and v (B, HKV, S, D), the mask's leading sizes (M0, M1, M2; it is
// (M0, M1, M2, S)), then each input's four strides (elements), read at evaluation.
const char* kParams =
    "const T* q, const T* k, const T* v, const MT* mask, T* out, int B, int HQ, int L, int HKV, int S, int M0, "
    "int M1, int M2, int qs0, int qs1, int qs2, int qs3, int ks0, int ks1, int ks2, int ks3, int vs0, int vs1, "
    "int vs2, int vs3, int ms0, int ms1, int ms2, int ms3";

std::string cuda_body(uint32_t scale_bits) {
  return R"(
  const float scale = __int_as_float()" + std::to_string(scale_bits) + R"();
  const float NEG_INF = __int_as_float(0xff800000u);
  constexpr int E = D / 32;
  const int l = blockIdx.x % L;
  const int h = (blockIdx.x / L) % HQ;
  const int b = blockIdx.x / (L * HQ);
  const int hk = h / (HQ / HKV);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ float sm_m[WARPS], sm_l[WARPS];
  __shared__ float sm_o[WARPS][D];
  float qv[E], o[E];
  const T* qp = q + (long long)b * qs0 + (long long)h * qs1 + (long long)l * qs2 + (long long)lane * E * qs3;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    qv[e] = to_f(qp[(long long)e * qs3]);
    o[e] = 0.0f;
  }
  const T* kb = k + (long long)b * ks0 + (long long)hk * ks1 + (long long)lane * E * ks3;
  const T* vb = v + (long long)b * vs0 + (long long)hk * vs1 + (long long)lane * E * vs3;
  long long mbase = 0;
  if (MASK != 0) {
    mbase = (long long)(M0 > 1 ? b : 0) * ms0 + (long long)(M1 > 1 ? h : 0) * ms1 + (long long)(M2 > 1 ? l : 0) * ms2;
  }
  const int last = CAUSAL ? S - L + l : S - 1;
  float mx = NEG_INF, sum = 0.0f;
  for (int s = warp; s <= last; s += WARPS) {
    float add = 0.0f;
    if (MASK != 0) {
      const float mv = to_f(mask[mbase + (long long)s * ms3]);
      if (MASK == 1) {
        if (mv == 0.0f) {
          continue;
        }
      } else {
        add = mv;
      }
    }
    const T* kp = kb + (long long)s * ks2;
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      dot = fmaf(qv[e], to_f(kp[(long long)e * ks3]), dot);
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
    const T* vp = vb + (long long)s * vs2;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      o[e] = fmaf(p, to_f(vp[(long long)e * vs3]), o[e] * factor);
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
      op[e] = from_f<T>(acc[e] * inv);
    }
  }
)";
}

constexpr int kWarps = 4;

std::string source(const char* t, const char* mt, int d, int kind, bool causal, uint32_t scale_bits) {
  return std::string(shim::jit_prelude()) + "using T = " + t + ";\nusing MT = " + mt +
         ";\nextern \"C\" __global__ void __launch_bounds__(" + std::to_string(kWarps * 32) + ") KNAME(" + kParams +
         ") {\n  constexpr int D = " + std::to_string(d) + ";\n  constexpr int WARPS = " + std::to_string(kWarps) +
         ";\n  constexpr int MASK = " + std::to_string(kind) + ";\n  constexpr bool CAUSAL = " +
         (causal ? "true" : "false") + ";\n" + cuda_body(scale_bits) + "}\n";
}

std::string variant(const char* t, const char* mt, int d, int kind, bool causal, uint32_t scale_bits) {
  char key[128];
  std::snprintf(key, sizeof key, "mlxgen_sdpa_few_%s_%s_d%d_k%d_c%d_s%08x", t, mt, d, kind, causal ? 1 : 0, scale_bits);
  return key;
}

// The kernel for these types, sizes, mask kind and scale (a JitKernel, jit.cpp).
shim::JitKernel& kernel_for(mx::Dtype dtype, mx::Dtype mask_dtype, int d, int kind, bool causal, float scale) {
  uint32_t bits;
  std::memcpy(&bits, &scale, sizeof bits);
  const char* t = shim::jit_type(dtype);
  const char* mt = shim::jit_type(mask_dtype);
  return shim::jit_kernel(variant(t, mt, d, kind, causal, bits), [&] { return source(t, mt, d, kind, causal, bits); });
}

// Unit stride along the last axis (a copy otherwise).
mx::array unit_last(const mx::array& x) {
  return x.strides().back() == 1 ? x : mx::contiguous(x);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> shim::sdpa_few_sources() {
  std::vector<std::pair<std::string, std::string>> out;
  const uint32_t scale = 0x3db504f3u;  // 1 / sqrt(128)
  for (const auto& [t, mt, d, kind, causal] :
       {std::tuple{"bf16_t", "float", 128, 0, true}, std::tuple{"bf16_t", "bool", 128, 1, false},
        std::tuple{"bf16_t", "bf16_t", 64, 2, false}, std::tuple{"f16_t", "float", 256, 0, false},
        std::tuple{"float", "float", 32, 2, true}}) {
    out.emplace_back(variant(t, mt, d, kind, causal, scale), source(t, mt, d, kind, causal, scale));
  }
  return out;
}

int mlxs_sdpa_few_available(const mlxs_array q, const mlxs_array k, const mlxs_array v) {
  try {
    const auto &qa = arr(q), &ka = arr(k), &va = arr(v);
    const int d = qa.shape(-1);
    const bool fits = qa.ndim() == 4 && ka.ndim() == 4 && va.ndim() == 4 && d % 32 == 0 && d <= 256 &&
                      ka.shape(-1) == d && va.shape(-1) == d && ka.shape(2) == va.shape(2) && ka.shape(1) == va.shape(1) &&
                      ka.shape(1) > 0 && qa.shape(1) % ka.shape(1) == 0 && qa.shape(0) == ka.shape(0) &&
                      ka.dtype() == qa.dtype() && va.dtype() == qa.dtype() &&
                      (qa.dtype() == mx::bfloat16 || qa.dtype() == mx::float16 || qa.dtype() == mx::float32);
    return fits && shim::jit_available() ? 1 : 0;
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
    const int hkv = ka.shape(1), sk = ka.shape(2);
    auto outs = kernel_for(qa.dtype(), m.dtype(), d, kind, causal != 0, scale)
                    .launch({qa, ka, va, m}, {{b, hq, l, d}}, {qa.dtype()},
                            {b, hq, l, hkv, sk, m.shape(0), m.shape(1), m.shape(2)}, {true, true, true, true},
                            {unsigned(b * hq * l), 1, 1}, {kWarps * 32, 1, 1});
    *out = wrap(outs[0]);
  });
}
