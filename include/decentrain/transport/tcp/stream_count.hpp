// How many connections a pair keeps when tcp_options::streams_from_link: the rule and what it
// measures. A TCP connection keeps at most its window in flight, so over a round trip of t it
// moves at most window / t, whatever the link could carry (tcp/stripes.hpp). Where a message's
// connections each kept at least three quarters of a window in flight, the window, not the link,
// held them: twice as many would move more. Where they kept less, the link (or the peers'
// reading) held them, and more would not help. (Half a window would double a link-bound pair
// once more than it needs: on 1 Gbit/s at 100 ms, 16 connections where 5 fill it.) The window is the kernel's limit; the round trip the least the
// kernel measured on the pair's first connection (its propagation delay, without the queues a
// transfer builds: with those a link-bound connection would look window-bound).
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_ASIO

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>

namespace decentrain::transport::tcp_detail {

// The connections a pair should keep after a message of `bytes` landed over `k` of them in
// `seconds`, with a least round trip of `round_trip` seconds and at most `window` bytes in flight
// a connection: 2k (up to `most`) when each kept at least three quarters of it in flight, else k.
inline int streams_wanted(int k, int most, double bytes, double seconds, double round_trip, double window) {
  if (k < 1 || k >= most || seconds <= 0 || round_trip <= 0 || window <= 0) return std::max(k, 1);
  const double in_flight = bytes / seconds / k * round_trip;
  return in_flight >= window * 3 / 4 ? std::min(2 * k, most) : k;
}

// The third number of a /proc/sys/net/ipv4/tcp_[rw]mem line (the buffer's maximum); 0 if unread.
inline std::uint64_t kernel_buffer_max(const char* path) {
  std::ifstream in(path);
  std::uint64_t least = 0, initial = 0, most = 0;
  return in >> least >> initial >> most ? most : 0;
}

// tcp_options::stream_window_bytes's default: the lesser of two thirds of the send buffer's
// maximum and half the receive buffer's (see options.hpp), 4 MiB's worth where unread.
inline std::uint64_t kernel_stream_window() {
  const auto send = kernel_buffer_max("/proc/sys/net/ipv4/tcp_wmem"), receive = kernel_buffer_max("/proc/sys/net/ipv4/tcp_rmem");
  const std::uint64_t fallback = (std::uint64_t{4} << 20) * 2 / 3;
  if (send == 0 && receive == 0) return fallback;
  const auto a = send == 0 ? receive / 2 : send * 2 / 3, b = receive == 0 ? send * 2 / 3 : receive / 2;
  return std::max<std::uint64_t>(std::min(a, b), 1);
}

// The least round trip the kernel measured on a TCP socket, in seconds; 0 where it has none.
// Read at the offsets of Linux's uapi tcp_info (a stable ABI): glibc's struct ends before
// tcpi_min_rtt (Linux 4.6); a kernel that fills less than that leaves the smoothed round trip.
inline double least_round_trip(int fd) {
#if defined(__linux__) && defined(TCP_INFO)
  constexpr std::size_t rtt_at = 68, min_rtt_at = 148;
  alignas(8) std::array<unsigned char, 256> info{};
  socklen_t size = info.size();
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, info.data(), &size) != 0) return 0;
  const auto field = [&](std::size_t at) {
    std::uint32_t v = 0;
    if (size >= at + sizeof(v)) std::memcpy(&v, info.data() + at, sizeof(v));
    return v;
  };
  const auto least = field(min_rtt_at);
  return (least != 0 && least != ~std::uint32_t{0} ? least : field(rtt_at)) * 1e-6;
#else
  (void)fd;
  return 0;
#endif
}

}  // namespace decentrain::transport::tcp_detail

#endif  // DECENTRAIN_HAS_ASIO
