// Compiled with only single_include/ on the include path: the amalgamated header must be
// complete on its own. Trains a tiny linear model and checks the loss drops.
#include <decentrain/decentrain.hpp>

#include <cstdio>

namespace dt = decentrain;

int main() {
  dt::rng gen(7, "single-header");
  auto x = dt::randn(dt::shape{32, 4}, gen);
  auto true_w = dt::randn(dt::shape{4, 1}, gen);
  auto y = dt::math::matmul(x, true_w);
  auto w = dt::parameter(dt::zeros(dt::shape{4, 1}));
  double first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    auto err = dt::linear(dt::var<>(x), w) - dt::var<>(y);
    auto loss = dt::mean(err * err);
    if (step == 0) first = loss.item();
    last = loss.item();
    w.zero_grad();
    loss.backward();
    dt::no_grad guard;
    w.value() = dt::math::sub(w.value(), dt::math::affine(w.grad(), 0.1));
  }
  std::printf("single header: loss %.6f -> %.6f\n", first, last);
  return last < 0.01 * first ? 0 : 1;
}
