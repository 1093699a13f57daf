// Relays: a peer that listens carries the connection between two peers that cannot reach each
// other (both accept no connections: behind NATs, firewalls). Each end runs its connection over
// a tunnel (tcp/tunnel.hpp); the relay forwards the tunnels' bytes in relay frames, a circuit per
// pair, and sees only what the two ends' own connection sealed: under per-peer identities or
// TLS it can neither read nor alter it (under a shared run key alone it holds the key, so it
// could). What a relay takes on is bounded by its operator: circuits, bandwidth, and the bytes
// queued per destination (past them it stops reading the sender, as TCP's flow control would).
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_ASIO

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/tcp/connection.hpp"
#include "decentrain/transport/tcp/options.hpp"
#include "decentrain/transport/tcp/punch.hpp"

namespace decentrain::transport::tcp_detail {

// Writes one relay frame to `via` (sealed with that hop's keys) within `timeout`; false when the
// connection closed or the time passed. `stop()` may end a write that has not begun. A frame
// the time cut short leaves the stream unreadable past it: the connection is given up.
template <class Stop>
bool write_relay(connection& via, const wire::relay_route& r, std::span<const std::byte> body, std::chrono::milliseconds timeout,
                 std::atomic<std::uint64_t>& framing, Stop&& stop) {
  const auto res = via.write_data(wire::encode_route(r), body, clock::now() + timeout, stop, wire::frame_type::relay);
  if (res.status == write_status::timed_out && res.started) via.abandon();
  if (res.status != write_status::done) return false;
  framing += wire::header_bytes + body.size() + wire::padding(body.size()).size();
  return true;
}

// The frames for one destination, written by a thread of their own in order, paced by the
// relay's bandwidth. What waits is bounded per sender: its stream's bytes by `max_queued`, its
// other frames (opens, acks, closes) by `control_budget`; past either, the sender is not read
// until half has gone, and a frame the relay makes itself (a refusal) is dropped. Per sender,
// so that one who floods holds up nobody else; and an end never has more of its stream
// unacknowledged than its window (tcp/tunnel.hpp), the relay's own max_queued_bytes where every
// peer sets it alike, so an honest end is never held up here: were it, the acks it sends after
// its bytes would wait too, and the other direction of its circuit with them.
class forwarder {
 public:
  static constexpr std::size_t control_budget = std::size_t{64} << 10;
  // What a frame without stream bytes costs beyond its body (its header and padding at most).
  static constexpr std::size_t frame_cost = wire::header_bytes + wire::frame_alignment;

  forwarder(std::shared_ptr<connection> dest, std::size_t max_queued, std::chrono::milliseconds timeout,
            std::atomic<std::uint64_t>& framing, std::atomic<std::uint64_t>& forwarded, std::atomic<std::int64_t>& in_flight,
            std::atomic<std::uint64_t>& dropped, std::atomic<std::int64_t>& queued, std::function<clock::time_point(std::size_t)> pace)
      : dest_(std::move(dest)), max_(max_queued), timeout_(timeout), framing_(framing), forwarded_(forwarded),
        in_flight_(in_flight), dropped_(dropped), queued_(queued), pace_(std::move(pace)), thread_([this] { run(); }) {}
  ~forwarder() {
    stop();
    if (thread_.joinable()) thread_.join();
  }

  const std::shared_ptr<connection>& dest() const { return dest_; }
  // Whether a frame of `r.kind` with a body of `n` bytes from peer r.from may be read now; if
  // not, `room` is called once it may.
  bool has_room(const wire::relay_route& r, std::size_t n, std::function<void()> room) {
    std::lock_guard lock(mutex_);
    if (done_ || fits(r.from, r.kind, n)) return true;
    waiting_.push_back({r.from, r.kind == wire::relay_kind::bytes, std::move(room)});
    return false;
  }
  // Queues a frame read with room for it (has_room), or one the relay made itself (`own`:
  // counted as the relay's own, whatever ranks its route names, and dropped where it does not
  // fit).
  void push(const wire::relay_route& r, bytes body, bool own = false) {
    {
      std::lock_guard lock(mutex_);
      if (done_) return;
      const int key = own ? relay_key : r.from;
      if (own && !fits(key, r.kind, body.size())) {
        ++dropped_;
        return;
      }
      ++in_flight_;
      account(key, r.kind, body.size(), true);
      items_.push_back({r, std::move(body), key});
    }
    wake_.notify_one();
  }
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
  }
  bool finished() const {
    std::lock_guard lock(mutex_);
    return done_;
  }

 private:
  struct sender {
    std::size_t stream = 0, control = 0;
  };
  struct item {
    wire::relay_route route;
    bytes body;
    int key;  // whose it is counted as: its sender's rank, or relay_key
  };
  static constexpr int relay_key = -1;  // the frames the relay makes itself
  struct waiter {
    int from;
    bool stream;
    std::function<void()> room;
  };

  // (mutex_ held)
  bool fits(int key, wire::relay_kind kind, std::size_t n) {
    const auto it = senders_.find(key);
    const sender s = it == senders_.end() ? sender{} : it->second;
    if (kind == wire::relay_kind::bytes) return s.stream == 0 || s.stream + n <= max_;
    return s.control + n + frame_cost <= control_budget;
  }
  void account(int key, wire::relay_kind kind, std::size_t n, bool in) {
    auto& s = senders_[key];
    auto& v = kind == wire::relay_kind::bytes ? s.stream : s.control;
    const auto cost = kind == wire::relay_kind::bytes ? n : n + frame_cost;
    v = in ? v + cost : v - cost;
    queued_ += in ? static_cast<std::int64_t>(cost) : -static_cast<std::int64_t>(cost);
    if (s.stream == 0 && s.control == 0) senders_.erase(key);
  }
  // The senders paused on this queue whose part is down to half (all of them, `all`).
  std::vector<std::function<void()>> due(bool all = false) {
    std::vector<std::function<void()>> out;
    std::erase_if(waiting_, [&](waiter& w) {
      const auto it = senders_.find(w.from);
      const sender s = it == senders_.end() ? sender{} : it->second;
      if (!all && (w.stream ? s.stream > max_ / 2 : s.control > control_budget / 2)) return false;
      out.push_back(std::move(w.room));
      return true;
    });
    return out;
  }

  void run() {
    for (;;) {
      item next;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !items_.empty(); });
        if (stopping_) break;
        next = std::move(items_.front());
        items_.pop_front();
      }
      if (next.route.kind == wire::relay_kind::bytes) {  // (acks and the like are not paced)
        const auto start = pace_(next.body.size());
        std::unique_lock lock(mutex_);
        if (wake_.wait_until(lock, start, [&] { return stopping_; })) {
          --in_flight_;  // (the one taken; those still queued are counted off below)
          break;
        }
      }
      const bool sent = write_relay(*dest_, next.route, next.body, timeout_, framing_, [&] {
        std::lock_guard lock(mutex_);
        return stopping_;
      });
      if (sent && next.route.kind == wire::relay_kind::bytes) forwarded_ += next.body.size();
      std::vector<std::function<void()>> ready;
      {
        std::lock_guard lock(mutex_);
        account(next.key, next.route.kind, next.body.size(), false);
        --in_flight_;
        ready = due();
      }
      for (auto& f : ready) f();
      if (!sent) break;  // the destination is gone: the node's close of it ends the circuits
    }
    std::vector<std::function<void()>> ready;
    {
      std::lock_guard lock(mutex_);
      done_ = true;
      in_flight_ -= static_cast<std::int64_t>(items_.size());
      items_.clear();
      for (const auto& [from, q] : senders_) queued_ -= static_cast<std::int64_t>(q.stream + q.control);
      senders_.clear();
      ready = due(true);  // no sender stays paused on a queue nobody empties
    }
    for (auto& f : ready) f();
  }

  std::shared_ptr<connection> dest_;
  std::size_t max_;
  std::chrono::milliseconds timeout_;
  std::atomic<std::uint64_t>& framing_;
  std::atomic<std::uint64_t>& forwarded_;
  std::atomic<std::int64_t>& in_flight_;  // the relay's frames queued or being written
  std::atomic<std::uint64_t>& dropped_;
  std::atomic<std::int64_t>& queued_;  // the relay's bytes queued
  std::function<clock::time_point(std::size_t)> pace_;  // when a piece of so many bytes may start
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<item> items_;
  std::map<int, sender> senders_;  // what each sender (and the relay itself) has queued here
  std::vector<waiter> waiting_;
  bool stopping_ = false, done_ = false;
  std::thread thread_;  // (last: starts once the rest is built)
};

// The relay's side: circuits between pairs of its peers and a forwarder per destination. Its
// entry points run on the node's I/O thread.
class relay_service {
 public:
  relay_service(int self, relay_options o, std::chrono::milliseconds timeout, std::atomic<std::uint64_t>& framing)
      : self_(self), opts_(o), timeout_(timeout), framing_(framing) {}
  ~relay_service() { stop(); }

  // Whether a frame `r` with a body of `n` bytes for `dest` may be read now; if not, `room` is
  // called later.
  bool has_room(const std::shared_ptr<connection>& dest, const wire::relay_route& r, std::size_t n, std::function<void()> room) {
    if (!dest) return true;
    return to(dest).has_room(r, n, std::move(room));
  }

  // A relay frame from `from` (whose rank is r.from) for peer r.to, whose connection here is
  // `dest` (null: none). `by_joiner`: `from` is a joiner not admitted yet, whose circuits may
  // hold half of max_circuits at most (the members' resumes keep the other half).
  void carry(const wire::relay_route& r, bytes body, const std::shared_ptr<connection>& from, const std::shared_ptr<connection>& dest,
             bool by_joiner = false) {
    carry_one(r, std::move(body), from, dest, by_joiner);
    open_count_ = circuits_.size();
  }

  // Whether peers a and b have a circuit open here (I/O thread).
  bool is_open(int a, int b) const { return circuits_.count(std::minmax(a, b)) > 0; }

  // Peer `rank`'s connection closed: its circuits close, each other end told why.
  // `connection_of(r)`: peer r's connection here, or null.
  void lost(int rank, const std::shared_ptr<connection>& c, const std::function<std::shared_ptr<connection>(int)>& connection_of) {
    for (auto it = circuits_.begin(); it != circuits_.end();) {
      if (it->first != rank && it->second != rank) {
        ++it;
        continue;
      }
      const int other = it->first == rank ? it->second : it->first;
      joiners_.erase(*it);
      it = circuits_.erase(it);
      if (const auto oc = connection_of(other))
        to(oc).push({wire::relay_kind::lost, rank, other},
                    as_bytes(decentrain::detail::concat("the relay, peer ", self_, ", lost its connection to peer ", rank)), true);
    }
    if (auto it = out_.find(c.get()); it != out_.end()) {
      it->second->stop();
      retired_.push_back(std::move(it->second));
      out_.erase(it);
    }
    std::erase_if(retired_, [](const auto& f) { return f->finished(); });  // (joins those done)
    open_count_ = circuits_.size();
  }

  void stop() {
    for (auto& [c, f] : out_) f->stop();
    for (auto& f : retired_) f->stop();
    out_.clear();
    retired_.clear();
  }

  // No circuit open and nothing left to write: a relay may leave without cutting anyone short.
  bool idle() const { return open_count_ == 0 && in_flight_ == 0; }

  relay_stats stats() const {
    relay_stats s;
    s.circuits_opened = opened_;
    s.circuits_refused = refused_;
    s.open_circuits = open_count_;
    s.bytes_forwarded = forwarded_;
    s.frames_dropped = dropped_;
    s.queued_bytes = static_cast<std::uint64_t>(std::max<std::int64_t>(0, queued_));
    std::lock_guard lock(stats_mutex_);
    s.last_refusal = last_refusal_;
    return s;
  }

 private:
  void carry_one(const wire::relay_route& r, bytes body, const std::shared_ptr<connection>& from, const std::shared_ptr<connection>& dest,
                 bool by_joiner) {
    const auto pair = std::minmax(r.from, r.to);
    const bool open = circuits_.count(pair) > 0;
    switch (r.kind) {
      case wire::relay_kind::open:
      case wire::relay_kind::resume: {
        std::string refusal;
        if (!opts_.serve) refusal = decentrain::detail::concat("peer ", self_, " does not relay (its tcp_options::relay.serve is off)");
        else if (!dest) refusal = decentrain::detail::concat("peer ", self_, " is not connected to peer ", r.to, " (yet)");
        else if (!open && static_cast<int>(circuits_.size()) >= opts_.max_circuits)
          refusal = decentrain::detail::concat("peer ", self_, " relays ", opts_.max_circuits, " circuits already (its relay.max_circuits)");
        else if (!open && by_joiner && static_cast<int>(joiners_.size()) >= opts_.max_circuits / 2)
          refusal = decentrain::detail::concat("peer ", self_, " relays ", joiners_.size(), " circuits of joiners already (half its relay.max_circuits)");
        if (!refusal.empty()) {
          ++refused_;
          {
            std::lock_guard lock(stats_mutex_);
            last_refusal_ = refusal;
          }
          return to(from).push({wire::relay_kind::close, r.to, r.from}, as_bytes(refusal), true);
        }
        if (!open) ++opened_;
        circuits_.insert(pair);
        if (!open && by_joiner) joiners_.insert(pair);
        return to(dest).push(r, std::move(body));
      }
      case wire::relay_kind::punch: {
        // Each end hears the other's address as this peer sees it (tcp/punch.hpp); nothing when
        // this peer does not relay or is not connected to both (the asker then asks for a circuit).
        asio::error_code e1, e2;
        const auto at_from = from->socket.remote_endpoint(e1);
        const auto at_dest = dest ? dest->socket.remote_endpoint(e2) : asio::ip::tcp::endpoint();
        if (!opts_.serve || !dest || e1 || e2 || !at_from.address().is_v4() || !at_dest.address().is_v4()) {
          ++dropped_;
          return;
        }
        to(dest).push(r, encode_punch_address(at_from), true);
        return to(from).push({wire::relay_kind::punch, r.to, r.from}, encode_punch_address(at_dest), true);
      }
      case wire::relay_kind::lost:  // (only a relay sends it: an end's is dropped)
        ++dropped_;
        return;
      case wire::relay_kind::ack:
      case wire::relay_kind::bytes:
        if (!open || !dest) {
          ++dropped_;
          return;
        }
        return to(dest).push(r, std::move(body));
      case wire::relay_kind::close:
        circuits_.erase(pair);
        joiners_.erase(pair);
        if (open && dest) to(dest).push(r, std::move(body));
        return;
    }
  }

  static bytes as_bytes(const std::string& s) {
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    return bytes(p, p + std::min<std::size_t>(s.size(), 1024));
  }

  // When a piece of `n` bytes may start: the relay's bandwidth is shared by every forwarder.
  clock::time_point pace(std::size_t n) {
    if (opts_.bytes_per_second == 0) return {};
    std::lock_guard lock(pace_mutex_);
    const auto start = std::max(clock::now(), next_);
    next_ = start + std::chrono::duration_cast<clock::duration>(
                        std::chrono::duration<double>(static_cast<double>(n) / static_cast<double>(opts_.bytes_per_second)));
    return start;
  }

  forwarder& to(const std::shared_ptr<connection>& dest) {
    auto& f = out_[dest.get()];
    if (f && f->finished()) retired_.push_back(std::move(f));  // (its write failed: the connection is closing)
    if (!f)
      f = std::make_unique<forwarder>(dest, static_cast<std::size_t>(opts_.max_queued_bytes), timeout_, framing_, forwarded_,
                                      in_flight_, dropped_, queued_, [this](std::size_t n) { return pace(n); });
    return *f;
  }

  int self_;
  relay_options opts_;
  std::chrono::milliseconds timeout_;
  std::atomic<std::uint64_t>& framing_;
  std::set<std::pair<int, int>> circuits_;                    // I/O thread
  std::set<std::pair<int, int>> joiners_;                     // I/O thread: those of circuits_ a joiner opened
  std::map<const connection*, std::unique_ptr<forwarder>> out_;  // I/O thread; by destination connection
  std::vector<std::unique_ptr<forwarder>> retired_;             // stopping; joined once finished
  std::atomic<std::uint64_t> opened_ = 0, refused_ = 0, open_count_ = 0, forwarded_ = 0, dropped_ = 0;
  std::atomic<std::int64_t> in_flight_ = 0, queued_ = 0;
  mutable std::mutex stats_mutex_;
  std::string last_refusal_;
  std::mutex pace_mutex_;
  clock::time_point next_{};
};

}  // namespace decentrain::transport::tcp_detail

#endif  // DECENTRAIN_HAS_ASIO
