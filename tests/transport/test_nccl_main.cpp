// Entry point of the NCCL tests (host code, built by the C++ compiler). `--devices N` first: with
// fewer than N CUDA devices the program says so and exits 77, which CTest records as skipped
// (never as passed); `--no-device`: the same where there is a device (the cases that check what a
// machine without one is told). The rest of the command line goes to Catch2.
#include "support/catch_session.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver: clear the sticky status
    devices = 0;
  }
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--devices") == 0 && i + 1 < argc) {
      const int wanted = std::atoi(argv[++i]);
      if (devices < wanted) {
        std::printf("skipped: %d CUDA device%s, these cases need %d\n", devices, devices == 1 ? "" : "s", wanted);
        return 77;
      }
    } else if (std::strcmp(argv[i], "--no-device") == 0) {
      if (devices > 0) {
        std::printf("skipped: these cases check a machine without a CUDA device, and this one has %d\n", devices);
        return 77;
      }
    } else {
      rest.push_back(argv[i]);
    }
  }
  return decentrain_test::run_catch(static_cast<int>(rest.size()), rest.data());
}
