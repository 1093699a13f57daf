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

namespace {
// DiLoCo on `sites.size()` in-process replicas, replica r at sites[r] (or none, `flat`); each
// replica's parameters at its last evaluation, or the error each threw, and the bytes sent
// between replicas of different sites.
template <class Codec = dt::compress::identity>
std::vector<std::vector<float>> diloco_at_sites(const std::vector<std::string>& sites, dt::comm::diloco<dt::comm::outer::nesterov, Codec> comm,
                                                std::vector<std::string>* errors = nullptr, std::uint64_t* across = nullptr,
                                                bool flat = false, std::vector<std::vector<float>>* after_step_1 = nullptr,
                                                std::uint64_t* inside = nullptr) {
  using trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<dt::comm::outer::nesterov, Codec>>;
  const int n = static_cast<int>(sites.size());
  std::vector<std::vector<float>> params(sites.size());
  if (errors) errors->assign(sites.size(), "");
  if (across) *across = 0;
  if (inside) *inside = 0;
  dt::transport::in_process net(n);
  net.run([&](dt::transport::in_process::endpoint& ep) {
    auto mine = comm;
    if (!flat) mine.site = sites[static_cast<std::size_t>(ep.rank())];
    try {
      trainer t(fixture::tiny_gpt(), fixture::small_run(12), ep, mine);
      t.on_eval([&](const dt::train::eval_point&) { params[static_cast<std::size_t>(ep.rank())] = fixture::flat_params(t.model().parameters()); });
      if (after_step_1) {
        after_step_1->resize(sites.size());
        t.on_step([&](const dt::train::step_metrics& m) {
          if (m.step == 2) (*after_step_1)[static_cast<std::size_t>(ep.rank())] = fixture::flat_params(t.model().parameters());
        });
      }
      (void)t.fit(fixture::small_corpus().data);
    } catch (const std::exception& e) {
      if (!errors) throw;
      (*errors)[static_cast<std::size_t>(ep.rank())] = e.what();
    }
  });
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      const bool apart = sites[static_cast<std::size_t>(a)] != sites[static_cast<std::size_t>(b)];
      if (across && apart) *across += net.bytes_sent(a, b);
      if (inside && !apart) *inside += net.bytes_sent(a, b);
    }
  return params;
}
}  // namespace

TEST_CASE("trainer: DiLoCo averaged over sites by the two-level all-reduce is DiLoCo's all-reduce, through a codec too") {
  using diloco_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>>;
  dt::comm::diloco<> flat;
  flat.inner_steps = 3;
  const auto reference = fixture::final_params<diloco_trainer>(4, fixture::tiny_gpt(), fixture::small_run(12), flat);
  // Two sites, ranks interleaved; and sites of 3 and 1.
  // The tiny model's all-reduce is small enough for the flat run to double recursively, whose
  // first exchange sends each replica's whole vector to the other site in a, b, a, b; by sites
  // each replica sends half of it across.
  for (const auto& sites : std::vector<std::vector<std::string>>{{"a", "b", "a", "b"}, {"x", "x", "y", "x"}}) {
    std::uint64_t across = 0, flat_across = 0;
    const auto by_sites = diloco_at_sites(sites, flat, nullptr, &across);
    (void)diloco_at_sites(sites, flat, nullptr, &flat_across, true);
    INFO(sites[1] << ": " << across << " bytes between sites, " << flat_across << " flat");
    for (std::size_t r = 0; r < 4; ++r) {
      CHECK(by_sites[r] == by_sites[0]);  // the same bits on every replica
      CHECK(fixture::max_abs_diff(by_sites[r], reference[r]) < 1e-5);
    }
    if (sites[1] == "b") CHECK(static_cast<double>(across) < 0.6 * static_cast<double>(flat_across));
  }
  // int8 across sites: every replica still ends alike, near the f32 run.
  dt::comm::diloco<dt::comm::outer::nesterov, dt::compress::int8_blockwise> int8;
  int8.inner_steps = 3;
  const auto coded = diloco_at_sites({"a", "a", "b", "b"}, int8);
  for (std::size_t r = 0; r < 4; ++r) {
    CHECK(coded[r] == coded[0]);
    CHECK(fixture::relative_diff(coded[r], reference[r]) < 0.05);
  }
}

TEST_CASE("trainer: synchronous training averaged over sites is synchronous training, with fewer bytes between the sites") {
  using sync_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::sync_allreduce<>>;
  const std::vector<std::string> sites = {"a", "b", "a", "b"};
  auto run = [&](bool by_sites, std::uint64_t& across) {
    std::vector<std::vector<float>> params(sites.size());
    dt::transport::in_process net(4);
    net.run([&](dt::transport::in_process::endpoint& ep) {
      dt::comm::sync_allreduce<> comm;
      if (by_sites) comm.site = sites[static_cast<std::size_t>(ep.rank())];
      sync_trainer t(fixture::tiny_gpt(), fixture::small_run(8), ep, comm);
      t.on_eval([&](const dt::train::eval_point&) { params[static_cast<std::size_t>(ep.rank())] = fixture::flat_params(t.model().parameters()); });
      (void)t.fit(fixture::small_corpus().data);
    });
    across = 0;
    for (int a = 0; a < 4; ++a)
      for (int b = 0; b < 4; ++b)
        if (sites[static_cast<std::size_t>(a)] != sites[static_cast<std::size_t>(b)]) across += net.bytes_sent(a, b);
    return params;
  };
  std::uint64_t flat_across = 0, by_sites_across = 0;
  const auto flat = run(false, flat_across), by_sites = run(true, by_sites_across);
  INFO(by_sites_across << " bytes between sites by sites, " << flat_across << " flat");
  for (std::size_t r = 0; r < 4; ++r) {
    CHECK(by_sites[r] == by_sites[0]);
    CHECK(fixture::max_abs_diff(by_sites[r], flat[r]) < 1e-5);
  }
  CHECK(static_cast<double>(by_sites_across) < 0.6 * static_cast<double>(flat_across));
}

TEST_CASE("trainer: DiLoCo synchronous inside each site trains a site as one replica, and only the outer average crosses") {
  dt::comm::diloco<> plain;
  plain.inner_steps = 3;
  auto synced = plain;
  synced.sync_inside_site = true;
  const std::vector<std::string> sites = {"a", "b", "a", "b"};
  std::uint64_t plain_across = 0, plain_inside = 0, synced_across = 0, synced_inside = 0;
  std::vector<std::vector<float>> mid, plain_mid;
  const auto end = diloco_at_sites(sites, synced, nullptr, &synced_across, false, &mid, &synced_inside);
  (void)diloco_at_sites(sites, plain, nullptr, &plain_across, false, &plain_mid, &plain_inside);
  INFO("across: " << synced_across << " B synchronous inside, " << plain_across << " B not; inside: " << synced_inside << " B, "
                  << plain_inside << " B");
  // Mid-round (after step 1 of 3), the members of a site hold the same parameters, the sites not.
  CHECK(mid[0] == mid[2]);
  CHECK(mid[1] == mid[3]);
  CHECK(mid[0] != mid[1]);
  CHECK(plain_mid[0] != plain_mid[2]);  // (without it, every replica steps alone)
  for (const auto& p : end) CHECK(p == end[0]);
  // The gradients stay inside the sites: what crosses is the outer average's (a site's members
  // hold the same pseudo-gradient, so its step 1 sends nothing), no more than without.
  CHECK(synced_across <= plain_across);
  CHECK(synced_inside > 3 * plain_inside);
}

TEST_CASE("trainer: DiLoCo over sites refuses replicas without one and settings it cannot average") {
  dt::comm::diloco<> comm;
  comm.inner_steps = 3;
  std::vector<std::string> errors;
  (void)diloco_at_sites({"a", "", "b", "b"}, comm, &errors);
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("the peers combine contributions differently"));
  comm.weighted = true;
  (void)diloco_at_sites({"a", "a"}, comm, &errors);
  CHECK_THAT(errors[0], Catch::Contains("averaging over sites (site 'a') is one plain mean; set it without weighted"));
  comm.weighted = false;
  (void)diloco_at_sites({"a", std::string(64, 'b')}, comm, &errors);
  CHECK_THAT(errors[1], Catch::Contains("site names are at most 63 bytes, got 64"));
  dt::comm::diloco<dt::comm::outer::nesterov, dt::compress::top_k> sparse;
  (void)diloco_at_sites({"a", "b"}, sparse, &errors);
  CHECK_THAT(errors[0], Catch::Contains("a sparse codec's cannot be"));
  comm.sync_inside_site = true;
  (void)diloco_at_sites({"a", "a"}, comm, &errors, nullptr, true);
  CHECK_THAT(errors[0], Catch::Contains("sync_inside_site averages the gradients inside this replica's site, and it names none"));
}
