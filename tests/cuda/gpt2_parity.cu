// GPT-2 124M logits, loss and gradients on the GPU against PyTorch (tests/support/gpt2_parity.hpp).
//
//   test_gpt2_parity DIR
#include "support/gpt2_parity.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: test_gpt2_parity DIR\n");
    return 2;
  }
  if (decentrain::cuda_rt::device_count() == 0) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  return gpt2_parity::run<decentrain::cuda>(argv[1]);
}
