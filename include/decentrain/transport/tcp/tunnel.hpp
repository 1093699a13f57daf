// One end of a connection that a third peer relays (tcp/relay.hpp): a local socket pair whose
// near end the node uses as it would a TCP socket, so the handshake, its keys (TLS included) and
// every frame run through it unchanged, end to end between the two peers; the far end is pumped
// by this tunnel's threads: what the node writes goes to the relay in relay frames, what the
// relay brings is written back (on a thread of its own, see write_back), and acknowledged once
// written, so the far end's window bounds what waits here.
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
#include <condition_variable>
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

// Bytes that wait for a writer, bounded: past `max` a reader is told to stop and called back
// (`room`) once half of it has gone. Guarded by its owner's mutex.
struct byte_queue {
  std::deque<bytes> items;
  std::size_t queued = 0;
  std::vector<std::function<void()>> waiting;

  bool has_room(std::size_t n, std::size_t max, std::function<void()> room) {
    if (queued == 0 || queued + n <= max) return true;
    waiting.push_back(std::move(room));
    return false;
  }
  // The callbacks due once `queued` is down to half of `max` (or everything, `all`).
  std::vector<std::function<void()>> due(std::size_t max, bool all = false) {
    if (!all && queued > max / 2) return {};
    return std::exchange(waiting, {});
  }
};

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
    if (thread_.joinable()) thread_.join();  // (it joins the writer)
    if (writer_.joinable()) writer_.join();
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
    writer_ = std::thread([this] { write_back(); });
    thread_ = std::thread([this] { run(); });
  }

  // ---- what the relay brings (I/O thread) ----

  // Whether `n` more bytes from the relay may be read now; if not, `room` is called (from this
  // tunnel's thread) once they may.
  bool has_room(std::size_t n, std::function<void()> room) {
    std::lock_guard lock(mutex_);
    // The far end's window bounds what waits here (acks count what was written on); twice it
    // stops only a relay or far end that ignores the window.
    return pump_ < 0 || q_.has_room(n, 2 * s_.window, std::move(room));
  }

  // A piece of the far end's stream, written on at once as far as the socket takes it.
  void deliver(bytes b) {
    std::vector<std::function<void()>> due;
    {
      std::lock_guard lock(mutex_);
      // (while the circuit waits to be resumed, nothing is taken: the resume says where from)
      if (pump_ < 0 || state_ != state::live || near_gone_) return;
      in_ += b.size();
      q_.queued += b.size();
      q_.items.push_back(std::move(b));
      due = flush();  // (under the lock: the I/O thread and the writer both write)
    }
    back_.notify_one();
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
      if (early_via_ && clock::now() - early_at_ <= s_.resume_within) (void)take_resume(early_via_, early_position_);
      early_via_ = nullptr;
    }
    signal();
  }

  // A resume from the far end through `c`, having received so much of this end's stream: the
  // acceptor takes the new relay and answers; the dialer hears its answer. False when this
  // tunnel is not waiting to be resumed there: a resume out of turn moves no live circuit. One
  // that comes through another relay before this end noticed its relay's loss (the far end
  // noticed first) is kept, the newest, and taken if this end notices within resume_within; so
  // a key holder can plant one only to be taken at a real loss, where the dialer's own then
  // waits, and the circuit ends after resume_within as it would without a relay.
  bool resume(const std::shared_ptr<connection>& c, std::uint64_t far_received) {
    {
      std::lock_guard lock(mutex_);
      if (!dialer_ && state_ == state::live && c != via_) {
        early_via_ = c;
        early_position_ = far_received;
        early_at_ = clock::now();
        return false;
      }
      if (!take_resume(c, far_received)) return false;
    }
    signal();
    return true;
  }

  // The far end resumes through `c` (mutex_ held); false when this end is not waiting for that.
  bool take_resume(const std::shared_ptr<connection>& c, std::uint64_t far_received) {
    if (state_ != state::resuming || (dialer_ && via_ != c) || far_received > out_ || far_received < base_ || c->closed_for_writes)
      return false;
    via_ = c;
    relay_rank_ = c->rank;
    forget_before(far_received);  // (its acks may have been lost with the relay)
    resend_from_ = far_received;
    answer_ = !dialer_;
    state_ = state::live;
    early_via_ = nullptr;
    ++resumed_;
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
    {
      std::lock_guard lock(mutex_);  // (the writer checks stopping_ under it before it waits)
      stopping_ = true;
    }
    signal();
    back_.notify_one();
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
      auto& b = q_.items.front();
      const ssize_t n = ::send(pump_, b.data() + written_, b.size() - written_, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // full (or broken: the near end's reader finds out)
      written_ += static_cast<std::size_t>(n);
      if (written_in_ == acked_in_) unacked_since_ = clock::now();
      written_in_ += static_cast<std::uint64_t>(n);
      if (written_ < b.size()) break;
      q_.queued -= b.size();
      written_ = 0;
      q_.items.pop_front();
    }
    return q_.due(2 * s_.window);
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
    bool read = false, near_gone = false;
    std::size_t room = 0;  // the most that may be read now (the window's rest)
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
    p.near_gone = near_gone_;
    if (state_ == state::resuming) {
      if (now - lost_at_ > s_.resume_within) {
        why_ = decentrain::detail::concat(lost_why_, "; no other relay took the circuit up within ", s_.resume_within.count(), " ms",
                                          last_refusal_.empty() ? "" : " (the last refused: " + last_refusal_ + ")");
        state_ = state::ended;
        p.leave = q_.items.empty();
        return p;
      }
      // The dialer asks the next relay when none is asked (the last refused, or was lost).
      if (dialer_ && !via_) p.find_relay = true;
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
      // (never past the window: the relay queues a window per sender, and an end that sent more
      // would be held up there, its acks with it)
      p.room = std::min(s_.chunk, s_.window - std::min(kept_bytes_, s_.window));
      p.read = p.room > 0;
    }
    if (written_in_ > acked_in_) {
      if (written_in_ - acked_in_ >= s_.window / 4 || now - unacked_since_ >= std::chrono::milliseconds(20)) {
        p.ack = written_in_;
        acked_in_ = written_in_;
      } else {
        p.wait_ms = 20;
      }
    }
    return p;
  }

  // What came from the relay goes into the pump end on a thread of its own: were it written by
  // run(), which blocks while the relay takes its frames, two ends whose relay waits for room at
  // each of them would wait for each other for ever.
  void write_back() {
    for (;;) {
      int fd;
      {
        std::unique_lock lock(mutex_);
        back_.wait(lock, [&] { return writer_done_ || stopping_ || !q_.items.empty(); });
        if (writer_done_ || stopping_) return;
        fd = pump_;
      }
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
      std::vector<std::function<void()>> due;
      bool emptied = false, wrote = false;
      {
        std::lock_guard lock(mutex_);
        if (writer_done_ || stopping_) return;
        const auto before = written_in_;
        if (p.revents & (POLLHUP | POLLERR)) {  // the near end is gone: nobody reads what comes back
          near_gone_ = true;
          q_.items.clear();
          q_.queued = 0;
          written_ = 0;
          due = q_.due(2 * s_.window, true);
        } else if (p.revents & POLLOUT) {
          due = flush();
        }
        emptied = q_.items.empty();
        wrote = written_in_ != before;
      }
      for (auto& f : due) f();
      if (emptied || wrote) signal();  // (an ack may be due, or run() waits for the queue to empty)
    }
  }

  void run() {
    bytes buf(s_.chunk);
    // The near end hung up while this end was not reading it: poll() would report that at once
    // every time, so the pump end is polled no more; what it holds is read once the window opens.
    bool near_gone = false;
    for (;;) {
      auto p = next();
      if (p.leave) break;
      near_gone = near_gone || p.near_gone;
      if (near_gone && !p.read) {
        std::lock_guard lock(mutex_);
        if (state_ != state::live) {  // nobody reads what would come back, nothing more goes out
          if (why_.empty()) why_ = decentrain::detail::concat("peer ", self_, " closed it");
          state_ = state::ended;
          break;
        }
      }
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
            tried_.insert(via.get());
            received = in_;
          }
          (void)send(via, wire::relay_kind::resume, wire::encode_position(received));
        }
      }
      if (p.answer) (void)send(p.via, wire::relay_kind::resume, wire::encode_position(*p.answer));
      if (p.resend) {
        bool sent = true;
        for (std::size_t i = 0; sent && i < p.resend->size(); ++i) {
          const auto& b = (*p.resend)[i];
          for (std::size_t at = 0; sent && at < b.size(); at += s_.chunk)
            sent = send(p.via, wire::relay_kind::bytes, std::span<const std::byte>(b).subspan(at, std::min(s_.chunk, b.size() - at)));
        }
      }
      if (p.ack) (void)send(p.via, wire::relay_kind::ack, wire::encode_position(*p.ack));
      pollfd fds[2] = {{near_gone && !p.read ? -1 : pump_, static_cast<short>(p.read ? POLLIN : 0), 0}, {wake_, POLLIN, 0}};
      ::poll(fds, 2, p.wait_ms);
      if (!near_gone && (fds[0].revents & (POLLHUP | POLLERR))) {
        near_gone = true;
        std::vector<std::function<void()>> due;
        {
          std::lock_guard lock(mutex_);
          near_gone_ = true;  // nobody reads what comes back: it is dropped, and no longer paces the relay
          q_.items.clear();
          q_.queued = 0;
          written_ = 0;
          due = q_.due(2 * s_.window, true);
        }
        for (auto& f : due) f();
      }
      if (fds[1].revents & POLLIN) {
        std::uint64_t v;
        (void)!::read(wake_, &v, sizeof v);
      }
      if (stopping_) break;
      if (p.read && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
        const ssize_t n = ::recv(pump_, buf.data(), p.room, MSG_DONTWAIT);
        if (n > 0) {
          const auto piece = std::span<const std::byte>(buf).first(static_cast<std::size_t>(n));
          std::shared_ptr<connection> via;
          {
            std::lock_guard lock(mutex_);
            kept_.emplace_back(piece.begin(), piece.end());
            kept_bytes_ += piece.size();
            out_ += piece.size();
            // (resumed meanwhile: the answer and what is sent again go first, this with them)
            if (state_ == state::live && !answer_ && !resend_from_) via = via_;
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
    }
    {
      std::lock_guard lock(mutex_);
      writer_done_ = true;
    }
    back_.notify_one();
    writer_.join();  // (before the pump end closes: it writes there)
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
      due = q_.due(2 * s_.window, true);  // the relay's connection is read again
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
  // The far end's stream: received so far, written into the pump end so far, acknowledged so
  // far (what was written: the far end's window then bounds what waits here), since when not.
  std::uint64_t in_ = 0, written_in_ = 0, acked_in_ = 0;
  clock::time_point unacked_since_{};
  byte_queue q_;             // from the relay, to be written to the pump end
  std::size_t written_ = 0;  // of q_'s first item
  // Resuming: since when, why, the relays tried, when the last was asked, what it said.
  clock::time_point lost_at_{};
  // A resume that came through another relay while this end still took the circuit for live
  // (it had not noticed the loss yet): taken once it does.
  std::shared_ptr<connection> early_via_;
  std::uint64_t early_position_ = 0;
  clock::time_point early_at_{};
  std::string lost_why_, last_refusal_;
  std::set<const connection*> tried_;
  std::string why_;  // why the circuit ended
  bool near_gone_ = false;  // the near end hung up

  std::condition_variable back_;  // the writer: something to write back, or time to go
  bool writer_done_ = false;      // (mutex_)
  std::atomic<bool> stopping_{false}, finished_{false};
  std::atomic<std::uint64_t> resumed_{0};
  bool told_ = false;  // (this tunnel's thread) the relay was told the circuit closed
  std::thread writer_, thread_;
};

}  // namespace decentrain::transport::tcp_detail

#endif  // DECENTRAIN_HAS_ASIO
