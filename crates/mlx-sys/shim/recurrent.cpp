// mlx-gen's C ABI for recurrent (linear-attention) layers: the short causal convolution, and the
// compiled pieces of mlx-lm's gated_delta.py and activations.py, written operation for operation
// as the Python functions are, under mx::compile as they are (`@mx.compile` / shapeless).
#include "shim.h"

#include <mlx/mlx.h>

#include <functional>
#include <string>
#include <vector>

namespace mx = mlx::core;

// The same definition as in shim.cpp: an owned mx::array.
struct mlxs_array_ {
  mx::array a;
};

// shim.cpp's: keeps the text read back by mlxs_last_error().
extern "C" void mlxs_keep_error(const char* what);

namespace {

using Fn = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;

template <class F>
int rguard(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    mlxs_keep_error(e.what());
  } catch (...) {
    mlxs_keep_error("unknown C++ exception");
  }
  return 1;
}

const mx::array& rarr(const mlxs_array a) {
  if (a == nullptr) {
    throw std::invalid_argument("null array handle");
  }
  return a->a;
}

mlxs_array rwrap(mx::array a) {
  return new mlxs_array_{std::move(a)};
}

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

}  // namespace

int mlxs_conv1d(mlxs_array* out, const mlxs_array x, const mlxs_array w, int stride, int padding, int dilation,
                int groups) {
  return rguard([&] { *out = rwrap(mx::conv1d(rarr(x), rarr(w), stride, padding, dilation, groups)); });
}

int mlxs_repeat(mlxs_array* out, const mlxs_array a, int repeats, int axis) {
  return rguard([&] { *out = rwrap(mx::repeat(rarr(a), repeats, axis)); });
}

int mlxs_gated_delta_g(mlxs_array* out, const mlxs_array a_log, const mlxs_array a, const mlxs_array dt_bias) {
  // compute_g: exp(-exp(A_log.astype(float32)) * softplus(a + dt_bias)), softplus = logaddexp(x, 0).
  return rguard([&] {
    static const Fn* f = compiled(
        [](const std::vector<mx::array>& in) {
          auto x = mx::add(in[1], in[2]);
          auto softplus = mx::logaddexp(x, mx::array(0, x.dtype()));
          auto decay = mx::negative(mx::exp(mx::astype(in[0], mx::float32)));
          return std::vector<mx::array>{mx::exp(mx::multiply(decay, softplus))};
        },
        /* shapeless = */ true);
    *out = rwrap((*f)({rarr(a_log), rarr(a), rarr(dt_bias)})[0]);
  });
}

int mlxs_gated_delta_step(mlxs_array* y, mlxs_array* state_out, const mlxs_array q, const mlxs_array k,
                          const mlxs_array v, const mlxs_array g, const mlxs_array beta, const mlxs_array state,
                          const mlxs_array mask) {
  return rguard([&] {
    // `@mx.compile` (not shapeless): one compiled graph per shape, as in mlx-lm.
    static const Fn* f = compiled(delta_step, false);
    std::vector<mx::array> in{rarr(q), rarr(k), rarr(v), rarr(g), rarr(beta), rarr(state)};
    if (mask != nullptr) {
      in.push_back(rarr(mask));
    }
    auto outs = (*f)(in);
    *y = rwrap(outs[0]);
    *state_out = rwrap(outs[1]);
  });
}

int mlxs_precise_swiglu(mlxs_array* out, const mlxs_array h, const mlxs_array gate, const mlxs_array x) {
  // precise_swiglu(h, gate, x): (silu(gate.astype(float32)) * x.astype(float32)).astype(h.dtype)
  return rguard([&] {
    static const Fn* f = compiled(
        [](const std::vector<mx::array>& in) {
          auto g = silu(mx::astype(in[1], mx::float32));
          auto x = mx::astype(in[2], mx::float32);
          return std::vector<mx::array>{mx::astype(mx::multiply(g, x), in[0].dtype())};
        },
        /* shapeless = */ true);
    *out = rwrap((*f)({rarr(h), rarr(gate), rarr(x)})[0]);
  });
}
