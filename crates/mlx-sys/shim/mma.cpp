// mlx-gen's C ABI for a quantized product of 8-256 rows on the tensor cores, x (M, K) @ dequantize(w)ᵀ as
// one CUDA kernel of ours (jit.cpp: compiled once, launched by our own primitive): a batch decode step's
// products (a row a sequence) and a speculative verification's (K+1 positions). MLX 0.32.4's CUDA backend
// multiplies 8-64 rows with a tiled product that reads a 4-bit weight at about 100 GB/s on an H100 (a 3072 x
// 3072 weight: 45 us at 8 rows against 15 at one, `qmm_rows.py`), so a verification of 5-9 positions costs
// three decode steps and a 32-row batch step four and a half; the few-row kernel of qmm.cpp works on the CUDA
// cores and lost to MLX's from 8 rows. Here the weight is read once for all rows and the products run on
// the tensor cores (mma.sync m16n8k16, float32 sums).
//
// A warp computes 32 output columns (two 16-row tiles of the weight, the mma's A operand) for up to 32
// rows of x (four 8-row tiles, the B operand); the block's WARPS warps split K (chunks of 64 values,
// every WARPS-th chunk a warp) and sum their parts in shared memory. Within a chunk, thread t of a quad
// holds 16 adjacent values of K (t*16 .. t*16+15): one 8-byte load of each of its weight rows and two
// 16-byte loads of each of its x rows. The mma's k slots are assigned to K out of order (the sum over
// K does not depend on it), the same way for both operands: in the chunk's step s (0-3) the slots 2t,
// 2t+1, 2t+8, 2t+9 hold the values t*16 + 4s + 0..3, so a thread's A and B registers come from its own
// loads. A weight value is dequantized as MLX's affine form, scale * q + bias, in float32 and rounded
// to x's type (the mma's inputs); the products are summed in float32 in another order than MLX's
// kernels. The engine takes it for 8-32 rows by default on CUDA (measured on an H100: BENCHMARKS.md 2026-12-07e).
#include "internal.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

namespace {

// Constants: T (bf16_t or f16_t), GS (group size: 32, 64 or 128), NT (8-row tiles of x a block: 1, 2 or
// 4), WARPS. x (M, K) or (1, M, K) with strides ldx (rows) and xcs (values), w (N, K / 8) words, scales and
// biases (N, K / GS), out (M, N); blockIdx.x: 32 columns, blockIdx.y: 8 * NT rows.
const char* kBody = R"(
  constexpr int MT = 2;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int n_base = blockIdx.x * 32;
  const int r_base = blockIdx.y * 8 * NT;
  const int KW = K / 8;
  const int KG = K / GS;
  const bool w_vec = (reinterpret_cast<unsigned long long>(w) % 8) == 0;
  const bool x_vec = (reinterpret_cast<unsigned long long>(x) % 16) == 0 && ldx % 8 == 0 && xcs == 1;
  // The mma's four sums for weight tile mt and x tile nt at (mt * NT + nt) * 4.
  constexpr int ACC = MT * NT * 4;
  float acc[ACC];
#pragma unroll
  for (int i = 0; i < ACC; ++i) {
    acc[i] = 0.0f;
  }
  // A chunk's operands: this thread's weight rows n_base + mt * 16 + g + 8 * h (16 values each: two words,
  // their group's scale and bias) and x rows r_base + nt * 8 + g (the same 16 values: 8 words of two).
  struct Chunk {
    u32 wv[MT][2][2];
    float sc[MT][2];
    float bi[MT][2];
    u32 xv[NT][8];
  };
  auto load = [&](int c, Chunk& ch) {
    const int kt = c * 64 + t * 16;
    const int grp = kt / GS;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = n_base + mt * 16 + g + 8 * h;
        if (n < N) {
          const u32* wr = w + (long long)n * KW + kt / 8;
          if (w_vec) {
            const uint2 p = *reinterpret_cast<const uint2*>(wr);
            ch.wv[mt][h][0] = p.x;
            ch.wv[mt][h][1] = p.y;
          } else {
            ch.wv[mt][h][0] = wr[0];
            ch.wv[mt][h][1] = wr[1];
          }
          ch.sc[mt][h] = to_f(scales[(long long)n * KG + grp]);
          ch.bi[mt][h] = to_f(biases[(long long)n * KG + grp]);
        } else {
          ch.wv[mt][h][0] = 0u;
          ch.wv[mt][h][1] = 0u;
          ch.sc[mt][h] = 0.0f;
          ch.bi[mt][h] = 0.0f;
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int r = r_base + nt * 8 + g;
      if (r < M) {
        const T* xr = x + (long long)r * ldx + (long long)kt * xcs;
        if (x_vec) {
          const uint4 p0 = *reinterpret_cast<const uint4*>(xr);
          const uint4 p1 = *reinterpret_cast<const uint4*>(xr + 8);
          ch.xv[nt][0] = p0.x; ch.xv[nt][1] = p0.y; ch.xv[nt][2] = p0.z; ch.xv[nt][3] = p0.w;
          ch.xv[nt][4] = p1.x; ch.xv[nt][5] = p1.y; ch.xv[nt][6] = p1.z; ch.xv[nt][7] = p1.w;
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const u16 lo = reinterpret_cast<const u16*>(xr + (long long)(2 * i) * xcs)[0];
            const u16 hi = reinterpret_cast<const u16*>(xr + (long long)(2 * i + 1) * xcs)[0];
            ch.xv[nt][i] = static_cast<u32>(lo) | (static_cast<u32>(hi) << 16);
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          ch.xv[nt][i] = 0u;
        }
      }
    }
  };
  auto compute = [&](const Chunk& ch) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        // Values 4s .. 4s+3 of the thread's 16, rows g (h = 0) and g + 8 (h = 1), dequantized.
        float d[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const u32 word = ch.wv[mt][h][s >> 1];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const u32 q = (word >> (4 * ((s & 1) * 4 + j))) & 15u;
            d[h][j] = ch.sc[mt][h] * static_cast<float>(q) + ch.bi[mt][h];
          }
        }
        // A: {row g, slots 2t, 2t+1}, {row g+8, same}, {row g, slots 2t+8, 2t+9}, {row g+8, same}.
        const u32 a0 = pack2(d[0][0], d[0][1]);
        const u32 a1 = pack2(d[1][0], d[1][1]);
        const u32 a2 = pack2(d[0][2], d[0][3]);
        const u32 a3 = pack2(d[1][2], d[1][3]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          // B: {slots 2t, 2t+1} and {2t+8, 2t+9} of column g: the thread's values 4s, 4s+1 and 4s+2, 4s+3.
          mma16816(acc + (mt * NT + nt) * 4, a0, a1, a2, a3, ch.xv[nt][2 * s], ch.xv[nt][2 * s + 1]);
        }
      }
    }
  };
  // Every WARPS-th chunk of 64 values of K, the next one's loads issued before this one's products.
  const int chunks = K / 64;
  Chunk cur;
  if (warp < chunks) {
    load(warp, cur);
  }
  for (int c = warp; c < chunks; c += WARPS) {
    Chunk next;
    const bool more = c + WARPS < chunks;
    if (more) {
      load(c + WARPS, next);
    }
    compute(cur);
    if (more) {
      cur = next;
    }
  }
  // The warps' parts summed in shared memory, then written by warp 0: the four sums of tiles (mt, nt)
  // are columns mt*16 + g (0, 1) and + 8 (2, 3) of rows nt*8 + 2t (0, 2) and + 1 (1, 3).
  __shared__ float part[WARPS - 1][ACC][32];
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < ACC; ++i) {
      part[warp - 1][i][lane] = acc[i];
    }
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int i = 0; i < ACC; ++i) {
      float v = acc[i];
#pragma unroll
      for (int o = 0; o < WARPS - 1; ++o) {
        v += part[o][i][lane];
      }
      const int mt = i / (NT * 4), nt = (i / 4) % NT, j = i % 4;
      const int r = r_base + nt * 8 + 2 * t + (j & 1);
      const int n = n_base + mt * 16 + g + 8 * (j >> 1);
      if (r < M && n < N) {
        out[(long long)r * N + n] = from_f<T>(v);
      }
    }
  }
)";

// The mma and the packing of two floats into its 16-bit operand type (the first in the low half).
std::string helpers(const char* mma_t) {
  const std::string cvt = std::string(mma_t) == "bf16" ? "cvt.rn.bf16x2.f32" : "cvt.rn.f16x2.f32";
  return std::string(R"(
__device__ __forceinline__ u32 pack2(float lo, float hi) {
  u32 r;
  asm(")") + cvt + R"( %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.)" + mma_t + "." + mma_t + R"(.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
)";
}

// Warps a block (they split K): 8, or with MLX_GEN_QMM_MMA_WARPS=16 (a measurement knob, off until measured)
// 16 for blocks of one or two row tiles. Each warp walks its K chunks one after another (the next chunk's
// loads issued before this one's products), so a 3072-wide K is 6 chunks a warp at 8 warps, 3 at 16: a
// product of 8 rows by a 3072 x 3072 weight took 9.2 us on an H100 where its bytes take about 2 at the
// memory's pace (BENCHMARKS.md 2026-12-07e). Four tiles keep 8: their partial sums (ACC = 32 a lane) for 15
// more warps would pass the 48 KB of static shared memory.
int warps(int nt) {
  static const int asked = [] {
    const char* v = std::getenv("MLX_GEN_QMM_MMA_WARPS");
    return v != nullptr && std::atoi(v) == 16 ? 16 : 8;
  }();
  return nt <= 2 ? asked : 8;
}

// x's strides come after the scalars, one an axis: (ldx, xcs) for x (M, K), (unused, ldx, xcs) for (1, M, K).
std::string key(const char* t, int gs, int nt, int ndim, int nw) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "mlxgen_qmm_mma%d_%s_g%d_n%d_w%d", ndim, t, gs, nt, nw);
  return buf;
}

std::string source(const char* t, int gs, int nt, int ndim, int nw) {
  const char* mma_t = std::string(t) == "bf16_t" ? "bf16" : "f16";
  char consts[128];
  std::snprintf(consts, sizeof consts, "  constexpr int GS = %d;\n  constexpr int NT = %d;\n  constexpr int WARPS = %d;\n",
                gs, nt, nw);
  return std::string(shim::jit_prelude()) + "using T = " + t + ";\n" + helpers(mma_t) +
         "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(nw * 32) +
         ") KNAME(const T* x, const u32* w, const T* scales, const T* biases, T* out, int M, int K, int N, " +
         (ndim == 3 ? "int xs0, " : "") + "int ldx, int xcs) {\n" +
         consts + kBody + "}\n";
}

// 8-row tiles of x a block for m rows: 1, 2 or 4 (32 rows; more rows take more blocks), at most
// MLX_GEN_QMM_MMA_TILES (1, 2 or 4; default 4). Fewer tiles a block take fewer registers (ptxas: 80 at one
// tile, 172 at four), so more blocks share an SM, and more blocks (each reading the weight, the second time
// from L2) for the same rows. Measured on an H100 (Llama-3.2-3B shape, batch step of 32 rows): 7.74 ms at 4
// tiles, 7.92 at 2, 9.57 at 1 (BENCHMARKS.md 2026-12-07e).
int tiles(int m) {
  static const int cap = [] {
    const char* v = std::getenv("MLX_GEN_QMM_MMA_TILES");
    const int c = v == nullptr ? 4 : std::atoi(v);
    return c == 1 || c == 2 ? c : 4;
  }();
  return std::min(m <= 8 ? 1 : m <= 16 ? 2 : 4, cap);
}

// Whether the kernel takes this product: x (M, K) or (1, M, K) of 8-256 rows of a 16-bit float, affine
// 4-bit weights (N, K / 8) in groups of 32, 64 or 128, K a multiple of 64, scales and biases of x's type,
// on a CUDA GPU where the tensor cores take 16-bit mma (sm_80 and later).
bool suits(const mx::array& x, const mx::array& w, const mx::array& s, const mx::array* b, int gs, int bits,
           const std::string& mode) {
  if (mode != "affine" || b == nullptr || bits != 4 || (gs != 32 && gs != 64 && gs != 128) || !shim::jit_available()) {
    return false;
  }
  if (!(x.ndim() == 2 || (x.ndim() == 3 && x.shape(0) == 1)) || (x.dtype() != mx::bfloat16 && x.dtype() != mx::float16)) {
    return false;
  }
  auto in_place = [](const mx::array& a) { return !a.is_available() || a.flags().row_contiguous; };
  const int m = x.shape(-2), k = x.shape(-1), n = w.ndim() == 2 ? w.shape(0) : 0;
  return m >= 8 && m <= 256 && k % 64 == 0 && w.ndim() == 2 && w.dtype() == mx::uint32 && w.shape(1) * 8 == k &&
         s.ndim() == 2 && s.shape(0) == n && s.shape(1) == k / gs && s.dtype() == x.dtype() && b->dtype() == x.dtype() &&
         b->shape() == s.shape() && in_place(w) && in_place(s) && in_place(*b) && shim::jit_sm() >= 80;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> shim::qmm_mma_sources() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [t, gs, nt, nd, nw] : {std::tuple{"bf16_t", 64, 1, 2, 8}, std::tuple{"bf16_t", 64, 2, 2, 8},
                                          std::tuple{"bf16_t", 64, 4, 2, 8}, std::tuple{"bf16_t", 64, 1, 3, 8},
                                          std::tuple{"f16_t", 32, 4, 2, 8}, std::tuple{"bf16_t", 128, 4, 3, 8},
                                          std::tuple{"bf16_t", 64, 1, 2, 16}, std::tuple{"f16_t", 128, 2, 3, 16}}) {
    out.emplace_back(key(t, gs, nt, nd, nw), source(t, gs, nt, nd, nw));
  }
  return out;
}

int mlxs_qmm_mma(mlxs_array* out, const mlxs_array x, const mlxs_array w, const mlxs_array scales,
                 const mlxs_array biases, int group_size, int bits, const char* mode) {
  auto fits = [&](const mx::array& xa, const mx::array& wa, const mx::array& sa, const mx::array* ba,
                  const std::string& md) { return suits(xa, wa, sa, ba, group_size, bits, md); };
  auto run = [&](const mx::array& xa, const mx::array& wa, const mx::array& sa, const mx::array& ba) {
    const int m = xa.shape(-2), k = xa.shape(-1), n = wa.shape(0), nd = xa.ndim();
    const int nt = tiles(m), nw = warps(nt);
    const char* t = shim::jit_type(xa.dtype());
    auto& kern = shim::jit_kernel(key(t, group_size, nt, nd, nw), [&] { return source(t, group_size, nt, nd, nw); });
    mx::Shape shape = xa.shape();
    shape.back() = n;
    return kern.launch({xa, wa, sa, ba}, {shape}, {xa.dtype()}, {m, k, n}, {true, false, false, false},
                       {unsigned((n + 31) / 32), unsigned((m + 8 * nt - 1) / (8 * nt)), 1}, {unsigned(nw * 32), 1, 1})[0];
  };
  return shim::quantized_product(out, x, w, scales, biases, group_size, bits, mode, fits, run);
}
