// AD-PSGD (asynchronous gossip): pairwise exchanges keep the replicas' sum and bring them to
// the mean; a peer 4x slower leaves the others' step rate where it was (sync all-reduce waits for
// it); a run resumed from a drain is bit for bit the uninterrupted one (deterministic
// simulator); a malformed message is named; graphs and settings that cannot work are refused.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "support/trainer_fixture.hpp"

namespace dt = decentrain;

namespace {

// A deterministic simulation of `n` peers on `links`, computing 1 simulated second a step at
// the given speeds (none: all 1).
dt::transport::in_process simulated(dt::transport::link_matrix links, std::vector<double> speeds = {}) {
  dt::transport::in_process::options o;
  o.deterministic = dt::transport::in_process::deterministic_run{.step_seconds = 1.0};
  o.speeds = std::move(speeds);
  return dt::transport::in_process(std::move(links), o);
}

struct exchanged {
  std::vector<std::vector<float>> values;  // [replica][i] after the drain
  std::vector<std::int64_t> asked, answered;
};

// n replicas, replica r starting from r * 10 + i (i < 4), `steps` steps of poll-and-ask each
// after `compute_s` simulated seconds of "compute", then a drain; with `weights`, weighted, replica
// r weighing weights[r].
exchanged exchange(int n, int steps, const std::string& links = "lan", double compute_s = 1.0, std::vector<double> weights = {}) {
  exchanged out{std::vector<std::vector<float>>(static_cast<std::size_t>(n)), std::vector<std::int64_t>(static_cast<std::size_t>(n)),
                std::vector<std::int64_t>(static_cast<std::size_t>(n))};
  simulated(dt::transport::links::preset(links, n, 1)).run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator c(ep);
    const int me = ep.rank();
    dt::comm::topology::exponential graph;
    dt::comm::pairwise_averager a;
    std::vector<float> x(4);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(me * 10 + static_cast<int>(i));
    const bool weighted = !weights.empty();
    const double w = weighted ? weights[static_cast<std::size_t>(me)] : 1.0;
    a.begin(c, dt::comm::ad_psgd<>::neighbours(graph, me, n), x.size(), weighted);
    for (int t = 0; t < steps; ++t) {
      ep.computed(compute_s);
      (void)a.poll(c, std::span<float>(x), w);
      a.ask(c, std::span<const float>(x), dt::detail::splitmix64(static_cast<std::uint64_t>(t * n + me)), w);
    }
    (void)a.drain(c, std::span<float>(x), w);
    const auto r = static_cast<std::size_t>(me);
    out.values[r] = x;
    out.asked[r] = a.asked();
    out.answered[r] = a.answered();
    if (a.open() != 0) out.values[r].clear();  // (a drain leaves nothing open: checked below)
  });
  return out;
}

}  // namespace

TEST_CASE("ad-psgd: weighted, each exchange keeps the pair's weighted sum, and the replicas reach the mean weighted by their weights") {
  const int n = 8;
  const std::vector<double> weights{1, 3, 2, 5, 1, 4, 2, 7};
  const auto e = exchange(n, 80, "lan", 1.0, weights);
  double total = 0;
  for (const double w : weights) total += w;
  for (std::size_t i = 0; i < 4; ++i) {
    double kept = 0, start = 0;
    for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) {
      REQUIRE(e.values[r].size() == 4);
      kept += weights[r] * e.values[r][i];
      start += weights[r] * (10.0 * static_cast<double>(r) + static_cast<double>(i));
    }
    const double mean = start / total;  // 42.8 + i, where the plain mean is 35 + i
    INFO("value " << i);
    CHECK(std::abs(kept - start) < 1e-4 * start);
    for (const auto& v : e.values) CHECK(std::abs(v[i] - mean) < 1e-3 * 35);
  }
}

TEST_CASE("ad-psgd: pairwise exchanges keep the replicas' sum, bring every replica to the mean, and answer every request") {
  const int n = 8;
  const auto e = exchange(n, 80);
  std::int64_t asked = 0, answered = 0;
  for (int r = 0; r < n; ++r) {
    asked += e.asked[static_cast<std::size_t>(r)];
    answered += e.answered[static_cast<std::size_t>(r)];
    REQUIRE(e.values[static_cast<std::size_t>(r)].size() == 4);
  }
  CHECK(asked == answered);
  CHECK(asked >= n * 40);  // (most steps ask: a neighbour is free unless every one has an open request)
  for (std::size_t i = 0; i < 4; ++i) {
    double sum = 0;
    for (const auto& v : e.values) sum += v[i];
    const double mean0 = (10.0 * (n - 1) / 2.0) + static_cast<double>(i);  // the mean of r * 10 + i
    INFO("value " << i);
    CHECK(std::abs(sum / n - mean0) < 1e-4);
    for (const auto& v : e.values) CHECK(std::abs(v[i] - mean0) < 1e-3 * 35);  // from a spread of 35 either side
  }
  // The simulator is deterministic: the same run gives the same values.
  CHECK(exchange(n, 80).values == e.values);
}

TEST_CASE("ad-psgd: where an answer takes many steps to come, replicas still converge to the mean (one request open at a time)") {
  // wan links, 20 ms of compute a step: an exchange (100 ms each way) spans ten steps. Two
  // answers to requests sent with the same values would each move the asker half-way, together
  // past its neighbours, and the values would grow without bound.
  const int n = 16;
  const auto e = exchange(n, 600, "wan", 0.02);
  for (std::size_t i = 0; i < 4; ++i) {
    const double mean0 = 10.0 * (n - 1) / 2.0 + static_cast<double>(i);
    double sum = 0;
    for (const auto& v : e.values) {
      REQUIRE(v.size() == 4);
      sum += v[i];
      CHECK(std::abs(v[i] - mean0) < 1e-2 * 75);  // from a spread of 75 either side
    }
    CHECK(std::abs(sum / n - mean0) < 1e-3);
  }
}

TEST_CASE("trainer: under ad-psgd a peer 4x slower leaves the others' step rate within 10%, where sync all-reduce waits for it") {
  using ad_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::ad_psgd<>>;
  using sync_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::sync_allreduce<>>;
  const std::int64_t steps = 12;
  const auto opts = fixture::small_run(steps);
  const std::vector<double> one_slow = {1, 1, 1, 0.25};
  // Each peer's clock when its second-to-last step ended (the last one drains, waiting for all).
  auto clocks = [&](auto trainer_tag, std::vector<double> speeds, std::vector<dt::train::fit_result>* results) {
    using Trainer = typename decltype(trainer_tag)::type;
    std::vector<double> at(4, -1);
    auto r = dt::train::fit_in_process<Trainer>(simulated(dt::transport::links::lan(4), std::move(speeds)), fixture::tiny_gpt(), opts,
                                                fixture::small_corpus().data, {}, [&](Trainer& t) {
                                                  t.on_step([&, &t = t](const dt::train::step_metrics& m) {
                                                    if (m.step == steps - 1) at[static_cast<std::size_t>(t.rank())] = m.clock_s;
                                                  });
                                                });
    if (results) *results = r;
    return at;
  };
  struct ad_tag { using type = ad_trainer; };
  struct sync_tag { using type = sync_trainer; };
  std::vector<dt::train::fit_result> results;
  const auto ad_even = clocks(ad_tag{}, {}, nullptr), ad_slow = clocks(ad_tag{}, one_slow, &results);
  const auto sync_even = clocks(sync_tag{}, {}, nullptr), sync_slow = clocks(sync_tag{}, one_slow, nullptr);
  for (std::size_t r = 0; r < 3; ++r) {
    INFO("fast peer " << r << ": ad-psgd " << ad_even[r] << " s -> " << ad_slow[r] << " s; sync " << sync_even[r] << " s -> "
                      << sync_slow[r] << " s");
    REQUIRE(ad_even[r] > 0);
    CHECK(ad_slow[r] <= 1.10 * ad_even[r]);
    CHECK(sync_slow[r] >= 3.0 * sync_even[r]);
  }
  CHECK(ad_slow[3] >= 3.5 * ad_even[3]);  // (the slow peer is slow)
  for (const auto& f : results) {
    CHECK(f.final_val_loss < fixture::uniform_loss());
    CHECK(f.evals.back().consensus_distance > 0);
  }
}

TEST_CASE("trainer: an ad-psgd run resumed from checkpoints taken at a drain matches the uninterrupted run (deterministic simulator)") {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::ad_psgd<dt::comm::topology::ring>>;
  const auto opts = fixture::small_run(12);
  dt::comm::ad_psgd<dt::comm::topology::ring> comm;
  comm.drain_every = 4;
  const int n = 4;
  std::vector<std::vector<float>> whole(n), resumed(n);
  std::vector<dt::io::checkpoint> saved(n);
  simulated(dt::transport::links::ideal(n)).run([&](dt::transport::in_process::endpoint& ep) {
    Trainer t(fixture::tiny_gpt(), opts, ep, comm);
    t.on_step([&](const dt::train::step_metrics& m) {
      if (m.step == 8) saved[static_cast<std::size_t>(ep.rank())] = t.capture();
    });
    (void)t.fit(fixture::small_corpus().data);
    whole[static_cast<std::size_t>(ep.rank())] = fixture::flat_params(t.model().parameters());
  });
  simulated(dt::transport::links::ideal(n)).run([&](dt::transport::in_process::endpoint& ep) {
    Trainer t(fixture::tiny_gpt(), opts, ep, comm);
    t.restore(saved[static_cast<std::size_t>(ep.rank())]);
    (void)t.fit(fixture::small_corpus().data);
    resumed[static_cast<std::size_t>(ep.rank())] = fixture::flat_params(t.model().parameters());
  });
  for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) {
    INFO("replica " << r);
    CHECK(resumed[r] == whole[r]);
  }
  CHECK(whole[0] != whole[1]);
}

namespace {
// Data parallelism whose steps weigh `weight`, or peer r's r + 1 where it is 0.
struct ad_step_weights : dt::parallel::data {
  double weight = 0;
  template <class Ctx>
  dt::parallel::step_result forward_backward(Ctx& ctx) {
    auto r = dt::parallel::data::forward_backward(ctx);
    r.weight = weight > 0 ? weight : ctx.comm.rank() + 1.0;
    return r;
  }
};
}  // namespace

TEST_CASE("trainer: ad-psgd with weighted set weighs the exchanges by the step weights (equal ones change nothing)") {
  using Policy = dt::comm::ad_psgd<dt::comm::topology::ring>;
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Policy, ad_step_weights>;
  auto opts = fixture::small_run(8);
  opts.lr = 1e-2;  // replicas far enough apart that the weights show
  const auto run = [&](bool weighted, double weight) {
    Policy comm;
    comm.weighted = weighted;
    ad_step_weights parallel;
    parallel.weight = weight;
    std::vector<std::vector<float>> out(4);
    simulated(dt::transport::links::ideal(4)).run([&](dt::transport::in_process::endpoint& ep) {
      Trainer t(fixture::tiny_gpt(), opts, ep, comm, parallel);
      (void)t.fit(fixture::small_corpus().data);
      out[static_cast<std::size_t>(ep.rank())] = fixture::flat_params(t.model().parameters());
    });
    return out;
  };
  const auto plain = run(false, 1), equal = run(true, 2), by_rank = run(true, 0);
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("replica " << r);
    // (the weighted exchange's arithmetic in f64, 8 AdamW steps at lr 1e-2: 1.2-1.6e-5 apart)
    CHECK(fixture::max_abs_diff(equal[r], plain[r]) < 1e-4);
    CHECK(fixture::max_abs_diff(by_rank[r], plain[r]) > 1e-3);
  }
}

TEST_CASE("ad-psgd: a message of an unknown kind or of the wrong size is refused, naming the peer") {
  for (const bool wrong_size : {false, true}) {
    INFO((wrong_size ? "wrong size" : "unknown kind"));
    std::string error;
    dt::transport::in_process::options o;
    o.peers_fail_alone = true;
    dt::transport::in_process(dt::transport::links::ideal(2), o).run([&](dt::transport::in_process::endpoint& ep) {
      dt::collective::communicator c(ep);
      if (ep.rank() == 1) {
        std::vector<float> m(wrong_size ? 9 : 5, 1.0f);
        m[0] = 7.0f;
        c.send_to(0, std::span<const float>(m));
        return;
      }
      dt::comm::pairwise_averager a;
      std::vector<float> x(4, 0.0f);
      a.begin(c, {1}, x.size());
      try {
        (void)a.drain(c, std::span<float>(x));
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    CHECK_THAT(error, Catch::Contains("peer 1"));
    CHECK_THAT(error, Catch::Contains(wrong_size ? "bytes where" : "a message of kind 7"));
  }
}

TEST_CASE("trainer: ad-psgd refuses a graph that changes with the round, peers that exchange differently, and inner_steps < 1") {
  const auto opts = fixture::small_run(2);
  using changing = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::ad_psgd<dt::comm::topology::one_peer_exponential>>;
  CHECK_THROWS_WITH(fixture::final_params<changing>(4, fixture::tiny_gpt(), opts),
                    Catch::Contains("ad-psgd: topology 'one-peer-exponential' changes its neighbours with the round"));
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::ad_psgd<>>;
  std::vector<std::string> errors(2);
  dt::transport::in_process(2).run([&](dt::transport::in_process::endpoint& ep) {
    dt::comm::ad_psgd<> comm;
    comm.drain_every = ep.rank() == 1 ? 5 : 0;
    try {
      Trainer t(fixture::tiny_gpt(), opts, ep, comm);
      (void)t.fit(fixture::small_corpus().data);
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(ep.rank())] = e.what();
    }
  });
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("ad-psgd: the peers exchange differently"));
  dt::comm::ad_psgd<> bad;
  bad.inner_steps = 0;
  CHECK_THROWS_WITH(fixture::final_params<Trainer>(2, fixture::tiny_gpt(), opts, bad), Catch::Contains("inner_steps must be >= 1"));
}

TEST_CASE("trainer: ad-psgd trains 1 to 8 peers, every request answered and none open at the end") {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::ad_psgd<>>;
  const auto opts = fixture::small_run(10);
  for (int n = 1; n <= 8; ++n) {
    INFO(n << " peers");
    std::vector<std::int64_t> asked(static_cast<std::size_t>(n)), answered(static_cast<std::size_t>(n)), open(static_cast<std::size_t>(n));
    const auto results = dt::train::fit_in_process<Trainer>(
        simulated(dt::transport::links::lan(n)), fixture::tiny_gpt(), opts, fixture::small_corpus().data, {}, [&](Trainer& t) {
          t.on_eval([&, &t = t](const dt::train::eval_point&) {
            const auto r = static_cast<std::size_t>(t.rank());
            asked[r] = t.policy().averager().asked();
            answered[r] = t.policy().averager().answered();
            open[r] = t.policy().averager().open();
          });
        });
    std::int64_t total_asked = 0, total_answered = 0;
    for (int r = 0; r < n; ++r) {
      const auto k = static_cast<std::size_t>(r);
      total_asked += asked[k];
      total_answered += answered[k];
      CHECK(open[k] == 0);
      CHECK(results[k].final_val_loss < fixture::uniform_loss());
    }
    CHECK(total_asked == total_answered);
    // At most one request a step but the last (a drain), and one whenever a neighbour is free.
    CHECK(total_asked <= n * (opts.steps - 1));
    CHECK((n == 1 ? total_asked == 0 : total_asked >= n * (opts.steps - 1) / 2));
  }
}
