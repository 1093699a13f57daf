// Who may cost this peer what before it belongs to the run: strangers (connections that have not
// said and proved who they are) get a deadline and a bounded count, joiners a bounded count (the
// node holds them to membership frames until a view admits them), a caller claiming a live
// peer's rank is refused, and every refusal is counted with its reason (admission_stats).
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_ASIO

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "decentrain/transport/tcp/connection.hpp"

namespace decentrain::transport {

// What became of connections that had not (yet) shown they belong to the run, and how many
// peers came back.
struct tcp_admission_stats {
  std::uint64_t timed_out = 0;        // said no hello (or proved no key) within handshake_timeout
  std::uint64_t evicted = 0;          // closed to make room: over max_pending, or out of descriptors
  std::uint64_t refused = 0;          // no run key, a different one, or a proof that did not verify
  std::uint64_t bad_tags = 0;         // frames whose authentication tag failed (modified, replayed, forged)
  std::uint64_t accept_failures = 0;  // accept() errors (out of descriptors...), each followed by a pause
  std::uint64_t reconnected = 0;      // connections admitted for a rank that had one here before, which
                                      // closed: a peer restarted or rejoining, or a new process taking
                                      // a rank the group forgot (not a duplicate dial, which is dropped)
  std::uint64_t hijacks = 0;          // callers that claimed a rank connected here and alive (refused)
  std::uint64_t joiners_turned_away = 0;  // joiners asked to come back later: max_joiners were waiting
  int pending = 0;                    // connections now between accept and hello
  std::string last_rejected;          // why the last refused connection or bad frame was dropped
};

namespace tcp_detail {

class admission {
 public:
  // ---- counting (any thread) ----
  void timed_out(std::size_t n) {
    std::lock_guard lock(mutex_);
    stats_.timed_out += n;
  }
  void evicted() {
    std::lock_guard lock(mutex_);
    ++stats_.evicted;
  }
  void accept_failed() {
    std::lock_guard lock(mutex_);
    ++stats_.accept_failures;
  }
  void reconnected() {
    std::lock_guard lock(mutex_);
    ++stats_.reconnected;
  }
  void hijack_refused(const std::string& why) {
    std::lock_guard lock(mutex_);
    ++stats_.hijacks;
    stats_.last_rejected = why;
  }
  void joiner_refused() {
    std::lock_guard lock(mutex_);
    ++stats_.joiners_turned_away;
  }
  // A caller refused (before or at its proof), or a frame that failed its tag (`bad_tag`).
  void rejected(const std::string& why, bool bad_tag = false) {
    std::lock_guard lock(mutex_);
    ++(bad_tag ? stats_.bad_tags : stats_.refused);
    stats_.last_rejected = why;
  }
  std::string last_rejected() const {
    std::lock_guard lock(mutex_);
    return stats_.last_rejected;
  }
  tcp_admission_stats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  // ---- strangers (I/O thread) ----
  // Connections accepted that have not shown who they are (a directory request stays one).
  static bool stranger(const connection& c) { return c.rank < 0 && !c.closed; }

  void count_pending(const std::set<std::shared_ptr<connection>>& all) {
    int n = 0;
    for (const auto& c : all) n += stranger(*c);
    std::lock_guard lock(mutex_);
    stats_.pending = n;
  }
  // One stranger less (admitted).
  void admitted_one() {
    std::lock_guard lock(mutex_);
    stats_.pending = std::max(0, stats_.pending - 1);
  }
  int pending() const {
    std::lock_guard lock(mutex_);
    return stats_.pending;
  }

  // The stranger that has waited longest, to close to make room (none: null).
  static std::shared_ptr<connection> oldest_stranger(const std::set<std::shared_ptr<connection>>& all) {
    std::shared_ptr<connection> oldest;
    for (const auto& c : all)
      if (stranger(*c) && (!oldest || c->accepted_at < oldest->accepted_at)) oldest = c;
    return oldest;
  }
  // The strangers past their handshake deadline.
  static std::vector<std::shared_ptr<connection>> overdue(const std::set<std::shared_ptr<connection>>& all,
                                                          std::chrono::milliseconds deadline) {
    const auto now = clock::now();
    std::vector<std::shared_ptr<connection>> out;
    for (const auto& c : all)
      if (stranger(*c) && now - c->accepted_at > deadline) out.push_back(c);
    return out;
  }

 private:
  mutable std::mutex mutex_;
  tcp_admission_stats stats_;
};

}  // namespace tcp_detail
}  // namespace decentrain::transport

#endif  // DECENTRAIN_HAS_ASIO
