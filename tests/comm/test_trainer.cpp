// The trainer with each communication policy on in-process peers: the equivalences that pin
// the policies down, bytes on the wire, and checkpoint/resume of a decentralized run.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <optional>
#include <vector>

#include "support/trainer_fixture.hpp"

namespace dt = decentrain;
using dt::train::trainer_options;

using fixture::flat_params;
using fixture::max_abs_diff;
using fixture::small_corpus;

namespace {

dt::nn::gpt_config tiny_config(std::int64_t) { return fixture::tiny_gpt(); }

template <class Trainer>
std::vector<std::vector<float>> run_peers(int world, trainer_options opts, typename Trainer::comm_policy comm = {},
                                          std::vector<dt::train::fit_result>* results = nullptr) {
  return fixture::final_params<Trainer>(world, fixture::tiny_gpt(), opts, comm, results);
}

template <class Trainer>
std::vector<dt::io::checkpoint> stop_at(int world, std::int64_t step, const trainer_options& opts,
                                        const typename Trainer::comm_policy& comm) {
  return fixture::stop_at<Trainer>(world, step, fixture::tiny_gpt(), opts, comm);
}
template <class Trainer>
std::vector<std::vector<float>> resume_from(const std::vector<dt::io::checkpoint>& saved, const trainer_options& opts,
                                            const typename Trainer::comm_policy& comm) {
  return fixture::resume_from<Trainer>(saved, fixture::tiny_gpt(), opts, comm);
}

}  // namespace

TEST_CASE("trainer: N peers under sync_allreduce match one peer with an N-times batch") {
  trainer_options opts;
  opts.steps = 6;
  opts.eval_batches = 1;
  opts.batch_size = 2;
  using Sync = dt::train::trainer<dt::nn::gpt<dt::cpu>>;
  const auto four = run_peers<Sync>(4, opts);
  opts.batch_size = 8;
  const auto one = run_peers<Sync>(1, opts);
  // Same rows, same init; only the order of float sums differs (per-peer means then an average
  // versus one mean). Six AdamW steps at lr 3e-3 amplify that to a few 1e-6 at most.
  for (int r = 0; r < 4; ++r) CHECK(max_abs_diff(four[static_cast<std::size_t>(r)], one[0]) < 2e-5);
  CHECK(four[1] == four[0]);  // and the peers agree exactly with each other
  CHECK(max_abs_diff(four[0], flat_params(dt::nn::gpt<>(tiny_config(small_corpus().tok.vocab_size()),
                                                                    *std::make_unique<dt::rng>(1337, "init"))
                                                          .parameters())) > 1e-3);  // and it did train
}

using recorded_sync = fixture::probe<dt::comm::sync_allreduce<>>;  // grads of step 0, per peer

// AdamW's m / sqrt(v) ignores a constant factor and clipping rescales, so the test above would
// also pass if the policy summed the gradients instead of averaging them; this one compares the
// gradient itself (it fails with reduce_op::sum: 4x the single peer's).
TEST_CASE("trainer: under sync_allreduce each peer's gradient is the mean over the N-times batch") {
  trainer_options opts;
  opts.steps = 1;
  opts.eval_batches = 1;
  opts.batch_size = 2;
  opts.grad_clip = 0;
  using Sync = dt::train::trainer<dt::nn::gpt<dt::cpu>, recorded_sync>;
  std::vector<std::vector<float>> four(4), one(1);
  recorded_sync p4, p1;
  p4.grads = &four;
  p1.grads = &one;
  run_peers<Sync>(4, opts, p4);
  opts.batch_size = 8;
  run_peers<Sync>(1, opts, p1);
  double largest = 0;
  for (float g : one[0]) largest = std::max(largest, std::abs(static_cast<double>(g)));
  REQUIRE(largest > 1e-3);
  for (int r = 0; r < 4; ++r) CHECK(max_abs_diff(four[static_cast<std::size_t>(r)], one[0]) < 1e-6 * largest * 10);
  CHECK(four[0] == four[3]);
}

namespace {
// Data parallelism whose peer r says its step weighs r + 1 (as if it had taken r + 1 times the
// rows); with `weight` set, every peer says that instead; with `equal_from` set, every peer's
// steps from that one on weigh 1.
struct rank_weighted : dt::parallel::data {
  std::optional<double> weight;
  std::int64_t equal_from = -1;
  template <class Ctx>
  dt::parallel::step_result forward_backward(Ctx& ctx) {
    auto r = dt::parallel::data::forward_backward(ctx);
    r.weight = weight ? *weight : equal_from >= 0 && ctx.step >= equal_from ? 1.0 : ctx.comm.rank() + 1.0;
    return r;
  }
};

// One step of 2 rows, unclipped: the gradients a weighted exchange combines.
trainer_options one_step() {
  trainer_options opts;
  opts.steps = 1;
  opts.eval_batches = 1;
  opts.batch_size = 2;
  opts.grad_clip = 0;
  return opts;
}
// Each of 3 rank_weighted peers' own gradient of that step (local SGD exchanges nothing after
// the backward).
std::vector<std::vector<float>> own_gradients() {
  using Own = dt::train::trainer<dt::nn::gpt<dt::cpu>, fixture::probe<dt::comm::local_sgd<>>, rank_weighted>;
  std::vector<std::vector<float>> own(3);
  fixture::probe<dt::comm::local_sgd<>> p_own;
  p_own.grads = &own;
  fixture::final_params<Own>(3, fixture::tiny_gpt(), one_step(), p_own);
  return own;
}
}  // namespace

TEST_CASE("trainer: sync_allreduce with weighted set averages the replicas' gradients by their step weights") {
  const auto opts = one_step();
  // Each peer's own gradient, then the weighted and the plain mean of the same gradients.
  using Sync = dt::train::trainer<dt::nn::gpt<dt::cpu>, recorded_sync, rank_weighted>;
  const auto own = own_gradients();
  std::vector<std::vector<float>> weighted(3), plain(3);
  recorded_sync p_weighted, p_plain;
  p_weighted.inner.weighted = true;
  p_weighted.grads = &weighted;
  p_plain.grads = &plain;
  run_peers<Sync>(3, opts, p_weighted);
  run_peers<Sync>(3, opts, p_plain);
  std::vector<float> by_weight(own[0].size()), mean(own[0].size());
  for (std::size_t i = 0; i < mean.size(); ++i) {
    by_weight[i] = (1.0f * own[0][i] + 2.0f * own[1][i] + 3.0f * own[2][i]) / 6.0f;
    mean[i] = (own[0][i] + own[1][i] + own[2][i]) / 3.0f;
  }
  double largest = 0;
  for (float g : mean) largest = std::max(largest, std::abs(static_cast<double>(g)));
  REQUIRE(largest > 1e-3);
  const double tolerance = 1e-5 * largest;
  for (int r = 0; r < 3; ++r) {
    CHECK(max_abs_diff(weighted[static_cast<std::size_t>(r)], by_weight) < tolerance);
    CHECK(max_abs_diff(plain[static_cast<std::size_t>(r)], mean) < tolerance);
  }
  CHECK(max_abs_diff(by_weight, mean) > 100 * tolerance);  // the weights change the average
  // A weight that cannot weigh is refused, naming the step.
  for (const double bad : {-2.0, std::nan("")}) {
    rank_weighted liar;
    liar.weight = bad;
    CHECK_THROWS_WITH(fixture::final_params<Sync>(1, fixture::tiny_gpt(), opts, p_plain, nullptr, liar),
                      Catch::Matchers::Contains("gave step 0 the weight") &&
                          Catch::Matchers::Contains("a step's weight must be finite and >= 0"));
  }
}

TEST_CASE("trainer: weighted with a robust aggregator weighs each replica's gradient, and one that cannot weigh is refused") {
  const auto opts = one_step();
  // Each peer's own gradient, then the weighted median of the three (weights 1, 2, 3: per
  // coordinate the value where more than half the weight, 3 of 6, lies at or below it; the mean
  // of two values where exactly half does).
  using Median = fixture::probe<dt::comm::sync_allreduce<dt::compress::identity, dt::collective::median>>;
  using Sync = dt::train::trainer<dt::nn::gpt<dt::cpu>, Median, rank_weighted>;
  const auto own = own_gradients();
  std::vector<std::vector<float>> weighted(3), plain(3);
  Median p_weighted, p_plain;
  p_weighted.inner.weighted = true;
  p_weighted.grads = &weighted;
  p_plain.grads = &plain;
  fixture::final_params<Sync>(3, fixture::tiny_gpt(), opts, p_weighted);
  fixture::final_params<Sync>(3, fixture::tiny_gpt(), opts, p_plain);
  std::size_t differ = 0, off_weighted = 0, off_plain = 0;
  for (std::size_t i = 0; i < own[0].size(); ++i) {
    std::vector<std::pair<float, double>> v = {{own[0][i], 1.0}, {own[1][i], 2.0}, {own[2][i], 3.0}};
    std::sort(v.begin(), v.end());
    const auto mean_of = [](float a, float b) { return static_cast<float>(0.5 * (static_cast<double>(a) + b)); };
    const double two = v[0].second + v[1].second;
    const float by_weight = v[0].second == 3.0 ? mean_of(v[0].first, v[1].first)
                            : two > 3.0        ? v[1].first
                            : two == 3.0       ? mean_of(v[1].first, v[2].first)
                                               : v[2].first;
    const float middle = v[1].first;
    for (int r = 0; r < 3; ++r) {
      off_weighted += weighted[static_cast<std::size_t>(r)][i] != by_weight;
      off_plain += plain[static_cast<std::size_t>(r)][i] != middle;
    }
    differ += by_weight != middle;
  }
  CHECK(off_weighted == 0);  // every peer, every value
  CHECK(off_plain == 0);
  CHECK(differ > own[0].size() / 4);  // the weights change the median
  // sender-mean cannot weigh: refused at the start, naming it.
  using Sender = fixture::probe<dt::comm::sync_allreduce<dt::compress::identity, dt::collective::sender_mean>>;
  Sender sender;
  sender.inner.weighted = true;
  CHECK_THROWS_WITH((fixture::final_params<dt::train::trainer<dt::nn::gpt<dt::cpu>, Sender, rank_weighted>>(
                        2, fixture::tiny_gpt(), opts, sender)),
                    Catch::Matchers::Contains("sync_allreduce: weighted averaging with aggregator 'sender-mean', which cannot weigh"));
}

namespace {
// Runs 3 peers of rank_weighted (peer r's steps weigh r + 1) under `policy` with weighted set, 2
// steps a round; checks every peer ends on the weighted mean of the peers' parameters before
// the round's exchange, and that the weights changed it.
template <class Policy>
void check_weighted_rounds(Policy policy) {
  trainer_options opts;
  opts.steps = 2;
  opts.eval_batches = 1;
  opts.batch_size = 2;
  opts.lr = 1e-2;  // replicas far enough apart that the weights show
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, fixture::probe<Policy>, rank_weighted>;
  std::vector<std::vector<float>> before(3);
  fixture::probe<Policy> p;
  p.inner = policy;
  p.inner.inner_steps = 2;
  p.inner.weighted = true;
  p.before_last = &before;
  const auto after = fixture::final_params<Trainer>(3, fixture::tiny_gpt(), opts, p, nullptr, rank_weighted{});
  std::vector<float> by_weight(before[0].size()), mean(before[0].size());
  for (std::size_t i = 0; i < mean.size(); ++i) {
    // A round of 2 steps: peer r weighs 2 (r + 1); the factor 2 cancels.
    by_weight[i] = (1.0f * before[0][i] + 2.0f * before[1][i] + 3.0f * before[2][i]) / 6.0f;
    mean[i] = (before[0][i] + before[1][i] + before[2][i]) / 3.0f;
  }
  const double tolerance = 2e-6;
  for (int r = 0; r < 3; ++r) CHECK(max_abs_diff(after[static_cast<std::size_t>(r)], by_weight) < tolerance);
  CHECK(max_abs_diff(by_weight, mean) > 100 * tolerance);
}

// Runs 3 peers of rank_weighted whose steps from step 2 on weigh 1 under `policy` (weighted)
// for `steps` steps, whole and stopped after step `stop` then resumed: both must end bit for bit
// alike. Returns the whole run's parameters.
template <class Policy>
std::vector<std::vector<float>> check_resumed_alike(const Policy& policy, std::int64_t steps, std::int64_t stop) {
  trainer_options opts;
  opts.steps = steps;
  opts.eval_batches = 1;
  opts.batch_size = 2;
  opts.lr = 1e-2;
  rank_weighted weights;
  weights.equal_from = 2;
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Policy, rank_weighted>;
  const auto whole = fixture::final_params<Trainer>(3, fixture::tiny_gpt(), opts, policy, nullptr, weights);
  const auto saved = fixture::stop_at<Trainer>(3, stop, fixture::tiny_gpt(), opts, policy, weights);
  const auto resumed = fixture::resume_from<Trainer>(saved, fixture::tiny_gpt(), opts, policy, weights);
  for (std::size_t r = 0; r < 3; ++r) CHECK(resumed[r] == whole[r]);
  return whole;
}
}  // namespace

TEST_CASE("trainer: local SGD, DiLoCo, gossip and push-sum with weighted set average the replicas by their rounds' weights") {
  SECTION("local SGD") { check_weighted_rounds(dt::comm::local_sgd<>{}); }
  // Outer SGD with lr 1 and no momentum: the new global parameters are the weighted mean.
  SECTION("DiLoCo") { check_weighted_rounds(dt::comm::diloco<dt::comm::outer::sgd>{}); }
  // Two fragments, each exchanged at once (no overlap) and taken whole (mix 0): fragment 0 after
  // step 0 (one step's weight), both after the last step (fragment 0 one step's, fragment 1
  // two): every exchange weighs the peers as r + 1 does.
  SECTION("Streaming DiLoCo") {
    dt::comm::streaming_diloco<dt::comm::outer::sgd> streaming;
    streaming.fragments = 2;
    streaming.overlap = 0;
    streaming.mix = 0;
    check_weighted_rounds(streaming);
  }
  // On a ring of 3 each replica hears from both others: the round's mean is the group's.
  SECTION("gossip") { check_weighted_rounds(dt::comm::gossip<dt::comm::topology::ring>{}); }
  SECTION("push-sum") { check_weighted_rounds(dt::comm::push_sum<dt::comm::topology::ring>{}); }
  SECTION("Streaming DiLoCo refuses weighted with eager updates") {
    dt::comm::streaming_diloco<> both;
    both.inner_steps = 4;
    both.fragments = 2;
    both.weighted = both.eager = true;
    trainer_options opts;
    opts.steps = 1;
    opts.eval_batches = 1;
    opts.batch_size = 2;
    using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::streaming_diloco<>>;
    CHECK_THROWS_WITH(fixture::final_params<Trainer>(1, fixture::tiny_gpt(), opts, both),
                      Catch::Matchers::Contains("weighted and eager cannot be set together"));
  }
  SECTION("a fragment's weight is in the checkpoint: stopped with an exchange in flight and resumed, bit for bit") {
    dt::comm::streaming_diloco<> streaming;
    streaming.inner_steps = 4;
    streaming.fragments = 2;
    streaming.overlap = 1;
    streaming.weighted = true;
    // Steps 0 and 1 weigh r + 1, the later ones 1. Fragment 0 is sent after steps 1 and 5,
    // fragment 1 after step 3 (landing after step 4). Stopped after step 3: fragment 1's
    // exchange is in flight (saved with its average), fragment 0 has counted steps 2 and 3.
    const auto whole = check_resumed_alike(streaming, 7, 3);
    // Equal weights move the run: the weights are used.
    streaming.weighted = false;
    const auto equal = check_resumed_alike(streaming, 7, 3);
    CHECK(max_abs_diff(equal[0], whole[0]) > 1e-6);
  }
  SECTION("a round's weight is in the checkpoint: stopped mid-round and resumed, bit for bit") {
    dt::comm::diloco<> diloco;
    diloco.inner_steps = 4;
    diloco.weighted = true;
    // Steps 0 and 1 weigh r + 1, the later ones 1: the first round weighs 4, 6 and 8, and a
    // resumed round that forgot its first two steps would weigh 2, 2 and 2.
    (void)check_resumed_alike(diloco, 6, 2);
  }
  SECTION("gossip's and push-sum's round weights are in the checkpoint: stopped mid-round and resumed, bit for bit") {
    dt::comm::gossip<dt::comm::topology::ring> gossip;
    gossip.inner_steps = 4;
    gossip.weighted = true;
    const auto whole = check_resumed_alike(gossip, 6, 2);
    gossip.weighted = false;
    CHECK(max_abs_diff(check_resumed_alike(gossip, 6, 2)[0], whole[0]) > 1e-6);  // the weights are used
    dt::comm::push_sum<dt::comm::topology::ring> push;
    push.inner_steps = 4;
    push.weighted = true;
    const auto pushed = check_resumed_alike(push, 6, 2);
    push.weighted = false;
    CHECK(max_abs_diff(check_resumed_alike(push, 6, 2)[0], pushed[0]) > 1e-6);
    // A checkpoint saved with the other setting lays its messages out otherwise: refused.
    using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::push_sum<dt::comm::topology::ring>, rank_weighted>;
    auto opts = fixture::small_run(6);
    const auto saved = fixture::stop_at<Trainer>(3, 2, fixture::tiny_gpt(), opts, push);
    push.weighted = true;
    CHECK_THROWS_WITH(fixture::resume_from<Trainer>(saved, fixture::tiny_gpt(), opts, push),
                      Catch::Matchers::Contains("checkpoint: push-sum was saved with weighted off, and this policy has it on"));
  }
}

TEST_CASE("trainer: DiLoCo with H = 1, outer lr 1 and no momentum is local SGD") {
  trainer_options opts;
  opts.steps = 5;
  opts.eval_batches = 1;
  opts.batch_size = 2;
  using Local = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::local_sgd<>>;
  using Diloco = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<dt::comm::outer::sgd>>;
  dt::comm::local_sgd<> every_step;
  every_step.inner_steps = 1;
  dt::comm::diloco<dt::comm::outer::sgd> outer_sgd;
  outer_sgd.inner_steps = 1;
  const auto local = run_peers<Local>(3, opts, every_step);
  const auto diloco = run_peers<Diloco>(3, opts, outer_sgd);
  // global - 1 * (global - mean(local)) rounds differently from mean(local) by an ulp or so,
  // which five AdamW steps amplify to a few 1e-6 (measured 2.4e-6).
  for (int r = 0; r < 3; ++r) CHECK(max_abs_diff(diloco[static_cast<std::size_t>(r)], local[static_cast<std::size_t>(r)]) < 2e-5);
  CHECK(local[0] == local[2]);
}

TEST_CASE("trainer: DiLoCo learns, keeps peers in step and sends H times fewer bytes than sync") {
  trainer_options opts;
  opts.steps = 60;
  opts.eval_batches = 2;
  opts.batch_size = 4;
  std::vector<dt::train::fit_result> sync_r, diloco_r;
  using Sync = dt::train::trainer<dt::nn::gpt<dt::cpu>>;
  using Diloco = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>>;
  dt::comm::diloco<> h10;
  h10.inner_steps = 10;
  run_peers<Sync>(4, opts, {}, &sync_r);
  const auto params = run_peers<Diloco>(4, opts, h10, &diloco_r);
  CHECK(params[0] == params[3]);  // every round ends on the same global parameters
  const double uniform = std::log(static_cast<double>(small_corpus().tok.vocab_size()));
  CHECK(diloco_r[0].final_val_loss < uniform - 0.5);
  CHECK(diloco_r[0].final_val_loss == diloco_r[3].final_val_loss);
  // 60 steps: sync all-reduces gradients 60 times, DiLoCo pseudo-gradients 6 times (both the
  // same size), plus the start broadcast and the evaluation's scalar all-reduce.
  const double ratio = static_cast<double>(sync_r[0].last.bytes_sent) / static_cast<double>(diloco_r[0].last.bytes_sent);
  CHECK(ratio > 8.0);
  CHECK(ratio < 10.5);

  // The trainer attributes bytes to the policy: one all-reduce per step for sync and per round
  // for DiLoCo. The tiny model's 55 KiB gradient goes by recursive doubling, in which each of 4
  // peers sends the whole buffer in each of 2 rounds. At the start the peers compare their codec
  // settings and their parameters' hashes (two 16-byte all-reduces by recursive doubling, 2
  // rounds of 16 bytes each): peers seeded alike hold the same parameters, so no broadcast
  // follows. Only the evaluation's scalar all-reduce is outside the policy.
  dt::rng init(1, "init");
  const auto P = static_cast<std::uint64_t>(dt::nn::gpt<dt::cpu>(tiny_config(small_corpus().tok.vocab_size()), init).parameters().numel());
  REQUIRE(4 * P < dt::collective::options{}.recursive_doubling_below_bytes);
  CHECK(sync_r[0].last.policy_bytes_sent == 60 * 2 * 4 * P + 64);
  CHECK(diloco_r[0].last.policy_bytes_sent == 6 * 2 * 4 * P + 64);
  CHECK(sync_r[0].last.bytes_sent - sync_r[0].last.policy_bytes_sent < 64);
  CHECK(diloco_r[0].last.bytes_sent - diloco_r[0].last.policy_bytes_sent < 64);
}

TEST_CASE("trainer: peers that start from different parameters get the first peer's, broadcast only then") {
  trainer_options opts;
  opts.steps = 2;
  opts.eval_batches = 1;
  opts.batch_size = 2;
  using Sync = dt::train::trainer<dt::nn::gpt<dt::cpu>>;
  std::uint64_t sent[2] = {};
  for (const bool differ : {false, true}) {
    std::vector<std::vector<float>> params(3);
    std::vector<std::uint64_t> policy_bytes(3);
    dt::train::fit_in_process<Sync>(dt::transport::in_process(3), fixture::tiny_gpt(), opts, small_corpus().data, {},
                                    [&](Sync& t) {
                                      if (differ && t.rank() == 2) {  // one value of peer 2's model moved
                                        auto v = flat_params(t.model().parameters());
                                        v[0] += 0.5f;
                                        dt::comm::scatter_values(t.model().parameters(), v);
                                      }
                                      t.on_eval([&, &t = t](const dt::train::eval_point& e) {
                                        params[static_cast<std::size_t>(t.rank())] = flat_params(t.model().parameters());
                                        policy_bytes[static_cast<std::size_t>(t.rank())] = e.policy_bytes_sent;
                                      });
                                    });
    CHECK(params[0] == params[2]);
    CHECK(params[0] == params[1]);
    sent[differ] = policy_bytes[0];
  }
  // The same steps; only the broadcast differs: the whole model went out from peer 0.
  const auto P = static_cast<std::uint64_t>(flat_params(dt::nn::gpt<dt::cpu>(tiny_config(small_corpus().tok.vocab_size()),
                                                                             *std::make_unique<dt::rng>(1, "init"))
                                                            .parameters())
                                                .size());
  CHECK(sent[1] >= sent[0] + 4 * P);
}

TEST_CASE("trainer: a DiLoCo run resumed mid-round from per-peer checkpoints matches the uninterrupted run") {
  trainer_options opts;
  opts.steps = 12;
  opts.eval_batches = 1;
  opts.batch_size = 2;
  using Diloco = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>>;
  dt::comm::diloco<> h5;
  h5.inner_steps = 5;
  const auto whole = run_peers<Diloco>(2, opts, h5);

  // First half: stop after 7 steps (inside the second round) and keep each peer's checkpoint;
  // the schedule must be the full run's, so the run stops through a hook.
  const auto saved = stop_at<Diloco>(2, 7, opts, h5);
  CHECK(saved[0].counter("step") == 7);
  CHECK(saved[0].tensors.count("comm.diloco.global") == 1);
  const auto resumed = resume_from<Diloco>(saved, opts, h5);
  CHECK(resumed[0] == whole[0]);
  CHECK(resumed[1] == whole[1]);

  // Peers restored from different steps are refused on every peer, not trained on.
  const auto& c = small_corpus();
  const auto cfg = tiny_config(c.tok.vocab_size());
  CHECK_THROWS_WITH(dt::transport::in_process(2).run([&](dt::transport::in_process::endpoint& ep) {
    Diloco t(cfg, opts, ep, h5);
    if (ep.rank() == 0) t.restore(saved[0]);
    (void)t.fit(c.data);
  }),
                    Catch::Contains("peers start at different steps (from 0 to 7)"));
}

TEST_CASE("trainer: DiLoCo through PowerSGD gets the parameters' shapes, sends far less, and resumes bit-exact") {
  trainer_options opts;
  opts.steps = 12;
  opts.eval_batches = 1;
  opts.batch_size = 2;
  using Low = dt::comm::diloco<dt::comm::outer::nesterov, dt::compress::powersgd<>>;
  using Diloco = dt::train::trainer<dt::nn::gpt<dt::cpu>, Low>;
  Low h5;
  h5.inner_steps = 5;
  h5.codec.rank = 2;
  std::vector<dt::train::fit_result> low_r, plain_r;
  const auto whole = run_peers<Diloco>(2, opts, h5, &low_r);
  CHECK(whole[0] == whole[1]);
  dt::comm::diloco<> plain;
  plain.inner_steps = 5;
  (void)run_peers<dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>>>(2, opts, plain, &plain_r);
  CHECK(low_r[0].last.policy_bytes_sent * 4 < plain_r[0].last.policy_bytes_sent);

  const auto saved = stop_at<Diloco>(2, 7, opts, h5);
  CHECK(saved[0].tensors.count("comm.diloco.codec.q") == 1);
  const auto resumed = resume_from<Diloco>(saved, opts, h5);
  CHECK(resumed[0] == whole[0]);
  CHECK(resumed[1] == whole[1]);
}

TEST_CASE("trainer: DiLoCo hands Gaia's filter its global parameters: nothing passes, nothing moves, threshold 0 is the codec alone") {
  trainer_options opts;
  opts.steps = 12;
  opts.eval_batches = 1;
  opts.batch_size = 2;
  using Filtered = dt::comm::diloco<dt::comm::outer::sgd, dt::compress::error_feedback<dt::compress::significance<dt::compress::top_k>>>;
  using Plain = dt::comm::diloco<dt::comm::outer::sgd, dt::compress::error_feedback<dt::compress::top_k>>;
  using Gaia = dt::train::trainer<dt::nn::gpt<dt::cpu>, Filtered>;
  Filtered gaia;
  gaia.inner_steps = 5;
  gaia.codec.codec.codec.fraction = 1.0;  // every value the filter lets through, in f32
  Plain plain;
  plain.inner_steps = 5;
  plain.codec.codec.fraction = 1.0;
  std::vector<dt::train::fit_result> none_r, all_r, some_r;

  // A threshold no relative change passes: only updates of weights at zero (whose relative
  // change is unbounded: the biases start there) go out, and every other global parameter, which
  // every round ends on, stays where it started.
  gaia.codec.codec.threshold = 1e30;
  const auto held = run_peers<Gaia>(2, opts, gaia, &none_r);
  dt::rng init(opts.seed, "init");  // as the trainer draws its model
  const auto start = flat_params(dt::nn::gpt<dt::cpu>(tiny_config(small_corpus().tok.vocab_size()), init).parameters());
  REQUIRE(held[0].size() == start.size());
  std::size_t moved = 0, zeros = 0;
  for (std::size_t i = 0; i < start.size(); ++i) {
    zeros += start[i] == 0.0f;
    moved += start[i] != 0.0f && held[0][i] != start[i];
  }
  CHECK(moved == 0);
  CHECK(zeros * 10 < start.size());
  CHECK(held[0] == held[1]);

  // Threshold 0 lets every value that is not zero through: the codec alone, bit for bit.
  gaia.codec.codec.threshold = 0;
  const auto all = run_peers<Gaia>(2, opts, gaia, &all_r);
  const auto alone = run_peers<dt::train::trainer<dt::nn::gpt<dt::cpu>, Plain>>(2, opts, plain);
  CHECK(all[0] == alone[0]);
  CHECK(all[1] == alone[1]);
  CHECK(none_r[0].last.policy_bytes_sent * 5 < all_r[0].last.policy_bytes_sent);

  // 1%: fewer values than all of them, the peers on the same parameters, and the held-back
  // updates (the error feedback's residual) through a checkpoint: resumed bit-exact.
  gaia.codec.codec.threshold = 0.01;
  const auto some = run_peers<Gaia>(2, opts, gaia, &some_r);
  CHECK(some[0] == some[1]);
  CHECK(some[0] != start);
  CHECK(some_r[0].last.policy_bytes_sent < all_r[0].last.policy_bytes_sent);
  const auto saved = stop_at<Gaia>(2, 7, opts, gaia);
  CHECK(saved[0].tensors.count("comm.diloco.codec.own.residual") == 1);
  const auto resumed = resume_from<Gaia>(saved, opts, gaia);
  CHECK(resumed[0] == some[0]);
  CHECK(resumed[1] == some[1]);
}

TEST_CASE("trainer: bad options and mismatched checkpoints are errors") {
  const auto cfg = tiny_config(small_corpus().tok.vocab_size());
  using T = dt::train::trainer<dt::nn::gpt<dt::cpu>>;
  trainer_options bad;
  bad.steps = 0;
  CHECK_THROWS_WITH(T(cfg, bad, dt::transport::in_process(1).at(0)), Catch::Contains("steps must be >= 1"));
  bad = {};
  bad.batch_size = -1;
  CHECK_THROWS_WITH(T(cfg, bad, dt::transport::in_process(1).at(0)), Catch::Contains("batch_size"));
  dt::io::checkpoint ckpt;
  {
    T t(cfg, {}, dt::transport::in_process(2).at(1));
    ckpt = t.capture();
  }
  T other(cfg, {}, dt::transport::in_process(2).at(0));
  CHECK_THROWS_WITH(other.restore(ckpt), Catch::Contains("peer 1 of 2") && Catch::Contains("peer 0 of 2"));
}

TEST_CASE("trainer: compute_dtype bf16 trains with mixed precision, other dtypes are refused") {
  trainer_options opts;
  opts.steps = 30;
  opts.eval_batches = 2;
  opts.compute_dtype = dt::dtype::bf16;
  std::vector<dt::train::fit_result> mixed, full;
  using Sync = dt::train::trainer<dt::nn::gpt<dt::cpu>>;
  run_peers<Sync>(2, opts, {}, &mixed);
  opts.compute_dtype = dt::dtype::f32;
  run_peers<Sync>(2, opts, {}, &full);
  INFO("val loss f32 " << full[0].final_val_loss << ", bf16 " << mixed[0].final_val_loss);
  CHECK(mixed[0].final_val_loss == mixed[1].final_val_loss);
  CHECK(mixed[0].final_val_loss != full[0].final_val_loss);
  CHECK(mixed[0].final_val_loss == Approx(full[0].final_val_loss).epsilon(0.03));
  opts.compute_dtype = dt::dtype::f64;
  CHECK_THROWS_WITH(Sync(tiny_config(small_corpus().tok.vocab_size()), opts, dt::transport::in_process(1).at(0)),
                    Catch::Contains("compute_dtype must be f32 or bf16"));
}

TEST_CASE("trainer: a non-finite loss stops fit with an error naming peer and step, before that step is saved") {
  trainer_options opts;
  opts.steps = 40;
  opts.eval_batches = 1;
  opts.batch_size = 2;
  opts.lr = 999999;  // diverges within a few steps
  opts.warmup_steps = 0;
  opts.grad_clip = 0;
  const auto& c = small_corpus();
  const auto dir = std::filesystem::temp_directory_path() / ("decentrain-nonfinite-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::sync_allreduce<>, dt::parallel::data, dt::fault::checkpoint_every>;
  dt::fault::checkpoint_every saving;
  saving.dir = dir.string();
  saving.every = 1;
  saving.keep_last = 100;
  std::string error;
  std::int64_t last_finite = -1;
  dt::transport::in_process(1).run([&](dt::transport::in_process::endpoint& ep) {
    Trainer t(tiny_config(c.tok.vocab_size()), opts, ep, {}, {}, saving);
    t.on_step([&](const dt::train::step_metrics& m) { last_finite = m.step; });
    try {
      (void)t.fit(c.data);
    } catch (const dt::error& e) {
      error = e.what();
    }
  });
  REQUIRE(last_finite < opts.steps);
  CHECK_THAT(error, Catch::Contains("peer 0 at step " + std::to_string(last_finite) + ": the training loss is") &&
                        Catch::Contains("stop_on_non_finite = false"));
  const auto saved = saving.saved_steps(0, 1);
  REQUIRE(!saved.empty());
  CHECK(saved.back() == last_finite);  // the last step whose loss was finite; nothing of the failing one
  std::filesystem::remove_all(dir);

  opts.stop_on_non_finite = false;
  double val = 0;
  dt::transport::in_process(1).run([&](dt::transport::in_process::endpoint& ep) {
    dt::train::trainer<dt::nn::gpt<dt::cpu>> t(tiny_config(c.tok.vocab_size()), opts, ep);
    val = t.fit(c.data).final_val_loss;
  });
  CHECK(std::isnan(val));  // trained on, as asked
}
