// A network partition of TCP peers on loopback, without root or a firewall: each peer listens on
// 127.0.0.1 and advertises 127.0.0.2 (tcp_options::advertise), where this relay listens on the
// same port and forwards. It reads each connection's hello to learn which rank dialed. cut()
// then holds every connection between the two sides (nothing forwarded, nothing closed: silence,
// as behind a firewall that drops packets) and refuses new ones at once (a firewall that rejects);
// heal() closes the held connections, as the peers did on their side long before, and lets new
// ones through. Plain POSIX sockets and one thread per connection: a test's handful of peers.
#pragma once

#include <decentrain/transport/frame.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace fixture {

class partition_relay {
 public:
  static constexpr const char* front_host = "127.0.0.2";  // what the peers advertise

  partition_relay() = default;
  partition_relay(const partition_relay&) = delete;
  partition_relay& operator=(const partition_relay&) = delete;
  ~partition_relay() {
    stopping_ = true;
    for (;;) {  // an accept loop may start one more connection's thread before it sees stopping_
      std::vector<std::thread> running;
      {
        std::lock_guard lock(mutex_);
        running.swap(threads_);
      }
      if (running.empty()) break;
      for (auto& t : running) t.join();
    }
    for (int fd : listeners_) ::close(fd);
  }

  // Relays 127.0.0.2:port to the peer of rank `rank` listening on 127.0.0.1:port.
  void front(int rank, std::uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) throw std::runtime_error("partition_relay: socket() failed");
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const auto at = address(front_host, port);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&at), sizeof at) != 0 || ::listen(fd, 64) != 0) {
      ::close(fd);
      throw std::runtime_error("partition_relay: cannot listen on " + std::string(front_host) + ":" + std::to_string(port));
    }
    std::lock_guard lock(mutex_);
    listeners_.push_back(fd);
    threads_.emplace_back([this, fd, rank, port] { accept_loop(fd, rank, port); });
  }

  // Cuts `side` off from every other rank until heal().
  void cut(std::set<int> side) {
    std::lock_guard lock(mutex_);
    side_ = std::move(side);
    cut_ = true;
    for (auto& l : links_)
      if (straddles(l->dialer, l->target)) l->held = true;
  }
  void heal() {
    std::lock_guard lock(mutex_);
    cut_ = false;
    for (auto& l : links_)
      if (l->held) l->closing = true;
  }
  // Connections refused while cut (a peer's tries to reach the other side).
  int refused() const { return refused_; }

 private:
  struct link {
    int dialer = -1, target = -1;
    std::atomic<bool> held{false}, closing{false};
  };

  static sockaddr_in address(const char* host, std::uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    ::inet_pton(AF_INET, host, &a.sin_addr);
    return a;
  }

  bool straddles(int a, int b) const { return cut_ && (side_.count(a) != 0) != (side_.count(b) != 0); }

  // Waits up to `ms` for `fd` to be readable; false on timeout or when the relay stops.
  bool readable(int fd, int ms) const {
    pollfd p{fd, POLLIN, 0};
    return !stopping_ && ::poll(&p, 1, ms) > 0;
  }

  // Reads exactly `n` bytes within a few seconds.
  bool read_all(int fd, std::byte* out, std::size_t n) const {
    for (int waited = 0; n > 0 && waited < 100;) {
      if (!readable(fd, 50)) {
        ++waited;
        continue;
      }
      const auto got = ::recv(fd, out, n, 0);
      if (got <= 0) return false;
      out += got;
      n -= static_cast<std::size_t>(got);
    }
    return n == 0;
  }

  // Writes all `n` bytes, waiting for room in steps of 50 ms: a peer that reads nothing (held,
  // frozen) cannot keep this thread in a send when the relay stops or the link is closed.
  bool write_all(int fd, const std::byte* p, std::size_t n, const std::atomic<bool>& closing) const {
    while (n > 0) {
      if (stopping_ || closing) return false;
      pollfd w{fd, POLLOUT, 0};
      if (::poll(&w, 1, 50) <= 0) continue;
      const auto put = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (put < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (put <= 0) return false;
      p += put;
      n -= static_cast<std::size_t>(put);
    }
    return true;
  }

  void accept_loop(int listener, int rank, std::uint16_t port) {
    while (!stopping_) {
      if (!readable(listener, 50)) continue;
      const int client = ::accept(listener, nullptr, nullptr);
      if (client < 0) continue;
      std::lock_guard lock(mutex_);
      threads_.emplace_back([this, client, rank, port] { relay(client, rank, port); });
    }
  }

  // One connection: its hello names the dialer; then bytes both ways until either side closes,
  // the link is healed after being held, or the relay stops.
  void relay(int client, int target, std::uint16_t port) {
    namespace wire = decentrain::transport::wire;
    std::vector<std::byte> hello(wire::header_bytes);
    int dialer = -1;
    try {
      if (!read_all(client, hello.data(), hello.size())) throw std::runtime_error("no hello");
      const auto h = wire::decode_header(hello.data(), wire::max_handshake_bytes);
      decentrain::transport::bytes body(static_cast<std::size_t>(h.length));
      const std::size_t pad = wire::padding(h.length).size();
      std::vector<std::byte> rest(body.size() + pad);
      if (!read_all(client, rest.data(), rest.size())) throw std::runtime_error("no hello body");
      std::copy(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(body.size()), body.begin());
      dialer = wire::decode_body<wire::hello>(body, "hello").rank;
      hello.insert(hello.end(), rest.begin(), rest.end());
    } catch (const std::exception&) {
      ::close(client);
      return;
    }
    auto l = std::make_shared<link>();
    l->dialer = dialer;
    l->target = target;
    {
      std::lock_guard lock(mutex_);
      if (straddles(dialer, target)) {
        ++refused_;
        ::close(client);
        return;
      }
      links_.push_back(l);
    }
    const int server = ::socket(AF_INET, SOCK_STREAM, 0);
    const auto to = address("127.0.0.1", port);
    if (server >= 0 && ::connect(server, reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0 &&
        write_all(server, hello.data(), hello.size(), l->closing)) {
      std::byte buffer[1 << 16];
      pollfd both[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      while (!stopping_ && !l->closing) {
        if (l->held) {  // silence: read nothing, so nothing is forwarded and nothing closes
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          continue;
        }
        both[0].revents = both[1].revents = 0;
        if (::poll(both, 2, 50) <= 0) continue;
        bool open = true;
        for (int i = 0; i < 2 && open; ++i) {
          if (!(both[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          const auto got = ::recv(both[i].fd, buffer, sizeof buffer, 0);
          open = got > 0 && write_all(both[1 - i].fd, buffer, static_cast<std::size_t>(got), l->closing);
        }
        if (!open) break;
      }
    }
    if (server >= 0) ::close(server);
    ::close(client);
  }

  std::mutex mutex_;  // guards threads_, listeners_, links_, side_, cut_
  std::vector<std::thread> threads_;
  std::vector<int> listeners_;
  std::vector<std::shared_ptr<link>> links_;
  std::set<int> side_;
  bool cut_ = false;
  std::atomic<int> refused_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace fixture
