// mlx-gen's C ABI over the MLX C++ API: each function converts handles, calls MLX inside
// `guard` (internal.h: turns a C++ exception into a status and keeps its text, here), and hands back
// handles.
#include "internal.h"

#include <mlx/mlx.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <functional>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

struct mlxs_tensors_ {
  std::vector<std::pair<std::string, mx::array>> tensors;
  std::vector<std::pair<std::string, std::string>> meta;
};

namespace {

using shim::arr;
using shim::arrays;
using shim::guard;
using shim::opt;
using shim::wrap;

thread_local std::string g_error;

const mx::Dtype kDtypes[] = {mx::bool_,   mx::uint8,   mx::uint16,  mx::uint32, mx::uint64,
                             mx::int8,    mx::int16,   mx::int32,   mx::int64,  mx::float16,
                             mx::float32, mx::float64, mx::bfloat16, mx::complex64};

mx::Dtype dtype_of(int code) {
  if (code < 0 || code >= static_cast<int>(sizeof(kDtypes) / sizeof(kDtypes[0]))) {
    throw std::invalid_argument("unknown dtype code " + std::to_string(code));
  }
  return kDtypes[code];
}

int code_of(mx::Dtype d) { return static_cast<int>(d.val()); }

mx::Shape shape_of(const int32_t* s, int n) { return mx::Shape(s, s + n); }

std::vector<int> ints(const int32_t* s, int n) { return std::vector<int>(s, s + n); }

std::vector<int> all_axes(const mx::array& a) {
  std::vector<int> axes(a.ndim());
  std::iota(axes.begin(), axes.end(), 0);
  return axes;
}

}  // namespace

extern "C" {

const char* mlxs_last_error(void) {
  return g_error.c_str();
}

// For internal.h's guard: the text mlxs_last_error() reads back.
void mlxs_keep_error(const char* what) {
  g_error = what;
}

const char* mlxs_version(void) {
  return mx::version();
}

int mlxs_gpu_available(void) {
  try {
    return mx::is_available(mx::Device::gpu) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int mlxs_set_default_device(int gpu) {
  return guard([&] { mx::set_default_device(gpu ? mx::Device::gpu : mx::Device::cpu); });
}

int mlxs_default_device_is_gpu(void) {
  try {
    return mx::default_device() == mx::Device::gpu ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int mlxs_synchronize(void) {
  return guard([&] { mx::synchronize(); });
}

int mlxs_setenv_default(const char* name, const char* value) {
  return setenv(name, value, 0) == 0 ? 0 : 1;
}

int mlxs_new_default_stream(void) {
  return guard([&] {
    auto s = mx::new_stream(mx::default_device());
    mx::set_default_stream(s);
  });
}

int mlxs_device_name(char* buf, size_t len) {
  return guard([&] {
    std::string name = "cpu";
    const auto& info = mx::device_info(mx::default_device());
    auto it = info.find("device_name");
    if (it != info.end() && std::holds_alternative<std::string>(it->second)) {
      name = std::get<std::string>(it->second);
    }
    std::snprintf(buf, len, "%s", name.c_str());
  });
}

void mlxs_array_free(mlxs_array a) {
  delete a;
}

int mlxs_array_clone(mlxs_array* out, const mlxs_array a) {
  return guard([&] { *out = wrap(arr(a)); });
}

namespace {

// Whether this MLX's allocator is the CPU-only one (mlx/backend/no_gpu), whose buffers are a
// `size_t` size header followed by the data (`Buffer::raw_ptr()` is `ptr + 8`). Checked once on a
// real allocation rather than assumed, so that another allocator (CUDA's, Metal's) is never given
// a buffer in this layout.
bool cpu_buffer_layout() {
  static const bool ok = [] {
    if (mx::is_available(mx::Device::gpu)) {
      return false;
    }
    auto data = mx::allocator::malloc(24);
    auto buffer = data.buffer();
    return buffer.raw_ptr() == static_cast<char*>(buffer.ptr()) + sizeof(size_t) &&
           mx::allocator::allocator().size(buffer) == 24;
  }();
  return ok;
}

// Bytes of `shape` elements of `dtype`, or an exception for a negative dimension.
size_t checked_bytes(const mx::Shape& shape, mx::Dtype dtype) {
  size_t n = 1;
  for (auto d : shape) {
    if (d < 0) {
      throw std::invalid_argument("negative dimension");
    }
    n *= static_cast<size_t>(d);
  }
  return n * dtype.size();
}

// Bytes MLX uses in place outside its allocator (mapped weights, host buffers): its own memory
// figures do not see them; mlxs_external_memory() reports them.
std::atomic<size_t> g_external{0};

// An array over `bytes` bytes at `data` that MLX does not own; `release` runs once MLX is done
// with them. CPU-only backend: used in place as the buffer `data - 8` in that allocator's layout,
// wrapped as a `Data` with a deleter (MLX 0.32.4's CPU `make_buffer` is missing, so its raw-pointer
// constructor would copy); an unowned buffer is never freed by the allocator nor donated to an
// output, so its size header is never read. Elsewhere MLX's raw-pointer constructor decides (in
// place on Metal for page-aligned data; one copy on CUDA, then `release` at once: that is how a
// copy shows). `*zero_copy` says which; bytes used in place count in g_external until released.
// The caller checked `bytes` (only running out of memory throws before `release` is taken).
mx::array external_array(void* data, size_t bytes, mx::Shape shape, mx::Dtype dtype,
                         std::function<void()> release, int* zero_copy) {
  auto state = std::make_shared<std::atomic<int>>(0);  // 0 constructing, 1 in place, 2 released
  auto done = [state, bytes, release = std::move(release)] {
    if (state->exchange(2) == 1) {
      g_external -= bytes;
    }
    release();
  };
  auto a = [&] {
    if (bytes > 0 && cpu_buffer_layout()) {
      mx::allocator::Buffer buffer(static_cast<char*>(data) - sizeof(size_t));
      return mx::array(mx::allocator::Data(buffer, [done](mx::allocator::Buffer) { done(); }), std::move(shape), dtype);
    }
    return mx::array(data, std::move(shape), dtype, [done](void*) { done(); });
  }();
  int expected = 0;
  *zero_copy = state->compare_exchange_strong(expected, 1) ? 1 : 0;
  if (*zero_copy) {
    g_external += bytes;
  }
  return a;
}

}  // namespace

int mlxs_array_from_data(mlxs_array* out, const void* data, const int32_t* shape, int ndim, int dtype) {
  return guard([&] {
    auto dt = dtype_of(dtype);
    auto sh = shape_of(shape, ndim);
    size_t bytes = checked_bytes(sh, dt);
    // Copy once so that the caller's memory can go away, behind a size header as MLX's CPU
    // allocator lays out its buffers (see external_array); MLX frees the copy when done with it.
    auto block = static_cast<char*>(std::malloc(bytes + sizeof(size_t)));
    if (block == nullptr) {
      throw std::bad_alloc();
    }
    std::memcpy(block, &bytes, sizeof(size_t));
    std::memcpy(block + sizeof(size_t), data, bytes);
    int zero_copy = 0;
    *out = wrap(external_array(block + sizeof(size_t), bytes, std::move(sh), dt, [block] { std::free(block); }, &zero_copy));
  });
}

int mlxs_array_read_file(mlxs_array* out, int fd, uint64_t offset, const int32_t* shape, int ndim, int dtype) {
  return guard([&] {
    auto dt = dtype_of(dtype);
    auto sh = shape_of(shape, ndim);
    size_t bytes = checked_bytes(sh, dt);
    // Read straight into a buffer of MLX's allocator (host-visible on every backend: the CPU's
    // memory, Metal's shared buffers, CUDA's managed memory), as MLX's own loader does: one copy.
    auto data = mx::allocator::malloc(bytes);  // freed by its destructor if the read fails
    auto buffer = data.buffer();
    char* p = static_cast<char*>(buffer.raw_ptr());
    size_t done = 0;
    while (done < bytes) {
      ssize_t n = pread(fd, p + done, bytes - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n <= 0) {
        int err = errno;
        throw std::runtime_error("reading " + std::to_string(bytes) + " bytes at " + std::to_string(offset) + ": " +
                                 (n == 0 ? std::string("unexpected end of file") : std::string(std::strerror(err))));
      }
      done += static_cast<size_t>(n);
    }
    *out = wrap(mx::array(std::move(data), std::move(sh), dt));
  });
}

int mlxs_array_from_external(mlxs_array* out, void* data, size_t bytes, const int32_t* shape, int ndim,
                             int dtype, void* owner, void (*release)(void*), int* zero_copy) {
  return guard([&] {
    auto dt = dtype_of(dtype);
    auto sh = shape_of(shape, ndim);
    if (checked_bytes(sh, dt) != bytes) {
      throw std::invalid_argument("external data size does not match its shape and dtype");
    }
    *out = wrap(external_array(data, bytes, std::move(sh), dt, [owner, release] { release(owner); }, zero_copy));
  });
}

int mlxs_array_scalar(mlxs_array* out, double value, int dtype) {
  return guard([&] {
    auto dt = dtype_of(dtype);
    if (dt == mx::bool_) {
      *out = wrap(mx::array(value != 0.0));
    } else if (mx::issubdtype(dt, mx::integer)) {
      *out = wrap(mx::array(static_cast<int64_t>(value), dt));
    } else {
      // Same as a Python float meeting an array of this dtype: converted once, to this dtype.
      *out = wrap(mx::array(static_cast<float>(value), dt));
    }
  });
}

int mlxs_array_ndim(const mlxs_array a) {
  return static_cast<int>(a->a.ndim());
}

int mlxs_array_shape(const mlxs_array a, int32_t* shape) {
  const auto& s = a->a.shape();
  for (size_t i = 0; i < s.size(); ++i) {
    shape[i] = s[i];
  }
  return 0;
}

int mlxs_array_dtype(const mlxs_array a) {
  return code_of(a->a.dtype());
}

size_t mlxs_array_size(const mlxs_array a) {
  return a->a.size();
}

size_t mlxs_array_nbytes(const mlxs_array a) {
  return a->a.nbytes();
}

int mlxs_array_to_host(const mlxs_array a, int dtype, void* buf, size_t nbytes) {
  return guard([&] {
    auto dt = dtype_of(dtype);
    auto b = a->a;
    b.eval();
    // Only add a conversion to the graph when the evaluated array is not already what we want.
    if (b.dtype() != dt || !b.flags().row_contiguous) {
      b = mx::contiguous(mx::astype(b, dt));
      b.eval();
    }
    if (b.nbytes() != nbytes) {
      throw std::invalid_argument("host buffer of " + std::to_string(nbytes) + " bytes for an array of " +
                                  std::to_string(b.nbytes()));
    }
    std::memcpy(buf, b.data<char>(), nbytes);
  });
}

int mlxs_unary(mlxs_array* out, int op, const mlxs_array a) {
  return guard([&] {
    const auto& x = arr(a);
    switch (op) {
      case 0: *out = wrap(mx::exp(x)); break;
      case 1: *out = wrap(mx::log(x)); break;
      case 2: *out = wrap(mx::negative(x)); break;
      case 3: *out = wrap(mx::sigmoid(x)); break;
      case 4: *out = wrap(mx::sqrt(x)); break;
      case 5: *out = wrap(mx::rsqrt(x)); break;
      case 6: *out = wrap(mx::abs(x)); break;
      case 7: *out = wrap(mx::logical_not(x)); break;
      case 8: *out = wrap(mx::sin(x)); break;
      case 9: *out = wrap(mx::cos(x)); break;
      case 10: *out = wrap(mx::tanh(x)); break;
      case 11: *out = wrap(mx::square(x)); break;
      case 12: *out = wrap(mx::log1p(x)); break;
      case 13: *out = wrap(mx::floor(x)); break;
      case 14: *out = wrap(mx::erf(x)); break;
      case 15: *out = wrap(mx::stop_gradient(x)); break;
      case 16: *out = wrap(mx::log2(x)); break;
      case 17: *out = wrap(mx::ceil(x)); break;
      case 18: *out = wrap(mx::sign(x)); break;
      default: throw std::invalid_argument("unknown unary op " + std::to_string(op));
    }
  });
}

int mlxs_binary(mlxs_array* out, int op, const mlxs_array a, const mlxs_array b) {
  return guard([&] {
    const auto& x = arr(a);
    const auto& y = arr(b);
    switch (op) {
      case 0: *out = wrap(mx::add(x, y)); break;
      case 1: *out = wrap(mx::subtract(x, y)); break;
      case 2: *out = wrap(mx::multiply(x, y)); break;
      case 3: *out = wrap(mx::divide(x, y)); break;
      case 4: *out = wrap(mx::maximum(x, y)); break;
      case 5: *out = wrap(mx::minimum(x, y)); break;
      case 6: *out = wrap(mx::power(x, y)); break;
      case 7: *out = wrap(mx::equal(x, y)); break;
      case 8: *out = wrap(mx::not_equal(x, y)); break;
      case 9: *out = wrap(mx::less(x, y)); break;
      case 10: *out = wrap(mx::less_equal(x, y)); break;
      case 11: *out = wrap(mx::greater(x, y)); break;
      case 12: *out = wrap(mx::greater_equal(x, y)); break;
      case 13: *out = wrap(mx::logical_and(x, y)); break;
      case 14: *out = wrap(mx::logical_or(x, y)); break;
      case 15: *out = wrap(mx::floor_divide(x, y)); break;
      case 16: *out = wrap(mx::remainder(x, y)); break;
      case 17: *out = wrap(mx::logaddexp(x, y)); break;
      default: throw std::invalid_argument("unknown binary op " + std::to_string(op));
    }
  });
}

int mlxs_where(mlxs_array* out, const mlxs_array cond, const mlxs_array x, const mlxs_array y) {
  return guard([&] { *out = wrap(mx::where(arr(cond), arr(x), arr(y))); });
}

int mlxs_astype(mlxs_array* out, const mlxs_array a, int dtype) {
  return guard([&] { *out = wrap(mx::astype(arr(a), dtype_of(dtype))); });
}

int mlxs_from_fp8(mlxs_array* out, const mlxs_array a, int dtype) {
  return guard([&] { *out = wrap(mx::from_fp8(arr(a), dtype_of(dtype))); });
}

int mlxs_to_fp8(mlxs_array* out, const mlxs_array a) {
  return guard([&] { *out = wrap(mx::to_fp8(arr(a))); });
}

int mlxs_view(mlxs_array* out, const mlxs_array a, int dtype) {
  return guard([&] { *out = wrap(mx::view(arr(a), dtype_of(dtype))); });
}

int mlxs_pad(mlxs_array* out, const mlxs_array a, const int32_t* low, const int32_t* high, int n,
             const mlxs_array value) {
  return guard([&] {
    std::vector<std::pair<int, int>> widths;
    for (int i = 0; i < n; ++i) {
      widths.emplace_back(low[i], high[i]);
    }
    *out = wrap(mx::pad(arr(a), widths, arr(value), "constant"));
  });
}

int mlxs_matmul(mlxs_array* out, const mlxs_array a, const mlxs_array b) {
  return guard([&] { *out = wrap(mx::matmul(arr(a), arr(b))); });
}

int mlxs_addmm(mlxs_array* out, const mlxs_array c, const mlxs_array a, const mlxs_array b, float alpha,
               float beta) {
  return guard([&] { *out = wrap(mx::addmm(arr(c), arr(a), arr(b), alpha, beta)); });
}

int mlxs_quantized_matmul(mlxs_array* out, const mlxs_array x, const mlxs_array w, const mlxs_array scales,
                          const mlxs_array biases, int transpose, int group_size, int bits, const char* mode) {
  return guard([&] {
    *out = wrap(mx::quantized_matmul(arr(x), arr(w), arr(scales), opt(biases), transpose != 0, group_size, bits,
                                     mode));
  });
}

int mlxs_quantize(mlxs_array* w_out, mlxs_array* scales_out, mlxs_array* biases_out, const mlxs_array w,
                  int group_size, int bits, const char* mode) {
  return guard([&] {
    auto r = mx::quantize(arr(w), group_size, bits, mode);
    *w_out = wrap(r.at(0));
    *scales_out = wrap(r.at(1));
    *biases_out = r.size() > 2 ? wrap(r[2]) : nullptr;
  });
}

int mlxs_dequantize(mlxs_array* out, const mlxs_array w, const mlxs_array scales, const mlxs_array biases,
                    int group_size, int bits, const char* mode, int dtype) {
  return guard([&] {
    std::optional<mx::Dtype> dt;
    if (dtype >= 0) {
      dt = dtype_of(dtype);
    }
    *out = wrap(mx::dequantize(arr(w), arr(scales), opt(biases), group_size, bits, mode, std::nullopt, dt));
  });
}

int mlxs_reshape(mlxs_array* out, const mlxs_array a, const int32_t* shape, int ndim) {
  return guard([&] { *out = wrap(mx::reshape(arr(a), shape_of(shape, ndim))); });
}

int mlxs_broadcast_to(mlxs_array* out, const mlxs_array a, const int32_t* shape, int ndim) {
  return guard([&] { *out = wrap(mx::broadcast_to(arr(a), shape_of(shape, ndim))); });
}

int mlxs_transpose(mlxs_array* out, const mlxs_array a, const int32_t* axes, int n) {
  return guard([&] { *out = wrap(mx::transpose(arr(a), ints(axes, n))); });
}

int mlxs_expand_dims(mlxs_array* out, const mlxs_array a, const int32_t* axes, int n) {
  return guard([&] { *out = wrap(mx::expand_dims(arr(a), ints(axes, n))); });
}

int mlxs_squeeze(mlxs_array* out, const mlxs_array a, const int32_t* axes, int n) {
  return guard([&] { *out = wrap(n == 0 ? mx::squeeze(arr(a)) : mx::squeeze(arr(a), ints(axes, n))); });
}

int mlxs_slice(mlxs_array* out, const mlxs_array a, const int32_t* start, const int32_t* stop,
               const int32_t* strides, int n) {
  return guard([&] {
    *out = wrap(mx::slice(arr(a), shape_of(start, n), shape_of(stop, n), shape_of(strides, n)));
  });
}

int mlxs_slice_update(mlxs_array* out, const mlxs_array src, const mlxs_array update, const int32_t* start,
                      const int32_t* stop, int n) {
  return guard([&] { *out = wrap(mx::slice_update(arr(src), arr(update), shape_of(start, n), shape_of(stop, n))); });
}

int mlxs_concatenate(mlxs_array* out, const mlxs_array* a, size_t n, int axis) {
  return guard([&] { *out = wrap(mx::concatenate(arrays(a, n), axis)); });
}

int mlxs_stack(mlxs_array* out, const mlxs_array* a, size_t n, int axis) {
  return guard([&] { *out = wrap(mx::stack(arrays(a, n), axis)); });
}

int mlxs_take(mlxs_array* out, const mlxs_array a, const mlxs_array indices, int axis) {
  return guard([&] { *out = wrap(mx::take(arr(a), arr(indices), axis)); });
}

int mlxs_take_along_axis(mlxs_array* out, const mlxs_array a, const mlxs_array indices, int axis) {
  return guard([&] { *out = wrap(mx::take_along_axis(arr(a), arr(indices), axis)); });
}

int mlxs_put_along_axis(mlxs_array* out, const mlxs_array a, const mlxs_array indices, const mlxs_array values,
                        int axis) {
  return guard([&] { *out = wrap(mx::put_along_axis(arr(a), arr(indices), arr(values), axis)); });
}

int mlxs_scatter_add_axis(mlxs_array* out, const mlxs_array a, const mlxs_array indices, const mlxs_array values,
                          int axis) {
  return guard([&] { *out = wrap(mx::scatter_add_axis(arr(a), arr(indices), arr(values), axis)); });
}

int mlxs_arange(mlxs_array* out, double start, double stop, double step, int dtype) {
  return guard([&] { *out = wrap(mx::arange(start, stop, step, dtype_of(dtype))); });
}

int mlxs_full(mlxs_array* out, const int32_t* shape, int ndim, const mlxs_array value, int dtype) {
  return guard([&] { *out = wrap(mx::full(shape_of(shape, ndim), arr(value), dtype_of(dtype))); });
}

int mlxs_contiguous(mlxs_array* out, const mlxs_array a) {
  return guard([&] { *out = wrap(mx::contiguous(arr(a))); });
}

int mlxs_reduce(mlxs_array* out, int op, const mlxs_array a, const int32_t* axes, int n, int keepdims) {
  return guard([&] {
    const auto& x = arr(a);
    auto ax = n == 0 ? all_axes(x) : ints(axes, n);
    bool kd = keepdims != 0;
    switch (op) {
      case 0: *out = wrap(mx::sum(x, ax, kd)); break;
      case 1: *out = wrap(mx::max(x, ax, kd)); break;
      case 2: *out = wrap(mx::min(x, ax, kd)); break;
      case 3: *out = wrap(mx::mean(x, ax, kd)); break;
      case 4: *out = wrap(mx::prod(x, ax, kd)); break;
      case 5: *out = wrap(mx::logsumexp(x, ax, kd)); break;
      case 6:
      case 7: {
        if (n > 1) {
          throw std::invalid_argument("argmax/argmin take one axis");
        }
        if (n == 0) {
          *out = wrap(op == 6 ? mx::argmax(x, kd) : mx::argmin(x, kd));
        } else {
          *out = wrap(op == 6 ? mx::argmax(x, axes[0], kd) : mx::argmin(x, axes[0], kd));
        }
        break;
      }
      case 8: *out = wrap(mx::any(x, ax, kd)); break;
      case 9: *out = wrap(mx::all(x, ax, kd)); break;
      default: throw std::invalid_argument("unknown reduction " + std::to_string(op));
    }
  });
}

int mlxs_softmax(mlxs_array* out, const mlxs_array a, const int32_t* axes, int n, int precise) {
  return guard([&] {
    const auto& x = arr(a);
    *out = wrap(mx::softmax(x, n == 0 ? all_axes(x) : ints(axes, n), precise != 0));
  });
}

int mlxs_sort_op(mlxs_array* out, int op, const mlxs_array a, int axis, int k) {
  return guard([&] {
    const auto& x = arr(a);
    switch (op) {
      case 0: *out = wrap(mx::sort(x, axis)); break;
      case 1: *out = wrap(mx::argsort(x, axis)); break;
      case 2: *out = wrap(mx::partition(x, k, axis)); break;
      case 3: *out = wrap(mx::argpartition(x, k, axis)); break;
      case 4: *out = wrap(mx::topk(x, k, axis)); break;
      default: throw std::invalid_argument("unknown sort op " + std::to_string(op));
    }
  });
}

int mlxs_cumsum(mlxs_array* out, const mlxs_array a, int axis, int reverse, int inclusive) {
  return guard([&] { *out = wrap(mx::cumsum(arr(a), axis, reverse != 0, inclusive != 0)); });
}

int mlxs_swiglu(mlxs_array* out, const mlxs_array gate, const mlxs_array up) {
  // mlx-lm's activations.swiglu: `nn.silu(gate) * x` under mx.compile(shapeless=True), so the
  // elementwise chain runs as one fused kernel, with the same operations in the same order.
  using Fn = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;
  return guard([&] {
    // Built once and never destroyed: at exit, MLX's own globals (allocator, compile cache) may
    // already be gone when static destructors run, and freeing arrays then corrupts the heap.
    static const Fn* fused = new Fn(mx::compile(
        [](const std::vector<mx::array>& in) {
          return std::vector<mx::array>{mx::multiply(mx::multiply(in[0], mx::sigmoid(in[0])), in[1])};
        },
        /* shapeless = */ true));
    *out = wrap((*fused)({arr(gate), arr(up)})[0]);
  });
}

int mlxs_rms_norm(mlxs_array* out, const mlxs_array x, const mlxs_array weight, float eps) {
  return guard([&] { *out = wrap(mx::fast::rms_norm(arr(x), opt(weight), eps)); });
}

int mlxs_layer_norm(mlxs_array* out, const mlxs_array x, const mlxs_array weight, const mlxs_array bias, float eps) {
  return guard([&] { *out = wrap(mx::fast::layer_norm(arr(x), opt(weight), opt(bias), eps)); });
}

int mlxs_rope(mlxs_array* out, const mlxs_array x, int dims, int traditional, int has_base, float base, float scale,
              int offset, const mlxs_array offsets, const mlxs_array freqs) {
  return guard([&] {
    std::optional<float> b;
    if (has_base) {
      b = base;
    }
    *out = offsets ? wrap(mx::fast::rope(arr(x), dims, traditional != 0, b, scale, arr(offsets), opt(freqs)))
                   : wrap(mx::fast::rope(arr(x), dims, traditional != 0, b, scale, offset, opt(freqs)));
  });
}

int mlxs_sdpa(mlxs_array* out, const mlxs_array q, const mlxs_array k, const mlxs_array v, float scale,
              const char* mask_mode, const mlxs_array mask, const mlxs_array sinks) {
  return guard([&] {
    *out = wrap(mx::fast::scaled_dot_product_attention(arr(q), arr(k), arr(v), scale, mask_mode ? mask_mode : "",
                                                       opt(mask), opt(sinks)));
  });
}

int mlxs_random_seed(uint64_t seed) {
  return guard([&] { mx::random::seed(seed); });
}

int mlxs_random_key(mlxs_array* out, uint64_t seed) {
  return guard([&] { *out = wrap(mx::random::key(seed)); });
}

int mlxs_random_split(mlxs_array* first, mlxs_array* second, const mlxs_array key) {
  return guard([&] {
    auto [a, b] = mx::random::split(arr(key));
    *first = wrap(std::move(a));
    *second = wrap(std::move(b));
  });
}

int mlxs_random_categorical(mlxs_array* out, const mlxs_array logits, int axis, const mlxs_array key) {
  return guard([&] { *out = wrap(mx::random::categorical(arr(logits), axis, opt(key))); });
}

int mlxs_random_uniform(mlxs_array* out, const int32_t* shape, int ndim, int dtype, const mlxs_array key) {
  return guard([&] {
    *out = wrap(mx::random::uniform(mx::array(0.0f), mx::array(1.0f), shape_of(shape, ndim), dtype_of(dtype),
                                    opt(key)));
  });
}

int mlxs_random_randint(mlxs_array* out, int64_t low, int64_t high, const int32_t* shape, int ndim, int dtype,
                        const mlxs_array key) {
  return guard([&] {
    // As Python's mx.random.randint(low, high, shape) with int bounds: int32 scalars.
    *out = wrap(mx::random::randint(mx::array(static_cast<int>(low)), mx::array(static_cast<int>(high)),
                                    shape_of(shape, ndim), dtype_of(dtype), opt(key)));
  });
}

int mlxs_safetensors_load(mlxs_tensors* out, const char* path) {
  return guard([&] {
    auto loaded = mx::load_safetensors(std::string(path));
    auto t = new mlxs_tensors_();
    for (auto& [name, a] : loaded.first) {
      t->tensors.emplace_back(name, a);
    }
    for (auto& [k, v] : loaded.second) {
      t->meta.emplace_back(k, v);
    }
    *out = t;
  });
}

void mlxs_tensors_free(mlxs_tensors t) {
  delete t;
}

size_t mlxs_tensors_len(const mlxs_tensors t) {
  return t->tensors.size();
}

const char* mlxs_tensors_name(const mlxs_tensors t, size_t i) {
  return t->tensors.at(i).first.c_str();
}

int mlxs_tensors_array(mlxs_array* out, const mlxs_tensors t, size_t i) {
  return guard([&] { *out = wrap(t->tensors.at(i).second); });
}

size_t mlxs_tensors_meta_len(const mlxs_tensors t) {
  return t->meta.size();
}

const char* mlxs_tensors_meta_key(const mlxs_tensors t, size_t i) {
  return t->meta.at(i).first.c_str();
}

const char* mlxs_tensors_meta_value(const mlxs_tensors t, size_t i) {
  return t->meta.at(i).second.c_str();
}

int mlxs_safetensors_save(const char* path, const char* const* names, const mlxs_array* a, size_t n,
                          const char* const* meta_keys, const char* const* meta_values, size_t m) {
  return guard([&] {
    std::unordered_map<std::string, mx::array> tensors;
    for (size_t i = 0; i < n; ++i) {
      tensors.insert_or_assign(names[i], arr(a[i]));
    }
    std::unordered_map<std::string, std::string> meta;
    for (size_t i = 0; i < m; ++i) {
      meta[meta_keys[i]] = meta_values[i];
    }
    mx::save_safetensors(std::string(path), std::move(tensors), std::move(meta));
  });
}

size_t mlxs_active_memory(void) {
  return mx::get_active_memory();
}

size_t mlxs_peak_memory(void) {
  return mx::get_peak_memory();
}

size_t mlxs_external_memory(void) {
  return g_external.load();
}

size_t mlxs_cache_memory(void) {
  return mx::get_cache_memory();
}

void mlxs_reset_peak_memory(void) {
  mx::reset_peak_memory();
}

void mlxs_clear_cache(void) {
  mx::clear_cache();
}

size_t mlxs_set_cache_limit(size_t limit) {
  return mx::set_cache_limit(limit);
}

size_t mlxs_set_memory_limit(size_t limit) {
  return mx::set_memory_limit(limit);
}

int mlxs_gather_mm(mlxs_array* out, const mlxs_array a, const mlxs_array b, const mlxs_array lhs_indices,
                   const mlxs_array rhs_indices, int sorted_indices) {
  return guard([&] {
    *out = wrap(mx::gather_mm(arr(a), arr(b), opt(lhs_indices), opt(rhs_indices), sorted_indices != 0));
  });
}

int mlxs_gather_qmm(mlxs_array* out, const mlxs_array x, const mlxs_array w, const mlxs_array scales,
                    const mlxs_array biases, const mlxs_array lhs_indices, const mlxs_array rhs_indices,
                    int transpose, int group_size, int bits, const char* mode, int sorted_indices) {
  return guard([&] {
    *out = wrap(mx::gather_qmm(arr(x), arr(w), arr(scales), opt(biases), opt(lhs_indices), opt(rhs_indices),
                               transpose != 0, group_size, bits, mode, std::nullopt, sorted_indices != 0));
  });
}

}  // extern "C"
