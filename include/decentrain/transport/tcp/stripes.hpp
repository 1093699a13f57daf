// A large message over several TCP connections at once (tcp_options::streams): the sending side.
//
// One TCP connection moves at most its send buffer per round trip, and Linux caps that buffer
// (tcp_wmem's maximum, 4 MiB by default: 335 Mbit/s over a 100 ms round trip), so one stream
// cannot fill a long fat link where that setting cannot be raised; several can (bench/streams.sh
// measures both). A pair's first connection carries every frame as before; the dialer opens the
// further ones after it (tcp/rendezvous.hpp), and they carry pieces only. A message of at least
// stripe_min_bytes goes out as a stripe frame on the first connection (its number, size and
// piece size: wire::stripe_head), then its pieces over all of the pair's connections at once,
// each connection taking the next piece as soon as its socket took the last, so a connection
// whose window is fuller takes fewer (PCCL and GridFTP stripe the same way).
//
// The receiving side (tcp/node.hpp) reads the pieces into the memory a receiver posted or one
// buffer, two messages at once at most (so the streams that finished their share of one go on
// with the next while the others finish theirs), lands them in order, and holds the first
// connection's next data frame until those before it landed: messages from a peer land in the
// order it sent them, striped or not, as over one connection.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_ASIO

#include <poll.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/tcp/connection.hpp"

namespace decentrain::transport::tcp_detail {

// Writes one striped message: its stripe frame on conns[0] (the pair's first connection), then
// its pieces over every connection of `conns` at once. The caller holds every connection's
// write_mutex (the first's first). `interrupt` is asked as connection::write_data asks it,
// before the stripe frame starts only. A failure once the stripe frame went out gives every
// connection of the pair up (connection::abandon_locked): the receiver could never complete
// the message it was told of, and one connection closed (by the I/O thread, say) fails the
// write at once, not when a piece next goes to it.
template <class Interrupt>
write_result write_striped(std::span<connection* const> conns, tag_type tag, std::span<const std::byte> data,
                           std::uint64_t piece_bytes, clock::time_point deadline, Interrupt&& interrupt) {
  connection& first = *conns[0];
  const wire::stripe_head head{first.stripes_sent + 1, data.size(), piece_bytes};
  const auto announce = wire::encode_stripe_head(head);
  if (const auto r = first.write_locked(wire::frame_type::stripe, tag, announce, deadline, interrupt); r.status != write_status::done)
    return r;
  ++first.stripes_sent;

  struct lane {
    connection* c = nullptr;
    std::array<std::byte, wire::header_bytes> h{};
    std::optional<connection::outgoing> out;  // the piece being written
  };
  // (Encrypting, each connection seals its piece into a buffer of its own, kept per sending thread.)
  static thread_local std::vector<bytes> ciphertexts;
  if (ciphertexts.size() < conns.size()) ciphertexts.resize(conns.size());
  std::vector<lane> lanes(conns.size());
  for (std::size_t i = 0; i < conns.size(); ++i) lanes[i].c = conns[i];

  const std::uint64_t pieces = head.pieces();
  std::uint64_t next = 0, written = 0;
  auto fail = [&](write_status s, int error) {
    for (auto& l : lanes) {
      if (l.out) (void)l.out->finish(s, error);
      l.c->abandon_locked();
    }
    return write_result{s, error, true};
  };
  std::vector<pollfd> waiting;
  while (written < pieces) {
    for (const auto& l : lanes)
      if (l.c->closed_for_writes.load()) return fail(write_status::closed, 0);
    for (std::size_t i = 0; i < lanes.size(); ++i) {
      auto& l = lanes[i];
      for (;;) {
        if (!l.out) {
          if (next == pieces) break;
          const std::uint64_t index = next++;
          const auto body = data.subspan(static_cast<std::size_t>(head.offset(index)), static_cast<std::size_t>(head.length(index)));
          const auto id = wire::encode_piece_id({head.seq, index});
          std::span<const std::byte> sent = body;
          if (l.c->encrypted()) {
            auto& buffer = ciphertexts[i];
            if (buffer.size() < body.size()) buffer.resize(body.size());
            const auto into = std::span<std::byte>(buffer).first(body.size());
            l.h = l.c->sealed_header(wire::frame_type::piece, id, body, into);
            sent = into;
          } else {
            l.h = l.c->sealed_header(wire::frame_type::piece, id, body, {});
          }
          l.out.emplace(*l.c, l.h, sent);
        }
        if (l.c->closed_for_writes.load()) return fail(write_status::closed, 0);
        const auto step = l.out->write();
        if (step == connection::outgoing::step::full) break;
        if (step == connection::outgoing::step::failed) return fail(write_status::broken, l.out->error());
        (void)l.out->finish(write_status::done);
        l.out.reset();
        ++written;
      }
    }
    if (written == pieces) break;
    const auto left = deadline - clock::now();
    if (left <= clock::duration::zero()) return fail(write_status::timed_out, 0);
    waiting.clear();
    for (const auto& l : lanes)
      if (l.out) waiting.push_back(pollfd{l.c->socket.native_handle(), POLLOUT, 0});
    ::poll(waiting.data(), waiting.size(),
           static_cast<int>(std::min<std::int64_t>(100, std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1)));
  }
  return {};
}

// The bytes a striped message adds on the wire besides its payload: the stripe frame whole,
// and each piece's header and padding.
inline std::uint64_t striped_framing_bytes(std::uint64_t total, std::uint64_t piece_bytes) {
  const wire::stripe_head head{1, total, piece_bytes};
  std::uint64_t n = wire::header_bytes + wire::stripe_head_bytes + wire::padding(wire::stripe_head_bytes).size();
  for (std::uint64_t i = 0; i < head.pieces(); ++i) n += wire::header_bytes + wire::padding(head.length(i)).size();
  return n;
}

}  // namespace decentrain::transport::tcp_detail

#endif  // DECENTRAIN_HAS_ASIO
