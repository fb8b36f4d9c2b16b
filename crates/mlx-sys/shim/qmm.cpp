// mlx-gen's C ABI for a quantized product of a few rows, x (M, K) or (1, M, K) @ dequantize(w)ᵀ for 1 <= M <= 7,
// as one CUDA kernel of ours (jit.cpp: compiled once, launched by our own primitive): a decode step's
// products (one row), a batch
// decode step's (one row a sequence) and a speculative verification's (K+1 positions). MLX 0.32's
// CUDA backend runs 1-7 rows with its matrix-vector kernel once a row (from 8 rows a tiled product),
// and that kernel reads a weight at about a sixth of the H200's memory bandwidth (16384 x 3072, 4-bit:
// 33 us for 25 MB, `batch_step_cost --qmm`), which is most of a 7B model's decode step. Ours reads
// large weights at 1.7-1.9 TB/s on the H100 (MLX's: about 1), 1.2-1.9x MLX's speed at one row,
// 1.6-2.9x at 2-4; from 8 rows MLX's tiled product is 3-5x faster, so 8 rows and more take MLX's. A
// gathered variant takes mlx-lm's SwitchLinear for a few tokens (each (token, expert) slot through its
// expert's weight).
//
// Here a block of 128 threads computes R output columns for all M rows. Its threads split K: each
// reads one 16-byte pack of every one of the R weight rows at a time (32 values at 4 bits, 16 at 8;
// a warp reads 512 contiguous bytes a row, R loads in flight a thread), and the matching values of
// x's rows. A pack lies in one quantization group, so the sum is s * sum(x q) + b * sum(x) per pack
// (MLX's affine dequantization, scale * q + bias, summed in another order). A value q becomes a float
// without a conversion instruction: the bits of q at bit position p, OR-ed into the exponent of
// 2^(23 - p), are the float 2^(23 - p) + q. Sums in float32, then a warp sum and one across the
// block's warps. The result rounds differently from MLX's kernels (another summation order).
// Other backends, dtypes, bit widths, modes or row counts take MLX's quantized_matmul.
#include "internal.h"

#include <cstdlib>
#include <string>
#include <vector>

namespace {

using shim::arr;
using shim::guard;
using shim::opt;
using shim::wrap;

// The plain product's parameters: x (M, K) with strides (ldx, xcs) in elements, w (N, K * BITS / 32),
// out (M, N).
const char* kRowsParams =
    "const T* x, const u32* w, const T* scales, const T* biases, T* out, int M, int K, int N, int ldx, int xcs";
// The same for x (1, M, K) (a single sequence's decode step, verification), out (1, M, N): x's first
// stride comes first and is not used, so the engine needs no reshape (a primitive a product) around it.
const char* kRows3Params =
    "const T* x, const u32* w, const T* scales, const T* biases, T* out, int M, int K, int N, int xs0, int ldx, "
    "int xcs";
const char* kRowsPrologue = "";

// The gathered product's (mlx-lm's SwitchLinear for a few tokens): one slot (token, chosen expert)
// a block row, blockIdx.y (gridDim.y slots); indices (T, topk) with strides (ldi, ics) name each
// slot's expert, w (E, N, K * BITS / 32) stacks the experts, x (strides ldx, xcs) holds a row a slot
// (xrows = T * topk) or a row a token (xrows = T, shared by its topk slots); out (T, topk, N). The
// pointers are moved to the slot's expert, x row and output row.
const char* kGatherParams =
    "const T* x, const u32* w, const T* scales, const T* biases, const u32* indices, T* out, int K, int N, "
    "int topk, int xrows, int ldx, int xcs, int ldi, int ics";
const char* kGatherPrologue = R"(
  const int slots = gridDim.y;
  const int slot = blockIdx.y;
  const int M = 1;
  const long long e = indices[(long long)(slot / topk) * ldi + (long long)(slot % topk) * ics];
  const int xrow = xrows == slots ? slot : slot / topk;
  w += e * N * (K / (32 / BITS));
  scales += e * N * (K / GS);
  biases += e * N * (K / GS);
  x += (long long)xrow * ldx;
  out += (long long)slot * N;
)";

// Constants: T (x, scales, biases, out: bf16_t or f16_t), BITS (4 or 8), GS (group size), MMAX
// (rows the accumulators hold, M <= MMAX), R (output columns a block), THREADS (a block's threads);
// M, K, N from the parameters or a prologue above. Weights are read in packs where their data start
// on a pack's size (then every row does: K is a multiple of a pack's values), else word by word; x
// likewise where its values are adjacent and its rows start on a pack's size too, else one by one.
const char* kCudaBody = R"(
  constexpr int VPW = 32 / BITS;      // values a 32-bit word
  constexpr int VPU = 4 * VPW;        // values a 16-byte pack
  constexpr int HALF = 16 / BITS;     // values a 16-bit half word
  constexpr unsigned QMASK = (1u << BITS) - 1u;
  constexpr int WARPS = THREADS / 32;
  struct alignas(sizeof(T) * VPW) XPack { T v[VPW]; };
  __shared__ float red[WARPS][R][MMAX];
  const int U = K / VPU;
  const int KG = K / GS;
  const int n0 = blockIdx.x * R;
  const int tid = threadIdx.x;
  const bool w_packed = (reinterpret_cast<unsigned long long>(w) % 16) == 0;
  const bool x_packed = xcs == 1 && (M == 1 || ldx % VPW == 0) &&
                        (reinterpret_cast<unsigned long long>(x) % sizeof(XPack)) == 0;
  float acc[R][MMAX];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < MMAX; ++m) {
      acc[r][m] = 0.0f;
    }
  }
  for (int u = tid; u < U; u += THREADS) {
    u32 words[R][4];
    float s[R];
    float b[R];
    const int g = (u * VPU) / GS;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int n = n0 + r;
      if (n < N) {
        const u32* wr = w + ((long long)n * U + u) * 4;
        if (w_packed) {
          const uint4 p = *reinterpret_cast<const uint4*>(wr);
          words[r][0] = p.x;
          words[r][1] = p.y;
          words[r][2] = p.z;
          words[r][3] = p.w;
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            words[r][i] = wr[i];
          }
        }
        s[r] = to_f(scales[(long long)n * KG + g]);
        b[r] = to_f(biases[(long long)n * KG + g]);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          words[r][i] = 0u;
        }
        s[r] = 0.0f;
        b[r] = 0.0f;
      }
    }
    float dot[R][MMAX];
    float xsum[MMAX];
#pragma unroll
    for (int m = 0; m < MMAX; ++m) {
      xsum[m] = 0.0f;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        dot[r][m] = 0.0f;
      }
    }
#pragma unroll
    for (int wi = 0; wi < 4; ++wi) {
      float xv[MMAX][VPW];
#pragma unroll
      for (int m = 0; m < MMAX; ++m) {
        if (m < M) {
          const T* xr = x + (long long)m * ldx + ((long long)u * VPU + wi * VPW) * xcs;
          if (x_packed) {
            const XPack p = *reinterpret_cast<const XPack*>(xr);
#pragma unroll
            for (int j = 0; j < VPW; ++j) {
              xv[m][j] = to_f(p.v[j]);
            }
          } else {
#pragma unroll
            for (int j = 0; j < VPW; ++j) {
              xv[m][j] = to_f(xr[(long long)j * xcs]);
            }
          }
#pragma unroll
          for (int j = 0; j < VPW; ++j) {
            xsum[m] += xv[m][j];
          }
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float q[VPW];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const u32 bits = h == 0 ? words[r][wi] : (words[r][wi] >> 16);
#pragma unroll
          for (int j = 0; j < HALF; ++j) {
            const u32 e = (u32)(127 + 23 - BITS * j) << 23;
            q[h * HALF + j] = __uint_as_float((bits & (QMASK << (BITS * j))) | e) - __uint_as_float(e);
          }
        }
#pragma unroll
        for (int m = 0; m < MMAX; ++m) {
          if (m < M) {
#pragma unroll
            for (int j = 0; j < VPW; ++j) {
              dot[r][m] = fmaf(xv[m][j], q[j], dot[r][m]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int m = 0; m < MMAX; ++m) {
        acc[r][m] += s[r] * dot[r][m] + b[r] * xsum[m];
      }
    }
  }
  const int lane = tid & 31;
  const int warp = tid >> 5;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < MMAX; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, off);
      }
      if (lane == 0) {
        red[warp][r][m] = v;
      }
    }
  }
  __syncthreads();
  if (tid < R * MMAX) {
    const int r = tid / MMAX;
    const int m = tid % MMAX;
    if (m < M && n0 + r < N) {
      float v = 0.0f;
#pragma unroll
      for (int i = 0; i < WARPS; ++i) {
        v += red[i][r][m];
      }
      out[(long long)m * N + n0 + r] = from_f<T>(v);
    }
  }
)";

constexpr int kThreads = 128;
// Output columns a block (R): 4, or MLX_GEN_QMM_COLS = 1, 2, 4 or 8 to measure the trade between a
// thread's registers (ptxas, bf16 4-bit: 72 at one row and R = 4, 124 at 4 rows, 200 at 8; 48, 79
// and 146 with R = 2), which bound the blocks an SM holds, and x's reuse across the block's rows.
int cols() {
  static const int c = [] {
    const char* v = std::getenv("MLX_GEN_QMM_COLS");
    const int n = v == nullptr ? 4 : std::atoi(v);
    return n == 1 || n == 2 || n == 4 || n == 8 ? n : -1;
  }();
  if (c < 0) {
    throw std::invalid_argument("MLX_GEN_QMM_COLS must be 1, 2, 4 or 8");
  }
  return c;
}

// The kernels' forms: the plain product of x (M, K) or (1, M, K), the gathered one.
struct Form {
  const char* base;
  const char* params;
  const char* prologue;
};
const Form kRows{"mlxgen_qmm_rows", kRowsParams, kRowsPrologue};
const Form kRows3{"mlxgen_qmm_rows3", kRows3Params, kRowsPrologue};
const Form kGather{"mlxgen_gather_qmm_rows", kGatherParams, kGatherPrologue};

// The cache key of `form`'s variant for x's kernel type `t` and these constants.
std::string key(const Form& form, const char* t, int bits, int gs, int mmax, int r) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s_%s_b%d_g%d_m%d_r%d", form.base, t, bits, gs, mmax, r);
  return buf;
}

// That variant's source.
std::string source(const Form& form, const char* t, int bits, int gs, int mmax, int r) {
  char consts[160];
  std::snprintf(consts, sizeof consts,
                "  constexpr int BITS = %d;\n  constexpr int GS = %d;\n  constexpr int MMAX = %d;\n"
                "  constexpr int R = %d;\n  constexpr int THREADS = %d;\n",
                bits, gs, mmax, r, kThreads);
  return std::string(shim::jit_prelude()) + "using T = " + t + ";\nextern \"C\" __global__ void __launch_bounds__(" +
         std::to_string(kThreads) + ") KNAME(" + form.params + ") {\n" + consts + form.prologue + kCudaBody + "}\n";
}

// The kernel variant, its source written and compiled on first use (jit.cpp).
shim::JitKernel& kernel(const Form& form, mx::Dtype dtype, int bits, int gs, int mmax, int r) {
  const char* t = shim::jit_type(dtype);
  return shim::jit_kernel(key(form, t, bits, gs, mmax, r), [&] { return source(form, t, bits, gs, mmax, r); });
}

// Whether a weight array the kernel reads as row-contiguous is (the primitive refuses another at
// evaluation, where nothing can be copied): known once it is evaluated, as loaded weights are; an
// array still to be computed is taken on trust (the engine's are contiguous).
bool rows_in_place(const mx::array& a) {
  return !a.is_available() || a.flags().row_contiguous;
}

// The quantization and dtypes both kernels take: affine 4- or 8-bit weights in groups of 32, 64 or
// 128 dividing K, scales and biases of x's type, x a 16-bit float, on a CUDA GPU.
bool suits_quant(const mx::array& x, const mx::array& s, const mx::array* b, int gs, int bits, const std::string& mode) {
  if (mode != "affine" || b == nullptr || (bits != 4 && bits != 8) || (gs != 32 && gs != 64 && gs != 128)) {
    return false;
  }
  if (x.dtype() != mx::bfloat16 && x.dtype() != mx::float16) {
    return false;
  }
  return x.shape(-1) % gs == 0 && s.dtype() == x.dtype() && b->dtype() == x.dtype() &&
         b->shape() == s.shape() && rows_in_place(s) && rows_in_place(*b) && shim::jit_available();
}

// Whether the kernel takes this product: x (M, K) or (1, M, K) of 1-7 rows, weights (out, in) (and
// suits_quant).
bool suits(const mx::array& x, const mx::array& w, const mx::array& s, const mx::array* b, int gs, int bits,
           const std::string& mode) {
  if (!(x.ndim() == 2 || (x.ndim() == 3 && x.shape(0) == 1)) || !suits_quant(x, s, b, gs, bits, mode) ||
      w.ndim() != 2 || s.ndim() != 2 || w.dtype() != mx::uint32 || !rows_in_place(w)) {
    return false;
  }
  const int m = x.shape(-2), k = x.shape(-1), n = w.shape(0);
  return m >= 1 && m <= 7 && w.shape(1) * (32 / bits) == k && s.shape(0) == n && s.shape(1) == k / gs;
}

// Whether the gathered kernel takes this product: x (T or T * k, K), stacked weights (E, out, in),
// indices (T, k) of uint32 (and suits_quant).
bool suits_gather(const mx::array& x, const mx::array& w, const mx::array& s, const mx::array* b,
                  const mx::array& idx, int gs, int bits, const std::string& mode) {
  if (x.ndim() != 2 || !suits_quant(x, s, b, gs, bits, mode) || w.ndim() != 3 || s.ndim() != 3 || w.dtype() != mx::uint32 ||
      !rows_in_place(w) || idx.ndim() != 2 || idx.dtype() != mx::uint32) {
    return false;
  }
  const int k = x.shape(1), slots = idx.shape(0) * idx.shape(1);
  return (x.shape(0) == idx.shape(0) || x.shape(0) == slots) && slots >= 1 && w.shape(2) * (32 / bits) == k &&
         s.shape(0) == w.shape(0) && s.shape(1) == w.shape(1) && s.shape(2) == k / gs;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> shim::qmm_sources() {
  std::vector<std::pair<std::string, std::string>> out;
  auto add = [&](const Form& form, const char* t, int bits, int gs, int mmax, int r) {
    out.emplace_back(key(form, t, bits, gs, mmax, r), source(form, t, bits, gs, mmax, r));
  };
  for (const char* t : {"bf16_t", "f16_t"}) {
    for (int bits : {4, 8}) {
      for (int mmax : {1, 2, 4, 8}) {
        add(kRows, t, bits, 64, mmax, 4);
      }
      add(kRows3, t, bits, 64, 1, 4);
      add(kGather, t, bits, 32, 1, 4);
    }
  }
  for (int r : {1, 2, 8}) {
    add(kRows, "bf16_t", 4, 128, 2, r);
  }
  return out;
}

int shim::quantized_product(mlxs_array* out, const mlxs_array x, const mlxs_array w, const mlxs_array scales,
                            const mlxs_array biases, int group_size, int bits, const char* mode,
                            const QuantSuits& suits, const QuantLaunch& launch) {
  return guard([&] {
    const auto &xa = arr(x), &wa = arr(w), &sa = arr(scales);
    const mx::array* ba = biases == nullptr ? nullptr : &arr(biases);
    const std::string md = mode == nullptr ? "affine" : mode;
    *out = wrap(suits(xa, wa, sa, ba, md) ? launch(xa, wa, sa, *ba)
                                          : mx::quantized_matmul(xa, wa, sa, opt(biases), true, group_size, bits, md));
  });
}

int mlxs_qmm_rows(mlxs_array* out, const mlxs_array x, const mlxs_array w, const mlxs_array scales,
                  const mlxs_array biases, int group_size, int bits, const char* mode) {
  auto fits = [&](const mx::array& xa, const mx::array& wa, const mx::array& sa, const mx::array* ba,
                  const std::string& md) { return suits(xa, wa, sa, ba, group_size, bits, md); };
  auto run = [&](const mx::array& xa, const mx::array& wa, const mx::array& sa, const mx::array& ba) {
    const bool three = xa.ndim() == 3;
    const int m = xa.shape(-2), k = xa.shape(-1), n = wa.shape(0);
    const int mmax = m == 1 ? 1 : m == 2 ? 2 : m <= 4 ? 4 : 8;
    const int r = cols(), blocks = (n + r - 1) / r;
    auto& kern = kernel(three ? kRows3 : kRows, xa.dtype(), bits, group_size, mmax, r);
    const mx::Shape shape = three ? mx::Shape{1, m, n} : mx::Shape{m, n};
    return kern.launch({xa, wa, sa, ba}, {shape}, {xa.dtype()}, {m, k, n}, {true, false, false, false},
                       {unsigned(blocks), 1, 1}, {kThreads, 1, 1})[0];
  };
  return shim::quantized_product(out, x, w, scales, biases, group_size, bits, mode, fits, run);
}

int mlxs_gather_qmm_rows(mlxs_array* out, const mlxs_array x, const mlxs_array w, const mlxs_array scales,
                         const mlxs_array biases, const mlxs_array indices, int group_size, int bits,
                         const char* mode) {
  return guard([&] {
    const auto &xa = arr(x), &wa = arr(w), &sa = arr(scales), &ia = arr(indices);
    const mx::array* ba = biases == nullptr ? nullptr : &arr(biases);
    const std::string md = mode == nullptr ? "affine" : mode;
    if (xa.ndim() != 2 || ia.ndim() != 2 || wa.ndim() != 3) {
      throw std::invalid_argument("gather_qmm_rows takes x (rows, in), stacked weights (experts, out, in) and indices (tokens, k)");
    }
    const int t = ia.shape(0), k = ia.shape(1), n = wa.shape(1);
    if (xa.shape(0) != t && xa.shape(0) != t * k) {
      throw std::invalid_argument("gather_qmm_rows: x needs a row a token or a row a (token, expert) slot");
    }
    if (!suits_gather(xa, wa, sa, ba, ia, group_size, bits, md)) {
      // MLX's gathered product: x as (T, 1, 1, in) or (T, k, 1, in) against the (T, k) indices.
      const mx::array xs = xa.shape(0) == t * k && k > 1 ? mx::reshape(xa, {t, k, 1, xa.shape(1)})
                                                         : mx::reshape(xa, {t, 1, 1, xa.shape(1)});
      const mx::array y =
          mx::gather_qmm(xs, wa, sa, opt(biases), std::nullopt, ia, true, group_size, bits, md, std::nullopt, false);
      *out = wrap(mx::reshape(y, {t, k, n}));
      return;
    }
    const int r = cols(), blocks = (n + r - 1) / r;
    auto& kern = kernel(kGather, xa.dtype(), bits, group_size, 1, r);
    auto outs = kern.launch({xa, wa, sa, *ba, ia}, {{t, k, n}}, {xa.dtype()}, {xa.shape(1), n, k, xa.shape(0)},
                            {true, false, false, false, true}, {unsigned(blocks), unsigned(t * k), 1}, {kThreads, 1, 1});
    *out = wrap(outs[0]);
  });
}

int mlxs_qmm_rows_available(void) {
  return shim::jit_available() ? 1 : 0;
}
