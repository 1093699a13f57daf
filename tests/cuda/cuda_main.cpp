// Entry point of the GPU test program: without a CUDA device it says so and exits with 77,
// which CTest records as skipped (never as passed). Host code only, compiled by the C++
// compiler (Catch2's runner through nvcc took four times as long); Catch2 itself comes from
// tests/support/catch_session.cpp.
#include "support/catch_session.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver: clear the sticky status
    devices = 0;
  }
  if (devices == 0) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    std::printf("CUDA device 0: %s (sm_%d%d, %.1f GiB)\n", prop.name, prop.major, prop.minor,
                static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  return decentrain_test::run_catch(argc, argv);
}
