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
//
// A further stream can be lost (an error, a reset) with pieces in its buffers and on the wire,
// which its TCP will never deliver. The receiver says which pieces of the further streams landed
// (landed frames on the first connection; the first's own go or fail with the pair), the sender
// keeps each piece not said landed (connection::outbound_stripes), and what a lost stream
// carried goes again over the connections the receiver reads on to it: the message lands whole,
// a piece that comes twice is read aside, and only the first connection's loss fails the pair.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_ASIO

#include <poll.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/tcp/connection.hpp"

namespace decentrain::transport::tcp_detail {

// Writes striped messages to one peer over the pair's connections, their write locks held
// meanwhile: the first's from the start, the further streams' (in the node's order) once the
// stripe frame went out, so that the I/O thread closing a stream never waits on a stripe frame
// held up by the first connection; a lost stream's lock is let go at once. `streams` are the
// pair's further streams as the node lists them now.
class striped_writer {
 public:
  // What it counts as it goes: pieces sent again (a stream was lost), and framing bytes (the
  // headers and padding of those, and the landed frames it sent for the peer's pieces).
  struct counters {
    std::atomic<std::uint64_t>& resent;
    std::atomic<std::uint64_t>& framing;
  };

  striped_writer(connection& first, std::span<const std::shared_ptr<connection>> streams, clock::time_point deadline, counters counted)
      : first_(first), streams_(streams.begin(), streams.end()), deadline_(deadline), counted_(counted) {
    lanes_.push_back(std::make_unique<lane>(&first, std::unique_lock(first.write_mutex)));
  }

  // One striped message: its stripe frame on the first connection, then its pieces over every
  // connection at once, each taking the next piece as soon as its socket took the last, so a
  // connection whose window is fuller takes fewer. Pieces of a stream lost meanwhile (or before)
  // go again over the others (connection::outbound_stripes says which reach the receiver); only
  // the first connection's failure fails the write, and gives every connection of the pair up
  // (the receiver could never complete the message it was told of). `interrupt` is asked as
  // connection::write_data asks it, before the stripe frame starts. Returns once the pieces went
  // out and what of them over further streams is not said landed is at most `max_held` bytes for
  // the pair (a peer that never says so holds up its sender, not its sender's memory).
  template <class Interrupt>
  write_result send(tag_type tag, std::span<const std::byte> data, std::uint64_t piece_bytes, std::uint64_t max_held,
                    Interrupt&& interrupt) {
    // (pieces owed from before go first, while the first connection still reaches them)
    if (first_.owes_pieces()) {
      lock_streams();
      if (const auto r = pump([] { return true; }, never); r.status != write_status::done) return r;
    }
    const wire::stripe_head head{first_.stripes_sent + 1, data.size(), piece_bytes};
    const auto announce = wire::encode_stripe_head(head);
    counted_.framing += first_.queue_control();
    if (const auto r = first_.write_locked(wire::frame_type::stripe, tag, announce, deadline_, interrupt); r.status != write_status::done)
      return r;
    ++first_.stripes_sent;
    {
      std::lock_guard lock(first_.sent_mutex);
      connection::outbound_stripe e;
      e.head = head;
      e.data = data;
      e.via.assign(static_cast<std::size_t>(head.pieces()), connection::outbound_stripe::unsent);
      e.kept.resize(e.via.size());
      e.open = head.pieces();
      first_.outbound.unconfirmed.push_back(std::move(e));
    }
    lock_streams();
    current_ = head.seq;
    pieces_ = head.pieces();
    auto r = pump([&] { return next_ == pieces_ && first_.outbound.held_bytes <= max_held; }, never);
    if (r.status == write_status::done) {
      // What is not said landed yet is kept for a stream lost later (the caller's memory is not).
      std::lock_guard lock(first_.sent_mutex);
      if (auto* e = first_.outbound.find(head.seq)) {
        for (std::uint64_t i = 0; i < pieces_; ++i)
          if (e->via[static_cast<std::size_t>(i)] != connection::outbound_stripe::landed) {
            const auto p = e->piece(i);
            e->kept[static_cast<std::size_t>(i)] = std::make_shared<const bytes>(p.begin(), p.end());
          }
        e->data = {};
      }
    }
    current_ = 0;
    return r;
  }

  // The pieces of lost streams that wait to go again and reach the receiver now; `stop()` true
  // gives the pair up.
  template <class Stop>
  write_result resend(Stop&& stop) {
    lock_streams();
    return pump([] { return true; }, stop);
  }

  static bool never() { return false; }

 private:
  struct lane {
    lane(connection* to, std::unique_lock<std::mutex> held) : c(to), lock(std::move(held)) {}
    connection* c;
    std::unique_lock<std::mutex> lock;
    std::array<std::byte, wire::header_bytes> h{};
    std::optional<connection::outgoing> out;  // the piece being written
    wire::piece_id id;
    std::shared_ptr<const bytes> hold;  // a kept copy being written (a landed frame may drop it meanwhile)
    std::size_t out_bytes = 0;
    bool again = false;
  };

  void lock_streams() {
    if (streams_locked_) return;
    streams_locked_ = true;
    for (const auto& s : streams_)
      if (!s->closed_for_writes.load()) lanes_.push_back(std::make_unique<lane>(s.get(), std::unique_lock(s->write_mutex)));
  }

  // Writes pieces (those of lost streams first, where they reach the receiver, then the
  // message's next) until `done()` holds (sent_mutex held) and no lane is midway and none has a
  // piece to take, waiting for landed frames when there is nothing to write. Lanes whose stream
  // is lost are let go and their pieces queued again.
  template <class Done, class Stop>
  write_result pump(Done&& done, Stop&& stop) {
    std::vector<pollfd> waiting;
    for (;;) {
      if (first_.closed_for_writes.load()) return fail(write_status::closed, 0);
      if (stop()) return fail(write_status::interrupted, 0);
      for (std::size_t i = 1; i < lanes_.size();)
        if (lanes_[i]->c->closed_for_writes.load()) drop(i);
        else ++i;
      bool busy = false;
      for (std::size_t i = 0; i < lanes_.size();) {
        auto& l = *lanes_[i];
        bool dropped = false;
        for (;;) {
          if (!l.out && !take(l, i == 0)) break;
          const auto step = l.out->write();
          if (step == connection::outgoing::step::full) break;
          if (step == connection::outgoing::step::failed) {
            if (i == 0) return fail(write_status::broken, l.out->error());
            drop(i);
            dropped = true;
            break;
          }
          (void)l.out->finish(write_status::done);
          l.out.reset();
          {
            std::lock_guard lock(first_.sent_mutex);
            first_.outbound.written(l.id, l.c->stream);
          }
          if (l.again) {
            ++counted_.resent;
            counted_.framing += wire::header_bytes + wire::padding(l.out_bytes).size();
          }
          l.hold.reset();
        }
        if (dropped) continue;
        busy = busy || l.out.has_value();
        ++i;
      }
      bool finished = false;
      {
        std::lock_guard lock(first_.sent_mutex);
        finished = !busy && done();
      }
      if (finished) return {};
      const auto left = deadline_ - clock::now();
      if (left <= clock::duration::zero()) return fail(write_status::timed_out, 0);
      if (!busy) {
        // (waiting for landed frames: this peer's own go out meanwhile, or two peers that both
        // wait would wait on each other)
        counted_.framing += first_.queue_control();
        first_.flush_unsent();
        std::unique_lock lock(first_.sent_mutex);
        first_.sent_landed.wait_for(lock, std::chrono::milliseconds(2));
        continue;
      }
      waiting.clear();
      for (const auto& l : lanes_)
        if (l->out) waiting.push_back(pollfd{l->c->socket.native_handle(), POLLOUT, 0});
      ::poll(waiting.data(), waiting.size(),
             static_cast<int>(std::min<std::int64_t>(20, std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1)));
    }
  }

  // The next piece for lane `l`: one to send again that reaches the receiver over it, else the
  // message's next. False: none.
  bool take(lane& l, bool on_first) {
    std::span<const std::byte> body;
    {
      std::lock_guard lock(first_.sent_mutex);
      auto& out = first_.outbound;
      l.again = false;
      for (auto it = out.again.begin(); it != out.again.end();) {
        const auto id = *it;
        auto* e = out.find(id.seq);
        if (!e || e->via[static_cast<std::size_t>(id.index)] != connection::outbound_stripe::unsent) {  // (landed meanwhile)
          it = out.again.erase(it);
          continue;
        }
        if (!out.reaches(id.seq, l.c->stream)) {
          ++it;
          continue;
        }
        out.again.erase(it);
        l.id = id;
        l.hold = e->kept[static_cast<std::size_t>(id.index)];
        body = e->piece(id.index);
        l.again = true;
        break;
      }
      if (!l.again) {
        auto* e = current_ == 0 ? nullptr : out.find(current_);
        if (!e || next_ == pieces_) return false;
        l.id = {current_, next_++};
        body = e->piece(l.id.index);
      }
    }
    l.out_bytes = body.size();
    if (on_first) counted_.framing += first_.queue_control();  // (before the outgoing takes `unsent`)
    const auto tag = wire::encode_piece_id(l.id);
    std::span<const std::byte> sent = body;
    if (l.c->encrypted()) {
      // (each connection seals its piece into a buffer of its own, kept per sending thread)
      static thread_local std::vector<bytes> ciphertexts;
      const auto k = static_cast<std::size_t>(l.c->stream);
      if (ciphertexts.size() <= k) ciphertexts.resize(k + 1);
      auto& buffer = ciphertexts[k];
      if (buffer.size() < body.size()) buffer.resize(body.size());
      const auto into = std::span<std::byte>(buffer).first(body.size());
      l.h = l.c->sealed_header(wire::frame_type::piece, tag, body, into);
      sent = into;
    } else {
      l.h = l.c->sealed_header(wire::frame_type::piece, tag, body, {});
    }
    l.out.emplace(*l.c, l.h, sent);
    return true;
  }

  // A further stream that failed or closed: given up and let go, and what it carried not said
  // landed (the piece midway with it) queued again.
  void drop(std::size_t i) {
    auto& l = *lanes_[i];
    {
      std::lock_guard lock(first_.sent_mutex);
      if (l.out) {
        (void)l.out->finish(write_status::broken);
        first_.outbound.again.push_front(l.id);
      }
      first_.outbound.lost(l.c->stream);
    }
    l.out.reset();
    l.c->abandon_locked();
    lanes_.erase(lanes_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  write_result fail(write_status s, int error) {
    for (auto& l : lanes_) {
      if (l->out) (void)l->out->finish(s, error);
      l->c->abandon_locked();
    }
    return write_result{s, error, true};
  }

  connection& first_;
  std::vector<std::shared_ptr<connection>> streams_;
  bool streams_locked_ = false;
  clock::time_point deadline_;
  std::vector<std::unique_ptr<lane>> lanes_;  // (a lane's piece points into it: lanes never move)
  std::uint64_t current_ = 0, next_ = 0, pieces_ = 0;
  counters counted_;
};

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
