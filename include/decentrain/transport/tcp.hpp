// Real peers over TCP with standalone asio. A peer listens on an address, asks the peers it
// knows (--join) for the directory of everyone they know until it knows all `world` peers, and
// dials every lower rank (higher ranks dial it), so each pair shares one connection. One I/O
// thread reads every connection into a mailbox, or straight into memory a receiver posted
// (exchange, which the collectives use); the sending thread writes its frames itself and
// returns once they are written, which bounds memory without deadlock (every peer's I/O thread
// always reads). A frame that fails validation (magic, version, type, length, cereal) is
// counted, its connection closed, and the peer carries on.
#pragma once

#include "decentrain/config.hpp"

// nvcc (13.0) cannot compile asio 1.22's executor traits, so CUDA translation units see no TCP
// transport; the TCP peer lives in host code (a .cpp) and hands device buffers over as bytes.
#ifndef DECENTRAIN_HAS_ASIO
#if __has_include(<asio.hpp>) && !defined(__CUDACC__)
#define DECENTRAIN_HAS_ASIO 1
#else
#define DECENTRAIN_HAS_ASIO 0
#endif
#endif

#if DECENTRAIN_HAS_ASIO

#include <asio.hpp>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/auth.hpp"
#include "decentrain/transport/tls.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/peer_error.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/liveness.hpp"
#include "decentrain/transport/mailbox.hpp"

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

struct tcp_options {
  std::string listen = "127.0.0.1:0";  // port 0: any free port (see tcp::address())
  // The host other peers dial to reach this one; empty: the listen host. Needed when listening
  // on a wildcard address (0.0.0.0 or ::), which names no machine in particular.
  std::string advertise;
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
  int max_pending = 64;
  // The run's secret (transport/auth.hpp; read one with auth::read_key_file): only peers that
  // hold the same key can connect, and every frame is authenticated. Empty: anyone who can reach
  // the port can join the group and send it anything a peer may send.
  std::string key;
  // TLS (transport/tls.hpp): peers admit only callers whose certificate the run's CA signed, and
  // every frame is encrypted. With a run key as well, a caller must hold both.
  tls::options tls;
  // What every peer of a run must agree on, as "name=value" items separated by ';' (the
  // application's: decentrain-gpt gives its steps, model shape and policy). A caller whose
  // settings differ is refused with a message naming each difference, so peers started with
  // different settings fail at once instead of training apart or timing out.
  std::string settings;
  // Ranks an elastic group may ever hold (0: world). Peers that join the group once it runs take
  // ranks of their own below it (a rank of the first `world` whose peer left may come back).
  int max_world = 0;

  int capacity() const { return std::max(world, max_world); }

  void validate() const {
    decentrain::detail::check(world >= 1 && max_world >= 0 && max_world <= (1 << 16), "tcp: world must be >= 1 and max_world in [0, 65536]");
    decentrain::detail::check(rank >= 0 && rank < capacity(), "tcp: rank ", rank, " is outside [0, ",
                              max_world > world ? "max_world" : "world", " = ", capacity(), ")");
    decentrain::detail::check(world == 1 || rank == 0 || !join.empty(), "tcp: peer ", rank,
                              " needs at least one peer to join through (--join HOST:PORT)");
    decentrain::detail::check(max_frame_bytes >= 1024, "tcp: max_frame_bytes must be >= 1024");
    decentrain::detail::check(heartbeat_interval.count() >= 0, "tcp: heartbeat_interval must be >= 0 ms, got ",
                              heartbeat_interval.count());
    decentrain::detail::check(heartbeat_interval.count() == 0 || min_silence >= 2 * heartbeat_interval,
                              "tcp: min_silence (", min_silence.count(), " ms) must be at least two heartbeat intervals (",
                              2 * heartbeat_interval.count(), " ms)");
    const auto host = wire::split_address(listen).first;
    decentrain::detail::check(world == 1 || !advertise.empty() || (host != "0.0.0.0" && host != "::"),
                              "tcp: peer ", rank, " listens on the wildcard address ", listen,
                              "; set advertise (--advertise HOST) to an address the other peers can reach");
    for (const auto& j : join) (void)wire::split_address(j);
    decentrain::detail::check(handshake_timeout.count() > 0 && max_pending >= 1, "tcp: handshake_timeout (",
                              handshake_timeout.count(), " ms) and max_pending (", max_pending, ") must be positive");
    if (!key.empty()) auth::check_key(key, "tcp_options::key");
    tls.validate();
  }
};

class tcp {
  struct impl;

 public:
  // Binds the listening socket (so address() is known); connect() then builds the mesh.
  explicit tcp(tcp_options options) : self_(std::make_shared<impl>(std::move(options))) {}

  // Binds and connects: returns once every peer of the world is connected, or throws.
  static tcp join(tcp_options options) {
    tcp t(std::move(options));
    t.connect();
    return t;
  }

  std::string address() const { return self_->advertised; }
  void connect() { self_->connect(); }

  int rank() const { return self_->opts.rank; }
  // The peers the group started with; a peer that joined later counts up to its own rank.
  int world() const { return std::max(self_->opts.world, self_->opts.rank + 1); }
  void send(int peer, tag_type tag, std::span<const std::byte> data) { self_->send(peer, tag, data); }
  bytes recv(int peer, tag_type tag) { return self_->recv(peer, tag, !lane_); }
  // Sends `outs` (when `to` >= 0) and receives the messages from `from` straight into `ins`; see
  // transport::exchange.
  void exchange(int to, std::span<const std::span<const std::byte>> outs, int from, std::span<const std::span<std::byte>> ins,
                tag_type tag, const landed_fn& landed) {
    self_->exchange(to, outs, from, ins, tag, landed, !lane_);
  }
  void computed(double) {}

  // ---- membership (transport/membership.hpp) ----
  bytes recv_within(int peer, tag_type tag, std::chrono::milliseconds timeout) {
    return self_->recv(peer, tag, !lane_, timeout);
  }
  void discard_before(int peer, tag_type tag) { self_->box.discard_before(peer, tag); }
  void set_epoch(std::uint64_t epoch) { self_->box.set_epoch(epoch); }
  std::optional<alarm> alarmed() const { return self_->box.alarmed(); }
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
  void leave(const std::string& reason) { self_->leave(reason); }

 private:
  // forget and bar: closes the connection with a goodbye saying `why`, drops what `peer` sent,
  // and (barred) refuses it from now on.
  void drop(int peer, bool barred, const std::string& why) {
    decentrain::detail::check(peer >= 0 && peer < self_->opts.capacity() && peer != rank(), "tcp: peer ", rank(),
                              " cannot ", barred ? "bar" : "forget", " peer ", peer);
    if (barred) {
      // A forgotten peer's address stays in the directory (whose answers list connected peers
      // only, so no joiner is sent to it): should this peer be left out in turn and rejoin, it
      // dials the group it knew (rediscover). A barred one is never dialed again.
      std::lock_guard lock(self_->mutex);
      self_->directory.erase(peer);
    }
    if (barred) self_->box.bar(peer, why);
    else self_->box.forget(peer, why);
    self_->give_up_on(peer, barred ? "excluded from the run" : "left out of the view", wire::farewell{true, why});
  }

 public:

  // ---- joining a running group (fault::elastic) ----
  // Whether connect() found the group running: this peer then waits to be admitted to a view.
  bool joined_late() const {
    std::lock_guard lock(self_->mutex);
    return self_->late;
  }
  // Ranks of this group are below this: world() and the ranks joiners may take (max_world).
  int capacity() const { return self_->opts.capacity(); }
  // A joiner waiting for admission: asks its seeds and the peers it knows for their directories
  // and connects to those it is not connected to yet (joiners that came after it; best effort).
  // A member the group left out that forgot the group (fault::elastic's left_out = rejoin) calls
  // it too: from then on it dials as a joiner, also the peers it forgot, whose addresses it kept.
  void rediscover() { self_->rediscover(); }
  // Every peer connected now, ascending.
  std::vector<int> connected() const {
    std::lock_guard lock(self_->mutex);
    std::vector<int> out;
    for (const auto& [r, c] : self_->peers) out.push_back(r);
    return out;
  }

  // Sends, receives and counters are safe from two threads with different tags: a lane is this
  // same connection set (see transport::open_lane); its waits happen beside the caller's work and
  // are not counted in wait_seconds.
  std::optional<tcp> lane() {
    tcp l = *this;
    l.lane_ = true;
    return l;
  }
  traffic_stats stats() const { return self_->stats(); }

  // What the heartbeats measured of a connected peer (nothing when `peer` is not connected).
  struct peer_liveness {
    double round_trip_seconds = -1;     // smoothed; -1 until a heartbeat was echoed
    double heartbeat_gap_seconds = -1;  // smoothed time between its heartbeats
    std::chrono::milliseconds deadline{0};  // how long it may be silent before it is closed
    std::uint64_t heartbeats = 0;
  };
  std::optional<peer_liveness> liveness_of(int peer) const { return self_->liveness_of(peer); }

  // The reason the last malformed frame was dropped (empty if none was).
  std::string last_malformed() const {
    std::lock_guard lock(self_->mutex);
    return self_->last_malformed;
  }

  // What became of connections that had not (yet) shown they belong to the run, and how many
  // peers came back.
  struct admission_stats {
    std::uint64_t timed_out = 0;        // said no hello (or proved no key) within handshake_timeout
    std::uint64_t evicted = 0;          // closed to make room: over max_pending, or out of descriptors
    std::uint64_t refused = 0;          // no run key, a different one, or a proof that did not verify
    std::uint64_t bad_tags = 0;         // frames whose authentication tag failed (modified, replayed, forged)
    std::uint64_t accept_failures = 0;  // accept() errors (out of descriptors...), each followed by a pause
    std::uint64_t reconnected = 0;      // connections admitted for a rank that had one here before, which
                                        // closed: a peer restarted or rejoining, or a new process taking
                                        // a rank the group forgot (not a duplicate dial, which is dropped)
    int pending = 0;                    // connections now between accept and hello
    std::string last_rejected;          // why the last refused connection or bad frame was dropped
  };
  admission_stats admission() const {
    std::lock_guard lock(self_->mutex);
    auto a = self_->admitted;
    a.pending = self_->pending_now;
    return a;
  }

 private:
  using clock = std::chrono::steady_clock;
  static std::uint64_t nanoseconds(clock::time_point t) {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
  }

  struct connection : std::enable_shared_from_this<connection> {
    explicit connection(asio::io_context& io) : socket(io), heard(clock::now()), accepted_at(heard) {}
    asio::ip::tcp::socket socket;
    int rank = -1;  // -1 until its hello arrives (and, with a run key, its proof)
    // The previous body's padding, then the next header: one read (I/O thread only).
    std::array<std::byte, wire::frame_alignment + wire::header_bytes> head{};
    std::size_t padding = 0;  // bytes of padding still to read before the next header
    int low_water = 1;        // the socket's SO_RCVLOWAT as last set (I/O thread only)
    bytes body;
    bool closed = false;  // I/O thread only
    // Data frames are written by the sending thread; closing takes this lock, so the descriptor
    // is never closed (and its number reused) under a writer.
    std::mutex write_mutex;
    std::atomic<bool> closed_for_writes{false};
    // Guarded by write_mutex: what of a heartbeat or goodbye the socket did not take at once
    // (they are written without blocking); the next write sends it first, so frames never mix.
    bytes unsent;
    // Liveness (I/O thread): when anything last came from the peer, the bytes that sat in the
    // socket at the last check (bytes waiting under SO_RCVLOWAT count as heard), the last
    // heartbeat to echo back and when it came, and the estimates (also under impl::mutex).
    clock::time_point heard;
    int queued = 0;
    wire::heartbeat last_in;
    clock::time_point last_in_at;
    liveness beats;
    // An accepted connection: which handshake frame comes next (I/O thread only). A dialed one is
    // open from the start (its handshake ran in dial()).
    enum class stage : std::uint8_t { hello, proof, open, answered } next = stage::hello;
    clock::time_point accepted_at;
    wire::hello asked;  // the hello awaiting its proof, and the handshake's transcript
    bytes transcript;
    // With a run key: both directions' frame keys. `send` under write_mutex, `receive` on the I/O
    // thread; set before the connection carries any tagged frame.
    std::optional<auth::session> keys;
#if DECENTRAIN_HAS_TLS
    std::unique_ptr<tls::stream> tls;  // during the TLS handshake only
#endif
    int certified_rank = -1;  // the rank the caller's certificate names (TLS), -1: none
  };

  struct impl {
    explicit impl(tcp_options o) : opts((o.validate(), std::move(o))), acceptor(io), started(std::chrono::steady_clock::now()) {
#if DECENTRAIN_HAS_TLS
      if (opts.tls.enabled()) tls_context = tls::make_context(opts.tls, opts.rank);
#endif
      const auto [host, port] = wire::split_address(opts.listen);
      try {
        asio::ip::tcp::resolver resolver(io);
        const auto ep = *resolver.resolve(host, std::to_string(port), asio::ip::resolver_base::passive).begin();
        acceptor.open(ep.endpoint().protocol());
        acceptor.set_option(asio::socket_base::reuse_address(true));
        acceptor.bind(ep.endpoint());
        acceptor.listen();
      } catch (const std::exception& e) {
        decentrain::detail::fail("tcp: peer ", opts.rank, " cannot listen on ", opts.listen, ": ", e.what());
      }
      advertised = (opts.advertise.empty() ? host : opts.advertise) + ":" + std::to_string(acceptor.local_endpoint().port());
      directory[opts.rank] = advertised;
      accept_next();
      schedule_sweep();
      if (opts.heartbeat_interval.count() > 0) schedule_beat();
      io_thread = std::thread([this] { io.run(); });
    }

    ~impl() {
      asio::post(io, [this] {
        stopping = true;
        beat_timer.cancel();
        sweep_timer.cancel();
        accept_timer.cancel();
        asio::error_code ignored;
        acceptor.close(ignored);
        const auto open = all;  // close() erases from `all`
        for (const auto& c : open) close(c, "");
      });
      work.reset();
      if (io_thread.joinable()) io_thread.join();
    }

    // ---- mesh ----
    void connect() {
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
          std::lock_guard lock(mutex);
          if (!refusal.empty()) decentrain::detail::fail(refusal);  // retrying would not help
        }
        if (late_group()) return connect_late(deadline);
        for (int j = 0; j < opts.rank; ++j) {
          std::string address;
          {
            std::lock_guard lock(mutex);
            if (peers.count(j) || !directory.count(j)) continue;
            address = directory[j];
          }
          ++attempts;
          try {
            dial(j, address);
          } catch (const std::exception& e) {
            last_error = e.what();
          }
        }
        std::unique_lock lock(mutex);
        if (!refusal.empty()) decentrain::detail::fail(refusal);
        if (static_cast<int>(peers.size()) == opts.world - 1) {
          formed = true;
          return;
        }
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) {
          std::string missing;
          for (int j = 0; j < opts.world; ++j)
            if (j != opts.rank && !peers.count(j)) missing += (missing.empty() ? "" : ", ") + std::to_string(j);
          decentrain::detail::fail("tcp: peer ", opts.rank, " could not connect to peer(s) ", missing, " within ",
                                   opts.join_timeout.count(), " ms (", attempts, " attempts with backoff; last error: ",
                                   last_error, admitted.last_rejected.empty() ? "" : "; last caller refused: ",
                                   admitted.last_rejected, ")");
        }
        changed.wait_for(lock, std::min<std::chrono::steady_clock::duration>(backoff, deadline - now));
        backoff = std::min(backoff * 2, opts.max_backoff);
      }
    }

    int known() {
      std::lock_guard lock(mutex);
      return static_cast<int>(directory.size());
    }

    bool late_group() {
      std::lock_guard lock(mutex);
      return late;
    }

    // Dials the directory's peers this one is not connected to, skipping those that failed twice
    // (`failures` counts per rank); returns the last error.
    std::string dial_unconnected(std::map<int, int>& failures) {
      std::vector<std::pair<int, std::string>> todo;
      {
        std::lock_guard lock(mutex);
        for (const auto& [r, a] : directory)
          if (r != opts.rank && !peers.count(r) && failures[r] < 2 && !box.barred(r)) todo.emplace_back(r, a);
      }
      std::string last_error;
      for (const auto& [r, a] : todo) {
        try {
          dial(r, a);
        } catch (const refused_for_now& e) {  // alive: not counted as gone
          last_error = e.what();
        } catch (const std::exception& e) {
          ++failures[r];
          last_error = e.what();
        }
      }
      return last_error;
    }

    void rediscover() {
      std::vector<std::string> ask = opts.join;
      {
        std::lock_guard lock(mutex);
        late = true;  // a member left out rejoins as a joiner: the others take it in only as one
        for (const auto& [r, a] : directory)
          if (r != opts.rank) ask.push_back(a);
      }
      // One answer lists the peers it is connected to: enough. Each call starts one further along,
      // so a peer that answers with the wrong side of a partition is not the only one ever asked.
      for (std::size_t i = 0; i < ask.size(); ++i) {
        try {
          poll_directory(ask[(i + rediscover_turn) % ask.size()]);
          break;
        } catch (const std::exception&) {
        }
      }
      ++rediscover_turn;
      {
        std::lock_guard lock(mutex);
        if (!refusal.empty()) decentrain::detail::fail(refusal);  // its rank was taken meanwhile
      }
      std::map<int, int> failures;  // a peer gone meanwhile: the group's membership sorts it out
      (void)dial_unconnected(failures);
    }

    // The group is running: dial every peer a seed listed (all of them, whatever their rank),
    // saying this peer joins late. A listed peer that cannot be reached twice has most likely
    // died since; the group's membership sorts that out when it admits this one. One that refuses
    // for now is tried again until the deadline: a peer killed and started again at once finds
    // members that saw its previous process die and have not left it out of their view yet.
    void connect_late(std::chrono::steady_clock::time_point deadline) {
      std::map<int, int> failures;
      std::string last_error = "none";
      auto backoff = opts.first_backoff;
      for (;;) {
        if (auto e = dial_unconnected(failures); !e.empty()) last_error = std::move(e);
        std::unique_lock lock(mutex);
        if (!refusal.empty()) decentrain::detail::fail(refusal);
        bool settled = true;
        for (const auto& [r, a] : directory)
          if (r != opts.rank && !peers.count(r) && failures[r] < 2) settled = false;
        if (settled && !peers.empty()) {
          formed = true;
          return;
        }
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline && !peers.empty()) {  // some still refuse: the admission sorts that out
          formed = true;
          return;
        }
        if (now >= deadline || (settled && peers.empty()))
          decentrain::detail::fail("tcp: peer ", opts.rank, " could not reach the running group",
                                   now >= deadline ? decentrain::detail::concat(" within ", opts.join_timeout.count(), " ms")
                                                   : std::string(": every peer listed failed twice"),
                                   " (last error: ", last_error, ")");
        changed.wait_for(lock, std::min<std::chrono::steady_clock::duration>(backoff, deadline - now));
        backoff = std::min(backoff * 2, opts.max_backoff);
      }
    }

    wire::hello my_hello(wire::hello_purpose purpose) const {
      wire::hello h;
      h.rank = opts.rank;
      h.world = opts.world;
      h.purpose = purpose;
      h.address = advertised;
      h.late = late;
      h.settings = opts.settings;
      return h;
    }

    // A short-lived connection on a private io_context: connect with a timeout, do `work`.
    template <class Work>
    void with_connection(const std::string& address, Work&& work_fn) {
      const auto [host, port] = wire::split_address(address);
      asio::io_context local;
      asio::ip::tcp::socket socket(local);
      asio::error_code result = asio::error::would_block;
      asio::ip::tcp::resolver resolver(local);
      const auto endpoints = resolver.resolve(host, std::to_string(port));
      asio::async_connect(socket, endpoints, [&](const asio::error_code& ec, const asio::ip::tcp::endpoint&) { result = ec; });
      local.run_for(opts.connect_timeout);
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
        if (ec) { failure = ec == asio::error::eof ? "it closed the connection" : ec.message(); return; }
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
      io_ctx.run_for(opts.connect_timeout);
      decentrain::detail::check(finished, "tcp: peer ", opts.rank, " got no answer from the peer at ", address, ": ", failure);
      return f;
    }

    // The caller's half of the handshake on a fresh connection: with TLS its handshake first;
    // the hello, then (with a run key) the challenge and the proof. Returns the peer's answer (a
    // welcome, a directory, or a goodbye: the refusal is thrown, naming the reason), the
    // connection's frame keys and the rank the peer proved it is (with a run key, or a certificate
    // that names one; -1 without). `expected`: the rank dialed (-1: a seed, any rank).
    struct answered {
      frame_in answer;
      std::optional<auth::session> keys;
      int rank = -1;
    };
    answered handshake(asio::ip::tcp::socket& s, wire::hello_purpose purpose, const std::string& address,
                       [[maybe_unused]] int expected = -1) {
      answered out;
#if DECENTRAIN_HAS_TLS
      if (tls_context) {
        tls::established e;
        try {
          e = tls::dial(*tls_context, s, opts.connect_timeout, address);
        } catch (const tls::refused& ex) {  // (a handshake that timed out is retried like any connection)
          give_up(++unproven_refusals >= 3, ex.what());
        }
        if (expected >= 0 && (opts.tls.bind_ranks || e.certified_rank >= 0))
          decentrain::detail::check(e.certified_rank == expected, "tls: the peer at ", address, " has a certificate for \"",
                                    e.common_name, "\", not for rank ", expected, " (a stale directory, or another peer's address)");
        out.keys.emplace(e.dialer_to_acceptor, e.acceptor_to_dialer, true);
        out.rank = e.certified_rank;
      }
#endif
      auto h = my_hello(purpose);
      const bool keyed = !opts.key.empty();
      if (keyed) h.nonce = auth::random_nonce();
      const bytes hello = wire::encode_body(h);
      write_frame(s, out.keys, wire::frame_type::hello, 0, hello);
      auto refused = [&](const frame_in& f) {
        wire::farewell why{false, "no reason given"};
        if (!f.body.empty()) {
          try {
            why = wire::decode_body<wire::farewell>(f.body, "goodbye");
          } catch (const std::exception&) {
          }
        }
        // Nothing before the proofs is authenticated: a refusal that would end the join is
        // believed only when it comes three times (one forged goodbye must not end it).
        if (!why.final)  // the peer lives and asks for another try (connect_late keeps trying it)
          throw refused_for_now(decentrain::detail::concat("tcp: the peer at ", address, " refused peer ", opts.rank, ": ", why.reason));
        give_up(++unproven_refusals >= 3, "tcp: the peer at ", address, " refused peer ", opts.rank, ": ", why.reason);
      };
      // With TLS every frame from the peer is encrypted, its refusals too.
      auto open = [&](frame_in& f) {
        const auto head = std::span<const std::byte>(f.raw).first(wire::header_used_bytes);
        if (out.keys && !out.keys->receive.open_in_place(head, f.body, f.head.mac))
          decentrain::detail::fail("tcp: the answer of the peer at ", address, " failed its authentication tag");
      };
      if (keyed) {
        auto c = read_frame(s, address);
        open(c);
        if (c.head.type == wire::frame_type::bye) refused(c);
        decentrain::detail::check(c.head.type == wire::frame_type::challenge, "tcp: the peer at ", address,
                                  " answered the hello with frame type ", static_cast<int>(c.head.type),
                                  ", not the run key's challenge");
        decentrain::detail::check(c.body.size() == wire::challenge_bytes, "tcp: the run key's challenge from the peer at ", address,
                                  " has ", c.body.size(), " bytes, not ", wire::challenge_bytes);
        const std::size_t proof_at = wire::challenge_bytes - auth::proof_bytes;
        bytes transcript = hello;
        transcript.insert(transcript.end(), c.body.begin(), c.body.begin() + static_cast<std::ptrdiff_t>(proof_at));
        if (!auth::same(std::span(c.body).subspan(proof_at), auth::acceptor_proof(opts.key, transcript)))
          give_up(++unproven_refusals >= 3, "tcp: the peer at ", address, " does not hold this run's key (its proof did not verify)");
        const int proven = wire::challenge_rank(c.body);
        decentrain::detail::check(out.rank < 0 || out.rank == proven, "tcp: the peer at ", address, " proved it is peer ", proven,
                                  " with the run key and rank ", out.rank, " with its certificate");
        out.rank = proven;
        const auto proof = auth::dialer_proof(opts.key, transcript);
        write_frame(s, out.keys, wire::frame_type::proof, 0, bytes(proof.begin(), proof.end()));
        if (!out.keys) out.keys.emplace(opts.key, transcript, true);  // (with TLS, its keys stay)
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
        std::lock_guard lock(mutex);
        if (refusal.empty()) refusal = why;
      }
      decentrain::detail::fail(why);
    }

    // Asks `seed` for its directory. The exchange runs on a private io_context with a deadline,
    // so a seed that accepts but never answers cannot stall the join.
    void poll_directory(const std::string& seed) {
      with_connection(seed, [&](asio::ip::tcp::socket& s) {
        const auto answer = handshake(s, wire::hello_purpose::directory, seed).answer;
        decentrain::detail::check(answer.head.type == wire::frame_type::directory, "tcp: directory request to ", seed,
                                  " answered with frame type ", static_cast<int>(answer.head.type));
        const auto dir = wire::decode_body<wire::directory>(answer.body, "directory");
        std::lock_guard lock(mutex);
        // A running group, and this peer is not of its mesh (or was, and rejoins: then another
        // address under its rank is another process that took the rank meanwhile).
        const bool outside = !formed && peers.empty();
        if (dir.formed && (outside || late)) {
          for (const auto& [r, a] : dir.entries)
            if (r == opts.rank && (outside || a != advertised))
              refusal = decentrain::detail::concat("tcp: rank ", opts.rank, " is taken in the running group (by the peer at ", a,
                                                   "); a peer that joins needs a rank of its own");
          late = refusal.empty();
        }
        for (const auto& [r, a] : dir.entries)
          if (r >= 0 && r < opts.capacity() && r != opts.rank) directory[r] = a;
      });
    }

    void dial(int peer, const std::string& address) {
      with_connection(address, [&](asio::ip::tcp::socket& s) {
        auto [answer, keys, proven_rank] = handshake(s, wire::hello_purpose::data, address, peer);
        decentrain::detail::check(answer.head.type == wire::frame_type::welcome, "tcp: the peer at ", address,
                                  " answered peer ", opts.rank, "'s hello with frame type ", static_cast<int>(answer.head.type));
        // With a key, the rank is proven: a connection that reached another peer (relayed, or an
        // address that now belongs to another rank) is not taken for `peer`.
        decentrain::detail::check(opts.key.empty() || proven_rank == peer, "tcp: the peer at ", address, " proved it is peer ", proven_rank,
                                  ", not peer ", peer, " (a stale directory, or the connection was redirected)");
        auto c = std::make_shared<connection>(io);
        const auto protocol = s.local_endpoint().protocol();
        c->socket.assign(protocol, s.release());
        c->rank = peer;
        c->next = connection::stage::open;
        c->keys = std::move(keys);
        std::promise<void> registered;
        auto f = registered.get_future();
        asio::post(io, [this, c, &registered] {
          all.insert(c);
          std::shared_ptr<connection> dropped;
          {
            std::lock_guard lock(mutex);
            dropped = keep_one(c, true);
          }
          if (dropped) close(dropped, "");
          if (dropped != c) {
            // A joiner hears the peer from now on, also one it forgot (it was left out and
            // rejoins), as the peer welcomed it.
            if (!(late_group() && box.welcome(c->rank))) box.reopen(c->rank);
            read_next(c);
          }
          registered.set_value();
        });
        f.get();
        changed.notify_all();
      });
    }

    // Two joiners that find each other at once dial each other: of the two connections, the one
    // the lower rank dialed is kept on both sides. Registers `c` (dialed by this peer when
    // `outgoing`) or not; returns the connection to close quietly, if any (mutex held).
    std::shared_ptr<connection> keep_one(const std::shared_ptr<connection>& c, bool outgoing) {
      auto it = peers.find(c->rank);
      if (it == peers.end() || it->second == c) {
        if (it == peers.end() && !ever_connected.insert(c->rank).second) ++admitted.reconnected;
        peers[c->rank] = c;
        return nullptr;
      }
      const bool lower_dialed_c = outgoing ? opts.rank < c->rank : c->rank < opts.rank;
      if (!lower_dialed_c) return c;
      auto old = it->second;
      it->second = c;
      return old;
    }

    // A frame as asio buffers: header, body, padding (head and body must outlive the write).
    static std::array<asio::const_buffer, 3> frame_buffers(const std::array<std::byte, wire::header_bytes>& head,
                                                           std::span<const std::byte> body) {
      const auto pad = wire::padding(body.size());
      return {asio::buffer(head), asio::buffer(body.data(), body.size()), asio::buffer(pad.data(), pad.size())};
    }

    // A handshake frame, sealed (and with TLS encrypted) when the connection has keys already.
    void write_frame(asio::ip::tcp::socket& s, std::optional<auth::session>& keys, wire::frame_type type, tag_type tag,
                     bytes body) {
      framing_sent += wire::header_bytes + body.size() + wire::padding(body.size()).size();
      auto head = wire::encode_header({type, tag, body.size()});
      if (keys) {
        const auto mac = keys->send.seal(std::span<const std::byte>(head).first(wire::header_used_bytes), body,
                                         keys->send.encrypts() ? std::span<std::byte>(body) : std::span<std::byte>());
        std::memcpy(head.data() + wire::tag_offset, mac.data(), mac.size());
      }
      asio::write(s, frame_buffers(head, body));
    }

    // ---- I/O thread ----
    // Accepts forever, one connection at a time. A failed accept (out of descriptors: the
    // connection stays in the kernel's queue and accept fails again at once) pauses, doubling up
    // to a second, and makes room by closing the oldest stranger, instead of spinning; once the
    // acceptor is closed (shutdown) it stops.
    void accept_next() {
      auto c = std::make_shared<connection>(io);
      acceptor.async_accept(c->socket, [this, c](const asio::error_code& ec) {
        if (stopping || !acceptor.is_open() || ec == asio::error::operation_aborted) return;
        if (ec && ec != asio::error::connection_aborted) {
          {
            std::lock_guard lock(mutex);
            ++admitted.accept_failures;
          }
          if (ec == asio::error::no_descriptors || ec.value() == ENFILE || ec == asio::error::no_buffer_space ||
              ec == asio::error::no_memory)
            evict_oldest_pending();
          accept_timer.expires_after(accept_pause);
          accept_pause = std::min(accept_pause * 2, std::chrono::milliseconds(1000));
          accept_timer.async_wait([this](const asio::error_code& e) {
            if (!e && !stopping) accept_next();
          });
          return;
        }
        accept_pause = std::chrono::milliseconds(10);
        if (!ec) {
          asio::error_code ignored;
          c->socket.set_option(asio::ip::tcp::no_delay(true), ignored);
          c->accepted_at = clock::now();
          all.insert(c);
          if (count_pending() > opts.max_pending) evict_oldest_pending();
#if DECENTRAIN_HAS_TLS
          if (tls_context) start_tls(c);
          else
#endif
            read_next(c);
        }
        accept_next();
      });
    }

#if DECENTRAIN_HAS_TLS
    // The acceptor's half of TLS (transport/tls.hpp): the handshake, `ready`, then frames under
    // the exported keys. A caller that speaks plain frames is told, as a plain goodbye, that
    // this peer needs TLS (its first bytes are a frame's magic, not a TLS record).
    void start_tls(const std::shared_ptr<connection>& c) {
      c->socket.async_wait(asio::socket_base::wait_read, [this, c](const asio::error_code& ec) {
        if (c->closed) return;
        if (ec) return lost(c, ec);
        std::array<unsigned char, 4> first{};
        const auto n = ::recv(c->socket.native_handle(), first.data(), first.size(), MSG_PEEK | MSG_DONTWAIT);
        if (n == 4 && (first[0] | first[1] << 8 | first[2] << 16 | static_cast<std::uint32_t>(first[3]) << 24) == wire::magic) {
          refuse(c, decentrain::detail::concat("peer ", opts.rank, " admits only peers with a certificate of the run's CA (TLS: ",
                                               "--tls-cert, --tls-key, --tls-ca); the caller has none"));
          return;
        }
        c->tls = std::make_unique<tls::stream>(c->socket, *tls_context);
        c->tls->async_handshake(asio::ssl::stream_base::server, [this, c](const asio::error_code& ec2) {
          if (c->closed) return;
          if (ec2) {
            const auto f = tls::describe(ec2, c->tls->native_handle());
            if (f.kind == tls::failure::went_away) return lost(c, ec2);
            return reject(c, "its TLS handshake failed: " + f.why);
          }
          try {
            const auto e = tls::finish(*c->tls);
            c->keys.emplace(e.dialer_to_acceptor, e.acceptor_to_dialer, false);
            c->certified_rank = e.certified_rank;
          } catch (const std::exception& ex) {
            return reject(c, ex.what());
          }
          // `ready` is the first byte this end sends after its handshake, and nothing follows it
          // until the caller's hello: an unregistered connection gets no heartbeat or other frame
          // (see tls.hpp for why the order matters).
          static constexpr unsigned char ready = tls::ready;
          asio::async_write(*c->tls, asio::buffer(&ready, 1), [this, c](const asio::error_code& ec3, std::size_t) {
            if (c->closed) return;
            if (ec3) return lost(c, ec3);
            c->tls.reset();
            read_next(c);
          });
        });
      });
    }
#endif

    // Connections accepted that have not shown who they are (a directory request stays one).
    int count_pending() {
      int n = 0;
      for (const auto& c : all) n += c->rank < 0 && !c->closed;
      std::lock_guard lock(mutex);
      pending_now = n;
      return n;
    }

    void evict_oldest_pending() {
      std::shared_ptr<connection> oldest;
      for (const auto& c : all)
        if (c->rank < 0 && !c->closed && (!oldest || c->accepted_at < oldest->accepted_at)) oldest = c;
      if (!oldest) return;
      {
        std::lock_guard lock(mutex);
        ++admitted.evicted;
      }
      close(oldest, "");  // (close recounts the strangers)
    }

    // Closes the strangers past their handshake deadline, a few times per deadline.
    void schedule_sweep() {
      sweep_timer.expires_after(std::clamp(opts.handshake_timeout / 4, std::chrono::milliseconds(20), std::chrono::milliseconds(500)));
      sweep_timer.async_wait([this](const asio::error_code& ec) {
        if (ec || stopping) return;
        const auto now = clock::now();
        std::vector<std::shared_ptr<connection>> late_ones;
        for (const auto& c : all)
          if (c->rank < 0 && !c->closed && now - c->accepted_at > opts.handshake_timeout) late_ones.push_back(c);
        if (!late_ones.empty()) {
          std::lock_guard lock(mutex);
          admitted.timed_out += late_ones.size();
        }
        for (const auto& c : late_ones) close(c, "");
        schedule_sweep();
      });
    }

    // Reads exactly `into` (from byte `got` on), then calls done(error, bytes read). It reads
    // until the socket is empty before it waits, and while it waits the socket's receive
    // low-water mark (SO_RCVLOWAT) is what is still missing, up to low_water_cap, so the kernel
    // wakes this thread once per large piece of a body rather than once per packet. asio's
    // async_read went through epoll_wait for every 50 KB it read; this reads a 1 MB chunk in
    // about one wake-up (5x fewer recv calls, 18x fewer epoll_waits, about 10% more all-reduce
    // bandwidth: bench/RESULTS.md). Never more than is missing: a mark above the rest of a frame
    // would wait for bytes that may never come. The kernel caps the mark at half the largest
    // receive buffer and grows the buffer to hold it.
    //
    // After `turn_bytes` in one go it hands the rest back to the event loop (as read_next does
    // between frames): a peer streaming gigabytes (a state transfer) would otherwise keep this
    // thread reading for as long as the stream lasts: its heartbeats, timers and other
    // connections would wait that long (its peer then takes it for silent), and the stack would
    // grow by a few calls per message.
    static constexpr std::size_t low_water_cap = std::size_t{4} << 20;
    static constexpr std::size_t turn_bytes = std::size_t{4} << 20;

    template <class Done>
    void read_fully(const std::shared_ptr<connection>& c, std::span<std::byte> into, std::size_t got, Done done) {
      const int fd = c->socket.native_handle();
      std::size_t this_turn = 0;
      while (got < into.size()) {
        if (this_turn >= turn_bytes) {
          asio::post(io, [this, c, into, got, done = std::move(done)]() mutable {
            if (c->closed) return done(asio::error_code(asio::error::operation_aborted), got);  // settles a posting
            read_fully(c, into, got, std::move(done));
          });
          return;
        }
        const ssize_t n = ::recv(fd, into.data() + got, into.size() - got, MSG_DONTWAIT);
        if (n > 0) {
          got += static_cast<std::size_t>(n);
          this_turn += static_cast<std::size_t>(n);
          c->heard = clock::now();
          continue;
        }
        if (n == 0) return done(asio::error_code(asio::error::eof), got);
        const int err = errno;
        if (err == EINTR) continue;
        if (err != EAGAIN && err != EWOULDBLOCK) return done(asio::error_code(err, asio::error::get_system_category()), got);
        const int want = static_cast<int>(std::min(into.size() - got, low_water_cap));
        if (want != c->low_water && ::setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0) c->low_water = want;
        c->socket.async_wait(asio::socket_base::wait_read, [this, c, into, got, done = std::move(done)](const asio::error_code& ec) mutable {
          if (ec) return done(ec, got);
          read_fully(c, into, got, std::move(done));
        });
        return;
      }
      done(asio::error_code(), got);
    }

    void read_next(const std::shared_ptr<connection>& c) {
      const std::size_t pad = c->padding;
      read_fully(c, std::span<std::byte>(c->head.data(), pad + wire::header_bytes), 0, [this, c, pad](const asio::error_code& ec, std::size_t) {
        if (ec) return lost(c, ec);
        wire::header h;
        // A TLS ClientHello where a hello should be: a caller with TLS, told in a plain goodbye
        // (its TLS fails on it at once, and says this peer does not speak TLS).
        if (c->rank < 0 && c->next == connection::stage::hello && c->head[0] == std::byte{22} && c->head[1] == std::byte{3})
          return refuse(c, decentrain::detail::concat("peer ", opts.rank, " runs without TLS and the caller with it; give every ",
                                                      "peer the same TLS settings"));
        try {
          wire::check_zeros(c->head.data(), pad, "padding");
          h = wire::decode_header(c->head.data() + pad, opts.max_frame_bytes);
          c->padding = wire::padding(h.length).size();
          expect(*c, h);
        } catch (const std::exception& e) {
          return malformed(c, e.what());
        }
        if (h.type == wire::frame_type::data)
          if (auto into = box.claim(c->rank, h.tag, static_cast<std::size_t>(h.length))) return read_in_place(c, h, *into);
        c->body = box.spare(static_cast<std::size_t>(h.length));
        read_fully(c, std::span<std::byte>(c->body), 0, [this, c, h](const asio::error_code& ec2, std::size_t got) {
          if (ec2 == asio::error::eof)
            return malformed(c, decentrain::detail::concat("frame: truncated body (", got, " of ", h.length, " bytes)"));
          if (ec2) return lost(c, ec2);
          if (!authentic(*c, h, c->body)) return reject_frame(c, h);
          try {
            if (!dispatch(c, h)) return;
          } catch (const std::exception& e) {
            return malformed(c, e.what());
          }
          read_next_later(c);
        });
      });
    }

    // The next frame, from the event loop (see turn_bytes).
    void read_next_later(const std::shared_ptr<connection>& c) {
      asio::post(io, [this, c] {
        if (!c->closed) read_next(c);
      });
    }

    // A data body whose receiver posted its memory (exchange): read straight into it. The
    // posting is settled before anything else happens to the connection, so the receiver never
    // returns while this still writes into its memory.
    void read_in_place(const std::shared_ptr<connection>& c, const wire::header& h, std::span<std::byte> into) {
      read_fully(c, into, 0, [this, c, h, into](const asio::error_code& ec, std::size_t got) {
        if (ec) {
          // Closed (and counted) before the posting is settled: the receiver wakes to a peer
          // already marked unreachable, so its error and the stats say why.
          if (ec == asio::error::eof)
            malformed(c, decentrain::detail::concat("frame: truncated body (", got, " of ", h.length, " bytes)"));
          else
            lost(c, ec);
          return box.abandoned(c->rank, h.tag);
        }
        if (!authentic(*c, h, into)) {
          reject_frame(c, h);
          return box.abandoned(c->rank, h.tag);
        }
        box.landed(c->rank, h.tag);
        read_next_later(c);
      });
    }

    // Throws unless a frame of this type and size may come next on `c`: a connection that has not
    // shown who it is may send only its next handshake frame, and only a small one.
    void expect(const connection& c, const wire::header& h) const {
      using stage = connection::stage;
      if (c.rank >= 0) {
        decentrain::detail::check(h.type == wire::frame_type::data || h.type == wire::frame_type::bye ||
                                      h.type == wire::frame_type::heartbeat,
                                  h.type == wire::frame_type::hello ? "frame: a second hello on a connection"
                                                                    : "frame: unexpected frame type ",
                                  h.type == wire::frame_type::hello ? "" : std::to_string(static_cast<int>(h.type)));
        return;
      }
      decentrain::detail::check(h.length <= wire::max_handshake_bytes, "frame: a frame of ", h.length,
                                " bytes from a connection that has not said who it is (the limit is ", wire::max_handshake_bytes, ")");
      decentrain::detail::check(c.next != stage::answered, "frame: more frames after a directory request");
      decentrain::detail::check(c.next != stage::hello || h.type == wire::frame_type::hello,
                                "frame: the first frame on a connection must be a hello");
      decentrain::detail::check(c.next != stage::proof || h.type == wire::frame_type::proof,
                                "frame: expected the run key's proof, got frame type ", static_cast<int>(h.type));
    }

    // Whether a frame's tag is the one its connection's key gives its place in the stream (no key:
    // no tag). Checked before anything is done with the frame.
    // With TLS the body is decrypted in place.
    static bool authentic(connection& c, const wire::header& h, std::span<std::byte> body) {
      if (!c.keys) return h.mac == auth::tag{};
      const auto head = wire::encode_header(h);  // its covered bytes are those received
      return c.keys->receive.open_in_place(std::span<const std::byte>(head).first(wire::header_used_bytes), body, h.mac);
    }

    void reject_frame(const std::shared_ptr<connection>& c, const wire::header& h) {
      const auto from = c->rank >= 0 ? "peer " + std::to_string(c->rank) : std::string("a connection");
      reject(c, c->keys || !opts.key.empty()
                    ? decentrain::detail::concat("a frame (type ", static_cast<int>(h.type), ") from ", from,
                                                 c->keys ? " failed its authentication tag: modified, replayed or forged"
                                                         : " carries an authentication tag before the run key's handshake ended")
                    : decentrain::detail::concat("a frame (type ", static_cast<int>(h.type), ") from ", from,
                                                 " carries an authentication tag, but this peer has no run key"),
             true);
    }

    // Drops a connection that failed the run key's checks, counted and named.
    void reject(const std::shared_ptr<connection>& c, const std::string& why, bool bad_tag = false) {
      {
        std::lock_guard lock(mutex);
        ++(bad_tag ? admitted.bad_tags : admitted.refused);
        admitted.last_rejected = why;
      }
      close(c, "it failed authentication: " + why);
    }

    // Handles one complete frame; false when the connection is done.
    bool dispatch(const std::shared_ptr<connection>& c, const wire::header& h) {
      switch (h.type) {
        case wire::frame_type::data:
          box.push(c->rank, h.tag, detail::message{std::move(c->body), 0.0});
          c->body = {};
          return true;
        case wire::frame_type::bye: {
          if (c->body.empty()) {
            close(c, "it said goodbye");
            return false;
          }
          const auto f = wire::decode_body<wire::farewell>(c->body, "goodbye");
          if (f.excluded) close(c, "it stopped listening to this peer: " + f.reason, failure_cause::excluded);
          else close(c, "it left: " + f.reason);
          return false;
        }
        case wire::frame_type::heartbeat: {
          const auto beat = wire::decode_heartbeat(c->body);
          const auto now = clock::now();
          // A round trip only from an echo of ours that makes sense (a peer's garbage is ignored).
          double round_trip = -1;
          const std::uint64_t now_ns = nanoseconds(now);
          if (beat.echo_ns != 0 && beat.echo_ns <= now_ns && beat.held_ns <= now_ns - beat.echo_ns) {
            round_trip = static_cast<double>(now_ns - beat.echo_ns - beat.held_ns) * 1e-9;
            if (round_trip > 600) round_trip = -1;
          }
          c->last_in = beat;
          c->last_in_at = now;
          std::lock_guard lock(mutex);
          c->beats.heartbeat(now, round_trip);
          return true;
        }
        case wire::frame_type::hello: {
          auto hello = wire::decode_body<wire::hello>(c->body, "hello");
          decentrain::detail::check(hello.rank >= 0 && hello.rank < opts.capacity() && hello.rank != opts.rank,
                                    "frame: hello claims rank ", hello.rank);
          if (hello.world != opts.world || hello.settings != opts.settings) {
            refuse(c, hello.world != opts.world
                          ? decentrain::detail::concat("peer ", opts.rank, " is in a world of ", opts.world, ", the caller (rank ",
                                                       hello.rank, ") in one of ", hello.world,
                                                       "; start every peer with the same world size")
                          : decentrain::detail::concat("peer ", opts.rank, " and the caller (rank ", hello.rank,
                                                       ") were started with different settings: ",
                                                       settings_difference(opts.settings, hello.settings)));
            return true;  // the caller closes (or the handshake deadline does)
          }
          decentrain::detail::check(hello.little_endian == (std::endian::native == std::endian::little),
                                    "frame: peer ", hello.rank, " has a different byte order");
          if (c->keys && c->keys->receive.encrypts() && (opts.tls.bind_ranks || c->certified_rank >= 0) &&
              c->certified_rank != hello.rank) {
            refuse(c, decentrain::detail::concat("the caller claims rank ", hello.rank, ", and its certificate ",
                                                 c->certified_rank >= 0 ? "is for rank " + std::to_string(c->certified_rank)
                                                                        : std::string("names no rank"),
                                                 " (one peer cannot take another's rank)"));
            return true;  // the caller closes (or the handshake deadline does)
          }
          const bool keyed = !opts.key.empty();
          if (keyed != !hello.nonce.empty()) {
            const auto why = keyed ? decentrain::detail::concat("peer ", opts.rank, " admits only peers holding the run's key (",
                                                                "tcp_options::key; decentrain-gpt: --key-file or ",
                                                                auth::key_file_variable, "); the caller has none")
                                   : decentrain::detail::concat("the caller holds a run key and peer ", opts.rank,
                                                                " has none; give every peer the same key");
            refuse(c, why);
            return true;  // the caller closes (or the handshake deadline does)
          }
          if (!keyed) return admit(c, hello);
          decentrain::detail::check(hello.nonce.size() == auth::nonce_bytes, "frame: a hello nonce of ", hello.nonce.size(),
                                    " bytes (it has ", auth::nonce_bytes, ")");
          const auto nonce = auth::random_nonce();
          const auto* n = reinterpret_cast<const std::byte*>(nonce.data());
          bytes challenge(n, n + nonce.size());  // nonce, rank, then the proof over the transcript
          wire::put_challenge_rank(challenge, opts.rank);
          c->transcript.assign(c->body.begin(), c->body.end());  // (c->body is a recycled buffer)
          c->transcript.insert(c->transcript.end(), challenge.begin(), challenge.end());
          const auto proof = auth::acceptor_proof(opts.key, c->transcript);
          challenge.insert(challenge.end(), proof.begin(), proof.end());
          c->asked = std::move(hello);
          c->next = connection::stage::proof;
          reply(c, wire::frame_type::challenge, std::move(challenge));
          return true;
        }
        case wire::frame_type::proof: {
          if (!auth::same(c->body, auth::dialer_proof(opts.key, c->transcript))) {
            reject(c, decentrain::detail::concat("the proof of the run key from the caller claiming rank ", c->asked.rank,
                                                 " did not verify (it does not hold this run's key)"));
            return false;
          }
          if (!c->keys) c->keys.emplace(opts.key, c->transcript, false);  // (with TLS, its keys stay)
          c->transcript = {};
          return admit(c, std::exchange(c->asked, {}));
        }
        default:
          decentrain::detail::fail("frame: unexpected frame type ", static_cast<int>(h.type));
      }
      return false;
    }

    // A caller that said (and proved) who it is: a directory request is answered; a peer is taken
    // into the mesh and welcomed, or refused with a goodbye saying why. False when `c` is dropped.
    bool admit(const std::shared_ptr<connection>& c, const wire::hello& hello) {
      std::lock_guard lock(mutex);
      if (hello.purpose == wire::hello_purpose::directory) {
        if (!formed && !hello.address.empty()) directory[hello.rank] = hello.address;
        wire::directory d;
        d.formed = formed;
        for (const auto& [r, a] : directory)
          if (!formed || r == opts.rank || peers.count(r)) d.entries.emplace_back(r, a);
        c->next = connection::stage::answered;
        reply(c, wire::frame_type::directory, wire::encode_body(d));
        return true;  // the asker closes when it has read the reply
      }
      if (const auto why = box.barred(hello.rank)) {  // final: trying again cannot help
        c->next = connection::stage::answered;
        reply(c, wire::frame_type::bye, wire::encode_body(wire::farewell{false, *why, true}));
        return true;  // the caller closes
      }
      if (hello.late) {
        if (!box.welcome(hello.rank)) {  // a rank this peer forgot may come back as a new peer
          c->next = connection::stage::answered;
          reply(c, wire::frame_type::bye,
                wire::encode_body(wire::farewell{false, decentrain::detail::concat(
                                                          "peer ", opts.rank, " has not left the previous peer of rank ",
                                                          hello.rank, " out of its view yet; join again later")}));
          return true;  // the joiner closes
        }
      } else if (hello.rank < opts.rank || peers.count(hello.rank)) {  // told why: the caller waits for an answer
        c->next = connection::stage::answered;
        reply(c, wire::frame_type::bye,
              wire::encode_body(wire::farewell{
                  false, hello.rank < opts.rank
                             ? decentrain::detail::concat("peer ", hello.rank, " dialed peer ", opts.rank,
                                                          " (lower ranks are dialed, not dialing: are two peers started as rank ",
                                                          hello.rank, "?)")
                             : decentrain::detail::concat("peer ", opts.rank, " is already connected to a peer of rank ", hello.rank,
                                                          " (are two peers started as rank ", hello.rank, "?)")}));
        return true;  // the caller closes
      }
      if (!hello.address.empty()) directory[hello.rank] = hello.address;
      // The welcome goes out before the connection is registered, so it is the first frame the
      // caller reads from it (the training thread may write to it as soon as it is registered).
      {
        std::lock_guard write_lock(c->write_mutex);
        append_frame(*c, wire::frame_type::welcome, {});
        flush_unsent(*c);
      }
      c->rank = hello.rank;
      c->next = connection::stage::open;
      pending_now = std::max(0, pending_now - 1);  // (mutex held) no longer a stranger
      const auto dropped = keep_one(c, false);
      if (dropped != c) box.reopen(c->rank);
      changed.notify_all();
      if (dropped) asio::post(io, [this, dropped] { close(dropped, ""); });  // not under the mutex
      return dropped != c;  // false: this connection is the one dropped
    }

    // A caller refused before its key was checked: told why (best effort), counted.
    void refuse(const std::shared_ptr<connection>& c, const std::string& why) {
      {
        std::lock_guard lock(mutex);
        ++admitted.refused;
        admitted.last_rejected = why;
      }
      c->next = connection::stage::answered;
      reply(c, wire::frame_type::bye, wire::encode_body(wire::farewell{false, why, true}));
    }

    void malformed(const std::shared_ptr<connection>& c, const std::string& why) {
      {
        std::lock_guard lock(mutex);
        ++malformed_frames;
        last_malformed = why;
      }
      close(c, "it sent a malformed frame: " + why);
    }

    void lost(const std::shared_ptr<connection>& c, const asio::error_code& ec) {
      if (!c->closed && c->rank < 0 && c->next == connection::stage::proof) {  // a caller whose key differs stops here
        std::lock_guard lock(mutex);
        ++admitted.refused;
        admitted.last_rejected = "a caller closed the connection after the run key's challenge (another key, or none)";
      }
      close(c, ec == asio::error::eof ? std::string("connection closed") : "connection lost: " + ec.message());
    }

    void close(const std::shared_ptr<connection>& c, const std::string& why, failure_cause cause = failure_cause::departed) {
      if (c->closed) return;
      c->closed = true;
      c->closed_for_writes = true;
      asio::error_code ignored;
      c->socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);  // wakes a writer in poll()
      {
        std::lock_guard write_lock(c->write_mutex);
        c->socket.close(ignored);
      }
      all.erase(c);
      if (c->rank < 0 && !stopping) count_pending();
      if (c->rank >= 0) {
        std::lock_guard lock(mutex);
        auto it = peers.find(c->rank);
        if (it != peers.end() && it->second == c) {
          peers.erase(it);
          if (!why.empty()) box.close(c->rank, why, cause);
        }
      }
    }

    // ---- liveness (I/O thread) ----
    void schedule_beat() {
      beat_timer.expires_after(opts.heartbeat_interval);
      beat_timer.async_wait([this](const asio::error_code& ec) {
        if (ec || stopping) return;
        beat_all();
        schedule_beat();
      });
    }

    // Closes the peers silent past their deadline and sends the others a heartbeat.
    void beat_all() {
      const auto now = clock::now();
      // When this peer itself was not running (SIGSTOP, a paused machine), nothing could be read
      // meanwhile and the others' silence says nothing: their deadlines start afresh.
      const bool was_stopped = last_beat && now - *last_beat > opts.min_silence;
      last_beat = now;
      std::vector<std::shared_ptr<connection>> connected;
      {
        std::lock_guard lock(mutex);
        for (const auto& [r, c] : peers) connected.push_back(c);
      }
      for (const auto& c : connected) {
        if (c->closed) continue;
        int queued = 0;
        if (::ioctl(c->socket.native_handle(), FIONREAD, &queued) == 0 && queued != c->queued) {
          c->queued = queued;
          c->heard = now;
        }
        if (was_stopped) c->heard = now;
        std::chrono::milliseconds deadline;
        {
          std::lock_guard lock(mutex);
          deadline = c->beats.deadline(opts.min_silence);
        }
        const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - c->heard);
        if (silent > deadline) {
          const auto why = decentrain::detail::concat("heard nothing from it for ", silent.count(), " ms, over its deadline of ",
                                                      deadline.count(), " ms (from its heartbeats)");
          exclude(c, why, wire::farewell{true, decentrain::detail::concat("peer ", opts.rank, " heard nothing from peer ", c->rank,
                                                                          " for ", silent.count(), " ms")});
          continue;
        }
        beat(*c, now);
      }
    }

    void beat(connection& c, clock::time_point now) {
      std::unique_lock lock(c.write_mutex, std::try_to_lock);
      // A writer busy on this connection is sending bytes, which the peer hears as well.
      if (!lock.owns_lock() || c.closed_for_writes.load() || !flush_unsent(c)) return;
      wire::heartbeat h;
      h.sent_ns = nanoseconds(now);
      if (c.last_in.sent_ns != 0) {
        h.echo_ns = c.last_in.sent_ns;
        h.held_ns = nanoseconds(now) - nanoseconds(c.last_in_at);
      }
      append_frame(c, wire::frame_type::heartbeat, wire::encode_heartbeat(h));
      flush_unsent(c);
    }

    // Stops listening to a peer: its waits fail as silent, it is told why (best effort, without
    // blocking: so that, if it was the frozen one, it does not take this peer for departed when
    // it wakes), and the connection closes.
    void exclude(const std::shared_ptr<connection>& c, const std::string& why, const wire::farewell& f) {
      part(c, why, failure_cause::silent, f);
    }

    // Closes a connection with a goodbye, written without blocking (best effort: a socket whose
    // buffer is full loses it, and the peer finds only the closed connection).
    void part(const std::shared_ptr<connection>& c, const std::string& why, failure_cause cause, const wire::farewell& f) {
      if (c->closed) return;
      // The mailbox closes in close(), after the peer left `peers`: a wait woken by the closure
      // and a send that follows it then agree that the peer is gone.
      {
        std::unique_lock lock(c->write_mutex, std::try_to_lock);
        if (lock.owns_lock() && !c->closed_for_writes.load() && flush_unsent(*c)) {
          append_frame(*c, wire::frame_type::bye, wire::encode_body(f));
          flush_unsent(*c);
        }
      }
      // Unread bytes at close() would make the kernel reset the connection and drop the goodbye.
      std::array<std::byte, 4096> sink;
      for (int i = 0; i < 1024 && ::recv(c->socket.native_handle(), sink.data(), sink.size(), MSG_DONTWAIT) > 0; ++i) {
      }
      close(c, why, cause);
    }

    // A frame's header, with its tag when the connection has keys (write_mutex held: tags must go
    // out in the order they were made). With TLS the body is encrypted into `ciphertext` (which
    // may be `body` itself).
    static std::array<std::byte, wire::header_bytes> sealed_header(connection& c, wire::frame_type type, tag_type tag,
                                                                  std::span<const std::byte> body, std::span<std::byte> ciphertext) {
      auto head = wire::encode_header({type, tag, body.size(), {}});
      if (c.keys) {
        const auto mac = c.keys->send.seal(std::span<const std::byte>(head).first(wire::header_used_bytes), body, ciphertext);
        std::memcpy(head.data() + wire::tag_offset, mac.data(), mac.size());
      }
      return head;
    }
    static bool encrypted(const connection& c) { return c.keys && c.keys->send.encrypts(); }

    // Queues a small control frame on c.unsent (write_mutex held).
    void append_frame(connection& c, wire::frame_type type, const bytes& body) {
      framing_sent += wire::header_bytes + body.size() + wire::padding(body.size()).size();
      auto& out = c.unsent;
      const std::size_t at = out.size();
      out.resize(at + wire::header_bytes);
      out.insert(out.end(), body.begin(), body.end());
      const auto text = std::span<std::byte>(out).subspan(at + wire::header_bytes, body.size());
      const auto head = sealed_header(c, type, 0, text, encrypted(c) ? text : std::span<std::byte>());
      std::memcpy(out.data() + at, head.data(), head.size());
      const auto pad = wire::padding(body.size());
      out.insert(out.end(), pad.begin(), pad.end());
    }

    // Writes what of c.unsent the socket takes now (write_mutex held); true once all of it went.
    static bool flush_unsent(connection& c) {
      std::size_t done = 0;
      while (done < c.unsent.size()) {
        const ssize_t n = ::send(c.socket.native_handle(), c.unsent.data() + done, c.unsent.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // full, or broken (the reader finds out)
        done += static_cast<std::size_t>(n);
      }
      c.unsent.erase(c.unsent.begin(), c.unsent.begin() + static_cast<std::ptrdiff_t>(done));
      return c.unsent.empty();
    }

    std::optional<peer_liveness> liveness_of(int peer) const {
      std::lock_guard lock(mutex);
      auto it = peers.find(peer);
      if (it == peers.end()) return std::nullopt;
      const auto& b = it->second->beats;
      return peer_liveness{b.round_trip_seconds(), b.gap_seconds(), b.deadline(opts.min_silence), b.heartbeats()};
    }

    // On the I/O thread: a frame to a caller that is not (yet) a peer of the mesh: the run key's
    // challenge, a directory, a refusal.
    void reply(const std::shared_ptr<connection>& c, wire::frame_type type, bytes body) {
      struct frame {
        std::array<std::byte, wire::header_bytes> head;
        bytes body;
      };
      auto f = std::make_shared<frame>(frame{{}, std::move(body)});
      framing_sent += wire::header_bytes + f->body.size() + wire::padding(f->body.size()).size();
      {
        std::lock_guard write_lock(c->write_mutex);
        f->head = sealed_header(*c, type, 0, f->body, encrypted(*c) ? std::span<std::byte>(f->body) : std::span<std::byte>());
      }
      asio::async_write(c->socket, frame_buffers(f->head, f->body), [this, c, f](const asio::error_code& ec, std::size_t) {
        if (ec) lost(c, ec);
      });
    }

    // ---- the training thread ----
    void send(int peer, tag_type tag, std::span<const std::byte> data) {
      decentrain::detail::check(peer >= 0 && peer < opts.capacity(), "tcp: peer ", opts.rank, " cannot send to peer ", peer,
                                " (ranks below ", opts.capacity(), ")");
      decentrain::detail::check(data.size() <= opts.max_frame_bytes, "tcp: a message of ", data.size(),
                                " bytes is over max_frame_bytes = ", opts.max_frame_bytes);
      if (peer == opts.rank) {  // to itself: straight into its own mailbox
        box.push(peer, tag, detail::message{bytes(data.begin(), data.end()), 0.0});
        bytes_sent += data.size();
        ++messages_sent;
        return;
      }
      std::shared_ptr<connection> c;
      {
        std::lock_guard lock(mutex);
        auto it = peers.find(peer);
        if (it == peers.end()) {
          if (const auto closed = box.closure_of(peer))
            transport::fail_peer_because(closed->second, peer, "send", "tcp: peer ", peer, " is gone (", closed->first, ")");
          transport::fail_peer(peer, "send", "tcp: peer ", opts.rank, " is not connected to peer ", peer);
        }
        c = it->second;
      }
      try {
        write_data(*c, tag, data);
      } catch (const transport::peer_error& e) {
        // A send that finds the connection closed or broken can run ahead of the reader, while
        // the peer's goodbye (which says why: "left it out of its view") still waits in the
        // socket; a broken pipe would tell the caller nothing of it (a peer woken from SIGSTOP).
        // The reader records why within moments, once the write lock is free.
        if (e.peer() == peer && e.cause() == failure_cause::other)
          if (const auto closed = closure_soon(peer))
            transport::fail_peer_because(closed->second, peer, "send", "tcp: peer ", peer, " is gone (", closed->first, ")");
        throw;
      }
      bytes_sent += data.size();
      framing_sent += wire::header_bytes + wire::padding(data.size()).size();
      ++messages_sent;
    }

    // The calling thread writes the frame itself (the I/O thread only reads data connections):
    // handing each message to the I/O thread and waiting for it cost two thread switches per
    // message, which on a machine with fewer cores than peers was most of a small all-reduce.
    // Non-blocking writes with poll() keep the send timeout; the I/O thread reads meanwhile, so
    // peers that all send at once still drain each other.
    void write_data(connection& c, tag_type tag, std::span<const std::byte> data) {
      std::lock_guard write_lock(c.write_mutex);
      if (encrypted(c)) {
        // The caller's buffer is not ours to overwrite: the frame is encrypted into one buffer per
        // sending thread (not per connection: a peer with many connections holds one copy of its
        // largest frame, not one per peer). The tag goes in the header, so all of it first.
        static thread_local bytes ciphertext;
        if (ciphertext.size() < data.size()) ciphertext.resize(data.size());
        const auto into = std::span<std::byte>(ciphertext).first(data.size());
        const auto head = sealed_header(c, wire::frame_type::data, tag, data, into);
        return write_sealed(c, tag, head, into);
      }
      write_sealed(c, tag, sealed_header(c, wire::frame_type::data, tag, data, {}), data);
    }

    // Why `peer`'s connection closed, given the I/O thread up to 250 ms to find out (see send).
    std::optional<std::pair<std::string, failure_cause>> closure_soon(int peer) const {
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(250);
      for (;;) {
        if (auto closed = box.closure_of(peer)) return closed;
        if (std::chrono::steady_clock::now() >= until) return std::nullopt;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }

    // write_data's frame once sealed (write_mutex held).
    void write_sealed(connection& c, tag_type tag, const std::array<std::byte, wire::header_bytes>& head,
                      std::span<const std::byte> data) {
      const int peer = c.rank;
      const auto pad = wire::padding(data.size());
      const int fd = c.socket.native_handle();
      // The rest of a heartbeat goes first (see connection::unsent).
      const std::size_t before = c.unsent.size();
      std::array<iovec, 4> parts{iovec{c.unsent.data(), c.unsent.size()},
                                 iovec{const_cast<std::byte*>(head.data()), head.size()},
                                 iovec{const_cast<std::byte*>(data.data()), data.size()},
                                 iovec{const_cast<std::byte*>(pad.data()), pad.size()}};
      std::size_t first = 0, written = 0;
      const auto deadline = std::chrono::steady_clock::now() + opts.recv_timeout;
      auto fail = [&](failure_cause cause, int who, auto&&... why) {
        c.unsent.erase(c.unsent.begin(), c.unsent.begin() + static_cast<std::ptrdiff_t>(std::min(written, before)));
        if (written <= before && c.keys) c.keys->send.unseal();  // the frame never started: its tag is unused
        transport::fail_peer_because(cause, who, "send", why...);
      };
      while (first < parts.size()) {
        if (c.closed_for_writes.load()) {
          if (const auto closed = box.closure_of(peer))
            fail(closed->second, peer, "tcp: peer ", peer, " is gone (", closed->first, ")");
          fail(failure_cause::other, peer, "tcp: connection to peer ", peer, " is closed");
        }
        msghdr msg{};
        msg.msg_iov = parts.data() + first;
        msg.msg_iovlen = parts.size() - first;
        const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
          const int err = errno;
          if (err == EINTR) continue;
          if (err != EAGAIN && err != EWOULDBLOCK)
            fail(failure_cause::other, peer, "tcp: sending to peer ", peer, " failed: ", std::generic_category().message(err));
          // An alarm (transport/membership.hpp) stops a send that has written nothing of its
          // frame yet: its receiver may be the frozen peer. One half written must finish (or time
          // out), or the stream to a live peer would lose its framing.
          if (written <= before && !is_membership_tag(tag))
            if (const auto a = box.alarmed())
              fail(cause_of(*a), a->failed, "tcp: ", describe(*a));
          const auto left = deadline - std::chrono::steady_clock::now();
          if (left <= std::chrono::steady_clock::duration::zero())
            fail(failure_cause::silent, peer, "tcp: sending to peer ", peer, " did not finish within ", opts.recv_timeout.count(), " ms");
          pollfd p{fd, POLLOUT, 0};
          ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(100, std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1)));
          continue;
        }
        auto done = static_cast<std::size_t>(n);
        written += done;
        while (first < parts.size() && done >= parts[first].iov_len) done -= parts[first++].iov_len;
        if (first < parts.size()) {
          parts[first].iov_base = static_cast<std::byte*>(parts[first].iov_base) + done;
          parts[first].iov_len -= done;
        }
      }
      c.unsent.clear();
    }

    bytes recv(int peer, tag_type tag, bool count_wait = true, std::optional<std::chrono::milliseconds> timeout = {}) {
      decentrain::detail::check(peer >= 0 && peer < opts.capacity(), "tcp: peer ", opts.rank, " cannot receive from peer ", peer,
                                " (ranks below ", opts.capacity(), ")");
      const auto t0 = std::chrono::steady_clock::now();
      auto m = box.pop(peer, tag, timeout.value_or(opts.recv_timeout));
      if (count_wait) wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      bytes_received += m.payload.size();
      ++messages_received;
      return std::move(m.payload);
    }

    // Posts `ins` for the messages from `from` before sending `outs`: the I/O thread then reads
    // those bodies straight into `ins` (see mailbox::receive_into).
    void exchange(int to, std::span<const std::span<const std::byte>> outs, int from, std::span<const std::span<std::byte>> ins,
                  tag_type tag, const landed_fn& landed, bool count_wait = true) {
      decentrain::detail::check(from >= 0 && from < opts.capacity(), "tcp: peer ", opts.rank, " cannot receive from peer ", from,
                                " (ranks below ", opts.capacity(), ")");
      auto t0 = std::chrono::steady_clock::now();
      box.receive_into(
          from, tag, ins, opts.recv_timeout,
          [&] {
            if (to >= 0)
              for (const auto& out : outs) send(to, tag, out);
            t0 = std::chrono::steady_clock::now();
          },
          [&] { give_up_on(from, "its message did not finish within the receive timeout"); },
          [&](std::size_t i, std::size_t size) {
            if (count_wait) wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            bytes_received += size;
            ++messages_received;
            landed(i, size);
            t0 = std::chrono::steady_clock::now();
          });
    }

    // From the training thread: closes the connection to `peer` on the I/O thread, which ends a
    // read that is stuck in the middle of that peer's message; with a farewell, tells it why.
    void give_up_on(int peer, std::string why, std::optional<wire::farewell> f = std::nullopt) {
      asio::post(io, [this, peer, why = std::move(why), f = std::move(f)] {
        std::shared_ptr<connection> c;
        {
          std::lock_guard lock(mutex);
          if (auto it = peers.find(peer); it != peers.end()) c = it->second;
        }
        if (!c) return;
        if (f) exclude(c, why, *f);
        else close(c, why);
      });
    }

    // From the training thread: every connection closes with a goodbye saying `reason`; returns
    // once they are written (or after a second, should the I/O thread be stuck).
    void leave(const std::string& reason) {
      auto done = std::make_shared<std::promise<void>>();
      auto written = done->get_future();
      asio::post(io, [this, reason, done] {
        std::vector<std::shared_ptr<connection>> open;
        {
          std::lock_guard lock(mutex);
          for (const auto& [r, c] : peers) open.push_back(c);
        }
        for (const auto& c : open)
          part(c, "this peer left the group", failure_cause::departed, wire::farewell{false, reason});
        done->set_value();
      });
      written.wait_for(std::chrono::seconds(1));
    }

    traffic_stats stats() const {
      traffic_stats s;
      s.bytes_sent = bytes_sent;
      s.framing_bytes_sent = framing_sent;
      s.messages_sent = messages_sent;
      s.bytes_received = bytes_received;
      s.messages_received = messages_received;
      s.wait_seconds = wait_seconds;
      {
        std::lock_guard lock(mutex);
        s.malformed_frames = malformed_frames;
        s.rejected_frames = admitted.refused + admitted.bad_tags;
      }
      s.clock_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      return s;
    }

    tcp_options opts;
#if DECENTRAIN_HAS_TLS
    std::shared_ptr<asio::ssl::context> tls_context;  // null without TLS
#endif
    asio::io_context io;
    std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work{asio::make_work_guard(io)};
    asio::ip::tcp::acceptor acceptor;
    std::chrono::steady_clock::time_point started;
    std::string advertised;
    std::thread io_thread;
    asio::steady_timer beat_timer{io};
    asio::steady_timer sweep_timer{io};   // closes strangers past their handshake deadline
    asio::steady_timer accept_timer{io};  // the pause after a failed accept
    std::chrono::milliseconds accept_pause{10};
    std::optional<clock::time_point> last_beat;  // I/O thread only
    bool stopping = false;                       // I/O thread only

    mutable std::mutex mutex;              // guards directory, peers, formed, late, malformed counters
    std::condition_variable changed;       // a peer connected
    std::map<int, std::string> directory;
    std::size_t rediscover_turn = 0;    // training thread only
    std::map<int, std::shared_ptr<connection>> peers;
    std::set<int> ever_connected;  // ranks that have had a connection here (for admitted.reconnected)
    bool formed = false;           // the mesh of this peer's group is complete (it may be running)
    bool late = false;             // this peer joined a running group
    std::string refusal;           // why this peer cannot join at all (its rank is taken, a wrong key)
    int unproven_refusals = 0;     // refusals heard before any proof (see handshake)
    std::set<std::shared_ptr<connection>> all;  // I/O thread only
    std::uint64_t malformed_frames = 0;
    std::string last_malformed;
    admission_stats admitted;      // under mutex
    int pending_now = 0;           // under mutex
    detail::mailbox box;

    // Payload bytes, as for every transport (framing adds 24 bytes a message). Atomic: the
    // training thread and a lane's background collective (see lane()) both count here.
    std::atomic<std::uint64_t> bytes_sent = 0, messages_sent = 0, bytes_received = 0, messages_received = 0;
    std::atomic<std::uint64_t> framing_sent = 0;  // headers, padding and control frames (traffic_stats)
    std::atomic<double> wait_seconds = 0;
  };

  std::shared_ptr<impl> self_;
  bool lane_ = false;  // a lane's waits are not the caller's
};

static_assert(membership_endpoint<tcp>);
static_assert(joining_endpoint<tcp>);

}  // namespace decentrain::transport

#endif  // DECENTRAIN_HAS_ASIO
