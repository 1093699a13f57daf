// The autograd engine itself: accumulation, no_grad, zero_grad, graph release, shared inputs,
// bf16 storage and the parameter registry.
#include <decentrain/decentrain.hpp>

#include <catch2/catch.hpp>

namespace dt = decentrain;
using Catch::Matchers::Contains;

namespace {
dt::tensor<> values(std::vector<double> v, dt::shape s) { return dt::from_vector(v, s, dt::dtype::f64); }
}

TEST_CASE("gradients accumulate across backward calls until zeroed", "[autograd]") {
  auto x = dt::parameter(values({1, 2, 3}, {3}));
  dt::sum(x * 2.0).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2, 2, 2});
  dt::sum(x * x).backward();  // += 2x
  CHECK(x.grad().to_vector<double>() == std::vector<double>{4, 6, 8});
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
  dt::sum(x).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 1, 1});
}

TEST_CASE("a var used twice receives the sum of both paths", "[autograd]") {
  auto x = dt::parameter(values({3}, {1}));
  auto y = x * x * x + x;  // dy/dx = 3x^2 + 1 = 28
  y.backward();
  CHECK(x.grad().item() == Approx(28.0));
}

TEST_CASE("no_grad records nothing and restores the previous mode", "[autograd]") {
  auto x = dt::parameter(values({1, 2}, {2}));
  {
    dt::no_grad guard;
    CHECK_FALSE(dt::grad_enabled());
    auto y = dt::sum(x * 3.0);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.is_leaf());
    CHECK_THROWS_WITH(y.backward(), Contains("does not require gradients"));
  }
  CHECK(dt::grad_enabled());
  CHECK(dt::sum(x).requires_grad());
}

TEST_CASE("inputs without requires_grad get no gradient", "[autograd]") {
  auto x = dt::parameter(values({1, 2}, {2}));
  dt::var<> c(values({5, 7}, {2}));
  dt::sum(x * c).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{5, 7});
  CHECK_FALSE(c.grad().defined());
}

TEST_CASE("the graph is released by backward and a second pass is an error", "[autograd]") {
  auto x = dt::parameter(values({1, 2}, {2}));
  auto y = dt::sum(dt::gelu(x));
  y.backward();
  CHECK_THROWS_WITH(y.backward(), Contains("a second time"));
}

TEST_CASE("backward frees each activation once its readers are done, unless the caller holds it", "[autograd]") {
  // y_{i+1} = y_i * w_i over 1 MiB tensors: the forward keeps n activations; the backward makes
  // one persistent gradient per w_i. Freed as the pass goes, activations make room for those
  // gradients, so the pass needs far less than the n more blocks it would if they stayed.
  using mem = dt::memory<dt::cpu>;
  constexpr int n = 16;
  constexpr std::size_t block = std::size_t{1} << 20;
  dt::rng gen(3, "engine-memory");
  std::vector<dt::var<>> w;
  for (int i = 0; i < n; ++i) w.push_back(dt::parameter(dt::randn(dt::shape{1 << 17}, gen, dt::dtype::f64)));
  auto x = dt::var<>(dt::randn(dt::shape{1 << 17}, gen, dt::dtype::f64));
  dt::var<> y = x, kept;
  for (int i = 0; i < n; ++i) {
    y = y * w[i];
    if (i == n / 2) kept = y;  // held by the caller: must survive the pass
  }
  auto loss = dt::sum(y);
  const auto kept_values = kept.value().to_vector<double>();
  const auto start = mem::allocated_bytes();
  mem::reset_peak();
  loss.backward();
  // About 6 blocks: the output gradient, one gradient of y and of w in flight, the two
  // activations the caller holds (y and kept). Kept all, it would be n more.
  CHECK(mem::peak_allocated_bytes() < start + 8 * block);
  CHECK(kept.value().to_vector<double>() == kept_values);
  for (const auto& p : w) CHECK(p.grad().defined());
}

TEST_CASE("deferred weight gradients: the input gradient at once, the weights' when run, the same bits", "[autograd]") {
  dt::rng gen(3, "defer");
  const auto x0 = dt::randn<dt::cpu>(dt::shape{2, 3, 8}, gen);
  const auto w1 = dt::randn<dt::cpu>(dt::shape{8, 16}, gen), b1 = dt::randn<dt::cpu>(dt::shape{16}, gen);
  const auto w2 = dt::randn<dt::cpu>(dt::shape{16, 8}, gen), b2 = dt::randn<dt::cpu>(dt::shape{8}, gen);
  const auto w3 = dt::randn<dt::cpu>(dt::shape{8, 4}, gen);
  struct grads {
    std::vector<float> x, w1, b1, w2, b2, w3;
  };
  // A linear layer, the fused MLP and a linear without bias, twice through the last one.
  const auto pass = [&](dt::weight_gradients* later, bool check_owed) {
    dt::var<dt::cpu> x(x0.clone(), true);
    auto pw1 = dt::parameter(w1.clone()), pb1 = dt::parameter(b1.clone()), pw2 = dt::parameter(w2.clone()),
         pb2 = dt::parameter(b2.clone()), pw3 = dt::parameter(w3.clone());
    const auto h = dt::linear_gelu_linear(x, pw1, pb1, pw2, pb2);
    auto y = dt::sum(dt::linear(h, pw3) * dt::linear(h + x, pw3));
    if (later) {
      dt::defer_weight_gradients scope(*later);
      y.backward();
    } else {
      y.backward();
    }
    if (check_owed) {
      CHECK(x.grad().defined());  // the input gradient is there at once
      CHECK_FALSE(pw1.grad().defined());
      CHECK_FALSE(pb2.grad().defined());
      CHECK_FALSE(pw3.grad().defined());
      CHECK(later->size() == 4);  // one item a linear layer: the MLP's two, and the two uses of w3
      later->run();
      CHECK(later->empty());
    }
    const auto v = [](const dt::var<dt::cpu>& p) { return p.grad().to_vector<float>(); };
    return grads{v(x), v(pw1), v(pb1), v(pw2), v(pb2), v(pw3)};
  };
  const auto now = pass(nullptr, false);
  dt::weight_gradients later;
  const auto deferred = pass(&later, true);
  CHECK(deferred.x == now.x);
  CHECK(deferred.w1 == now.w1);
  CHECK(deferred.b1 == now.b1);
  CHECK(deferred.w2 == now.w2);
  CHECK(deferred.b2 == now.b2);
  CHECK(deferred.w3 == now.w3);
  // The scope ends with its block: a backward after it computes the weights' gradients at once.
  auto w = dt::parameter(w3.clone());
  dt::sum(dt::linear(dt::var<dt::cpu>(x0.clone()), w)).backward();
  CHECK(w.grad().defined());
  CHECK(later.empty());
}

TEST_CASE("backward needs a scalar or an explicit gradient of the output's shape", "[autograd]") {
  auto x = dt::parameter(values({1, 2}, {2}));
  auto y = x * 2.0;
  CHECK_THROWS_WITH(y.backward(), Contains("needs a scalar output"));
  CHECK_THROWS_WITH(y.backward(values({1, 1, 1}, {3})), Contains("does not match output shape (2,)"));
  y.backward(values({1, -1}, {2}));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2, -2});
}

TEST_CASE("a deep chain back-propagates without recursion limits", "[autograd]") {
  auto x = dt::parameter(values({1}, {1}));
  dt::var<> y = x;
  for (int i = 0; i < 20000; ++i) y = y + 1.0;
  y.backward();
  CHECK(x.grad().item() == 1.0);
}

TEST_CASE("bf16 tensors compute in f32 and store bf16", "[autograd][bf16]") {
  dt::rng gen(3, "bf16");
  const auto a32 = dt::randn(dt::shape{4, 8}, gen), b32 = dt::randn(dt::shape{8, 3}, gen);
  auto a = dt::parameter(a32.to(dt::dtype::bf16)), b = dt::parameter(b32.to(dt::dtype::bf16));
  auto y = dt::matmul(a, b);
  CHECK(y.dtype() == dt::dtype::bf16);
  // Against f32 math on the bf16-rounded inputs: only the output rounding differs (2^-8 rel).
  const auto ref = dt::math::matmul(a.value().to(dt::dtype::f32), b.value().to(dt::dtype::f32));
  const auto cmp = dt::compare(y.value().to(dt::dtype::f32), ref, 1.0 / 128, 1e-2);
  INFO(cmp.message);
  CHECK(cmp.close);
  dt::sum(y).backward();
  CHECK(a.grad().dtype() == dt::dtype::bf16);
  CHECK(a.grad().shape() == a.shape());
}

TEST_CASE("cross-entropy of bf16 logits is an f32 loss with the f32 gradient, rounded once", "[autograd][bf16]") {
  dt::rng gen(4, "bf16-ce");
  const auto logits32 = dt::randn(dt::shape{6, 50}, gen, dt::dtype::f32, 0.0, 3.0).to(dt::dtype::bf16).to(dt::dtype::f32);
  const auto targets = dt::from_vector(std::vector<std::int32_t>{3, 0, 49, 7, -1, 22}, dt::shape{6});
  auto low = dt::parameter(logits32.to(dt::dtype::bf16));
  auto wide = dt::parameter(logits32.clone());
  auto loss_low = dt::cross_entropy(low, targets), loss_wide = dt::cross_entropy(wide, targets);
  // A bf16 loss would keep 3 significant digits; the loss stays in the compute dtype (as autocast).
  CHECK(loss_low.dtype() == dt::dtype::f32);
  CHECK(loss_low.item() == loss_wide.item());
  loss_low.backward();
  loss_wide.backward();
  REQUIRE(low.grad().dtype() == dt::dtype::bf16);
  CHECK(low.grad().to_vector<double>() == wide.grad().to(dt::dtype::bf16).to_vector<double>());
}

TEST_CASE("parameter_list registers named parameters in order", "[autograd]") {
  dt::parameter_list<> block;
  block.add("weight", dt::parameter(dt::ones(dt::shape{2, 3})));
  block.add("bias", dt::parameter(dt::zeros(dt::shape{3})));
  dt::parameter_list<> model;
  model.add_all("h.0", block);
  model.add("ln_f.weight", dt::parameter(dt::ones(dt::shape{3})));
  CHECK(model.size() == 3);
  CHECK(model.numel() == 12);
  CHECK(model.contains("h.0.bias"));
  CHECK(model.begin()->name == "h.0.weight");
  CHECK_THROWS_WITH(model.add("ln_f.weight", dt::parameter(dt::ones(dt::shape{1}))),
                    Contains("duplicate parameter name 'ln_f.weight'"));
  CHECK_THROWS_WITH(model.get("nope"), Contains("no parameter named 'nope'"));
  CHECK_THROWS_WITH(model.add("x", dt::var<>(dt::ones(dt::shape{1}))), Contains("requires_grad"));
  auto w = model.get("h.0.weight");
  dt::sum(w).backward();
  CHECK(w.grad().defined());
  model.zero_grad();
  CHECK_FALSE(w.grad().defined());
}

TEST_CASE("dropout keeps 1 - p of the elements, scaled by 1 / (1 - p), reproducibly", "[autograd][dropout]") {
  const auto x = dt::var<>(dt::ones(dt::shape{100000}, dt::dtype::f64));
  dt::rng a(5, "dropout"), b(5, "dropout");
  const auto y = dt::dropout(x, 0.25, a).value().to_vector<double>();
  CHECK(dt::dropout(x, 0.25, b).value().to_vector<double>() == y);
  std::size_t kept = 0, wrong_scale = 0;
  for (double v : y) {
    if (v != 0.0) {
      ++kept;
      wrong_scale += std::abs(v - 1.0 / 0.75) > 1e-12;
    }
  }
  CHECK(wrong_scale == 0);
  CHECK(static_cast<double>(kept) / y.size() == Approx(0.75).margin(0.005));  // ~3.7 standard deviations
  // Each call takes one number from the rng as its key, and value i is kept when its draw under
  // the key (detail::unit_draw_in, the draw the GPU kernel makes too) is at least p.
  const auto key = dt::rng(5, "dropout").next_u64();
  std::size_t not_the_keys = 0;
  for (std::size_t i = 0; i < y.size(); ++i)
    not_the_keys += (y[i] != 0.0) != (dt::detail::unit_draw_in(dt::detail::draw_word(key, 0), static_cast<std::uint32_t>(i)) >= 0.25f);
  CHECK(not_the_keys == 0);
  CHECK(dt::dropout(x, 0.25, a).value().to_vector<double>() != y);  // the next call, the next key
  dt::rng c(5, "dropout");
  CHECK(dt::dropout(x, 0.25, c, /*training=*/false).value().to_vector<double>() == x.value().to_vector<double>());
  CHECK(dt::dropout(x, 1.0, c).value().to_vector<double>() == std::vector<double>(100000, 0.0));
}
