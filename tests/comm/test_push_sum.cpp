// Push-sum (Stochastic Gradient Push): the total weight kept over 10^4 rounds of a changing,
// irregular directed graph, where D-PSGD's equal weights drift; the exact mean with a tenth of
// the messages lost, given running sums (and what is lost without them); a peer that sends a bad
// weight named; the trainer under push-sum, overlapped (OSGP), resumed bit for bit, and refused
// settings.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "support/trainer_fixture.hpp"

namespace dt = decentrain;

namespace {

// Each replica sends to one or two peers drawn from the round (the same on every replica), so
// in-degrees differ from out-degrees and change every round: a directed, time-varying graph on
// which equal weights do not keep the mean.
struct random_out {
  static constexpr const char* name = "random-out";
  std::vector<int> sends_to(int rank, int n, std::int64_t round) const {
    dt::rng gen(static_cast<std::uint64_t>(round) * 1000003u + static_cast<std::uint64_t>(rank), "test.random_out");
    std::vector<int> out;
    const int count = n > 2 ? 1 + static_cast<int>(gen.below(2)) : 1;
    while (static_cast<int>(out.size()) < count) {
      const int j = static_cast<int>(gen.below(static_cast<std::uint64_t>(n)));
      if (j != rank && std::find(out.begin(), out.end(), j) == out.end()) out.push_back(j);
    }
    return out;
  }
  std::vector<int> receives_from(int rank, int n, std::int64_t round) const {
    std::vector<int> in;
    for (int j = 0; j < n; ++j) {
      const auto to = sends_to(j, n, round);
      if (std::find(to.begin(), to.end(), rank) != to.end()) in.push_back(j);
    }
    return in;
  }
};

struct mixed {
  std::vector<std::vector<float>> values;  // [replica][i] after the last round
  std::vector<std::vector<double>> weights;  // [sample][replica]: the weights every `every` rounds
};

// `rounds` push-sum rounds on n in-process replicas, replica r starting from r * 8 + i.
template <class Topology>
mixed push(int n, int rounds, dt::comm::push_sum_mixer::settings s, int every = 0) {
  mixed out;
  out.values.resize(static_cast<std::size_t>(n));
  if (every > 0) out.weights.assign(static_cast<std::size_t>(rounds / every), std::vector<double>(static_cast<std::size_t>(n)));
  dt::transport::in_process(n).run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator c(ep);
    dt::comm::push_sum_mixer m(s);
    std::vector<float> v(4);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(c.rank() * 8 + static_cast<int>(i));
    for (int t = 0; t < rounds; ++t) {
      m.send(Topology{}, c, t, std::span<const float>(v));
      m.receive(Topology{}, c, t, v.size());
      m.finish(std::span<float>(v));
      if (every > 0 && (t + 1) % every == 0)
        out.weights[static_cast<std::size_t>(t / every)][static_cast<std::size_t>(c.rank())] = m.weight();
    }
    out.values[static_cast<std::size_t>(c.rank())] = v;
  });
  return out;
}

// The largest distance of any replica's value from the starting mean ((n - 1) * 4 + i).
double off_mean(const std::vector<std::vector<float>>& values) {
  const auto n = static_cast<double>(values.size());
  double worst = 0;
  for (const auto& v : values)
    for (std::size_t i = 0; i < v.size(); ++i) worst = std::max(worst, std::abs(v[i] - ((n - 1) * 4.0 + static_cast<double>(i))));
  return worst;
}

}  // namespace

TEST_CASE("push-sum: the total weight is kept to 1e-12 over 10^4 rounds of a changing directed graph, and every replica reaches the mean") {
  const int n = 8;
  const auto out = push<random_out>(n, 10000, {}, 1000);
  bool weights_moved = false;
  for (const auto& sample : out.weights) {
    double total = 0;
    for (const double w : sample) {
      total += w;
      weights_moved = weights_moved || std::abs(w - 1.0) > 1e-3;
    }
    INFO("total weight off by " << std::scientific << total - n);
    CHECK(std::abs(total - n) < 1e-12);
  }
  CHECK(weights_moved);  // the graph is irregular: without the weights the mean would drift
  CHECK(off_mean(out.values) < 1e-4);
  // D-PSGD's equal weights on the same graph: the replicas agree, but not on the mean.
  std::vector<std::vector<float>> dpsgd(static_cast<std::size_t>(n));
  dt::transport::in_process(n).run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator c(ep);
    std::vector<float> v(4), scratch;
    std::vector<double> sum;
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(c.rank() * 8 + static_cast<int>(i));
    for (int t = 0; t < 200; ++t) dt::comm::gossip_round(random_out{}, c, t, std::span<float>(v), scratch, sum);
    dpsgd[static_cast<std::size_t>(c.rank())] = v;
  });
  CHECK(off_mean(dpsgd) > 0.1);
}

TEST_CASE("push-sum: with a tenth of the messages lost, running sums still give every replica the mean, and plain shares lose it") {
  using exp = dt::comm::topology::one_peer_exponential;
  for (int n : {6, 8}) {
    INFO(n << " replicas");
    const auto running = push<exp>(n, 300, {.running_sums = true, .drop_fraction = 0.1, .drop_seed = 7});
    CHECK(off_mean(running.values) < 1e-4);
    const auto directed = push<random_out>(n, 300, {.running_sums = true, .drop_fraction = 0.1, .drop_seed = 7});
    CHECK(off_mean(directed.values) < 1e-4);
    // The same losses without running sums: the replicas still agree, on a value the lost mass moved.
    const auto plain = push<exp>(n, 300, {.running_sums = false, .drop_fraction = 0.1, .drop_seed = 7});
    CHECK(off_mean(plain.values) > 1e-2);
    CHECK(fixture::max_abs_diff(plain.values[0], plain.values[1]) < 1e-4);
  }
}

TEST_CASE("push-sum: a peer that sends a weight that is not positive is named") {
  std::vector<std::string> errors(2);
  dt::transport::in_process(2).run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator c(ep);
    std::vector<float> v(4, 1.0f);
    if (c.rank() == 1) {  // a hand-made message: not lost, weight -1
      std::vector<float> m(8, 0.0f);
      const double lost = 0, weight = -1;
      std::memcpy(m.data(), &lost, sizeof lost);
      std::memcpy(m.data() + 2, &weight, sizeof weight);
      c.send_to(0, std::span<const float>(m));
      return;
    }
    dt::comm::push_sum_mixer mixer;
    try {
      mixer.send(dt::comm::topology::ring{}, c, 0, std::span<const float>(v));
      mixer.receive(dt::comm::topology::ring{}, c, 0, v.size());
    } catch (const std::exception& e) {
      errors[0] = e.what();
    }
  });
  CHECK_THAT(errors[0], Catch::Contains("peer 1 sent the weight -1"));
}

TEST_CASE("trainer: push-sum trains, equals D-PSGD on a regular graph, and its overlapped variant stays close") {
  using push_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::push_sum<>>;
  using gossip_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::gossip<>>;
  const auto opts = fixture::small_run(20);
  std::vector<dt::train::fit_result> results;
  const auto pushed = fixture::final_params<push_trainer>(4, fixture::tiny_gpt(), opts, {}, &results);
  const auto gossiped = fixture::final_params<gossip_trainer>(4, fixture::tiny_gpt(), opts);
  // One peer a round, weight 1/2 each way: every weight stays 1 and push-sum is D-PSGD (summed in
  // another order: equal to rounding).
  for (std::size_t r = 0; r < 4; ++r) {
    INFO("replica " << r);
    CHECK(fixture::max_abs_diff(pushed[r], gossiped[r]) < 1e-5);
    CHECK(results[r].final_val_loss < fixture::uniform_loss());
    CHECK(results[r].evals.back().consensus_distance > 0);
  }
  CHECK(pushed[0] != pushed[1]);
  // OSGP: one round stale; the replicas learn and stay close, by far less than training moved them.
  dt::comm::push_sum<> osgp;
  osgp.overlap = true;
  std::vector<dt::train::fit_result> overlapped;
  const auto o = fixture::final_params<push_trainer>(4, fixture::tiny_gpt(), opts, osgp, &overlapped);
  std::vector<float> start;
  dt::transport::in_process(1).run([&](dt::transport::in_process::endpoint& ep) {
    push_trainer t(fixture::tiny_gpt(), opts, ep);
    start = fixture::flat_params(t.model().parameters());
  });
  for (std::size_t r = 0; r < 4; ++r) {
    CHECK(overlapped[r].final_val_loss < fixture::uniform_loss());
    CHECK(fixture::max_abs_diff(o[r], o[0]) < 0.1 * fixture::max_abs_diff(o[r], start));
    CHECK(fixture::max_abs_diff(o[r], pushed[r]) < 0.05);
  }
  CHECK(o[0] != pushed[0]);
}

TEST_CASE("trainer: push-sum resumed mid-run from per-peer checkpoints matches the uninterrupted run (plain, overlapped, running sums)") {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::push_sum<dt::comm::topology::exponential>>;
  const auto opts = fixture::small_run(12);
  for (const int variant : {0, 1, 2}) {
    INFO("variant " << variant);
    dt::comm::push_sum<dt::comm::topology::exponential> comm;
    comm.inner_steps = variant == 0 ? 2 : 1;
    comm.overlap = variant >= 1;
    comm.running_sums = variant == 2;
    comm.drop_fraction = variant == 2 ? 0.2 : 0.0;
    const auto whole = fixture::final_params<Trainer>(3, fixture::tiny_gpt(), opts, comm);
    const auto saved = fixture::stop_at<Trainer>(3, 5, fixture::tiny_gpt(), opts, comm);
    const auto resumed = fixture::resume_from<Trainer>(saved, fixture::tiny_gpt(), opts, comm);
    for (std::size_t r = 0; r < 3; ++r) CHECK(resumed[r] == whole[r]);
  }
}

TEST_CASE("trainer: push-sum refuses peers that mix differently and a drop fraction outside 0 to 1") {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::push_sum<>>;
  const auto opts = fixture::small_run(2);
  std::vector<std::string> errors(2);
  dt::transport::in_process(2).run([&](dt::transport::in_process::endpoint& ep) {
    dt::comm::push_sum<> comm;
    comm.overlap = ep.rank() == 1;
    try {
      Trainer t(fixture::tiny_gpt(), opts, ep, comm);
      (void)t.fit(fixture::small_corpus().data);
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(ep.rank())] = e.what();
    }
  });
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("the peers mix differently"));
  dt::comm::push_sum<> lossy;
  lossy.drop_fraction = 1;
  CHECK_THROWS_WITH(fixture::final_params<Trainer>(1, fixture::tiny_gpt(), opts, lossy), Catch::Contains("drop_fraction must be in [0, 1)"));
}

namespace {
// One push-sum round on n in-process replicas of random_out, replica r starting from r * 8 + i
// with push-sum weight `w0[r]` (reached by a plain round before, so the weights differ) and round
// weight `rw[r]`, weighted (or not, the round weights then unused): each replica's values and
// weight afterwards, and its values and weight before.
struct weighted_round {
  std::vector<std::vector<float>> before, after;
  std::vector<double> w_before, w_after;
};
weighted_round push_weighted(int n, const std::vector<double>& rw, bool weighted = true) {
  weighted_round out;
  const auto size = static_cast<std::size_t>(n);
  out.before.resize(size);
  out.after.resize(size);
  out.w_before.resize(size);
  out.w_after.resize(size);
  dt::transport::in_process(n).run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator c(ep);
    const auto me = static_cast<std::size_t>(c.rank());
    dt::comm::push_sum_mixer m({.weighted = weighted});
    std::vector<float> v(4);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(c.rank() * 8 + static_cast<int>(i));
    m.send(random_out{}, c, 0, std::span<const float>(v));  // (round weight 1 everywhere: plain push-sum's round)
    m.receive(random_out{}, c, 0, v.size());
    m.finish(std::span<float>(v));
    out.before[me] = v;
    out.w_before[me] = m.weight();
    m.send(random_out{}, c, 1, std::span<const float>(v), rw[me]);
    m.receive(random_out{}, c, 1, v.size());
    m.finish(std::span<float>(v));
    out.after[me] = v;
    out.w_after[me] = m.weight();
  });
  return out;
}
}  // namespace

TEST_CASE("push-sum: weighted, a round weighs each replica by its round weight times its push-sum weight, and the push-sum weights mix as before") {
  const int n = 8;
  const std::vector<double> rw{1, 3, 2, 5, 1, 4, 2, 7};
  const auto o = push_weighted(n, rw);
  // By hand: replica i takes sum_j s_j r_j z_j / sum_j s_j r_j over itself and those that send
  // to it in round 1, s_j = w_j / (d_j + 1) its share of w (d_j: how many it sends to).
  double total_w = 0;
  bool weights_differ = false;
  for (int i = 0; i < n; ++i) {
    const auto ui = static_cast<std::size_t>(i);
    auto from = random_out{}.receives_from(i, n, 1);
    from.push_back(i);
    double num[4] = {0, 0, 0, 0}, den = 0, w = 0;
    for (const int j : from) {
      const auto uj = static_cast<std::size_t>(j);
      const double share = o.w_before[uj] / static_cast<double>(random_out{}.sends_to(j, n, 1).size() + 1);
      den += share * rw[uj];
      w += share;
      for (std::size_t k = 0; k < 4; ++k) num[k] += share * rw[uj] * o.before[uj][k];
    }
    INFO("replica " << i);
    for (std::size_t k = 0; k < 4; ++k) CHECK(std::abs(o.after[ui][k] - num[k] / den) <= 1e-5 * std::max(1.0, std::abs(num[k] / den)));
    CHECK(std::abs(o.w_after[ui] - w) < 1e-12);  // the push-sum weight mixed as if unweighted
    total_w += o.w_after[ui];
    weights_differ = weights_differ || std::abs(o.w_before[ui] - 1) > 1e-3;
  }
  CHECK(weights_differ);  // the round before left unequal push-sum weights: both weights are in the mix
  CHECK(std::abs(total_w - n) < 1e-12);
  // Equal round weights are plain push-sum (to rounding).
  const auto equal = push_weighted(n, std::vector<double>(static_cast<std::size_t>(n), 2.5));
  const auto plain = push_weighted(n, rw, false);
  double moved = 0;
  for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) {
    CHECK(fixture::max_abs_diff(equal.after[r], plain.after[r]) < 1e-5);
    moved = std::max(moved, static_cast<double>(fixture::max_abs_diff(o.after[r], plain.after[r])));
  }
  CHECK(moved > 0.5);  // and the weights move the result
}
