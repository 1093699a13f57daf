// Where received messages wait until a recv asks for them: one FIFO per (source, tag), a
// condition variable, a timeout, and a way to fail every waiter when a peer or the network is
// gone (so a peer blocked on a dead neighbour gets an error instead of hanging), and the
// membership alarm (transport/membership.hpp): a message to alarm_tag is not queued but makes
// every wait outside the membership channel fail until the next view is installed.
//
// A receiver that already knows where the next messages of a (source, tag) should land can post
// that memory first, one piece per message in order; the network thread then reads each body
// straight into its piece instead of into a fresh buffer that the receiver would copy out of (a
// copy and an allocation a message, which in a ring all-reduce is as much memory traffic as the
// reduction itself).
//
// Budgets (a network transport's: tcp sets them, in_process queues without limit): a message is
// queued only when this peer accepts it from its source. It accepts what a receiver posted memory
// for, what a receiver said it expects (expect(): a collective's step, before it sends its own
// part, so that peers that all send before they receive never wait on one another), what a
// tag's standing allowance covers (allow(): a handoff), and beyond those at most
// `budget::bytes_per_peer` from each source. The network thread asks room() before it reads a
// body; without room it stops reading that source (its sender then waits, as TCP's flow control
// makes it) until a receiver takes something of it, posts memory or expects more. A source whose
// queued messages nobody takes while a receive waits for another of its messages (a tag nobody
// reads, flooded) is over its budget: once the receive has waited `budget::grace`, what it queued
// is dropped and the receive fails naming it (failure_cause::convicted). A peer that holds the
// run's key can stall one receive, but cannot make a peer hold more than it accepts.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "decentrain/detail/activity.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/membership.hpp"
#include "decentrain/transport/peer_error.hpp"
#include "decentrain/transport/tag.hpp"

namespace decentrain::transport::detail {

// Which of a receiver's acceptances a queued message is counted against (see budgets above).
enum class accepted_as : std::uint8_t { budget, expected, allowed, control };

struct message {
  bytes payload;
  double arrival = 0.0;        // simulated arrival time (in_process); 0 elsewhere
  std::uint64_t sequence = 0;  // per source, in the order pushed (set by the mailbox)
  accepted_as as = accepted_as::budget;  // (room() says which)
};

// What a source may hold here (see the top of this file).
struct budget {
  std::uint64_t bytes_per_peer = std::numeric_limits<std::uint64_t>::max();
  std::chrono::milliseconds grace{5000};
};

class mailbox {
  using key = std::pair<int, tag_type>;

 public:
  void set_budget(budget b) {
    std::lock_guard lock(mutex_);
    budget_ = b;
  }

  void push(int source, tag_type tag, message m) {
    {
      std::lock_guard lock(mutex_);
      if (forgotten_.count(source)) return;
      m.sequence = ++pushed_[source];
      if (tag == alarm_tag) {
        raise(source, m);
      } else {
        count(source, tag, m, +1);
        queues_[{source, tag}].push_back(std::move(m));
      }
    }
    ready_.notify_all();
  }

  // ---- budgets ----

  // A receiver that knows its next messages from `source` on `tag` (a collective's step) says
  // so before it sends its own: up to `size` bytes of them are queued beyond the budget.
  // What came ahead of the expectation (queued against the budget) is counted against it now.
  void expect(int source, tag_type tag, std::uint64_t size) {
    std::unique_lock lock(mutex_);
    const key k{source, tag};
    if (auto q = queues_.find(k); q != queues_.end())
      for (auto& m : q->second)
        if (m.as == accepted_as::budget && m.payload.size() <= size) {
          count(source, tag, m, -1);
          m.as = accepted_as::expected;
          size -= m.payload.size();
        }
    if (size > 0) {
      if (!expected_.count(k)) {
        expectation_order_.push_back(k);
        if (expectation_order_.size() > max_expectations)  // those met since are no longer held
          std::erase_if(expectation_order_, [&](const key& o) { return !expected_.count(o) && o != k; });
        if (expectation_order_.size() > max_expectations) {  // the oldest goes (a sender that never sent)
          expected_.erase(expectation_order_.front());
          expectation_order_.pop_front();
        }
      }
      expected_[k] += size;
    }
    wake_if_paused(lock, source);
  }
  // Up to `size` bytes from each source on `tag` are queued beyond the budget, whenever they
  // come (a leaver's handoff, written before its goodbye).
  void allow(tag_type tag, std::uint64_t size) {
    std::vector<std::function<void()>> wake;
    {
      std::lock_guard lock(mutex_);
      allowed_[tag] = size;
      for (auto& [source, p] : paused_) wake.push_back(std::move(p.resume));
      paused_.clear();
    }
    for (auto& w : wake)
      if (w) w();
  }

  // Whether a body of `length` bytes from `source` on `tag` may be queued now, and against what
  // (the message pushed then carries it). When it may not, the source's reading stops here:
  // `resume` is called (once, without the lock, from whichever thread made room) when a receiver
  // took something of it, posted memory for it, expected more, or it was forgotten or dropped;
  // the network thread then asks again.
  std::optional<accepted_as> room(int source, tag_type tag, std::size_t length, std::function<void()> resume) {
    {
      std::lock_guard lock(mutex_);
      if (const auto e = expected_.find({source, tag}); e != expected_.end() && e->second >= length) {
        if ((e->second -= length) == 0) expected_.erase(e);
        return accepted_as::expected;
      }
      // The membership protocol's small messages (reports, views, echoes, markers, alarms) never
      // wait behind a peer's data: they have a room of their own.
      if (is_membership_tag(tag) && length <= max_control_message && control_bytes_[source] + length <= max_control_queued)
        return accepted_as::control;
      if (const auto a = allowed_.find(tag); a != allowed_.end() && allowed_bytes_[{source, tag}] + length <= a->second)
        return accepted_as::allowed;
      if (queued_bytes_[source] + length <= budget_.bytes_per_peer || forgotten_.count(source)) return accepted_as::budget;
      paused_[source] = paused{std::move(resume), std::chrono::steady_clock::now()};
    }
    ready_.notify_all();  // a receive waiting on `source` now has a time to look again (throw_if_stuck)
    return std::nullopt;
  }
  // What `source` has queued here, not taken yet.
  std::uint64_t queued_bytes(int source) const {
    std::lock_guard lock(mutex_);
    const auto it = queued_bytes_.find(source);
    return it == queued_bytes_.end() ? 0 : it->second;
  }
  // Sources found over their budget (their queued messages dropped), and how often.
  std::map<int, std::uint64_t> over_budget() const {
    std::lock_guard lock(mutex_);
    return over_budget_;
  }

  // The next message from `source` with `tag`; throws when `timeout` passes first, when
  // `source` was closed, or when the whole mailbox was failed.
  message pop(int source, tag_type tag, std::chrono::milliseconds timeout) {
    const int sources[1] = {source};
    return pop_any(sources, tag, timeout).second;
  }

  // The next message with `tag` from whichever of `sources` has one, and who sent it: of those
  // queued, the one that arrived first (simulated arrival; in the order of `sources` where they
  // tie), each source's own in order. Throws as pop() does, for the first source that can send
  // nothing more while none is queued (the caller leaves it out and asks again), and when
  // `timeout` passes first (naming the source when there is one).
  std::pair<int, message> pop_any(std::span<const int> sources, tag_type tag, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    const auto started = std::chrono::steady_clock::now();
    const auto deadline = started + timeout;
    for (;;) {
      if (auto m = take_first_of(sources, tag)) {
        wake_if_paused(lock, m->first);
        return std::move(*m);
      }
      auto next_check = deadline;
      for (const int source : sources) {
        throw_if_unreachable(source, tag);
        throw_if_stuck(lock, source, tag, started);
        next_check = std::min(next_check, next_stuck_check(source, started));
      }
      if (ready_.wait_until(lock, next_check) == std::cv_status::timeout && std::chrono::steady_clock::now() >= deadline &&
          !any_queued(sources, tag, std::numeric_limits<double>::infinity()))
        timed_out_any(sources, tag, timeout, not_taken(sources));
    }
  }
  // The same without waiting: none when no source has one queued (by simulated time `now`).
  std::optional<std::pair<int, message>> try_pop_any(std::span<const int> sources, tag_type tag,
                                                     double now = std::numeric_limits<double>::infinity()) {
    std::unique_lock lock(mutex_);
    if (auto m = take_first_of(sources, tag, now)) {
      wake_if_paused(lock, m->first);
      return m;
    }
    for (const int source : sources) throw_if_unreachable(source, tag);
    return std::nullopt;
  }
  // A wait's end at its timeout names the call this thread was in (detail::activity) and, in
  // `unread`, what the sources sent that no wait took: calls that do not match on the two sides
  // (a recv_from without its send_to; a collective against another) look so, though messages of
  // a later call that came early are listed too.
  [[noreturn]] static void timed_out_any(std::span<const int> sources, tag_type tag, std::chrono::milliseconds timeout,
                                         const std::string& unread = {}) {
    if (sources.size() == 1) timed_out(sources.front(), tag, timeout, unread);
    std::string list;
    for (const int s : sources) list += (list.empty() ? "" : ", ") + std::to_string(s);
    transport::fail_peer_because(failure_cause::silent, -1, "receive", "transport: no message from any of peers ", list, " (",
                                 describe_tag(tag), ") within ", timeout.count(), " ms", in_call(),
                                 ": they are slow, partitioned or have failed", unread);
  }

  // ---- turns on simulated time (in_process's deterministic mode) ----

  // An alarm that takes effect when it arrives (m.arrival), not when it is sent: a peer whose
  // clock is behind the sender's, or across a partition, does not hear it early.
  void push_alarm_arriving(int source, message m) {
    std::lock_guard lock(mutex_);
    if (forgotten_.count(source)) return;
    m.sequence = ++pushed_[source];
    pending_alarms_.emplace_back(source, std::move(m));
  }
  // A closed connection (a killed peer's, a goodbye) that this peer learns of at `arrival`.
  void close_arriving(int source, std::string reason, failure_cause cause, double arrival) {
    std::lock_guard lock(mutex_);
    pending_closures_.push_back({source, closure{std::move(reason), cause}, arrival});
  }
  // Raises the alarms and closes what has arrived by simulated time `now`.
  void arrived(double now) {
    std::lock_guard lock(mutex_);
    std::stable_sort(pending_alarms_.begin(), pending_alarms_.end(),
                     [](const auto& a, const auto& b) { return a.second.arrival < b.second.arrival; });
    while (!pending_alarms_.empty() && pending_alarms_.front().second.arrival <= now) {
      raise(pending_alarms_.front().first, pending_alarms_.front().second);
      pending_alarms_.erase(pending_alarms_.begin());
    }
    std::erase_if(pending_closures_, [&](const pending_closure& c) {
      if (c.arrival > now) return false;
      closed_.emplace(c.source, c.why);
      return true;
    });
  }

  // The same for a wait on any of `sources`: the earliest of theirs.
  std::optional<double> due_any(std::span<const int> sources, tag_type tag) const {
    std::optional<double> at;
    for (const int source : sources)
      if (const auto d = due(source, tag); d && (!at || *d < *at)) at = d;
    return at;
  }
  // When a wait for the next message from `source` with `tag` ends: at that message's arrival
  // time, or at once (-infinity) when it would fail now; none while it would still wait.
  std::optional<double> due(int source, tag_type tag) const {
    std::lock_guard lock(mutex_);
    std::optional<double> at;
    if (auto it = queues_.find({source, tag}); it != queues_.end() && !it->second.empty()) at = it->second.front().arrival;
    try {
      throw_if_unreachable(source, tag);
    } catch (const peer_error&) {
      return -std::numeric_limits<double>::infinity();
    }
    if (!is_membership_tag(tag))  // an alarm on the way ends the wait when it lands
      for (const auto& [from, m] : pending_alarms_)
        if (!at || m.arrival < *at) at = m.arrival;
    for (const auto& c : pending_closures_)  // so does the source's closed connection
      if (c.source == source && (!at || c.arrival < *at)) at = c.arrival;
    return at;
  }
  [[noreturn]] static void timed_out(int source, tag_type tag, std::chrono::milliseconds timeout,
                                     const std::string& unread = {}) {
    transport::fail_peer_because(failure_cause::silent, source, "receive", "transport: no message from peer ", source, " (",
                                 describe_tag(tag), ") within ", timeout.count(), " ms", in_call(),
                                 ": the peer is slow, partitioned or has failed", unread);
  }
  static std::string in_call() {
    const char* call = decentrain::detail::this_thread_activity().call;
    return call ? std::string(" in ") + call : std::string();
  }
  // Empty again, as a new process's (a simulated peer started again under its rank).
  void reset() {
    std::lock_guard lock(mutex_);
    queues_.clear();
    posted_.clear();
    spares_.clear();
    closed_.clear();
    failure_.clear();
    fatal_.clear();
    failed_peer_ = -1;
    pushed_.clear();
    last_taken_.clear();
    forgotten_.clear();
    barred_.clear();
    epoch_ = 0;
    alarm_.reset();
    pending_alarms_.clear();
    pending_closures_.clear();
    queued_bytes_.clear();
    allowed_bytes_.clear();
    control_bytes_.clear();
    expected_.clear();
    expectation_order_.clear();
    paused_.clear();
    over_budget_.clear();
  }

  // ---- posted receives (the receiving thread) ----

  // Receives the next into.size() messages from `source` with `tag`, the i-th into into[i] (used
  // only when the sizes match), and calls landed(i, size) for each, in order, as it arrives (on
  // this thread, without the lock, while later messages may still be landing). `start` runs
  // after the memory is posted and before the wait, so what the caller sends in it can already
  // be answered in place. When `timeout` passes between two messages while the network thread
  // is writing into posted memory, `stuck` must make it stop (close the connection); this
  // returns only once nothing writes into `into` any more, also when it (or `landed`) throws.
  template <class Start, class Stuck, class Landed>
  void receive_into(int source, tag_type tag, std::span<const std::span<std::byte>> into, std::chrono::milliseconds timeout,
                    Start&& start, Stuck&& stuck, Landed&& landed) {
    const key k{source, tag};
    {
      std::unique_lock lock(mutex_);
      decentrain::detail::check(!posted_.count(k), "transport: two receives from peer ", source, " (tag ", tag,
                                ") wait at once; one endpoint serves one receiving thread");
      if (!into.empty()) {
        auto& postings = posted_[k];
        for (const auto& i : into) postings.push_back(posting{i});
      }
      wake_if_paused(lock, source);  // a paused reader may land its frame in this memory
    }
    // From here `into` may be written by the network thread: settle the postings on every way out.
    try {
      start();
      for (std::size_t i = 0; i < into.size(); ++i) landed(i, next_landed(k, into[i], timeout));
    } catch (...) {
      withdraw(k, stuck, timeout);
      throw;
    }
  }

  // ---- posted receives (the network thread) ----

  // The memory posted for the next message from `source` with `tag` when it is exactly `length`
  // bytes and nothing of that (source, tag) is queued before it; the caller then reads the body
  // into it and reports `landed` or `abandoned`. Otherwise nothing: read into a buffer and push.
  std::optional<std::span<std::byte>> claim(int source, tag_type tag, std::size_t length) {
    std::lock_guard lock(mutex_);
    auto p = posted_.find({source, tag});
    if (p == posted_.end() || queued(source, tag)) return std::nullopt;
    // Postings before the first open one have their messages (landed, or being written).
    for (auto& q : p->second)
      if (q.state == posting::state_type::open) {
        if (q.into.size() != length) return std::nullopt;
        q.state = posting::state_type::claimed;
        // It lands in place: what the receiver expected of it is taken.
        if (const auto e = expected_.find({source, tag}); e != expected_.end())
          if ((e->second -= std::min<std::uint64_t>(e->second, length)) == 0) expected_.erase(e);
        return q.into;
      }
    return std::nullopt;
  }
  void landed(int source, tag_type tag) { settle(source, tag, posting::state_type::landed); }

  // A buffer of `size` bytes for a body that lands in no posted memory: one that a receive_into
  // copied out of before, when one is large enough, so its pages are already mapped (a fresh
  // buffer costs a page fault every 4 KiB while the socket fills it).
  bytes spare(std::size_t size) {
    bytes b;
    {
      std::lock_guard lock(mutex_);
      for (auto it = spares_.begin(); it != spares_.end(); ++it)
        if (it->capacity() >= size) {
          b = std::move(*it);
          spares_.erase(it);
          break;
        }
    }
    b.resize(size);
    return b;
  }
  void abandoned(int source, tag_type tag) { settle(source, tag, posting::state_type::abandoned); }

  // ---- failure ----

  // Messages already queued from `source` stay readable; waits for more fail with `reason`,
  // as a peer that departed or, with `cause` silent, one that missed its deadline.
  void close(int source, std::string reason, failure_cause cause = failure_cause::departed) {
    {
      std::lock_guard lock(mutex_);
      closed_.emplace(source, closure{std::move(reason), cause});
      paused_.erase(source);  // its connection (and reader) is gone
    }
    ready_.notify_all();
  }
  // Why `source` is closed, when it is: the reason and the cause its waits fail with.
  std::optional<std::pair<std::string, failure_cause>> closure_of(int source) const {
    std::lock_guard lock(mutex_);
    auto c = closed_.find(source);
    if (c == closed_.end()) return std::nullopt;
    return std::pair{c->second.reason, c->second.cause};
  }
  void reopen(int source) {
    std::lock_guard lock(mutex_);
    if (!forgotten_.count(source)) closed_.erase(source);
    paused_.erase(source);  // a new connection: its reader is not paused
  }

  // ---- membership (fault::elastic) ----

  // Closes `source` for good: what it queued is dropped, what it sends later too.
  void forget(int source, std::string reason) {
    {
      std::unique_lock lock(mutex_);
      forgotten_.insert(source);
      closed_[source] = closure{std::move(reason), failure_cause::departed};
      std::erase_if(queues_, [&](const auto& q) { return q.first.first == source; });
      queued_bytes_.erase(source);
      std::erase_if(allowed_bytes_, [&](const auto& a) { return a.first.first == source; });
      control_bytes_.erase(source);
      std::erase_if(expected_, [&](const auto& e) { return e.first.first == source; });
      std::erase_if(pending_alarms_, [&](const auto& a) { return a.first == source; });
      std::erase_if(pending_closures_, [&](const pending_closure& c) { return c.source == source; });
      wake_if_paused(lock, source);
    }
    ready_.notify_all();
  }
  // Forgets `source` and never welcomes it back (the group excluded it): why, for its refusal.
  void bar(int source, std::string reason) {
    {
      std::lock_guard lock(mutex_);
      barred_[source] = reason;
    }
    forget(source, std::move(reason));
  }
  std::optional<std::string> barred(int source) const {
    std::lock_guard lock(mutex_);
    const auto b = barred_.find(source);
    if (b == barred_.end()) return std::nullopt;
    return b->second;
  }
  // A peer joins under `source`: a new rank, or one this peer forgot (a killed peer that comes
  // back), is heard from now on. False while `source` is closed but not forgotten: the group
  // has not left the previous peer of that rank out yet, and a newcomer must not take its place
  // in collectives that still count on the old one; false for good when it is barred.
  bool welcome(int source) {
    std::lock_guard lock(mutex_);
    if (barred_.count(source) || (closed_.count(source) && !forgotten_.count(source))) return false;
    if (std::any_of(pending_closures_.begin(), pending_closures_.end(), [&](const pending_closure& c) { return c.source == source; }))
      return false;  // the old connection's close has not reached this peer yet
    forgotten_.erase(source);
    closed_.erase(source);
    std::erase_if(last_taken_, [&](const auto& t) { return t.first.first == source; });
    return true;
  }
  // Drops what `source` queued before the last message taken from it on `marker` (a view's
  // marker: everything before it belongs to the previous view, a failed state transfer's
  // chunks included), except on `marker` itself.
  void discard_before(int source, tag_type marker) {
    std::unique_lock lock(mutex_);
    const auto it = last_taken_.find({source, marker});
    if (it == last_taken_.end()) return;
    const std::uint64_t before = it->second;
    for (auto q = queues_.begin(); q != queues_.end();) {
      if (q->first.first == source && q->first.second != marker) {
        std::erase_if(q->second, [&](const message& m) {
          if (m.sequence >= before) return false;
          count(source, q->first.second, m, -1);
          return true;
        });
        if (q->second.empty()) {
          q = queues_.erase(q);
          continue;
        }
      }
      ++q;
    }
    wake_if_paused(lock, source);
  }
  void set_epoch(std::uint64_t epoch) {
    std::lock_guard lock(mutex_);
    // What a receiver expected of the old view will not come (its collectives were cut off).
    if (epoch != epoch_) {
      expected_.clear();
      expectation_order_.clear();
    }
    epoch_ = epoch;
    if (alarm_ && alarm_->epoch < epoch) alarm_.reset();
    std::erase_if(pending_alarms_, [&](const auto& a) {
      const auto x = wire::decode_alarm(a.second.payload, a.first);
      return !x || x->epoch < epoch;
    });
  }
  std::optional<alarm> alarmed() const {
    std::lock_guard lock(mutex_);
    return alarm_;
  }


  // Every wait fails from now on, naming `peer` (the peer whose failure brought the network down).
  void fail_all(int peer, std::string reason) {
    {
      std::lock_guard lock(mutex_);
      if (failure_.empty()) failure_ = std::move(reason), failed_peer_ = peer;
    }
    ready_.notify_all();
  }
  // Every wait fails with `reason` as an error of the program, not of a peer (a deadlock: no
  // fault policy should take it for a peer's failure and go on).
  void fail_all_as_error(std::string reason) {
    {
      std::lock_guard lock(mutex_);
      if (fatal_.empty()) fatal_ = std::move(reason);
    }
    ready_.notify_all();
  }
  // Whether a message from one of `sources` with `tag` is queued here (a wait for it is about to end).
  bool has_queued(std::span<const int> sources, tag_type tag) const {
    std::lock_guard lock(mutex_);
    return any_queued(sources, tag, std::numeric_limits<double>::infinity());
  }
  // What is queued here and not taken, as (source, tag), at most `most` of them: for a diagnostic.
  std::vector<std::pair<int, tag_type>> queued_keys(std::size_t most) const {
    std::lock_guard lock(mutex_);
    std::vector<std::pair<int, tag_type>> out;
    for (const auto& [k, q] : queues_)
      if (!q.empty() && out.size() < most) out.push_back(k);
    return out;
  }

 private:
  struct posting {
    enum class state_type { open, claimed, landed, abandoned };
    std::span<std::byte> into;
    state_type state = state_type::open;
    std::size_t size = 0;
  };

  struct closure {
    std::string reason;
    failure_cause cause = failure_cause::departed;
  };

  bool queued(int source, tag_type tag) const {
    auto it = queues_.find({source, tag});
    return it != queues_.end() && !it->second.empty();
  }

  bool any_queued(std::span<const int> sources, tag_type tag, double now) const {
    for (const int source : sources)
      if (auto it = queues_.find({source, tag}); it != queues_.end() && !it->second.empty() && it->second.front().arrival <= now)
        return true;
    return false;
  }
  // Of `sources`' next messages with `tag` that have arrived by `now`, the earliest, taken.
  std::optional<std::pair<int, message>> take_first_of(std::span<const int> sources, tag_type tag,
                                                       double now = std::numeric_limits<double>::infinity()) {
    int first = -1;
    double at = 0;
    for (const int source : sources)
      if (auto it = queues_.find({source, tag}); it != queues_.end() && !it->second.empty() && it->second.front().arrival <= now &&
                                                (first < 0 || it->second.front().arrival < at)) {
        first = source;
        at = it->second.front().arrival;
      }
    if (first < 0) return std::nullopt;
    return std::pair{first, std::move(*take_queued(first, tag))};
  }

  std::optional<message> take_queued(int source, tag_type tag) {
    auto it = queues_.find({source, tag});
    if (it == queues_.end() || it->second.empty()) return std::nullopt;
    message m = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) queues_.erase(it);
    count(source, tag, m, -1);
    if (is_membership_tag(tag)) last_taken_[{source, tag}] = m.sequence;
    return m;
  }

  // An alarm of this view or the next (a member that installed it first) is raised; an older one
  // is stale, and one further ahead cannot come from a member of this view: ignored, or it would
  // outlive every view this peer installs.
  void raise(int source, const message& m) {
    const auto a = wire::decode_alarm(m.payload, source);
    if (!a || a->epoch < epoch_ || a->epoch > epoch_ + 1 || alarm_) return;
    alarm_ = a;
  }

  void throw_if_unreachable(int source, tag_type tag) const {
    if (!fatal_.empty()) decentrain::detail::fail(fatal_);
    if (!failure_.empty()) transport::fail_peer(failed_peer_, "receive", failure_);
    if (auto c = closed_.find(source); c != closed_.end())
      transport::fail_peer_because(c->second.cause, source, "receive", "transport: peer ", source, " is gone (",
                                   c->second.reason, ")");
    if (alarm_ && !is_membership_tag(tag))
      transport::fail_peer_because(cause_of(*alarm_), alarm_->failed, "receive", "transport: ", describe(*alarm_));
  }

  // A paused reader of `source` reads again (the lock is released around its callback, which
  // posts to the network thread).
  void wake_if_paused(std::unique_lock<std::mutex>& lock, int source) {
    const auto it = paused_.find(source);
    if (it == paused_.end()) return;
    auto resume = std::move(it->second.resume);
    paused_.erase(it);
    lock.unlock();
    if (resume) resume();
    lock.lock();
  }
  void wake_if_paused(std::lock_guard<std::mutex>&, int) = delete;

  // When a wait on `source` should look again whether it is stuck behind the source's budget.
  std::chrono::steady_clock::time_point next_stuck_check(int source, std::chrono::steady_clock::time_point started) const {
    const auto p = paused_.find(source);
    if (p == paused_.end()) return std::chrono::steady_clock::time_point::max();
    return std::max(p->second.since, started) + budget_.grace;
  }

  // A receive of (source, tag) that started at `started` waits while the source's reader is
  // paused over its budget, none of what it queued being this tag: once that has lasted `grace`,
  // the source is over its budget. What it queued is dropped (nobody took it while a receive
  // needed what comes after it), its reader resumes, and the receive fails naming it.
  void throw_if_stuck(std::unique_lock<std::mutex>& lock, int source, tag_type tag, std::chrono::steady_clock::time_point started) {
    const auto p = paused_.find(source);
    if (p == paused_.end() || queued(source, tag)) return;
    if (std::chrono::steady_clock::now() < std::max(p->second.since, started) + budget_.grace) return;
    std::uint64_t dropped = 0, messages = 0;
    std::set<tag_type> tags;
    for (auto q = queues_.begin(); q != queues_.end();) {
      if (q->first.first != source) {
        ++q;
        continue;
      }
      tags.insert(q->first.second);
      for (const auto& m : q->second) dropped += m.payload.size(), ++messages;
      q = queues_.erase(q);
    }
    queued_bytes_.erase(source);
    control_bytes_.erase(source);
    std::erase_if(allowed_bytes_, [&](const auto& a) { return a.first.first == source; });
    ++over_budget_[source];
    const auto limit = budget_.bytes_per_peer;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
    wake_if_paused(lock, source);
    transport::fail_peer_because(failure_cause::convicted, source, "receive", "transport: peer ", source, " is over its budget: ",
                                 messages, " message(s) of ", dropped, " bytes on ", tags.size(),
                                 " tag(s) this peer did not read held its queue full (at most ", limit,
                                 " bytes) while a receive waited ", waited, " ms for its message of tag ", tag,
                                 "; they are dropped");
  }

  // Counts a message queued (+1) or taken or dropped (-1) against what accepted it.
  void count(int source, tag_type tag, const message& m, int sign) {
    const auto n = static_cast<std::uint64_t>(m.payload.size());
    switch (m.as) {
      case accepted_as::budget:
        queued_bytes_[source] += sign > 0 ? n : -n;
        break;
      case accepted_as::allowed: {
        auto& a = allowed_bytes_[{source, tag}];
        a += sign > 0 ? n : -n;
        if (a == 0) allowed_bytes_.erase({source, tag});
        break;
      }
      case accepted_as::control: {
        auto& c = control_bytes_[source];
        c += sign > 0 ? n : -n;
        if (c == 0) control_bytes_.erase(source);
        break;
      }
      case accepted_as::expected:
        break;  // the receiver said it takes these
    }
  }

  void keep_spare(bytes b) {
    constexpr std::size_t most = 8;
    if (b.capacity() == 0) return;
    if (spares_.size() == most) spares_.erase(spares_.begin());
    spares_.push_back(std::move(b));
  }

  void settle(int source, tag_type tag, posting::state_type state) {
    {
      std::lock_guard lock(mutex_);
      auto p = posted_.find({source, tag});
      if (p == posted_.end()) return;
      auto q = std::find_if(p->second.begin(), p->second.end(), is_claimed);
      if (q == p->second.end()) return;
      q->state = state;
      q->size = q->into.size();
    }
    ready_.notify_all();
  }

  static bool is_claimed(const posting& p) { return p.state == posting::state_type::claimed; }
  bool any_claimed(const key& k) const {
    auto p = posted_.find(k);
    return p != posted_.end() && std::any_of(p->second.begin(), p->second.end(), is_claimed);
  }

  // Waits for the message of the first of k's postings (`into`) and returns its size: landed in
  // place, or queued (copied into `into` when the sizes match). Throws when it was cut off, when
  // the peer is unreachable, or when `timeout` passes; the caller then withdraws the postings
  // (stopping a write still in progress).
  std::size_t next_landed(const key& k, std::span<std::byte> into, std::chrono::milliseconds timeout) {
    const auto [source, tag] = k;
    std::unique_lock lock(mutex_);
    const auto started = std::chrono::steady_clock::now();
    const auto deadline = started + timeout;
    for (;;) {
      auto& postings = posted_.at(k);
      posting& first = postings.front();
      if (first.state == posting::state_type::landed) {
        const std::size_t size = first.size;
        pop_first(k);
        return size;
      }
      if (first.state == posting::state_type::abandoned) {
        throw_if_unreachable(source, tag);
        transport::fail_peer(source, "receive", "transport: the message from peer ", source, " (tag ", tag, ") was cut off");
      }
      if (first.state == posting::state_type::open) {
        // Not (or not yet) landing in place: a queued message is the next one in order.
        if (auto m = take_queued(source, tag)) {
          pop_first(k);
          const std::size_t size = m->payload.size();
          if (size == into.size() && size > 0) std::memcpy(into.data(), m->payload.data(), size);
          keep_spare(std::move(m->payload));
          wake_if_paused(lock, source);
          return size;
        }
        throw_if_unreachable(source, tag);
        throw_if_stuck(lock, source, tag, started);
      }
      if (ready_.wait_until(lock, std::min(deadline, next_stuck_check(source, started))) == std::cv_status::timeout &&
          std::chrono::steady_clock::now() >= deadline) {
        auto& now = posted_.at(k).front();
        if (now.state == posting::state_type::claimed || (now.state == posting::state_type::open && !queued(source, tag)))
          timed_out(source, tag, timeout, not_taken(std::span<const int>(&source, 1)));
      }
    }
  }
  // (The lock held.) What `sources` sent here that no wait took, for a timeout's message.
  std::string not_taken(std::span<const int> sources) const {
    std::string tags;
    int more = 0;
    for (const auto& [k, q] : queues_) {
      if (q.empty() || std::find(sources.begin(), sources.end(), k.first) == sources.end()) continue;
      if (++more > 4) continue;
      tags += decentrain::detail::concat(tags.empty() ? "" : ", ", "peer ", k.first, " ", describe_tag(k.second), " (",
                                         q.size(), q.size() == 1 ? " message" : " messages", ")");
    }
    if (tags.empty()) return {};
    return decentrain::detail::concat("; not taken here: ", tags, more > 4 ? decentrain::detail::concat(" and ", more - 4, " more") : "",
                                      " (where nothing else is coming, the calls on the two sides do not match)");
  }

  void pop_first(const key& k) {
    auto p = posted_.find(k);
    p->second.pop_front();
    if (p->second.empty()) posted_.erase(p);
  }

  // Takes k's postings back. One the network thread is writing into cannot just be dropped:
  // `stuck` stops that write (closing its connection), and this waits until it has settled.
  template <class Stuck>
  void withdraw(const key& k, Stuck& stuck, std::chrono::milliseconds patience) {
    std::unique_lock lock(mutex_);
    if (any_claimed(k)) {
      // After an alarm the writer is most likely a live peer finishing its message: give it the
      // receive timeout to finish rather than cut a healthy connection at once.
      if (!alarm_ || !ready_.wait_for(lock, patience, [&] { return !any_claimed(k); })) {
        lock.unlock();
        stuck();
        lock.lock();
      }
      ready_.wait(lock, [&] { return !any_claimed(k); });
    }
    posted_.erase(k);
  }

  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::map<key, std::deque<message>> queues_;
  std::map<key, std::deque<posting>> posted_;  // in the order their messages will come
  std::vector<bytes> spares_;  // at most a few, oldest first
  std::map<int, closure> closed_;
  std::string failure_, fatal_;
  int failed_peer_ = -1;
  // membership
  std::map<int, std::uint64_t> pushed_;           // per source: messages pushed so far
  std::map<key, std::uint64_t> last_taken_;       // membership tags: the sequence last taken
  std::set<int> forgotten_;
  std::map<int, std::string> barred_;
  std::uint64_t epoch_ = 0;
  std::optional<alarm> alarm_;
  std::vector<std::pair<int, message>> pending_alarms_;  // (source, alarm) on simulated time, not arrived yet
  struct pending_closure {
    int source;
    closure why;
    double arrival;
  };
  std::vector<pending_closure> pending_closures_;
  // budgets
  budget budget_;
  static constexpr std::size_t max_expectations = 4096;  // (cleared at each view; the oldest go first)
  static constexpr std::size_t max_control_message = std::size_t{64} << 10;
  static constexpr std::uint64_t max_control_queued = std::uint64_t{4} << 20;  // per source
  std::deque<key> expectation_order_;          // expectations, oldest first
  std::map<int, std::uint64_t> control_bytes_;  // per source: membership messages queued outside the budget
  std::map<int, std::uint64_t> queued_bytes_;  // per source: bytes queued against the budget, not taken
  std::map<key, std::uint64_t> expected_;      // bytes a receiver still expects, per (source, tag)
  std::map<tag_type, std::uint64_t> allowed_;  // standing allowances, per tag
  std::map<key, std::uint64_t> allowed_bytes_; // bytes queued against them, per (source, tag)
  struct paused {
    std::function<void()> resume;
    std::chrono::steady_clock::time_point since;
  };
  std::map<int, paused> paused_;               // sources whose reading waits for room
  std::map<int, std::uint64_t> over_budget_;   // sources found over budget, and how often
};

}  // namespace decentrain::transport::detail
