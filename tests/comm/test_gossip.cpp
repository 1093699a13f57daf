// Gossip: the topologies (consistent lists, the mean kept, the exact mean in log2 n rounds on the
// one-peer exponential graph, the spread narrowing on the others, one chosen by name), the
// trainer under gossip, resume, and what is refused.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "support/trainer_fixture.hpp"
#include "support/transport_harness.hpp"

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
}  // namespace

TEST_CASE("gossip: the one-peer exponential graph gives every replica the exact mean in log2 n rounds") {
  for (int n : {2, 4, 8, 16, 32, 64}) {
    INFO(n << " replicas");
    const int rounds = std::bit_width(static_cast<unsigned>(n - 1));
    const auto out = mix<dt::comm::topology::one_peer_exponential>(n, rounds);
    for (std::size_t i = 0; i < 8; ++i) {
      const double mean = (n - 1) * 4.0 + static_cast<double>(i);  // the mean of r * 8 + i over r
      for (const auto& replica : out.back()) CHECK(replica[i] == static_cast<float>(mean));
    }
    if (n > 2) CHECK(fixture::spread(out.front()) > 0);  // not before
  }
}

TEST_CASE("gossip: every round keeps the replicas' mean, and the spread narrows on a ring and on the exponential graph") {
  auto check = [](const auto& out, int n) {
    double before = 8.0 * (n - 1);  // the spread of the starting values
    for (const auto& round : out) {
      for (std::size_t i = 0; i < 8; ++i) CHECK(mean_of(round, i) == Approx((n - 1) * 4.0 + static_cast<double>(i)).epsilon(1e-6));
      const double s = fixture::spread(round);
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
  SECTION("one-peer exponential graph of 6 (not a power of two: the spread narrows, not to zero at once)") {
    check(mix<dt::comm::topology::one_peer_exponential>(6, 12), 6);
  }
}

TEST_CASE("gossip: the topologies name each replica's neighbours, none twice, none itself") {
  const dt::comm::topology::ring ring;
  CHECK(ring.receives_from(0, 5, 0) == std::vector<int>{4, 1});
  CHECK(ring.receives_from(1, 2, 0) == std::vector<int>{0});
  CHECK(ring.receives_from(0, 1, 0).empty());
  const dt::comm::topology::one_peer_exponential exp;
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

TEST_CASE("gossip: every graph's sends meet their receives, each peer names none twice nor itself, and in-degree equals out-degree") {
  const auto check_graph = [](const auto& topo) {
    for (int n = 1; n <= 17; ++n)
      for (std::int64_t t = 0; t < 7; ++t) {
        INFO(dt::comm::topology_name(topo) << ": " << n << " replicas, round " << t);
        std::vector<int> in(static_cast<std::size_t>(n), 0), out(static_cast<std::size_t>(n), 0);
        for (int i = 0; i < n; ++i) {
          const auto from = topo.receives_from(i, n, t), to = topo.sends_to(i, n, t);
          in[static_cast<std::size_t>(i)] = static_cast<int>(from.size());
          out[static_cast<std::size_t>(i)] = static_cast<int>(to.size());
          for (const auto* list : {&from, &to})
            for (std::size_t k = 0; k < list->size(); ++k) {
              const int j = (*list)[k];
              CHECK((j >= 0 && j < n && j != i));
              CHECK(std::count(list->begin(), list->end(), j) == 1);
            }
          for (int j : from) {
            const auto back = topo.sends_to(j, n, t);
            CHECK(std::find(back.begin(), back.end(), i) != back.end());
          }
        }
        // Equal weights are doubly stochastic only if every replica's in-degree is its out-degree
        // and all are equal (one idle replica of an odd pairing aside).
        for (int i = 0; i < n; ++i) CHECK(in[static_cast<std::size_t>(i)] == out[static_cast<std::size_t>(i)]);
        const auto most = *std::max_element(in.begin(), in.end());
        CHECK(std::count(in.begin(), in.end(), most) >= n - 1);
      }
  };
  check_graph(dt::comm::topology::ring{});
  check_graph(dt::comm::topology::torus{});
  check_graph(dt::comm::topology::exponential{});
  check_graph(dt::comm::topology::one_peer_exponential{});
  check_graph(dt::comm::topology::random{3});
  // The torus of 12 is 3 x 4; of 7 (prime), a ring; the static exponential graph of 6 reaches 1, 2, 4 ahead.
  CHECK(dt::comm::topology::torus::rows(12) == 3);
  CHECK(dt::comm::topology::torus{}.sends_to(5, 12, 0) == std::vector<int>{1, 9, 4, 6});
  CHECK(dt::comm::topology::torus{}.sends_to(0, 7, 0) == dt::comm::topology::ring{}.sends_to(0, 7, 0));
  CHECK(dt::comm::topology::exponential{}.sends_to(5, 6, 0) == std::vector<int>{0, 1, 3});
  CHECK(dt::comm::topology::exponential{}.receives_from(0, 6, 9) == std::vector<int>{5, 4, 2});
  // The random pairing changes with the round and the seed, and is the same for every caller.
  const dt::comm::topology::random a{1}, b{2};
  bool differs_by_round = false, differs_by_seed = false;
  for (std::int64_t t = 1; t < 8; ++t) {
    differs_by_round = differs_by_round || a.sends_to(0, 16, t) != a.sends_to(0, 16, 0);
    differs_by_seed = differs_by_seed || a.sends_to(0, 16, t) != b.sends_to(0, 16, t);
  }
  CHECK(differs_by_round);
  CHECK(differs_by_seed);
  CHECK(a.sends_to(3, 16, 5) == dt::comm::topology::random{1}.sends_to(3, 16, 5));
}

TEST_CASE("gossip: the torus, the static exponential graph and random pairings keep the mean and narrow the spread") {
  auto check = [](const auto& out, int n) {
    double before = 8.0 * (n - 1);
    for (const auto& round : out) {
      for (std::size_t i = 0; i < 8; ++i) CHECK(mean_of(round, i) == Approx((n - 1) * 4.0 + static_cast<double>(i)).epsilon(1e-6));
      const double s = fixture::spread(round);
      CHECK(s <= before + 1e-4);
      before = s;
    }
    CHECK(before < 0.05 * 8.0 * (n - 1));
  };
  SECTION("torus of 12 (3 x 4)") { check(mix<dt::comm::topology::torus>(12, 16), 12); }
  SECTION("static exponential graph of 6") { check(mix<dt::comm::topology::exponential>(6, 8), 6); }
  SECTION("static exponential graph of 16") { check(mix<dt::comm::topology::exponential>(16, 8), 16); }
  SECTION("random pairings of 8") { check(mix<dt::comm::topology::random>(8, 24), 8); }
}

TEST_CASE("gossip: a topology named at run time is the graph of that name, and an unknown name is refused listing them") {
  namespace topo = dt::comm::topology;
  const auto same = [](const auto& typed, const topo::named& by_name) {
    for (int n : {1, 2, 5, 8, 12})
      for (std::int64_t t = 0; t < 5; ++t)
        for (int i = 0; i < n; ++i) {
          CHECK(typed.sends_to(i, n, t) == by_name.sends_to(i, n, t));
          CHECK(typed.receives_from(i, n, t) == by_name.receives_from(i, n, t));
        }
  };
  same(topo::ring{}, topo::named::parse("ring"));
  same(topo::torus{}, topo::named::parse("torus"));
  same(topo::exponential{}, topo::named::parse("exponential"));
  same(topo::one_peer_exponential{}, topo::named::parse("one-peer-exponential"));
  auto r = topo::named::parse("random");
  r.seed = 9;
  same(topo::random{9}, r);
  CHECK(dt::comm::topology_name(r) == "random(seed=9)");
  CHECK(topo::named{}.which == "one-peer-exponential");  // the default: the graph gossip had alone before
  CHECK_THROWS_WITH(topo::named::parse("hypercube"),
                    Catch::Contains("unknown topology 'hypercube' (expected ring, torus, exponential, one-peer-exponential or random)"));
  // Peers on different graphs are refused before they pair sends with receives that never come.
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::gossip<topo::named>>;
  const auto opts = fixture::small_run(2);
  CHECK_THROWS_WITH(dt::transport::in_process(2).run([&](dt::transport::in_process::endpoint& ep) {
    dt::comm::gossip<topo::named> comm;
    comm.topology = topo::named::parse(ep.rank() == 0 ? "ring" : "torus");
    Trainer t(fixture::tiny_gpt(), opts, ep, comm);
    (void)t.fit(fixture::small_corpus().data);
  }),
                    Catch::Contains("the peers gossip differently (this one: gossip:"));
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
  // Four replicas on the one-peer exponential graph: they learn; they differ, but by far less than how
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
  // The consensus distance each peer reports at the last evaluation is the mean over the replicas
  // of ||x_i - mean||, computed here from their final parameters.
  std::vector<double> mean(four[0].size(), 0.0);
  for (const auto& replica : four)
    for (std::size_t i = 0; i < mean.size(); ++i) mean[i] += replica[i] / 4.0;
  double expected = 0;
  for (const auto& replica : four) {
    double squares = 0;
    for (std::size_t i = 0; i < mean.size(); ++i) squares += (replica[i] - mean[i]) * (replica[i] - mean[i]);
    expected += std::sqrt(squares) / 4.0;
  }
  REQUIRE(expected > 0);
  for (const auto& r : results) CHECK(r.evals.back().consensus_distance == Approx(expected).epsilon(1e-4));
  // Under local SGD the replicas are equal after every average: nothing is measured.
  std::vector<dt::train::fit_result> local;
  (void)fixture::final_params<local_trainer>(2, fixture::tiny_gpt(), opts, every_step, &local);
  CHECK(local[0].evals.back().consensus_distance == -1);
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

TEST_CASE("gossip: weighted, a round takes each replica's neighbourhood mean by the round weights and keeps the values weighted by them") {
  using Topology = dt::comm::topology::one_peer_exponential;
  const int n = 8;
  const std::vector<double> rw{1, 3, 2, 5, 0, 4, 2, 7};  // (replica 4 took no rows: it weighs nothing)
  auto round = [&](const std::vector<double>& weights, bool weighted) {
    std::vector<std::vector<float>> out(static_cast<std::size_t>(n));
    dt::transport::in_process(n).run([&](dt::transport::in_process::endpoint& ep) {
      dt::collective::communicator c(ep);
      std::vector<float> v(8), scratch;
      std::vector<double> sum;
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(c.rank() * 8 + static_cast<int>(i));
      const auto me = static_cast<std::size_t>(c.rank());
      dt::comm::gossip_round(Topology{}, c, 1, std::span<float>(v), scratch, sum,
                             weighted ? std::optional<double>(weights[me]) : std::nullopt);
      out[me] = v;
    });
    return out;
  };
  const auto after = round(rw, true);
  std::vector<double> kept(8, 0.0), weighted_sum(8, 0.0);
  for (int i = 0; i < n; ++i) {
    auto from = Topology{}.receives_from(i, n, 1);
    from.push_back(i);
    double den = 0;
    for (const int j : from) den += rw[static_cast<std::size_t>(j)];
    for (std::size_t k = 0; k < 8; ++k) {
      double num = 0;
      for (const int j : from) num += rw[static_cast<std::size_t>(j)] * (j * 8 + static_cast<double>(k));
      INFO("replica " << i << ", value " << k);
      CHECK(std::abs(after[static_cast<std::size_t>(i)][k] - num / den) < 1e-5 * num / den);
      // sum_i D_i x_i' with D_i = sum_j P_ij r_j (P: 1 / (d + 1) on the neighbourhood).
      kept[k] += den / static_cast<double>(from.size()) * after[static_cast<std::size_t>(i)][k];
      weighted_sum[k] += rw[static_cast<std::size_t>(i)] * (i * 8 + static_cast<double>(k));
    }
  }
  for (std::size_t k = 0; k < 8; ++k) CHECK(std::abs(kept[k] - weighted_sum[k]) < 1e-5 * weighted_sum[k]);
  // Equal weights: D-PSGD's round (to rounding); unequal ones move it.
  const auto equal = round(std::vector<double>(static_cast<std::size_t>(n), 2.5), true);
  const auto plain = round({}, false);
  for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) CHECK(fixture::max_abs_diff(equal[r], plain[r]) < 1e-5);
  CHECK(fixture::max_abs_diff(after[1], plain[1]) > 0.5);
}

TEST_CASE("gossip: weighted, a peer that sends a weight that is not finite and >= 0 is named") {
  std::vector<std::string> errors(2);
  dt::transport::in_process(2).run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator c(ep);
    std::vector<float> v(4, 1.0f), scratch;
    std::vector<double> sum;
    if (c.rank() == 1) {  // a hand-made message: weight -1, then values
      std::vector<float> m(6, 0.0f);
      const double weight = -1;
      std::memcpy(m.data(), &weight, sizeof weight);
      c.send_to(0, std::span<const float>(m));
      return;
    }
    try {
      dt::comm::gossip_round(dt::comm::topology::ring{}, c, 0, std::span<float>(v), scratch, sum, 1.0);
    } catch (const std::exception& e) {
      errors[0] = e.what();
    }
  });
  CHECK_THAT(errors[0], Catch::Contains("gossip: peer 1 sent the round weight -1"));
}

namespace {
// `policy` on 1 to 8 replicas under fault::elastic, in process and over TCP on 127.0.0.1 (a
// thread a peer, tests/support/transport_harness.hpp): each run learns, one stopped after step 1
// and resumed from the peers' checkpoints ends where the whole run does, bit for bit, and the TCP
// run ends where the in-process one does.
template <class Policy>
void trains_and_resumes_on_1_to_8(const Policy& policy) {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Policy, dt::parallel::data, dt::fault::elastic>;
  const auto opts = fixture::small_run(4);
  for (int n = 1; n <= 8; ++n) {
    INFO(n << " replicas");
    std::vector<dt::train::fit_result> results;
    const auto whole = fixture::final_params<Trainer>(n, fixture::tiny_gpt(), opts, policy, &results);
    const auto saved = fixture::stop_at<Trainer>(n, 1, fixture::tiny_gpt(), opts, policy);
    const auto resumed = fixture::resume_from<Trainer>(saved, fixture::tiny_gpt(), opts, policy);
    for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) {
      CHECK(resumed[r] == whole[r]);
      CHECK(results[r].final_val_loss < fixture::uniform_loss());
    }
    // Over TCP: the whole run, then one resumed from the in-process run's checkpoints.
    std::vector<std::vector<float>> over_tcp(static_cast<std::size_t>(n)), resumed_tcp(static_cast<std::size_t>(n));
    harness::tcp::run(n, [&](dt::transport::tcp& ep) {
      Trainer t(fixture::tiny_gpt(), opts, ep, policy);
      (void)t.fit(fixture::small_corpus().data);
      over_tcp[static_cast<std::size_t>(ep.rank())] = fixture::flat_params(t.model().parameters());
    });
    harness::tcp::run(n, [&](dt::transport::tcp& ep) {
      Trainer t(fixture::tiny_gpt(), opts, ep, policy);
      t.restore(saved[static_cast<std::size_t>(ep.rank())]);
      (void)t.fit(fixture::small_corpus().data);
      resumed_tcp[static_cast<std::size_t>(ep.rank())] = fixture::flat_params(t.model().parameters());
    });
    for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) {
      CHECK(over_tcp[r] == whole[r]);
      CHECK(resumed_tcp[r] == whole[r]);
    }
  }
}
}  // namespace

// (AD-PSGD's: tests/comm/test_ad_psgd.cpp, in the deterministic simulator; every policy from the
// command line in --peers, TCP and MPI modes: tests/cli/test_cli.cpp.)
TEST_CASE("every decentralized policy trains 1 to 8 replicas under fault::elastic, in process and over TCP, and resumes bit for bit") {
  namespace topo = dt::comm::topology;
  SECTION("gossip") { trains_and_resumes_on_1_to_8(dt::comm::gossip<>{}); }
  SECTION("gossip, weighted") {
    dt::comm::gossip<topo::exponential> g;
    g.weighted = true;
    trains_and_resumes_on_1_to_8(g);
  }
  SECTION("push-sum, overlapped, weighted") {
    dt::comm::push_sum<> p;
    p.overlap = p.weighted = true;
    trains_and_resumes_on_1_to_8(p);
  }
  SECTION("choco") { trains_and_resumes_on_1_to_8(dt::comm::choco<>{}); }
  SECTION("moshpit") {
    dt::comm::moshpit<> m;
    m.grid.group_size = 2;
    trains_and_resumes_on_1_to_8(m);
  }
}
