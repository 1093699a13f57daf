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

// Wraps a policy: records each peer's parameters when the policy starts and before its
// after_step on every step (the parameters its inner step left).
template <class Inner>
struct recorder {
  using policy_concept = dt::comm::policy_tag;
  Inner inner{};
  std::vector<std::vector<float>>* started = nullptr;              // [rank]
  std::vector<std::vector<std::vector<float>>>* before = nullptr;  // [rank][step]

  template <class Ctx>
  void start(Ctx& ctx) {
    inner.start(ctx);
    dt::comm::gather_values(ctx.parameters, (*started)[static_cast<std::size_t>(ctx.comm.rank())]);
  }
  template <class Ctx>
  void after_backward(Ctx& ctx) {
    inner.after_backward(ctx);
  }
  template <class Ctx>
  void after_step(Ctx& ctx) {
    (*before)[static_cast<std::size_t>(ctx.comm.rank())].push_back(flat_params(ctx.parameters));
    inner.after_step(ctx);
  }
  void save(dt::io::checkpoint& c) const { inner.save(c); }
  void load(const dt::io::checkpoint& c) { inner.load(c); }
};

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

TEST_CASE("streaming_diloco: a merge keeps `mix` of the peer's own parameters and takes the rest from the global copy") {
  // Runs that differ only in the mix agree up to the first merge. There, mix 1 keeps the
  // peer's own parameters and mix 0 takes the new global copy, so mix 0.25 must give a quarter
  // of the first and three quarters of the second (swapped shares give the opposite).
  const auto with_mix = [](double mix) {
    Streaming s;
    s.inner_steps = 4;
    s.fragments = 1;
    s.overlap = 0;
    s.mix = mix;
    return params_per_step<StreamingTrainer>(2, short_run(5), s);
  };
  const auto own = with_mix(1.0), global = with_mix(0.0), quarter = with_mix(0.25);
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("peer " << r);
    REQUIRE(own[r].size() == 5);
    REQUIRE(global[r].size() == 5);
    REQUIRE(quarter[r].size() == 5);
    for (std::size_t step = 0; step < 3; ++step) CHECK(quarter[r][step] == own[r][step]);  // before the first merge
    const std::size_t merged = 3;  // the fourth step ends the round
    REQUIRE(own[r][merged] != global[r][merged]);  // the merge has something to mix
    std::size_t off = 0;
    double largest = 0;
    for (std::size_t i = 0; i < own[r][merged].size(); ++i) {
      const double expected = 0.25 * own[r][merged][i] + 0.75 * global[r][merged][i];
      largest = std::max(largest, std::abs(expected));
      if (std::abs(quarter[r][merged][i] - expected) > 1e-6 * (1 + std::abs(expected))) ++off;
    }
    CHECK(largest > 0);
    CHECK(off == 0);
  }
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

TEST_CASE("streaming_diloco: a trainer that ran, restored and fit again matches the uninterrupted run") {
  // restore() loads into a policy that has run (its fragments exist): the next start keeps what
  // the load put there, exchange in flight included.
  const auto opts = short_run(16);
  Streaming s;
  s.inner_steps = 6;
  s.fragments = 3;
  s.overlap = 2;
  const auto whole = fixture::final_params<StreamingTrainer>(1, two_layers(), opts, s);
  std::vector<float> again;
  dt::transport::in_process(1).run([&](dt::transport::in_process::endpoint& ep) {
    StreamingTrainer t(two_layers(), opts, ep, s);
    dt::io::checkpoint saved;
    struct stop {};
    t.on_step([&](const dt::train::step_metrics& m) {
      if (m.step == 8 && saved.counters.empty()) {  // fragment 0's exchange from step 7 is in flight
        saved = t.capture();
        throw stop{};
      }
    });
    try {
      t.fit(small_corpus().data);
    } catch (const stop&) {
    }
    t.restore(saved);
    t.fit(small_corpus().data);
    again = flat_params(t.model().parameters());
  });
  CHECK(again == whole[0]);
}

TEST_CASE("streaming_diloco: a state taken mid-run (an elastic heal) replaces every fragment's, not only the global copy") {
  // fault::elastic hands a member behind another's state with load() while the policy runs:
  // every fragment's state must be taken (which fragments' outer momentum has started, what is
  // in flight, the codecs' state), not only the global copy.
  const auto opts = short_run(16);
  Streaming s;
  s.inner_steps = 4;
  s.fragments = 2;  // fragment 0 exchanges after steps 1, 5, ...; fragment 1 after 3, 7, ...
  s.overlap = 2;
  const auto further = fixture::stop_at<StreamingTrainer>(1, 6, two_layers(), opts, s)[0];  // fragment 0 in flight
  const auto behind = fixture::stop_at<StreamingTrainer>(1, 2, two_layers(), opts, s)[0];
  REQUIRE(behind.counter("comm.streaming_diloco.fragment1.momentum_started") == 0);
  REQUIRE(further.counter("comm.streaming_diloco.fragment1.momentum_started") == 1);
  dt::io::checkpoint taken;
  dt::transport::in_process(1).run([&](dt::transport::in_process::endpoint& ep) {
    StreamingTrainer t(two_layers(), opts, ep, s);
    struct stop {};
    t.on_step([&](const dt::train::step_metrics& m) {
      if (m.step != 2) return;
      t.policy().load(further);
      t.policy().save(taken);
      throw stop{};
    });
    try {
      t.fit(small_corpus().data);
    } catch (const stop&) {
    }
  });
  for (const auto& [name, value] : further.counters)
    if (name.rfind("comm.streaming_diloco.", 0) == 0) {
      INFO(name);
      REQUIRE(taken.counters.count(name) == 1);
      CHECK(taken.counters.at(name) == value);
    }
  for (const auto& [name, value] : further.tensors)
    if (name.rfind("comm.streaming_diloco.", 0) == 0) {
      INFO(name);
      REQUIRE(taken.tensors.count(name) == 1);
      CHECK(taken.tensors.at(name).to_vector<float>() == value.to_vector<float>());
    }
}

TEST_CASE("streaming_diloco: a member behind that takes another's state keeps its own error-feedback residual") {
  // fault::elastic hands over a state without the donor's unsent residuals (io::leave_out_own_state):
  // the member taking it must keep its own, fragment by fragment, not end with none.
  using EfStreaming = dt::comm::streaming_diloco<dt::comm::outer::nesterov, dt::compress::error_feedback<dt::compress::top_k>>;
  using EfTrainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, EfStreaming>;
  const auto opts = short_run(16);
  EfStreaming s;
  s.inner_steps = 4;
  s.fragments = 2;
  s.codec.codec.fraction = 0.1;
  auto further = fixture::stop_at<EfTrainer>(1, 9, two_layers(), opts, s)[0];
  dt::io::leave_out_own_state(further);
  dt::io::checkpoint mine, taken;
  dt::transport::in_process(1).run([&](dt::transport::in_process::endpoint& ep) {
    EfTrainer t(two_layers(), opts, ep, s);
    struct stop {};
    t.on_step([&](const dt::train::step_metrics& m) {
      if (m.step != 5) return;  // both fragments have exchanged: both residuals hold something
      t.policy().save(mine);
      t.policy().load(further);
      t.policy().save(taken);
      throw stop{};
    });
    try {
      t.fit(small_corpus().data);
    } catch (const stop&) {
    }
  });
  for (int f = 0; f < 2; ++f) {
    const auto key = "comm.streaming_diloco.fragment" + std::to_string(f) + ".codec.own.residual";
    INFO(key);
    REQUIRE(mine.tensors.count(key) == 1);
    const auto own = mine.tensors.at(key).to_vector<float>();
    CHECK(std::count_if(own.begin(), own.end(), [](float v) { return v != 0.0f; }) > 0);
    CHECK(taken.tensors.at(key).to_vector<float>() == own);
  }
  // The shared part is the state taken.
  CHECK(taken.tensors.at("comm.streaming_diloco.global").to_vector<float>() ==
        further.tensors.at("comm.streaming_diloco.global").to_vector<float>());
}

TEST_CASE("streaming_diloco: eager updates with one peer are DiLoCo step for step") {
  // One peer's stand-in, last average + (own_t - own_{t-1}) / 1, is its own pseudo-gradient:
  // the same outer steps as DiLoCo's, up to rounding.
  const auto opts = short_run(13);
  dt::comm::diloco<> d;
  d.inner_steps = 4;
  Streaming s;
  s.inner_steps = 4;
  s.fragments = 1;
  s.eager = true;
  const auto diloco = params_per_step<dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>>>(1, opts, d);
  const auto eager = params_per_step<StreamingTrainer>(1, opts, s);
  REQUIRE(eager[0].size() == 13);
  for (std::size_t step = 0; step < 13; ++step) CHECK(fixture::max_abs_diff(eager[0][step], diloco[0][step]) < 1e-5);
  // The same run without eager updates, overlapping one step, is not: the comparison can fail.
  s.eager = false;
  s.overlap = 1;
  s.mix = 0;
  const auto overlapped = params_per_step<StreamingTrainer>(1, opts, s);
  CHECK(fixture::max_abs_diff(overlapped[0][4], diloco[0][4]) > 1e-3);
}

TEST_CASE("streaming_diloco: eager updates step with the own pseudo-gradient and the others' from the round before") {
  // Three peers, one fragment, H = 3: exchanges after steps 2, 5, 8, the last step 9 ends on the
  // global copy. The expected parameters are computed here from what each peer's inner steps left.
  constexpr int world = 3;
  constexpr std::size_t steps = 10;
  const auto opts = short_run(static_cast<std::int64_t>(steps));
  using Recorded = recorder<Streaming>;
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Recorded>;
  std::vector<std::vector<float>> started(world);
  std::vector<std::vector<std::vector<float>>> before(world);
  Recorded policy;
  policy.inner.inner_steps = 3;
  policy.inner.fragments = 1;
  policy.inner.eager = true;
  policy.started = &started;
  policy.before = &before;
  const auto after = params_per_step<Trainer>(world, opts, policy);
  const dt::comm::outer::nesterov outer;
  auto outer_step = [&](std::vector<float>& params, const std::vector<float>& grad, std::vector<float>& momentum, bool first) {
    dt::kernels::sgd_update(dt::cpu{}, params.data(), grad.data(), momentum.data(), static_cast<std::int64_t>(params.size()),
                            outer.lr, outer.momentum, 0.0, outer.use_nesterov, 0.0, first);
  };
  const auto n = started[0].size();
  REQUIRE(started[1] == started[0]);
  std::vector<std::vector<float>> own(world, started[0]), own_momentum(world, std::vector<float>(n));
  std::vector<std::vector<float>> previous(world);  // each peer's pseudo-gradient of the round before
  std::vector<float> global = started[0], global_momentum(n), previous_average;
  std::size_t rounds = 0;
  for (const std::size_t s : {std::size_t{2}, std::size_t{5}, std::size_t{8}, steps - 1}) {
    std::vector<std::vector<float>> delta(world, std::vector<float>(n));
    std::vector<float> average(n);
    for (std::size_t r = 0; r < world; ++r)
      for (std::size_t i = 0; i < n; ++i) {
        delta[r][i] = own[r][i] - before[r][s][i];
        average[i] += delta[r][i] / world;
      }
    if (s == steps - 1) {
      // The exchange from step 8 and the last one land on the global copy; every peer ends there.
      outer_step(global, previous_average, global_momentum, false);
      outer_step(global, average, global_momentum, false);
      for (std::size_t r = 0; r < world; ++r) CHECK(fixture::max_abs_diff(after[r][s], global) < 1e-5);
      CHECK(after[0][s] == after[1][s]);
      CHECK(after[0][s] == after[2][s]);
      break;
    }
    for (std::size_t r = 0; r < world; ++r) {
      std::vector<float> stand_in(n);
      for (std::size_t i = 0; i < n; ++i)
        stand_in[i] = rounds == 0 ? delta[r][i] / world : previous_average[i] + (delta[r][i] - previous[r][i]) / world;
      outer_step(own[r], stand_in, own_momentum[r], rounds == 0);
      INFO("step " << s << ", peer " << r);
      CHECK(fixture::max_abs_diff(after[r][s], own[r]) < 1e-5);
      CHECK(fixture::max_abs_diff(after[r][s], before[r][s]) > 1e-3);  // the step changed something
      previous[r] = delta[r];
    }
    // The average of the round before arrives with this round's send: the global copy takes it.
    if (rounds > 0) outer_step(global, previous_average, global_momentum, rounds == 1);
    previous_average = average;
    ++rounds;
    // Between exchanges the parameters are the inner steps' alone (no merge when an average lands).
    if (s + 1 < steps - 1)
      for (std::size_t r = 0; r < world; ++r) CHECK(after[r][s + 1] == before[r][s + 1]);
  }
}

TEST_CASE("streaming_diloco: eager updates resume bit for bit, and their state is not taken by a policy without them") {
  const auto opts = short_run(14);
  Streaming s;
  s.inner_steps = 6;
  s.fragments = 2;
  s.eager = true;
  const auto whole = fixture::final_params<StreamingTrainer>(2, two_layers(), opts, s);
  // Fragment 0 exchanges after steps 2 and 8 (its (s + 1) mod 6 is 3): stopped after 5 steps, the
  // exchange from step 2 is in flight and lands after step 8.
  const auto saved = fixture::stop_at<StreamingTrainer>(2, 5, two_layers(), opts, s);
  CHECK(saved[0].counter("comm.streaming_diloco.fragment0.lands_after") == 8);
  CHECK(saved[0].tensors.count("comm.streaming_diloco.eager") == 1);
  const auto resumed = fixture::resume_from<StreamingTrainer>(saved, two_layers(), opts, s);
  CHECK(resumed[0] == whole[0]);
  CHECK(resumed[1] == whole[1]);
  s.eager = false;
  CHECK_THROWS_WITH(fixture::resume_from<StreamingTrainer>(saved, two_layers(), opts, s),
                    Catch::Contains("saved with eager updates, this policy has none"));
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
