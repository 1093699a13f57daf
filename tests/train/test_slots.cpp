// The slots proved from outside the library: a gossip policy, a codec and a fault policy that
// checkpoints, each written here against the public headers only, as a user would, and trained;
// plus the library's own checkpoint_every and the fault slot's error routing. (A pipeline, a
// parallel policy that cuts the model, is the library's parallel::pipeline: tests/parallel.)
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <vector>

#include "support/trainer_fixture.hpp"

namespace dt = decentrain;
using dt::train::trainer_options;

namespace {

using fixture::final_params;
using fixture::max_abs_diff;
using fixture::small_corpus;
using fixture::tiny_gpt;
using fixture::uniform_loss;

// ---- a gossip policy: after every step, average parameters with one neighbour (rank ^ 1) ----
struct neighbour_gossip {
  using policy_concept = dt::comm::policy_tag;
  template <class Ctx>
  void start(Ctx& ctx) {
    if (!ctx.resumed) dt::comm::broadcast_parameters(ctx, mine_);
  }
  template <class Ctx>
  void after_backward(Ctx&) {}
  template <class Ctx>
  void after_step(Ctx& ctx) {
    const int partner = ctx.comm.rank() ^ 1;
    if (partner >= ctx.comm.world()) return;
    dt::comm::gather_values(ctx.parameters, mine_);
    theirs_.resize(mine_.size());
    ctx.comm.exchange_with(partner, std::span<const float>(mine_), std::span<float>(theirs_));
    // The lower rank's values first, so both partners compute the same bits.
    const bool lower = ctx.comm.rank() < partner;
    for (std::size_t i = 0; i < mine_.size(); ++i)
      mine_[i] = lower ? 0.5f * (mine_[i] + theirs_[i]) : 0.5f * (theirs_[i] + mine_[i]);
    dt::comm::scatter_values(ctx.parameters, mine_);
  }
  void save(dt::io::checkpoint&) const {}
  void load(const dt::io::checkpoint&) {}

 private:
  std::vector<float> mine_, theirs_;
};

// ---- a codec: fixture::bf16_codec (tests/support/trainer_fixture.hpp), values as bf16 ----
using half_width = fixture::bf16_codec;

// ---- a fault policy that checkpoints in memory every `every` steps and redoes failed steps ----
struct memory_checkpoints {
  using policy_concept = dt::fault::policy_tag;
  std::int64_t every = 4;
  std::map<int, dt::io::checkpoint>* store = nullptr;  // by rank, shared by the test
  std::mutex* lock = nullptr;
  int* errors_seen = nullptr;

  template <class Ctx>
  void start(Ctx& ctx) {
    std::lock_guard g(*lock);
    if (auto it = store->find(ctx.comm.rank()); it != store->end()) ctx.restore(it->second);
  }
  template <class Ctx>
  void after_step(Ctx& ctx) {
    if (ctx.steps_done % every != 0) return;
    auto c = ctx.capture();
    std::lock_guard g(*lock);
    (*store)[ctx.comm.rank()] = std::move(c);
  }
  template <class Ctx>
  dt::fault::action on_error(Ctx&, const dt::transport::peer_error&) {
    std::lock_guard g(*lock);
    ++*errors_seen;
    return dt::fault::action::redo;
  }
};

using fixture::probe;

}  // namespace

TEST_CASE("slots: a gossip policy written outside the library averages with one neighbour and trains") {
  trainer_options opts;
  opts.steps = 40;
  opts.batch_size = 4;
  opts.eval_batches = 2;
  using Gossip = dt::train::trainer<dt::nn::gpt<dt::cpu>, neighbour_gossip>;
  std::vector<dt::train::fit_result> r;
  const auto p = final_params<Gossip>(4, tiny_gpt(), opts, {}, &r);
  CHECK(p[0] == p[1]);  // partners end every step on the same parameters
  CHECK(p[2] == p[3]);
  CHECK(max_abs_diff(p[0], p[2]) > 1e-4);  // the two pairs never talk after the start
  CHECK(r[0].final_val_loss < uniform_loss() - 0.5);
  // Bytes: every step one exchange of the whole model with the partner (the peers start alike: no
  // broadcast, only the 16-byte comparison).
  const auto P = static_cast<std::uint64_t>(p[0].size());
  CHECK(r[0].last.policy_bytes_sent >= 40 * 4 * P);
  CHECK(r[0].last.policy_bytes_sent <= 42 * 4 * P);
}

TEST_CASE("slots: a codec written outside the library compresses sync all-reduce and trains") {
  trainer_options opts;
  opts.steps = 40;
  opts.batch_size = 4;
  opts.eval_batches = 2;
  using Plain = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::sync_allreduce<>>;
  using Half = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::sync_allreduce<half_width>>;
  std::vector<dt::train::fit_result> plain, half;
  final_params<Plain>(2, tiny_gpt(), opts, {}, &plain);
  const auto p = final_params<Half>(2, tiny_gpt(), opts, {}, &half);
  CHECK(p[0] == p[1]);  // every peer decodes the same payloads in the same order
  CHECK(half[0].final_val_loss < uniform_loss() - 0.5);
  CHECK(half[0].final_val_loss == Approx(plain[0].final_val_loss).epsilon(0.02));
  CHECK(half[0].final_val_loss != plain[0].final_val_loss);  // the codec was really used
  // Two peers: identity's recursive doubling sends the 4-byte gradient once per step; the codec
  // sends 2 bytes a value (+ an 8-byte size) once per step.
  const double ratio = static_cast<double>(plain[0].last.policy_bytes_sent) / static_cast<double>(half[0].last.policy_bytes_sent);
  INFO("policy bytes: identity " << plain[0].last.policy_bytes_sent << ", half width " << half[0].last.policy_bytes_sent);
  CHECK(ratio > 1.8);  // the codec's 8-byte sizes keep it below 2
}

TEST_CASE("slots: a fault policy written outside the library checkpoints, resumes exactly and redoes a failed step") {
  trainer_options opts;
  opts.steps = 10;
  opts.batch_size = 2;
  opts.eval_batches = 1;
  dt::comm::diloco<> h3;
  h3.inner_steps = 3;
  using Clean = dt::train::trainer<dt::nn::gpt<dt::cpu>, probe<dt::comm::diloco<>>>;
  using Saved = dt::train::trainer<dt::nn::gpt<dt::cpu>, probe<dt::comm::diloco<>>, dt::parallel::data, memory_checkpoints>;
  probe<dt::comm::diloco<>> plain;
  plain.inner = h3;
  const auto whole = final_params<Clean>(2, tiny_gpt(), opts, plain);

  std::map<int, dt::io::checkpoint> store;
  std::mutex lock;
  int errors = 0;
  memory_checkpoints fault{4, &store, &lock, &errors};
  // A run that fails once at step 5 (the fault policy redoes it) and checkpoints at 4 and 8.
  probe<dt::comm::diloco<>> failing = plain;
  failing.fail_at = 5;
  std::vector<dt::train::fit_result> r;
  const auto redone = final_params<Saved>(2, tiny_gpt(), opts, failing, &r, {}, fault);
  CHECK(errors == 2);  // one per peer
  CHECK(r[0].last.redos == 1);
  CHECK(redone[0] == whole[0]);  // redoing the abandoned exchange changed nothing
  REQUIRE(store.size() == 2);
  CHECK(store[0].counter("step") == 8);

  // A fresh pair of trainers starts from the stored step-8 checkpoints and ends where the
  // uninterrupted run did, bit for bit.
  const auto resumed = final_params<Saved>(2, tiny_gpt(), opts, plain, nullptr, {}, fault);
  CHECK(resumed[0] == whole[0]);
  CHECK(resumed[1] == whole[1]);

  // fault::none rethrows the peer error, naming the peer and the operation.
  using Fragile = dt::train::trainer<dt::nn::gpt<dt::cpu>, probe<dt::comm::diloco<>>>;
  try {
    final_params<Fragile>(2, tiny_gpt(), opts, failing);
    FAIL("fault::none should have rethrown the peer error");
  } catch (const dt::transport::peer_error& e) {
    CHECK(e.operation() == "all_reduce");
    CHECK(std::string(e.what()).find("injected") != std::string::npos);
  }
}

TEST_CASE("fault::checkpoint_every keeps the newest checkpoints and resumes from the newest step every peer has") {
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() / ("decentrain_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  trainer_options opts;
  opts.steps = 12;
  opts.batch_size = 2;
  opts.eval_batches = 1;
  dt::comm::diloco<> h5;
  h5.inner_steps = 5;
  using Plain = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>>;
  using Saving = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>, dt::parallel::data, dt::fault::checkpoint_every>;
  const auto whole = final_params<Plain>(2, tiny_gpt(), opts, h5);

  dt::fault::checkpoint_every ck;
  ck.dir = dir.string();
  ck.every = 4;
  ck.keep_last = 2;
  // Stop after 10 steps (inside a DiLoCo round) through a hook, as a crash would.
  opts.stop_check_every = 1;
  opts.stop_check_in_background = false;  // (at the step asked, not at the check after)
  std::atomic<int> stopped{0};
  dt::transport::in_process(2).run([&](dt::transport::in_process::endpoint& ep) {
    Saving t(tiny_gpt(), opts, ep, h5, {}, ck);
    t.stop_when([&t] { return t.step() == 10; });
    stopped += t.fit(small_corpus().data).stopped ? 1 : 0;
  });
  CHECK(stopped == 2);  // (on the test's thread: Catch2 v2 is not thread-safe)
  // Saved at 4 and 8, and at 10 by on_stop; keep_last = 2 leaves 8 and 10.
  CHECK(ck.saved_steps(0, 2) == std::vector<std::int64_t>{8, 10});
  CHECK(ck.saved_steps(1, 2) == std::vector<std::int64_t>{8, 10});
  // Peer 1 was killed while writing step 10: its newest file is gone. Both resume from step 8.
  fs::remove(ck.file(1, 2, 10));
  const auto resumed = final_params<Saving>(2, tiny_gpt(), opts, h5, nullptr, {}, ck);
  CHECK(resumed[0] == whole[0]);
  CHECK(resumed[1] == whole[1]);
  // That run dropped peer 0's step 10 (of the abandoned run), saved step 12 and kept two per peer.
  CHECK(ck.saved_steps(0, 2) == std::vector<std::int64_t>{8, 12});
  CHECK(ck.saved_steps(1, 2) == std::vector<std::int64_t>{8, 12});

  // A peer with no checkpoints while the other has some is refused with a message naming it.
  fs::remove_all(ck.peer_dir(1, 2));
  CHECK_THROWS_WITH(final_params<Saving>(2, tiny_gpt(), opts, h5, nullptr, {}, ck),
                    Catch::Contains("some peers have checkpoints") && Catch::Contains("others have none"));
  fs::remove_all(dir);
}

TEST_CASE("fault::checkpoint_every passes over a damaged checkpoint: every peer resumes from the newest step intact on all, saying so") {
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() / ("decentrain_ckpt_damaged_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  constexpr int world = 3;
  trainer_options opts;
  opts.steps = 12;
  opts.batch_size = 2;
  opts.eval_batches = 1;
  dt::comm::diloco<> h4;
  h4.inner_steps = 4;
  using Plain = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>>;
  using Saving = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>, dt::parallel::data, dt::fault::checkpoint_every>;
  const auto whole = final_params<Plain>(world, tiny_gpt(), opts, h4);
  dt::fault::checkpoint_every ck;
  ck.dir = dir.string();
  ck.every = 4;
  ck.keep_last = 3;
  (void)final_params<Saving>(world, tiny_gpt(), opts, h4, nullptr, {}, ck);
  for (int r = 0; r < world; ++r) REQUIRE(ck.saved_steps(r, world) == std::vector<std::int64_t>{4, 8, 12});

  // One byte flipped in the middle of a file, or the file cut short.
  auto flip = [](const fs::path& f) {
    const auto at = static_cast<std::streamoff>(fs::file_size(f) / 2);
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    char c = 0;
    io.seekg(at);
    io.get(c);
    io.seekp(at);
    io.put(static_cast<char>(c ^ 0x5a));
  };
  auto cut = [](const fs::path& f) { fs::resize_file(f, fs::file_size(f) - 100); };

  struct peer_outcome {
    std::vector<float> params;
    std::int64_t resumed_at = -1;
    std::map<std::int64_t, std::string> unreadable;
  };
  auto resume_all = [&] {
    std::vector<peer_outcome> out(world);
    std::mutex m;
    dt::transport::in_process(world).run([&](dt::transport::in_process::endpoint& ep) {
      Saving t(tiny_gpt(), opts, ep, h4, {}, ck);
      std::int64_t first = -1;
      std::vector<float> params;
      t.on_step([&first](const dt::train::step_metrics& s) {
        if (first < 0) first = s.step - 1;
      });
      t.on_eval([&](const dt::train::eval_point&) { params = fixture::flat_params(t.model().parameters()); });
      t.fit(small_corpus().data);
      std::lock_guard lock(m);
      auto& o = out[static_cast<std::size_t>(ep.rank())];
      o.params = std::move(params);
      o.resumed_at = first;
      o.unreadable = t.fault().unreadable();
    });
    return out;
  };

  // Peer 1's newest file is damaged: all three resume from step 8, and only peer 1 names a file.
  flip(ck.file(1, world, 12));
  auto out = resume_all();
  for (int r = 0; r < world; ++r) {
    const auto& o = out[static_cast<std::size_t>(r)];
    INFO("peer " << r);
    CHECK(o.resumed_at == 8);
    CHECK(o.params == whole[static_cast<std::size_t>(r)]);
    if (r == 1) {
      REQUIRE(o.unreadable.size() == 1);
      CHECK(o.unreadable.begin()->first == 12);
      CHECK_THAT(o.unreadable.begin()->second, Catch::Contains("step-12.ckpt"));
    } else {
      CHECK(o.unreadable.empty());
    }
    CHECK(ck.saved_steps(r, world) == std::vector<std::int64_t>{4, 8, 12});  // step 12 saved again, whole
  }

  // Peer 0's step 8 damaged and peer 2's step 12 cut short: step 4 is the newest intact on all
  // three (peer 0 still holds an intact step 12, peer 2 an intact step 8).
  flip(ck.file(0, world, 8));
  cut(ck.file(2, world, 12));
  out = resume_all();
  for (int r = 0; r < world; ++r) {
    const auto& o = out[static_cast<std::size_t>(r)];
    INFO("peer " << r);
    CHECK(o.resumed_at == 4);
    CHECK(o.params == whole[static_cast<std::size_t>(r)]);
  }
  CHECK(out[0].unreadable.size() == 1);
  CHECK(out[0].unreadable.count(8) == 1);
  CHECK(out[1].unreadable.empty());
  CHECK(out[2].unreadable.size() == 1);
  CHECK(out[2].unreadable.count(12) == 1);

  // No step intact on every peer: an error that says which files did not read back.
  for (auto step : ck.saved_steps(1, world)) flip(ck.file(1, world, step));
  CHECK_THROWS_WITH(resume_all(), Catch::Contains("no step has a checkpoint that reads back whole on every peer"));
  fs::remove_all(dir);
}
