// Training with peers that send poison (bench/attacks.hpp): under the mean a peer sending huge
// pseudo-gradients ruins DiLoCo for everyone, under centered clipping the honest peers end where a
// clean run ends, and so do Streaming DiLoCo's against a noisy peer, fragment by fragment; a peer
// sending NaN is dropped every round, never averaged in, and named; under
// fault::elastic the honest peers agree to exclude a peer that keeps sending poison.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attacks.hpp"
#include "support/trainer_fixture.hpp"

namespace dt = decentrain;
using fixture::small_corpus;

namespace {
using aggregator = dt::collective::any_aggregator;
using RobustDiloco = dt::comm::diloco<dt::comm::outer::nesterov, dt::compress::identity, aggregator>;
using RobustSync = dt::comm::sync_allreduce<dt::compress::identity, aggregator>;
using RobustStreaming = dt::comm::streaming_diloco<dt::comm::outer::nesterov, dt::compress::identity, aggregator>;

struct run_result {
  double val_loss = 0;
  dt::collective::peer_tally seen;  // by peer 0
};

template <class Policy>
run_result train(Policy policy, const char* spec, bench::attack kind, int attackers) {
  using Attacked = bench::attacked<Policy>;
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Attacked>;
  dt::train::trainer_options opts;
  opts.steps = 40;
  opts.eval_batches = 2;
  opts.batch_size = 4;
  Attacked a;
  a.inner = policy;
  a.inner.aggregator = dt::collective::parse_aggregator(spec);
  a.settings.kind = kind;
  a.settings.attackers = attackers;
  a.settings.board = std::make_shared<bench::attack_board>(5);
  run_result out;
  const auto r = dt::train::fit_in_process<Trainer>(dt::transport::in_process(5), fixture::tiny_gpt(), opts, small_corpus().data,
                                                    a, [&](Trainer& t) {
                                                      if (t.rank() == 0)
                                                        t.on_step([&t, &out](const dt::train::step_metrics&) {
                                                          out.seen = t.policy().aggregation().tally;
                                                        });
                                                    });
  out.val_loss = r[0].final_val_loss;
  for (const auto& p : r) CHECK(p.final_val_loss == r[0].final_val_loss);  // every peer holds the same model
  return out;
}
}  // namespace

TEST_CASE("byzantine: DiLoCo under centered clipping shrugs off a peer scaling its pseudo-gradient by 100", "[byzantine]") {
  RobustDiloco d;
  d.inner_steps = 5;
  const auto clean = train(d, "mean", bench::attack::none, 0);
  const auto ruined = train(d, "mean", bench::attack::scaled, 1);
  const auto held = train(d, "centered-clip", bench::attack::scaled, 1);
  const auto clean_clipped = train(d, "centered-clip", bench::attack::none, 0);
  CHECK(clean.val_loss < fixture::uniform_loss() - 0.3);  // it learned
  CHECK((!std::isfinite(ruined.val_loss) || ruined.val_loss > clean.val_loss + 1.0));
  CHECK(std::abs(held.val_loss - clean.val_loss) < 0.05 * clean.val_loss);
  CHECK(std::abs(clean_clipped.val_loss - clean.val_loss) < 0.02 * clean.val_loss);
  // Peer 4 was far from the aggregate every round (8 rounds: 40 steps of 5); nobody else was.
  REQUIRE(held.seen.calls == 8);
  CHECK(held.seen.far[4] == 8);
  for (std::size_t p = 0; p < 4; ++p) CHECK(held.seen.suspicious(p) == 0);
}

TEST_CASE("byzantine: Streaming DiLoCo under centered clipping shrugs off a peer adding noise to its pseudo-gradients", "[byzantine]") {
  // At every round's end the attacker adds Gaussian noise of 10 times their RMS to its round's
  // change, so every fragment it sends afterwards is far from the others'. Each fragment is
  // aggregated on its own (its own call of the aggregator), so the clip holds per fragment.
  // (Not x100 here: Streaming DiLoCo replaces only part of a peer's own parameters at each merge,
  // so the attacker's own run diverges to a non-finite loss and stops, which ends the test's run.)
  RobustStreaming s;
  s.inner_steps = 5;
  s.fragments = 2;
  s.overlap = 1;
  const auto clean = train(s, "mean", bench::attack::none, 0);
  const auto noisy = train(s, "mean", bench::attack::noise, 1);
  const auto held = train(s, "centered-clip", bench::attack::noise, 1);
  const auto clean_clipped = train(s, "centered-clip", bench::attack::none, 0);
  INFO("val loss: clean " << clean.val_loss << ", noise under the mean " << noisy.val_loss << ", under the clip "
                          << held.val_loss << ", clean under the clip " << clean_clipped.val_loss << "; peer 4 far in "
                          << held.seen.far[4] << " of " << held.seen.calls);
  CHECK(clean.val_loss < fixture::uniform_loss() - 0.3);  // it learned
  CHECK(noisy.val_loss > clean.val_loss + 0.1);           // the mean takes the noise in
  CHECK(std::abs(held.val_loss - clean.val_loss) < 0.01 * clean.val_loss);
  CHECK(std::abs(clean_clipped.val_loss - clean.val_loss) < 0.01 * clean.val_loss);
  // 40 steps, H = 5, 2 fragments: 16 exchanges and the last step's; the attacker's first noise
  // lands after the first round, then it is far in every exchange; nobody else ever is.
  REQUIRE(held.seen.calls == 17);
  CHECK(held.seen.far[4] >= 15);
  for (std::size_t p = 0; p < 4; ++p) CHECK(held.seen.suspicious(p) == 0);
}

TEST_CASE("byzantine: a peer sending NaN or infinities is dropped every step, named, and never averaged in", "[byzantine]") {
  const auto clean = train(RobustSync{}, "mean", bench::attack::none, 0);
  const auto attacked = train(RobustSync{}, "mean", bench::attack::non_finite, 2);  // peer 4 NaN, peer 3 +inf
  REQUIRE(std::isfinite(attacked.val_loss));
  CHECK(std::abs(attacked.val_loss - clean.val_loss) < 0.05 * clean.val_loss);
  REQUIRE(attacked.seen.calls == 40);
  CHECK(attacked.seen.non_finite == std::vector<std::int64_t>{0, 0, 0, 40, 40});
  const auto median = train(RobustSync{}, "median:partitioned", bench::attack::non_finite, 2);
  REQUIRE(std::isfinite(median.val_loss));
  CHECK(median.seen.non_finite == std::vector<std::int64_t>{0, 0, 0, 40, 40});
}

TEST_CASE("byzantine: DiLoCo and sync averaged over sites drop a peer sending NaN or infinities as the flat all-reduce does", "[byzantine]") {
  // One site of five: the two-level all-reduce's result holds the poison, so every replica redoes
  // the round flat, through the aggregator, which drops the two attackers and names them.
  RobustDiloco d;
  d.inner_steps = 4;
  const auto flat = train(d, "mean", bench::attack::non_finite, 2);
  d.site = "a";
  const auto clean = train(d, "mean", bench::attack::none, 0);
  const auto attacked = train(d, "mean", bench::attack::non_finite, 2);
  REQUIRE(std::isfinite(attacked.val_loss));
  CHECK(attacked.val_loss == flat.val_loss);  // the same robust round, bit for bit
  CHECK(attacked.seen.non_finite == std::vector<std::int64_t>{0, 0, 0, 10, 10});  // every round of 40 steps
  CHECK(clean.seen.calls == 0);  // (clean rounds never fall back)
  // The same for synchronous training: every step's poisoned result is redone flat.
  RobustSync sync;
  const auto sync_flat = train(sync, "mean", bench::attack::non_finite, 2);
  sync.site = "a";
  const auto sync_sites = train(sync, "mean", bench::attack::non_finite, 2);
  REQUIRE(std::isfinite(sync_sites.val_loss));
  CHECK(sync_sites.val_loss == sync_flat.val_loss);
  CHECK(sync_sites.seen.non_finite == std::vector<std::int64_t>{0, 0, 0, 40, 40});
}

namespace {
// 5 in-process peers under fault::elastic, the highest `attackers` sending poison: what each
// peer ended with (an error for those the group excluded).
template <class Policy>
struct elastic_attack {
  using Attacked = bench::attacked<Policy>;
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Attacked, dt::parallel::data, dt::fault::elastic>;
  static constexpr int world = 5;
  std::vector<std::string> errors = std::vector<std::string>(world);
  std::vector<std::vector<float>> params = std::vector<std::vector<float>>(world);
  std::vector<std::vector<dt::fault::membership_change>> changes = std::vector<std::vector<dt::fault::membership_change>>(world);
  std::vector<double> val_loss = std::vector<double>(world);

  elastic_attack(Policy policy, bench::attack kind, int attackers, dt::fault::elastic fault = {}) {
    dt::train::trainer_options opts;
    opts.steps = 30;
    opts.eval_batches = 2;
    opts.batch_size = 4;
    Attacked a;
    a.inner = policy;
    a.settings.kind = kind;
    a.settings.attackers = attackers;
    dt::transport::in_process::options o;
    o.recv_timeout = std::chrono::seconds(30);
    o.peers_fail_alone = true;
    fault.agreement.timeout = std::chrono::seconds(20);
    dt::transport::in_process net(dt::transport::links::ideal(world), o);
    std::mutex m;
    net.run([&](dt::transport::in_process::endpoint& ep) {
      const auto r = static_cast<std::size_t>(ep.rank());
      Trainer t(fixture::tiny_gpt(), opts, ep, a, {}, fault);
      try {
        val_loss[r] = t.fit(small_corpus().data).final_val_loss;
      } catch (const std::exception& e) {
        std::lock_guard lock(m);
        errors[r] = e.what();
        return;
      }
      std::vector<float> flat;
      dt::comm::gather_values(t.model().parameters(), flat);
      std::lock_guard lock(m);
      params[r] = std::move(flat);
      changes[r] = t.fault().changes();
    });
  }
};

std::string listed(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += std::to_string(x) + " ";
  return s;
}
}  // namespace

TEST_CASE("byzantine: the honest peers agree to exclude a peer that keeps sending poison, and it stops", "[byzantine][elastic]") {
  struct scenario {
    const char* aggregator;
    bench::attack kind;
    int attackers;
  };
  for (const auto& s : {scenario{"mean", bench::attack::non_finite, 1}, scenario{"centered-clip:partitioned", bench::attack::scaled, 2},
                        scenario{"median", bench::attack::noise, 1}}) {
    INFO(s.aggregator << ", " << bench::attack_name(s.kind) << " x" << s.attackers);
    RobustSync sync;
    sync.aggregator = dt::collective::parse_aggregator(s.aggregator);
    const elastic_attack<RobustSync> run(sync, s.kind, s.attackers);
    const int honest = elastic_attack<RobustSync>::world - s.attackers;
    for (int r = honest; r < elastic_attack<RobustSync>::world; ++r) {
      INFO("attacker " << r);
      // "was excluded from the run" when the view reached it, else (the others closed on it first)
      // the agreement it is left alone in stops for want of a majority: "peer 0 excluded it from the run"
      CHECK_THAT(run.errors[static_cast<std::size_t>(r)], Catch::Contains("excluded"));
    }
    std::vector<int> excluded;
    for (int r = honest; r < elastic_attack<RobustSync>::world; ++r) excluded.push_back(r);
    for (int r = 0; r < honest; ++r) {
      INFO("honest peer " << r << ": " << run.errors[static_cast<std::size_t>(r)]);
      REQUIRE(run.errors[static_cast<std::size_t>(r)].empty());
      CHECK(run.params[static_cast<std::size_t>(r)] == run.params[0]);  // the same model, bit for bit
      CHECK(std::isfinite(run.val_loss[static_cast<std::size_t>(r)]));
      // The same changes on every honest peer: the attackers removed (one view each, or one for
      // both), each change caused by a conviction, within the first steps.
      std::vector<int> removed;
      for (const auto& c : run.changes[static_cast<std::size_t>(r)]) {
        removed.insert(removed.end(), c.removed.begin(), c.removed.end());
        CHECK(c.step <= 6);
      }
      std::sort(removed.begin(), removed.end());
      CHECK(listed(removed) == listed(excluded));
      REQUIRE(run.changes[static_cast<std::size_t>(r)].size() == run.changes[0].size());
      for (std::size_t i = 0; i < run.changes[0].size(); ++i) {
        CHECK(run.changes[static_cast<std::size_t>(r)][i].epoch == run.changes[0][i].epoch);
        CHECK(run.changes[static_cast<std::size_t>(r)][i].step == run.changes[0][i].step);
      }
    }
  }
}

TEST_CASE("byzantine: without exclusion, or with only honest peers, the group keeps everyone", "[byzantine][elastic]") {
  RobustSync sync;
  sync.aggregator = dt::collective::parse_aggregator("centered-clip:partitioned");
  dt::fault::elastic reporting_only;
  reporting_only.exclusion.times = 0;
  const elastic_attack<RobustSync> kept(sync, bench::attack::scaled, 1, reporting_only);
  const elastic_attack<RobustSync> clean(sync, bench::attack::none, 0);
  for (std::size_t r = 0; r < 5; ++r) {
    CHECK(kept.errors[r].empty());
    CHECK(kept.changes[r].empty());
    CHECK(clean.errors[r].empty());
    CHECK(clean.changes[r].empty());
  }
  dt::fault::elastic bad;
  bad.exclusion.times = 6;  // more than of_last (5)
  const elastic_attack<RobustSync> refused(sync, bench::attack::none, 0, bad);
  for (const auto& e : refused.errors) CHECK_THAT(e, Catch::Contains("exclusion needs 0 <= times <= of_last <= 64"));
}

#if DECENTRAIN_HAS_ASIO
TEST_CASE("byzantine: over tcp the group excludes a poisoning peer, and refuses it when it tries to join again",
          "[byzantine][elastic][tcp]") {
  // 4 TCP peers (threads of this process, 127.0.0.1) under fault::elastic, sync all-reduce with
  // the mean; peer 3 sends NaN. Once excluded it dials the group again as a joiner with the same
  // rank. The honest peers wait at step 20 until that try is over (bounded), so the group still runs.
  using Attacked = bench::attacked<RobustSync>;
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Attacked, dt::parallel::data, dt::fault::elastic>;
  constexpr int world = 4;
  dt::train::trainer_options opts;
  opts.steps = 30;
  opts.eval_batches = 2;
  opts.batch_size = 4;
  Attacked a;
  a.settings.kind = bench::attack::non_finite;
  a.settings.attackers = 1;
  dt::fault::elastic fault;
  fault.agreement.timeout = std::chrono::seconds(20);
  dt::transport::tcp_options base;
  base.world = world;
  base.recv_timeout = std::chrono::seconds(30);
  base.join_timeout = std::chrono::seconds(10);
  dt::transport::tcp first(base);
  const std::string seed = first.address();
  std::atomic<bool> tried{false};
  std::vector<std::string> errors(world);
  std::vector<std::vector<dt::fault::membership_change>> changes(world);
  std::vector<std::vector<float>> params(world);
  std::string rejoin_error;
  std::chrono::steady_clock::duration rejoin_took{};
  std::mutex m;
  auto run_peer = [&](int r, std::optional<dt::transport::tcp> pre) {
    const auto i = static_cast<std::size_t>(r);
    auto o = base;
    o.rank = r;
    o.join = {seed};
    try {
      dt::transport::tcp ep = pre ? std::move(*pre) : dt::transport::tcp(o);
      ep.connect();
      Trainer t(fixture::tiny_gpt(), opts, ep, a, {}, fault);
      t.on_step([&tried](const dt::train::step_metrics& s) {
        for (int k = 0; s.step == 20 && !tried && k < 3000; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      });
      t.fit(small_corpus().data);
      std::lock_guard lock(m);
      changes[i] = t.fault().changes();
      params[i] = fixture::flat_params(t.model().parameters());
    } catch (const std::exception& e) {
      std::lock_guard lock(m);
      errors[i] = e.what();
    }
    if (r != world - 1) return;
    const auto t0 = std::chrono::steady_clock::now();
    try {  // the excluded peer comes back
      dt::transport::tcp again(o);
      again.connect();
    } catch (const std::exception& e) {
      std::lock_guard lock(m);
      rejoin_error = e.what();
    }
    rejoin_took = std::chrono::steady_clock::now() - t0;
    tried = true;
  };
  std::vector<std::thread> threads;
  threads.emplace_back(run_peer, 0, std::move(first));
  for (int r = 1; r < world; ++r) threads.emplace_back(run_peer, r, std::nullopt);
  for (auto& t : threads) t.join();

  CHECK_THAT(errors[3], Catch::Contains("excluded"));
  INFO("the excluded peer's second try: " << rejoin_error);
  CHECK_THAT(rejoin_error, Catch::Contains("excluded it from the run"));
  CHECK(rejoin_took < std::chrono::seconds(5));  // it stopped trying: not at its join timeout (10 s)
  for (std::size_t r = 0; r < 3; ++r) {
    INFO("honest peer " << r << ": " << errors[r]);
    REQUIRE(errors[r].empty());
    CHECK(params[r] == params[0]);
    std::ostringstream views;
    for (const auto& c : changes[r])
      views << "\nview " << c.epoch << ": " << c.members.size() << " members, removed " << c.removed.size() << ", joined "
            << c.joined.size() << ", cause: " << c.cause;
    INFO("its views:" << views.str());
    // Peer 3 removed, nobody joined. A peer whose count reached the threshold first may start an
    // agreement before the others counted the same aggregation: a lone accusation convicts no one
    // (fewer than a third may lie), so that view keeps everyone and the next one, with the
    // accusation standing and the others', removes peer 3.
    REQUIRE(!changes[r].empty());
    CHECK(changes[r].size() <= 2);
    CHECK(changes[r].back().removed == std::vector<int>{3});
    CHECK(changes[r].back().members == std::vector<int>{0, 1, 2});
    for (const auto& c : changes[r]) {
      CHECK(c.joined.empty());
      CHECK((c.removed.empty() || c.removed == std::vector<int>{3}));
    }
  }
}
#endif
