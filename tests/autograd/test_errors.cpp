// Bad input to ops: every case throws decentrain::error with a message naming the offending
// values and what was expected.
#include <decentrain/decentrain.hpp>

#include <catch2/catch.hpp>

namespace dt = decentrain;
using Catch::Matchers::Contains;

namespace {
dt::var<> v(dt::shape s, dt::dtype t = dt::dtype::f32) { return dt::parameter(dt::zeros(s, t)); }
dt::tensor<> ids(std::vector<std::int32_t> x, dt::shape s) { return dt::from_vector(x, s); }
}  // namespace

TEST_CASE("elementwise ops reject shapes that do not broadcast", "[errors]") {
  CHECK_THROWS_AS(v({2, 3}) + v({4}), dt::error);
  CHECK_THROWS_WITH(v({2, 3}) + v({4}), Contains("add: shapes (2, 3) and (4,) cannot be broadcast"));
  CHECK_THROWS_WITH(v({2, 3}) * v({2, 3}, dt::dtype::f64), Contains("mul: dtype mismatch: f32 vs f64"));
  CHECK_THROWS_WITH(v({2}) / 0.0, Contains("division of a var by the scalar 0"));
}

TEST_CASE("matmul and linear check inner and batch dimensions", "[errors]") {
  CHECK_THROWS_WITH(dt::matmul(v({2, 3}), v({4, 5})), Contains("inner dimensions differ: (2, 3) x (4, 5) (3 vs 4)"));
  CHECK(dt::matmul(v({2, 3}), v({4, 3}), false, true).shape() == dt::shape{2, 4});
  CHECK_THROWS_WITH(dt::matmul(v({2, 3}), v({4, 3}), true, true), Contains("(2, 3)^T x (4, 3)^T (2 vs 3)"));
  CHECK_THROWS_WITH(dt::matmul(v({2, 2, 3}), v({3, 3, 4})), Contains("batch dimensions differ"));
  CHECK_THROWS_WITH(dt::matmul(v({3}), v({3, 4})), Contains("rank >= 2"));
  CHECK_THROWS_WITH(dt::linear(v({2, 5}), v({4, 3})), Contains("linear: input shape (2, 5) does not match weight shape (4, 3)"));
  CHECK_THROWS_WITH(dt::linear(v({2, 4}), v({4, 3}), v({4})), Contains("bias shape (4,) does not match"));
  CHECK_THROWS_WITH(dt::linear_gelu_linear(v({2, 5}), v({4, 8}), v({8, 3})),
                    Contains("linear_gelu_linear: input shape (2, 5) does not match first weight shape (4, 8)"));
  CHECK_THROWS_WITH(dt::linear_gelu_linear(v({2, 4}), v({4, 8}), v({7, 3})),
                    Contains("second weight shape (7, 3) does not match the 8 columns it multiplies (expected (8, out))"));
  CHECK_THROWS_WITH(dt::linear_gelu_linear(v({2, 4}), v({4, 8}), v({8}), v({8, 3}), v({8})),
                    Contains("second bias shape (8,) does not match second weight shape (8, 3) (expected (3,))"));
  CHECK_THROWS_WITH(dt::linear_gelu_linear(v({2, 4}), v({4, 8}), v({8, 3}, dt::dtype::f64)), Contains("dtype mismatch: f32 vs f64"));
  CHECK(dt::linear_gelu_linear(v({2, 3, 4}), v({4, 8}), v({8, 3})).shape() == dt::shape{2, 3, 3});
}

TEST_CASE("reductions and shape ops check axes and sizes", "[errors]") {
  CHECK_THROWS_WITH(dt::sum(v({2, 3}), {2}), Contains("axis 2 is out of range for shape (2, 3)"));
  CHECK_THROWS_WITH(dt::mean(v({2, 3}), {1, -1}), Contains("axis -1 is listed twice"));
  CHECK_THROWS_WITH(dt::reshape(v({2, 3}), {4, 2}), Contains("cannot reshape tensor of shape (2, 3) (6 elements) to (4, 2)"));
  CHECK_THROWS_WITH(dt::reshape(v({2, 3}), {-1, -1}), Contains("only one dim may be -1"));
  CHECK_THROWS_WITH(dt::slice(v({2, 3}), 1, 2, 5), Contains("slice [2, 5) is out of range for dim 1 of size 3"));
  CHECK_THROWS_WITH(dt::split(v({2, 5}), {2, 2}, 1), Contains("split sizes (2, 2) add up to 4 but dim 1"));
  CHECK_THROWS_WITH(dt::concat({v({2, 3}), v({3, 3})}, 1), Contains("input 1 has shape (3, 3) but input 0 has shape (2, 3)"));
  CHECK_THROWS_WITH(dt::concat(std::vector<dt::var<>>{}, 0), Contains("at least one input"));
  CHECK_THROWS_WITH(dt::transpose(v({2, 3}), 0, 3), Contains("axis 3 is out of range"));
}

TEST_CASE("embedding and cross_entropy validate integer inputs", "[errors]") {
  CHECK_THROWS_WITH(dt::embedding(ids({0, 7, 2}, {3}), v({5, 4})), Contains("id 7 at flat index 1 is outside the table's 5 rows"));
  CHECK_THROWS_WITH(dt::embedding(ids({-1}, {1}), v({5, 4})), Contains("id -1"));
  CHECK_THROWS_WITH(dt::embedding(dt::zeros(dt::shape{2}), v({5, 4})), Contains("ids must be i32, got f32"));
  CHECK_THROWS_WITH(dt::cross_entropy(v({2, 5}), ids({1, 5}, {2})), Contains("target 5 at flat index 1 is outside [0, 5)"));
  CHECK_THROWS_WITH(dt::cross_entropy(v({2, 5}), ids({1, 2, 3}, {3})), Contains("targets shape (3,) does not match logits shape (2, 5) (expected (2,))"));
  // Every row ignored: NaN like PyTorch, and the backward adds nothing.
  auto logits = v({2, 5});
  auto loss = dt::cross_entropy(logits, ids({-1, -1}, {2}));
  CHECK(std::isnan(loss.item()));
}

TEST_CASE("linear_cross_entropy names bad shapes, dtypes and targets", "[errors]") {
  CHECK_THROWS_WITH(dt::linear_cross_entropy(v({2, 4}), v({5, 3}), ids({0, 1}, {2})),
                    Contains("input shape (2, 4) does not match weight shape (5, 3) (expected last input dim 3)"));
  CHECK_THROWS_WITH(dt::linear_cross_entropy(v({2, 4}), v({4}), ids({0, 1}, {2})), Contains("weight must be a non-empty (classes, in) matrix"));
  CHECK_THROWS_WITH(dt::linear_cross_entropy(v({2, 4}), v({0, 4}), ids({0, 1}, {2})), Contains("weight must be a non-empty"));
  CHECK_THROWS_WITH(dt::linear_cross_entropy(v({2, 4}), v({5, 4}, dt::dtype::f64), ids({0, 1}, {2})),
                    Contains("dtype mismatch: f32 vs f64"));
  CHECK_THROWS_WITH(dt::linear_cross_entropy(v({2, 4}), v({5, 4}), ids({0, 5}, {2})), Contains("target 5 at flat index 1 is outside [0, 5)"));
  CHECK_THROWS_WITH(dt::linear_cross_entropy(v({2, 3, 4}), v({5, 4}), ids({0, 1}, {2})),
                    Contains("targets shape (2,) does not match input shape (2, 3, 4) (expected (2, 3))"));
  CHECK_THROWS_WITH(dt::linear_cross_entropy(v({2, 4}), v({5, 4}), dt::zeros(dt::shape{2})), Contains("targets must be i32, got f32"));
  CHECK_THROWS_WITH(dt::linear_cross_entropy(v({2, 4}), v({5, 4}), ids({0, 1}, {2}), -1, -3), Contains("chunk_rows must be >= 0"));
  auto all_ignored = dt::linear_cross_entropy(v({2, 4}), v({5, 4}), ids({-1, -1}, {2}));
  CHECK(std::isnan(all_ignored.item()));
}

TEST_CASE("normalisation, attention and dropout check their options", "[errors]") {
  CHECK_THROWS_WITH(dt::layer_norm(v({2, 4}), v({3}), v({4})), Contains("weight (3,) and bias (4,) must both have shape (4,)"));
  CHECK_THROWS_WITH(dt::layer_norm(v({2, 4}), v({4}), v({4}), 0.0), Contains("eps must be > 0"));
  CHECK_THROWS_WITH(dt::causal_attention(v({1, 3, 6}), v({1, 3, 6}), v({1, 3, 6}), 4), Contains("n_head = 4 must be positive and divide C = 6"));
  CHECK_THROWS_WITH(dt::causal_attention(v({1, 3, 6}), v({1, 2, 6}), v({1, 3, 6}), 2), Contains("must have the same shape"));
  CHECK_THROWS_WITH(dt::causal_attention(v({3, 6}), v({3, 6}), v({3, 6}), 2), Contains("q must be (B, T, C)"));
  CHECK_THROWS_WITH(dt::causal_attention(v({1, 3, 8}), 2), Contains("a fused qkv must be (B, T, 3C), got shape (1, 3, 8)"));
  CHECK_THROWS_WITH(dt::causal_attention(v({3, 6}), 2), Contains("a fused qkv must be (B, T, 3C)"));
  CHECK_THROWS_WITH(dt::causal_attention(v({1, 3, 9}), 2), Contains("n_head = 2 must be positive and divide C = 3"));
  dt::rng gen(1, "dropout");
  CHECK_THROWS_WITH(dt::dropout(v({2}), 1.5, gen), Contains("probability must be in [0, 1], got 1.5"));
  CHECK_THROWS_WITH(dt::gelu(dt::var<>(dt::zeros(dt::shape{2}, dt::dtype::i32))), Contains("gelu: expected a floating-point tensor"));
  CHECK_THROWS_WITH(dt::parameter(dt::zeros(dt::shape{2}, dt::dtype::i32)), Contains("dtype i32 cannot require gradients"));
}

TEST_CASE("gemm checks its arguments", "[errors]") {
  std::vector<float> a(6), b(6), c(4);
  CHECK_THROWS_WITH(dt::kernels::gemm(dt::cpu{}, false, false, 2, 2, 3, 1.f, a.data(), 2, b.data(), 2, 0.f, c.data(), 2),
                    Contains("leading dimension too small"));
  if (!dt::kernels::has_cblas) {
    CHECK_THROWS_WITH(dt::kernels::gemm(dt::cpu{}, false, false, 2, 2, 3, 1.f, a.data(), 3, b.data(), 2, 0.f,
                                        c.data(), 2, dt::kernels::gemm_backend::cblas),
                      Contains("no CBLAS"));
  }
}
