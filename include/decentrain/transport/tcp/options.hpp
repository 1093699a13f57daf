// What a TCP peer is started with (tcp_options), each setting checked before anything listens.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/auth.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/identity.hpp"
#include "decentrain/transport/tls.hpp"

namespace decentrain::transport {

// "a=1;b=2" against "a=1;b=3;c=4": "b is 2 here and 3 there, c is unset here and 4 there".
inline std::string settings_difference(const std::string& here, const std::string& there) {
  const auto items = [](const std::string& s) {
    std::map<std::string, std::string> out;
    std::size_t at = 0;
    while (at <= s.size()) {
      const auto end = std::min(s.find(';', at), s.size());
      const auto item = s.substr(at, end - at);
      if (!item.empty()) {
        const auto eq = item.find('=');
        out[item.substr(0, eq)] = eq == std::string::npos ? "" : item.substr(eq + 1);
      }
      at = end + 1;
    }
    return out;
  };
  const auto a = items(here), b = items(there);
  std::set<std::string> names;
  for (const auto& [k, v] : a) names.insert(k);
  for (const auto& [k, v] : b) names.insert(k);
  std::string out;
  for (const auto& k : names) {
    const auto x = a.find(k), y = b.find(k);
    if (x != a.end() && y != b.end() && x->second == y->second) continue;
    out += (out.empty() ? "" : ", ") + k + " is " + (x == a.end() ? "unset" : x->second) + " here and " +
           (y == b.end() ? "unset" : y->second) + " there";
  }
  return out.empty() ? "the same items in another order" : out;
}

// What a peer that listens does for peers that cannot reach each other (tcp_options::relay).
struct relay_options {
  bool serve = true;      // relay at all
  int max_circuits = 64;  // pairs of peers relayed at once
  // All relayed traffic together, in payload bytes a second; 0: no limit.
  std::uint64_t bytes_per_second = 0;
  // A relayed stream's window: what an end sends and the other has not yet taken, and what may
  // wait at a relay from one sender for one destination before that sender's connection stops
  // being read. Set it alike on every peer: an end whose window is larger than its relay's is
  // held up there, and the acks it sends behind its bytes with it.
  std::uint64_t max_queued_bytes = std::uint64_t{8} << 20;
  // How long a relay that leaves (or is destroyed) waits for the circuits it carries to close
  // first: their ends close them when they are done, and a pair whose last exchange ends a
  // moment after this peer's own would otherwise lose it.
  std::chrono::milliseconds linger{3000};
  // How long the two ends of a relayed connection whose relay is lost look for another to
  // resume it before they give it up (its heartbeats pause meanwhile: keep it under
  // tcp_options::min_silence).
  std::chrono::milliseconds resume_within{2000};

  void validate() const {
    decentrain::detail::check(max_circuits >= 0, "tcp: relay.max_circuits must be >= 0, got ", max_circuits);
    decentrain::detail::check(linger.count() >= 0, "tcp: relay.linger must be >= 0 ms, got ", linger.count());
    decentrain::detail::check(resume_within.count() >= 0, "tcp: relay.resume_within must be >= 0 ms, got ", resume_within.count());
    decentrain::detail::check(max_queued_bytes >= (std::uint64_t{1} << 16), "tcp: relay.max_queued_bytes must be at least 64 KiB, got ",
                              max_queued_bytes);
  }
};

// What a relay did (tcp::relay_stats): circuits it opened and refused, payload it forwarded.
struct relay_stats {
  std::uint64_t circuits_opened = 0, circuits_refused = 0, open_circuits = 0;
  std::uint64_t bytes_forwarded = 0;
  // For a circuit closed meanwhile, or made here (a refusal) for a sender that does not read them.
  std::uint64_t frames_dropped = 0;
  std::uint64_t queued_bytes = 0;  // waiting to be forwarded now (frames' bodies, and a header's worth for each without stream bytes)
  std::string last_refusal;
};

// One connection of a pair (tcp::stream_ports_to): its number (0: the pair's first, which
// carries every frame; 1 and up: further streams, tcp_options::streams) and its TCP ports.
struct stream_ports {
  int stream = 0;
  std::uint16_t local = 0, remote = 0;
};

struct tcp_options {
  // Where this peer accepts connections; port 0: any free port (see tcp::address()). Empty: it
  // accepts none (a peer behind a NAT or a firewall): it dials every peer of the group that
  // listens, lower ranks and higher, and nobody dials it; two such peers reach each other
  // directly where their NATs let them (`punch_within`, tcp/punch.hpp), else through a peer that
  // listens and relays (`relay`, tcp/relay.hpp), the higher rank asking for either. Not peer 0
  // (the group's first seed). The peers that join a running group must reach every member, so
  // none is admitted while such a member is in.
  std::string listen = "127.0.0.1:0";
  // The host other peers dial to reach this one; empty: the listen host. Needed when listening
  // on a wildcard address (0.0.0.0 or ::), which names no machine in particular.
  std::string advertise;
  // How long two peers that accept no connections try to connect directly (a hole punched
  // through their NATs, IPv4 only) before the higher rank asks for a relay; 0: never try.
  std::chrono::milliseconds punch_within{1000};
  std::vector<std::string> join;       // peers to learn the others from; empty for the first peer
  int rank = 0;
  int world = 1;
  std::chrono::milliseconds connect_timeout{2000};   // one connection attempt
  std::chrono::milliseconds join_timeout{30000};     // until every peer is connected
  std::chrono::milliseconds first_backoff{50};       // doubles after each round of failures...
  std::chrono::milliseconds max_backoff{2000};       // ...up to this
  std::chrono::milliseconds recv_timeout{300000};    // a recv (or a send) that waits longer fails
  // Liveness: every connection carries a heartbeat this often (0: none; then a frozen peer is
  // found only by recv_timeout). A peer heard from nothing at all (no heartbeat, no byte) for
  // longer than its deadline (transport/liveness.hpp: from its measured heartbeat gaps and round
  // trips, never under min_silence) is closed as silent. recv_timeout is then how long to wait
  // for a live peer's message (a slow peer still computing), not how long a frozen peer holds
  // the others up.
  std::chrono::milliseconds heartbeat_interval{250};
  std::chrono::milliseconds min_silence{3000};
  std::uint64_t max_frame_bytes = std::uint64_t{64} << 20;
  // Strangers. A connection must say who it is (and, with a key, prove it) within
  // handshake_timeout, sending at most wire::max_handshake_bytes a frame meanwhile; at most
  // max_pending connections may be doing so at once (a new one past that closes the oldest, so
  // strangers who hold connections open cannot lock a real peer out for longer than it takes to
  // say hello). An idle stranger therefore costs a peer one descriptor for a few seconds.
  std::chrono::milliseconds handshake_timeout{5000};
  int max_pending = 32;
  // Joiners: peers that dialed this one to join the running group and are not members of its
  // view yet. At most max_joiners at once (a new one past that is asked to come back later), and
  // until a view admits it a joiner may send only membership frames of at most
  // max_joiner_frame_bytes, max_joiner_queued_bytes queued at once (more, and it is dropped): a
  // key holder posing as many joiners costs a peer a few descriptors and kilobytes.
  int max_joiners = 16;
  std::uint64_t max_joiner_frame_bytes = std::uint64_t{64} << 10;
  std::uint64_t max_joiner_queued_bytes = std::uint64_t{1} << 20;
  // What a member may have queued here that no receive took yet (mailbox.hpp's budget): past it,
  // this peer stops reading from it until a receive takes some (the sender waits, as TCP's flow
  // control makes it); a peer whose queue stays full of messages nobody takes while a receive
  // waits for another of its messages for `budget_grace` is over its budget: what it queued is
  // dropped and the receive fails naming it. At least max_frame_bytes.
  std::uint64_t max_queued_bytes = std::uint64_t{64} << 20;
  std::chrono::milliseconds budget_grace{5000};
  // The run's secret (transport/auth.hpp; read one with auth::read_key_file): only peers that
  // hold the same key can connect, and every frame is authenticated. Empty: anyone who can reach
  // the port can join the group and send it anything a peer may send. A shared key cannot tell
  // its holders apart: see `identity`.
  std::string key;
  // Per-peer identities (transport/identity.hpp): this peer's own private key and the run's
  // roster of every rank's public key. A peer then proves its rank with its own key, and no
  // other peer, key holder or not, can speak for it.
  identity::options identity;
  // TLS (transport/tls.hpp): peers admit only callers whose certificate the run's CA signed, and
  // every frame is encrypted. With a run key as well, a caller must hold both.
  tls::options tls;
  // What every peer of a run must agree on, as "name=value" items separated by ';' (the
  // application's: decentrain-gpt gives its steps, model shape and policy). A caller whose
  // settings differ is refused with a message naming each difference, so peers started with
  // different settings fail at once instead of training apart or timing out.
  std::string settings;
  // What this peer does, when it listens, for peers that cannot reach each other: it relays
  // their connections, within these limits (tcp::relay_stats() says what it did).
  relay_options relay;
  // Connections a pair of peers keeps (1 to 16): a message of at least stripe_min_bytes goes
  // over all of them at once, in pieces of stripe_piece_bytes, each connection taking the next
  // piece as its socket takes bytes (tcp/stripes.hpp). One TCP connection moves at most its
  // send buffer a round trip (Linux caps it at tcp_wmem's maximum, 4 MiB by default: 335 Mbit/s
  // over a 100 ms round trip); several fill a long fat link where that cap cannot be raised.
  // The dialer of a pair opens the further ones, directly only (not through a relay), and a
  // peer accepts as many as its own setting: set it alike on every peer. A receiver takes the
  // pieces of two messages from a peer at once at most (each up to max_frame_bytes, where one
  // connection has one frame's body on its way): a peer may hold that much for each until its
  // messages are whole or its connection closes. A further stream that is lost is dialed again.
  int streams = 1;
  std::uint64_t stripe_min_bytes = std::uint64_t{4} << 20;
  std::uint64_t stripe_piece_bytes = std::uint64_t{1} << 20;
  // Streams as many as the measured link needs, up to `streams`: a pair starts with one
  // connection, and where a message of at least stripe_min_bytes came over k of them at a rate
  // that kept each at least three quarters of stream_window_bytes in flight (its rate per connection times
  // the pair's least round trip, from the kernel: TCP_INFO), each held at its window rather than
  // by the link, it keeps 2k (the receiver measures; one that did not dial the pair asks its
  // dialer in a streams frame). A link that one connection fills keeps one.
  bool streams_from_link = false;
  // The most one connection keeps in flight (above); 0: from the kernel's buffer limits, the
  // lesser of two thirds of tcp_wmem's maximum and half of tcp_rmem's (Linux: the sender's
  // buffer holds what is not acknowledged yet and its bookkeeping, the receiver's window half
  // its buffer), 4 MiB's worth where they cannot be read.
  std::uint64_t stream_window_bytes = 0;
  // Ranks an elastic group may ever hold (0: world). Peers that join the group once it runs take
  // ranks of their own below it (a rank of the first `world` whose peer left may come back).
  int max_world = 0;

  int capacity() const { return std::max(world, max_world); }

  void validate() const {
    decentrain::detail::check(world >= 1 && max_world >= 0 && max_world <= (1 << 16), "tcp: world must be >= 1 and max_world in [0, 65536]");
    decentrain::detail::check(rank >= 0 && rank < capacity(), "tcp: rank ", rank, " is outside [0, ",
                              max_world > world ? "max_world" : "world", " = ", capacity(), ")");
    decentrain::detail::check(world == 1 || rank == 0 || !join.empty(), "tcp: peer ", rank,
                              " needs at least one peer to join through (tcp_options::join)");
    decentrain::detail::check(join.empty() || capacity() > 1, "tcp: peer ", rank, " is a world of one (world 1), so it joins no ",
                              "peers; set world (and rank) to join a group");
    decentrain::detail::check(max_frame_bytes >= 1024, "tcp: max_frame_bytes must be >= 1024");
    decentrain::detail::check(heartbeat_interval.count() >= 0, "tcp: heartbeat_interval must be >= 0 ms, got ",
                              heartbeat_interval.count());
    decentrain::detail::check(heartbeat_interval.count() == 0 || min_silence >= 2 * heartbeat_interval,
                              "tcp: min_silence (", min_silence.count(), " ms) must be at least two heartbeat intervals (",
                              2 * heartbeat_interval.count(), " ms)");
    if (listen.empty()) {  // accepts no connections: it dials every peer
      decentrain::detail::check(rank != 0 || capacity() == 1, "tcp: peer 0 accepts no connections (listen is empty), but the ",
                                "others join the group through it: peer 0 must listen");
      decentrain::detail::check(advertise.empty(), "tcp: peer ", rank, " accepts no connections (listen is empty), so it has no ",
                                "address to advertise (", advertise, ")");
    } else {
      const auto host = wire::split_address(listen).first;
      decentrain::detail::check(world == 1 || !advertise.empty() || (host != "0.0.0.0" && host != "::"),
                                "tcp: peer ", rank, " listens on the wildcard address ", listen,
                                "; set tcp_options::advertise to an address the other peers can reach");
    }
    for (const auto& j : join) (void)wire::split_address(j);
    decentrain::detail::check(handshake_timeout.count() > 0 && max_pending >= 1, "tcp: handshake_timeout (",
                              handshake_timeout.count(), " ms) and max_pending (", max_pending, ") must be positive");
    decentrain::detail::check(max_joiners >= 1 && max_joiner_frame_bytes >= 1024 && max_joiner_queued_bytes >= max_joiner_frame_bytes,
                              "tcp: max_joiners (", max_joiners, ") must be >= 1, max_joiner_frame_bytes (", max_joiner_frame_bytes,
                              ") >= 1024 and max_joiner_queued_bytes (", max_joiner_queued_bytes, ") at least max_joiner_frame_bytes");
    decentrain::detail::check(max_queued_bytes >= max_frame_bytes, "tcp: max_queued_bytes (", max_queued_bytes,
                              ") must be at least max_frame_bytes (", max_frame_bytes, "): a frame that can never be queued stalls");
    decentrain::detail::check(budget_grace.count() > 0, "tcp: budget_grace must be > 0 ms, got ", budget_grace.count());
    if (!key.empty()) auth::check_key(key, "tcp_options::key");
    identity.validate();
    tls.validate();
    relay.validate();
    decentrain::detail::check(punch_within.count() >= 0, "tcp: punch_within must be >= 0 ms, got ", punch_within.count());
    decentrain::detail::check(streams >= 1 && streams <= wire::max_streams, "tcp: streams must be in [1, ", wire::max_streams, "], got ",
                              streams);
    decentrain::detail::check(!streams_from_link || streams > 1, "tcp: streams_from_link chooses up to `streams` connections a pair, ",
                              "and streams is 1: set it to the most a pair may keep (up to ", wire::max_streams, ")");
    if (streams == 1) return;  // (nothing is striped: the stripe settings are not used)
    decentrain::detail::check(stripe_piece_bytes >= wire::min_piece_bytes && stripe_piece_bytes % wire::frame_alignment == 0 &&
                                  stripe_piece_bytes <= max_frame_bytes,
                              "tcp: stripe_piece_bytes must be a multiple of ", wire::frame_alignment, " from ", wire::min_piece_bytes,
                              " to max_frame_bytes (", max_frame_bytes, "), got ", stripe_piece_bytes);
    decentrain::detail::check(stripe_min_bytes >= stripe_piece_bytes, "tcp: stripe_min_bytes (", stripe_min_bytes,
                              ") must be at least stripe_piece_bytes (", stripe_piece_bytes, ")");
  }
};

}  // namespace decentrain::transport
