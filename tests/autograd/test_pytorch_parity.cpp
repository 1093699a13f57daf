// Parity with PyTorch: every op's output and input gradients (of sum(out * w) for a random w)
// against fixtures made by tests/reference/make_fixtures.py, and a 2-layer GPT-2 block stack,
// forward and backward. All in f32. Tolerance, stated once: |ours - torch| <= 1e-5 + 1e-4 |torch|
// (f32 has 24 bits; both sides sum in different orders through a few ops).
#include "support/fixture.hpp"

#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>

namespace {
using vars = std::vector<dt::var<>>;
constexpr double rtol = 1e-4, atol = 1e-5;

const fixture& ops() {
  static const fixture f(DECENTRAIN_FIXTURE_DIR "/ops.dtfx");
  return f;
}

void check_close(const dt::tensor<>& ours, const dt::tensor<>& theirs, const std::string& what) {
  INFO(what);
  REQUIRE(ours.shape() == theirs.shape());
  const auto cmp = dt::compare(ours.to(dt::dtype::f32), theirs, rtol, atol);
  INFO(cmp.message);
  CHECK(cmp.close);
}

// Runs op `name` on the fixture inputs in0..in(n-1), compares output and every gradient.
void check_op(const std::string& name, std::size_t n_inputs, const std::function<dt::var<>(const vars&)>& f) {
  const auto& fx = ops();
  vars inputs;
  for (std::size_t i = 0; i < n_inputs; ++i)
    inputs.push_back(dt::parameter(fx[name + ".in" + std::to_string(i)].clone()));
  auto out = f(inputs);
  check_close(out.value(), fx[name + ".out"], name + " forward");
  dt::sum(dt::mul(out, dt::var<>(fx[name + ".w"].reshape(out.shape())))).backward();
  for (std::size_t i = 0; i < n_inputs; ++i)
    check_close(inputs[i].grad(), fx[name + ".grad" + std::to_string(i)], name + " grad of input " + std::to_string(i));
}
}  // namespace

TEST_CASE("parity: elementwise and scalar ops", "[parity]") {
  check_op("add", 2, [](const vars& v) { return v[0] + v[1]; });
  check_op("sub", 2, [](const vars& v) { return v[0] - v[1]; });
  check_op("mul", 2, [](const vars& v) { return v[0] * v[1]; });
  check_op("div", 2, [](const vars& v) { return v[0] / v[1]; });
  check_op("affine", 1, [](const vars& v) { return v[0] * -1.5 + 2.0; });
  check_op("rdiv", 1, [](const vars& v) { return 2.0 / v[0]; });
}

TEST_CASE("parity: matmul, batched matmul, linear", "[parity]") {
  check_op("matmul", 2, [](const vars& v) { return dt::matmul(v[0], v[1]); });
  check_op("matmul_tt", 2, [](const vars& v) { return dt::matmul(v[0], v[1], true, true); });
  check_op("bmm", 2, [](const vars& v) { return dt::matmul(v[0], v[1]); });
  check_op("bmm_shared", 2, [](const vars& v) { return dt::matmul(v[0], v[1]); });
  check_op("linear", 3, [](const vars& v) { return dt::linear(v[0], v[1], v[2]); });
}

TEST_CASE("parity: reductions and shape ops", "[parity]") {
  check_op("sum", 1, [](const vars& v) { return dt::sum(v[0], {0, 2}); });
  check_op("mean", 1, [](const vars& v) { return dt::mean(v[0], {1}, true); });
  check_op("reshape", 1, [](const vars& v) { return dt::reshape(v[0], {5, 3}); });
  check_op("transpose", 1, [](const vars& v) { return dt::transpose(v[0], 0, 2); });
  check_op("concat", 2, [](const vars& v) { return dt::concat({v[0], v[1], v[0]}, 1); });
  check_op("split", 1, [](const vars& v) {
    auto p = dt::split(v[0], {2, 1, 2}, -1);
    return p[0] * p[2] + p[1];
  });
}

TEST_CASE("parity: layer_norm, gelu, softmax, log_softmax, attention", "[parity]") {
  check_op("layer_norm", 3, [](const vars& v) { return dt::layer_norm(v[0], v[1], v[2]); });
  check_op("gelu", 1, [](const vars& v) { return dt::gelu(v[0]); });
  check_op("softmax", 1, [](const vars& v) { return dt::softmax(v[0]); });
  check_op("log_softmax", 1, [](const vars& v) { return dt::log_softmax(v[0]); });
  check_op("attention", 3, [](const vars& v) { return dt::causal_attention(v[0], v[1], v[2], 2); });
}

TEST_CASE("parity: embedding and cross_entropy", "[parity]") {
  const auto ids = ops()["embedding.ids"];
  check_op("embedding", 1, [&](const vars& v) { return dt::embedding(ids, v[0]); });
  const auto targets = ops()["cross_entropy.targets"];
  check_op("cross_entropy", 1, [&](const vars& v) { return dt::cross_entropy(v[0], targets, -1); });
}

TEST_CASE("parity: 2-layer GPT-2 block stack, forward and backward", "[parity][gpt]") {
  const fixture fx(DECENTRAIN_FIXTURE_DIR "/gpt_block.dtfx");
  const auto cfg = fx["config"].to_vector<std::int32_t>();
  const std::int64_t V = cfg[0], T = cfg[1], C = cfg[2], H = cfg[3], L = cfg[4], B = cfg[5];
  std::map<std::string, dt::var<>> p;
  auto param = [&](const std::string& name) -> dt::var<>& {
    auto it = p.find(name);
    if (it == p.end()) it = p.emplace(name, dt::parameter(fx["param." + name].clone())).first;
    return it->second;
  };
  const auto positions = dt::arange(T, dt::dtype::i32).reshape({1, T}).expand(dt::shape{B, T}).contiguous();
  auto x = dt::embedding(fx["idx"], param("wte.weight")) + dt::embedding(positions, param("wpe.weight"));  // (B,T,C)
  for (std::int64_t l = 0; l < L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    auto a = dt::layer_norm(x, param(h + "ln_1.weight"), param(h + "ln_1.bias"));
    auto qkv = dt::split(dt::linear(a, param(h + "attn.c_attn.weight"), param(h + "attn.c_attn.bias")), {C, C, C}, -1);
    x = x + dt::linear(dt::causal_attention(qkv[0], qkv[1], qkv[2], H), param(h + "attn.c_proj.weight"),
                       param(h + "attn.c_proj.bias"));
    auto m = dt::layer_norm(x, param(h + "ln_2.weight"), param(h + "ln_2.bias"));
    m = dt::gelu(dt::linear(m, param(h + "mlp.c_fc.weight"), param(h + "mlp.c_fc.bias")));
    x = x + dt::linear(m, param(h + "mlp.c_proj.weight"), param(h + "mlp.c_proj.bias"));
  }
  x = dt::layer_norm(x, param("ln_f.weight"), param("ln_f.bias"));
  auto logits = dt::matmul(x, param("wte.weight"), false, true);  // tied LM head, (B,T,V)
  auto loss = dt::cross_entropy(logits, fx["targets"]);

  REQUIRE(logits.shape() == dt::shape{B, T, V});
  check_close(logits.value(), fx["logits"], "logits");
  CHECK(loss.item() == Approx(fx["loss"].item()).epsilon(1e-5));
  loss.backward();
  for (auto& [name, var] : p) check_close(var.grad(), fx["grad." + name], "gradient of " + name);
  CHECK(p.size() == static_cast<std::size_t>(4 + 12 * L));
}

TEST_CASE("fixture files are checked: magic, version, truncation", "[parity][fixture]") {
  using Catch::Matchers::Contains;
  const std::string path = "decentrain_bad_fixture.dtfx";
  auto write = [&](const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out << bytes;
  };
  write("NOPE");
  CHECK_THROWS_WITH(fixture(path), Contains("bad magic number"));
  write(std::string("DTFX") + std::string("\x02\0\0\0", 4));
  CHECK_THROWS_WITH(fixture(path), Contains("has version 2, expected 1"));
  write(std::string("DTFX") + std::string("\x01\0\0\0\x01\0\0\0\x05\0", 10));
  CHECK_THROWS_WITH(fixture(path), Contains("is truncated"));
  CHECK_THROWS_WITH(fixture("does/not/exist.dtfx"), Contains("cannot open"));
  std::remove(path.c_str());
}
