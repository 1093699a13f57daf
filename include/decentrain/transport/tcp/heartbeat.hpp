// Heartbeats: every connected peer gets one each interval, each one received measures the link
// (liveness.hpp), and a peer heard from nothing at all past its deadline is named for closing.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_ASIO

#include <poll.h>
#include <sys/ioctl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/tcp/connection.hpp"

namespace decentrain::transport::tcp_detail {

class heartbeat {
 public:
  // A peer silent past its deadline: why, for its error, and what it is told (`hung_up`: it
  // closed the connection while this peer was not reading it, see below).
  struct silent {
    std::shared_ptr<connection> c;
    std::string why;
    wire::farewell told;
    bool hung_up = false;
  };

  // On the I/O thread, each interval: returns the peers silent past their deadline and sends
  // the others a heartbeat. `beats_mutex` guards each connection's `beats` (read by other
  // threads); `framing` counts the bytes sent.
  //
  // A connection whose reading is paused (its sender is over the mailbox's budget) is not read,
  // so its heartbeats wait in the socket: it counts as heard, and is looked at only for a hang-up.
  std::vector<silent> beat(int self, const std::vector<std::shared_ptr<connection>>& connected, std::chrono::milliseconds min_silence,
                           std::mutex& beats_mutex, std::atomic<std::uint64_t>& framing) {
    const auto now = clock::now();
    // When this peer itself was not running (SIGSTOP, a paused machine), nothing could be read
    // meanwhile and the others' silence says nothing: their deadlines start afresh.
    const bool was_stopped = last_beat_ && now - *last_beat_ > min_silence;
    last_beat_ = now;
    std::vector<silent> out;
    for (const auto& c : connected) {
      if (c->closed) continue;
      if (c->paused) {
        pollfd p{c->socket.native_handle(), POLLRDHUP, 0};
        if (::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
          out.push_back({c, "it closed the connection while this peer was not reading it (over its budget)", {}, true});
          continue;
        }
        c->heard = now;
      }
      int queued = 0;
      if (::ioctl(c->socket.native_handle(), FIONREAD, &queued) == 0 && queued != c->queued) {
        c->queued = queued;
        c->heard = now;
      }
      if (was_stopped) c->heard = now;
      std::chrono::milliseconds deadline;
      {
        std::lock_guard lock(beats_mutex);
        deadline = c->beats.deadline(min_silence);
      }
      const auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(now - c->heard);
      if (quiet > deadline) {
        out.push_back({c,
                       decentrain::detail::concat("heard nothing from it for ", quiet.count(), " ms, over its deadline of ",
                                                  deadline.count(), " ms (from its heartbeats)"),
                       wire::farewell{true, decentrain::detail::concat("peer ", self, " heard nothing from peer ", c->rank, " for ",
                                                                       quiet.count(), " ms")}});
        continue;
      }
      send(*c, now, framing);
    }
    return out;
  }

  // A heartbeat arrived on `c` (I/O thread): its echo gives the round trip.
  static void heard(connection& c, const bytes& body, std::mutex& beats_mutex) {
    const auto beat = wire::decode_heartbeat(body);
    const auto now = clock::now();
    // A round trip only from an echo of ours that makes sense (a peer's garbage is ignored).
    double round_trip = -1;
    const std::uint64_t now_ns = nanoseconds(now);
    if (beat.echo_ns != 0 && beat.echo_ns <= now_ns && beat.held_ns <= now_ns - beat.echo_ns) {
      round_trip = static_cast<double>(now_ns - beat.echo_ns - beat.held_ns) * 1e-9;
      if (round_trip > 600) round_trip = -1;
    }
    c.last_in = beat;
    c.last_in_at = now;
    std::lock_guard lock(beats_mutex);
    c.beats.heartbeat(now, round_trip);
  }

 private:
  static void send(connection& c, clock::time_point now, std::atomic<std::uint64_t>& framing) {
    std::unique_lock lock(c.write_mutex, std::try_to_lock);
    // A writer busy on this connection is sending bytes, which the peer hears as well.
    if (!lock.owns_lock() || c.closed_for_writes.load() || !c.flush_unsent()) return;
    wire::heartbeat h;
    h.sent_ns = nanoseconds(now);
    if (c.last_in.sent_ns != 0) {
      h.echo_ns = c.last_in.sent_ns;
      h.held_ns = nanoseconds(now) - nanoseconds(c.last_in_at);
    }
    framing += c.append_frame(wire::frame_type::heartbeat, wire::encode_heartbeat(h));
    c.flush_unsent();
  }

  std::optional<clock::time_point> last_beat_;
};

}  // namespace decentrain::transport::tcp_detail

#endif  // DECENTRAIN_HAS_ASIO
