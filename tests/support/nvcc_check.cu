// Built by nvcc when CUDA is enabled: every header must compile in a CUDA translation unit.
#include <decentrain/decentrain.hpp>

static_assert(DECENTRAIN_HAS_CUDA == 1, "nvcc must see DECENTRAIN_HAS_CUDA == 1");

int main() {
  decentrain::rng gen(1, "nvcc-check");
  auto x = decentrain::parameter(decentrain::randn(decentrain::shape{2, 3}, gen));
  decentrain::sum(decentrain::gelu(x)).backward();
  return x.grad().defined() ? 0 : 1;
}
