// Turns for simulated peers on simulated time: the threads of in_process's deterministic mode
// run one at a time, as the events of a discrete-event simulation. A peer runs until it waits
// for a message that has not arrived (or whose arrival lies ahead of its clock), or yields; the
// next to run is the peer whose next event is earliest on the simulated clock: a ready peer's
// clock, a waiting peer's message arrival, or its deadline (then its wait times out). Ties go to
// the lowest rank. Churn events (transport/churn.hpp) are applied between turns, in time order
// with the peers' events. Nothing depends on how the operating system schedules the threads or
// on the wall clock, so the same seed gives the same run, bit for bit, and a failure seen once
// can be replayed.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/churn.hpp"

namespace decentrain::transport::detail {

class turns {
 public:
  // When a waiting peer's wait ends: at a message's arrival (or -infinity: it fails at once),
  // none while it would go on waiting. Called with no peer running.
  using due_fn = std::function<std::optional<double>()>;
  // Applies a churn event with no peer running; false when it does not apply (a kill of a peer
  // that is not running, a start of one that is). A start that applies is then a ready peer at
  // the event's time, whose thread the callback has started (it waits in `await_turn`).
  using apply_fn = std::function<bool(const churn_event&)>;

  struct wake {
    double at = 0.0;
    bool timed_out = false;
  };

  turns(int peers, churn_schedule events, apply_fn apply)
      : peers_(static_cast<std::size_t>(peers)), events_(std::move(events)), apply_(std::move(apply)) {}

  // Before any turn: `rank` is ready at `clock` (the peers that start the run).
  void add(int rank, double clock) {
    std::lock_guard lock(mutex_);
    auto& p = peers_.at(static_cast<std::size_t>(rank));
    p = make(state::ready, clock);
  }
  // Hands out the first turn.
  void begin() {
    std::lock_guard lock(mutex_);
    pass();
  }
  // A peer's thread waits here for its first turn.
  void await_turn(int rank) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return holder_ == rank; });
  }
  // The holder lets peers whose events come before `clock` run first.
  void yield(int rank, double clock) {
    std::unique_lock lock(mutex_);
    hold(rank);
    peers_[static_cast<std::size_t>(rank)] = make(state::ready, clock);
    pass();
    changed_.wait(lock, [&] { return holder_ == rank; });
  }
  // The holder waits until `due` says its wait ends or `deadline` (simulated) comes first.
  wake wait(int rank, double clock, double deadline, due_fn due) {
    std::unique_lock lock(mutex_);
    hold(rank);
    auto& p = peers_[static_cast<std::size_t>(rank)];
    p = make(state::waiting, clock, deadline, std::move(due));
    pass();
    changed_.wait(lock, [&] { return holder_ == rank; });
    return peers_[static_cast<std::size_t>(rank)].woke;
  }
  // The holder's thread ends.
  void end(int rank) {
    std::lock_guard lock(mutex_);
    hold(rank);
    peers_[static_cast<std::size_t>(rank)] = make(state::done);
    pass();
  }
  // Blocks until every peer has ended (churn events still due then are dropped).
  void await_all() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return finished_; });
  }

 private:
  enum class state { absent, ready, waiting, done };
  struct peer {
    state now = state::absent;
    double clock = 0.0;
    double deadline = 0.0;
    due_fn due;
    wake woke;
  };
  static peer make(state now, double clock = 0.0, double deadline = 0.0, due_fn due = nullptr) {
    peer p;
    p.now = now;
    p.clock = clock;
    p.deadline = deadline;
    p.due = std::move(due);
    return p;
  }

  void hold(int rank) const {
    decentrain::detail::check(holder_ == rank, "in_process: peer ", rank,
                              " acted out of turn (a deterministic run's peers use their endpoints on their own thread only)");
  }

  // Picks the next holder (applying the churn events that come first) and wakes it.
  void pass() {
    for (;;) {
      double best_at = std::numeric_limits<double>::infinity();
      int best = -1;
      bool times_out = false;
      bool any = false;
      for (std::size_t r = 0; r < peers_.size(); ++r) {
        auto& p = peers_[r];
        if (p.now != state::ready && p.now != state::waiting) continue;
        any = true;
        double at = p.clock;
        bool to = false;
        if (p.now == state::waiting) {
          const auto d = p.due();
          if (d && *d <= p.clock) {
            at = p.clock;  // landed by the peer's clock: taken now, also by a wait that ends at once (a poll)
          } else {
            at = d ? std::max(p.clock, *d) : p.deadline;
            if (!(at < p.deadline)) at = p.deadline, to = true;  // a message landing after the deadline is too late
          }
        }
        if (at < best_at || best < 0) best_at = at, best = static_cast<int>(r), times_out = to;
      }
      if (!any) {  // every peer ended: the run is over
        holder_ = -1;
        finished_ = true;
        changed_.notify_all();
        return;
      }
      if (next_event_ < events_.size() && events_[next_event_].at_s <= best_at) {
        const auto e = events_[next_event_];
        const auto& slot = peers_.at(static_cast<std::size_t>(e.rank));
        // A start waits until the rank's killed process has had its turn and ended (its clock
        // may be past its kill): two threads never share a rank's turn.
        const bool old_process_runs = e.what == churn_event::kind::start && (slot.now == state::ready || slot.now == state::waiting);
        if (!old_process_runs) {
          ++next_event_;
          if (apply_(e) && e.what == churn_event::kind::start) peers_.at(static_cast<std::size_t>(e.rank)) = make(state::ready, e.at_s);
          continue;
        }
      }
      auto& p = peers_[static_cast<std::size_t>(best)];
      if (p.now == state::waiting) p.woke = wake{times_out ? p.deadline : best_at, times_out};
      p.now = state::ready;
      p.due = nullptr;
      holder_ = best;
      changed_.notify_all();
      return;
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<peer> peers_;
  churn_schedule events_;
  std::size_t next_event_ = 0;
  apply_fn apply_;
  int holder_ = -1;
  bool finished_ = false;
};

}  // namespace decentrain::transport::detail
