// CUDA kernels of mlx-gen's own, compiled here with NVRTC and launched through MLX's exported
// `fast::precompiled_cuda_kernel`, so that a call costs the host what one of MLX's own primitives
// does. MLX's `fast::cuda_kernel` writes the kernel's whole source text again on every call (its
// signature, its template arguments, the body: several kilobytes through fmt) before it looks the
// compiled module up by name; for a product called a hundred times a token that was several
// microseconds a call of host time. Here a kernel variant's source is written and compiled once:
// its image (cubin for the device's architecture, PTX where NVRTC cannot make SASS for it) is kept
// on disk (MLX_GEN_KERNEL_CACHE, default $XDG_CACHE_HOME or ~/.cache, then mlx-gen/kernels), loaded
// into MLX's module cache by one tiny synchronous launch at first use (the kernel returns at once
// when its first scalar, `dry`, is 1), and every later call hands MLX the kernel's name with an
// empty image (MLX finds the loaded module by name and never reads the image again).
//
// NVRTC is the library MLX's CUDA backend already links (libnvrtc), found in the process by name.
// The sources include no header: 16-bit floats travel as their bits and convert with jit_prelude()'s
// functions.
#include "internal.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unordered_map>

namespace shim {

namespace {

// The NVRTC entry points mlx-gen uses (its C API: stable across CUDA versions).
struct Nvrtc {
  using Create = int (*)(void**, const char*, const char*, int, const char* const*, const char* const*);
  using Compile = int (*)(void*, int, const char* const*);
  using Size = int (*)(void*, size_t*);
  using Get = int (*)(void*, char*);
  using Destroy = int (*)(void**);
  Create create = nullptr;
  Compile compile = nullptr;
  Size log_size = nullptr, cubin_size = nullptr, ptx_size = nullptr;
  Get log = nullptr, cubin = nullptr, ptx = nullptr;
  Destroy destroy = nullptr;
  bool ok = false;
};

const Nvrtc& nvrtc() {
  static const Nvrtc n = [] {
    Nvrtc r;
    auto sym = [](const char* name) { return dlsym(RTLD_DEFAULT, name); };
    r.create = reinterpret_cast<Nvrtc::Create>(sym("nvrtcCreateProgram"));
    r.compile = reinterpret_cast<Nvrtc::Compile>(sym("nvrtcCompileProgram"));
    r.log_size = reinterpret_cast<Nvrtc::Size>(sym("nvrtcGetProgramLogSize"));
    r.log = reinterpret_cast<Nvrtc::Get>(sym("nvrtcGetProgramLog"));
    r.cubin_size = reinterpret_cast<Nvrtc::Size>(sym("nvrtcGetCUBINSize"));
    r.cubin = reinterpret_cast<Nvrtc::Get>(sym("nvrtcGetCUBIN"));
    r.ptx_size = reinterpret_cast<Nvrtc::Size>(sym("nvrtcGetPTXSize"));
    r.ptx = reinterpret_cast<Nvrtc::Get>(sym("nvrtcGetPTX"));
    r.destroy = reinterpret_cast<Nvrtc::Destroy>(sym("nvrtcDestroyProgram"));
    r.ok = r.create && r.compile && r.log_size && r.log && r.cubin_size && r.cubin && r.ptx_size && r.ptx &&
           r.destroy;
    return r;
  }();
  return n;
}

// The default GPU's compute capability as "90" (sm_90).
std::string arch() {
  static const std::string a = [] {
    const auto& info = mx::device_info(mx::Device(mx::Device::gpu, 0));
    auto get = [&](const char* key) -> size_t {
      auto it = info.find(key);
      if (it == info.end() || !std::holds_alternative<size_t>(it->second)) {
        throw std::runtime_error(std::string("MLX reports no ") + key + " for the GPU");
      }
      return std::get<size_t>(it->second);
    };
    return std::to_string(get("compute_capability_major")) + std::to_string(get("compute_capability_minor"));
  }();
  return a;
}

// Compiles `source` with NVRTC for `option` (-arch=sm_XY: cubin, -arch=compute_XY: PTX); empty
// with the compiler's log in `log` where it fails.
std::string compile(const std::string& name, const std::string& source, const std::string& option,
                    std::string& log) {
  const Nvrtc& n = nvrtc();
  void* prog = nullptr;
  if (n.create(&prog, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr) != 0) {
    throw std::runtime_error("NVRTC could not create a program for " + name);
  }
  const char* opts[] = {option.c_str(), "--std=c++17", "-default-device"};
  const bool built = n.compile(prog, 3, opts) == 0;
  std::string image;
  if (built) {
    const bool cubin = option.find("sm_") != std::string::npos;
    size_t size = 0;
    (cubin ? n.cubin_size : n.ptx_size)(prog, &size);
    image.resize(size);
    (cubin ? n.cubin : n.ptx)(prog, image.data());
  } else {
    size_t size = 0;
    n.log_size(prog, &size);
    log.assign(size, '\0');
    n.log(prog, log.data());
  }
  n.destroy(&prog);
  return image;
}

std::filesystem::path cache_dir() {
  if (const char* d = std::getenv("MLX_GEN_KERNEL_CACHE"); d != nullptr && *d != '\0') {
    return d;
  }
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    return std::filesystem::path(x) / "mlx-gen" / "kernels";
  }
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home != nullptr ? home : "/tmp") / ".cache" / "mlx-gen" / "kernels";
}

// The image of kernel `name` for this GPU: from the disk cache, else compiled (and cached; a cache
// that cannot be written is skipped).
std::string image_for(const std::string& name, const std::string& source) {
  const std::string a = arch();
  const auto path = cache_dir() / (name + "_sm" + a + ".bin");
  if (std::ifstream in{path, std::ios::binary}; in.good()) {
    std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!image.empty()) {
      return image;
    }
  }
  std::string log;
  std::string image = compile(name, source, "-arch=sm_" + a, log);
  if (image.empty()) {
    image = compile(name, source, "-arch=compute_" + a, log);
  }
  if (image.empty()) {
    throw std::runtime_error("NVRTC failed to compile " + name + ": " + log);
  }
  std::error_code err;
  std::filesystem::create_directories(path.parent_path(), err);
  const auto tmp = path.string() + ".tmp" + std::to_string(static_cast<long>(getpid()));
  if (std::ofstream out{tmp, std::ios::binary}; out.good()) {
    out.write(image.data(), static_cast<std::streamsize>(image.size()));
    out.close();
    std::filesystem::rename(tmp, path, err);
  }
  return image;
}

}  // namespace

const char* jit_prelude() {
  return R"(
typedef unsigned int u32;
typedef unsigned short u16;
// 16-bit floats as their bits; to_f reads any float type as a float, from_f<T> rounds a float to T
// (to nearest even, as CUDA's conversions).
struct bf16_t {
  u16 bits;
};
struct f16_t {
  u16 bits;
};
__device__ __forceinline__ float to_f(float v) {
  return v;
}
__device__ __forceinline__ float to_f(bf16_t v) {
  return __uint_as_float(static_cast<u32>(v.bits) << 16);
}
__device__ __forceinline__ float to_f(f16_t v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}
template <class T>
__device__ __forceinline__ T from_f(float f);
template <>
__device__ __forceinline__ float from_f<float>(float f) {
  return f;
}
template <>
__device__ __forceinline__ bf16_t from_f<bf16_t>(float f) {
  const u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return bf16_t{static_cast<u16>((u >> 16) | 0x40u)};
  }
  return bf16_t{static_cast<u16>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
template <>
__device__ __forceinline__ f16_t from_f<f16_t>(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return f16_t{h};
}
)";
}

const char* jit_type(mx::Dtype dtype) {
  switch (dtype) {
    case mx::float32:
      return "float";
    case mx::bfloat16:
      return "bf16_t";
    case mx::float16:
      return "f16_t";
    case mx::uint32:
      return "u32";
    case mx::int32:
      return "int";
    case mx::bool_:
      return "bool";
    default:
      throw std::invalid_argument("no CUDA kernel type for this dtype");
  }
}

bool jit_available() {
  return kernel_backend() == 1 && nvrtc().ok;
}

std::vector<mx::array> JitKernel::launch(const std::vector<mx::array>& inputs, const std::vector<mx::Shape>& shapes,
                                         const std::vector<mx::Dtype>& dtypes, const std::vector<int>& scalars,
                                         std::tuple<int, int, int> grid, std::tuple<int, int, int> block) {
  std::vector<mx::fast::ScalarArg> args;
  args.reserve(scalars.size() + 1);
  args.emplace_back(0);
  for (int s : scalars) {
    args.emplace_back(s);
  }
  {
    std::lock_guard<std::mutex> held(lock_);
    if (!loaded_) {
      if (!nvrtc().ok) {
        throw std::runtime_error("NVRTC is not loaded: the CUDA kernel " + name_ + " cannot be compiled");
      }
      const std::string image = image_for(name_, source_);
      // One launch that returns at once (dry = 1) on inputs of one element: MLX loads the image.
      std::vector<mx::array> tiny;
      for (const auto& in : inputs) {
        tiny.push_back(mx::zeros({1}, in.dtype()));
      }
      std::vector<mx::Shape> one(shapes.size(), mx::Shape{1});
      auto warm = args;
      warm[0] = 1;
      mx::eval(mx::fast::precompiled_cuda_kernel(name_, image, tiny, one, dtypes, warm, {1, 1, 1}, {1, 1, 1}));
      loaded_ = true;
      source_.clear();
    }
  }
  return mx::fast::precompiled_cuda_kernel(name_, std::string(), inputs, shapes, dtypes, args, grid, block, 0,
                                           std::nullopt, true);
}

JitKernel& jit_kernel(const std::string& key, const std::function<std::string()>& source) {
  static std::mutex lock;
  static auto* kernels = new std::unordered_map<std::string, JitKernel*>();
  std::lock_guard<std::mutex> held(lock);
  auto& slot = (*kernels)[key];
  if (slot == nullptr) {
    const std::string text = source();
    std::string name = kernel_name(key, text);
    slot = new JitKernel(name, "#define KNAME " + name + "\n" + text);
  }
  return *slot;
}

}  // namespace shim

int mlxs_jit_check(const char* nvrtc_library, const char* arch, int* compiled) {
  return shim::guard([&] {
    if (dlopen(nvrtc_library, RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      throw std::runtime_error(std::string("cannot load ") + nvrtc_library + ": " + dlerror());
    }
    if (!shim::nvrtc().ok) {
      throw std::runtime_error(std::string(nvrtc_library) + " lacks NVRTC's entry points");
    }
    auto all = shim::qmm_sources();
    for (auto& s : shim::gated_delta_sources()) {
      all.push_back(std::move(s));
    }
    *compiled = 0;
    for (const auto& [key, source] : all) {
      std::string log;
      if (shim::compile(key, "#define KNAME " + key + "\n" + source, std::string("-arch=sm_") + arch, log).empty()) {
        throw std::runtime_error("NVRTC failed to compile " + key + ": " + log);
      }
      ++*compiled;
    }
  });
}
