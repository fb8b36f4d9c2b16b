// CUDA kernels of mlx-gen's own, compiled here with NVRTC and launched by a primitive of our own,
// so that a call costs the host what one of MLX's primitives does. MLX's `fast::cuda_kernel` writes
// the kernel's whole source text again on every call (signature, template arguments, body: several
// kilobytes through fmt) before it looks the compiled module up by name, and its
// `precompiled_cuda_kernel` names a module by a hash of the compiled image, hashed again on every
// call: for a product called a hundred times a token, microseconds a call of host time either way.
// Here a kernel variant's source is written and compiled once (a cubin for the GPU's architecture,
// PTX where NVRTC cannot make SASS for it), kept on disk (MLX_GEN_KERNEL_CACHE, default
// $XDG_CACHE_HOME or ~/.cache, then mlx-gen/kernels) and loaded once with the CUDA driver; each
// call makes a JitPrimitive, whose evaluation allocates the outputs and adds one kernel node to
// MLX's CUDA graph through its command encoder, as MLX's own primitives do.
//
// NVRTC and the CUDA driver are libraries MLX's CUDA backend already links (libnvrtc, libcuda),
// found in the process by name. MLX's encoder is reached through the members its library exports
// (cu::get_command_encoder, CommandEncoder's set_input_array, set_output_array and
// add_kernel_node_raw), found by name too: MLX's wheels do not ship the CUDA headers its own
// declarations need, and MLX's CPU and Metal libraries do not have them. The kernel sources include no header either: 16-bit floats travel
// as their bits and convert with jit_prelude()'s functions.
#include "internal.h"

#include <mlx/primitives.h>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unordered_map>

// CUDA's dim3 (three unsigned ints, passed by value) and the driver's opaque types.
struct dim3 {
  unsigned int x, y, z;
};
struct CUfunc_st;
struct CUmod_st;

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

// A function of a library already in the process, by name (null where none has it).
template <class F>
void find(F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

const Nvrtc& nvrtc() {
  static const Nvrtc n = [] {
    Nvrtc r;
    find(r.create, "nvrtcCreateProgram");
    find(r.compile, "nvrtcCompileProgram");
    find(r.log_size, "nvrtcGetProgramLogSize");
    find(r.log, "nvrtcGetProgramLog");
    find(r.cubin_size, "nvrtcGetCUBINSize");
    find(r.cubin, "nvrtcGetCUBIN");
    find(r.ptx_size, "nvrtcGetPTXSize");
    find(r.ptx, "nvrtcGetPTX");
    find(r.destroy, "nvrtcDestroyProgram");
    r.ok = r.create && r.compile && r.log_size && r.log && r.cubin_size && r.cubin && r.ptx_size && r.ptx &&
           r.destroy;
    return r;
  }();
  return n;
}

// The members of MLX's CUDA command encoder a primitive needs (mlx/backend/cuda/device.h), found in
// libmlx by their exported names as MLX 0.32.4 mangles them, and called as the functions they are
// (the encoder as the first argument): absent from MLX's CPU and Metal libraries, where no kernel
// of ours runs.
struct Encoder {
  using Get = void* (*)(mx::Stream);
  using SetArray = void (*)(void*, const mx::array&);
  using AddNode = void (*)(void*, CUfunc_st*, dim3, dim3, dim3, uint32_t, void**);
  Get get = nullptr;
  SetArray set_input = nullptr, set_output = nullptr;
  AddNode add_node = nullptr;
  bool ok = false;
};

const Encoder& encoder_fns() {
  static const Encoder e = [] {
    Encoder r;
    find(r.get, "_ZN3mlx4core2cu19get_command_encoderENS0_6StreamE");
    find(r.set_input, "_ZN3mlx4core2cu14CommandEncoder15set_input_arrayERKNS0_5arrayE");
    find(r.set_output, "_ZN3mlx4core2cu14CommandEncoder16set_output_arrayERKNS0_5arrayE");
    find(r.add_node, "_ZN3mlx4core2cu14CommandEncoder19add_kernel_node_rawEP9CUfunc_st4dim3S5_S5_jPPv");
    r.ok = r.get && r.set_input && r.set_output && r.add_node;
    return r;
  }();
  return e;
}

// The CUDA driver's module loading and page-locked host memory (libcuda, in the process through
// libmlx).
struct Driver {
  using Load = int (*)(CUmod_st**, const void*);
  using Function = int (*)(CUfunc_st**, CUmod_st*, const char*);
  using HostAlloc = int (*)(void**, size_t, unsigned);
  using HostDevicePointer = int (*)(unsigned long long*, void*, unsigned);
  Load load = nullptr;
  Function function = nullptr;
  HostAlloc host_alloc = nullptr;
  HostDevicePointer host_device_pointer = nullptr;
  bool ok = false;
};

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    find(r.load, "cuModuleLoadData");
    find(r.function, "cuModuleGetFunction");
    find(r.host_alloc, "cuMemHostAlloc");
    find(r.host_device_pointer, "cuMemHostGetDevicePointer_v2");
    r.ok = r.load && r.function && r.host_alloc && r.host_device_pointer;
    return r;
  }();
  return d;
}

// MLX's CommandEncoder::add_completed_handler (exported): runs a function once the work queued so
// far has completed on the device.
using AddCompleted = void (*)(void*, std::function<void()>);
AddCompleted add_completed() {
  static const AddCompleted f = [] {
    AddCompleted r = nullptr;
    find(r, "_ZN3mlx4core2cu14CommandEncoder21add_completed_handlerESt8functionIFvvEE");
    return r;
  }();
  return f;
}

// Page-locked host blocks, mapped into the device's address space, for the words a launch reads
// from the host (JitKernel::launch's `host`): a block is taken when its launch is encoded and given
// back when the device has run it (add_completed), then reused; never freed.
class HostBlocks {
 public:
  struct Block {
    void* host;
    unsigned long long device;
    size_t bytes;
  };
  Block take(size_t bytes) {
    {
      std::lock_guard<std::mutex> held(lock_);
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].bytes >= bytes) {
          Block b = free_[i];
          free_.erase(free_.begin() + static_cast<long>(i));
          return b;
        }
      }
    }
    Block b{nullptr, 0, std::max<size_t>(bytes, 64 * 1024)};
    const Driver& d = driver();
    // CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP
    if (int rc = d.host_alloc(&b.host, b.bytes, 0x01 | 0x02); rc != 0) {
      throw std::runtime_error("the CUDA driver could not allocate " + std::to_string(b.bytes) +
                               " bytes of page-locked host memory (error " + std::to_string(rc) + ")");
    }
    if (int rc = d.host_device_pointer(&b.device, b.host, 0); rc != 0) {
      throw std::runtime_error("the CUDA driver gave no device address for page-locked host memory (error " +
                               std::to_string(rc) + ")");
    }
    return b;
  }
  void give_back(Block b) {
    std::lock_guard<std::mutex> held(lock_);
    free_.push_back(b);
  }

 private:
  std::mutex lock_;
  std::vector<Block> free_;
};

HostBlocks& host_blocks() {
  static auto* blocks = new HostBlocks();
  return *blocks;
}

// MLX's own allocation of a primitive's output in device memory on the encoder's stream
// (cu::malloc_async(size, encoder), local to libmlx: elf.cpp finds it), unless MLX_GEN_JIT_DEVICE_MEMORY=0;
// null where it is off or not found, and outputs come from the exported allocator's malloc, which on CUDA
// is managed memory (and moves a device buffer its cache hands out to managed memory with a synchronous
// copy). Measured on an H100 (BENCHMARKS.md 2026-12-07c, 3 rounds): the same tokens, a decode's p99
// inter-token time lower in 5 of 6 pairs (Llama-3.2-3B 3.4-4.4 ms against 3.9-4.9), so on by default.
using DeviceMalloc = mx::allocator::Data (*)(size_t, void*);
DeviceMalloc device_malloc() {
  static const DeviceMalloc f = []() -> DeviceMalloc {
    const char* v = std::getenv("MLX_GEN_JIT_DEVICE_MEMORY");
    if (v != nullptr && std::strcmp(v, "0") == 0) {
      return nullptr;
    }
    const bool asked = v != nullptr && std::strcmp(v, "1") == 0;
    auto found = reinterpret_cast<DeviceMalloc>(local_function(reinterpret_cast<void*>(encoder_fns().get),
                                                               "_ZN3mlx4core2cu19get_command_encoderENS0_6StreamE",
                                                               "_ZN3mlx4core2cu12malloc_asyncEmRNS1_14CommandEncoderE"));
    if (found == nullptr && asked) {
      std::fprintf(stderr,
                   "warning: MLX_GEN_JIT_DEVICE_MEMORY=1: MLX's device allocation was not found in its library's "
                   "symbol table; our kernels' outputs stay in MLX's managed memory\n");
    }
    return found;
  }();
  return f;
}

// Whether everything a JitKernel needs is in the process: NVRTC, the CUDA driver, MLX's encoder.
bool runtime_found() {
  return nvrtc().ok && encoder_fns().ok && driver().ok && add_completed() != nullptr;
}

// A kernel source as compiled: its text with KNAME defined as the function's (and module's) name.
std::string named_source(const std::string& name, const std::string& text) {
  return "#define KNAME " + name + "\n" + text;
}

// An array's device address (mlx/backend/cuda/utils.h's gpu_ptr: the CUDA buffer's first member is
// its data pointer; the offset is in bytes).
void* device_ptr(const mx::array& a) {
  return static_cast<char*>(*static_cast<void* const*>(a.buffer().ptr())) + a.offset();
}

int as_int(int64_t v, const std::string& kernel) {
  if (v < INT32_MIN || v > INT32_MAX) {
    throw std::runtime_error(kernel + ": a stride does not fit in 32 bits");
  }
  return static_cast<int>(v);
}

// One launch of a JitKernel: inputs' and outputs' data pointers, the host words' device address
// (where there are any), the scalars, then the strides (elements, one an axis) of each input marked
// strided; every other input must be row-contiguous.
class JitPrimitive : public mx::Primitive {
 public:
  JitPrimitive(mx::Stream stream, JitKernel& kernel, std::vector<int> scalars, std::vector<bool> strided,
               std::array<unsigned, 3> grid, std::array<unsigned, 3> block, std::vector<uint32_t> host)
      : mx::Primitive(stream),
        kernel_(kernel),
        scalars_(std::move(scalars)),
        strided_(std::move(strided)),
        grid_(grid),
        block_(block),
        host_(std::move(host)) {}

  void eval_cpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(kernel_.name() + " runs on a CUDA GPU only");
  }

  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto* function = static_cast<CUfunc_st*>(kernel_.function());
    const Encoder& fns = encoder_fns();
    void* encoder = fns.get(stream());
    std::vector<void*> pointers;
    std::vector<int> ints = scalars_;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& in = inputs[i];
      if (i < strided_.size() && strided_[i]) {
        for (int64_t stride : in.strides()) {
          ints.push_back(as_int(stride, kernel_.name()));
        }
      } else if (!in.flags().row_contiguous) {
        throw std::runtime_error(kernel_.name() + ": input " + std::to_string(i) + " is not row-contiguous");
      }
      pointers.push_back(device_ptr(in));
      fns.set_input(encoder, in);
    }
    const DeviceMalloc in_device = device_malloc();
    for (auto& out : outputs) {
      out.set_data(in_device != nullptr ? in_device(out.nbytes(), encoder) : mx::allocator::malloc(out.nbytes()));
      pointers.push_back(device_ptr(out));
      fns.set_output(encoder, out);
    }
    if (!host_.empty()) {
      const size_t bytes = host_.size() * sizeof(uint32_t);
      HostBlocks::Block block = host_blocks().take(bytes);
      std::memcpy(block.host, host_.data(), bytes);
      pointers.push_back(reinterpret_cast<void*>(static_cast<uintptr_t>(block.device)));
      add_completed()(encoder, [block] { host_blocks().give_back(block); });
    }
    std::vector<void*> params;
    params.reserve(pointers.size() + ints.size());
    for (auto& p : pointers) {
      params.push_back(&p);
    }
    for (auto& v : ints) {
      params.push_back(&v);
    }
    fns.add_node(encoder, function, dim3{grid_[0], grid_[1], grid_[2]}, dim3{block_[0], block_[1], block_[2]},
                 dim3{1, 1, 1}, 0, params.data());
  }

  const char* name() const override {
    return "MlxGenKernel";
  }

 private:
  JitKernel& kernel_;
  std::vector<int> scalars_;
  std::vector<bool> strided_;
  std::array<unsigned, 3> grid_, block_;
  std::vector<uint32_t> host_;
};

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
__device__ __forceinline__ float to_f(bool v) {
  return v ? 1.0f : 0.0f;
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
// a + b and a * b in the type itself, rounded once (as CUDA's __hadd / __hmul: bf16 through its
// fused multiply-add with 1 or -0, sm_80 and later).
__device__ __forceinline__ float add_t(float a, float b) {
  return a + b;
}
__device__ __forceinline__ float mul_t(float a, float b) {
  return a * b;
}
__device__ __forceinline__ bf16_t add_t(bf16_t a, bf16_t b) {
  u16 r;
  const u16 one = 0x3f80u;
  asm("fma.rn.bf16 %0, %1, %2, %3;" : "=h"(r) : "h"(a.bits), "h"(one), "h"(b.bits));
  return bf16_t{r};
}
__device__ __forceinline__ bf16_t mul_t(bf16_t a, bf16_t b) {
  u16 r;
  const u16 neg_zero = 0x8000u;
  asm("fma.rn.bf16 %0, %1, %2, %3;" : "=h"(r) : "h"(a.bits), "h"(b.bits), "h"(neg_zero));
  return bf16_t{r};
}
__device__ __forceinline__ f16_t add_t(f16_t a, f16_t b) {
  u16 r;
  asm("add.rn.f16 %0, %1, %2;" : "=h"(r) : "h"(a.bits), "h"(b.bits));
  return f16_t{r};
}
__device__ __forceinline__ f16_t mul_t(f16_t a, f16_t b) {
  u16 r;
  asm("mul.rn.f16 %0, %1, %2;" : "=h"(r) : "h"(a.bits), "h"(b.bits));
  return f16_t{r};
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
  return kernel_backend() == 1 && runtime_found();
}

int jit_sm() {
  return std::atoi(arch().c_str());
}

void* JitKernel::function() {
  std::lock_guard<std::mutex> held(lock_);
  if (function_ == nullptr) {
    const Driver& d = driver();
    if (!runtime_found()) {
      throw std::runtime_error("NVRTC, the CUDA driver or MLX's CUDA encoder is not in the process: the kernel " + name_ +
                               " cannot run");
    }
    const std::string image = image_for(name_, source_);
    CUmod_st* module = nullptr;
    if (int rc = d.load(&module, image.data()); rc != 0) {
      throw std::runtime_error("the CUDA driver could not load " + name_ + " (error " + std::to_string(rc) + ")");
    }
    CUfunc_st* f = nullptr;
    if (int rc = d.function(&f, module, name_.c_str()); rc != 0) {
      throw std::runtime_error("the CUDA driver found no function " + name_ + " (error " + std::to_string(rc) + ")");
    }
    function_ = f;
    source_.clear();
  }
  return function_;
}

std::vector<mx::array> JitKernel::launch(const std::vector<mx::array>& inputs, const std::vector<mx::Shape>& shapes,
                                         const std::vector<mx::Dtype>& dtypes, std::vector<int> scalars,
                                         std::vector<bool> strided, std::array<unsigned, 3> grid,
                                         std::array<unsigned, 3> block, std::vector<uint32_t> host) {
  auto stream = mx::default_stream(mx::default_device());
  return mx::array::make_arrays(shapes, dtypes,
                                std::make_shared<JitPrimitive>(stream, *this, std::move(scalars), std::move(strided),
                                                               grid, block, std::move(host)),
                                inputs);
}

MappedHost mapped_host(size_t bytes) {
  if (!jit_available()) {
    throw std::runtime_error("page-locked host memory for a kernel needs a CUDA GPU with NVRTC and the driver");
  }
  HostBlocks::Block b = host_blocks().take(bytes);  // never given back
  return MappedHost{b.host, b.device};
}

JitKernel& jit_kernel(const std::string& key, const std::function<std::string()>& source) {
  static std::mutex lock;
  static auto* kernels = new std::unordered_map<std::string, JitKernel*>();
  std::lock_guard<std::mutex> held(lock);
  auto& slot = (*kernels)[key];
  if (slot == nullptr) {
    const std::string text = source();
    std::string name = kernel_name(key, text);
    slot = new JitKernel(name, named_source(name, text));
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
    for (auto& s : shim::add_rms_norm_sources()) {
      all.push_back(std::move(s));
    }
    for (auto& s : shim::sdpa_few_sources()) {
      all.push_back(std::move(s));
    }
    for (auto& s : shim::gated_delta_sources()) {
      all.push_back(std::move(s));
    }
    for (auto& s : shim::mask_tokens_sources()) {
      all.push_back(std::move(s));
    }
    for (auto& s : shim::moe_route_sources()) {
      all.push_back(std::move(s));
    }
    for (auto& s : shim::qmm_mma_sources()) {
      all.push_back(std::move(s));
    }
    for (auto& s : shim::mailbox_sources()) {
      all.push_back(std::move(s));
    }
    *compiled = 0;
    for (const auto& [key, source] : all) {
      std::string log;
      if (shim::compile(key, shim::named_source(key, source), std::string("-arch=sm_") + arch, log).empty()) {
        throw std::runtime_error("NVRTC failed to compile " + key + ": " + log);
      }
      ++*compiled;
    }
  });
}
