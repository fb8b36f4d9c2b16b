// mlx-gen's C ABI over MLX distributed (groups and collectives); errors are kept per thread and read
// with mlxs_dist_last_error(), apart from shim.cpp's, so that the two files share no state.
#include "internal.h"

#include <mlx/distributed/distributed.h>
#include <mlx/distributed/ops.h>
#include <mlx/mlx.h>

#include <string>

namespace md = mlx::core::distributed;

struct mlxs_group_ {
  md::Group g;
};

namespace {

using shim::arr;
using shim::wrap;

thread_local std::string g_dist_error;

template <class F>
int dguard(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    g_dist_error = e.what();
  } catch (...) {
    g_dist_error = "unknown C++ exception";
  }
  return 1;
}

const md::Group& grp(const mlxs_group g) {
  if (g == nullptr) {
    throw std::invalid_argument("null group handle");
  }
  return g->g;
}

}  // namespace

extern "C" {

const char* mlxs_dist_last_error(void) {
  return g_dist_error.c_str();
}

int mlxs_dist_is_available(const char* backend) {
  try {
    return md::is_available(backend) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int mlxs_dist_init(mlxs_group* out, int strict, const char* backend) {
  return dguard([&] { *out = new mlxs_group_{md::init(strict != 0, backend)}; });
}

void mlxs_group_free(mlxs_group g) {
  delete g;
}

int mlxs_group_rank(const mlxs_group g) {
  return g == nullptr ? -1 : g->g.rank();
}

int mlxs_group_size(const mlxs_group g) {
  return g == nullptr ? -1 : g->g.size();
}

int mlxs_group_split(mlxs_group* out, const mlxs_group g, int color, int key) {
  return dguard([&] { *out = new mlxs_group_{grp(g).split(color, key)}; });
}

int mlxs_dist_all_sum(mlxs_array* out, const mlxs_array x, const mlxs_group g) {
  return dguard([&] { *out = wrap(md::all_sum(arr(x), grp(g))); });
}

int mlxs_dist_all_gather(mlxs_array* out, const mlxs_array x, const mlxs_group g) {
  return dguard([&] { *out = wrap(md::all_gather(arr(x), grp(g))); });
}

int mlxs_dist_send(mlxs_array* out, const mlxs_array x, int dst, const mlxs_group g) {
  return dguard([&] { *out = wrap(md::send(arr(x), dst, grp(g))); });
}

int mlxs_dist_recv_like(mlxs_array* out, const mlxs_array like, int src, const mlxs_group g) {
  return dguard([&] { *out = wrap(md::recv_like(arr(like), src, grp(g))); });
}

}  // extern "C"
