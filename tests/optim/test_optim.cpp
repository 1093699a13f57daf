// Optimizers against PyTorch trajectories (fixtures from tests/reference/make_fixtures.py, f32,
// tolerance 1e-6 + 1e-5 relative), the schedule's shape, state round trips and bad options.
#include "support/fixture.hpp"

#include <decentrain/optim/optim.hpp>

#include <catch2/catch.hpp>

namespace optim = decentrain::optim;
using Catch::Matchers::Contains;

namespace {
const fixture& fx() {
  static const fixture f(DECENTRAIN_FIXTURE_DIR "/optim.dtfx");
  return f;
}
const char* const names[] = {"w", "b", "gain"};

dt::parameter_list<> fresh_params() {
  dt::parameter_list<> params;
  for (const char* n : names) params.add(n, dt::parameter(fx()[std::string("init.") + n].clone()));
  return params;
}
void set_grads(dt::parameter_list<>& params, int step) {
  for (auto& e : params) e.param.grad() = fx()["grad" + std::to_string(step) + "." + e.name].clone();
}
void check_params(const dt::parameter_list<>& params, const std::string& prefix) {
  for (const auto& e : params) {
    INFO(prefix << e.name);
    const auto cmp = dt::compare(e.param.value(), fx()[prefix + e.name], 1e-5, 1e-6);
    INFO(cmp.message);
    CHECK(cmp.close);
  }
}
}  // namespace

TEST_CASE("AdamW follows torch.optim.AdamW, with decay only on matrices", "[optim][parity]") {
  auto params = fresh_params();
  optim::adamw<> opt(params, {1e-2, 0.9, 0.95, 1e-8, 0.1});
  CHECK(opt.decays("w"));
  CHECK_FALSE(opt.decays("b"));
  CHECK_FALSE(opt.decays("gain"));
  for (int s = 0; s < 6; ++s) {
    if (s == 3) opt.set_lr(5e-3);
    set_grads(params, s);
    opt.step();
    check_params(params, "adamw" + std::to_string(s) + ".");
  }
}

TEST_CASE("SGD with Nesterov momentum follows torch.optim.SGD", "[optim][parity]") {
  auto params = fresh_params();
  optim::sgd<> opt(params, {0.7, 0.9, 0.0, true, 0.0});
  for (int s = 0; s < 6; ++s) {
    set_grads(params, s);
    opt.step();
    check_params(params, "sgd" + std::to_string(s) + ".");
  }
}

TEST_CASE("clip_grad_norm follows torch.nn.utils.clip_grad_norm_", "[optim][parity]") {
  auto params = fresh_params();
  set_grads(params, 0);
  const double norm = optim::clip_grad_norm(params, 1.5);
  CHECK(norm == Approx(fx()["clip.norm"].item()).epsilon(1e-6));
  for (const auto& e : params) {
    INFO(e.name);
    CHECK(dt::allclose(e.param.grad(), fx()["clip." + e.name], 1e-5, 1e-7));
  }
  // Below the threshold nothing changes.
  set_grads(params, 1);
  const auto before = params.get("w").grad().clone();
  optim::clip_grad_norm(params, 1e6);
  CHECK(dt::allclose(params.get("w").grad(), before, 0.0, 0.0));
}

TEST_CASE("clip_grad_norm scales gradients in place, but never one the caller also holds", "[optim]") {
  dt::parameter_list<> params;
  dt::rng gen(8, "clip-memory");
  for (int i = 0; i < 8; ++i) {
    auto p = params.add("p" + std::to_string(i), dt::parameter(dt::zeros(dt::shape{1 << 18})));  // 1 MiB each
    p.grad() = dt::randn(dt::shape{1 << 18}, gen);
  }
  const auto held = params.get("p0").grad();  // a second handle: p0 must get a scaled copy
  const auto held_values = held.to_vector<float>();
  const void* own = params.get("p1").grad().raw_data();
  const auto start = dt::memory<dt::cpu>::allocated_bytes();
  dt::memory<dt::cpu>::reset_peak();
  const double norm = optim::clip_grad_norm(params, 1.0);
  REQUIRE(norm > 1.0);
  CHECK(dt::memory<dt::cpu>::peak_allocated_bytes() < start + (std::size_t{2} << 20));  // a copy of all would be 8 MiB
  CHECK(params.get("p1").grad().raw_data() == own);
  CHECK(held.to_vector<float>() == held_values);
  CHECK(params.get("p0").grad().raw_data() != held.raw_data());
  CHECK(params.get("p0").grad().to_vector<float>()[3] == Approx(held_values[3] / (norm + 1e-6)).epsilon(1e-6));
}

TEST_CASE("optimizer state round-trips: a restored optimizer continues identically", "[optim]") {
  auto a = fresh_params(), b = fresh_params();
  optim::adamw<> opt_a(a, {1e-2, 0.9, 0.95, 1e-8, 0.1});
  for (int s = 0; s < 3; ++s) {
    set_grads(a, s);
    opt_a.step();
  }
  for (auto& e : b) e.param.value().copy_from(a.get(e.name).value());
  optim::adamw<> opt_b(b, {1e-2, 0.9, 0.95, 1e-8, 0.1});
  opt_b.load_state(opt_a.state());
  for (int s = 3; s < 6; ++s) {
    set_grads(a, s);
    set_grads(b, s);
    opt_a.step();
    opt_b.step();
  }
  for (const auto& e : a) CHECK(dt::allclose(e.param.value(), b.get(e.name).value(), 0.0, 0.0));

  auto c = fresh_params();
  optim::sgd<> sgd_c(c, {0.7, 0.9, 0.0, true, 0.0});
  auto state = sgd_c.state();
  CHECK_FALSE(state[0].second.defined());
  state[1].first = "nope";
  CHECK_THROWS_WITH(sgd_c.load_state(state), Contains("is for 'nope' but parameter 1 is 'b'"));
  auto bad = opt_a.state();
  bad.pop_back();
  CHECK_THROWS_WITH(opt_b.load_state(bad), Contains("state has 2 entries but the optimizer has 3"));
}

TEST_CASE("parameters without gradients are skipped", "[optim]") {
  auto params = fresh_params();
  optim::adamw<> opt(params);
  params.get("w").grad() = fx()["grad0.w"].clone();
  const auto b_before = params.get("b").value().clone();
  opt.step();
  CHECK(dt::allclose(params.get("b").value(), b_before, 0.0, 0.0));
  CHECK_FALSE(dt::allclose(params.get("w").value(), fx()["init.w"], 0.0, 0.0));
}

TEST_CASE("cosine schedule: warmup, cosine decay, floor", "[optim][schedule]") {
  const optim::cosine_schedule lr{1e-3, 1e-4, 10, 110};
  CHECK(lr(0) == Approx(1e-3 / 11));
  CHECK(lr(9) == Approx(1e-3 * 10 / 11));
  CHECK(lr(10) == Approx(1e-3));
  CHECK(lr(60) == Approx(1e-4 + 0.5 * 9e-4));
  CHECK(lr(110) == Approx(1e-4));
  CHECK(lr(5000) == Approx(1e-4));
  for (std::int64_t s = 11; s < 110; ++s) CHECK(lr(s) <= lr(s - 1));
  CHECK_THROWS_WITH((optim::cosine_schedule{1e-3, 1e-4, 10, 10}.validate()), Contains("warmup_steps < decay_steps"));
}

TEST_CASE("bad optimizer options and parameters are refused", "[optim]") {
  auto params = fresh_params();
  CHECK_THROWS_WITH(optim::adamw<>(params, {-1.0}), Contains("lr must be >= 0, got -1"));
  CHECK_THROWS_WITH(optim::adamw<>(params, {1e-3, 1.0}), Contains("betas must be in [0, 1)"));
  CHECK_THROWS_WITH(optim::sgd<>(params, {0.1, 0.0, 0.0, true}), Contains("Nesterov momentum needs momentum > 0"));
  CHECK_THROWS_WITH(optim::clip_grad_norm(params, 0.0), Contains("max_norm must be > 0"));
  dt::parameter_list<> half;
  half.add("h", dt::parameter(dt::ones(dt::shape{2}, dt::dtype::bf16)));
  optim::adamw<> opt(half);
  half.get("h").grad() = dt::ones(dt::shape{2}, dt::dtype::bf16);
  CHECK_THROWS_WITH(opt.step(), Contains("parameter 'h' has dtype bf16; optimizers update f32"));
}
