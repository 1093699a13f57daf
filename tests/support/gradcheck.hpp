// Finite-difference gradient checking in double. The function under test maps inputs to any
// tensor; it is reduced to a scalar with fixed random weights, so every output element's
// gradient is checked, not just their sum.
#pragma once

#include <decentrain/decentrain.hpp>

#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

namespace dt = decentrain;

struct gradcheck_options {
  double step = 1e-6;
  double rtol = 1e-5;
  double atol = 1e-7;
};

// Returns an empty string when all analytical gradients match central differences, otherwise
// a description of the worst mismatch.
inline std::string gradcheck(const std::function<dt::var<>(const std::vector<dt::var<>>&)>& f,
                             std::vector<dt::tensor<>> inputs, gradcheck_options opt = {}) {
  for (auto& t : inputs) REQUIRE(t.dtype() == dt::dtype::f64);
  std::vector<dt::var<>> vars;
  for (auto& t : inputs) vars.push_back(dt::parameter(t));
  auto out = f(vars);
  dt::rng gen(1234, "gradcheck-weights");
  const auto weights = dt::randn(out.shape(), gen, dt::dtype::f64);
  auto objective = [&](const std::vector<dt::var<>>& vs) {
    auto y = f(vs);
    return dt::sum(dt::mul(y, dt::var<>(weights)));
  };
  objective(vars).backward();

  for (std::size_t i = 0; i < inputs.size(); ++i) {
    auto& x = inputs[i];
    auto* p = x.data<double>();
    std::vector<double> numeric(static_cast<std::size_t>(x.numel()));
    for (std::int64_t j = 0; j < x.numel(); ++j) {
      const double saved = p[j];
      p[j] = saved + opt.step;
      const double up = objective(vars).item();
      p[j] = saved - opt.step;
      const double down = objective(vars).item();
      p[j] = saved;
      numeric[static_cast<std::size_t>(j)] = (up - down) / (2 * opt.step);
    }
    const auto expected = dt::from_vector(numeric, x.shape());
    const auto& grad = vars[i].grad();
    if (!grad.defined()) return "input " + std::to_string(i) + " received no gradient";
    const auto cmp = dt::compare(grad, expected, opt.rtol, opt.atol);
    if (!cmp.close) return "input " + std::to_string(i) + ": " + cmp.message;
  }
  return {};
}

#define CHECK_GRADIENTS(...)              \
  do {                                    \
    const auto _msg = gradcheck(__VA_ARGS__); \
    INFO(_msg);                           \
    CHECK(_msg.empty());                  \
  } while (false)
