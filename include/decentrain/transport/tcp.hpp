// Real peers over TCP with standalone asio: the facade of transport/tcp/. A peer listens on an
// address, finds its group through the peers it knows and connects to every one of them
// (tcp/rendezvous.hpp, each connection after a handshake: tcp/handshake.hpp); one I/O thread
// reads every connection (tcp/node.hpp), strangers are bounded in time and count
// (tcp/admission.hpp), heartbeats find the silent (tcp/heartbeat.hpp), and two peers that
// accept no connections reach each other through a relay (tcp/relay.hpp, tcp/tunnel.hpp).
// Settings: tcp/options.hpp.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_ASIO

#include <chrono>
#include <mutex>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/membership.hpp"
#include "decentrain/transport/tcp/admission.hpp"
#include "decentrain/transport/tcp/node.hpp"
#include "decentrain/transport/tcp/options.hpp"
#include "decentrain/transport/tcp/rendezvous.hpp"

namespace decentrain::transport {

class tcp {
  struct impl {
    explicit impl(tcp_options o) : node(std::move(o)) {
      node.set_stream_dialer([this](int peer) { return rendezvous.open_missing_streams(peer); });
    }
    // (the node's stream dialer dials through the rendezvous, which goes first)
    ~impl() { node.stop_dialing(); }
    impl(const impl&) = delete;
    impl& operator=(const impl&) = delete;
    tcp_detail::node node;
    tcp_detail::rendezvous rendezvous{node};
  };

 public:
  // Binds the listening socket (so address() is known); connect() then builds the mesh.
  explicit tcp(tcp_options options) : self_(std::make_shared<impl>(std::move(options))) {}

  // Binds and connects: returns once every peer of the world is connected, or throws.
  static tcp join(tcp_options options) {
    tcp t(std::move(options));
    t.connect();
    return t;
  }

  // Where the others reach this peer ("host:port"); empty when it accepts no connections.
  std::string address() const { return n().advertised; }
  void connect() {
    self_->rendezvous.connect();
    // The clock starts once the group has formed, as a simulated network's does: the wait for
    // the other processes to start is not the run's, and would count against the first peer's
    // compute utilisation.
    std::lock_guard lock(n().mutex);
    n().started = std::chrono::steady_clock::now();
  }

  int rank() const { return n().opts.rank; }
  // The peers the group started with; a peer that joined later counts up to its own rank.
  int world() const { return std::max(n().opts.world, n().opts.rank + 1); }
  void send(int peer, tag_type tag, std::span<const std::byte> data) { n().send(peer, tag, data); }
  bytes recv(int peer, tag_type tag) { return n().recv(peer, tag, !lane_); }
  received recv_any(std::span<const int> sources, tag_type tag) { return n().recv_any(sources, tag, !lane_); }
  std::optional<bytes> try_recv(int peer, tag_type tag) { return n().try_recv(peer, tag); }
  // Sends `outs` (when `to` >= 0) and receives the messages from `from` straight into `ins`; see
  // transport::exchange.
  void exchange(int to, std::span<const std::span<const std::byte>> outs, int from, std::span<const std::span<std::byte>> ins,
                tag_type tag, const landed_fn& landed) {
    n().exchange(to, outs, from, ins, tag, landed, !lane_);
  }
  void computed(double) {}
  // What this peer will take beyond its budget (transport::expect; mailbox.hpp): the next
  // `size` bytes from `peer` on `tag`, or up to `size` bytes from each peer on `tag` whenever they come.
  void expect(int peer, tag_type tag, std::uint64_t size) { n().box.expect(peer, tag, size); }
  void allow(tag_type tag, std::uint64_t size) { n().box.allow(tag, size); }

  // ---- membership (transport/membership.hpp) ----
  bytes recv_within(int peer, tag_type tag, std::chrono::milliseconds timeout) { return n().recv(peer, tag, !lane_, timeout); }
  void discard_before(int peer, tag_type tag) { n().box.discard_before(peer, tag); }
  void set_epoch(std::uint64_t epoch) { n().box.set_epoch(epoch); }
  std::optional<alarm> alarmed() const { return n().box.alarmed(); }
  // Closes the connection to `peer` and drops what it sent: a peer left out of the view that
  // wakes up later (SIGSTOP, partition) finds its connections closed instead of being heard.
  void forget(int peer) { drop(peer, false, decentrain::detail::concat("peer ", rank(), " left it out of its view")); }
  // Forgets `peer` and refuses it from now on, also as a joiner, telling it `reason`: the group
  // excluded it (fault::elastic, a peer whose contributions were poison).
  void bar(int peer, const std::string& reason) {
    drop(peer, true, decentrain::detail::concat("peer ", rank(), " excluded it from the run: ", reason));
  }

  // Says goodbye to every connected peer (they find this peer departed at once, with `reason`,
  // instead of at a deadline) and closes the connections.
  void leave(const std::string& reason) { n().leave(reason); }

  // ---- joining a running group (fault::elastic) ----
  // Whether connect() found the group running: this peer then waits to be admitted to a view.
  bool joined_late() const { return n().late_group(); }
  // Ranks of this group are below this: world() and the ranks joiners may take (max_world).
  int capacity() const { return n().opts.capacity(); }
  // A joiner waiting for admission: asks its seeds and the peers it knows for their directories
  // and connects to those it is not connected to yet (joiners that came after it; best effort).
  // A member the group left out that forgot the group (fault::elastic's left_out = rejoin) calls
  // it too: from then on it dials as a joiner, also the peers it forgot, whose addresses it kept.
  void rediscover() { self_->rendezvous.rediscover(); }
  // Every peer connected now, ascending.
  std::vector<int> connected() const { return n().connected(); }
  // The members of the view this peer installed (fault::elastic): a joiner outside it may send
  // only membership frames, small and few (tcp_options::max_joiners and the two after it).
  void set_members(const std::vector<int>& members) { n().set_members(members); }
  // Members whose queued messages were dropped over their budget (tcp_options::max_queued_bytes),
  // and how often.
  std::map<int, std::uint64_t> over_budget() const { return n().box.over_budget(); }

  // Sends, receives and counters are safe from two threads with different tags: a lane is this
  // same connection set (see transport::open_lane); its waits happen beside the caller's work and
  // are not counted in wait_seconds.
  std::optional<tcp> lane() {
    tcp l = *this;
    l.lane_ = true;
    return l;
  }
  traffic_stats stats() const { return n().stats(); }
  // The payload bytes this peer (its lanes included) sent to `peer` so far: one link's traffic.
  std::uint64_t bytes_sent_to(int peer) const {
    decentrain::detail::check(peer >= 0 && peer < n().opts.capacity(), "tcp: no rank ", peer, " (ranks below ", n().opts.capacity(), ")");
    return n().sent_to[static_cast<std::size_t>(peer)].load();
  }

  // The peers this one reached through a relay (they accept no connections, nor does this
  // one), each with the rank of the peer that relayed it last, whether connected still or not.
  std::map<int, int> relayed() const { return n().relayed(); }
  // The peers this one reached directly although neither accepts connections: a hole punched
  // through their NATs (tcp_options::punch_within, tcp/punch.hpp), connected now.
  std::vector<int> punched() const { return n().punched(); }
  // What this peer did as a relay for others (tcp_options::relay).
  relay_stats relaying() const { return n().relay_stats(); }
  // The connections to a peer that its large messages go over at once (tcp_options::streams,
  // tcp/stripes.hpp): the pair's first and its further streams open now; 0 when not connected.
  int streams_to(int peer) const { return n().streams_to(peer); }
  // Those connections' TCP ports (the first connection's first, stream 0), to find them in `ss`
  // or a firewall's rules; empty when not connected, ports 0 for a relayed connection.
  std::vector<stream_ports> stream_ports_to(int peer) const { return n().stream_ports(peer); }

  // What the heartbeats measured of a connected peer (nothing when `peer` is not connected).
  struct peer_liveness {
    double round_trip_seconds = -1;     // smoothed; -1 until a heartbeat was echoed
    double heartbeat_gap_seconds = -1;  // smoothed time between its heartbeats
    std::chrono::milliseconds deadline{0};  // how long it may be silent before it is closed
    std::uint64_t heartbeats = 0;
  };
  std::optional<peer_liveness> liveness_of(int peer) const {
    const auto l = n().liveness_of(peer);
    if (!l) return std::nullopt;
    const auto& [rtt, gap, deadline, beats] = *l;
    return peer_liveness{rtt, gap, deadline, beats};
  }

  // The reason the last malformed frame was dropped (empty if none was).
  std::string last_malformed() const {
    std::lock_guard lock(n().mutex);
    return n().last_malformed;
  }

  // What became of connections that had not (yet) shown they belong to the run.
  using admission_stats = tcp_admission_stats;
  admission_stats admission() const { return n().adm.stats(); }

 private:
  tcp_detail::node& n() const { return self_->node; }

  // forget and bar: closes the connection with a goodbye saying `why`, drops what `peer` sent,
  // and (barred) refuses it from now on.
  void drop(int peer, bool barred, const std::string& why) {
    decentrain::detail::check(peer >= 0 && peer < capacity() && peer != rank(), "tcp: peer ", rank(), " cannot ",
                              barred ? "bar" : "forget", " peer ", peer);
    if (barred) {
      // A forgotten peer's address stays in the directory (whose answers list connected peers
      // only, so no joiner is sent to it): should this peer be left out in turn and rejoin, it
      // dials the group it knew (rediscover). A barred one is never dialed again.
      std::lock_guard lock(n().mutex);
      n().dir.addresses.erase(peer);
    }
    if (barred) n().box.bar(peer, why);
    else n().box.forget(peer, why);
    // (Waited for: a caller that goes on to read connected(), or to let the peer in again, finds
    // it gone. At most a second, should the I/O thread be stuck.)
    auto closed = n().give_up_on(peer, barred ? "excluded from the run" : "left out of the view", wire::farewell{true, why});
    if (!n().io.get_executor().running_in_this_thread()) closed.wait_for(std::chrono::seconds(1));
  }

  std::shared_ptr<impl> self_;
  bool lane_ = false;  // a lane's waits are not the caller's
};

static_assert(membership_endpoint<tcp>);
static_assert(joining_endpoint<tcp>);

}  // namespace decentrain::transport

#endif  // DECENTRAIN_HAS_ASIO
