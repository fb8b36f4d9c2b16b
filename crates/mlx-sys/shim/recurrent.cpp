// mlx-gen's C ABI for recurrent (linear-attention) layers: the short causal convolution, and the
// compiled pieces of mlx-lm's gated_delta.py and activations.py, written operation for operation
// as the Python functions are, under mx::compile as they are (`@mx.compile` / shapeless); the
// recurrence as one kernel (Metal: MLX's metal_kernel; CUDA: one of ours launched by jit.cpp's primitive, or
// MLX's cuda_kernel with MLX_GEN_GDN_JIT=0).
#include "internal.h"

#include <mlx/mlx.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

namespace {

using shim::arr;
using shim::guard;
using shim::wrap;
using Fn = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;

// A compiled function built once and never destroyed (see mlxs_swiglu in shim.cpp).
const Fn* compiled(Fn f, bool shapeless) {
  return new Fn(mx::compile(std::move(f), shapeless));
}

// mx.sigmoid(x) * x, as mlx.nn.silu.
mx::array silu(const mx::array& x) {
  return mx::multiply(x, mx::sigmoid(x));
}

// One recurrent step of `_gated_delta_step_ops`:
//   q, k (B, H, Dk); v (B, H, Dv); g, beta (B, H); state (B, H, Dv, Dk); mask (B,) bool or absent.
std::vector<mx::array> delta_step(const std::vector<mx::array>& in) {
  const auto &q = in[0], &k = in[1], &v = in[2], &g = in[3], &beta = in[4];
  auto old_state = in[5];
  auto decay = mx::expand_dims(g, {-2, -1});                           // g[..., None, None]
  auto state = mx::multiply(old_state, decay);                         // state * decay
  auto kr = mx::expand_dims(k, -2);                                    // k[..., None, :]
  auto kv_mem = mx::sum(mx::multiply(state, kr), -1);                  // (B, H, Dv)
  auto delta = mx::multiply(mx::subtract(v, kv_mem), mx::expand_dims(beta, -1));
  state = mx::add(state, mx::multiply(kr, mx::expand_dims(delta, -1)));
  auto y = mx::sum(mx::multiply(state, mx::expand_dims(q, -2)), -1);  // (B, H, Dv)
  if (in.size() > 6) {
    auto mask = mx::expand_dims(in[6], {1, 2, 3});
    state = mx::where(mask, state, old_state);
  }
  return {mx::astype(y, q.dtype()), state};
}

// How a kernel's source reads one position's inputs as floats (k and q at element s_idx), sums over its lanes
// and stores y's element (a float expression in, a statement out): the two kernels below differ only there.
struct DeltaAccess {
  std::string g, v, beta, k, q, reduce_kv, reduce_out;
  std::function<std::string(const std::string&)> store;
};

// One position of the recurrence, the arithmetic both kernels share (the order of its operations decides
// bit-parity): the decay, the two dot products over Dk (lane sums, then a warp reduction), the delta and the
// readout; positions where `keep` is false write a zero. `exact` (CUDA, MLX_GEN_GDN_NOFMA=1): every product and
// sum rounded on its own (__fmul_rn, __fadd_rn), as the per-position operations round them, instead of the
// products fused into FMAs; an experiment towards mlx-lm's CUDA tokens (the lanes' summation order stays the
// kernel's).
std::string delta_position(const DeltaAccess& a, const std::string& keep, bool exact) {
  auto mul = [&](const std::string& x, const std::string& y) { return exact ? "__fmul_rn(" + x + ", " + y + ")" : x + " * " + y; };
  auto add = [&](const std::string& x, const std::string& y) { return exact ? "__fadd_rn(" + x + ", " + y + ")" : x + " + " + y; };
  auto sub = [&](const std::string& x, const std::string& y) { return exact ? "__fsub_rn(" + x + ", " + y + ")" : "(" + x + " - " + y + ")"; };
  return R"(
    if ()" + keep + R"() {
      float kv_mem = 0.0f;
      for (int i = 0; i < n_per_t; ++i) {
        const int s_idx = n_per_t * dk_idx + i;
        st[i] = )" + mul("st[i]", a.g) + R"(;
        kv_mem = )" + add("kv_mem", mul("st[i]", a.k)) + R"(;
      }
      )" + a.reduce_kv + R"(
      const float delta = )" + mul(sub(a.v, "kv_mem"), a.beta) + R"(;
      float out = 0.0f;
      for (int i = 0; i < n_per_t; ++i) {
        const int s_idx = n_per_t * dk_idx + i;
        st[i] = )" + add("st[i]", mul(a.k, "delta")) + R"(;
        out = )" + add("out", mul("st[i]", a.q)) + R"(;
      }
      )" + a.reduce_out + R"(
      if (dk_idx == 0) { )" + a.store("out") + R"( }
    } else if (dk_idx == 0) {
      )" + a.store("0.0f") + R"(
    })";
}

// The lanes' sum of `v` in a CUDA warp.
std::string warp_sum(const std::string& v) {
  return "for (int o = 16; o > 0; o /= 2) { " + v + " += __shfl_xor_sync(0xffffffff, " + v + ", o); }";
}

// The whole recurrence of a layer over T positions in one GPU kernel: one warp (SIMD group) per
// (batch row, value head, value row), each lane holding Dk/32 of the row's state in registers, a
// position at a time (delta_position). It is mlx-lm's Metal kernel (`_make_gated_delta_kernel` in
// gated_delta.py) with T read from q's shape; q and k are per key head (no repeat: hk = hv / (Hv / Hk)).
// Inputs: q, k (B, T, Hk, Dk); v (B, T, Hv, Dv); g, beta (B, T, Hv); state_in (B, Hv, Dv, Dk);
// mask (B, T) when MASKED. Outputs: y (B, T, Hv, Dv) in q's dtype, state_out like state_in.
std::string delta_kernel_body(bool cuda, bool masked, bool exact) {
  std::string lane = cuda ? "threadIdx.x" : "thread_position_in_threadgroup.x";
  std::string row = cuda ? "(blockIdx.y * blockDim.y + threadIdx.y)" : "thread_position_in_grid.y";
  std::string head = cuda ? "blockIdx.z" : "thread_position_in_grid.z";
  DeltaAccess a{"static_cast<float>(g_[hv_idx])",
                "static_cast<float>(v_[dv_idx])",
                "static_cast<float>(beta_[hv_idx])",
                "static_cast<float>(k_[s_idx])",
                "static_cast<float>(q_[s_idx])",
                cuda ? warp_sum("kv_mem") : "kv_mem = simd_sum(kv_mem);",
                cuda ? warp_sum("out") : "out = simd_sum(out);",
                [](const std::string& f) { return "y_[dv_idx] = static_cast<InT>(" + f + ");"; }};
  return R"(
  const int T = q_shape[1];
  const int n = )" + head + R"(;
  const int b_idx = n / Hv;
  const int hv_idx = n % Hv;
  const int hk_idx = hv_idx / (Hv / Hk);
  constexpr int n_per_t = Dk / 32;
  const int dk_idx = )" + lane + R"(;
  const int dv_idx = )" + row + R"(;
  if (dv_idx >= Dv) { return; }
  auto q_ = q + b_idx * T * Hk * Dk + hk_idx * Dk;
  auto k_ = k + b_idx * T * Hk * Dk + hk_idx * Dk;
  auto v_ = v + b_idx * T * Hv * Dv + hv_idx * Dv;
  auto y_ = y + b_idx * T * Hv * Dv + hv_idx * Dv;
  auto i_state = state_in + (n * Dv + dv_idx) * Dk;
  auto o_state = state_out + (n * Dv + dv_idx) * Dk;
  float st[n_per_t];
  for (int i = 0; i < n_per_t; ++i) {
    st[i] = static_cast<float>(i_state[n_per_t * dk_idx + i]);
  }
  auto g_ = g + b_idx * T * Hv;
  auto beta_ = beta + b_idx * T * Hv;
  for (int t = 0; t < T; ++t) {)" + delta_position(a, masked ? "mask[b_idx * T + t]" : "true", exact) + R"(
    q_ += Hk * Dk;
    k_ += Hk * Dk;
    v_ += Hv * Dv;
    y_ += Hv * Dv;
    g_ += Hv;
    beta_ += Hv;
  }
  for (int i = 0; i < n_per_t; ++i) {
    o_state[n_per_t * dk_idx + i] = static_cast<StT>(st[i]);
  }
)";
}

// CUDA's kernel as one of ours (jit.cpp: compiled once, launched by our primitive, which costs the host
// less a call than MLX's cuda_kernel, and reads its inputs through their strides, so the projections'
// slices need no copies): the same arithmetic (delta_position) as delta_kernel_body, header-free. Inputs q, k
// (type TQ), v (TV), g (TG), beta (TB), state_in (StT), mask (bool) when MASKED, each strided (B, T, H, D) /
// (B, T, H) / (B, Hv, Dv, Dk) / (B, T); outputs y (B, T, Hv, Dv) in TQ and state_out (B, Hv, Dv, Dk) in
// StT, row-contiguous; the scalar T. A block is 32 lanes x 4 value rows.
std::string delta_jit_source(const char* tq, const char* tv, const char* tg, const char* tb, const char* st,
                             int dk, int dv, int hk, int hv, bool masked, bool exact) {
  auto n = [](int v) { return std::to_string(v); };
  DeltaAccess a{"to_f(*g_)",
                "to_f(*v_)",
                "to_f(*beta_)",
                "to_f(k_[s_idx * ks3])",
                "to_f(q_[s_idx * qs3])",
                warp_sum("kv_mem"),
                warp_sum("out"),
                [](const std::string& f) { return "*y_ = from_f<TQ>(" + f + ");"; }};
  return std::string(shim::jit_prelude()) + "using TQ = " + tq + ";\nusing TV = " + tv + ";\nusing TG = " + tg +
         ";\nusing TB = " + tb + ";\nusing StT = " + st + ";\nconstexpr int Dk = " + n(dk) + ", Dv = " + n(dv) +
         ", Hk = " + n(hk) + ", Hv = " + n(hv) +
         ";\nextern \"C\" __global__ void __launch_bounds__(128) KNAME(const TQ* q, const TQ* k, const TV* v, "
         "const TG* g, const TB* beta, const StT* state_in, " + (masked ? "const bool* mask, " : "") +
         "TQ* y, StT* state_out, int T, int qs0, int qs1, int qs2, int qs3, int ks0, int ks1, int ks2, int ks3, "
         "int vs0, int vs1, int vs2, int vs3, int gs0, int gs1, int gs2, int bs0, int bs1, int bs2, int ss0, "
         "int ss1, int ss2, int ss3" + (masked ? ", int ms0, int ms1" : "") + R"() {
  const int n = blockIdx.z;
  const int b_idx = n / Hv;
  const int hv_idx = n % Hv;
  const int hk_idx = hv_idx / (Hv / Hk);
  constexpr int n_per_t = Dk / 32;
  const int dk_idx = threadIdx.x;
  const int dv_idx = blockIdx.y * blockDim.y + threadIdx.y;
  if (dv_idx >= Dv) { return; }
  const TQ* q_ = q + (long long)b_idx * qs0 + (long long)hk_idx * qs2;
  const TQ* k_ = k + (long long)b_idx * ks0 + (long long)hk_idx * ks2;
  const TV* v_ = v + (long long)b_idx * vs0 + (long long)hv_idx * vs2 + (long long)dv_idx * vs3;
  TQ* y_ = y + ((long long)b_idx * T * Hv + hv_idx) * Dv + dv_idx;
  const StT* i_state = state_in + (long long)b_idx * ss0 + (long long)hv_idx * ss1 + (long long)dv_idx * ss2;
  StT* o_state = state_out + ((long long)n * Dv + dv_idx) * Dk;
  float st[n_per_t];
  for (int i = 0; i < n_per_t; ++i) {
    st[i] = to_f(i_state[(long long)(n_per_t * dk_idx + i) * ss3]);
  }
  const TG* g_ = g + (long long)b_idx * gs0 + (long long)hv_idx * gs2;
  const TB* beta_ = beta + (long long)b_idx * bs0 + (long long)hv_idx * bs2;
  for (int t = 0; t < T; ++t) {)" + delta_position(a, masked ? "mask[b_idx * ms0 + t * ms1]" : "true", exact) + R"(
    q_ += qs1;
    k_ += ks1;
    v_ += vs1;
    y_ += Hv * Dv;
    g_ += gs1;
    beta_ += bs1;
  }
  for (int i = 0; i < n_per_t; ++i) {
    o_state[n_per_t * dk_idx + i] = from_f<StT>(st[i]);
  }
}
)";
}

// The variant's key: the types, sizes, mask and rounding.
std::string delta_jit_variant(const char* tq, const char* tv, const char* tg, const char* tb, const char* st, int dk,
                              int dv, int hk, int hv, bool masked, bool exact) {
  char key[192];
  std::snprintf(key, sizeof key, "mlxgen_gated_delta_%s_%s_%s_%s_%s_k%d_v%d_h%d_%d%s%s", tq, tv, tg, tb, st, dk, dv,
                hk, hv, masked ? "_mask" : "", exact ? "_exact" : "");
  return key;
}

// Whether the environment variable `name` is "1".
bool set_to_one(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == "1";
}

// Whether CUDA's recurrence is ours (jit.cpp): by default where it can run, MLX_GEN_GDN_JIT=0 for MLX's
// cuda_kernel launch of the same arithmetic. On an H100 (`gpu_suite.sh gdnjit`, BENCHMARKS.md 2026-12-06g)
// the two gave the same log-probabilities bit for bit over 64 greedy tokens of the Qwen3.5-2B shape.
bool jit_recurrence() {
  static const bool on = [] {
    const char* v = std::getenv("MLX_GEN_GDN_JIT");
    return (v == nullptr || std::string(v) != "0") && shim::jit_available();
  }();
  return on;
}

// Whether the recurrence's rounding is MLX_GEN_GDN_NOFMA's (each product and sum rounded on its own).
bool nofma() {
  static const bool on = set_to_one("MLX_GEN_GDN_NOFMA");
  return on;
}

// The kernel for this backend (built once per variant, never destroyed).
const mx::fast::CustomKernelFunction& delta_kernel(bool masked) {
  static const mx::fast::CustomKernelFunction* kernels[2] = {nullptr, nullptr};
  auto& slot = kernels[masked ? 1 : 0];
  if (slot == nullptr) {
    std::vector<std::string> inputs{"q", "k", "v", "g", "beta", "state_in"};
    if (masked) {
      inputs.push_back("mask");
    }
    bool cuda = shim::kernel_backend() == 1;
    bool exact = cuda && nofma();
    std::string body = delta_kernel_body(cuda, masked, exact);
    std::string name = shim::kernel_name(masked ? "mlxgen_gated_delta_mask" : "mlxgen_gated_delta", body);
    slot = new mx::fast::CustomKernelFunction(
        cuda ? mx::fast::cuda_kernel(name, inputs, {"y", "state_out"}, body)
             : mx::fast::metal_kernel(name, inputs, {"y", "state_out"}, body));
  }
  return *slot;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> shim::gated_delta_sources() {
  // Qwen3.5's 16 key / 32 value heads of 128 (bfloat16, a float32 state and decay), masked and not, and
  // MLX_GEN_GDN_NOFMA's rounding; Qwen3-Next's 16 / 32 in float16.
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [t, g, masked, exact] : {std::tuple{"bf16_t", "float", false, false}, std::tuple{"bf16_t", "float", true, false},
                                            std::tuple{"bf16_t", "float", false, true}, std::tuple{"f16_t", "f16_t", true, false}}) {
    out.emplace_back(delta_jit_variant(t, t, g, t, "float", 128, 128, 16, 32, masked, exact),
                     delta_jit_source(t, t, g, t, "float", 128, 128, 16, 32, masked, exact));
  }
  return out;
}

int mlxs_gated_delta_kernel_available(void) {
  return shim::kernel_backend() != 0 ? 1 : 0;
}

int mlxs_gated_delta_kernel(mlxs_array* y, mlxs_array* state_out, const mlxs_array q, const mlxs_array k,
                            const mlxs_array v, const mlxs_array g, const mlxs_array beta, const mlxs_array state,
                            const mlxs_array mask) {
  return guard([&] {
    const auto &qa = arr(q), &ka = arr(k), &va = arr(v), &st = arr(state);
    if (qa.ndim() != 4 || ka.shape() != qa.shape() || va.ndim() != 4 || st.ndim() != 4) {
      throw std::invalid_argument("gated delta kernel: q, k (B, T, Hk, Dk), v (B, T, Hv, Dv), state (B, Hv, Dv, Dk)");
    }
    int b = qa.shape(0), hk = qa.shape(2), dk = qa.shape(3), hv = va.shape(2), dv = va.shape(3);
    if (dk % 32 != 0 || hv % hk != 0 || st.shape() != mx::Shape{b, hv, dv, dk}) {
      throw std::invalid_argument("gated delta kernel: Dk must be a multiple of 32, Hv of Hk, and the state (B, Hv, Dv, Dk)");
    }
    std::vector<mx::array> in{qa, ka, va, arr(g), arr(beta), st};
    if (mask != nullptr) {
      in.push_back(arr(mask));
    }
    const bool masked = mask != nullptr;
    const mx::Shape per_head{b, qa.shape(1), hv};
    if (jit_recurrence() && in[3].shape() == per_head &&
        in[4].shape() == per_head && (!masked || in[6].shape() == mx::Shape{b, qa.shape(1)})) {
      const char *tq = shim::jit_type(qa.dtype()), *tv = shim::jit_type(va.dtype()),
                 *tg = shim::jit_type(in[3].dtype()), *tb = shim::jit_type(in[4].dtype()),
                 *ts = shim::jit_type(st.dtype());
      const bool exact = nofma();
      auto& kernel = shim::jit_kernel(delta_jit_variant(tq, tv, tg, tb, ts, dk, dv, hk, hv, masked, exact),
                                      [&] { return delta_jit_source(tq, tv, tg, tb, ts, dk, dv, hk, hv, masked, exact); });
      auto outs = kernel.launch(in, {va.shape(), st.shape()}, {qa.dtype(), st.dtype()}, {qa.shape(1)},
                                std::vector<bool>(in.size(), true), {1, unsigned((dv + 3) / 4), unsigned(b * hv)},
                                {32, 4, 1});
      *y = wrap(outs[0]);
      *state_out = wrap(outs[1]);
      return;
    }
    auto outs = delta_kernel(masked)(
        in, {va.shape(), st.shape()}, {qa.dtype(), st.dtype()}, {32, dv, b * hv}, {32, 4, 1},
        {{"InT", qa.dtype()}, {"StT", st.dtype()}, {"Dk", dk}, {"Dv", dv}, {"Hk", hk}, {"Hv", hv}}, std::nullopt, false,
        {});
    *y = wrap(outs[0]);
    *state_out = wrap(outs[1]);
  });
}

int mlxs_conv1d(mlxs_array* out, const mlxs_array x, const mlxs_array w, int stride, int padding, int dilation,
                int groups) {
  return guard([&] { *out = wrap(mx::conv1d(arr(x), arr(w), stride, padding, dilation, groups)); });
}

int mlxs_repeat(mlxs_array* out, const mlxs_array a, int repeats, int axis) {
  return guard([&] { *out = wrap(mx::repeat(arr(a), repeats, axis)); });
}

int mlxs_gated_delta_g(mlxs_array* out, const mlxs_array a_log, const mlxs_array a, const mlxs_array dt_bias) {
  // compute_g: exp(-exp(A_log.astype(float32)) * softplus(a + dt_bias)), softplus = logaddexp(x, 0).
  return guard([&] {
    static const Fn* f = compiled(
        [](const std::vector<mx::array>& in) {
          auto x = mx::add(in[1], in[2]);
          auto softplus = mx::logaddexp(x, mx::array(0, x.dtype()));
          auto decay = mx::negative(mx::exp(mx::astype(in[0], mx::float32)));
          return std::vector<mx::array>{mx::exp(mx::multiply(decay, softplus))};
        },
        /* shapeless = */ true);
    *out = wrap((*f)({arr(a_log), arr(a), arr(dt_bias)})[0]);
  });
}

int mlxs_gated_delta_step(mlxs_array* y, mlxs_array* state_out, const mlxs_array q, const mlxs_array k,
                          const mlxs_array v, const mlxs_array g, const mlxs_array beta, const mlxs_array state,
                          const mlxs_array mask) {
  return guard([&] {
    // `@mx.compile` (not shapeless): one compiled graph per shape, as in mlx-lm.
    static const Fn* f = compiled(delta_step, false);
    std::vector<mx::array> in{arr(q), arr(k), arr(v), arr(g), arr(beta), arr(state)};
    if (mask != nullptr) {
      in.push_back(arr(mask));
    }
    auto outs = (*f)(in);
    *y = wrap(outs[0]);
    *state_out = wrap(outs[1]);
  });
}

int mlxs_precise_swiglu(mlxs_array* out, const mlxs_array h, const mlxs_array gate, const mlxs_array x) {
  // precise_swiglu(h, gate, x): (silu(gate.astype(float32)) * x.astype(float32)).astype(h.dtype)
  return guard([&] {
    static const Fn* f = compiled(
        [](const std::vector<mx::array>& in) {
          auto g = silu(mx::astype(in[1], mx::float32));
          auto x = mx::astype(in[2], mx::float32);
          return std::vector<mx::array>{mx::astype(mx::multiply(g, x), in[0].dtype())};
        },
        /* shapeless = */ true);
    *out = wrap((*f)({arr(h), arr(gate), arr(x)})[0]);
  });
}
