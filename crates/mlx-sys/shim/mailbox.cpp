// mlx-gen's C ABI for reading sampled tokens before their evaluation ends (a "mailbox"). MLX gives
// every array of one evaluation the same event, signalled when the whole evaluation is done, so a
// step that queues token n's sampling together with forward pass n+1 over it could read token n
// only once forward n+1 had finished (BENCHMARKS.md 2026-12-07c: 0.4-2.3 ms of wait a step). Here
// the sampled tokens pass through a primitive of ours that also writes them, then a sequence
// number, to host memory the host polls: on a CUDA GPU one kernel of ours (jit.cpp) writing to
// page-locked mapped memory, on the CPU a task of MLX's CPU stream writing to the heap. Forward
// n+1 reads the primitive's output (the same tokens), so the tokens are written as soon as they
// are sampled, while the device goes on. Metal has no such primitive here: mlxs_mailbox_new fails
// there and the engine queues the sampling in an evaluation of its own instead.
#include "internal.h"

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include <chrono>
#include <memory>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

// The block's words: [0] the sequence number of the last post, [kHeader..] its tokens.
struct mlxs_mailbox_ {
  uint32_t* words;
  unsigned long long device;  // the block's device address (CUDA), 0 on the CPU
  bool cuda;
  uint32_t next;  // the sequence number of the next post (never 0, the block's initial value)
  std::unique_ptr<uint32_t[]> owned;  // the CPU's block
};

namespace {

using shim::arr;
using shim::guard;
using shim::wrap;

constexpr size_t kHeader = 32;  // words: the sequence number alone on its 128-byte line
constexpr size_t kBytes = 64 * 1024;
constexpr size_t kCapacity = kBytes / sizeof(uint32_t) - kHeader;

// The block's sequence number, read with acquire and written with release ordering (the compiler's
// atomic builtins: libc++ has std::atomic_ref only from LLVM 19, past what macOS's toolchain ships).
uint32_t load_seq(const uint32_t* words) {
  return __atomic_load_n(&words[0], __ATOMIC_ACQUIRE);
}
void store_seq(uint32_t* words, uint32_t seq) {
  __atomic_store_n(&words[0], seq, __ATOMIC_RELEASE);
}

// On the CPU: copies the tokens to the output and to the block, then stores the sequence number
// (release: a reader that sees it sees the tokens), as a task of the stream's thread.
class PostCpu : public mx::Primitive {
 public:
  PostCpu(mx::Stream stream, uint32_t* words, uint32_t seq) : mx::Primitive(stream), words_(words), seq_(seq) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    auto& y = outputs[0];
    y.set_data(mx::allocator::malloc(y.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    encoder.set_output_array(y);
    encoder.dispatch([src = x.data<uint32_t>(), dst = y.data<uint32_t>(), n = x.size(), words = words_,
                      seq = seq_] {
      std::memcpy(dst, src, n * sizeof(uint32_t));
      std::memcpy(words + kHeader, src, n * sizeof(uint32_t));
      store_seq(words, seq);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("the CPU's token mailbox cannot run on a GPU stream");
  }

  const char* name() const override {
    return "MlxGenPost";
  }

 private:
  uint32_t* words_;
  uint32_t seq_;
};

// On CUDA: one block copies the tokens to the output and to the mapped block, then (after a
// system-wide fence) writes the sequence number. Host words: the block's device address (low, high
// word), the sequence number, the token count; HEADER is kHeader.
const char* kSource = R"(
extern "C" __global__ void KNAME(const u32* x, u32* out, const u32* host) {
  volatile u32* box = reinterpret_cast<volatile u32*>(static_cast<unsigned long long>(host[0]) |
                                                      (static_cast<unsigned long long>(host[1]) << 32));
  const u32 n = host[3];
  for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
    const u32 t = x[i];
    out[i] = t;
    box[HEADER + i] = t;
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    box[0] = host[2];
    __threadfence_system();
  }
}
)";

std::string source() {
  return std::string(shim::jit_prelude()) + "#define HEADER " + std::to_string(kHeader) + "u\n" + kSource;
}

// Waits a little: spinning first (a token is usually a few microseconds away), then yielding.
void pause(size_t round) {
  if (round < 2000) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  } else if (round < 20000) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> shim::mailbox_sources() {
  return {{"mlxgen_mailbox_post", source()}};
}

int mlxs_mailbox_new(mlxs_mailbox* out) {
  return guard([&] {
    *out = nullptr;
    auto m = std::make_unique<mlxs_mailbox_>();
    m->next = 1;
    if (mx::default_device() == mx::Device::cpu) {
      m->owned = std::make_unique<uint32_t[]>(kBytes / sizeof(uint32_t));
      m->words = m->owned.get();
      m->cuda = false;
    } else if (shim::jit_available()) {
      const shim::MappedHost block = shim::mapped_host(kBytes);
      m->words = static_cast<uint32_t*>(block.host);
      m->device = block.device;
      m->cuda = true;
    } else {
      throw std::runtime_error("no token mailbox on this device (a CPU or a CUDA GPU has one)");
    }
    store_seq(m->words, 0);
    *out = m.release();
  });
}

void mlxs_mailbox_free(mlxs_mailbox m) {
  delete m;  // a CUDA block stays page-locked for the process (jit.cpp's mapped_host)
}

int mlxs_mailbox_post(mlxs_array* out, uint32_t* seq, mlxs_mailbox m, const mlxs_array tokens) {
  return guard([&] {
    *out = nullptr;
    if (m == nullptr) {
      throw std::invalid_argument("null mailbox");
    }
    auto x = arr(tokens);
    if (x.ndim() != 1 || !(x.dtype() == mx::uint32 || x.dtype() == mx::int32) || x.size() == 0 ||
        x.size() > kCapacity) {
      throw std::invalid_argument("a token mailbox takes 1 to " + std::to_string(kCapacity) +
                                  " 32-bit integer tokens in one dimension");
    }
    x = mx::contiguous(x);
    const uint32_t s = m->next;
    m->next = m->next == UINT32_MAX ? 1 : m->next + 1;
    if (!m->cuda) {
      auto stream = mx::default_stream(mx::Device::cpu);
      *out = wrap(mx::array(x.shape(), x.dtype(), std::make_shared<PostCpu>(stream, m->words, s), {x}));
    } else {
      auto& kernel = shim::jit_kernel("mlxgen_mailbox_post", source);
      const auto n = static_cast<uint32_t>(x.size());
      auto outs = kernel.launch({x}, {x.shape()}, {x.dtype()}, {}, {false}, {1, 1, 1}, {256, 1, 1},
                                {static_cast<uint32_t>(m->device & 0xffffffffull),
                                 static_cast<uint32_t>(m->device >> 32), s, n});
      *out = wrap(outs[0]);
    }
    *seq = s;
  });
}

int mlxs_mailbox_wait(int* got, mlxs_mailbox m, uint32_t seq, const mlxs_array posted, uint32_t* dst, size_t n) {
  return guard([&] {
    *got = 0;
    if (m == nullptr) {
      throw std::invalid_argument("null mailbox");
    }
    const auto& a = arr(posted);
    if (n != a.size() || n > kCapacity) {
      throw std::invalid_argument("a mailbox read of " + std::to_string(n) + " tokens for a post of " +
                                  std::to_string(a.size()));
    }
    auto read = [&] {
      if (load_seq(m->words) != seq) {
        return false;
      }
      std::memcpy(dst, m->words + kHeader, n * sizeof(uint32_t));
      return true;
    };
    // Never queued (the caller reads the array, which evaluates it).
    if (a.status() == mx::array::Status::unscheduled) {
      return;
    }
    for (size_t round = 0;; ++round) {
      if (read()) {
        *got = 1;
        return;
      }
      // Evaluated without the block showing this post (a later post overwrote it): the array has
      // the tokens.
      if (round % 64 == 63 && a.is_available()) {
        *got = read() ? 1 : 0;
        return;
      }
      pause(round);
    }
  });
}
