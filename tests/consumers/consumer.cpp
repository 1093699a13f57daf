// The program the add_subdirectory, single-header and pkg-config consumers build: fits y = x W with
// the library's autograd and exits non-zero unless the loss falls by 100x.
#if defined(DECENTRAIN_CONSUMER_SINGLE_HEADER)
#include <decentrain.hpp>  // the installed single header
#else
#include <decentrain/decentrain.hpp>
#endif

#include <cstdio>

namespace dt = decentrain;

int main() {
  dt::rng gen(11, "consumer");
  const auto x = dt::randn(dt::shape{64, 8}, gen);
  const auto y = dt::math::matmul(x, dt::randn(dt::shape{8, 2}, gen));
  auto w = dt::parameter(dt::zeros(dt::shape{8, 2}));
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    auto diff = dt::linear(dt::var<>(x), w) - dt::var<>(y);
    auto loss = dt::mean(diff * diff);
    last = loss.item();
    if (step == 0) first = last;
    w.zero_grad();
    loss.backward();
    dt::no_grad guard;
    w.value() = dt::math::sub(w.value(), dt::math::affine(w.grad(), 0.2));
  }
  std::printf("decentrain %s consumer: loss %.3g -> %.3g\n", dt::version.string, first, last);
  return last < first / 100 ? 0 : 1;
}
