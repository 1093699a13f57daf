// Hole punching: two peers that accept no connections (each behind a NAT) connect directly.
// Each dials the peers that listen from one local port (`port_reservation`), so a NAT that maps
// a port the same way whatever the destination (full cone, restricted cone, port restricted;
// not a symmetric NAT) shows every peer the same public address for it. A relay that both
// reach tells each the other's address as it sees it (a relay frame of kind punch), and both
// connect to it from that port at once, the lower rank listening on it meanwhile: each NAT takes
// the other's packets for the answer to its own (TCP's simultaneous open, or an accept where
// the two attempts do not cross; libp2p's DCUtR works so). What does not connect within
// `tcp_options::punch_within` goes through the relay instead (tcp/tunnel.hpp).
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_ASIO

#include <asio.hpp>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <thread>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/tcp/connection.hpp"

namespace decentrain::transport::tcp_detail {

// The local IPv4 port a peer dials from, held by a bound socket for the peer's lifetime (so
// no other program takes it). Every socket bound to it sets SO_REUSEADDR and SO_REUSEPORT:
// connections from one port to different destinations are distinct to TCP.
class port_reservation {
 public:
  port_reservation() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    decentrain::detail::check(fd_ >= 0, "tcp: cannot open a socket for the port to punch from: ", std::strerror(errno));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (!reuse(fd_) || ::bind(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
      const int err = errno;
      ::close(fd_);
      decentrain::detail::fail("tcp: cannot bind a port to punch from: ", std::strerror(err));
    }
    socklen_t n = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &n);
    port_ = ntohs(a.sin_port);
  }
  port_reservation(const port_reservation&) = delete;
  port_reservation& operator=(const port_reservation&) = delete;
  ~port_reservation() { ::close(fd_); }

  std::uint16_t port() const { return port_; }

  // Binds `s` (closed) to the port; false where that fails (the caller dials from any port,
  // and this peer is not punched to).
  bool bind(asio::ip::tcp::socket& s) const {
    asio::error_code ec;
    s.open(asio::ip::tcp::v4(), ec);
    if (ec || !reuse(s.native_handle())) return false;
    s.bind(asio::ip::tcp::endpoint(asio::ip::address_v4::any(), port_), ec);
    if (ec) s.close(ec);
    return s.is_open();
  }

  // Connects from the port to `to` again and again (each SYN a NAT drops, or a refusal before
  // the other side's packets opened its NAT, is followed by another) until connected, the
  // deadline, or `stop()`. With `listening`, the port also accepts meanwhile (from `to` only):
  // the other side's SYN that finds no attempt of this side under way (they cross only by
  // chance where nothing delays them, as on one machine) is accepted instead of refused. The
  // connected descriptor (blocking), or -1.
  template <class Stop>
  int connect(const asio::ip::tcp::endpoint& to, clock::time_point deadline, bool listening, Stop&& stop) const {
    if (!to.address().is_v4()) return -1;
    const auto from = address(htonl(INADDR_ANY), port_);
    const auto dest = address(htonl(to.address().to_v4().to_uint()), to.port());
    int listener = -1;
    if (listening) {
      listener = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (listener >= 0 && (!reuse(listener) || ::bind(listener, reinterpret_cast<const sockaddr*>(&from), sizeof from) != 0 ||
                            ::listen(listener, 4) != 0)) {
        ::close(listener);
        listener = -1;
      }
    }
    int connected = -1;
    while (connected < 0 && clock::now() < deadline && !stop()) {
      const auto attempt_ends = std::min(deadline, clock::now() + std::chrono::milliseconds(250));
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      bool trying = reuse(fd) && ::bind(fd, reinterpret_cast<const sockaddr*>(&from), sizeof from) == 0 &&
                    (::connect(fd, reinterpret_cast<const sockaddr*>(&dest), sizeof dest) == 0 || errno == EINPROGRESS);
      while (connected < 0 && clock::now() < attempt_ends && !stop()) {
        pollfd p[2] = {{trying ? fd : -1, POLLOUT, 0}, {listener, POLLIN, 0}};
        if (::poll(p, 2, 20) <= 0) continue;
        if (p[1].revents & POLLIN) connected = accept_from(listener, dest);
        if (connected < 0 && (p[0].revents & (POLLOUT | POLLERR | POLLHUP))) {
          int error = 0;
          socklen_t n = sizeof error;
          if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &n) != 0) error = errno;
          if (error == 0) connected = fd;
          if (error != EINPROGRESS) trying = false;
        }
        if (!trying && listener < 0) break;
      }
      if (connected != fd) ::close(fd);
      if (connected < 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // (a refusal comes back at once)
    }
    if (listener >= 0) ::close(listener);
    if (connected >= 0) (void)::fcntl(connected, F_SETFL, ::fcntl(connected, F_GETFL) & ~O_NONBLOCK);
    return connected;
  }

 private:
  static sockaddr_in address(std::uint32_t ip, std::uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = ip;
    a.sin_port = htons(port);
    return a;
  }
  // A connection the listener took from `from`; others are closed. -1: none.
  static int accept_from(int listener, const sockaddr_in& from) {
    sockaddr_in peer{};
    socklen_t n = sizeof peer;
    const int fd = ::accept4(listener, reinterpret_cast<sockaddr*>(&peer), &n, SOCK_CLOEXEC);
    if (fd < 0) return -1;
    if (peer.sin_addr.s_addr == from.sin_addr.s_addr && peer.sin_port == from.sin_port) return fd;
    ::close(fd);
    return -1;
  }
  static bool reuse(int fd) {
    const int one = 1;
    return ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
           ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) == 0;
  }

  int fd_ = -1;
  std::uint16_t port_ = 0;
};

// A peer's address as a relay saw it, in a punch frame's body: "a.b.c.d:port".
inline bytes encode_punch_address(const asio::ip::tcp::endpoint& e) {
  const auto text = e.address().to_string() + ":" + std::to_string(e.port());
  const auto* p = reinterpret_cast<const std::byte*>(text.data());
  return bytes(p, p + text.size());
}
inline asio::ip::tcp::endpoint decode_punch_address(std::span<const std::byte> body) {
  decentrain::detail::check(body.size() <= 64, "frame: a punch frame's address has ", body.size(), " bytes (at most 64)");
  const std::string text(reinterpret_cast<const char*>(body.data()), body.size());
  const auto [host, port] = wire::split_address(text);
  asio::error_code ec;
  const auto address = asio::ip::make_address_v4(host, ec);  // (an address, never a name to look up)
  decentrain::detail::check(!ec && port != 0, "frame: a punch frame's address '", text, "' is not IPV4:PORT");
  return {address, port};
}

}  // namespace decentrain::transport::tcp_detail

#endif  // DECENTRAIN_HAS_ASIO
