// The stop check (trainer::stop_when with several peers): the group agrees every
// stop_check_every steps whether any peer asked to stop. In the background (the default) the
// check's all-reduce runs beside the steps up to the next check, where its answer is read: the
// peers stop together one check later, and the group does not wait at the checks.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "support/trainer_fixture.hpp"

namespace dt = decentrain;

namespace {

struct stop_run {
  std::vector<std::int64_t> last_step;  // by rank: the steps done when fit returned
  std::vector<int> stopped;             // by rank: fit said it stopped
};

// 24 steps, a stop check every 5, in the background or waiting.
dt::train::trainer_options checked_every_5(bool background) {
  auto opts = fixture::small_run(24);
  opts.batch_size = 2;
  opts.eval_every = 0;
  opts.eval_batches = 1;
  opts.stop_check_every = 5;
  opts.stop_check_in_background = background;
  return opts;
}

// 3 deterministic simulated peers, 24 steps, a check every 5 steps; peer 1 asks to stop from
// step `ask_at` on.
stop_run run(bool background, std::int64_t ask_at) {
  constexpr int world = 3;
  dt::transport::in_process::options o;
  o.deterministic = dt::transport::in_process::deterministic_run{};
  const auto opts = checked_every_5(background);
  dt::comm::diloco<> policy;
  policy.inner_steps = 12;
  stop_run out{std::vector<std::int64_t>(world), std::vector<int>(world)};
  dt::transport::in_process(dt::transport::links::ideal(world), o).run([&](dt::transport::in_process::endpoint& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>> t(fixture::tiny_gpt(), opts, ep, policy);
    t.stop_when([&t, ask_at, r] { return r == 1 && t.step() >= ask_at; });
    out.stopped[r] = t.fit(fixture::small_corpus().data).stopped ? 1 : 0;
    out.last_step[r] = t.step();
  });
  return out;
}

}  // namespace

TEST_CASE("trainer: a stop check in the background stops every peer at the check after the one that saw it") {
  // Peer 1 asks from step 7: the check at step 10 sees it, the group stops at step 15; waiting
  // at each check, it stops at step 10.
  const auto in_background = run(true, 7), waiting = run(false, 7);
  CHECK(in_background.stopped == std::vector<int>{1, 1, 1});
  CHECK(in_background.last_step == std::vector<std::int64_t>{15, 15, 15});
  CHECK(waiting.stopped == std::vector<int>{1, 1, 1});
  CHECK(waiting.last_step == std::vector<std::int64_t>{10, 10, 10});
  // Asked at a check's own step (10): seen there, acted on at 15.
  CHECK(run(true, 10).last_step == std::vector<std::int64_t>{15, 15, 15});
}

TEST_CASE("trainer: a stop check in the background does not hold the group at the check, one that waits does") {
  // Peer 2 holds back after step 10 (before its check there) until the others have done step 15
  // or `patience` has passed, and notes how far they got. In the background they post their
  // check at step 10 and train on to the next check (15), where they read it; waiting, they stay
  // at 10 until peer 2 comes. (Both outcomes are the path taken, not a race: waiting, the others
  // cannot pass step 10 however long peer 2 holds back.) Real threads: lanes are what the
  // background check runs on, which a deterministic simulation does not open.
  const auto held = [](bool background, std::chrono::milliseconds patience) {
    constexpr int world = 3;
    const auto opts = checked_every_5(background);
    dt::comm::diloco<> policy;  // (one exchange, at the end: only the checks meet before it)
    policy.inner_steps = 24;
    std::mutex m;
    std::condition_variable cv;
    std::vector<std::int64_t> done(world, 0);
    std::int64_t others_reached = -1;
    dt::transport::in_process(world).run([&](dt::transport::in_process::endpoint& ep) {
      const auto r = static_cast<std::size_t>(ep.rank());
      dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>> t(fixture::tiny_gpt(), opts, ep, policy);
      t.on_step([&](const dt::train::step_metrics& s) {
        std::unique_lock lock(m);
        done[r] = s.step;
        cv.notify_all();
        if (r != 2 || s.step != 10) return;
        cv.wait_for(lock, patience, [&] { return done[0] >= 15 && done[1] >= 15; });
        others_reached = std::min(done[0], done[1]);
      });
      t.stop_when([] { return false; });
      (void)t.fit(fixture::small_corpus().data);
    });
    return others_reached;
  };
  CHECK(held(true, std::chrono::seconds(60)) == 15);
  CHECK(held(false, std::chrono::milliseconds(500)) == 10);
}
