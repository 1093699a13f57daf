// One end of a connection that a third peer relays (tcp/relay.hpp): a local socket pair whose
// near end the node uses as it would a TCP socket, so the handshake, its keys (TLS included) and
// every frame run through it unchanged, end to end between the two peers; the far end is pumped
// by this tunnel's thread: what the node writes goes to the relay in relay frames, what the relay
// brings is written back. Closing either end closes the circuit: the near end's connection reads
// the end of its stream, and `why_ended()` says what happened.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_ASIO

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/tcp/connection.hpp"
#include "decentrain/transport/tcp/relay.hpp"

namespace decentrain::transport::tcp_detail {

class tunnel {
 public:
  // This end is peer `self`, the other `far`; `via` is the connection to the relay. The relay
  // frames carry at most `chunk` bytes; at most `max_queued` wait to be written back before
  // the relay's connection stops being read.
  tunnel(int self, int far, std::shared_ptr<connection> via, std::size_t chunk, std::size_t max_queued,
         std::chrono::milliseconds timeout, std::atomic<std::uint64_t>& framing)
      : self_(self), far_(far), via_(std::move(via)), chunk_(chunk), max_(max_queued), timeout_(timeout), framing_(framing) {
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
  int relay() const { return via_->rank; }
  const std::shared_ptr<connection>& via() const { return via_; }

  // The near end, for a connection's socket, which owns it from then on.
  int take_near() { return std::exchange(near_, -1); }

  // Starts pumping; `open`: first asks the relay to open the circuit (the dialing end).
  void start(bool open) {
    if (open && !write_relay(*via_, {wire::relay_kind::open, self_, far_}, {}, timeout_, framing_, [] { return false; }))
      end(decentrain::detail::concat("the connection to the relay, peer ", relay(), ", closed"));
    thread_ = std::thread([this] { run(); });
  }

  // I/O thread: whether `n` more bytes from the relay may be read now; if not, `room` is called
  // (from this tunnel's thread) once they may.
  bool has_room(std::size_t n, std::function<void()> room) {
    std::lock_guard lock(mutex_);
    return pump_ < 0 || q_.has_room(n, max_, std::move(room));
  }

  // I/O thread: bytes the relay brought, written on at once as far as the socket takes them.
  void deliver(bytes b) {
    std::vector<std::function<void()>> due;
    {
      std::lock_guard lock(mutex_);
      if (pump_ < 0 || ended_) return;
      q_.queued += b.size();
      q_.items.emplace_back(wire::relay_route{}, std::move(b));
      due = flush();  // (under the lock: the I/O thread and this tunnel's thread both write)
      if (!q_.items.empty()) signal();
    }
    for (auto& f : due) f();
  }

  // The relay closed the circuit: the far end closed it, or the relay could not reach it, or
  // lost either end (`why`). What came before is still written back.
  void end(std::string why) {
    {
      std::lock_guard lock(mutex_);
      if (why_.empty()) why_ = std::move(why);
      ended_ = true;
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
  void signal() {
    const std::uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof one);
  }

  // Writes what of the queue the pump end takes now (mutex_ held); the callbacks due then.
  std::vector<std::function<void()>> flush() {
    while (!q_.items.empty()) {
      auto& [route, b] = q_.items.front();
      const ssize_t n = ::send(pump_, b.data() + written_, b.size() - written_, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // full (or broken: the near end's reader finds out)
      written_ += static_cast<std::size_t>(n);
      if (written_ < b.size()) break;
      q_.queued -= b.size();
      written_ = 0;
      q_.items.pop_front();
    }
    return q_.due(max_);
  }

  void run() {
    bytes buf(chunk_);
    for (;;) {
      bool out = false;
      {
        std::lock_guard lock(mutex_);
        if (ended_ && q_.items.empty()) break;
        out = !q_.items.empty();
      }
      if (stopping_) break;
      pollfd fds[2] = {{pump_, static_cast<short>(POLLIN | (out ? POLLOUT : 0)), 0}, {wake_, POLLIN, 0}};
      ::poll(fds, 2, 1000);
      if (fds[1].revents & POLLIN) {
        std::uint64_t v;
        (void)!::read(wake_, &v, sizeof v);
      }
      if (stopping_) break;
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        const ssize_t n = ::recv(pump_, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n > 0) {
          if (!write_relay(*via_, {wire::relay_kind::bytes, self_, far_}, std::span<const std::byte>(buf).first(static_cast<std::size_t>(n)),
                           timeout_, framing_, [this] { return stopping_.load(); })) {
            end(decentrain::detail::concat("the connection to the relay, peer ", relay(), ", closed"));
            break;
          }
        } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          // This end's connection closed: the relay and the far end are told (best effort).
          (void)write_relay(*via_, {wire::relay_kind::close, self_, far_}, {}, std::chrono::milliseconds(500), framing_,
                            [this] { return stopping_.load(); });
          end(decentrain::detail::concat("peer ", self_, " closed it"));
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
    bool told = false;
    {
      std::lock_guard lock(mutex_);
      told = ended_;
    }
    // Stopped while the circuit was open (this end's connection was closed or replaced): the
    // relay is told, so it does not count the circuit against its limit until an end leaves.
    if (!told)
      (void)write_relay(*via_, {wire::relay_kind::close, self_, far_}, {}, std::chrono::milliseconds(200), framing_, [] { return false; });
    std::vector<std::function<void()>> due;
    {
      std::lock_guard lock(mutex_);
      ::shutdown(pump_, SHUT_RDWR);
      ::close(pump_);
      pump_ = -1;
      q_.items.clear();
      due = q_.due(max_, true);  // the relay's connection is read again
    }
    for (auto& f : due) f();
    finished_ = true;
  }

  int self_, far_;
  std::shared_ptr<connection> via_;
  std::size_t chunk_, max_;
  std::chrono::milliseconds timeout_;
  std::atomic<std::uint64_t>& framing_;
  int near_ = -1, pump_ = -1, wake_ = -1;
  mutable std::mutex mutex_;  // guards q_, written_, why_, ended_ and pump_'s closing
  byte_queue q_;              // from the relay, to be written to the pump end
  std::size_t written_ = 0;   // of q_'s first item
  std::string why_;
  bool ended_ = false;
  std::atomic<bool> stopping_{false}, finished_{false};
  std::thread thread_;
};

}  // namespace decentrain::transport::tcp_detail

#endif  // DECENTRAIN_HAS_ASIO
