// Entry point of the GPU test program: without a CUDA device it says so and exits with 77,
// which CTest records as skipped (never as passed).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  if (decentrain::cuda_rt::device_count() == 0) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    std::printf("CUDA device 0: %s (sm_%d%d, %.1f GiB)\n", prop.name, prop.major, prop.minor,
                static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  return Catch::Session().run(argc, argv);
}
