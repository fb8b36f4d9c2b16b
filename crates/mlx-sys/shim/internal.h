// What the shim's files beside shim.cpp share (recurrent.cpp, norm.cpp): the owned-array handle,
// the exception guard that reports through mlxs_last_error(), and handle conversion.
#pragma once

#include "shim.h"

#include <mlx/mlx.h>

#include <stdexcept>
#include <utility>

namespace mx = mlx::core;

// The same definition as in shim.cpp: an owned mx::array.
struct mlxs_array_ {
  mx::array a;
};

// shim.cpp's: keeps the text read back by mlxs_last_error().
extern "C" void mlxs_keep_error(const char* what);

namespace shim {

// Runs f; a C++ exception becomes status 1 and its text is kept for mlxs_last_error().
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

inline const mx::array& rarr(const mlxs_array a) {
  if (a == nullptr) {
    throw std::invalid_argument("null array handle");
  }
  return a->a;
}

inline mlxs_array rwrap(mx::array a) {
  return new mlxs_array_{std::move(a)};
}

}  // namespace shim
