// SWARM parallelism (parallel/swarm.hpp): pools of peers per stage, micro-batches routed to the
// next stage's peers by the router. One peer per stage trains as the pipeline does (GPipe's
// order), S x R peers track a pipeline of the same shape, every stage processes each row of a
// step once, the replicas of a stage agree after averaging, and bad settings are refused.
#include "../support/trainer_fixture.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace dt = decentrain;
using fixture::small_corpus;
using fixture::relative_diff;
using fixture::tiny_gpt;

namespace {

dt::nn::gpt_config two_blocks() {
  auto c = tiny_gpt();
  c.n_layer = 2;
  return c;
}

dt::parallel::swarm<> swarmed(int stages, int micro) {
  dt::parallel::swarm<> s;
  s.stages = stages;
  s.micro_batches = micro;
  return s;
}

// SWARM's peers weigh in by the rows they processed (the trainer refuses an unweighted policy).
dt::comm::sync_allreduce<> weighted() {
  dt::comm::sync_allreduce<> c;
  c.weighted = true;
  return c;
}

using Swarm = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::sync_allreduce<>, dt::parallel::swarm<>>;
using Pipe = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::sync_allreduce<>, dt::parallel::pipeline<>>;

struct swarm_record {
  std::vector<std::map<std::string, std::vector<float>>> params;  // by rank, at the end
  std::vector<dt::train::fit_result> results;
  std::vector<dt::parallel::swarm_stats> stats;  // by rank (SWARM runs)
  std::vector<int> stage;
};

template <class Trainer>
swarm_record train_swarm(int world, const dt::train::trainer_options& opts, typename Trainer::parallel_policy parallel,
                 dt::transport::in_process::options net = {}) {
  swarm_record rec;
  rec.params.resize(static_cast<std::size_t>(world));
  rec.stats.resize(static_cast<std::size_t>(world));
  rec.stage.resize(static_cast<std::size_t>(world));
  rec.results = dt::train::fit_in_process<Trainer>(
      dt::transport::in_process(dt::transport::links::ideal(world), net), two_blocks(), opts, small_corpus().data, weighted(),
      [&](Trainer& t) {
        t.on_eval([&, &t = t](const dt::train::eval_point&) {  // (each peer writes its own slot)
          std::map<std::string, std::vector<float>> mine;
          for (const auto& e : t.model().parameters()) mine[e.name] = e.param.value().template to_vector<float>();
          const auto r = static_cast<std::size_t>(t.rank());
          rec.params[r] = std::move(mine);
          rec.stage[r] = t.placement().stage;
          if constexpr (requires { t.parallel().stats(); }) rec.stats[r] = t.parallel().stats();
        });
      },
      1, parallel);
  return rec;
}

dt::train::trainer_options swarm_run(std::int64_t steps, std::int64_t batch) {
  auto o = fixture::small_run(steps);
  o.batch_size = batch;
  o.eval_every = 0;
  return o;
}

}  // namespace

TEST_CASE("swarm: one peer per stage trains as a GPipe pipeline, bit for bit") {
  const auto opts = swarm_run(6, 4);
  auto pipe = dt::parallel::pipeline<>{};
  pipe.stages = 2;
  pipe.micro_batches = 2;
  pipe.schedule = "gpipe";
  const auto expected = train_swarm<Pipe>(2, opts, pipe);
  const auto got = train_swarm<Swarm>(2, opts, swarmed(2, 2));
  for (int r = 0; r < 2; ++r) {
    INFO("peer " << r);
    REQUIRE(!got.params[static_cast<std::size_t>(r)].empty());
    CHECK(got.params[static_cast<std::size_t>(r)] == expected.params[static_cast<std::size_t>(r)]);
    CHECK(got.results[static_cast<std::size_t>(r)].final_val_loss == expected.results[static_cast<std::size_t>(r)].final_val_loss);
    CHECK(got.stats[static_cast<std::size_t>(r)].micro_batches == 2);
  }
}

TEST_CASE("swarm: pools of peers per stage track the pipeline of the same shape, each stage's replicas equal") {
  // 6 peers: 2 stages x 3 copies for the pipeline; for SWARM pools of 3, every micro-batch going
  // to whichever peer of stage 1 the router picks. The same rows each step: the same gradients
  // but for the order of the float sums (AdamW makes the near-zero biases differ most).
  const auto opts = swarm_run(8, 4);
  auto pipe = dt::parallel::pipeline<>{};
  pipe.stages = 2;
  pipe.micro_batches = 2;
  const auto expected = train_swarm<Pipe>(6, opts, pipe);
  const auto got = train_swarm<Swarm>(6, opts, swarmed(2, 2));
  std::int64_t stage1_micro = 0;
  for (int r = 0; r < 6; ++r) {
    INFO("peer " << r);
    const auto& mine = got.params[static_cast<std::size_t>(r)];
    REQUIRE(!mine.empty());
    CHECK(got.stage[static_cast<std::size_t>(r)] == r % 2);
    // Replicas of a stage hold the same parameters (sync averaging), bit for bit.
    CHECK(mine == got.params[static_cast<std::size_t>(r % 2)]);
    for (const auto& [name, v] : mine) {
      INFO(name);
      CHECK(relative_diff(v, expected.params[static_cast<std::size_t>(r % 2)].at(name)) < 1e-3);
    }
    if (r % 2 == 1) stage1_micro += got.stats[static_cast<std::size_t>(r)].micro_batches;
    CHECK(std::abs(got.results[static_cast<std::size_t>(r)].final_val_loss - expected.results[0].final_val_loss) < 1e-4);
  }
  CHECK(stage1_micro == 6);  // 3 copies x 2 micro-batches a step, each once
}

TEST_CASE("swarm: a faster peer of a stage takes more of its micro-batches") {
  // Stage 1's peers 1 and 3 on simulated links and speeds: peer 3 four times as fast. Stage 1
  // holds three of the four blocks, so its compute is most of a micro-batch's round trip. Over
  // the run the router gives peer 3 the larger share of stage 1's micro-batches.
  auto opts = swarm_run(12, 8);
  dt::transport::in_process::options net;
  net.speeds = {1, 1, 1, 4};
  auto record = swarm_record{};
  auto model = two_blocks();
  model.n_layer = 4;
  auto pools = swarmed(2, 4);
  pools.blocks = {1, 3};
  {
    dt::transport::link_matrix l(4, dt::transport::simulated_link{1e-3, 1e9, 0.0, 0.0, 0.0});
    record.stats.resize(4);
    dt::train::fit_in_process<Swarm>(
        dt::transport::in_process(l, net), model, opts, small_corpus().data, weighted(),
        [&](Swarm& t) {
          t.on_eval([&, &t = t](const dt::train::eval_point&) { record.stats[static_cast<std::size_t>(t.rank())] = t.parallel().stats(); });
        },
        1, pools);
  }
  INFO("peer 1: " << record.stats[1].total_micro_batches << ", peer 3: " << record.stats[3].total_micro_batches);
  CHECK(record.stats[1].total_micro_batches + record.stats[3].total_micro_batches == 12 * 8);
  // (Not 4:1: a stage-0 peer routes a step's micro-batches before their answers come back, and
  // the round trips include the wait in the fast peer's queue, which its larger share lengthens;
  // bench/swarm measures the router's shares against the speeds.)
  CHECK(static_cast<double>(record.stats[3].total_micro_batches) > 1.15 * static_cast<double>(record.stats[1].total_micro_batches));
}

TEST_CASE("swarm: a deterministic run resumes bit for bit, the routers' state in the checkpoint") {
  // Links of different latencies, so the routers' weights differ and their credits matter: a
  // resumed router that started afresh would pick other peers, and the sums' order would differ.
  auto opts = swarm_run(7, 4);
  dt::transport::in_process::options o;
  o.deterministic = dt::transport::in_process::deterministic_run{};
  const auto net = [&] { return dt::transport::in_process(dt::transport::links::heterogeneous(6, 3), o); };
  const auto pools = swarmed(2, 2);
  std::vector<std::vector<float>> full(6), resumed(6);
  std::vector<dt::io::checkpoint> saved(6);
  net().run([&](dt::transport::in_process::endpoint& ep) {
    Swarm t(two_blocks(), opts, ep, weighted(), pools);
    (void)t.fit(small_corpus().data);
    full[static_cast<std::size_t>(ep.rank())] = fixture::flat_params(t.model().parameters());
  });
  net().run([&](dt::transport::in_process::endpoint& ep) {
    Swarm t(two_blocks(), opts, ep, weighted(), pools);
    struct stop {};
    t.on_step([&](const dt::train::step_metrics& m) {
      if (m.step != 4) return;
      saved[static_cast<std::size_t>(ep.rank())] = t.capture();
      throw stop{};
    });
    try {
      (void)t.fit(small_corpus().data);
    } catch (const stop&) {
    }
  });
  for (int r = 0; r < 6; r += 2) CHECK(saved[static_cast<std::size_t>(r)].text.count("parallel.swarm.router") == 1);
  net().run([&](dt::transport::in_process::endpoint& ep) {
    Swarm t(two_blocks(), opts, ep, weighted(), pools);
    t.restore(saved[static_cast<std::size_t>(ep.rank())]);
    (void)t.fit(small_corpus().data);
    resumed[static_cast<std::size_t>(ep.rank())] = fixture::flat_params(t.model().parameters());
  });
  for (std::size_t r = 0; r < 6; ++r) {
    INFO("peer " << r);
    REQUIRE(!full[r].empty());
    CHECK(resumed[r] == full[r]);
  }
}

TEST_CASE("swarm: bad settings are refused naming the setting") {
  using Catch::Matchers::Contains;
  auto s = swarmed(3, 2);
  CHECK_THROWS_WITH(s.place(0, 2), Contains("2 peer(s) cannot hold 3 stages"));
  s = swarmed(0, 1);
  CHECK_THROWS_WITH(s.place(0, 2), Contains("stages must be >= 1"));
  s = swarmed(2, 0);
  CHECK_THROWS_WITH(s.place(0, 2), Contains("micro-batches must be >= 1"));
  s = swarmed(2, 1);
  s.assignment = {0, 0, 0};
  CHECK_THROWS_WITH(s.place(0, 3), Contains("leaves stage 1 without a peer"));
  s.assignment = {0, 1};
  CHECK_THROWS_WITH(s.place(0, 3), Contains("places 2 peers, the group has 3"));
  s.assignment.clear();
  CHECK_THROWS_WITH(s.regroup({0, 1, 2}, {0, 1, 0}, {0}, 2), Contains("1 peer(s) are left to hold 2 stages"));
}

TEST_CASE("swarm: a re-formed group keeps each peer's stage, puts joiners in the smallest pool, fills an empty stage") {
  auto s = swarmed(2, 1);
  // Peers 0..5 at stages 0,1,0,1,0,1; peer 3 leaves: the others keep theirs.
  s.regroup({0, 1, 2, 3, 4, 5}, {0, 1, 0, 1, 0, 1}, {0, 1, 2, 4, 5}, 2);
  CHECK(s.assignment == std::vector<int>{0, 1, 0, 0, 1});
  // A joiner (world rank 6) goes to stage 1, the smaller pool.
  s.regroup({0, 1, 2, 4, 5}, {0, 1, 0, 0, 1}, {0, 1, 2, 4, 5, 6}, 2);
  CHECK(s.assignment == std::vector<int>{0, 1, 0, 0, 1, 1});
  // Stage 1's peers 1 and 5 leave: the largest pool's highest rank (4) moves there.
  s.regroup({0, 1, 2, 4, 5}, {0, 1, 0, 0, 1}, {0, 2, 4}, 2);
  CHECK(s.assignment == std::vector<int>{0, 0, 1});
  const auto p = s.place(2, 3);
  CHECK(p.stage == 1);
  CHECK(p.replicas == std::vector<int>{2});
}
