// How a TCP peer finds its group and builds the mesh: it asks the peers it knows (--join) for the
// directory of everyone they know until it knows all `world` peers and dials every lower rank
// (higher ranks dial it), so each pair shares one connection; a peer that accepts no connections
// (no listen address: behind a NAT) dials every peer that listens, lower and higher, is dialed by
// none, and reaches the lower ranks that accept none either directly where their NATs let a hole
// be punched (tcp/punch.hpp), else through a relay (tcp/relay.hpp); a
// peer that finds the group running dials every peer of it as a joiner instead. Each dial runs the dialer's side of the handshake
// (tcp/handshake.hpp) on a short-lived io_context with a deadline, then hands the connection to
// the node's I/O thread.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_ASIO

#include <asio.hpp>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/tcp/connection.hpp"
#include "decentrain/transport/tcp/handshake.hpp"
#include "decentrain/transport/tcp/node.hpp"
#include "decentrain/transport/tls.hpp"

namespace decentrain::transport::tcp_detail {

class rendezvous {
 public:
  explicit rendezvous(node& n) : n_(n) {}

  // Returns once every peer of the world is connected (or, in a running group, every peer
  // listed), or throws.
  void connect() {
    const auto& opts = n_.opts;
    const auto deadline = std::chrono::steady_clock::now() + opts.join_timeout;
    auto backoff = opts.first_backoff;
    std::string last_error = "no attempt finished";
    int attempts = 0;
    for (;;) {
      if (known() < opts.world)
        for (const auto& seed : opts.join) {
          ++attempts;
          try {
            poll_directory(seed);
          } catch (const std::exception& e) {
            last_error = e.what();
          }
        }
      {
        std::lock_guard lock(n_.mutex);
        if (!n_.dir.refusal.empty()) decentrain::detail::fail(n_.dir.refusal);  // retrying would not help
      }
      if (n_.late_group()) return connect_late(deadline);
      const bool dials_all = n_.advertised.empty();  // (nobody can dial this peer)
      for (int j = 0; j < (dials_all ? opts.world : opts.rank); ++j) {
        std::string address;
        {
          std::lock_guard lock(n_.mutex);
          if (j == opts.rank || n_.peers.count(j) || !n_.dir.addresses.count(j)) continue;
          address = n_.dir.addresses[j];
          // Two peers that accept no connections: the higher rank asks a relay for the circuit.
          if (address.empty() && (!dials_all || j > opts.rank)) continue;
        }
        ++attempts;
        try {
          if (address.empty()) {
            if (punch(j) == punch_outcome::no) dial_relayed(j);
          } else {
            dial(j, address);
          }
        } catch (const std::exception& e) {
          last_error = e.what();
        }
      }
      std::unique_lock lock(n_.mutex);
      if (!n_.dir.refusal.empty()) decentrain::detail::fail(n_.dir.refusal);
      if (of_group_forming(n_.peers) == opts.world - 1) {
        n_.dir.formed = true;
        return;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        std::string missing;
        for (int j = 0; j < opts.world; ++j)
          if (j != opts.rank && !n_.peers.count(j)) missing += (missing.empty() ? "" : ", ") + std::to_string(j);
        const auto rejected = n_.adm.last_rejected();
        decentrain::detail::fail("tcp: peer ", opts.rank, " could not connect to peer(s) ", missing, " within ",
                                 opts.join_timeout.count(), " ms (", attempts, " attempts with backoff; last error: ", last_error,
                                 rejected.empty() ? "" : "; last caller refused: ", rejected, ")");
      }
      n_.changed.wait_for(lock, std::min<std::chrono::steady_clock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, opts.max_backoff);
    }
  }

  // A joiner waiting for admission, or a member the group left out that rejoins: asks its seeds
  // and the peers it knows for their directories and connects to those it is not connected to
  // yet. From the first call on it dials as a joiner, also the peers it forgot.
  void rediscover() {
    std::vector<std::string> ask = n_.opts.join;
    {
      std::lock_guard lock(n_.mutex);
      n_.dir.late = true;  // a member left out rejoins as a joiner: the others take it in only as one
      for (const auto& [r, a] : n_.dir.addresses)
        if (r != n_.opts.rank && !a.empty()) ask.push_back(a);
    }
    // One answer lists the peers it is connected to: enough. Each call starts one further along,
    // so a peer that answers with the wrong side of a partition is not the only one ever asked.
    for (std::size_t i = 0; i < ask.size(); ++i) {
      try {
        poll_directory(ask[(i + n_.dir.turn) % ask.size()]);
        break;
      } catch (const std::exception&) {
      }
    }
    ++n_.dir.turn;
    {
      std::lock_guard lock(n_.mutex);
      if (!n_.dir.refusal.empty()) decentrain::detail::fail(n_.dir.refusal);  // its rank was taken meanwhile
    }
    std::map<int, int> failures;  // a peer gone meanwhile: the group's membership sorts it out
    (void)dial_unconnected(failures);
  }

  // The further streams the pair with `peer` lacks, dialed now (the node's stream dialer: a
  // stream lost, or more that the measured link needs); the numbers it dialed.
  std::vector<int> open_missing_streams(int peer) {
    std::string address;
    {
      std::lock_guard lock(n_.mutex);
      if (const auto it = n_.dir.addresses.find(peer); it != n_.dir.addresses.end()) address = it->second;
    }
    if (address.empty()) return {};
    auto numbers = n_.missing_streams(peer);
    open_streams(peer, address, numbers);
    return numbers;
  }

 private:
  // The entries of a map by rank that are peers of the group forming (mutex held): a joiner
  // that came meanwhile, of rank world or above, is not one of them.
  template <class ByRank>
  int of_group_forming(const ByRank& m) const {
    return static_cast<int>(std::count_if(m.begin(), m.end(), [&](const auto& e) { return e.first < n_.opts.world; }));
  }
  // The peers of the group forming whose addresses this one knows.
  int known() const {
    std::lock_guard lock(n_.mutex);
    return of_group_forming(n_.dir.addresses);
  }
  // Whether this peer, finding the group running, still has to dial peer `r` (mutex held):
  // joiners of higher rank dial this one (two peers never dial each other at once), and a peer
  // that failed twice is most likely gone (`failures` counts per rank).
  bool to_dial(int r, std::map<int, int>& failures) const {
    return r != n_.opts.rank && !n_.peers.count(r) && failures[r] < 2 && !n_.box.barred(r) &&
           !(n_.dir.joining.count(r) && r > n_.opts.rank);
  }

  // Dials the directory's peers this one is not connected to: those that listen directly, then
  // those that accept no connections through a relay (one of the peers just reached: a member
  // that accepts none dialed only the peers of the group it formed, so it never dials this one);
  // returns the last error.
  std::string dial_unconnected(std::map<int, int>& failures) {
    std::vector<std::pair<int, std::string>> todo;
    {
      std::lock_guard lock(n_.mutex);
      for (const auto& [r, a] : n_.dir.addresses)
        if (!a.empty() && to_dial(r, failures)) todo.emplace_back(r, a);
    }
    std::string last_error;
    const auto attempt = [&](int r, auto&& how) {
      try {
        how();
      } catch (const refused_for_now& e) {  // alive: not counted as gone
        last_error = e.what();
      } catch (const std::exception& e) {
        ++failures[r];
        last_error = e.what();
      }
    };
    for (const auto& [r, a] : todo) attempt(r, [&, r = r, a = a] { dial(r, a); });
    std::vector<int> relayed;
    {
      std::lock_guard lock(n_.mutex);
      for (const auto& [r, a] : n_.dir.addresses)
        if (a.empty() && to_dial(r, failures)) relayed.push_back(r);
    }
    for (const int r : relayed) attempt(r, [&, r = r] { dial_relayed(r); });
    return last_error;
  }

  // The group is running: dial every peer a seed listed (all of them, whatever their rank),
  // saying this peer joins late; a member that accepts no connections through a relay. A
  // listed peer that cannot be reached twice has most likely died since; the group's membership
  // sorts that out when it admits this one. One that refuses for now is tried again until the
  // deadline: a peer killed and started again at once finds members that saw its previous
  // process die and have not left it out of their view yet.
  void connect_late(std::chrono::steady_clock::time_point deadline) {
    const auto& opts = n_.opts;
    std::map<int, int> failures;
    std::string last_error = "none";
    auto backoff = opts.first_backoff;
    for (;;) {
      if (auto e = dial_unconnected(failures); !e.empty()) last_error = std::move(e);
      std::unique_lock lock(n_.mutex);
      if (!n_.dir.refusal.empty()) decentrain::detail::fail(n_.dir.refusal);
      bool settled = true;
      for (const auto& [r, a] : n_.dir.addresses)
        if (to_dial(r, failures)) settled = false;
      if (settled && !n_.peers.empty()) {
        n_.dir.formed = true;
        return;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline && !n_.peers.empty()) {  // some still refuse: the admission sorts that out
        n_.dir.formed = true;
        return;
      }
      if (now >= deadline || (settled && n_.peers.empty()))
        decentrain::detail::fail("tcp: peer ", opts.rank, " could not reach the running group",
                                 now >= deadline ? decentrain::detail::concat(" within ", opts.join_timeout.count(), " ms")
                                                 : std::string(": every peer listed failed twice"),
                                 " (last error: ", last_error, ")");
      n_.changed.wait_for(lock, std::min<std::chrono::steady_clock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, opts.max_backoff);
    }
  }

  wire::hello my_hello(wire::hello_purpose purpose, std::uint8_t stream = 0) const {
    wire::hello h;
    h.stream = stream;
    h.rank = n_.opts.rank;
    h.world = n_.opts.world;
    h.purpose = purpose;
    h.address = n_.advertised;
    h.late = n_.late_group();
    h.settings = n_.opts.settings;
    return h;
  }

  // A short-lived connection on a private io_context: connect with a timeout, do `work`. From
  // the port this peer punches from (tcp/punch.hpp) where `from_punch_port` and the address is
  // IPv4: the peer dialed sees the address that a relay tells the peers to punch to.
  template <class Work>
  void with_connection(const std::string& address, Work&& work_fn, bool from_punch_port = false) {
    const auto [host, port] = wire::split_address(address);
    asio::io_context local;
    asio::ip::tcp::socket socket(local);
    asio::error_code result = asio::error::would_block;
    asio::ip::tcp::resolver resolver(local);
    const auto endpoints = resolver.resolve(host, std::to_string(port));
    const auto v4 = std::find_if(endpoints.begin(), endpoints.end(), [](const auto& e) { return e.endpoint().address().is_v4(); });
    auto from_any_port = [&] {
      asio::async_connect(socket, endpoints, [&](const asio::error_code& ec, const asio::ip::tcp::endpoint&) { result = ec; });
      local.run_for(n_.opts.connect_timeout);
    };
    if (from_punch_port && n_.punch_port && v4 != endpoints.end() && n_.punch_port->bind(socket)) {
      socket.async_connect(v4->endpoint(), [&](const asio::error_code& ec) { result = ec; });
      local.run_for(n_.opts.connect_timeout);
      // Refused from that port (its last connection to this address may linger in TIME_WAIT):
      // from any port then; only punching to this peer is lost.
      if (result && result != asio::error::would_block) {
        asio::error_code ignored;
        socket.close(ignored);
        result = asio::error::would_block;
        local.restart();
        from_any_port();
      }
    } else {
      from_any_port();
    }
    if (result == asio::error::would_block) decentrain::detail::fail("tcp: connecting to ", address, " timed out");
    if (result) decentrain::detail::fail("tcp: cannot connect to ", address, ": ", result.message());
    socket.set_option(asio::ip::tcp::no_delay(true));
    work_fn(socket);
  }

  // One frame read whole (header, body, padding) on a private io_context within
  // connect_timeout; `raw` keeps the header's bytes (its tag covers them).
  struct frame_in {
    wire::header head;
    std::array<std::byte, wire::header_bytes> raw{};
    bytes body;
  };
  frame_in read_frame(asio::ip::tcp::socket& s, const std::string& address) const {
    frame_in f;
    std::array<std::byte, wire::frame_alignment> pad{};
    std::string failure = "no answer within the connect timeout";
    bool finished = false;
    auto& io_ctx = static_cast<asio::io_context&>(s.get_executor().context());
    asio::async_read(s, asio::buffer(f.raw), [&](const asio::error_code& ec, std::size_t) {
      if (ec) {
        failure = ec == asio::error::eof ? "it closed the connection" : ec.message();
        return;
      }
      try {
        f.head = wire::decode_header(f.raw.data(), wire::max_control_bytes);
        f.body.resize(static_cast<std::size_t>(f.head.length));
      } catch (const std::exception& e) {
        failure = e.what();
        return;
      }
      // The padding too, so the socket is left at the next frame.
      std::array<asio::mutable_buffer, 2> in{asio::buffer(f.body), asio::buffer(pad.data(), wire::padding(f.body.size()).size())};
      asio::async_read(s, in, [&](const asio::error_code& ec2, std::size_t) {
        if (ec2) failure = ec2.message();
        else finished = true;
      });
    });
    io_ctx.restart();
    io_ctx.run_for(n_.opts.connect_timeout);
    decentrain::detail::check(finished, "tcp: peer ", n_.opts.rank, " got no answer from the peer at ", address, ": ", failure);
    return f;
  }

  // A handshake frame, sealed (and with TLS encrypted) when the connection has keys already.
  void write_frame(asio::ip::tcp::socket& s, std::optional<auth::session>& keys, wire::frame_type type, bytes body) {
    n_.framing_sent += wire::header_bytes + body.size() + wire::padding(body.size()).size();
    auto head = wire::encode_header({type, 0, body.size(), {}});
    if (keys) {
      const auto mac = keys->send.seal(std::span<const std::byte>(head).first(wire::header_used_bytes), body,
                                       keys->send.encrypts() ? std::span<std::byte>(body) : std::span<std::byte>());
      std::memcpy(head.data() + wire::tag_offset, mac.data(), mac.size());
    }
    asio::write(s, frame_buffers(head, body));
  }

  // The dialer's side of the handshake on a fresh connection: with TLS its handshake first;
  // then the machine of tcp/handshake.hpp. Returns the peer's answer (a welcome, a directory: a
  // refusal is thrown, naming the reason), the connection's frame keys and the rank the peer
  // proved it is (with a run key, or a certificate that names one; -1 without). `expected`: the
  // rank dialed (-1: a seed, any rank). `stream`: a pair's further stream (0: any other
  // connection), whose refusals are never final and are not counted towards the three that are.
  struct answered {
    frame_in answer;
    std::optional<auth::session> keys;
    int rank = -1;
  };
  answered dial_handshake(asio::ip::tcp::socket& s, wire::hello_purpose purpose, const std::string& address,
                          [[maybe_unused]] int expected = -1, std::uint8_t stream = 0) {
    answered out;
#if DECENTRAIN_HAS_TLS
    if (n_.tls_context) {
      tls::established e;
      try {
        e = tls::dial(*n_.tls_context, s, n_.opts.connect_timeout, address);
      } catch (const tls::refused& ex) {  // (a handshake that timed out is retried like any connection)
        give_up(stream == 0 && ++unproven_refusals_ >= 3, ex.what());
      }
      if (expected >= 0 && (n_.opts.tls.bind_ranks || e.certified_rank >= 0))
        decentrain::detail::check(e.certified_rank == expected, "tls: the peer at ", address, " has a certificate for \"",
                                  e.common_name, "\", not for rank ", expected, " (a stale directory, or another peer's address)");
      out.keys.emplace(e.dialer_to_acceptor, e.acceptor_to_dialer, true);
      out.rank = e.certified_rank;
    }
#endif
    handshake machine;
    const auto& creds = n_.creds;
    const bool proving = creds.keyed() || creds.identities();
    write_frame(s, out.keys, wire::frame_type::hello, machine.start(my_hello(purpose, stream), creds));
    bool proven = false;  // the acceptor proved its credentials: its answers are sealed, and believed
    auto refused = [&](const frame_in& f) {
      wire::farewell why{false, "no reason given"};
      if (!f.body.empty()) {
        try {
          why = wire::decode_body<wire::farewell>(f.body, "goodbye");
        } catch (const std::exception&) {
        }
      }
      // Nothing before the proofs is authenticated: a refusal that would end the join is
      // believed only when it comes three times (one forged goodbye must not end it), or once it
      // came sealed by a peer that proved its credentials.
      if (!why.final)  // the peer lives and asks for another try (connect_late keeps trying it)
        throw refused_for_now(decentrain::detail::concat("tcp: the peer at ", address, " refused peer ", n_.opts.rank, ": ", why.reason));
      give_up(stream == 0 && (proven || ++unproven_refusals_ >= 3), "tcp: the peer at ", address, " refused peer ", n_.opts.rank,
              ": ", why.reason);
    };
    // With TLS every frame from the peer is encrypted, its refusals too.
    auto open = [&](frame_in& f) {
      const auto head = std::span<const std::byte>(f.raw).first(wire::header_used_bytes);
      if (out.keys && !out.keys->receive.open_in_place(head, f.body, f.head.mac))
        decentrain::detail::fail("tcp: the answer of the peer at ", address, " failed its authentication tag");
    };
    if (proving) {
      auto c = read_frame(s, address);
      open(c);
      if (c.head.type == wire::frame_type::bye) refused(c);
      decentrain::detail::check(c.head.type == wire::frame_type::challenge, "tcp: the peer at ", address,
                                " answered the hello with frame type ", static_cast<int>(c.head.type), ", not a challenge");
      bool unproven = false;
      std::optional<handshake::challenged> got;
      try {
        got.emplace(machine.on_challenge(creds, c.body, address, unproven));
      } catch (const std::exception& e) {
        if (unproven) give_up(stream == 0 && ++unproven_refusals_ >= 3, e.what());
        throw;
      }
      decentrain::detail::check(out.rank < 0 || out.rank == got->rank, "tcp: the peer at ", address, " proved it is peer ", got->rank,
                                " with its credentials and rank ", out.rank, " with its certificate");
      out.rank = got->rank;
      write_frame(s, out.keys, wire::frame_type::proof, std::move(got->proof));
      if (!out.keys) out.keys.emplace(std::move(got->keys));  // (with TLS, its keys stay)
      proven = true;
    }
    out.answer = read_frame(s, address);
    open(out.answer);
    if (out.answer.head.type == wire::frame_type::bye) refused(out.answer);
    return out;
  }

  // A goodbye that is not final: the peer lives and asks for another try later.
  struct refused_for_now : decentrain::error {
    using decentrain::error::error;
  };

  // Throws; when `final`, connect() stops at once with this error (retrying cannot help).
  template <class... Parts>
  [[noreturn]] void give_up(bool final, Parts&&... parts) {
    const auto why = decentrain::detail::concat(std::forward<Parts>(parts)...);
    if (final) {
      std::lock_guard lock(n_.mutex);
      if (n_.dir.refusal.empty()) n_.dir.refusal = why;
    }
    decentrain::detail::fail(why);
  }

  // Asks `seed` for its directory. The exchange runs on a private io_context with a deadline,
  // so a seed that accepts but never answers cannot stall the join.
  void poll_directory(const std::string& seed) {
    with_connection(seed, [&](asio::ip::tcp::socket& s) {
      const auto answer = dial_handshake(s, wire::hello_purpose::directory, seed).answer;
      decentrain::detail::check(answer.head.type == wire::frame_type::directory, "tcp: directory request to ", seed,
                                " answered with frame type ", static_cast<int>(answer.head.type));
      const auto d = wire::decode_body<wire::directory>(answer.body, "directory");
      std::lock_guard lock(n_.mutex);
      // A running group, and this peer is not of its mesh (or was, and rejoins: then another
      // address under its rank is another process that took the rank meanwhile).
      n_.dir.learn(d, n_.opts.rank, n_.opts.capacity(), n_.advertised, !n_.dir.formed && n_.peers.empty());
    });
  }

  void dial(int peer, const std::string& address) {
    with_connection(address, [&](asio::ip::tcp::socket& s) { finish_dial(s, peer, address, nullptr); }, true);
    open_streams(peer, address, n_.missing_streams(peer));
    if (!n_.missing_streams(peer).empty()) n_.want_streams(peer);  // (dialed again, after a backoff)
  }

  // The pair's further streams (tcp_options::streams, tcp/stripes.hpp), dialed at once, up to
  // max_stream_dials at a time, once its first connection stands: each takes a connect and a
  // handshake (two or three round trips, more with TLS), which one after another held a long
  // link's first striped messages back by that many times (bench/RESULTS.md, bench/streams). At
  // most a few at once: the acceptor holds max_pending connections before their handshakes
  // end, and past that closes the oldest, which could be another peer's. One that fails leaves
  // the pair with those it has: striped messages go over fewer streams, and nothing else
  // changes. (The acceptor takes the streams in any order, one of each number.)
  static constexpr int max_stream_dials = 4;
  void open_streams(int peer, const std::string& address, const std::vector<int>& numbers) {
    std::atomic<std::size_t> next = 0;
    auto dial_some = [&] {
      for (auto i = next++; i < numbers.size() && !n_.dial_stopping; i = next++) open_stream(peer, address, numbers[i]);
    };
    {
      std::vector<std::jthread> dialers;  // (joined as they go out of scope, a throw included)
      try {
        for (std::size_t k = 1; k < std::min<std::size_t>(numbers.size(), max_stream_dials); ++k) dialers.emplace_back(dial_some);
      } catch (const std::system_error&) {  // (no thread to be had: this one dials them all)
      }
      dial_some();
    }
  }

  // Never throws: a stream is an addition to its pair (and its refusals never end the join:
  // dial_handshake counts only a pair's first connection's).
  void open_stream(int peer, const std::string& address, int i) {
    try {
      const auto first = n_.direct_connection(peer);
      if (!first) return;
      with_connection(address, [&](asio::ip::tcp::socket& s) {
        auto [answer, keys, proven_rank] = dial_handshake(s, wire::hello_purpose::data, address, peer, static_cast<std::uint8_t>(i));
        decentrain::detail::check(answer.head.type == wire::frame_type::welcome, "tcp: the peer at ", address,
                                  " answered a stream's hello with frame type ", static_cast<int>(answer.head.type));
        decentrain::detail::check((!n_.creds.keyed() && !n_.creds.identities()) || proven_rank == peer, "tcp: the peer at ",
                                  address, " proved it is peer ", proven_rank, ", not peer ", peer);
        auto c = std::make_shared<connection>(n_.io);
        const auto protocol = s.local_endpoint().protocol();
        c->socket.assign(protocol, s.release());
        c->rank = peer;
        c->stream = i;
        c->handshake_state.opened();
        c->keys = std::move(keys);
        n_.add_stream(c, first);
      });
    } catch (const std::exception&) {
    }
  }

  // Peer `far` accepts no connections either, and has the lower rank: a relay tells both the
  // other's address as it sees it (tcp/punch.hpp), and this peer connects to it while `far`
  // connects here. Until a relay answered once. One that is not connected to `far` yet (`far`
  // may still be dialing it), or does not relay, says nothing: the next round asks the next
  // one (`not_now`; the first asked again where it is the only one), and only after one
  // silence more than there are relays does the caller ask for a circuit (`no`), as it does
  // when the connection does not stand.
  enum class punch_outcome { stands, not_now, no };
  punch_outcome punch(int far) {
    if (!n_.punch_port || punch_answered_.count(far)) return punch_outcome::no;
    const auto relays = n_.relays_for(far);
    if (relays.empty()) return punch_outcome::no;
    {
      std::lock_guard lock(n_.mutex);
      n_.punch_answers.erase(far);
    }
    const auto asked = ++punch_turn_[far];
    if (!write_relay(*relays[(asked - 1) % relays.size()], {wire::relay_kind::punch, n_.opts.rank, far}, {},
                     n_.opts.connect_timeout, n_.framing_sent, [] { return false; }))
      return punch_outcome::no;
    asio::ip::tcp::endpoint at;
    {
      std::unique_lock lock(n_.mutex);
      if (!n_.changed.wait_for(lock, n_.opts.punch_within, [&] { return n_.punch_answers.count(far) > 0; }))
        return asked <= relays.size() ? punch_outcome::not_now : punch_outcome::no;
      at = n_.punch_answers[far];
    }
    punch_answered_.insert(far);
    const int fd = n_.punch_port->connect(at, clock::now() + n_.opts.punch_within, false, [] { return false; });
    if (fd < 0) return punch_outcome::no;
    asio::io_context local;
    asio::ip::tcp::socket s(local);
    try {
      s.assign(asio::ip::tcp::v4(), fd);
    } catch (const std::exception&) {
      ::close(fd);
      return punch_outcome::no;
    }
    try {
      finish_dial(s, far, decentrain::detail::concat("peer ", far, " at ", at.address().to_string(), ":", at.port(), " (a hole punched)"),
                  nullptr, true);
    } catch (const std::exception&) {
      return punch_outcome::no;  // (the socket closes with `s`)
    }
    return punch_outcome::stands;
  }

  // Reaches peer `far`, which accepts no connections either, through a relay: one of the peers
  // that listen and are connected to this one, the next one from call to call (one that refused,
  // or is not connected to `far` yet, is passed over the next time). The handshake runs end to
  // end over the tunnel, as it would over a socket.
  void dial_relayed(int far) {
    const auto relays = n_.relays_for(far);
    if (relays.empty()) {
      // Connected to a peer, not yet to one that relays: not a sign that `far` is gone (a joiner
      // tries again); connected to none, it is one failure more.
      const auto why = decentrain::detail::concat("tcp: peer ", n_.opts.rank, " reaches peer ", far,
                                                  " only through a relay, and is connected to no peer that relays yet");
      std::lock_guard lock(n_.mutex);
      if (n_.peers.empty()) decentrain::detail::fail(why);
      throw refused_for_now(why);
    }
    const auto via = relays[relay_turn_[far]++ % relays.size()];
    auto t = n_.open_tunnel(far, via);
    asio::io_context local;
    asio::ip::tcp::socket s(local);
    s.assign(asio::ip::tcp::v4(), t->take_near());
    try {
      finish_dial(s, far, decentrain::detail::concat("peer ", far, " through the relay peer ", via->rank), t);
    } catch (const refused_for_now&) {  // (alive, asking for another try later)
      asio::error_code ignored;
      s.close(ignored);
      throw;
    } catch (const std::exception& e) {
      asio::error_code ignored;
      s.close(ignored);  // (the tunnel closes the circuit)
      const auto why = t->why_ended();
      decentrain::detail::fail(e.what(), why.empty() ? "" : " (" + why + ")");
    }
  }

  // The dialer's handshake on `s` (to `address`, or through `through`) and the connection
  // registered with the node.
  void finish_dial(asio::ip::tcp::socket& s, int peer, const std::string& address, std::shared_ptr<tunnel> through,
                   bool punched = false) {
    {
      auto [answer, keys, proven_rank] = dial_handshake(s, wire::hello_purpose::data, address, peer);
      decentrain::detail::check(answer.head.type == wire::frame_type::welcome, "tcp: the peer at ", address, " answered peer ",
                                n_.opts.rank, "'s hello with frame type ", static_cast<int>(answer.head.type));
      // With credentials, the rank is proven: a connection that reached another peer (relayed, or
      // an address that now belongs to another rank) is not taken for `peer`.
      decentrain::detail::check((!n_.creds.keyed() && !n_.creds.identities()) || proven_rank == peer, "tcp: the peer at ", address,
                                " proved it is peer ", proven_rank, ", not peer ", peer,
                                " (a stale directory, or the connection was redirected)");
      auto c = std::make_shared<connection>(n_.io);
      const auto protocol = through ? asio::ip::tcp::v4() : s.local_endpoint().protocol();
      c->socket.assign(protocol, s.release());
      c->through = std::move(through);
      c->punched = punched;
      c->rank = peer;
      c->dialed = true;
      c->handshake_state.opened();
      c->keys = std::move(keys);
      n_.add_dialed(c);
    }
  }

  node& n_;
  std::atomic<int> unproven_refusals_ = 0;  // refusals heard before any proof (see dial_handshake; streams dial at once)
  std::map<int, std::size_t> relay_turn_;  // which relay dial_relayed asks next, per far peer
  std::set<int> punch_answered_;           // the peers punch() had an address for (tried once each)
  std::map<int, std::size_t> punch_turn_;  // how many times punch() asked a relay, per far peer (the next asked in turn)
};

}  // namespace decentrain::transport::tcp_detail

#endif  // DECENTRAIN_HAS_ASIO
