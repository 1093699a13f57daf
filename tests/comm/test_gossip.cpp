// Gossip: the topologies' mixing (the mean kept, the exact mean in log2 n rounds on the
// exponential graph, the spread narrowing on a ring), the trainer under gossip, resume, and what
// is refused.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "support/trainer_fixture.hpp"

namespace dt = decentrain;
using dt::train::trainer_options;

namespace {

// `rounds` gossip rounds on `n` in-process replicas, replica r starting from values r * 8 + i;
// returns each replica's values after every round ([round][replica][i]).
template <class Topology>
std::vector<std::vector<std::vector<float>>> mix(int n, int rounds, std::size_t size = 8) {
  std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(rounds),
                                                   std::vector<std::vector<float>>(static_cast<std::size_t>(n)));
  dt::transport::in_process(n).run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator c(ep);
    std::vector<float> v(size), scratch;
    std::vector<double> sum;
    for (std::size_t i = 0; i < size; ++i) v[i] = static_cast<float>(c.rank() * 8 + static_cast<int>(i));
    for (int t = 0; t < rounds; ++t) {
      dt::comm::gossip_round(Topology{}, c, t, std::span<float>(v), scratch, sum);
      out[static_cast<std::size_t>(t)][static_cast<std::size_t>(c.rank())] = v;
    }
  });
  return out;
}

double mean_of(const std::vector<std::vector<float>>& replicas, std::size_t i) {
  double s = 0;
  for (const auto& r : replicas) s += r[i];
  return s / static_cast<double>(replicas.size());
}
double spread(const std::vector<std::vector<float>>& replicas) {
  double most = 0;
  for (const auto& a : replicas)
    for (const auto& b : replicas) most = std::max(most, static_cast<double>(fixture::max_abs_diff(a, b)));
  return most;
}

}  // namespace

TEST_CASE("gossip: the one-peer exponential graph gives every replica the exact mean in log2 n rounds") {
  for (int n : {2, 4, 8}) {
    INFO(n << " replicas");
    const int rounds = std::bit_width(static_cast<unsigned>(n - 1));
    const auto out = mix<dt::comm::topology::exponential>(n, rounds);
    for (std::size_t i = 0; i < 8; ++i) {
      const double mean = (n - 1) * 4.0 + static_cast<double>(i);  // the mean of r * 8 + i over r
      for (const auto& replica : out.back()) CHECK(replica[i] == static_cast<float>(mean));
    }
    if (n > 2) CHECK(spread(out.front()) > 0);  // not before
  }
}

TEST_CASE("gossip: every round keeps the replicas' mean, and the spread narrows on a ring and on the exponential graph") {
  auto check = [](const auto& out, int n) {
    double before = 8.0 * (n - 1);  // the spread of the starting values
    for (const auto& round : out) {
      for (std::size_t i = 0; i < 8; ++i) CHECK(mean_of(round, i) == Approx((n - 1) * 4.0 + static_cast<double>(i)).epsilon(1e-6));
      const double s = spread(round);
      CHECK(s <= before);
      before = s;
    }
    CHECK(before < 0.05 * 8.0 * (n - 1));
  };
  SECTION("ring of 5") { check(mix<dt::comm::topology::ring>(5, 12), 5); }
  SECTION("ring of 3: everyone is a neighbour, one round is the mean") {
    const auto out = mix<dt::comm::topology::ring>(3, 1);
    for (const auto& replica : out[0]) CHECK(replica[0] == Approx(8.0f));
  }
  SECTION("exponential graph of 6 (not a power of two: the spread narrows, not to zero at once)") {
    check(mix<dt::comm::topology::exponential>(6, 12), 6);
  }
}

TEST_CASE("gossip: the topologies name each replica's neighbours, none twice, none itself") {
  const dt::comm::topology::ring ring;
  CHECK(ring.receives_from(0, 5, 0) == std::vector<int>{4, 1});
  CHECK(ring.receives_from(1, 2, 0) == std::vector<int>{0});
  CHECK(ring.receives_from(0, 1, 0).empty());
  const dt::comm::topology::exponential exp;
  // 6 replicas: hops 1, 2, 4, then 1 again.
  CHECK(exp.sends_to(5, 6, 0) == std::vector<int>{0});
  CHECK(exp.sends_to(5, 6, 1) == std::vector<int>{1});
  CHECK(exp.sends_to(5, 6, 2) == std::vector<int>{3});
  CHECK(exp.sends_to(5, 6, 3) == std::vector<int>{0});
  CHECK(exp.receives_from(1, 6, 2) == std::vector<int>{3});
  // In every round, j sends to i exactly when i receives from j: the sends meet their receives.
  for (int n : {2, 3, 5, 6, 8})
    for (std::int64_t t = 0; t < 6; ++t)
      for (int i = 0; i < n; ++i)
        for (int j : exp.receives_from(i, n, t)) {
          const auto to = exp.sends_to(j, n, t);
          CHECK(std::find(to.begin(), to.end(), i) != to.end());
        }
}

namespace {
// A topology that names the replica itself: refused, naming the topology.
struct self_loop {
  static constexpr const char* name = "self-loop";
  std::vector<int> receives_from(int rank, int, std::int64_t) const { return {rank}; }
  std::vector<int> sends_to(int rank, int, std::int64_t) const { return {rank}; }
};
static_assert(dt::comm::check_topology<self_loop>());
}  // namespace

TEST_CASE("gossip: a topology that names the replica itself is refused, naming it") {
  CHECK_THROWS_WITH(mix<self_loop>(3, 1), Catch::Contains("topology 'self-loop' names peer") && Catch::Contains("itself"));
}

TEST_CASE("trainer: gossip trains, its replicas stay close, two replicas on a ring are local SGD") {
  using ring_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::gossip<dt::comm::topology::ring>>;
  using exp_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::gossip<>>;
  using local_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::local_sgd<>>;
  auto opts = fixture::small_run(30);
  // Two replicas: each round averages the two, as local SGD's all-reduce does (summed in another
  // order: equal to rounding).
  dt::comm::local_sgd<> every_step;
  every_step.inner_steps = 1;
  const auto ring2 = fixture::final_params<ring_trainer>(2, fixture::tiny_gpt(), opts);
  const auto local2 = fixture::final_params<local_trainer>(2, fixture::tiny_gpt(), opts, every_step);
  CHECK(fixture::max_abs_diff(ring2[0], ring2[1]) == 0.0f);
  CHECK(fixture::max_abs_diff(ring2[0], local2[0]) < 1e-4f);
  // Four replicas on the exponential graph: they learn; they differ, but by far less than how
  // far training moved them.
  std::vector<dt::train::fit_result> results;
  const auto four = fixture::final_params<exp_trainer>(4, fixture::tiny_gpt(), opts, {}, &results);
  std::vector<float> start;  // the model every replica started from
  dt::transport::in_process(1).run([&](dt::transport::in_process::endpoint& ep) {
    exp_trainer t(fixture::tiny_gpt(), opts, ep);
    start = fixture::flat_params(t.model().parameters());
  });
  for (int r = 0; r < 4; ++r) {
    INFO("replica " << r);
    CHECK(results[static_cast<std::size_t>(r)].final_val_loss < fixture::uniform_loss());
    CHECK(fixture::max_abs_diff(four[static_cast<std::size_t>(r)], four[0]) <
          0.1f * fixture::max_abs_diff(four[static_cast<std::size_t>(r)], start));
  }
  CHECK(four[1] != four[0]);  // gossip does not make them equal between rounds
}

TEST_CASE("trainer: a gossip run resumed mid-run from per-peer checkpoints matches the uninterrupted run") {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::gossip<>>;
  auto opts = fixture::small_run(12);
  dt::comm::gossip<> comm;
  comm.inner_steps = 2;
  const auto whole = fixture::final_params<Trainer>(4, fixture::tiny_gpt(), opts, comm);
  const auto saved = fixture::stop_at<Trainer>(4, 5, fixture::tiny_gpt(), opts, comm);
  const auto resumed = fixture::resume_from<Trainer>(saved, fixture::tiny_gpt(), opts, comm);
  for (std::size_t r = 0; r < 4; ++r) CHECK(resumed[r] == whole[r]);
}

TEST_CASE("trainer: gossip refuses peers that gossip differently, and inner_steps < 1") {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::gossip<>>;
  const auto opts = fixture::small_run(2);
  CHECK_THROWS_WITH(dt::transport::in_process(2).run([&](dt::transport::in_process::endpoint& ep) {
    dt::comm::gossip<> comm;
    comm.inner_steps = ep.rank() == 0 ? 1 : 2;
    Trainer t(fixture::tiny_gpt(), opts, ep, comm);
    (void)t.fit(fixture::small_corpus().data);
  }),
                    Catch::Contains("the peers gossip differently"));
  dt::comm::gossip<> zero;
  zero.inner_steps = 0;
  CHECK_THROWS_WITH(fixture::final_params<Trainer>(1, fixture::tiny_gpt(), opts, zero), Catch::Contains("inner_steps must be >= 1"));
}
