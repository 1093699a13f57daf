// CHOCO-SGD: compressed gossip that reaches consensus through biased codecs at its default
// consensus step and diverges at step 1 (why the default is what it is), keeping the mean; the
// trainer under CHOCO, resumed bit for bit; what is refused.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "support/trainer_fixture.hpp"

namespace dt = decentrain;

namespace {

struct outcome {
  std::vector<std::vector<float>> values;  // after the last round
  std::string error;                       // what stopped a replica, if anything did
};

// `rounds` CHOCO rounds on a ring of n in-process replicas, replica r starting from sin(r + i).
template <class Codec>
outcome gossip(int n, int rounds, double gamma, Codec codec, std::size_t size = 512) {
  outcome out;
  out.values.resize(static_cast<std::size_t>(n));
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  dt::transport::in_process(n).run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator c(ep);
    dt::comm::choco_mixer mixer;
    Codec mine = codec;
    std::vector<float> v(size);
    for (std::size_t i = 0; i < size; ++i) v[i] = static_cast<float>(std::sin(c.rank() * 1.7 + static_cast<double>(i)));
    try {
      for (int t = 0; t < rounds; ++t) mixer.round(dt::comm::topology::ring{}, mine, c, gamma, std::span<float>(v));
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(c.rank())] = e.what();
    }
    out.values[static_cast<std::size_t>(c.rank())] = v;
  });
  for (const auto& e : errors)
    if (!e.empty()) out.error = e;
  return out;
}

double mean_error(const std::vector<std::vector<float>>& values, int n) {
  double worst = 0;
  for (std::size_t i = 0; i < values[0].size(); ++i) {
    double start = 0, now = 0;
    for (int r = 0; r < n; ++r) {
      start += std::sin(r * 1.7 + static_cast<double>(i)) / n;
      now += values[static_cast<std::size_t>(r)][i] / n;
    }
    worst = std::max(worst, std::abs(now - start));
  }
  return worst;
}

}  // namespace

TEST_CASE("choco: top-1% diverges at consensus step 1 and reaches consensus at the default, as sign does, keeping the mean") {
  const int n = 16;
  const double initial = fixture::spread(gossip(n, 0, 0.1, dt::compress::sign{}).values);
  dt::compress::top_k top;
  top.fraction = 0.01;
  // The default: a third of each codec's fidelity on a Gaussian vector of the payload's size.
  const double sign_gamma = dt::comm::choco<>::fidelity(dt::compress::sign{}, 512) / 3;
  const double top_gamma = dt::comm::choco<dt::comm::topology::ring, dt::compress::top_k>::fidelity(top, 512) / 3;
  INFO("default steps: sign " << sign_gamma << ", top-1% " << top_gamma);
  CHECK(sign_gamma == Approx(0.21).margin(0.02));
  CHECK(top_gamma < 0.05);
  const auto sign = gossip(n, 1500, sign_gamma, dt::compress::sign{});
  const auto topk = gossip(n, 3000, top_gamma, top);
  for (const auto* settled : {&sign, &topk}) {
    INFO("spread " << fixture::spread(settled->values) << " of " << initial << ", mean off by " << mean_error(settled->values, n));
    CHECK(settled->error.empty());
    CHECK(fixture::spread(settled->values) < 1e-2 * initial);
    CHECK(mean_error(settled->values, n) < 1e-4);
  }
  // Top-1% at step 1, and at 0.1: what the codec leaves out overshoots, and the replicas diverge.
  for (const double wild_gamma : {1.0, 0.1}) {
    const auto wild = gossip(n, 3000, wild_gamma, top);
    INFO("top-1% at step " << wild_gamma << ": spread " << fixture::spread(wild.values) << (wild.error.empty() ? "" : ", " + wild.error));
    CHECK((!wild.error.empty() || fixture::spread(wild.values) > initial));
  }
}

TEST_CASE("trainer: CHOCO with sign trains, its replicas stay close, and it resumes bit for bit") {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::choco<>>;
  const auto opts = fixture::small_run(20);
  std::vector<dt::train::fit_result> results;
  const auto four = fixture::final_params<Trainer>(4, fixture::tiny_gpt(), opts, {}, &results);
  std::vector<float> start;
  dt::transport::in_process(1).run([&](dt::transport::in_process::endpoint& ep) {
    Trainer t(fixture::tiny_gpt(), opts, ep);
    start = fixture::flat_params(t.model().parameters());
  });
  // Barely mixing (gamma 0.001): the replicas drift apart by more than the default lets them.
  dt::comm::choco<> barely;
  barely.consensus_step = 0.001;
  std::vector<dt::train::fit_result> apart;
  (void)fixture::final_params<Trainer>(4, fixture::tiny_gpt(), opts, barely, &apart);
  for (std::size_t r = 0; r < 4; ++r) {
    CHECK(results[r].final_val_loss < fixture::uniform_loss());
    CHECK(results[r].evals.back().consensus_distance > 0);
    CHECK(results[r].evals.back().consensus_distance < 0.5 * apart[r].evals.back().consensus_distance);
    CHECK(four[r] != start);
  }
  dt::comm::choco<> comm;
  comm.inner_steps = 2;
  const auto whole = fixture::final_params<Trainer>(3, fixture::tiny_gpt(), fixture::small_run(12), comm);
  const auto resumed = fixture::resume_from<Trainer>(fixture::stop_at<Trainer>(3, 5, fixture::tiny_gpt(), fixture::small_run(12), comm),
                                                     fixture::tiny_gpt(), fixture::small_run(12), comm);
  for (std::size_t r = 0; r < 3; ++r) CHECK(resumed[r] == whole[r]);
}

TEST_CASE("trainer: CHOCO refuses a graph that changes with the round, codecs with a round of their own, and a step outside 0 to 1") {
  const auto opts = fixture::small_run(2);
  using changing = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::choco<dt::comm::topology::one_peer_exponential>>;
  CHECK_THROWS_WITH(fixture::final_params<changing>(4, fixture::tiny_gpt(), opts), Catch::Contains("changes its neighbours with the round"));
  using ef = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::choco<dt::comm::topology::ring, dt::compress::error_feedback<dt::compress::sign>>>;
  CHECK_THROWS_WITH(fixture::final_params<ef>(2, fixture::tiny_gpt(), opts), Catch::Contains("runs a collective of its own"));
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::choco<>>;
  dt::comm::choco<> wild;
  wild.consensus_step = 1.5;
  CHECK_THROWS_WITH(fixture::final_params<Trainer>(2, fixture::tiny_gpt(), opts, wild), Catch::Contains("consensus_step must be in (0, 1]"));
  using directed = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::choco<dt::comm::topology::exponential>>;
  CHECK_THROWS_WITH(fixture::final_params<directed>(4, fixture::tiny_gpt(), opts), Catch::Contains("public copies (ring, torus), so it needs an undirected graph"));
}
