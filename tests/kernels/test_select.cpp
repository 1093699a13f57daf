// top_k: the k largest values and their positions, in the order a GPU radix sort gives them
// (tests/cuda checks that the GPU agrees position for position).
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <cmath>
#include <limits>
#include <vector>

namespace dt = decentrain;
using Catch::Matchers::Contains;

TEST_CASE("top_k returns the largest values first with their positions", "[kernels][select]") {
  const auto x = dt::from_vector(std::vector<float>{0.5f, -2.0f, 3.0f, 1.0f, 3.0f, -0.5f, 2.5f}, dt::shape{7});
  const auto [values, positions] = dt::math::top_k(x, 4);
  CHECK(values.to_vector<float>() == std::vector<float>{3.0f, 3.0f, 2.5f, 1.0f});
  CHECK(positions.dtype() == dt::dtype::i32);
  CHECK(positions.to_vector<std::int32_t>() == std::vector<std::int32_t>{2, 4, 6, 3});  // tie: lower position first

  CHECK(dt::math::top_k(x, 0).first.numel() == 0);
  const auto all = dt::math::top_k(x, 7).second.to_vector<std::int32_t>();
  CHECK(all == std::vector<std::int32_t>{2, 4, 6, 3, 0, 5, 1});
}

TEST_CASE("top_k orders special values as a radix sort does", "[kernels][select]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // -0 and +0 tie (lower position first); a positive NaN is above +inf, a negative one below -inf.
  const auto x = dt::from_vector(std::vector<double>{0.0, -inf, nan, -0.0, inf, -nan, 1.0}, dt::shape{7});
  const auto order = dt::math::top_k(x, 7).second.to_vector<std::int32_t>();
  CHECK(order == std::vector<std::int32_t>{2, 4, 6, 0, 3, 1, 5});
}

TEST_CASE("top_k agrees with a full sort on random data", "[kernels][select]") {
  dt::rng gen(4, "select");
  const auto x = dt::randn(dt::shape{5000}, gen);
  const auto [values, positions] = dt::math::top_k(x, 100);
  auto sorted = x.to_vector<float>();
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const auto v = values.to_vector<float>();
  const auto p = positions.to_vector<std::int32_t>();
  const auto xs = x.to_vector<float>();
  for (std::size_t i = 0; i < 100; ++i) {
    CHECK(v[i] == sorted[i]);
    CHECK(xs[static_cast<std::size_t>(p[i])] == v[i]);
  }
}

TEST_CASE("top_k rejects what it cannot select from", "[kernels][select][errors]") {
  const auto x = dt::zeros<dt::cpu>(dt::shape{2, 3});
  CHECK_THROWS_WITH(dt::math::top_k(x, 1), Contains("expects a 1-D tensor, got shape (2, 3)"));
  const auto v = dt::zeros<dt::cpu>(dt::shape{3});
  CHECK_THROWS_WITH(dt::math::top_k(v, 4), Contains("k = 4 is outside [0, 3]"));
  CHECK_THROWS_WITH(dt::math::top_k(v, -1), Contains("k = -1 is outside [0, 3]"));
  CHECK_THROWS_WITH(dt::math::top_k(dt::zeros<dt::cpu>(dt::shape{3}, dt::dtype::i32), 1), Contains("top_k"));
}
