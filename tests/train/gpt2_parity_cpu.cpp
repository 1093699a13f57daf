// GPT-2 124M logits, loss and gradients on the CPU against PyTorch (tests/support/gpt2_parity.hpp):
// the same check as the GPU's, so the reference script and the tolerances are exercised
// wherever PyTorch is installed.
//
//   test_gpt2_parity_cpu DIR
#include "support/gpt2_parity.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: test_gpt2_parity_cpu DIR\n");
    return 2;
  }
  return gpt2_parity::run<decentrain::cpu>(argv[1]);
}
