// Training with peers that send poison (bench/attacks.hpp): under the mean a peer sending huge
// pseudo-gradients ruins DiLoCo for everyone, under centered clipping the honest peers end where a
// clean run ends; a peer sending NaN is dropped every round, never averaged in, and named.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <cmath>
#include <memory>
#include <vector>

#include "attacks.hpp"
#include "support/trainer_fixture.hpp"

namespace dt = decentrain;
using fixture::small_corpus;

namespace {
using aggregator = dt::collective::any_aggregator;
using Diloco = dt::comm::diloco<dt::comm::outer::nesterov, dt::compress::identity, aggregator>;
using Sync = dt::comm::sync_allreduce<dt::compress::identity, aggregator>;

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
  Diloco d;
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

TEST_CASE("byzantine: a peer sending NaN or infinities is dropped every step, named, and never averaged in", "[byzantine]") {
  const auto clean = train(Sync{}, "mean", bench::attack::none, 0);
  const auto attacked = train(Sync{}, "mean", bench::attack::non_finite, 2);  // peer 4 NaN, peer 3 +inf
  REQUIRE(std::isfinite(attacked.val_loss));
  CHECK(std::abs(attacked.val_loss - clean.val_loss) < 0.05 * clean.val_loss);
  REQUIRE(attacked.seen.calls == 40);
  CHECK(attacked.seen.non_finite == std::vector<std::int64_t>{0, 0, 0, 40, 40});
  const auto median = train(Sync{}, "median:partitioned", bench::attack::non_finite, 2);
  REQUIRE(std::isfinite(median.val_loss));
  CHECK(median.seen.non_finite == std::vector<std::int64_t>{0, 0, 0, 40, 40});
}
