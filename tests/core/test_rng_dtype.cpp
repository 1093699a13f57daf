// Random streams and dtype helpers.
#include <decentrain/decentrain.hpp>

#include <catch2/catch.hpp>

#include <set>

namespace dt = decentrain;

TEST_CASE("rng streams are reproducible, named and restorable", "[rng]") {
  dt::rng a(1, "data"), b(1, "data"), c(1, "dropout"), d(2, "data");
  const auto first = a.next_u64();
  CHECK(first == b.next_u64());
  CHECK(first != c.next_u64());
  CHECK(first != d.next_u64());
  const auto saved = a.state();
  const auto next = a.next_u64();
  a.set_state(saved);
  CHECK(a.next_u64() == next);
  CHECK(a.name() == "data");
}

TEST_CASE("rng below() is unbiased and within range", "[rng]") {
  dt::rng gen(9, "below");
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 70000; ++i) ++counts[gen.below(7)];
  for (int c : counts) CHECK(c == Approx(10000).margin(500));  // ~5 standard deviations
  std::set<double> seen;
  for (int i = 0; i < 1000; ++i) {
    const double u = gen.uniform();
    CHECK(u >= 0.0);
    CHECK(u < 1.0);
    seen.insert(u);
  }
  CHECK(seen.size() == 1000);
}

TEST_CASE("dtype metadata", "[dtype]") {
  CHECK(dt::dtype_size(dt::dtype::bf16) == 2);
  CHECK(dt::dtype_size(dt::dtype::f64) == 8);
  CHECK(dt::dtype_name(dt::dtype::i32) == "i32");
  CHECK(dt::dtype_of<float> == dt::dtype::f32);
  CHECK_FALSE(dt::is_floating(dt::dtype::i32));
  CHECK(dt::from_vector(std::vector<std::int32_t>{3, -2}, {2}).to(dt::dtype::f64).to_vector<double>() ==
        std::vector<double>{3.0, -2.0});
}
