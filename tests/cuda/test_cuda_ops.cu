// Every op on dt::cuda against the CPU implementation: the same inputs on both devices,
// forward values and the gradients of every input compared. Tolerances (f32): relative to the
// largest magnitude of the CPU result, max |cuda - cpu| <= 1e-5 * max |cpu| (1e-5 relative,
// norm-wise), looser only where stated (reductions over thousands of terms, bf16 storage).
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <string>
#include <type_traits>
#include <vector>

namespace dt = decentrain;
using dt::cpu;
using gpu = dt::cuda;  // (the name cuda is taken by libcu++'s namespace ::cuda)

namespace {

// max |a - b| / max |b| (0 when both are all zero); a and b on the host.
double normwise_error(const dt::tensor<cpu>& a, const dt::tensor<cpu>& b) {
  REQUIRE(a.shape() == b.shape());
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) != std::isnan(vb[i])) return INFINITY;
    if (std::isnan(va[i])) continue;
    diff = std::max(diff, std::abs(va[i] - vb[i]));
    scale = std::max(scale, std::abs(vb[i]));
  }
  return scale == 0.0 ? diff : diff / scale;
}

template <class D>
dt::tensor<cpu> host(const dt::tensor<D>& x) { return dt::to_device<cpu>(x); }

// Runs f on both devices with the same inputs (all requiring gradients) and the same output
// gradient; checks the output and every input gradient.
template <class F>
void check_against_cpu(const std::string& what, const std::vector<dt::tensor<cpu>>& inputs, F f,
                       double tol = 1e-5) {
  INFO(what);
  std::vector<dt::var<cpu>> xc;
  std::vector<dt::var<gpu>> xg;
  for (const auto& t : inputs) {
    xc.push_back(dt::parameter(t.clone()));
    xg.push_back(dt::parameter(dt::to_device<gpu>(t)));
  }
  auto yc = f(xc);
  auto yg = f(xg);
  CHECK(normwise_error(host(yg.value()), yc.value()) <= tol);
  dt::rng gen(99, "cuda-grad-out");
  const auto g = dt::randn(yc.shape(), gen, yc.dtype());
  yc.backward(g);
  yg.backward(dt::to_device<gpu>(g));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    INFO("gradient of input " << i);
    REQUIRE(xc[i].grad().defined() == xg[i].grad().defined());
    if (xc[i].grad().defined()) CHECK(normwise_error(host(xg[i].grad()), xc[i].grad()) <= tol);
  }
}

template <class D>
dt::var<D>& param_at(dt::parameter_list<D>& list, std::size_t i) {
  return std::next(list.begin(), static_cast<std::ptrdiff_t>(i))->param;
}

dt::tensor<cpu> random(const dt::shape& s, std::uint64_t seed, dt::dtype t = dt::dtype::f32, double scale = 1.0) {
  dt::rng gen(seed, "cuda-test-input");
  return dt::randn(s, gen, t, 0.0, scale);
}

}  // namespace

TEST_CASE("cuda memory: allocation is cached and reused, copies convert dtypes and follow strides") {
  auto a = dt::tensor<gpu>::empty(dt::shape{1000, 300});
  const void* first = a.raw_data();
  a = dt::tensor<gpu>();
  CHECK(dt::memory<gpu>::cached_bytes() >= 1000 * 300 * 4);
  auto b = dt::tensor<gpu>::empty(dt::shape{1000, 300});
  CHECK(b.raw_data() == first);  // same stream, same size: the freed block (merged back whole) comes back

  const auto x = random(dt::shape{3, 5, 7}, 1);
  const auto xg = dt::to_device<gpu>(x);
  CHECK(host(xg).to_vector<float>() == x.to_vector<float>());
  // A permuted (non-contiguous) view made contiguous on the GPU equals the CPU's.
  const auto view_c = x.permute({2, 0, 1}).contiguous();
  const auto view_g = xg.permute({2, 0, 1}).contiguous();
  CHECK(host(view_g).to_vector<float>() == view_c.to_vector<float>());
  // Dtype conversions round the same way as on the CPU (bf16: nearest even).
  for (auto t : {dt::dtype::bf16, dt::dtype::f64}) {
    const auto conv_c = x.transpose(0, 2).to(t);
    const auto conv_g = xg.transpose(0, 2).to(t);
    CHECK(host(conv_g).to_vector<double>() == conv_c.to_vector<double>());
  }
  auto filled = dt::full<gpu>(dt::shape{4, 4}, 2.5, dt::dtype::bf16);
  for (double v : host(filled).to_vector<double>()) CHECK(v == 2.5);
  auto slice_target = dt::zeros<gpu>(dt::shape{4, 6});
  slice_target.slice(1, 2, 5).copy_from(dt::ones<gpu>(dt::shape{4, 3}));
  const auto sv = host(slice_target).to_vector<float>();
  CHECK(sv[0] == 0.f);
  CHECK(sv[2] == 1.f);
  CHECK(sv[5] == 0.f);

  // Whole-tensor casts (four at a time, with a tail), a cast from an unaligned start, and a
  // cast of a slice of the last dimension (rows) all round like the CPU.
  for (std::int64_t n : {1, 3, 4, 1001}) {
    const auto v = random(dt::shape{n}, 2);
    const auto vg = dt::to_device<gpu>(v);
    CHECK(host(vg.to(dt::dtype::bf16)).to_vector<double>() == v.to(dt::dtype::bf16).to_vector<double>());
    CHECK(host(vg.to(dt::dtype::bf16).to(dt::dtype::f32)).to_vector<double>() ==
          v.to(dt::dtype::bf16).to(dt::dtype::f32).to_vector<double>());
    if (n > 1)
      CHECK(host(vg.slice(0, 1, n).to(dt::dtype::bf16)).to_vector<double>() ==
            v.slice(0, 1, n).to(dt::dtype::bf16).to_vector<double>());
  }
  const auto wide = random(dt::shape{2, 9, 12}, 3);
  CHECK(host(dt::to_device<gpu>(wide).slice(2, 4, 9).to(dt::dtype::bf16)).to_vector<double>() ==
        wide.slice(2, 4, 9).to(dt::dtype::bf16).to_vector<double>());

  dt::pinned_buffer pinned(1 << 20);
  CHECK(pinned.data() != nullptr);
  CHECK(pinned.size() == (1u << 20));
}

TEST_CASE("cuda memory: repeated training steps reserve nothing new, a smaller batch fits in what is reserved") {
  auto cfg = dt::nn::gpt_preset("tiny");
  dt::rng init(12, "init");
  dt::nn::gpt<gpu> model(cfg, init);
  model.set_compute_dtype(dt::dtype::bf16);
  dt::optim::adamw<gpu> opt(model.parameters());
  auto step = [&](std::int64_t batch) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(batch * 64));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 17) % 256);
    const auto x = dt::to_device<gpu>(dt::from_vector(ids, dt::shape{batch, 64}));
    auto loss = model.loss(x, x);
    model.parameters().zero_grad();
    loss.backward();
    dt::optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
  };
  for (int i = 0; i < 3; ++i) step(8);  // the optimizer's state and the pattern of blocks settle
  const auto reserved = dt::memory<gpu>::reserved_bytes();
  dt::memory<gpu>::reset_peak();
  for (int i = 0; i < 3; ++i) step(8);
  step(5);
  CHECK(dt::memory<gpu>::reserved_bytes() == reserved);
  CHECK(dt::memory<gpu>::peak_reserved_bytes() == reserved);
  CHECK(dt::memory<gpu>::peak_allocated_bytes() <= reserved);
  CHECK(dt::memory<gpu>::cached_bytes() == reserved - dt::memory<gpu>::allocated_bytes());
}

TEST_CASE("cuda memory: an impossible allocation is a clear error, and the process goes on") {
  try {
    (void)dt::tensor<gpu>::empty(dt::shape{std::int64_t{1} << 40});  // 4 TiB
    FAIL("no error");
  } catch (const dt::error& e) {
    CHECK(std::string(e.what()).find("out of memory") != std::string::npos);
    CHECK(std::string(e.what()).find("CUDA device") != std::string::npos);
  }
  CHECK(host(dt::ones<gpu>(dt::shape{2})).to_vector<float>() == std::vector<float>{1.f, 1.f});
}

TEST_CASE("cuda elementwise ops with broadcasting, reductions and scalar ops match the CPU") {
  const auto a = random(dt::shape{4, 1, 6}, 2), b = random(dt::shape{3, 1}, 3);
  const auto c = random(dt::shape{4, 3, 6}, 4), d = dt::math::affine(random(dt::shape{4, 3, 6}, 5), 0.1, 2.0);
  check_against_cpu("add broadcast", {a, b}, [](auto& x) { return dt::add(x[0], x[1]); });
  check_against_cpu("sub broadcast", {a, b}, [](auto& x) { return dt::sub(x[0], x[1]); });
  check_against_cpu("mul", {c, d}, [](auto& x) { return dt::mul(x[0], x[1]); });
  check_against_cpu("div", {c, d}, [](auto& x) { return dt::div(x[0], x[1]); });
  check_against_cpu("sum leading", {c}, [](auto& x) { return dt::sum(x[0], {0, 1}); });
  check_against_cpu("sum trailing", {c}, [](auto& x) { return dt::sum(x[0], {2}, true); });
  check_against_cpu("sum middle", {c}, [](auto& x) { return dt::sum(x[0], {1}); });
  check_against_cpu("sum all", {c}, [](auto& x) { return dt::sum(x[0]); });
  check_against_cpu("mean", {c}, [](auto& x) { return dt::mean(x[0], {2}); });
}

TEST_CASE("cuda column sums and layer norm gradients over many rows, packed and unpacked, match the CPU") {
  // Bias and gain gradients sum thousands of rows in chunks; widths that are multiples of the
  // packed lane width (8 bf16, 4 f32) take the 16-byte-load kernels, the others the scalar ones.
  for (std::int64_t cols : {768, 13, 36}) {
    INFO("cols " << cols);
    const auto tall = random(dt::shape{2, 2600, cols}, 60);
    check_against_cpu("column sum f32", {tall}, [](auto& v) { return dt::sum(v[0], {0, 1}); });
    check_against_cpu("column sum bf16", {tall.to(dt::dtype::bf16)},
                      [](auto& v) { return dt::cast(dt::sum(v[0], {0, 1}), dt::dtype::f32); }, 8e-3);
    const auto w = random(dt::shape{cols}, 61), b = random(dt::shape{cols}, 62), branch = random(dt::shape{2, 2600, cols}, 63);
    check_against_cpu("layer_norm over many rows", {tall, w, b}, [](auto& v) { return dt::layer_norm(v[0], v[1], v[2]); });
    check_against_cpu("add_layer_norm, bf16 branch and output", {tall, branch.to(dt::dtype::bf16), w, b}, [](auto& v) {
      auto [sum, normed] = dt::add_layer_norm(v[0], v[1], v[2], v[3], 1e-5, dt::dtype::bf16);
      return dt::cast(normed, dt::dtype::f32) * sum;
    }, 8e-3);
  }
}

TEST_CASE("cuda gelu and cross-entropy: the packed (16-byte) and scalar paths both match the CPU") {
  // 1001 elements leave a tail after the packs; a view that starts one row in is not 16-byte
  // aligned, so it takes the scalar path.
  for (auto type : {dt::dtype::f32, dt::dtype::bf16}) {
    const double tol = type == dt::dtype::f32 ? 1e-5 : 8e-3;
    INFO(dt::dtype_name(type));
    const auto x = random(dt::shape{143, 7}, 64, dt::dtype::f32, 2.0).to(type);
    check_against_cpu("gelu, 1001 elements", {x}, [](auto& v) { return dt::gelu(v[0]); }, tol);
    check_against_cpu("gelu of an unaligned view", {x}, [](auto& v) { return dt::gelu(dt::slice(v[0], 0, 1, 143)); }, tol);
    // Widths 64 (packed) and 37 (scalar); one ignored row; a -inf logit the online max skips.
    for (std::int64_t width : {64, 37}) {
      INFO("width " << width);
      auto logits = random(dt::shape{6, width}, 65, dt::dtype::f32, 3.0);
      logits.data<float>()[3] = -INFINITY;
      logits.data<float>()[width + 5] = 40.0f;  // a late, large max: the running sum is rescaled
      std::vector<std::int32_t> t{1, 2, -1, 0, static_cast<std::int32_t>(width - 1), 5};
      const auto tc = dt::from_vector(t, dt::shape{6});
      auto lc = dt::parameter(logits.to(type));
      auto lg = dt::parameter(dt::to_device<gpu>(logits.to(type)));
      auto loss_c = dt::cross_entropy(lc, tc);
      auto loss_g = dt::cross_entropy(lg, dt::to_device<gpu>(tc));
      CHECK(std::isfinite(loss_g.item()));
      CHECK(loss_g.item() == Approx(loss_c.item()).epsilon(tol));
      loss_c.backward();
      loss_g.backward();
      CHECK(normwise_error(host(lg.grad()).to(dt::dtype::f32), lc.grad().to(dt::dtype::f32)) <= tol);
    }
  }
}

TEST_CASE("cuda matmul and linear (cuBLAS) match the CPU for every transpose and batching") {
  const auto a = random(dt::shape{2, 5, 7}, 6), b = random(dt::shape{7, 3}, 7), bt = random(dt::shape{3, 7}, 8);
  const auto ab = random(dt::shape{2, 7, 4}, 9), at = random(dt::shape{2, 7, 5}, 10), abt = random(dt::shape{2, 4, 7}, 14);
  check_against_cpu("batched x shared", {a, b}, [](auto& x) { return dt::matmul(x[0], x[1]); });
  check_against_cpu("batched x shared^T", {a, bt}, [](auto& x) { return dt::matmul(x[0], x[1], false, true); });
  check_against_cpu("batched x batched", {a, ab}, [](auto& x) { return dt::matmul(x[0], x[1]); });
  check_against_cpu("batched^T x batched^T", {at, abt}, [](auto& x) { return dt::matmul(x[0], x[1], true, true); });
  const auto x = random(dt::shape{3, 17, 96}, 11), w = random(dt::shape{96, 80}, 12, dt::dtype::f32, 0.1),
             bias = random(dt::shape{80}, 13);
  check_against_cpu("linear", {x, w, bias}, [](auto& v) { return dt::linear(v[0], v[1], v[2]); });
  check_against_cpu("linear without bias", {x, w}, [](auto& v) { return dt::linear(v[0], v[1]); });
}

TEST_CASE("cuda gelu, softmax, log_softmax and layer_norm match the CPU") {
  const auto x = random(dt::shape{6, 9, 130}, 14, dt::dtype::f32, 2.0);
  check_against_cpu("gelu", {x}, [](auto& v) { return dt::gelu(v[0]); });
  check_against_cpu("softmax", {x}, [](auto& v) { return dt::softmax(v[0]); });
  check_against_cpu("log_softmax", {x}, [](auto& v) { return dt::log_softmax(v[0]); });
  const auto w = random(dt::shape{130}, 15), b = random(dt::shape{130}, 16);
  check_against_cpu("layer_norm", {x, w, b}, [](auto& v) { return dt::layer_norm(v[0], v[1], v[2]); });
  // Wide rows: a warp walks 1000 columns.
  const auto wide = random(dt::shape{33, 1000}, 17), ww = random(dt::shape{1000}, 18), wb = random(dt::shape{1000}, 19);
  check_against_cpu("layer_norm wide", {wide, ww, wb}, [](auto& v) { return dt::layer_norm(v[0], v[1], v[2]); });
  // The fused residual add: both outputs feed the result, so both carry gradient back.
  const auto branch = random(dt::shape{6, 9, 130}, 20);
  check_against_cpu("add_layer_norm", {x, branch, w, b}, [](auto& v) {
    auto [sum, normed] = dt::add_layer_norm(v[0], v[1], v[2], v[3]);
    return normed * sum;
  });
  const auto wide_branch = random(dt::shape{33, 1000}, 21);
  check_against_cpu("add_layer_norm wide", {wide, wide_branch, ww, wb}, [](auto& v) {
    auto [sum, normed] = dt::add_layer_norm(v[0], v[1], v[2], v[3]);
    return normed + sum;
  });
}

TEST_CASE("cuda embedding and cross-entropy match the CPU, ids are checked") {
  const std::vector<std::int32_t> id_values{3, 1, 3, 0, 7, 3, 1, 2, 9, 9, 0, 5};
  const auto ids_c = dt::from_vector(id_values, dt::shape{3, 4});
  const auto table = random(dt::shape{10, 37}, 20);
  std::vector<dt::var<cpu>> tc{dt::parameter(table.clone())};
  std::vector<dt::var<gpu>> tg{dt::parameter(dt::to_device<gpu>(table))};
  auto yc = dt::embedding(ids_c, tc[0]);
  auto yg = dt::embedding(dt::to_device<gpu>(ids_c), tg[0]);
  CHECK(normwise_error(host(yg.value()), yc.value()) == 0.0);
  const auto g = random(yc.shape(), 21);
  yc.backward(g);
  yg.backward(dt::to_device<gpu>(g));
  CHECK(normwise_error(host(tg[0].grad()), tc[0].grad()) <= 1e-6);  // atomic adds: order varies

  const auto bad = dt::to_device<gpu>(dt::from_vector(std::vector<std::int32_t>{1, 10}, dt::shape{2}));
  CHECK_THROWS_WITH(dt::embedding(bad, tg[0]), Catch::Contains("id 10 at flat index 1"));

  const auto logits = random(dt::shape{5, 7, 300}, 22, dt::dtype::f32, 3.0);
  std::vector<std::int32_t> targets(35);
  for (std::size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<std::int32_t>((i * 37) % 300);
  targets[4] = -1;  // ignored
  const auto tgt_c = dt::from_vector(targets, dt::shape{5, 7});
  const auto tgt_g = dt::to_device<gpu>(tgt_c);
  std::vector<dt::var<cpu>> lc{dt::parameter(logits.clone())};
  std::vector<dt::var<gpu>> lg{dt::parameter(dt::to_device<gpu>(logits))};
  auto loss_c = dt::cross_entropy(lc[0], tgt_c);
  auto loss_g = dt::cross_entropy(lg[0], tgt_g);
  CHECK(loss_g.item() == Approx(loss_c.item()).epsilon(1e-6));
  loss_c.backward();
  loss_g.backward();
  CHECK(normwise_error(host(lg[0].grad()), lc[0].grad()) <= 1e-5);
  targets[0] = 300;
  CHECK_THROWS_WITH(dt::cross_entropy(lg[0], dt::to_device<gpu>(dt::from_vector(targets, dt::shape{5, 7}))),
                    Catch::Contains("target 300 at flat index 0"));
}

TEST_CASE("cuda linear_cross_entropy matches the CPU in f32 and bf16, whole and in chunks, and the unfused ops") {
  std::vector<std::int32_t> targets(6 * 37);
  for (std::size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<std::int32_t>((i * 53) % 1000);
  targets[5] = targets[100] = -1;  // ignored
  const auto tc = dt::from_vector(targets, dt::shape{6, 37});
  const auto tg = dt::to_device<gpu>(tc);
  for (const auto type : {dt::dtype::f32, dt::dtype::bf16}) {
    const auto x = random(dt::shape{6, 37, 64}, 23, type), w = random(dt::shape{1000, 64}, 24, type, 0.5);
    // bf16: each side rounds logits and their gradient to bf16, the GPU's products accumulate
    // in another order than the CPU's.
    const double tol = type == dt::dtype::bf16 ? 2e-2 : 1e-5;
    for (const std::int64_t chunk : {0, 50}) {
      INFO(dt::dtype_name(type) << ", chunk_rows " << chunk);
      check_against_cpu("linear_cross_entropy", {x, w}, [&](auto& v) {
        using D = typename std::decay_t<decltype(v[0])>::device_type;
        return dt::linear_cross_entropy(v[0], v[1], dt::to_device<D>(tc), -1, chunk);
      }, tol);
    }
    auto xf = dt::parameter(dt::to_device<gpu>(x)), wf = dt::parameter(dt::to_device<gpu>(w));
    auto xs = dt::parameter(dt::to_device<gpu>(x)), ws = dt::parameter(dt::to_device<gpu>(w));
    auto fused = dt::linear_cross_entropy(xf, wf, tg, -1, 64);
    auto split = dt::cross_entropy(dt::matmul(xs, ws, false, true), tg, -1);
    CHECK(fused.item() == Approx(split.item()).epsilon(type == dt::dtype::bf16 ? 1e-3 : 1e-6));
    fused.backward();
    split.backward();
    CHECK(normwise_error(host(xf.grad()), host(xs.grad())) <= tol);
    CHECK(normwise_error(host(wf.grad()), host(ws.grad())) <= tol);
  }
}

TEST_CASE("cuda GEMMs and the loss at linear_cross_entropy's shapes match the CPU, piece by piece") {
  // The products linear_cross_entropy's test above runs (222 rows, 64 wide, 1000 classes): the
  // logits (x w^T), the input's gradient (g w), the weight's (g^T x), with beta 0 and 1 over a
  // C that holds values, in f32 and with bf16 operands; then the loss's gradient alone. Where
  // that test fails, this one says which piece does.
  struct problem { bool ta, tb; std::int64_t m, n, k; };
  for (const problem p : {problem{false, true, 222, 1000, 64}, problem{false, false, 222, 64, 1000},
                          problem{true, false, 1000, 64, 222}}) {
    const auto a = random(p.ta ? dt::shape{p.k, p.m} : dt::shape{p.m, p.k}, 50);
    const auto b = random(p.tb ? dt::shape{p.n, p.k} : dt::shape{p.k, p.n}, 51);
    const auto c0 = random(dt::shape{p.m, p.n}, 52);
    for (const float beta : {0.0f, 1.0f})
      for (const bool bf16 : {false, true}) {
        INFO("ta " << p.ta << " tb " << p.tb << " m " << p.m << " n " << p.n << " k " << p.k << " beta " << beta
                   << (bf16 ? " bf16 operands" : " f32"));
        // Both sides multiply the same values: bf16 operands are rounded first, and widened on the CPU.
        const auto ac = bf16 ? a.to(dt::dtype::bf16).to(dt::dtype::f32) : a.clone();
        const auto bc = bf16 ? b.to(dt::dtype::bf16).to(dt::dtype::f32) : b.clone();
        auto want = c0.clone();
        dt::kernels::gemm(cpu{}, p.ta, p.tb, p.m, p.n, p.k, 1.0f, ac.data<float>(), ac.size(1), bc.data<float>(),
                          bc.size(1), beta, want.data<float>(), p.n);
        auto got = dt::to_device<gpu>(c0);
        if (bf16) {
          const auto ag = dt::to_device<gpu>(a.to(dt::dtype::bf16)), bg = dt::to_device<gpu>(b.to(dt::dtype::bf16));
          dt::kernels::gemm(gpu{}, p.ta, p.tb, p.m, p.n, p.k, 1.0f, ag.data<dt::bf16>(), ag.size(1), bg.data<dt::bf16>(),
                            bg.size(1), beta, got.data<float>(), p.n);
        } else {
          const auto ag = dt::to_device<gpu>(a), bg = dt::to_device<gpu>(b);
          dt::kernels::gemm(gpu{}, p.ta, p.tb, p.m, p.n, p.k, 1.0f, ag.data<float>(), ag.size(1), bg.data<float>(),
                            bg.size(1), beta, got.data<float>(), p.n);
        }
        CHECK(normwise_error(host(got), want) <= (bf16 ? 1e-4 : 1e-5));  // (tensor cores sum in another order)
      }
  }
  std::vector<std::int32_t> targets(6 * 37);
  for (std::size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<std::int32_t>((i * 53) % 1000);
  targets[5] = targets[100] = -1;
  const auto tc = dt::from_vector(targets, dt::shape{6, 37});
  check_against_cpu("cross_entropy of (6, 37, 1000) logits", {random(dt::shape{6, 37, 1000}, 53, dt::dtype::f32, 4.0)},
                    [&](auto& v) {
    using D = typename std::decay_t<decltype(v[0])>::device_type;
    return dt::cross_entropy(v[0], dt::to_device<D>(tc), -1);
  });
}

TEST_CASE("cuda causal attention (flash style) matches the CPU for several head widths and lengths") {
  struct dims { std::int64_t B, T, C, H; };
  // Head widths 16, 64 (GPT-2), 96 (not a multiple of 32) and 128; lengths that do and do not
  // fill whole 32-row tiles.
  for (const dims d : {dims{2, 5, 32, 2}, dims{2, 70, 128, 2}, dims{1, 64, 192, 2}, dims{2, 33, 256, 2},
                       dims{1, 200, 768, 12}}) {
    const auto q = random(dt::shape{d.B, d.T, d.C}, 30), k = random(dt::shape{d.B, d.T, d.C}, 31),
               v = random(dt::shape{d.B, d.T, d.C}, 32);
    const std::int64_t H = d.H;
    check_against_cpu("attention B=" + std::to_string(d.B) + " T=" + std::to_string(d.T) + " C=" +
                          std::to_string(d.C) + " H=" + std::to_string(H),
                      {q, k, v}, [H](auto& x) { return dt::causal_attention(x[0], x[1], x[2], H); });
  }
}

TEST_CASE("cuda bf16 attention on tensor cores matches f64 attention on the same rounded inputs") {
  static_assert(dt::detail::has_bf16_attention<gpu>, "the GPU must take the tensor-core path");
  struct dims { std::int64_t B, T, C, H; };
  // Head widths 16, 32, 64 and 128; lengths below, at and past whole 64-row tiles, and over
  // several tiles.
  for (const dims d : {dims{1, 65, 64, 4}, dims{2, 1, 64, 2}, dims{2, 37, 128, 2}, dims{2, 64, 128, 2},
                       dims{1, 130, 256, 2}, dims{2, 200, 768, 12}, dims{1, 300, 256, 4}, dims{1, 128, 512, 4}}) {
    INFO("B=" << d.B << " T=" << d.T << " C=" << d.C << " H=" << d.H);
    std::vector<dt::tensor<cpu>> in;
    for (std::uint64_t seed : {60, 61, 62}) in.push_back(random(dt::shape{d.B, d.T, d.C}, seed).to(dt::dtype::bf16));
    dt::rng gen(63, "bf16-attention-grad");
    const auto g = dt::randn(dt::shape{d.B, d.T, d.C}, gen).to(dt::dtype::bf16);
    std::vector<dt::var<cpu>> xc;
    std::vector<dt::var<gpu>> xg;
    for (const auto& t : in) {
      xc.push_back(dt::parameter(t.to(dt::dtype::f64)));
      xg.push_back(dt::parameter(dt::to_device<gpu>(t)));
    }
    REQUIRE(dt::kernels::attention_bf16_supported(gpu{}, d.C, d.H, d.C, {xg[0].value().data<dt::bf16>()}));
    auto yc = dt::causal_attention(xc[0], xc[1], xc[2], d.H);
    auto yg = dt::causal_attention(xg[0], xg[1], xg[2], d.H);
    REQUIRE(yg.dtype() == dt::dtype::bf16);
    // bf16 results (8 bits of mantissa) and bf16 probabilities inside: 1e-2 of the largest value.
    CHECK(normwise_error(host(yg.value()), yc.value()) <= 1e-2);
    yc.backward(g.to(dt::dtype::f64));
    yg.backward(dt::to_device<gpu>(g));
    for (std::size_t i = 0; i < 3; ++i) {
      INFO("gradient of input " << i);
      REQUIRE(xg[i].grad().dtype() == dt::dtype::bf16);
      CHECK(normwise_error(host(xg[i].grad()), xc[i].grad()) <= 1e-2);
    }
    // The same inputs again give bit-identical results (no atomics, no races).
    auto again = dt::causal_attention(xg[0], xg[1], xg[2], d.H);
    CHECK(host(again.value()).to_vector<double>() == host(yg.value()).to_vector<double>());
    // Read in place as column blocks of one fused (B, T, 3C) tensor (rows 3C apart), the
    // kernels compute the same numbers, and write the gradient as one tensor.
    auto fused = dt::parameter(dt::concat(std::vector<dt::var<gpu>>{xg[0], xg[1], xg[2]}, -1).value());
    REQUIRE(dt::kernels::attention_bf16_supported(gpu{}, d.C, d.H, 3 * d.C, {fused.value().data<dt::bf16>()}));
    auto yf = dt::causal_attention(fused, d.H);
    CHECK(host(yf.value()).to_vector<double>() == host(yg.value()).to_vector<double>());
    yf.backward(dt::to_device<gpu>(g));
    const auto separate = dt::concat(std::vector<dt::var<gpu>>{dt::var<gpu>(xg[0].grad()), dt::var<gpu>(xg[1].grad()),
                                                                dt::var<gpu>(xg[2].grad())}, -1);
    CHECK(host(fused.grad()).to_vector<double>() == host(separate.value()).to_vector<double>());
  }
}

TEST_CASE("cuda ops in double pass finite-difference gradient checks") {
  // Central differences in double on the GPU itself, for the kernels written by hand.
  const auto check = [](const std::string& name, std::vector<dt::tensor<cpu>> inputs, auto f) {
    INFO(name);
    std::vector<dt::var<gpu>> vars;
    for (auto& t : inputs) vars.push_back(dt::parameter(dt::to_device<gpu>(t)));
    dt::rng gen(5, "gradcheck-weights");
    const auto weights = dt::to_device<gpu>(dt::randn(f(vars).shape(), gen, dt::dtype::f64));
    auto objective = [&](const std::vector<dt::var<gpu>>& vs) { return dt::sum(dt::mul(f(vs), dt::var<gpu>(weights))); };
    objective(vars).backward();
    const double h = 1e-6;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const auto grad = host(vars[i].grad()).to_vector<double>();
      auto values = inputs[i].to_vector<double>();
      for (std::size_t j = 0; j < values.size(); ++j) {
        auto probe = [&](double delta) {
          auto moved = values;
          moved[j] += delta;
          std::vector<dt::var<gpu>> vs = vars;
          vs[i] = dt::var<gpu>(dt::to_device<gpu>(dt::from_vector(moved, inputs[i].shape())));
          return objective(vs).item();
        };
        const double numeric = (probe(h) - probe(-h)) / (2 * h);
        INFO("input " << i << " element " << j);
        CHECK(grad[j] == Approx(numeric).epsilon(1e-5).margin(1e-7));
      }
    }
  };
  const auto f64 = dt::dtype::f64;
  check("attention", {random(dt::shape{1, 6, 8}, 40, f64), random(dt::shape{1, 6, 8}, 41, f64),
                      random(dt::shape{1, 6, 8}, 42, f64)},
        [](const auto& x) { return dt::causal_attention(x[0], x[1], x[2], 2); });
  check("layer_norm", {random(dt::shape{3, 5}, 43, f64), random(dt::shape{5}, 44, f64), random(dt::shape{5}, 45, f64)},
        [](const auto& x) { return dt::layer_norm(x[0], x[1], x[2]); });
  check("add_layer_norm", {random(dt::shape{3, 5}, 48, f64), random(dt::shape{3, 5}, 49, f64),
                           random(dt::shape{5}, 44, f64), random(dt::shape{5}, 45, f64)},
        [](const auto& x) {
          auto [sum, normed] = dt::add_layer_norm(x[0], x[1], x[2], x[3]);
          return normed * sum;
        });
  check("gelu", {random(dt::shape{7}, 46, f64)}, [](const auto& x) { return dt::gelu(x[0]); });
  check("log_softmax", {random(dt::shape{2, 6}, 47, f64)}, [](const auto& x) { return dt::log_softmax(x[0]); });
}

TEST_CASE("cuda dropout makes the CPU's mask from the same key, forward and backward, in f32, f64 and bf16") {
  // The mask comes from one number of the rng and each value's index, so the devices agree to
  // the bit; 3 x 2^20 + 5 values: many blocks and a ragged end.
  for (const auto t : {dt::dtype::f32, dt::dtype::f64, dt::dtype::bf16})
    for (const std::int64_t n : {5, 3 * (1 << 20) + 5})
      check_against_cpu(dt::detail::concat("dropout ", dt::dtype_name(t), " of ", n), {random(dt::shape{n}, 61).to(t)},
                        [](auto& v) {
                          dt::rng gen(3, "cuda-dropout");
                          return dt::dropout(v[0], 0.3, gen);
                        },
                        0.0);
}

TEST_CASE("cuda bf16 storage: ops compute in f32 and round results like the CPU") {
  const auto x = random(dt::shape{4, 24, 64}, 50).to(dt::dtype::bf16);
  const auto w = random(dt::shape{64, 32}, 51, dt::dtype::f32, 0.2).to(dt::dtype::bf16);
  // Results are bf16 (8 bits of mantissa): 1 in 128 relative covers one rounding step.
  check_against_cpu("bf16 linear", {x, w}, [](auto& v) { return dt::linear(v[0], v[1]); }, 8e-3);
  check_against_cpu("bf16 gelu", {x}, [](auto& v) { return dt::gelu(v[0]); }, 8e-3);
  // On the GPU these kernels read and write bf16 themselves (kernels::native_bf16); the CPU
  // widens to f32 and rounds the result: the same arithmetic, one rounding each.
  static_assert(dt::kernels::native_bf16<gpu> && !dt::kernels::native_bf16<cpu>);
  const auto b = random(dt::shape{32}, 52).to(dt::dtype::bf16);
  check_against_cpu("bf16 linear with bias", {x, w, b}, [](auto& v) { return dt::linear(v[0], v[1], v[2]); }, 8e-3);
  check_against_cpu("bf16 sums", {x}, [](auto& v) { return dt::sum(v[0], {-1}, true) + dt::mean(v[0], {0, 1}); }, 8e-3);
  // x receives two bf16 gradients, added in f32 and rounded once on both devices.
  check_against_cpu("bf16 gradient accumulation", {x}, [](auto& v) { return dt::gelu(v[0]) + v[0]; }, 8e-3);
  // A shared left operand: its gradient sums the batch in f32 before the one rounding.
  const auto left = random(dt::shape{24, 64}, 53, dt::dtype::f32, 0.2).to(dt::dtype::bf16);
  const auto right = random(dt::shape{4, 64, 32}, 54).to(dt::dtype::bf16);
  check_against_cpu("bf16 shared-left matmul", {left, right}, [](auto& v) { return dt::matmul(v[0], v[1]); }, 8e-3);
  {
    const auto y = dt::math::matmul(dt::to_device<gpu>(left), dt::to_device<gpu>(right));
    CHECK(y.dtype() == dt::dtype::bf16);  // written by the GEMM in bf16, no f32 copy
  }
  // Mixed precision's residual step: an f32 stream plus a bf16 branch, normalised into bf16
  // (the GPU kernels read and write the bf16 themselves); `* sum` gives the stream a gradient
  // before the layer norm adds its share in place.
  {
    const auto stream = random(dt::shape{4, 24, 64}, 56), gain = random(dt::shape{64}, 57), shift = random(dt::shape{64}, 58);
    check_against_cpu("bf16 branch and output around an f32 layer norm", {stream, x, gain, shift}, [](auto& v) {
      auto [sum, normed] = dt::add_layer_norm(v[0], v[1], v[2], v[3], 1e-5, dt::dtype::bf16);
      return dt::cast(dt::layer_norm(sum, v[2], v[3], 1e-5, dt::dtype::bf16) * normed, dt::dtype::f32) * sum;
    }, 8e-3);
  }
  const auto logits = random(dt::shape{5, 7, 300}, 55, dt::dtype::f32, 3.0).to(dt::dtype::bf16);
  std::vector<std::int32_t> targets(35);
  for (std::size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<std::int32_t>((i * 41) % 300);
  targets[6] = -1;  // ignored
  const auto tc = dt::from_vector(targets, dt::shape{5, 7});
  auto lc = dt::parameter(logits.clone());
  auto lg = dt::parameter(dt::to_device<gpu>(logits));
  auto loss_c = dt::cross_entropy(lc, tc);
  auto loss_g = dt::cross_entropy(lg, dt::to_device<gpu>(tc));
  CHECK(loss_g.item() == Approx(loss_c.item()).epsilon(8e-3));
  loss_c.backward();
  loss_g.backward();
  REQUIRE(lg.grad().dtype() == dt::dtype::bf16);
  CHECK(normwise_error(host(lg.grad()), lc.grad()) <= 8e-3);
}

TEST_CASE("cuda optimizers and gradient clipping follow the CPU trajectory") {
  const auto w0 = random(dt::shape{40, 30}, 60), b0 = random(dt::shape{30}, 61);
  dt::parameter_list<cpu> pc;
  dt::parameter_list<gpu> pg;
  pc.add("w", dt::parameter(w0.clone()));
  pc.add("b", dt::parameter(b0.clone()));
  pg.add("w", dt::parameter(dt::to_device<gpu>(w0)));
  pg.add("b", dt::parameter(dt::to_device<gpu>(b0)));
  dt::optim::adamw<cpu> oc(pc, {.lr = 1e-2, .weight_decay = 0.1});
  dt::optim::adamw<gpu> og(pg, {.lr = 1e-2, .weight_decay = 0.1});
  for (int step = 0; step < 5; ++step) {
    const auto g = random(dt::shape{40, 30}, 70 + step), gb = random(dt::shape{30}, 80 + step);
    param_at(pc, 0).grad() = g.clone();
    param_at(pc, 1).grad() = gb.clone();
    param_at(pg, 0).grad() = dt::to_device<gpu>(g);
    param_at(pg, 1).grad() = dt::to_device<gpu>(gb);
    const double nc = dt::optim::clip_grad_norm(pc, 5.0);
    const double ng = dt::optim::clip_grad_norm(pg, 5.0);
    CHECK(ng == Approx(nc).epsilon(1e-6));
    oc.step();
    og.step();
  }
  CHECK(normwise_error(host(param_at(pg, 0).value()), param_at(pc, 0).value()) <= 1e-5);
  CHECK(normwise_error(host(param_at(pg, 1).value()), param_at(pc, 1).value()) <= 1e-5);
}

TEST_CASE("cuda linear_gelu through cuBLASLt epilogues (and the fallback) matches the CPU") {
  // Width 24 takes the GELU_AUX_BIAS epilogue (leading dimension a multiple of 8); width 13 the
  // fallback (bias kernel, GEMM, GELU kernel); f64 always the fallback.
  for (const std::int64_t width : {std::int64_t{24}, std::int64_t{13}}) {
    INFO("width " << width);
    const auto x = random(dt::shape{3, 17, 40}, 400), w = random(dt::shape{40, width}, 401, dt::dtype::f32, 0.2),
               b = random(dt::shape{width}, 402);
    check_against_cpu("linear_gelu with bias", {x, w, b}, [](auto& v) { return dt::linear_gelu(v[0], v[1], v[2]); });
    check_against_cpu("linear_gelu without bias", {x, w}, [](auto& v) { return dt::linear_gelu(v[0], v[1]); });
    check_against_cpu("linear (bias epilogue)", {x, w, b}, [](auto& v) { return dt::linear(v[0], v[1], v[2]); });
    const auto xd = random(dt::shape{5, 40}, 403, dt::dtype::f64), wd = random(dt::shape{40, width}, 404, dt::dtype::f64),
               bd = random(dt::shape{width}, 405, dt::dtype::f64);
    check_against_cpu("f64 linear_gelu", {xd, wd, bd}, [](auto& v) { return dt::linear_gelu(v[0], v[1], v[2]); }, 1e-12);
  }
  // bf16 operands (tensor cores, f32 accumulation) against the CPU's widened bf16.
  const auto x = random(dt::shape{64, 64}, 406, dt::dtype::bf16), w = random(dt::shape{64, 32}, 407, dt::dtype::bf16, 0.2),
             b = random(dt::shape{32}, 408, dt::dtype::bf16);
  check_against_cpu("bf16 linear_gelu", {x, w, b}, [](auto& v) { return dt::linear_gelu(v[0], v[1], v[2]); }, 1e-2);
}

TEST_CASE("cuda linear_gelu_linear (the MLP, DGELU epilogue in the backward) matches the CPU and the two ops") {
  // Hidden width 24 takes cuBLASLt's GELU_AUX_BIAS forward and DGELU backward epilogues; 13 the
  // fallbacks (GEMM, then the GELU backward kernel); f64 always the fallback.
  for (const std::int64_t hidden : {std::int64_t{24}, std::int64_t{13}}) {
    INFO("hidden " << hidden);
    const auto x = random(dt::shape{3, 17, 40}, 410), w1 = random(dt::shape{40, hidden}, 411, dt::dtype::f32, 0.2),
               b1 = random(dt::shape{hidden}, 412), w2 = random(dt::shape{hidden, 24}, 413, dt::dtype::f32, 0.2),
               b2 = random(dt::shape{24}, 414);
    check_against_cpu("linear_gelu_linear with biases", {x, w1, b1, w2, b2},
                      [](auto& v) { return dt::linear_gelu_linear(v[0], v[1], v[2], v[3], v[4]); });
    check_against_cpu("linear_gelu_linear without biases", {x, w1, w2}, [](auto& v) { return dt::linear_gelu_linear(v[0], v[1], v[2]); });
    // The GPU's fused op against its own two ops.
    std::vector<dt::var<gpu>> a, b;
    for (const auto& t : {x, w1, b1, w2, b2}) {
      a.push_back(dt::parameter(dt::to_device<gpu>(t)));
      b.push_back(dt::parameter(dt::to_device<gpu>(t)));
    }
    auto fused = dt::linear_gelu_linear(a[0], a[1], a[2], a[3], a[4]);
    auto split = dt::linear(dt::linear_gelu(b[0], b[1], b[2]), b[3], b[4]);
    CHECK(normwise_error(host(fused.value()), host(split.value())) <= 1e-6);
    const auto g = random(fused.shape(), 415);
    fused.backward(dt::to_device<gpu>(g));
    split.backward(dt::to_device<gpu>(g));
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("gradient of input " << i);
      CHECK(normwise_error(host(a[i].grad()), host(b[i].grad())) <= 1e-5);
    }
    const auto xd = random(dt::shape{5, 40}, 416, dt::dtype::f64), w1d = random(dt::shape{40, hidden}, 417, dt::dtype::f64),
               b1d = random(dt::shape{hidden}, 418, dt::dtype::f64), w2d = random(dt::shape{hidden, 8}, 419, dt::dtype::f64),
               b2d = random(dt::shape{8}, 420, dt::dtype::f64);
    check_against_cpu("f64 linear_gelu_linear", {xd, w1d, b1d, w2d, b2d},
                      [](auto& v) { return dt::linear_gelu_linear(v[0], v[1], v[2], v[3], v[4]); }, 1e-12);
  }
  // bf16 (tensor cores, the gradient of gelu's output never rounded to bf16) against the CPU's
  // widened bf16.
  const auto x = random(dt::shape{64, 64}, 421, dt::dtype::bf16), w1 = random(dt::shape{64, 128}, 422, dt::dtype::bf16, 0.2),
             b1 = random(dt::shape{128}, 423, dt::dtype::bf16), w2 = random(dt::shape{128, 64}, 424, dt::dtype::bf16, 0.2),
             b2 = random(dt::shape{64}, 425, dt::dtype::bf16);
  check_against_cpu("bf16 linear_gelu_linear", {x, w1, b1, w2, b2},
                    [](auto& v) { return dt::linear_gelu_linear(v[0], v[1], v[2], v[3], v[4]); }, 2e-2);
}

TEST_CASE("cuda linear_backward_through_gelu at a GPT-2 MLP's width, epilogue and fallback, against the CPU kernel") {
  // m = 512 rows, hidden n = 3072, k = 768: the shape (per 512 tokens) the bench runs. A pre
  // that starts 4 bytes into its buffer is below the epilogue's 16-byte alignment and takes the
  // fallback.
  const std::int64_t m = 512, n = 3072, k = 768;
  const auto g = random(dt::shape{m, k}, 430), w = random(dt::shape{n, k}, 431, dt::dtype::f32, 0.05),
             pre = random(dt::shape{m * n + 1}, 432);
  const auto gg = dt::to_device<gpu>(g), wg = dt::to_device<gpu>(w), pg = dt::to_device<gpu>(pre);
  for (const std::int64_t offset : {std::int64_t{0}, std::int64_t{1}}) {
    INFO("pre at element offset " << offset);
    auto want = dt::tensor<cpu>::empty(dt::shape{m, n});
    dt::kernels::linear_backward_through_gelu(cpu{}, m, n, k, g.data<float>(), w.data<float>(), pre.data<float>() + offset,
                                              want.data<float>());
    auto got = dt::tensor<gpu>::empty(dt::shape{m, n});
    dt::kernels::linear_backward_through_gelu(gpu{}, m, n, k, gg.data<float>(), wg.data<float>(), pg.data<float>() + offset,
                                              got.data<float>());
    CHECK(normwise_error(host(got), want) <= 1e-5);
  }
}

TEST_CASE("cuda multi-tensor AdamW and clipping over many tensors across launch batches and chunk edges") {
  // 45 tensors (more than one launch's 32), sizes at and around the 4096-element chunk, a
  // 1-element bias, vectors (no decay) and matrices (decay), and one parameter without a
  // gradient this step, which must stay untouched and keep its step count.
  const std::vector<dt::shape> shapes = {{1}, {7}, {4095}, {4096}, {4097}, {64, 64}, {65, 63}, {3, 8193}, {300}};
  dt::parameter_list<cpu> pc;
  dt::parameter_list<gpu> pg;
  for (int i = 0; i < 45; ++i) {
    const auto w = random(shapes[static_cast<std::size_t>(i) % shapes.size()], 200 + static_cast<std::uint64_t>(i));
    // (appended, not "p" + ...: g++ 12 warns falsely on that form at -O3, its bug 105329)
    const auto name = std::string("p").append(std::to_string(i));
    pc.add(name, dt::parameter(w.clone()));
    pg.add(name, dt::parameter(dt::to_device<gpu>(w)));
  }
  dt::optim::adamw<cpu> oc(pc, {.lr = 3e-3, .beta2 = 0.95, .weight_decay = 0.1});
  dt::optim::adamw<gpu> og(pg, {.lr = 3e-3, .beta2 = 0.95, .weight_decay = 0.1});
  for (int step = 0; step < 4; ++step) {
    for (std::size_t i = 0; i < 45; ++i) {
      if (i == 11 && step == 2) {  // no gradient this step
        param_at(pc, i).grad() = {};
        param_at(pg, i).grad() = {};
        continue;
      }
      const auto g = random(param_at(pc, i).shape(), 1000 + 100 * static_cast<std::uint64_t>(step) + i);
      param_at(pc, i).grad() = g.clone();
      param_at(pg, i).grad() = dt::to_device<gpu>(g);
    }
    const double nc = dt::optim::clip_grad_norm(pc, 10.0);
    const double ng = dt::optim::clip_grad_norm(pg, 10.0);
    CHECK(ng == Approx(nc).epsilon(1e-9));
    REQUIRE(nc > 10.0);  // so the gradients were scaled, every one in the same multi-tensor call
    for (std::size_t i = 0; i < 45; ++i) {  // AdamW hides a wrong scale (m / sqrt(v)): check it here
      if (!param_at(pc, i).grad().defined()) continue;
      INFO("gradient " << i << " after clipping");
      CHECK(normwise_error(host(param_at(pg, i).grad()), param_at(pc, i).grad()) <= 1e-6);
    }
    oc.step();
    og.step();
  }
  for (std::size_t i = 0; i < 45; ++i) {
    INFO("parameter " << i);
    CHECK(normwise_error(host(param_at(pg, i).value()), param_at(pc, i).value()) <= 1e-5);
  }
  const auto sc = oc.state();
  const auto sg = og.state();
  for (std::size_t i = 0; i < 45; ++i) {
    CHECK(sg[i].step == sc[i].step);
    CHECK(normwise_error(host(sg[i].exp_avg_sq), sc[i].exp_avg_sq) <= 1e-5);
  }
  CHECK(sc[11].step == 3);
}

TEST_CASE("cuda top_k (CUB radix sort) returns the CPU's values and positions, ties included") {
  for (const auto type : {dt::dtype::f32, dt::dtype::f64}) {
    INFO(dt::dtype_name(type));
    // Values rounded to 0.1 so that many tie; the order of ties must match too.
    auto x = random(dt::shape{100003}, 300, type);
    x = dt::from_vector(
        [&] {
          auto v = x.to_vector<double>();
          for (auto& e : v) e = std::round(e * 10.0) / 10.0;
          return v;
        }(),
        dt::shape{100003}, type);
    for (const std::int64_t k : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}, std::int64_t{100003}}) {
      INFO("k = " << k);
      const auto [vc, pc] = dt::math::top_k(x, k);
      const auto [vg, pg] = dt::math::top_k(dt::to_device<gpu>(x), k);
      CHECK(host(pg).to_vector<std::int32_t>() == pc.to_vector<std::int32_t>());
      CHECK(host(vg).to_vector<double>() == vc.to_vector<double>());
    }
  }
}

TEST_CASE("cuda GPT training tracks the CPU run's losses", "[slow]") {
  auto cfg = dt::nn::gpt_preset("tiny");
  dt::rng init_c(7, "init"), init_g(7, "init");
  dt::nn::gpt<cpu> mc(cfg, init_c);
  dt::nn::gpt<gpu> mg(cfg, init_g);
  dt::optim::adamw<cpu> oc(mc.parameters(), {.lr = 1e-3});
  dt::optim::adamw<gpu> og(mg.parameters(), {.lr = 1e-3});
  const auto corpus = dt::data::builtin_corpus();
  dt::data::byte_tokenizer tok;
  const auto tokens = tok.encode(corpus.substr(0, 100000));
  const std::int64_t B = 4, T = cfg.block_size;
  dt::rng batches(3, "batches");
  double first_c = 0, last_c = 0, last_g = 0;
  const int steps = 300;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::int32_t> x(B * T), y(B * T);
    for (std::int64_t b = 0; b < B; ++b) {
      const auto start = static_cast<std::int64_t>(batches.uniform() * static_cast<double>(tokens.size() - T - 1));
      for (std::int64_t t = 0; t < T; ++t) {
        x[b * T + t] = tokens[start + t];
        y[b * T + t] = tokens[start + t + 1];
      }
    }
    const auto xc = dt::from_vector(x, dt::shape{B, T}), yc = dt::from_vector(y, dt::shape{B, T});
    auto lc = mc.loss(xc, yc);
    auto lg = mg.loss(dt::to_device<gpu>(xc), dt::to_device<gpu>(yc));
    const double vc = lc.item(), vg = lg.item();
    if (step == 0) {
      first_c = vc;
      CHECK(vg == Approx(vc).epsilon(1e-5));
    }
    if (step < 10) CHECK(vg == Approx(vc).epsilon(1e-4));
    last_c = vc;
    last_g = vg;
    lc.backward();
    lg.backward();
    dt::optim::clip_grad_norm(mc.parameters(), 1.0);
    dt::optim::clip_grad_norm(mg.parameters(), 1.0);
    oc.step();
    og.step();
    for (auto& e : mc.parameters()) e.param.zero_grad();
    for (auto& e : mg.parameters()) e.param.zero_grad();
  }
  CHECK(last_c < first_c - 1.0);                    // the CPU run learned
  CHECK(last_g == Approx(last_c).epsilon(0.02));    // and the GPU run with it, within 2% at step 300
}

namespace {
// DiLoCo with H = 10 as a type, for TEMPLATE_TEST_CASE.
struct diloco_10 : dt::comm::diloco<> {
  diloco_10() { inner_steps = 10; }
};

template <class Device, class Comm>
std::vector<dt::train::fit_result> fit_two_peers(const dt::data::token_dataset& data, std::int64_t vocab) {
  using Trainer = dt::train::trainer<dt::nn::gpt<Device>, Comm>;
  dt::train::trainer_options opts;
  opts.steps = 40;
  opts.batch_size = 4;
  opts.eval_batches = 2;
  opts.lr = 3e-3;
  auto cfg = dt::nn::gpt_preset("tiny");
  cfg.vocab_size = vocab;
  return dt::train::fit_in_process<Trainer>(dt::transport::in_process(2), cfg, opts, data);
}
}  // namespace

TEMPLATE_TEST_CASE("cuda trainer: two peers on the GPU follow the CPU peers", "[slow]", dt::comm::sync_allreduce<>,
                   diloco_10) {
  const auto text = dt::data::builtin_corpus(std::size_t{1} << 16, 5);
  const auto tok = dt::data::char_tokenizer::from_text(text);
  const dt::data::token_dataset data(tok.encode(text));
  const auto on_cpu = fit_two_peers<cpu, TestType>(data, tok.vocab_size());
  const auto on_gpu = fit_two_peers<gpu, TestType>(data, tok.vocab_size());
  REQUIRE(on_gpu.size() == 2);
  // Same batches, same initialisation, same collectives: only float rounding differs.
  CHECK(on_gpu[0].final_val_loss == Approx(on_cpu[0].final_val_loss).epsilon(1e-3));
  CHECK(on_gpu[0].final_val_loss == on_gpu[1].final_val_loss);
  CHECK(on_gpu[0].last.policy_bytes_sent == on_cpu[0].last.policy_bytes_sent);
}

TEST_CASE("cuda pipeline: a GPT cut into two stages on the GPU trains as one GPU peer holding the whole model, 1F1B, ZB-H1 and ZB-V") {
  const auto text = dt::data::builtin_corpus(std::size_t{1} << 16, 5);
  const auto tok = dt::data::char_tokenizer::from_text(text);
  const dt::data::token_dataset data(tok.encode(text));
  dt::train::trainer_options opts;
  opts.steps = 10;
  opts.batch_size = 4;
  opts.eval_batches = 2;
  opts.grad_clip = 0.05;  // clips every step: the stages agree on the whole model's norm
  auto cfg = dt::nn::gpt_preset("tiny");
  cfg.vocab_size = tok.vocab_size();
  cfg.n_layer = 4;  // ZB-V cuts the model into 2 x 2 stages
  using Whole = dt::train::trainer<dt::nn::gpt<gpu>>;
  using Piped = dt::train::trainer<dt::nn::gpt<gpu>, dt::comm::sync_allreduce<>, dt::parallel::pipeline<>>;
  const auto whole = dt::train::fit_in_process<Whole>(dt::transport::in_process(1), cfg, opts, data);
  // ZB-H1 and ZB-V put the linear layers' weight gradients off (autograd/deferred.hpp) on the GPU.
  for (const char* schedule : {"1f1b", "zb-h1", "zb-v"}) {
    INFO(schedule);
    dt::parallel::pipeline<> pipe;
    pipe.stages = 2;
    pipe.micro_batches = 3;  // rows 2, 1, 1
    pipe.schedule = schedule;
    const auto piped = dt::train::fit_in_process<Piped>(dt::transport::in_process(2), cfg, opts, data, {}, {}, 1, pipe);
    REQUIRE(piped.size() == 2);
    for (const auto& r : piped) {
      CHECK(std::abs(r.final_val_loss - whole[0].final_val_loss) <= 1e-4);
      CHECK(r.last.grad_norm == Approx(whole[0].last.grad_norm).epsilon(1e-4));
    }
  }
}

TEST_CASE("cuda checkpoints: capture on the GPU, restore on the GPU and on the CPU") {
  auto cfg = dt::nn::gpt_preset("tiny");
  dt::rng init(3, "init");
  dt::nn::gpt<gpu> model(cfg, init);
  dt::optim::adamw<gpu> opt(model.parameters());
  const auto ids = dt::to_device<gpu>(dt::from_vector(std::vector<std::int32_t>(2 * 16, 7), dt::shape{2, 16}));
  model.loss(ids, ids).backward();
  opt.step();
  const auto c = dt::train::capture(model, opt, 1);
  dt::rng other(4, "init");
  dt::nn::gpt<gpu> restored(cfg, other);
  dt::optim::adamw<gpu> restored_opt(restored.parameters());
  CHECK(dt::train::restore(c, restored, restored_opt) == 1);
  dt::rng other_cpu(4, "init");
  dt::nn::gpt<cpu> on_cpu(cfg, other_cpu);
  dt::optim::adamw<cpu> cpu_opt(on_cpu.parameters());
  dt::train::restore(c, on_cpu, cpu_opt);
  auto a = model.parameters().begin(), b = restored.parameters().begin();
  auto h = on_cpu.parameters().begin();
  for (; a != model.parameters().end(); ++a, ++b, ++h) {
    INFO(a->name);
    const auto expected = host(a->param.value()).to_vector<float>();
    CHECK(host(b->param.value()).to_vector<float>() == expected);
    CHECK(h->param.value().to_vector<float>() == expected);
  }
}

TEST_CASE("cuda mixed precision: bf16 products on tensor cores track the CPU's bf16 emulation") {
  // On the GPU bf16 operands go to cuBLAS as bf16 (f32 accumulation); on the CPU they are
  // widened to f32 first. Both round products' inputs the same way, so they differ only in
  // summation order and in which results round to a neighbouring bf16 value.
  const auto x = random(dt::shape{4, 24, 64}, 90).to(dt::dtype::bf16), w = random(dt::shape{64, 48}, 91, dt::dtype::f32, 0.2).to(dt::dtype::bf16);
  check_against_cpu("bf16 matmul", {x, w}, [](auto& v) { return dt::matmul(v[0], v[1]); }, 8e-3);
  auto cfg = dt::nn::gpt_preset("tiny");
  dt::rng init_c(8, "init"), init_g(8, "init");
  dt::nn::gpt<cpu> mc(cfg, init_c);
  dt::nn::gpt<gpu> mg(cfg, init_g);
  mc.set_compute_dtype(dt::dtype::bf16);
  mg.set_compute_dtype(dt::dtype::bf16);
  std::vector<std::int32_t> ids(2 * 64);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 31) % 256);
  const auto xc = dt::from_vector(ids, dt::shape{2, 64});
  auto lc = mc.loss(xc, xc);
  auto lg = mg.loss(dt::to_device<gpu>(xc), dt::to_device<gpu>(xc));
  CHECK(lg.item() == Approx(lc.item()).epsilon(5e-3));
  lc.backward();
  lg.backward();
  auto a = mc.parameters().begin();
  for (auto b = mg.parameters().begin(); b != mg.parameters().end(); ++a, ++b) {
    INFO(a->name);
    CHECK(b->param.grad().dtype() == dt::dtype::f32);
    CHECK(normwise_error(host(b->param.grad()), a->param.grad()) <= 3e-2);
  }
}
