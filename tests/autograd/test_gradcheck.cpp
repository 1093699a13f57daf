// Finite-difference gradient checks in double for every differentiable op, on several shapes
// including odd sizes. Tolerance: |analytic - numeric| <= 1e-7 + 1e-5 |numeric| with central
// differences of step 1e-6 (truncation error ~1e-12, rounding ~1e-10 relative).
#include "support/gradcheck.hpp"

#include <cmath>

namespace {
using vars = std::vector<dt::var<>>;
constexpr auto f64 = dt::dtype::f64;

dt::tensor<> randn(dt::shape s, std::uint64_t seed) {
  dt::rng gen(seed, "gradcheck-input");
  return dt::randn(s, gen, f64);
}
// Values in [lo, hi), for inputs that must stay away from zero (denominators).
dt::tensor<> away_from_zero(dt::shape s, std::uint64_t seed) {
  dt::rng gen(seed, "gradcheck-positive");
  return dt::uniform(s, gen, 0.5, 2.0, f64);
}
}  // namespace

TEST_CASE("gradcheck: broadcasting add, sub, mul, div", "[autograd][gradcheck]") {
  const std::vector<std::pair<dt::shape, dt::shape>> cases = {
      {{3, 5}, {3, 5}}, {{2, 3, 5}, {5}}, {{4, 1}, {1, 7}}, {{1}, {2, 3}}, {{2, 1, 3}, {4, 1}}};
  for (const auto& [sa, sb] : cases) {
    INFO("shapes " << sa << " and " << sb);
    CHECK_GRADIENTS([](const vars& v) { return v[0] + v[1]; }, {randn(sa, 1), randn(sb, 2)});
    CHECK_GRADIENTS([](const vars& v) { return v[0] - v[1]; }, {randn(sa, 3), randn(sb, 4)});
    CHECK_GRADIENTS([](const vars& v) { return v[0] * v[1]; }, {randn(sa, 5), randn(sb, 6)});
    CHECK_GRADIENTS([](const vars& v) { return v[0] / v[1]; }, {randn(sa, 7), away_from_zero(sb, 8)});
  }
}

TEST_CASE("gradcheck: scalar ops", "[autograd][gradcheck]") {
  for (const auto& s : {dt::shape{7}, dt::shape{3, 5}}) {
    CHECK_GRADIENTS([](const vars& v) { return v[0] + 2.5; }, {randn(s, 1)});
    CHECK_GRADIENTS([](const vars& v) { return 3.0 - v[0]; }, {randn(s, 2)});
    CHECK_GRADIENTS([](const vars& v) { return v[0] * -1.5; }, {randn(s, 3)});
    CHECK_GRADIENTS([](const vars& v) { return v[0] / 4.0; }, {randn(s, 4)});
    CHECK_GRADIENTS([](const vars& v) { return 2.0 / v[0]; }, {away_from_zero(s, 5)});
    CHECK_GRADIENTS([](const vars& v) { return -v[0]; }, {randn(s, 6)});
  }
}

TEST_CASE("gradcheck: matmul with transposes and batches", "[autograd][gradcheck]") {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      INFO("trans_a " << ta << " trans_b " << tb);
      const auto a2 = ta ? dt::shape{5, 3} : dt::shape{3, 5};
      const auto b2 = tb ? dt::shape{7, 5} : dt::shape{5, 7};
      auto mm = [ta, tb](const vars& v) { return dt::matmul(v[0], v[1], ta, tb); };
      CHECK_GRADIENTS(mm, {randn(a2, 1), randn(b2, 2)});
      const auto a3 = ta ? dt::shape{2, 5, 3} : dt::shape{2, 3, 5};
      const auto b3 = tb ? dt::shape{2, 7, 5} : dt::shape{2, 5, 7};
      CHECK_GRADIENTS(mm, {randn(a3, 3), randn(b3, 4)});  // batched x batched
      CHECK_GRADIENTS(mm, {randn(a3, 5), randn(b2, 6)});  // batched x shared matrix
      CHECK_GRADIENTS(mm, {randn(a2, 7), randn(b3, 8)});  // shared matrix x batched
    }
  }
}

TEST_CASE("gradcheck: linear", "[autograd][gradcheck]") {
  CHECK_GRADIENTS([](const vars& v) { return dt::linear(v[0], v[1], v[2]); },
                  {randn({2, 3, 5}, 1), randn({5, 7}, 2), randn({7}, 3)});
  CHECK_GRADIENTS([](const vars& v) { return dt::linear(v[0], v[1]); },
                  {randn({4, 3}, 4), randn({3, 1}, 5)});
}

TEST_CASE("gradcheck: linear_gelu (fused linear + GELU)", "[autograd][gradcheck]") {
  CHECK_GRADIENTS([](const vars& v) { return dt::linear_gelu(v[0], v[1], v[2]); },
                  {randn({2, 3, 5}, 11), randn({5, 8}, 12), randn({8}, 13)});
  CHECK_GRADIENTS([](const vars& v) { return dt::linear_gelu(v[0], v[1]); },
                  {randn({4, 3}, 14), randn({3, 7}, 15)});
}

TEST_CASE("linear_gelu equals gelu(linear) bit for bit on the CPU, values and gradients", "[autograd]") {
  dt::rng gen(21, "linear-gelu");
  const auto x0 = dt::randn(dt::shape{3, 5, 16}, gen), w0 = dt::randn(dt::shape{16, 24}, gen),
             b0 = dt::randn(dt::shape{24}, gen), g0 = dt::randn(dt::shape{3, 5, 24}, gen);
  for (const bool with_bias : {true, false}) {
    INFO("bias: " << with_bias);
    auto x1 = dt::parameter(x0.clone()), w1 = dt::parameter(w0.clone()), b1 = dt::parameter(b0.clone());
    auto x2 = dt::parameter(x0.clone()), w2 = dt::parameter(w0.clone()), b2 = dt::parameter(b0.clone());
    auto fused = with_bias ? dt::linear_gelu(x1, w1, b1) : dt::linear_gelu(x1, w1);
    auto split = dt::gelu(with_bias ? dt::linear(x2, w2, b2) : dt::linear(x2, w2));
    CHECK(fused.value().to_vector<float>() == split.value().to_vector<float>());
    fused.backward(g0);
    split.backward(g0);
    CHECK(x1.grad().to_vector<float>() == x2.grad().to_vector<float>());
    CHECK(w1.grad().to_vector<float>() == w2.grad().to_vector<float>());
    if (with_bias) CHECK(b1.grad().to_vector<float>() == b2.grad().to_vector<float>());
  }
}

TEST_CASE("gradcheck: linear_gelu_linear (the MLP as one op)", "[autograd][gradcheck]") {
  CHECK_GRADIENTS([](const vars& v) { return dt::linear_gelu_linear(v[0], v[1], v[2], v[3], v[4]); },
                  {randn({2, 3, 5}, 41), randn({5, 8}, 42), randn({8}, 43), randn({8, 6}, 44), randn({6}, 45)});
  CHECK_GRADIENTS([](const vars& v) { return dt::linear_gelu_linear(v[0], v[1], v[2]); },
                  {randn({4, 3}, 46), randn({3, 7}, 47), randn({7, 1}, 48)});
}

// The two ops and the fused one on the same values; `dt_` is the dtype of every input.
namespace {
struct mlp_run {
  std::vector<float> out;
  std::vector<std::vector<float>> grads;  // x, w1, (b1,) w2, (b2)
};
mlp_run run_mlp(bool fused, bool with_bias, dt::dtype type, const std::vector<dt::tensor<>>& init, const dt::tensor<>& g) {
  vars p;
  for (const auto& t : init) p.push_back(dt::parameter(t.to(type)));
  dt::var<> out;
  if (fused)
    out = with_bias ? dt::linear_gelu_linear(p[0], p[1], p[2], p[3], p[4]) : dt::linear_gelu_linear(p[0], p[1], p[3]);
  else
    out = with_bias ? dt::linear(dt::linear_gelu(p[0], p[1], p[2]), p[3], p[4]) : dt::linear(dt::linear_gelu(p[0], p[1]), p[3]);
  out.backward(g.to(type));
  mlp_run r{out.value().to_vector<float>(), {}};
  for (std::size_t i = 0; i < p.size(); ++i)
    if (with_bias || (i != 2 && i != 4)) r.grads.push_back(p[i].grad().to_vector<float>());
  return r;
}
}  // namespace

TEST_CASE("linear_gelu_linear equals linear(linear_gelu) on the CPU: bit for bit in f32 and f64, close in bf16", "[autograd]") {
  dt::rng gen(23, "linear-gelu-linear");
  const std::vector<dt::tensor<>> init{dt::randn(dt::shape{3, 5, 16}, gen), dt::randn(dt::shape{16, 40}, gen),
                                       dt::randn(dt::shape{40}, gen), dt::randn(dt::shape{40, 12}, gen),
                                       dt::randn(dt::shape{12}, gen)};
  const auto g = dt::randn(dt::shape{3, 5, 12}, gen);
  for (const bool with_bias : {true, false}) {
    for (const auto type : {dt::dtype::f32, dt::dtype::f64}) {
      INFO("bias: " << with_bias << ", dtype " << dt::dtype_name(type));
      const auto fused = run_mlp(true, with_bias, type, init, g), split = run_mlp(false, with_bias, type, init, g);
      CHECK(fused.out == split.out);
      REQUIRE(fused.grads.size() == split.grads.size());
      for (std::size_t i = 0; i < fused.grads.size(); ++i) {
        INFO("gradient " << i);
        CHECK(fused.grads[i] == split.grads[i]);
      }
    }
    // bf16: the two ops round the GELU output's gradient to bf16 before multiplying by gelu';
    // the fused op does not, so the gradients agree to bf16 precision only.
    INFO("bias: " << with_bias << ", bf16");
    const auto fused = run_mlp(true, with_bias, dt::dtype::bf16, init, g), split = run_mlp(false, with_bias, dt::dtype::bf16, init, g);
    CHECK(fused.out == split.out);
    for (std::size_t i = 0; i < fused.grads.size(); ++i) {
      INFO("gradient " << i);
      const auto& a = fused.grads[i];
      const auto& b = split.grads[i];
      double diff = 0, norm = 0;
      for (std::size_t j = 0; j < a.size(); ++j) {
        diff += (a[j] - b[j]) * static_cast<double>(a[j] - b[j]);
        norm += b[j] * static_cast<double>(b[j]);
      }
      CHECK(std::sqrt(diff) <= 2e-2 * std::sqrt(norm));
      // The first layer's gradients (x, w1, b1) do see the difference: the fused path really ran.
      if (i < (with_bias ? 3u : 2u)) CHECK(diff > 0.0);
    }
  }
}

TEST_CASE("gradcheck: add_layer_norm (fused residual add + layer_norm), both outputs", "[autograd][gradcheck]") {
  // The sum feeds a later op too, as the residual stream does: both outputs carry gradient.
  CHECK_GRADIENTS([](const vars& v) {
    auto [sum, normed] = dt::add_layer_norm(v[0], v[1], v[2], v[3]);
    return normed * sum;
  }, {randn({2, 3, 6}, 31), randn({2, 3, 6}, 32), randn({6}, 33), randn({6}, 34)});
}

TEST_CASE("add_layer_norm equals layer_norm(x + branch) bit for bit on the CPU, values and gradients", "[autograd]") {
  dt::rng gen(22, "add-layer-norm");
  const auto x0 = dt::randn(dt::shape{3, 5, 40}, gen), r0 = dt::randn(dt::shape{3, 5, 40}, gen),
             w0 = dt::randn(dt::shape{40}, gen), b0 = dt::randn(dt::shape{40}, gen),
             g0 = dt::randn(dt::shape{3, 5, 40}, gen);
  auto x1 = dt::parameter(x0.clone()), r1 = dt::parameter(r0.clone());
  auto w1 = dt::parameter(w0.clone()), b1 = dt::parameter(b0.clone());
  auto x2 = dt::parameter(x0.clone()), r2 = dt::parameter(r0.clone());
  auto w2 = dt::parameter(w0.clone()), b2 = dt::parameter(b0.clone());
  auto [sum1, normed1] = dt::add_layer_norm(x1, r1, w1, b1);
  auto sum2 = x2 + r2;
  auto normed2 = dt::layer_norm(sum2, w2, b2);
  CHECK(sum1.value().to_vector<float>() == sum2.value().to_vector<float>());
  CHECK(normed1.value().to_vector<float>() == normed2.value().to_vector<float>());
  auto out1 = normed1 * sum1, out2 = normed2 * sum2;
  out1.backward(g0);
  out2.backward(g0);
  for (auto [a, b] : {std::pair{x1, x2}, std::pair{r1, r2}, std::pair{w1, w2}, std::pair{b1, b2}}) {
    CHECK(a.grad().to_vector<float>() == b.grad().to_vector<float>());
  }
}

TEST_CASE("layer norms with a bf16 branch and a bf16 output equal the ops with casts around them", "[autograd]") {
  // Mixed precision's residual step: an f32 stream, a bf16 branch, bf16 activations out. The
  // fused op must give what casting the branch up and the result down would, bit for bit,
  // values and gradients (the stream's gradient is taken in place by the layer norm when the
  // next op has already given it one: `* sum` below).
  dt::rng gen(23, "mixed-layer-norm");
  const auto x0 = dt::randn(dt::shape{3, 5, 40}, gen), r0 = dt::randn(dt::shape{3, 5, 40}, gen).to(dt::dtype::bf16),
             w0 = dt::randn(dt::shape{40}, gen), b0 = dt::randn(dt::shape{40}, gen),
             g0 = dt::randn(dt::shape{3, 5, 40}, gen);
  auto x1 = dt::parameter(x0.clone()), r1 = dt::parameter(r0.clone());
  auto w1 = dt::parameter(w0.clone()), b1 = dt::parameter(b0.clone());
  auto x2 = dt::parameter(x0.clone()), r2 = dt::parameter(r0.clone());
  auto w2 = dt::parameter(w0.clone()), b2 = dt::parameter(b0.clone());
  auto [sum1, normed1] = dt::add_layer_norm(x1, r1, w1, b1, 1e-5, dt::dtype::bf16);
  auto sum2 = x2 + dt::cast(r2, dt::dtype::f32);
  auto normed2 = dt::cast(dt::layer_norm(sum2, w2, b2), dt::dtype::bf16);
  REQUIRE(sum1.dtype() == dt::dtype::f32);
  REQUIRE(normed1.dtype() == dt::dtype::bf16);
  CHECK(sum1.value().to_vector<float>() == sum2.value().to_vector<float>());
  CHECK(normed1.value().to_vector<float>() == normed2.value().to_vector<float>());
  auto out1 = dt::cast(normed1, dt::dtype::f32) * sum1, out2 = dt::cast(normed2, dt::dtype::f32) * sum2;
  out1.backward(g0);
  out2.backward(g0);
  REQUIRE(r1.grad().dtype() == dt::dtype::bf16);
  for (auto [a, b] : {std::pair{x1, x2}, std::pair{r1, r2}, std::pair{w1, w2}, std::pair{b1, b2}}) {
    CHECK(a.grad().to_vector<float>() == b.grad().to_vector<float>());
  }
  // The plain layer norm with a bf16 output, and a second backward adding to kept gradients.
  auto y1 = dt::layer_norm(x1, w1, b1, 1e-5, dt::dtype::bf16);
  auto y2 = dt::cast(dt::layer_norm(x2, w2, b2), dt::dtype::bf16);
  CHECK(y1.value().to_vector<float>() == y2.value().to_vector<float>());
  const auto gb = g0.to(dt::dtype::bf16);
  y1.backward(gb);
  y2.backward(gb);
  for (auto [a, b] : {std::pair{x1, x2}, std::pair{w1, w2}, std::pair{b1, b2}}) {
    CHECK(a.grad().to_vector<float>() == b.grad().to_vector<float>());
  }
}

TEST_CASE("add_layer_norm rejects mismatched shapes and dtypes by name", "[autograd]") {
  auto x = dt::var<dt::cpu>(dt::zeros(dt::shape{2, 4}));
  auto w = dt::var<dt::cpu>(dt::ones(dt::shape{4})), b = dt::var<dt::cpu>(dt::zeros(dt::shape{4}));
  CHECK_THROWS_WITH(dt::add_layer_norm(x, dt::var<dt::cpu>(dt::zeros(dt::shape{2, 3})), w, b),
                    Catch::Contains("add_layer_norm") && Catch::Contains("branch"));
  CHECK_THROWS_WITH(dt::add_layer_norm(x, dt::var<dt::cpu>(dt::zeros(dt::shape{2, 4}, dt::dtype::i32)), w, b),
                    Catch::Contains("add_layer_norm: the branch must be floating-point, got i32"));
  CHECK_THROWS_WITH(dt::add_layer_norm(x, x, w, b, 1e-5, dt::dtype::i32),
                    Catch::Contains("add_layer_norm: output dtype must be floating-point, got i32"));
  CHECK_THROWS_WITH(dt::layer_norm(x, w, b, 1e-5, dt::dtype::i32),
                    Catch::Contains("layer_norm: output dtype must be floating-point, got i32"));
  CHECK_THROWS_WITH(dt::add_layer_norm(x, x, dt::var<dt::cpu>(dt::ones(dt::shape{3})), b),
                    Catch::Contains("add_layer_norm") && Catch::Contains("weight"));
}

TEST_CASE("gradcheck: sum and mean over axes", "[autograd][gradcheck]") {
  const std::vector<std::vector<std::int64_t>> axes_cases = {{}, {0}, {1}, {-1}, {0, 2}, {1, 2}};
  for (const auto& axes : axes_cases) {
    for (bool keep : {false, true}) {
      INFO("axes " << axes.size() << " keepdim " << keep);
      CHECK_GRADIENTS([&](const vars& v) { return dt::sum(v[0], axes, keep); }, {randn({2, 3, 5}, 1)});
      CHECK_GRADIENTS([&](const vars& v) { return dt::mean(v[0], axes, keep); }, {randn({3, 1, 4}, 2)});
    }
  }
}

TEST_CASE("gradcheck: reshape, transpose, slice, split, concat", "[autograd][gradcheck]") {
  CHECK_GRADIENTS([](const vars& v) { return dt::reshape(v[0], {5, -1}); }, {randn({3, 5}, 1)});
  // A transpose feeding a product exercises non-contiguous inputs to kernels.
  CHECK_GRADIENTS([](const vars& v) { return dt::transpose(v[0], 0, 2) * v[1]; },
                  {randn({2, 3, 5}, 2), randn({5, 3, 2}, 3)});
  CHECK_GRADIENTS([](const vars& v) { return dt::slice(v[0], 1, 1, 4); }, {randn({3, 5}, 4)});
  CHECK_GRADIENTS([](const vars& v) {
    auto parts = dt::split(v[0], {2, 1, 2}, -1);
    return parts[0] * parts[2] + parts[1];
  }, {randn({3, 5}, 5)});
  CHECK_GRADIENTS([](const vars& v) { return dt::concat({v[0], v[1], v[0]}, 1); },
                  {randn({2, 3, 2}, 6), randn({2, 1, 2}, 7)});
}

TEST_CASE("gradcheck: embedding with repeated ids", "[autograd][gradcheck]") {
  const auto ids = dt::from_vector(std::vector<std::int32_t>{3, 0, 3, 6, 1, 3}, {2, 3});
  CHECK_GRADIENTS([&](const vars& v) { return dt::embedding(ids, v[0]); }, {randn({7, 5}, 1)});
}

TEST_CASE("gradcheck: layer_norm", "[autograd][gradcheck]") {
  for (const auto& s : {dt::shape{3, 7}, dt::shape{2, 3, 5}, dt::shape{1, 1}}) {
    INFO("shape " << s);
    const std::int64_t c = s.back();  // c == 1 normalises to 0: all gradients but the bias's vanish
    CHECK_GRADIENTS([](const vars& v) { return dt::layer_norm(v[0], v[1], v[2]); },
                    {randn(s, 1), randn({c}, 2), randn({c}, 3)});
  }
}

TEST_CASE("gradcheck: gelu, softmax, log_softmax", "[autograd][gradcheck]") {
  for (const auto& s : {dt::shape{3, 7}, dt::shape{2, 3, 5}, dt::shape{1}}) {
    INFO("shape " << s);
    CHECK_GRADIENTS([](const vars& v) { return dt::gelu(v[0]); }, {randn(s, 1)});
    CHECK_GRADIENTS([](const vars& v) { return dt::softmax(v[0]); }, {randn(s, 2)});
    CHECK_GRADIENTS([](const vars& v) { return dt::log_softmax(v[0]); }, {randn(s, 3)});
  }
}

TEST_CASE("gradcheck: causal attention", "[autograd][gradcheck]") {
  struct attention_case { dt::shape s; std::int64_t heads; };
  for (const auto& [s, heads] : {attention_case{{2, 5, 6}, 2}, attention_case{{1, 7, 9}, 3},
                                 attention_case{{1, 1, 4}, 1}, attention_case{{2, 3, 4}, 4}}) {
    INFO("shape " << s << " heads " << heads);
    const auto h = heads;
    CHECK_GRADIENTS([h](const vars& v) { return dt::causal_attention(v[0], v[1], v[2], h); },
                    {randn(s, 1), randn(s, 2), randn(s, 3)});
    // The fused overload: q, k, v are the column blocks of one (B, T, 3C) input.
    const dt::shape fused{s[0], s[1], 3 * s[2]};
    CHECK_GRADIENTS([h](const vars& v) { return dt::causal_attention(v[0], h); }, {randn(fused, 4)});
  }
}

TEST_CASE("gradcheck: cross_entropy with ignore_index", "[autograd][gradcheck]") {
  const auto targets = dt::from_vector(std::vector<std::int32_t>{2, -1, 6, 0, 6}, {5});
  CHECK_GRADIENTS([&](const vars& v) { return dt::cross_entropy(v[0], targets); }, {randn({5, 7}, 1)});
  const auto targets3 = dt::from_vector(std::vector<std::int32_t>{1, 4, 0, 4, 99, 2}, {2, 3});
  CHECK_GRADIENTS([&](const vars& v) { return dt::cross_entropy(v[0], targets3, 99); },
                  {randn({2, 3, 5}, 2)});
}

TEST_CASE("gradcheck: linear_cross_entropy, in chunks and whole, with ignore_index", "[autograd][gradcheck]") {
  const auto targets = dt::from_vector(std::vector<std::int32_t>{2, -1, 6, 0, 6}, {5});
  for (const std::int64_t chunk : {0, 1, 2, 5}) {
    INFO("chunk_rows " << chunk);
    CHECK_GRADIENTS([&](const vars& v) { return dt::linear_cross_entropy(v[0], v[1], targets, -1, chunk); },
                    {randn({5, 4}, 1), randn({7, 4}, 2)});
  }
  const auto targets3 = dt::from_vector(std::vector<std::int32_t>{1, 4, 0, 4, 99, 2}, {2, 3});
  CHECK_GRADIENTS([&](const vars& v) { return dt::linear_cross_entropy(v[0], v[1], targets3, 99, 4); },
                  {randn({2, 3, 3}, 3), randn({5, 3}, 4)});
  // The loss scaled afterwards: the backward scales the gradients the forward computed.
  CHECK_GRADIENTS([&](const vars& v) { return dt::linear_cross_entropy(v[0], v[1], targets, -1, 2) * 3.0; },
                  {randn({5, 4}, 5), randn({7, 4}, 6)});
}

TEST_CASE("linear_cross_entropy equals cross_entropy(matmul(x, w^T)): values and gradients", "[autograd]") {
  dt::rng gen(31, "linear-ce");
  const auto targets = dt::from_vector(std::vector<std::int32_t>{3, -1, 10, 0, 7, 7, 1}, {7});
  for (const auto type : {dt::dtype::f64, dt::dtype::f32, dt::dtype::bf16}) {
    const auto x0 = dt::randn(dt::shape{7, 6}, gen).to(type), w0 = dt::randn(dt::shape{11, 6}, gen).to(type);
    for (const std::int64_t chunk : {0, 3}) {
      INFO(dt::dtype_name(type) << ", chunk_rows " << chunk);
      auto x1 = dt::parameter(x0.clone()), w1 = dt::parameter(w0.clone());
      auto x2 = dt::parameter(x0.clone()), w2 = dt::parameter(w0.clone());
      auto fused = dt::linear_cross_entropy(x1, w1, targets, -1, chunk);
      auto split = dt::cross_entropy(dt::matmul(x2, w2, false, true), targets, -1);
      CHECK(fused.dtype() == split.dtype());
      CHECK(fused.item() == Approx(split.item()).epsilon(type == dt::dtype::f64 ? 1e-12 : 1e-6));
      fused.backward();
      split.backward();
      CHECK(x1.grad().dtype() == type);
      CHECK(w1.grad().dtype() == type);
      if (chunk == 0) {  // one chunk: the same products as the two ops, bit for bit
        CHECK(x1.grad().to_vector<double>() == x2.grad().to_vector<double>());
        CHECK(w1.grad().to_vector<double>() == w2.grad().to_vector<double>());
      } else {  // the weight's gradient sums the chunks one after another
        const double tol = type == dt::dtype::bf16 ? 1e-2 : type == dt::dtype::f32 ? 1e-6 : 1e-14;
        CHECK(dt::compare(x1.grad(), x2.grad(), tol, tol).close);
        CHECK(dt::compare(w1.grad(), w2.grad(), tol, tol).close);
      }
    }
  }
}

TEST_CASE("linear_cross_entropy under no_grad computes the loss alone", "[autograd]") {
  dt::rng gen(32, "linear-ce-eval");
  auto x = dt::parameter(dt::randn(dt::shape{4, 3}, gen)), w = dt::parameter(dt::randn(dt::shape{5, 3}, gen));
  const auto targets = dt::from_vector(std::vector<std::int32_t>{0, 4, 2, 1}, {4});
  const double with_grad = dt::linear_cross_entropy(x, w, targets).item();
  dt::no_grad guard;
  auto loss = dt::linear_cross_entropy(x, w, targets);
  CHECK_FALSE(loss.requires_grad());
  CHECK(loss.item() == with_grad);
}

TEST_CASE("gradcheck: dropout with a fixed mask", "[autograd][gradcheck]") {
  // A fresh stream per call gives every evaluation the same mask, as finite differences need.
  CHECK_GRADIENTS([](const vars& v) {
    dt::rng gen(5, "dropout");
    return dt::dropout(v[0], 0.3, gen);
  }, {randn({4, 9}, 1)});
}

TEST_CASE("gradcheck: a composite transformer-like expression", "[autograd][gradcheck]") {
  // Shared inputs (x feeds two branches) check that gradients from several paths add up.
  CHECK_GRADIENTS([](const vars& v) {
    auto h = dt::layer_norm(v[0], v[2], v[3]);
    auto qkv = dt::split(dt::linear(h, v[1]), {4, 4, 4}, -1);
    auto a = dt::causal_attention(qkv[0], qkv[1], qkv[2], 2);
    return v[0] + dt::gelu(a);
  }, {randn({2, 3, 4}, 1), randn({4, 12}, 2), randn({4}, 3), randn({4}, 4)});
}

TEST_CASE("gradcheck: cast to f32 and bf16 and back", "[autograd][gradcheck]") {
  // The forward rounds to the narrower type, so central differences use a wide step and a
  // tolerance above the rounding (f32: ~1e-7 relative, bf16: ~4e-3 relative, over a step of 0.5).
  const gradcheck_options f32_opt{1e-2, 1e-4, 1e-6};
  CHECK_GRADIENTS([](const vars& v) { return dt::cast(dt::mul(dt::cast(v[0], dt::dtype::f32), dt::cast(v[1], dt::dtype::f32)), dt::dtype::f64); },
                  {randn({3, 4}, 1), randn({3, 4}, 2)}, f32_opt);
  const gradcheck_options bf16_opt{0.5, 3e-2, 1e-2};
  CHECK_GRADIENTS([](const vars& v) { return dt::cast(dt::cast(v[0], dt::dtype::bf16), dt::dtype::f64); },
                  {randn({5}, 3)}, bf16_opt);
}
