// Tensors: creation, views and copies, dtype conversion, printing, comparison, bad input.
#include <decentrain/decentrain.hpp>

#include <catch2/catch.hpp>

#include <sstream>

namespace dt = decentrain;
using Catch::Matchers::Contains;

TEST_CASE("factories fill shape, dtype and values", "[tensor]") {
  auto z = dt::zeros(dt::shape{2, 3});
  CHECK(z.shape() == dt::shape{2, 3});
  CHECK(z.dtype() == dt::dtype::f32);
  CHECK(z.numel() == 6);
  CHECK(z.is_contiguous());
  CHECK(z.to_vector<float>() == std::vector<float>(6, 0.f));
  CHECK(dt::ones(dt::shape{4}, dt::dtype::f64).to_vector<double>() == std::vector<double>(4, 1.0));
  CHECK(dt::full(dt::shape{2}, 2.5).to_vector<float>() == std::vector<float>{2.5f, 2.5f});
  CHECK(dt::arange(5, dt::dtype::i32).to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 1, 2, 3, 4});
  CHECK(dt::arange(1.0, 0.0, -0.25).to_vector<float>() == std::vector<float>{1.f, .75f, .5f, .25f});
  CHECK(dt::full(dt::shape{}, 3.0).item() == 3.0);
  CHECK(dt::zeros(dt::shape{0, 3}).numel() == 0);
  CHECK_THROWS_WITH(dt::from_vector(std::vector<float>{1, 2, 3}, {2, 2}), Contains("3 values do not fill shape (2, 2)"));
  CHECK_THROWS_WITH(dt::shape({2, -3}), Contains("negative dimension -3"));
  CHECK_THROWS_WITH(dt::arange(0.0, 1.0, 0.0), Contains("step must be non-zero"));
}

TEST_CASE("random factories are seeded and have the requested moments", "[tensor][rng]") {
  dt::rng a(42, "init"), b(42, "init");
  CHECK(dt::randn(dt::shape{16}, a).to_vector<float>() == dt::randn(dt::shape{16}, b).to_vector<float>());
  dt::rng gen(7, "moments");
  const auto x = dt::randn(dt::shape{200000}, gen, dt::dtype::f64, 1.0, 2.0).to_vector<double>();
  double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= static_cast<double>(x.size());
  for (double v : x) var += (v - mean) * (v - mean);
  var /= static_cast<double>(x.size());
  CHECK(mean == Approx(1.0).margin(0.02));   // standard error 2/sqrt(2e5) = 0.0045
  CHECK(std::sqrt(var) == Approx(2.0).margin(0.02));
  const auto u = dt::uniform(dt::shape{10000}, gen, -1.0, 3.0).to_vector<float>();
  CHECK(*std::min_element(u.begin(), u.end()) >= -1.f);
  CHECK(*std::max_element(u.begin(), u.end()) < 3.f);
  CHECK_THROWS_WITH(dt::uniform(dt::shape{1}, gen, 2.0, 1.0), Contains("lo (2) must not exceed hi (1)"));
}

TEST_CASE("views share storage, reshape copies only when it must", "[tensor][views]") {
  auto x = dt::arange(12).reshape({3, 4});
  auto t = x.transpose(0, 1);
  CHECK(t.shape() == dt::shape{4, 3});
  CHECK(t.shares_storage_with(x));
  CHECK_FALSE(t.is_contiguous());
  CHECK(t.at({1, 2}) == 9.0);
  auto r = x.reshape({2, -1});
  CHECK(r.shape() == dt::shape{2, 6});
  CHECK(r.shares_storage_with(x));
  auto rt = t.reshape({12});  // not expressible as a view of a transposed layout: copies
  CHECK_FALSE(rt.shares_storage_with(x));
  CHECK(rt.to_vector<float>() == std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  auto s = x.slice(1, 1, 3);
  CHECK(s.shape() == dt::shape{3, 2});
  CHECK(s.shares_storage_with(x));
  CHECK(s.to_vector<float>() == std::vector<float>{1, 2, 5, 6, 9, 10});
  auto parts = x.split({1, 3}, 1);
  REQUIRE(parts.size() == 2);
  CHECK(parts[1].to_vector<float>() == std::vector<float>{1, 2, 3, 5, 6, 7, 9, 10, 11});
  auto p = dt::arange(24).reshape({2, 3, 4}).permute({2, 0, 1});
  CHECK(p.shape() == dt::shape{4, 2, 3});
  CHECK(p.at({3, 1, 2}) == 23.0);
  auto e = dt::arange(3).reshape({3, 1}).expand(dt::shape{2, 3, 4});
  CHECK(e.at({1, 2, 3}) == 2.0);
  CHECK(e.contiguous().to_vector<float>()[5] == 1.0f);
  CHECK_THROWS_WITH(x.expand(dt::shape{3, 5}), Contains("cannot expand shape (3, 4) to (3, 5)"));
  CHECK_THROWS_WITH(x.permute({0, 0}), Contains("repeats dim 0"));
  CHECK_THROWS_WITH(x.at({3, 0}), Contains("index 3 is out of range for dim 0 of size 3"));
}

TEST_CASE("copies are independent and copy_from writes into views", "[tensor][copy]") {
  auto x = dt::zeros(dt::shape{2, 3});
  auto c = x.clone();
  c.fill(1.0);
  CHECK(x.to_vector<float>() == std::vector<float>(6, 0.f));
  x.slice(1, 1, 3).copy_from(dt::ones(dt::shape{2, 2}, dt::dtype::f64));  // strided destination, dtype conversion
  CHECK(x.to_vector<float>() == std::vector<float>{0, 1, 1, 0, 1, 1});
  CHECK_THROWS_WITH(x.copy_from(dt::ones(dt::shape{3, 2})), Contains("source shape (3, 2) does not match destination shape (2, 3)"));
  CHECK_THROWS_WITH(dt::tensor<>().clone(), Contains("undefined tensor"));
  CHECK_THROWS_WITH(x.data<double>(), Contains("data<f64>() called on a tensor of dtype f32"));
}

TEST_CASE("bf16 stores the top half of f32 with round-to-nearest-even", "[tensor][bf16]") {
  CHECK(dt::bf16(1.0f).bits == 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even one (1.0).
  CHECK(static_cast<float>(dt::bf16(1.0f + 0x1p-8f)) == 1.0f);
  CHECK(static_cast<float>(dt::bf16(1.0f + 0x1p-8f + 0x1p-12f)) == 1.0f + 0x1p-7f);
  CHECK(std::isnan(static_cast<float>(dt::bf16(NAN))));
  CHECK(std::isinf(static_cast<float>(dt::bf16(INFINITY))));
  dt::rng gen(1, "bf16");
  const auto x = dt::randn(dt::shape{1000}, gen);
  const auto back = x.to(dt::dtype::bf16).to(dt::dtype::f32);
  const auto cmp = dt::compare(back, x, 1.0 / 256, 0.0);  // 8 significant bits: rel error <= 2^-9
  INFO(cmp.message);
  CHECK(cmp.close);
  CHECK(cmp.max_rel_diff > 0.0);
}

TEST_CASE("compare reports the worst element, printing is readable", "[tensor][compare]") {
  auto a = dt::from_vector(std::vector<float>{1, 2, 3}, {3});
  auto b = dt::from_vector(std::vector<float>{1, 2.5f, 3}, {3});
  const auto cmp = dt::compare(a, b, 1e-3, 1e-3);
  CHECK_FALSE(cmp.close);
  CHECK(cmp.worst_index == 1);
  CHECK(cmp.max_abs_diff == Approx(0.5));
  CHECK_THAT(cmp.message, Contains("at flat index 1 got 2 expected 2.5"));
  CHECK(dt::allclose(a, a));
  CHECK_THROWS_WITH(dt::compare(a, dt::zeros(dt::shape{2})), Contains("shapes differ: (3,) vs (2,)"));
  std::ostringstream out;
  out << dt::arange(20).reshape({2, 10});
  CHECK_THAT(out.str(), Contains("tensor(shape=(2, 10), dtype=f32, device=cpu)"));
  CHECK_THAT(out.str(), Contains("[[0, 1, 2, ..., 7, 8, 9],"));
}
