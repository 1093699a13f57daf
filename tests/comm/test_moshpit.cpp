// Moshpit averaging: the grid's groups, the exact mean in d rounds for N = M^d (weighted too),
// convergence where the grid has holes, the trainer under the moshpit policy and under DiLoCo
// with Moshpit outer averaging, resume, and refused settings.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "support/trainer_fixture.hpp"

namespace dt = decentrain;

namespace {

// `averages` Moshpit averages on n in-process replicas, replica r starting from r * 8 + i; with
// `weighted`, replica r weighs r + 1. Each replica's values after the last.
std::vector<std::vector<float>> average(int n, dt::comm::moshpit_grid grid, int averages, bool weighted = false) {
  std::vector<std::vector<float>> out(static_cast<std::size_t>(n));
  dt::transport::in_process(n).run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator c(ep);
    dt::comm::moshpit_averager averager;
    dt::compress::identity codec;
    dt::collective::mean mean;
    std::vector<float> v(4);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(c.rank() * 8 + static_cast<int>(i));
    for (int a = 0; a < averages; ++a) {
      std::optional<double> w;
      if (weighted) w = c.rank() + 1.0;
      averager.average(grid, codec, mean, c, std::span<float>(v), a * grid.rounds_per_average(n), w);
    }
    out[static_cast<std::size_t>(c.rank())] = v;
  });
  return out;
}

}  // namespace

TEST_CASE("moshpit: the grid's groups share every coordinate but the round's") {
  const dt::comm::moshpit_grid g{.group_size = 4};
  CHECK(g.dims(1) == 1);
  CHECK(g.dims(4) == 1);
  CHECK(g.dims(5) == 2);
  CHECK(g.dims(16) == 2);
  CHECK(g.dims(64) == 3);
  CHECK(g.group_of(6, 16, 0) == std::vector<int>{4, 5, 6, 7});    // along the first digit
  CHECK(g.group_of(6, 16, 1) == std::vector<int>{2, 6, 10, 14});  // along the second
  CHECK(g.group_of(6, 16, 2) == g.group_of(6, 16, 0));
  CHECK(g.group_of(9, 10, 0) == std::vector<int>{8, 9});  // a hole: the group shrinks
  CHECK(g.group_of(1, 10, 1) == std::vector<int>{1, 5, 9});
  CHECK(g.rounds_per_average(16) == 2);
  CHECK(dt::comm::moshpit_grid{.group_size = 4, .rounds = 1}.rounds_per_average(16) == 1);
}

TEST_CASE("moshpit: d rounds give every replica the exact mean for N = M^d, weighted or not") {
  for (const auto& [m, n] : std::vector<std::pair<int, int>>{{2, 8}, {3, 9}, {4, 16}, {2, 16}, {4, 64}}) {
    INFO("group size " << m << ", " << n << " replicas");
    const auto out = average(n, {.group_size = m}, 1);
    for (const auto& v : out)
      for (std::size_t i = 0; i < v.size(); ++i) CHECK(v[i] == Approx((n - 1) * 4.0 + static_cast<double>(i)).epsilon(1e-6));
    // Fewer rounds than dimensions: not yet.
    CHECK(fixture::spread(average(n, {.group_size = m, .rounds = 1}, 1)) > 1);
    // Weighted by r + 1: the weighted mean, sum (r + 1)(8r + i) / sum (r + 1).
    const auto w = average(n, {.group_size = m}, 1, true);
    double num = 0, den = 0;
    for (int r = 0; r < n; ++r) {
      num += (r + 1.0) * 8.0 * r;
      den += r + 1.0;
    }
    for (const auto& v : w)
      for (std::size_t i = 0; i < v.size(); ++i) CHECK(v[i] == Approx(num / den + static_cast<double>(i)).epsilon(1e-5));
  }
}

TEST_CASE("moshpit: a grid with holes keeps the mean and converges to it") {
  for (const int n : {5, 10, 13}) {
    INFO(n << " replicas in groups of 4");
    const auto once = average(n, {.group_size = 4}, 1);
    const auto more = average(n, {.group_size = 4}, 12);
    CHECK(fixture::spread(once) > 1e-3);  // not exact in d rounds
    CHECK(fixture::spread(more) < 1e-3 * fixture::spread(average(n, {.group_size = 4}, 0)));
    for (std::size_t i = 0; i < 4; ++i) {
      double mean = 0;
      for (const auto& v : more) mean += v[i];
      CHECK(mean / n == Approx((n - 1) * 4.0 + static_cast<double>(i)).epsilon(1e-5));
    }
  }
}

TEST_CASE("trainer: the moshpit policy with the whole grid's rounds is local SGD, and DiLoCo's Moshpit outer averaging is its all-reduce") {
  using moshpit_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::moshpit<>>;
  using local_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::local_sgd<>>;
  using diloco_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>>;
  const auto opts = fixture::small_run(12);
  dt::comm::moshpit<> mosh;
  mosh.inner_steps = 3;
  mosh.grid.group_size = 2;  // 4 replicas: a 2 x 2 grid
  dt::comm::local_sgd<> local;
  local.inner_steps = 3;
  std::vector<dt::train::fit_result> results;
  const auto a = fixture::final_params<moshpit_trainer>(4, fixture::tiny_gpt(), opts, mosh, &results);
  const auto b = fixture::final_params<local_trainer>(4, fixture::tiny_gpt(), opts, local);
  for (std::size_t r = 0; r < 4; ++r) {
    CHECK(fixture::max_abs_diff(a[r], b[r]) < 1e-5);
    CHECK(results[r].final_val_loss < fixture::uniform_loss());
  }
  // One round an average: the replicas differ, and the consensus distance says by how much.
  mosh.grid.rounds = 1;
  const auto c = fixture::final_params<moshpit_trainer>(4, fixture::tiny_gpt(), opts, mosh, &results);
  CHECK(c[0] != c[3]);
  CHECK(results[0].evals.back().consensus_distance > 0);

  dt::comm::diloco<> all, grid;
  all.inner_steps = grid.inner_steps = 3;
  grid.moshpit = dt::comm::moshpit_grid{.group_size = 2};
  const auto d = fixture::final_params<diloco_trainer>(4, fixture::tiny_gpt(), opts, all);
  const auto e = fixture::final_params<diloco_trainer>(4, fixture::tiny_gpt(), opts, grid);
  for (std::size_t r = 0; r < 4; ++r) CHECK(fixture::max_abs_diff(d[r], e[r]) < 1e-5);
  // Five replicas in groups of 2 (a grid with holes): the replicas differ a little, and learn.
  std::vector<dt::train::fit_result> holes;
  (void)fixture::final_params<diloco_trainer>(5, fixture::tiny_gpt(), opts, grid, &holes);
  for (const auto& r : holes) CHECK(r.final_val_loss < fixture::uniform_loss());
}

TEST_CASE("trainer: moshpit and DiLoCo with Moshpit averaging resume mid-run bit for bit") {
  using moshpit_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::moshpit<>>;
  using diloco_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>>;
  const auto opts = fixture::small_run(12);
  dt::comm::moshpit<> mosh;
  mosh.inner_steps = 2;
  mosh.grid = {.group_size = 2, .rounds = 1};
  const auto whole = fixture::final_params<moshpit_trainer>(5, fixture::tiny_gpt(), opts, mosh);
  const auto resumed = fixture::resume_from<moshpit_trainer>(fixture::stop_at<moshpit_trainer>(5, 4, fixture::tiny_gpt(), opts, mosh),
                                                             fixture::tiny_gpt(), opts, mosh);
  for (std::size_t r = 0; r < 5; ++r) CHECK(resumed[r] == whole[r]);
  dt::comm::diloco<> grid;
  grid.inner_steps = 3;
  grid.moshpit = dt::comm::moshpit_grid{.group_size = 2};
  const auto d_whole = fixture::final_params<diloco_trainer>(4, fixture::tiny_gpt(), opts, grid);
  const auto d_resumed = fixture::resume_from<diloco_trainer>(fixture::stop_at<diloco_trainer>(4, 4, fixture::tiny_gpt(), opts, grid),
                                                              fixture::tiny_gpt(), opts, grid);
  for (std::size_t r = 0; r < 4; ++r) CHECK(d_resumed[r] == d_whole[r]);
}

TEST_CASE("trainer: moshpit refuses groups of fewer than 2 and peers that average differently") {
  using moshpit_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::moshpit<>>;
  using diloco_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>>;
  const auto opts = fixture::small_run(2);
  dt::comm::moshpit<> one;
  one.grid.group_size = 1;
  CHECK_THROWS_WITH(fixture::final_params<moshpit_trainer>(1, fixture::tiny_gpt(), opts, one), Catch::Contains("group_size must be >= 2"));
  std::vector<std::string> errors(2);
  dt::transport::in_process(2).run([&](dt::transport::in_process::endpoint& ep) {
    dt::comm::diloco<> comm;
    if (ep.rank() == 1) comm.moshpit = dt::comm::moshpit_grid{};
    try {
      diloco_trainer t(fixture::tiny_gpt(), opts, ep, comm);
      (void)t.fit(fixture::small_corpus().data);
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(ep.rank())] = e.what();
    }
  });
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("the peers combine contributions differently"));
}
