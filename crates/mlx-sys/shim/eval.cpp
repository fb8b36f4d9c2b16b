// mlx-gen's C ABI for evaluation: mlxs_eval / mlxs_async_eval (each thread that evaluates waits for
// its stream's queued work when it ends), the graph's export to dot, and MLX_GEN_CRASH_TRACE's handler.
#include "internal.h"

#include <mlx/graph_utils.h>

#include <csignal>
#include <cstdlib>
#include <execinfo.h>
#include <fstream>
#include <unistd.h>

namespace {

using shim::arrays;
using shim::guard;

// Work queued with async_eval may still run when the process (or the evaluating thread) ends;
// MLX's own state (scheduler, allocator, the stream's encoders) is then destroyed under it (seen as
// glibc heap corruption at exit). So every thread that evaluates waits for its stream's queued work
// when it ends: a thread-local guard, made at the thread's first evaluation just after MLX's
// per-thread state for that stream (so destroyed, and run, before it). On the main thread that is
// at exit, before the atexit handlers: glibc destroys the main thread's thread-locals first, so an
// atexit handler that synchronizes a GPU stream meets MLX's thread-local CUDA state destroyed (a
// segmentation fault at exit in cu::get_command_encoder, seen on the H100 after batch_step_cost).
// On the CPU, whose stream runs on MLX's own worker thread, an atexit handler also waits for the
// first evaluation's stream, named explicitly: the exiting main thread's default stream would be
// the wrong one when the evaluations ran on another thread (the server's engine thread, a test).
//
// With MLX_GEN_CRASH_TRACE=1 the first evaluation also installs a handler for fatal signals
// (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) that writes the native call stack to stderr (glibc's
// backtrace: "file(+offset)" frames, which addr2line resolves against an unstripped copy), then
// lets the signal do what it would have done: a crash inside MLX or a kernel launch on a machine
// without a debugger says where it happened.
void crash_trace(int sig) {
  static const char head[] = "fatal signal; native call stack:\n";
  ssize_t ignored = write(2, head, sizeof head - 1);
  (void)ignored;
  void* frames[64];
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_crash_trace() {
  const char* v = std::getenv("MLX_GEN_CRASH_TRACE");
  if (v == nullptr || std::strcmp(v, "1") != 0) {
    return;
  }
  void* warm[1];
  backtrace(warm, 1);  // loads the unwinder now, not inside the handler
  struct sigaction sa {};
  sa.sa_handler = crash_trace;
  sa.sa_flags = SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) {
    sigaction(sig, &sa, nullptr);
  }
}

// Waits for a stream's queued work when its thread ends (see above).
struct ThreadExitWait {
  mx::Stream stream;
  ~ThreadExitWait() {
    try {
      mx::synchronize(stream);
    } catch (...) {
    }
  }
};

void wait_at_exit() {
  thread_local bool armed = false;
  if (armed) {
    return;
  }
  armed = true;
  const mx::Stream stream = mx::default_stream(mx::default_device());
  // Builds MLX's state for the stream on this thread now, before the guard below.
  mx::synchronize(stream);
  thread_local ThreadExitWait guard{stream};
  static std::once_flag once;
  std::call_once(once, [stream] {
    install_crash_trace();
    if (stream.device.type == mx::Device::DeviceType::cpu) {
      static const mx::Stream first = stream;
      std::atexit([] {
        try {
          mx::synchronize(first);
        } catch (...) {
        }
      });
    }
  });
}

}  // namespace

extern "C" {

int mlxs_eval(const mlxs_array* a, size_t n) {
  return guard([&] {
    mx::eval(arrays(a, n));
    wait_at_exit();
  });
}

int mlxs_async_eval(const mlxs_array* a, size_t n) {
  return guard([&] {
    mx::async_eval(arrays(a, n));
    wait_at_exit();
  });
}

int mlxs_export_to_dot(const mlxs_array* a, size_t n, const char* path) {
  return guard([&] {
    std::ofstream os(path);
    if (!os) {
      throw std::runtime_error(std::string("cannot write ") + path);
    }
    mx::export_to_dot(os, arrays(a, n));
    if (!os.flush()) {
      throw std::runtime_error(std::string("cannot write ") + path);
    }
  });
}

}  // extern "C"
