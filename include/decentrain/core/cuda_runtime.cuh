// CUDA runtime glue shared by every CUDA header: status checks that throw decentrain::error
// naming the failed call, the stream a host thread queues its work on, and launch geometry.
// The whole body is compiled only by nvcc.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "decentrain/detail/error.hpp"

namespace decentrain::cuda_rt {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    detail::fail("CUDA error in ", what, ": ", cudaGetErrorName(status), " (",
                 cudaGetErrorString(status), ")");
}

// After a kernel launch: a bad launch configuration or an earlier asynchronous fault is
// reported here, named after the kernel, instead of at some later unrelated call.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

// Number of usable devices; 0 when there is no driver or no GPU (never throws, so a test
// program can decide to skip).
inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" status
    return 0;
  }
  return n;
}

inline int current_device() {
  int d = 0;
  check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

// The device this host thread's tensors, kernels and cuBLAS handles use from now on (a CUDA
// runtime setting per thread: in-process peers on threads can each take their own GPU).
inline void set_device(int device) {
  const int n = device_count();
  if (device < 0 || device >= n)
    detail::fail("CUDA device ", device, " does not exist: this machine has ", n, " CUDA device", n == 1 ? "" : "s");
  check(cudaSetDevice(device), "cudaSetDevice");
}

// "NVIDIA H200, 139.8 GiB" for the summary of a run.
inline std::string device_name(int device) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  char memory[32];
  std::snprintf(memory, sizeof memory, "%.1f GiB", static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return std::string(prop.name) + ", " + memory;
}

namespace detail {
inline cudaStream_t& thread_stream() {
  // Each host thread has its own stream by default, so peers simulated as threads overlap on
  // one GPU. cudaStreamPerThread needs no creation or destruction.
  thread_local cudaStream_t stream = cudaStreamPerThread;
  return stream;
}
}  // namespace detail

// The stream every decentrain kernel, copy and GEMM of this thread is queued on.
inline cudaStream_t current_stream() { return detail::thread_stream(); }

// Runs a scope's work on `stream` (for example a communication stream) and restores the
// previous one. Memory allocated inside is cached for reuse on `stream` only.
class stream_guard {
 public:
  explicit stream_guard(cudaStream_t stream) : previous_(detail::thread_stream()) {
    detail::thread_stream() = stream;
  }
  ~stream_guard() { detail::thread_stream() = previous_; }
  stream_guard(const stream_guard&) = delete;
  stream_guard& operator=(const stream_guard&) = delete;

 private:
  cudaStream_t previous_;
};

// Waits for this thread's queued work; errors of earlier kernels surface here.
inline void synchronize() { check(cudaStreamSynchronize(current_stream()), "cudaStreamSynchronize"); }

// Grid for a grid-stride loop over n elements: enough blocks to fill the GPU, never more than
// the work needs (kernels loop, so capping the grid is always correct).
inline constexpr int threads_per_block = 256;
inline unsigned blocks_for(std::int64_t n, int threads = threads_per_block) {
  const std::int64_t needed = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(needed, 1, 65536));
}

}  // namespace decentrain::cuda_rt

#endif  // DECENTRAIN_HAS_CUDA
