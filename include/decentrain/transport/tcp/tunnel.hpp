// One end of a connection that a third peer relays (tcp/relay.hpp): a local socket pair whose
// near end the node uses as it would a TCP socket, so the handshake, its keys (TLS included) and
// every frame run through it unchanged, end to end between the two peers; the far end is pumped
// by this tunnel's thread: what the node writes goes to the relay in relay frames, what the relay
// brings is written back.
//
// A relay that dies does not end the connection: each end keeps what it sent until the other
// acknowledges it (at most a window), and the end that opened the circuit asks another relay to
// resume it, saying how much it received; the other end answers the same way, and each sends
// again what the other missed. The near connections see a pause, nothing lost. Without another
// relay within `resume_within`, or when the other end closes it, the circuit ends: the near end
// reads the end of its stream, and `why_ended()` says what happened.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_ASIO

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/tcp/connection.hpp"
#include "decentrain/transport/tcp/relay.hpp"

namespace decentrain::transport::tcp_detail {

class tunnel {
 public:
  // Another relay for the circuit to `far`, not one of `tried`; null when there is none now.
  using relay_finder = std::function<std::shared_ptr<connection>(int far, const std::set<const connection*>& tried)>;

  struct settings {
    std::size_t chunk = std::size_t{256} << 10;  // the most a relay frame carries
    std::size_t window = std::size_t{8} << 20;   // sent and not acknowledged; and queued from the relay
    std::chrono::milliseconds timeout{300000};   // a write to the relay
    std::chrono::milliseconds resume_within{3000};
  };

  // This end is peer `self`, the other `far`; `via` is the connection to the relay; `dialer`:
  // this end opened the circuit (and resumes it, asking `find` for another relay).
  tunnel(int self, int far, std::shared_ptr<connection> via, bool dialer, settings s, std::atomic<std::uint64_t>& framing,
         relay_finder find)
      : self_(self), far_(far), dialer_(dialer), s_(s), framing_(framing), find_(std::move(find)), via_(std::move(via)) {
    int fds[2];
    decentrain::detail::check(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, "tcp: peer ", self,
                              " cannot make a socket pair for its relayed connection to peer ", far, ": ", std::strerror(errno));
    near_ = fds[0];
    pump_ = fds[1];
    const int buffer = 4 << 20;  // a relay's round trip is long: room for a few chunks in flight
    for (const int fd : fds) {
      (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
      (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
    }
    wake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_ < 0) {
      ::close(near_);
      ::close(pump_);
      decentrain::detail::fail("tcp: peer ", self, " cannot make an eventfd for its relayed connection: ", std::strerror(errno));
    }
  }
  tunnel(const tunnel&) = delete;
  tunnel& operator=(const tunnel&) = delete;
  ~tunnel() {
    stop();
    if (thread_.joinable()) thread_.join();
    if (near_ >= 0) ::close(near_);
    if (pump_ >= 0) ::close(pump_);
    ::close(wake_);
  }

  int far() const { return far_; }
  // The relay now (the last one while none carries the circuit).
  int relay() const {
    std::lock_guard lock(mutex_);
    return relay_rank_;
  }
  // The connection the circuit's frames come from now (null while it waits to be resumed).
  std::shared_ptr<connection> via() const {
    std::lock_guard lock(mutex_);
    return via_;
  }
  std::uint64_t resumed() const { return resumed_; }

  // The near end, for a connection's socket, which owns it from then on.
  int take_near() { return std::exchange(near_, -1); }

  // Starts pumping; the dialer first asks the relay to open the circuit.
  void start() {
    if (dialer_ && !write_relay(*via_, {wire::relay_kind::open, self_, far_}, {}, s_.timeout, framing_, [] { return false; }))
      end(decentrain::detail::concat("the connection to the relay, peer ", via_->rank, ", closed"));
    thread_ = std::thread([this] { run(); });
  }

  // ---- what the relay brings (I/O thread) ----

  // Whether `n` more bytes from the relay may be read now; if not, `room` is called (from this
  // tunnel's thread) once they may.
  bool has_room(std::size_t n, std::function<void()> room) {
    std::lock_guard lock(mutex_);
    return pump_ < 0 || q_.has_room(n, s_.window, std::move(room));
  }

  // A piece of the far end's stream, written on at once as far as the socket takes it.
  void deliver(bytes b) {
    std::vector<std::function<void()>> due;
    {
      std::lock_guard lock(mutex_);
      if (pump_ < 0 || state_ == state::ended) return;
      if (in_ == acked_in_) unacked_since_ = clock::now();
      in_ += b.size();
      q_.queued += b.size();
      q_.items.emplace_back(wire::relay_route{}, std::move(b));
      due = flush();  // (under the lock: the I/O thread and this tunnel's thread both write)
    }
    signal();  // (an ack may be due)
    for (auto& f : due) f();
  }

  // The far end received the stream up to `position`: what came before it is forgotten.
  void acknowledged(std::uint64_t position) {
    {
      std::lock_guard lock(mutex_);
      forget_before(position);
    }
    signal();
  }

  // A close from the relay: the far end closed the circuit, or the relay refused it (`why`).
  // While the dialer resumes, a refusal only sends it to the next relay.
  void closed(std::string why) {
    {
      std::lock_guard lock(mutex_);
      if (state_ == state::resuming && dialer_) {
        via_ = nullptr;
        last_refusal_ = std::move(why);
        signal();
        return;
      }
    }
    end(std::move(why));
  }

  // The relay is gone, or lost the far end (`why`): the circuit waits to be resumed.
  void relay_lost(const std::shared_ptr<connection>& c, std::string why) {
    {
      std::lock_guard lock(mutex_);
      if (state_ != state::live || (c && via_ != c)) return;
      state_ = state::resuming;
      lost_at_ = clock::now();
      lost_why_ = std::move(why);
      if (via_) tried_.insert(via_.get());
      via_ = nullptr;
    }
    signal();
  }

  // A resume from the far end through `c`, having received so much of this end's stream: the
  // acceptor takes the new relay and answers; the dialer hears its answer. False when this
  // tunnel is not waiting to be resumed there (a resume out of turn is ignored: a key holder
  // cannot move a live circuit onto itself).
  bool resume(const std::shared_ptr<connection>& c, std::uint64_t far_received) {
    {
      std::lock_guard lock(mutex_);
      if (state_ != state::resuming || (dialer_ && via_ != c) || far_received > out_ || far_received < base_) return false;
      via_ = c;
      relay_rank_ = c->rank;
      forget_before(far_received);  // (its acks may have been lost with the relay)
      resend_from_ = far_received;
      answer_ = !dialer_;
      state_ = state::live;
      ++resumed_;
    }
    signal();
    return true;
  }

  // Ends the circuit: what came before is still written back, then the near end reads the end.
  void end(std::string why) {
    {
      std::lock_guard lock(mutex_);
      if (why_.empty()) why_ = std::move(why);
      state_ = state::ended;
    }
    signal();
  }

  // Stops at once (the near end reads the end of its stream).
  void stop() {
    stopping_ = true;
    signal();
  }
  bool finished() const { return finished_; }
  std::string why_ended() const {
    std::lock_guard lock(mutex_);
    return why_;
  }

 private:
  enum class state : std::uint8_t { live, resuming, ended };

  void signal() {
    const std::uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof one);
  }

  // Writes what of the queue the pump end takes now (mutex_ held); the callbacks due then.
  std::vector<std::function<void()>> flush() {
    while (!q_.items.empty()) {
      auto& b = q_.items.front().second;
      const ssize_t n = ::send(pump_, b.data() + written_, b.size() - written_, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // full (or broken: the near end's reader finds out)
      written_ += static_cast<std::size_t>(n);
      if (written_ < b.size()) break;
      q_.queued -= b.size();
      written_ = 0;
      q_.items.pop_front();
    }
    return q_.due(s_.window);
  }

  // Drops what the far end received (mutex_ held).
  void forget_before(std::uint64_t position) {
    while (!kept_.empty() && base_ < position) {
      auto& front = kept_.front();
      const auto drop = static_cast<std::size_t>(std::min<std::uint64_t>(front.size(), position - base_));
      base_ += drop;
      kept_bytes_ -= drop;
      if (drop == front.size()) kept_.pop_front();
      else front.erase(front.begin(), front.begin() + static_cast<std::ptrdiff_t>(drop));
    }
  }

  // One relay frame to the relay now; false when it is gone (the circuit waits to be resumed).
  bool send(const std::shared_ptr<connection>& via, wire::relay_kind kind, std::span<const std::byte> body) {
    if (via && write_relay(*via, {kind, self_, far_}, body, s_.timeout, framing_, [this] { return stopping_.load(); })) return true;
    if (via) relay_lost(via, decentrain::detail::concat("the connection to the relay, peer ", via->rank, ", closed"));
    return false;
  }

  // What this tunnel's thread does next, decided under the lock.
  struct plan {
    bool leave = false;
    std::shared_ptr<connection> via;
    bool read = false, write_back = false;
    std::optional<std::uint64_t> ack, answer;
    std::optional<std::vector<bytes>> resend;
    bool find_relay = false;
    int wait_ms = 1000;
  };

  plan next() {
    plan p;
    std::lock_guard lock(mutex_);
    const auto now = clock::now();
    if (stopping_ || (state_ == state::ended && q_.items.empty())) {
      p.leave = true;
      return p;
    }
    p.via = via_;
    p.write_back = !q_.items.empty();
    if (state_ == state::resuming) {
      if (now - lost_at_ > s_.resume_within) {
        why_ = decentrain::detail::concat(lost_why_, "; no other relay took the circuit up within ", s_.resume_within.count(), " ms",
                                          last_refusal_.empty() ? "" : " (the last refused: " + last_refusal_ + ")");
        state_ = state::ended;
        p.leave = q_.items.empty();
        return p;
      }
      // The dialer asks the next relay when none is asked, or the one asked has not answered.
      if (dialer_ && (!via_ || now - asked_at_ > std::chrono::milliseconds(500))) {
        if (via_) tried_.insert(via_.get());
        via_ = nullptr;
        p.find_relay = true;
      }
      p.wait_ms = 20;
      return p;
    }
    if (state_ == state::live) {
      if (answer_) {
        p.answer = in_;
        answer_ = false;
      }
      if (resend_from_) {
        std::vector<bytes> again;
        std::uint64_t at = base_;
        for (const auto& b : kept_) {
          const auto from = *resend_from_ > at ? static_cast<std::size_t>(std::min<std::uint64_t>(b.size(), *resend_from_ - at)) : 0;
          if (from < b.size()) again.emplace_back(b.begin() + static_cast<std::ptrdiff_t>(from), b.end());
          at += b.size();
        }
        p.resend = std::move(again);
        resend_from_.reset();
      }
      p.read = kept_bytes_ < s_.window;
    }
    if (in_ > acked_in_) {
      if (in_ - acked_in_ >= s_.window / 4 || now - unacked_since_ >= std::chrono::milliseconds(20)) {
        p.ack = in_;
        acked_in_ = in_;
      } else {
        p.wait_ms = 20;
      }
    }
    return p;
  }

  void run() {
    bytes buf(s_.chunk);
    for (;;) {
      auto p = next();
      if (p.leave) break;
      if (p.find_relay) {
        std::set<const connection*> tried;
        {
          std::lock_guard lock(mutex_);
          tried = tried_;
        }
        // (outside the lock: the node's registry is asked)
        auto via = find_(far_, tried);
        if (!via) {
          std::lock_guard lock(mutex_);
          tried_.clear();  // every relay asked once: round again (the far end may not have noticed the loss yet)
        } else {
          std::uint64_t received;
          {
            std::lock_guard lock(mutex_);
            via_ = via;
            asked_at_ = clock::now();
            received = in_;
          }
          (void)send(via, wire::relay_kind::resume, wire::encode_position(received));
        }
      }
      if (p.answer) (void)send(p.via, wire::relay_kind::resume, wire::encode_position(*p.answer));
      if (p.resend)
        for (const auto& b : *p.resend)
          for (std::size_t at = 0; at < b.size(); at += s_.chunk)
            if (!send(p.via, wire::relay_kind::bytes, std::span<const std::byte>(b).subspan(at, std::min(s_.chunk, b.size() - at))))
              break;
      if (p.ack) (void)send(p.via, wire::relay_kind::ack, wire::encode_position(*p.ack));
      pollfd fds[2] = {{pump_, static_cast<short>((p.read ? POLLIN : 0) | (p.write_back ? POLLOUT : 0)), 0}, {wake_, POLLIN, 0}};
      ::poll(fds, 2, p.wait_ms);
      if (fds[1].revents & POLLIN) {
        std::uint64_t v;
        (void)!::read(wake_, &v, sizeof v);
      }
      if (stopping_) break;
      if (p.read && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
        const ssize_t n = ::recv(pump_, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n > 0) {
          const auto piece = std::span<const std::byte>(buf).first(static_cast<std::size_t>(n));
          std::shared_ptr<connection> via;
          {
            std::lock_guard lock(mutex_);
            kept_.emplace_back(piece.begin(), piece.end());
            kept_bytes_ += piece.size();
            out_ += piece.size();
            if (state_ == state::live) via = via_;
          }
          if (via) (void)send(via, wire::relay_kind::bytes, piece);  // (lost: sent again once resumed)
        } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          // This end's connection closed: the relay and the far end are told (best effort).
          std::shared_ptr<connection> via;
          {
            std::lock_guard lock(mutex_);
            via = via_;
          }
          if (via)
            (void)write_relay(*via, {wire::relay_kind::close, self_, far_}, {}, std::chrono::milliseconds(500), framing_,
                              [this] { return stopping_.load(); });
          end(decentrain::detail::concat("peer ", self_, " closed it"));
          told_ = true;
          break;
        }
      }
      if (fds[0].revents & POLLOUT) {
        std::vector<std::function<void()>> due;
        {
          std::lock_guard lock(mutex_);
          due = flush();
        }
        for (auto& f : due) f();
      }
    }
    std::shared_ptr<connection> via;
    {
      std::lock_guard lock(mutex_);
      via = via_;
    }
    // Stopped while the circuit was open (this end's connection was closed or replaced): the
    // relay is told, so it does not count the circuit against its limit until an end leaves.
    if (!told_ && via && stopping_)
      (void)write_relay(*via, {wire::relay_kind::close, self_, far_}, {}, std::chrono::milliseconds(200), framing_, [] { return false; });
    std::vector<std::function<void()>> due;
    {
      std::lock_guard lock(mutex_);
      ::shutdown(pump_, SHUT_RDWR);
      ::close(pump_);
      pump_ = -1;
      q_.items.clear();
      due = q_.due(s_.window, true);  // the relay's connection is read again
    }
    for (auto& f : due) f();
    finished_ = true;
  }

  const int self_, far_;
  const bool dialer_;
  const settings s_;
  std::atomic<std::uint64_t>& framing_;
  relay_finder find_;
  int near_ = -1, pump_ = -1, wake_ = -1;

  mutable std::mutex mutex_;  // guards everything below but the atomics, and pump_'s closing
  std::shared_ptr<connection> via_;
  int relay_rank_ = via_ ? via_->rank : -1;
  state state_ = state::live;
  // This end's stream: what was sent and not acknowledged (from position base_ to out_).
  std::deque<bytes> kept_;
  std::size_t kept_bytes_ = 0;
  std::uint64_t base_ = 0, out_ = 0;
  std::optional<std::uint64_t> resend_from_;  // a resume asked for the stream again from there
  bool answer_ = false;                       // the acceptor answers a resume
  // The far end's stream: received so far, acknowledged so far, since when not.
  std::uint64_t in_ = 0, acked_in_ = 0;
  clock::time_point unacked_since_{};
  byte_queue q_;             // from the relay, to be written to the pump end
  std::size_t written_ = 0;  // of q_'s first item
  // Resuming: since when, why, the relays tried, when the last was asked, what it said.
  clock::time_point lost_at_{}, asked_at_{};
  std::string lost_why_, last_refusal_;
  std::set<const connection*> tried_;
  std::string why_;  // why the circuit ended

  std::atomic<bool> stopping_{false}, finished_{false};
  std::atomic<std::uint64_t> resumed_{0};
  bool told_ = false;  // (this tunnel's thread) the relay was told the circuit closed
  std::thread thread_;
};

}  // namespace decentrain::transport::tcp_detail

#endif  // DECENTRAIN_HAS_ASIO
