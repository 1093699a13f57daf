// Reads from a raw socket with a deadline, for the programs that play a hostile or hand-written
// peer (bench/hostile_peer.hpp, the transport tests). asio's blocking read retries a receive that
// the socket's SO_RCVTIMEO timed out, waiting without a limit, so the limit is kept here: each
// read waits for the socket to be readable (poll) at most until the deadline.
#pragma once

#include <poll.h>

#include <asio.hpp>

#include <array>
#include <chrono>
#include <cstddef>

namespace bench {

// Fills `into` from `s`, or returns why not: asio::error::timed_out once `limit` has passed, eof
// when the other end closed, another error as the socket gave it. With `some`, returns after the
// first bytes (how many in *got).
inline asio::error_code read_within(asio::ip::tcp::socket& s, asio::mutable_buffer into, std::chrono::milliseconds limit,
                                    bool some = false, std::size_t* got = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  auto* at = static_cast<std::byte*>(into.data());
  std::size_t have = 0;
  while (have < into.size()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    pollfd ready{s.native_handle(), POLLIN, 0};
    if (left <= 0 || ::poll(&ready, 1, static_cast<int>(left)) <= 0) return asio::error::timed_out;
    asio::error_code ec;
    have += s.read_some(asio::buffer(at + have, into.size() - have), ec);
    if (got) *got = have;
    if (ec) return ec;
    if (some) break;
  }
  return {};
}

// True once the other end has closed the connection within `limit` (what it sends meanwhile is
// read and dropped); false when it is still open at the limit.
inline bool closed_within(asio::ip::tcp::socket& s, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::array<std::byte, 4096> sink{};
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const auto ec = read_within(s, asio::buffer(sink), left.count() > 0 ? left : std::chrono::milliseconds(0), true);
    if (ec == asio::error::eof || ec == asio::error::connection_reset) return true;
    if (ec) return false;
  }
}

}  // namespace bench
