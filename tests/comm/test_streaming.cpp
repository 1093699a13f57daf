// Streaming DiLoCo: its equivalence with DiLoCo, how parameters are dealt into fragments, the
// schedule, the peak exchange, and resuming while an exchange is in flight.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "support/trainer_fixture.hpp"

namespace dt = decentrain;
using dt::train::trainer_options;
using fixture::flat_params;
using fixture::small_corpus;

namespace {

using Streaming = dt::comm::streaming_diloco<>;
using StreamingTrainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Streaming>;

// Two layers: units wte, wpe, h.0, h.1, ln_f.
dt::nn::gpt_config two_layers() {
  auto c = fixture::tiny_gpt();
  c.n_layer = 2;
  return c;
}

trainer_options short_run(std::int64_t steps) {
  trainer_options o;
  o.steps = steps;
  o.eval_batches = 1;
  o.batch_size = 2;
  return o;
}

// Every peer's parameters after every step.
template <class Trainer>
std::vector<std::vector<std::vector<float>>> params_per_step(int world, const trainer_options& opts,
                                                             const typename Trainer::comm_policy& comm) {
  std::vector<std::vector<std::vector<float>>> seen(static_cast<std::size_t>(world));
  dt::train::fit_in_process<Trainer>(dt::transport::in_process(world), two_layers(), opts, small_corpus().data, comm,
                                     [&](Trainer& t) {
                                       t.on_step([&, &t = t](const dt::train::step_metrics&) {
                                         seen[static_cast<std::size_t>(t.rank())].push_back(flat_params(t.model().parameters()));
                                       });
                                     });
  return seen;
}

}  // namespace

TEST_CASE("streaming_diloco: one fragment, no overlap and mix 0 is DiLoCo step for step") {
  const auto opts = short_run(13);
  dt::comm::diloco<> d;
  d.inner_steps = 5;
  Streaming s;
  s.inner_steps = 5;
  s.fragments = 1;
  s.overlap = 0;
  s.mix = 0;
  const auto diloco = params_per_step<dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>>>(3, opts, d);
  const auto streaming = params_per_step<StreamingTrainer>(3, opts, s);
  for (std::size_t r = 0; r < 3; ++r) {
    REQUIRE(streaming[r].size() == 13);
    for (std::size_t step = 0; step < 13; ++step) CHECK(streaming[r][step] == diloco[r][step]);
  }
}

TEST_CASE("streaming_diloco: every parameter belongs to exactly one fragment, layers dealt strided or in runs") {
  dt::rng init(1, "init");
  dt::nn::gpt<dt::cpu> model(two_layers(), init);
  const auto& params = model.parameters();
  const auto n = static_cast<std::size_t>(params.numel());
  CHECK(dt::comm::detail::layer_of("h.12.attn.c_attn.weight") == "h.12");
  CHECK(dt::comm::detail::layer_of("ln_f.weight") == "ln_f");
  CHECK(dt::comm::detail::layer_of("wte") == "wte");
  for (const auto pattern : {dt::comm::fragment_pattern::strided, dt::comm::fragment_pattern::sequential}) {
    for (std::int64_t P = 1; P <= 5; ++P) {
      const auto fragments = dt::comm::detail::fragment_ranges(params, P, pattern);
      REQUIRE(fragments.size() == static_cast<std::size_t>(P));
      std::vector<int> owners(n, 0);
      for (const auto& f : fragments) {
        CHECK(!f.empty());
        for (const auto& r : f)
          for (std::size_t i = r.offset; i < r.offset + r.size; ++i) ++owners[i];
      }
      CHECK(std::all_of(owners.begin(), owners.end(), [](int o) { return o == 1; }));
    }
  }
  // Strided over 5 layers in 2 fragments: wte, h.0, ln_f in one; wpe, h.1 in the other.
  const auto strided = dt::comm::detail::fragment_ranges(params, 2, dt::comm::fragment_pattern::strided);
  const auto wte = static_cast<std::size_t>(params.get("wte.weight").value().numel());
  const auto wpe = static_cast<std::size_t>(params.get("wpe.weight").value().numel());
  CHECK(strided[0].front().offset == 0);
  CHECK(strided[0].front().size == wte);
  CHECK(strided[1].front().offset == wte);
  CHECK(strided[1].front().size == wpe);
  CHECK(strided[0].size() == 3);
  CHECK(strided[1].size() == 2);
  // Sequential: runs in order, the first ending where the second begins.
  const auto runs = dt::comm::detail::fragment_ranges(params, 2, dt::comm::fragment_pattern::sequential);
  REQUIRE(runs[0].size() == 1);
  REQUIRE(runs[1].size() == 1);
  CHECK(runs[0][0].offset + runs[0][0].size == runs[1][0].offset);
  CHECK_THROWS_WITH(dt::comm::detail::fragment_ranges(params, 6, dt::comm::fragment_pattern::strided),
                    Catch::Contains("6 fragments asked for, but the model has 5 layers"));
}

TEST_CASE("streaming_diloco: fragments exchange in turn, each a part of the model, and training converges") {
  const auto opts = short_run(40);
  Streaming s;
  s.inner_steps = 8;
  s.fragments = 4;
  s.overlap = 2;
  std::vector<std::int64_t> merges(3);
  std::vector<std::uint64_t> peak(3);
  auto run = [&](const Streaming& policy) {
    return dt::train::fit_in_process<StreamingTrainer>(
        dt::transport::in_process(3), two_layers(), opts, small_corpus().data, policy, [&](StreamingTrainer& t) {
          t.on_eval([&, &t = t](const dt::train::eval_point&) {
            merges[static_cast<std::size_t>(t.rank())] = t.policy().merges();
            peak[static_cast<std::size_t>(t.rank())] = t.policy().peak_exchange_bytes();
          });
        });
  };
  const auto results = run(s);
  // 40 steps, H = 8, 4 fragments: each fragment 5 times (the fourth's fifth at the last step),
  // plus the last step's exchange of the three fragments not due then.
  CHECK(merges[0] == 4 * 5 + 3);
  CHECK(results[0].final_val_loss < fixture::uniform_loss() - 0.5);
  CHECK(results[0].final_val_loss == results[2].final_val_loss);
  // The largest of the four fragments is a block, 42% of the model: its exchange is the peak,
  // well under that of one fragment holding everything.
  const auto streamed_peak = peak[0];
  s.fragments = 1;
  (void)run(s);
  CHECK(streamed_peak > 0);
  CHECK(static_cast<double>(streamed_peak) < 0.5 * static_cast<double>(peak[0]));
}

TEST_CASE("streaming_diloco: the last step leaves every peer on the same parameters, whatever the mix") {
  Streaming s;
  s.inner_steps = 6;
  s.fragments = 3;
  s.overlap = 2;
  s.mix = 0.5;
  const auto params = fixture::final_params<StreamingTrainer>(3, two_layers(), short_run(14), s);
  CHECK(params[0] == params[1]);
  CHECK(params[0] == params[2]);
}

TEST_CASE("streaming_diloco: a run resumed while an exchange is in flight matches the uninterrupted run bit for bit") {
  const auto opts = short_run(16);
  Streaming s;
  s.inner_steps = 6;
  s.fragments = 3;
  s.overlap = 2;
  const auto whole = fixture::final_params<StreamingTrainer>(2, two_layers(), opts, s);
  // Fragment 0 exchanges after steps 1, 7, 13 (its (s + 1) mod 6 is 2): stopped after 8 steps, its
  // exchange from step 7 is in flight and lands after step 9.
  const auto saved = fixture::stop_at<StreamingTrainer>(2, 8, two_layers(), opts, s);
  CHECK(saved[0].counter("comm.streaming_diloco.fragment0.lands_after") == 9);
  CHECK(saved[0].tensors.count("comm.streaming_diloco.fragment0.average") == 1);
  const auto resumed = fixture::resume_from<StreamingTrainer>(saved, two_layers(), opts, s);
  CHECK(resumed[0] == whole[0]);
  CHECK(resumed[1] == whole[1]);
}

TEST_CASE("streaming_diloco: bad settings are named") {
  const auto opts = short_run(4);
  auto run = [&](Streaming s) { (void)fixture::final_params<StreamingTrainer>(1, two_layers(), opts, s); };
  Streaming s;
  s.inner_steps = 4;
  s.overlap = 4;
  CHECK_THROWS_WITH(run(s), Catch::Contains("overlap must be in [0, inner_steps)"));
  s.overlap = 1;
  s.fragments = 5;
  CHECK_THROWS_WITH(run(s), Catch::Contains("fragments must be in [1, inner_steps = 4]"));
  s.fragments = 2;
  s.mix = 1.5;
  CHECK_THROWS_WITH(run(s), Catch::Contains("mix must be in [0, 1]"));
}
