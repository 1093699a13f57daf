// The vectorisable tanh behind float GELU: absolute error against std::tanh (in double) stays
// below 5e-7 everywhere, including saturation and the clamp at |u| = 9.
#include <decentrain/decentrain.hpp>

#include <catch2/catch.hpp>

#include <cmath>

TEST_CASE("float GELU's tanh is accurate to 5e-7 absolute", "[kernels][gelu]") {
  double worst = 0.0, where = 0.0;
  for (int i = -400000; i <= 400000; ++i) {
    const float u = static_cast<float>(i) * 5e-5f;  // [-20, 20]
    const double err = std::abs(static_cast<double>(decentrain::kernels::detail::gelu_tanh(u)) - std::tanh(static_cast<double>(u)));
    if (err > worst) worst = err, where = u;
  }
  INFO("worst " << worst << " at " << where);
  CHECK(worst < 5e-7);
  // Saturated: within one float step (6e-8) of +-1.
  CHECK(std::abs(decentrain::kernels::detail::gelu_tanh(100.f) - 1.f) <= 6e-8f);
  CHECK(std::abs(decentrain::kernels::detail::gelu_tanh(-100.f) + 1.f) <= 6e-8f);
}
