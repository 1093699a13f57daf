// Checks made on peer threads, reported on the test's thread. Catch2 v2 is not thread-safe: a
// CHECK on a peer thread can corrupt its counters or interleave its output, so a peer records
// what it found here and the test reports it once the peers have joined.
#pragma once

#include <catch2/catch.hpp>

#include <cstddef>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace harness {

class peer_checks {
 public:
  // Records a check; `what` is the failure's text when `ok` is false. Returns ok.
  bool expect(bool ok, const std::string& what) {
    std::lock_guard lock(mutex_);
    ++checked_;
    if (!ok) failures_.push_back(what);
    return ok;
  }
  // On the test's thread, after the peers joined: each failure as a failed check, and one
  // more if fewer than `at_least` checks ran (a peer that never got to them fails too).
  void report(std::size_t at_least) const {
    std::lock_guard lock(mutex_);
    for (const auto& f : failures_) FAIL_CHECK(f);
    INFO(checked_ << " checks made on the peers' threads");
    CHECK(checked_ >= at_least);
  }

 private:
  mutable std::mutex mutex_;
  std::size_t checked_ = 0;
  std::vector<std::string> failures_;
};

// Runs fn(r) for r in [0, n), each on a thread of its own, and joins them: what any peer threw,
// one line each ("peer 2: ..."), for the test's thread to check (empty when none threw).
template <class F>
std::string on_peer_threads(int n, F&& fn) {
  std::mutex mutex;
  std::string log;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        log += "peer " + std::to_string(r) + ": " + e.what() + "\n";
      }
    });
  for (auto& t : threads) t.join();
  return log;
}

// On a peer thread, whether `f` throws an E; recorded in `checks`.
template <class E, class F>
bool expect_throws_as(peer_checks& checks, F&& f, const std::string& where) {
  try {
    f();
  } catch (const E&) {
    return checks.expect(true, "");
  } catch (const std::exception& e) {
    return checks.expect(false, where + ": threw another error: " + e.what());
  }
  return checks.expect(false, where + ": nothing thrown");
}

// On a peer thread, whether `f` throws an error whose text contains `text`; recorded in `checks`.
template <class F>
bool expect_throws_with(peer_checks& checks, F&& f, const std::string& text, const std::string& where) {
  std::string got = "nothing thrown";
  try {
    f();
  } catch (const std::exception& e) {
    got = e.what();
    if (got.find(text) != std::string::npos) return checks.expect(true, "");
  }
  return checks.expect(false, where + ": expected an error containing \"" + text + "\", got: " + got);
}

}  // namespace harness

// PEER_CHECK(checks, condition): CHECK for a peer thread; the failure names the condition as
// written and its line.
#define PEER_CHECK(checks, ...) \
  (checks).expect(static_cast<bool>(__VA_ARGS__), std::string(#__VA_ARGS__) + " (" __FILE__ ":" + std::to_string(__LINE__) + ")")
