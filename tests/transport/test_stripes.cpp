// Striped messages (tcp_options::streams, tcp/stripes.hpp): a message goes over several
// connections of a pair at once and lands whole, in the order sent, among messages that do not;
// hostile pieces and streams are named and dropped. Everything binds to 127.0.0.1 and is
// bounded in time. (The conformance suite runs its cases striped too: harness::tcp_striped.)
#include <catch2/catch.hpp>

#include "bounded_read.hpp"
#include "reset_connection.hpp"
#include "support/transport_harness.hpp"

#include <decentrain/decentrain.hpp>

#include <asio.hpp>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace dt = decentrain;
namespace tr = dt::transport;
namespace wire = dt::transport::wire;
using namespace std::chrono_literals;

namespace {

tr::bytes striped_pattern(std::size_t size, int from, int index) {
  tr::bytes m(size);
  for (std::size_t i = 0; i < size; ++i) m[i] = static_cast<std::byte>((i * 131 + static_cast<std::size_t>(from * 7 + index * 3)) & 0xff);
  return m;
}

// The dialer of a pair opens its further streams once the first connection stands, and its
// acceptor registers them as they come: waits (10 s at most) until every pair has `want`
// connections here, then for the other peers, so that what follows is striped from the start.
void striped_wait(tr::tcp& ep, int want) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  for (int p = 0; p < ep.world(); ++p)
    while (p != ep.rank() && ep.streams_to(p) < want && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(2ms);
  dt::collective::communicator(ep).barrier();
}

void striped_options(tr::tcp_options& o) {
  o.streams = 4;
  o.stripe_min_bytes = std::uint64_t{64} << 10;
  o.stripe_piece_bytes = std::uint64_t{16} << 10;
}

// What each peer of a striped run saw: its streams to the others, the messages that came wrong,
// an all-reduce's result, and its traffic.
struct striped_run {
  std::vector<std::vector<int>> streams;
  std::vector<int> wrong;
  std::vector<std::vector<float>> reduced;
  std::vector<tr::traffic_stats> stats;
  std::vector<std::string> errors;
};

// Three peers; each sends each other one message sizes of which some are striped, all under one
// tag, alternating with small ones, then receives the other's in order (queued: nobody posted
// memory for them), then all-reduces 1 Mi floats (its exchanges land in posted memory).
striped_run run_striped(const std::string& key, const std::string& tls_dir = {}) {
  constexpr int world = 3;
  const std::vector<std::size_t> sizes{100, std::size_t{64} << 10, 7, (std::size_t{1} << 20) + 4097, std::size_t{200} << 10,
                                       0, std::size_t{64} << 10 | 1, 3000};
  striped_run out;
  out.streams.resize(world);
  out.wrong.assign(world, -1);
  out.reduced.resize(world);
  out.stats.resize(world);
  const auto errors = harness::tcp::run_each(world, [&](tr::tcp_options& o) {
    striped_options(o);
    o.key = key;
    if (!tls_dir.empty()) {
      const auto stem = tls_dir + "/rank-" + std::to_string(o.rank);
      o.tls = {stem + ".pem", stem + ".key", tls_dir + "/ca.pem", false};
    }
  }, [&](tr::tcp& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    striped_wait(ep, 4);
    for (int p = 0; p < world; ++p) out.streams[r].push_back(ep.streams_to(p));
    for (int p = 0; p < world; ++p)
      if (p != ep.rank())
        for (std::size_t i = 0; i < sizes.size(); ++i) ep.send(p, 5, striped_pattern(sizes[i], ep.rank(), static_cast<int>(i)));
    int wrong = 0;
    for (int p = 0; p < world; ++p)
      if (p != ep.rank())
        for (std::size_t i = 0; i < sizes.size(); ++i) wrong += ep.recv(p, 5) != striped_pattern(sizes[i], p, static_cast<int>(i));
    out.wrong[r] = wrong;
    std::vector<float> v(std::size_t{1} << 20);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 13 + r * 5) % 97);
    dt::collective::communicator(ep).all_reduce(std::span<float>(v));
    out.reduced[r] = std::move(v);
    out.stats[r] = ep.stats();
  });
  for (const auto& e : errors) out.errors.push_back(harness::tcp::what(e));
  return out;
}

// A frame as a peer without keys writes it: header, body, padding.
void striped_write(asio::ip::tcp::socket& s, wire::frame_type type, tr::tag_type tag, const tr::bytes& body) {
  const auto head = wire::encode_header({type, tag, body.size(), {}});
  std::vector<std::byte> f(head.begin(), head.end());
  f.insert(f.end(), body.begin(), body.end());
  const auto pad = wire::padding(body.size());
  f.insert(f.end(), pad.begin(), pad.end());
  asio::write(s, asio::buffer(f));
}

// A caller without credentials that says it is peer `rank` (stream `stream` of its pair), and
// what the peer answered: a welcome, or a goodbye's reason.
struct striped_caller {
  asio::ip::tcp::socket socket;
  wire::frame_type answer = wire::frame_type::bye;
  std::string reason;
};

striped_caller striped_call(asio::io_context& io, const std::string& address, int rank, int world, std::uint8_t stream) {
  const auto [host, port] = wire::split_address(address);
  striped_caller c{asio::ip::tcp::socket(io), {}, {}};
  c.socket.connect({asio::ip::make_address(host), port});
  wire::hello h;
  h.rank = rank;
  h.world = world;
  h.stream = stream;
  striped_write(c.socket, wire::frame_type::hello, 0, wire::encode_body(h));
  std::array<std::byte, wire::header_bytes> in{};
  REQUIRE(!bench::read_within(c.socket, asio::buffer(in), 10s));
  const auto got = wire::decode_header(in.data(), wire::max_control_bytes);
  c.answer = got.type;
  tr::bytes answer_body(got.length + wire::padding(got.length).size());
  REQUIRE(!bench::read_within(c.socket, asio::buffer(answer_body), 10s));
  answer_body.resize(got.length);
  if (got.type == wire::frame_type::bye && !answer_body.empty())
    c.reason = wire::decode_body<wire::farewell>(answer_body, "goodbye").reason;
  return c;
}

// A lone peer 0 of two, with four streams a pair, for callers without credentials.
tr::tcp_options striped_listener_options() {
  tr::tcp_options o;
  o.world = 2;
  o.join_timeout = 10s;
  o.recv_timeout = 10s;
  striped_options(o);
  return o;
}

// A caller that says it is peer 1: its first connection and one further stream, both taken.
struct striped_callers {
  striped_caller first, stream;
};
striped_callers striped_call_with_stream(asio::io_context& io, tr::tcp& peer0) {
  striped_callers c{striped_call(io, peer0.address(), 1, 2, 0), striped_call(io, peer0.address(), 1, 2, 1)};
  REQUIRE(c.first.answer == wire::frame_type::welcome);
  REQUIRE(c.stream.answer == wire::frame_type::welcome);
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (peer0.streams_to(1) != 2 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(2ms);
  REQUIRE(peer0.streams_to(1) == 2);
  return c;
}

// Reads and drops what comes until the socket ends (its owner shuts it down), pausing after each
// read of at most `chunk` bytes; the bytes read.
std::uint64_t striped_drain(asio::ip::tcp::socket& s, std::size_t chunk, std::chrono::milliseconds pause) {
  std::vector<std::byte> sink(chunk);
  std::uint64_t got = 0;
  asio::error_code ec;
  while (!ec) {
    got += s.read_some(asio::buffer(sink), ec);
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
  }
  return got;
}

// One peer's connections to the other, handed to the other peer's thread (the network barrier
// between them orders the two in time, not for the memory model: hence the lock).
struct striped_ports {
  std::mutex mutex;
  std::vector<tr::stream_ports> ports;
  void publish(tr::tcp& ep, int peer) {
    std::lock_guard lock(mutex);
    ports = ep.stream_ports_to(peer);
  }
  std::vector<tr::stream_ports> get() {
    std::lock_guard lock(mutex);
    return ports;
  }
};

// Waits (`within` at most) until this peer has `want` connections to `peer`; how many it has.
int striped_until(tr::tcp& ep, int peer, int want, std::chrono::milliseconds within) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (ep.streams_to(peer) != want && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(2ms);
  return ep.streams_to(peer);
}

// Waits (until `until` at most) for the other peer's thread to say it started; whether it did.
bool striped_started(const std::atomic<bool>& started, std::chrono::steady_clock::time_point until) {
  while (!started && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  return started;
}

// Waits (until `until` at most) until every one of these connections of this process holds
// bytes its peer has not taken (SIOCOUTQ): a write over all of them waits on a receiver that
// reads none. False if that did not come.
bool striped_all_queued(const std::vector<tr::stream_ports>& connections, std::chrono::steady_clock::time_point until) {
  while (std::chrono::steady_clock::now() < until) {
    std::size_t queued_on = 0;
    for (const auto& p : connections) {
      const int fd = bench::find_connection(p.local, p.remote);
      int queued = 0;
      queued_on += fd >= 0 && ::ioctl(fd, SIOCOUTQ, &queued) == 0 && queued > 0;
    }
    if (queued_on == connections.size() && !connections.empty()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

// Reads frames from a peer's first connection (a caller without keys) until its landed frames
// named `want` pieces, or `within` passed; other frames (heartbeats) are skipped.
std::vector<wire::piece_id> striped_landed(asio::ip::tcp::socket& s, std::size_t want, std::chrono::milliseconds within) {
  std::vector<wire::piece_id> ids;
  const auto until = std::chrono::steady_clock::now() + within;
  while (ids.size() < want && std::chrono::steady_clock::now() < until) {
    std::array<std::byte, wire::header_bytes> in{};
    if (bench::read_within(s, asio::buffer(in), std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now())))
      break;
    const auto h = wire::decode_header(in.data(), wire::max_control_bytes);
    tr::bytes body(h.length + wire::padding(h.length).size());
    if (bench::read_within(s, asio::buffer(body), 10s)) break;
    body.resize(h.length);
    if (h.type != wire::frame_type::landed) continue;
    for (const auto& id : wire::decode_landed(body)) ids.push_back(id);
  }
  return ids;
}

}  // namespace

TEST_CASE("tcp streams: messages striped over four connections land whole, in order among the others, queued or posted") {
  // Plain, with a run key (each connection's frames tagged under its own keys), and with TLS (each
  // connection's pieces encrypted under its own): certificates from scripts/tls_certs.
  const auto certificates = std::filesystem::temp_directory_path() / ("decentrain-stripes-tls-" + std::to_string(::getpid()));
  std::filesystem::remove_all(certificates);
  const struct removed_after {
    std::filesystem::path d;
    ~removed_after() {
      std::error_code ignored;
      std::filesystem::remove_all(d, ignored);
    }
  } cleanup{certificates};
  const auto made = std::system(("bash " DECENTRAIN_SOURCE_DIR "/scripts/tls_certs " + certificates.string() + " 3 --days 2 >/dev/null").c_str());
  REQUIRE(made == 0);
  for (int mode = 0; mode < 3; ++mode) {
    INFO((mode == 0 ? "without a run key" : mode == 1 ? "with a run key" : "with TLS"));
    const auto run = run_striped(mode == 1 ? "a run key of thirty-two bytes..." : "", mode == 2 ? certificates.string() : "");
    for (const auto& e : run.errors) CHECK(e == "");
    REQUIRE(run.reduced.size() == 3);
    for (int r = 0; r < 3; ++r) {
      const auto u = static_cast<std::size_t>(r);
      for (int p = 0; p < 3; ++p) CHECK(run.streams[u][static_cast<std::size_t>(p)] == (p == r ? 0 : 4));
      CHECK(run.wrong[u] == 0);
      CHECK(run.reduced[u] == run.reduced[0]);
      // Four messages to each of two peers are over stripe_min_bytes, and the all-reduce's pieces
      // of 1 Mi floats / 3 (1.4 MB) are too.
      CHECK(run.stats[u].striped_sent >= 8);
      CHECK(run.stats[u].striped_received >= 8);
    }
    for (std::size_t i = 0; i < run.reduced[0].size(); i += 997) {
      float want = 0;
      for (std::size_t r = 0; r < 3; ++r) want += static_cast<float>((i * 13 + r * 5) % 97);
      REQUIRE(run.reduced[0][i] == want);
    }
  }
}

TEST_CASE("tcp streams: striped messages past the receiver's budget wait for room and land in order") {
  // Peer 1 streams six messages of 700 KB (striped) at peer 0, whose budget holds one of them:
  // each next one waits at its stripe frame, its pieces on the other streams waiting with it,
  // until peer 0 takes one; peer 0 starts taking them only after a while.
  constexpr int world = 2, count = 6;
  constexpr std::size_t size = 700000;
  std::vector<int> wrong(world, -1);
  std::uint64_t striped = 0;
  const auto errors = harness::tcp::run_each(world, [](tr::tcp_options& o) {
    striped_options(o);
    o.max_frame_bytes = std::uint64_t{1} << 20;
    o.max_queued_bytes = std::uint64_t{1} << 20;
  }, [&](tr::tcp& ep) {
    striped_wait(ep, 4);
    if (ep.rank() == 1) {
      for (int i = 0; i < count; ++i) ep.send(0, 9, striped_pattern(size, 1, i));
      wrong[1] = 0;
    } else {
      std::this_thread::sleep_for(300ms);
      int bad = 0;
      for (int i = 0; i < count; ++i) bad += ep.recv(1, 9) != striped_pattern(size, 1, i);
      wrong[0] = bad;
      striped = ep.stats().striped_received;
    }
  });
  for (const auto& e : errors) CHECK(harness::tcp::what(e) == "");
  CHECK(wrong == std::vector<int>{0, 0});
  CHECK(striped == count);
}

TEST_CASE("tcp streams: a peer that takes fewer streams keeps the pair to its number, and messages go as before") {
  constexpr int world = 2;
  std::vector<int> streams(world), wrong(world, -1);
  std::vector<tr::traffic_stats> stats(world);
  const auto errors = harness::tcp::run_each(world, [](tr::tcp_options& o) {
    striped_options(o);
    if (o.rank == 0) o.streams = 2;  // peer 1 dials it and asks for three more: it takes one
  }, [&](tr::tcp& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    striped_wait(ep, 2);
    streams[r] = ep.streams_to(1 - ep.rank());
    ep.send(1 - ep.rank(), 1, striped_pattern(std::size_t{1} << 20, ep.rank(), 0));
    wrong[r] = ep.recv(1 - ep.rank(), 1) != striped_pattern(std::size_t{1} << 20, 1 - ep.rank(), 0);
    stats[r] = ep.stats();
  });
  for (const auto& e : errors) CHECK(harness::tcp::what(e) == "");
  CHECK(streams == std::vector<int>{2, 2});
  CHECK(wrong == std::vector<int>{0, 0});
  CHECK(stats[0].striped_sent == 1);
  CHECK(stats[1].striped_received == 1);
}

TEST_CASE("tcp streams: pieces and streams a peer may not send close its connection, named, and the peer takes others after") {
  // Peer 0 listens with four streams a pair; callers without credentials say they are peer 1
  // and send what no honest peer sends. Each is dropped with a reason that names it.
  const auto o = striped_listener_options();
  tr::tcp peer0(o);
  const auto address = peer0.address();
  asio::io_context io;
  const auto head = [](std::uint64_t seq, std::uint64_t total, std::uint64_t piece) {
    return wire::encode_stripe_head({seq, total, piece});
  };
  const auto piece_tag = [](std::uint64_t seq, std::uint64_t index) { return wire::encode_piece_id({seq, index}); };
  struct attack {
    std::string name;
    std::function<void(asio::ip::tcp::socket&)> send;
    std::string named;
  };
  const std::vector<attack> attacks{
      {"a piece of a message never announced",
       [&](auto& s) { striped_write(s, wire::frame_type::piece, piece_tag(1, 0), tr::bytes(4096)); }, "which is not one it is sending (0 open, the last announced 0)"},
      {"a message numbered out of turn",
       [&](auto& s) { striped_write(s, wire::frame_type::stripe, 9, head(2, 8192, 4096)); }, "sent striped message 2 after message 0"},
      {"a message over max_frame_bytes",
       [&](auto& s) { striped_write(s, wire::frame_type::stripe, 9, head(1, o.max_frame_bytes + 1, 4096)); }, "a striped message of"},
      {"pieces that are not 64-byte multiples",
       [&](auto& s) { striped_write(s, wire::frame_type::stripe, 9, head(1, 8192, 4100)); }, "multiples of 64"},
      {"pieces so large that counting them wraps",  // (a fuzz finding: the message counted 0 pieces, landed unread)
       [&](auto& s) { striped_write(s, wire::frame_type::stripe, 9, head(1, 8192, ~std::uint64_t{63})); }, "multiples of 64 from 4096 to"},
      {"a piece past the message's last",
       [&](auto& s) {
         striped_write(s, wire::frame_type::stripe, 9, head(1, 8192, 4096));
         striped_write(s, wire::frame_type::piece, piece_tag(1, 2), tr::bytes(4096));
       },
       "piece 2 (4096 bytes) of striped message 1"},
      {"a piece of another length",
       [&](auto& s) {
         striped_write(s, wire::frame_type::stripe, 9, head(1, 6000, 4096));
         striped_write(s, wire::frame_type::piece, piece_tag(1, 1), tr::bytes(4096));
       },
       "piece 1 (4096 bytes)"},
      {"a streams frame from the pair's dialer (its acceptor asks; the dialer opens them)",
       [&](auto& s) { striped_write(s, wire::frame_type::streams, 4, {}); }, "asked for 4 connections a pair in a streams frame, but it dialed the pair"},
      {"a streams frame asking for 17 connections",
       [&](auto& s) { striped_write(s, wire::frame_type::streams, 17, {}); }, "a streams frame asking for 17 connections"},
      {"a streams frame with a body",
       [&](auto& s) { striped_write(s, wire::frame_type::streams, 2, tr::bytes(8)); }, "with a body of 8 bytes"},
  };
  std::vector<std::string> last(attacks.size());
  std::vector<std::uint64_t> counted(attacks.size());
  std::vector<bool> closed(attacks.size());
  for (std::size_t i = 0; i < attacks.size(); ++i) {
    auto c = striped_call(io, address, 1, 2, 0);
    REQUIRE(c.answer == wire::frame_type::welcome);
    attacks[i].send(c.socket);
    closed[i] = bench::closed_within(c.socket, 10s);
    last[i] = peer0.last_malformed();
    counted[i] = peer0.stats().malformed_frames;
  }
  for (std::size_t i = 0; i < attacks.size(); ++i) {
    INFO(attacks[i].name << ": " << last[i]);
    CHECK(closed[i]);
    CHECK(last[i].find(attacks[i].named) != std::string::npos);
    CHECK(counted[i] == i + 1);
  }

  // Two streams reading the same piece at once (a sender sends a piece again once it gave the
  // stream that carried it up, which this end may not know yet): the second copy is kept aside,
  // never read into the place the first still writes into, and lands when the first's stream is
  // lost midway. (Or, read after the second copy landed, the first is read aside and dropped.)
  {
    auto f = striped_call(io, address, 1, 2, 0);
    REQUIRE(f.answer == wire::frame_type::welcome);
    auto a = striped_call(io, address, 1, 2, 1);
    auto b = striped_call(io, address, 1, 2, 2);
    REQUIRE(a.answer == wire::frame_type::welcome);
    REQUIRE(b.answer == wire::frame_type::welcome);
    const auto lost_before = peer0.stats().streams_lost;
    const auto two = striped_pattern(8192, 1, 7);
    striped_write(f.socket, wire::frame_type::stripe, 3, head(1, two.size(), 4096));
    const auto half = wire::encode_header({wire::frame_type::piece, piece_tag(1, 0), 4096, {}});
    asio::write(a.socket, asio::buffer(half));
    asio::write(a.socket, asio::buffer(tr::bytes(1000)));
    std::this_thread::sleep_for(200ms);  // (time for peer 0 to start on stream 1's piece: either way it lands right)
    striped_write(b.socket, wire::frame_type::piece, piece_tag(1, 0), tr::bytes(two.begin(), two.begin() + 4096));
    striped_write(f.socket, wire::frame_type::piece, piece_tag(1, 1), tr::bytes(two.begin() + 4096, two.end()));
    a.socket.close();
    CHECK(peer0.recv(1, 3) == two);
    const auto counted = std::chrono::steady_clock::now() + 10s;
    while (peer0.stats().streams_lost == lost_before && std::chrono::steady_clock::now() < counted) std::this_thread::sleep_for(2ms);
    CHECK(peer0.stats().streams_lost == lost_before + 1);
    CHECK(peer0.streams_to(1) == 2);
    f.socket.close();
    const auto gone = std::chrono::steady_clock::now() + 10s;
    while (peer0.streams_to(1) != 0 && std::chrono::steady_clock::now() < gone) std::this_thread::sleep_for(2ms);
  }

  // Streams: one past the peer's number, one for a rank with no connection here, a second of one
  // number, are refused; one that sends a data frame is dropped, and the pair with it.
  auto refused_past = striped_call(io, address, 1, 2, 4);
  CHECK(refused_past.answer == wire::frame_type::bye);
  CHECK(refused_past.reason.find("takes at most 4 connections a pair") != std::string::npos);
  const auto alone = std::chrono::steady_clock::now() + 10s;  // (the pair just dropped leaves the list a moment later)
  while (peer0.streams_to(1) != 0 && std::chrono::steady_clock::now() < alone) std::this_thread::sleep_for(2ms);
  auto no_first = striped_call(io, address, 1, 2, 1);
  CHECK(no_first.answer == wire::frame_type::bye);
  CHECK(no_first.reason.find("no direct connection from a member of rank 1") != std::string::npos);
  auto first = striped_call(io, address, 1, 2, 0);
  REQUIRE(first.answer == wire::frame_type::welcome);
  auto stream = striped_call(io, address, 1, 2, 2);
  CHECK(stream.answer == wire::frame_type::welcome);
  auto again = striped_call(io, address, 1, 2, 2);
  CHECK(again.answer == wire::frame_type::bye);
  CHECK(again.reason.find("has a stream 2 from peer 1 already") != std::string::npos);
  CHECK(peer0.streams_to(1) == 2);
  striped_write(stream.socket, wire::frame_type::data, 3, tr::bytes(8));
  CHECK(bench::closed_within(stream.socket, 10s));
  CHECK(peer0.last_malformed().find("on its stream 2, which carries pieces of striped messages only") != std::string::npos);
  CHECK(bench::closed_within(first.socket, 10s));
  CHECK_THROWS_WITH(peer0.recv(1, 3), Catch::Contains("its stream 2 closed: it sent a malformed frame"));

  // A stream its peer closes between frames leaves the pair with the others (that peer closes
  // the pair itself if it means to): a message striped over the first connection and a stream
  // opened anew lands whole, its last piece read before its stripe frame. Peer 0 says which
  // pieces of the streams landed (landed frames on the first connection), so that their sender
  // need keep no copy of them.
  auto again_first = striped_call(io, address, 1, 2, 0);
  REQUIRE(again_first.answer == wire::frame_type::welcome);
  auto third = striped_call(io, address, 1, 2, 3);
  REQUIRE(third.answer == wire::frame_type::welcome);
  third.socket.close();
  auto fresh = striped_call(io, address, 1, 2, 1);
  REQUIRE(fresh.answer == wire::frame_type::welcome);
  const auto big = striped_pattern(3 * 4096 + 100, 1, 1);
  const auto piece_of = [&](std::size_t i) {
    return tr::bytes(big.begin() + static_cast<std::ptrdiff_t>(i * 4096),
                     big.begin() + static_cast<std::ptrdiff_t>(std::min(big.size(), (i + 1) * 4096)));
  };
  striped_write(fresh.socket, wire::frame_type::piece, piece_tag(1, 3), piece_of(3));
  std::this_thread::sleep_for(100ms);
  striped_write(again_first.socket, wire::frame_type::stripe, 3, head(1, big.size(), 4096));
  striped_write(again_first.socket, wire::frame_type::piece, piece_tag(1, 0), piece_of(0));
  striped_write(fresh.socket, wire::frame_type::piece, piece_tag(1, 1), piece_of(1));
  striped_write(again_first.socket, wire::frame_type::piece, piece_tag(1, 2), piece_of(2));
  CHECK(peer0.recv(1, 3) == big);
  CHECK(peer0.stats().striped_received == 2);
  auto said = striped_landed(again_first.socket, 2, 10s);
  std::sort(said.begin(), said.end(), [](const auto& x, const auto& y) { return x.index < y.index; });
  CHECK(said == std::vector<wire::piece_id>{{1, 1}, {1, 3}});

  // A piece that comes again after its message landed (its landed frame was on its way when its
  // sender gave its stream up) is read and dropped, however old the message.
  const auto twice_before = peer0.stats().pieces_twice;
  striped_write(again_first.socket, wire::frame_type::piece, piece_tag(1, 1), piece_of(1));
  const auto settled = std::chrono::steady_clock::now() + 10s;
  while (peer0.stats().pieces_twice == twice_before && std::chrono::steady_clock::now() < settled) std::this_thread::sleep_for(2ms);
  CHECK(peer0.stats().pieces_twice == twice_before + 1);
  CHECK(peer0.streams_to(1) == 2);

  // A stream that closes with a piece on its way is lost, not the pair: the piece is expected
  // again, and lands when it comes over another connection.
  const auto lost_before = peer0.stats().streams_lost;
  const auto next = striped_pattern(8192, 1, 2);
  striped_write(again_first.socket, wire::frame_type::stripe, 3, head(2, next.size(), 4096));
  const auto cut = wire::encode_header({wire::frame_type::piece, piece_tag(2, 1), 4096, {}});
  asio::write(fresh.socket, asio::buffer(cut));
  asio::write(fresh.socket, asio::buffer(tr::bytes(1000)));
  fresh.socket.close();
  const auto dropped = std::chrono::steady_clock::now() + 10s;
  while (peer0.streams_to(1) != 1 && std::chrono::steady_clock::now() < dropped) std::this_thread::sleep_for(2ms);
  CHECK(peer0.streams_to(1) == 1);
  CHECK(peer0.stats().streams_lost == lost_before + 1);
  striped_write(again_first.socket, wire::frame_type::piece, piece_tag(2, 0), tr::bytes(next.begin(), next.begin() + 4096));
  striped_write(again_first.socket, wire::frame_type::piece, piece_tag(2, 1), tr::bytes(next.begin() + 4096, next.end()));
  CHECK(peer0.recv(1, 3) == next);

}

TEST_CASE("tcp streams: landed frames for pieces not sent yet, or never, change nothing at their sender") {
  // A caller without credentials says it is peer 1 and opens a further stream; peer 0 stripes
  // 32 MiB at it. Told of the message by its stripe frame, the caller says every piece of it and
  // of the next landed at once, and ids that name nothing, while the write is under way; then
  // it reads everything. The write ends as it would have, and peer 0 goes on.
  tr::tcp peer0(striped_listener_options());
  asio::io_context io;
  auto callers = striped_call_with_stream(io, peer0);
  auto& f = callers.first;
  auto& s1 = callers.stream;
  const auto until = std::chrono::steady_clock::now() + 10s;
  constexpr std::size_t size = std::size_t{32} << 20;  // (more than the two connections' buffers hold)
  std::string failed = "(not ended)";
  std::thread sender([&] {
    try {
      peer0.send(1, 5, striped_pattern(size, 0, 0));
      failed.clear();
    } catch (const std::exception& e) {
      failed = e.what();
    }
  });
  // (the first connection's frames until the stripe frame: the caller reads nothing else yet,
  // so the write waits on its sockets)
  std::optional<wire::stripe_head> told;
  while (!told && std::chrono::steady_clock::now() < until) {
    std::array<std::byte, wire::header_bytes> in{};
    if (bench::read_within(f.socket, asio::buffer(in), 10s)) break;
    const auto h = wire::decode_header(in.data(), std::uint64_t{1} << 30);
    tr::bytes body(h.length + wire::padding(h.length).size());
    if (bench::read_within(f.socket, asio::buffer(body), 10s)) break;
    body.resize(h.length);
    if (h.type == wire::frame_type::stripe) told = wire::decode_stripe_head(body, std::uint64_t{1} << 30);
  }
  REQUIRE(told);
  std::vector<tr::tag_type> ids;
  for (std::uint64_t seq = told->seq; seq <= told->seq + 1; ++seq)
    for (std::uint64_t i = 0; i < told->pieces() + 3; ++i) ids.push_back(wire::encode_piece_id({seq, i}));
  striped_write(f.socket, wire::frame_type::landed, 0, wire::encode_landed(ids));
  // (then everything is read, on both connections, until peer 0 closes them)
  std::uint64_t drained0 = 0, drained1 = 0;
  std::thread d0([&] { drained0 = striped_drain(f.socket, 1 << 16, 0ms); }), d1([&] { drained1 = striped_drain(s1.socket, 1 << 16, 0ms); });
  sender.join();
  const auto stats = peer0.stats();
  asio::error_code ignored;
  f.socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  s1.socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  d0.join();
  d1.join();
  CHECK(failed == "");
  CHECK(stats.striped_sent == 1);
  CHECK(drained0 + drained1 >= size);
}

TEST_CASE("tcp streams: a peer that never says pieces landed holds its sender up at twice its budget, not its memory") {
  // A caller without credentials says it is peer 1, opens a further stream and reads all peer 0
  // sends, but never says a piece landed. Peer 0 keeps what went over the stream until then, up
  // to 2 x max_queued_bytes (2 MiB here) a pair: its striped sends of 1 MiB stop there, and the
  // one that waits fails at its deadline.
  auto o = striped_listener_options();
  o.recv_timeout = 2s;
  o.max_frame_bytes = std::uint64_t{1} << 20;
  o.max_queued_bytes = std::uint64_t{1} << 20;
  tr::tcp peer0(o);
  asio::io_context io;
  auto callers = striped_call_with_stream(io, peer0);
  auto& f = callers.first;
  auto& s1 = callers.stream;
  // (the first connection read slowly, about 3 MB/s, as a slow link would carry it, so that the
  // stream takes most pieces: on loopback the first would take them all)
  std::thread d0([&] { (void)striped_drain(f.socket, 16 << 10, 5ms); }), d1([&] { (void)striped_drain(s1.socket, 1 << 16, 0ms); });
  int sent = 0;
  std::string failed;
  for (; sent < 16; ++sent) {
    try {
      peer0.send(1, 5, striped_pattern(std::size_t{1} << 20, 0, sent));
    } catch (const std::exception& e) {
      failed = e.what();
      break;
    }
  }
  asio::error_code ignored;
  f.socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  s1.socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  d0.join();
  d1.join();
  INFO("sent " << sent << " MiB before: " << failed);
  // (each send holds what of it went over the stream, most of it: all 16 went through before
  // the bound was kept)
  CHECK(sent >= 2);
  CHECK(sent < 16);
  CHECK(failed.find("did not finish within 2000 ms") != std::string::npos);
}

TEST_CASE("tcp streams: a message whose stream is cut midway lands whole over the others, and the pair goes on") {
  // Peer 1 stripes 48 MiB at peer 0, whose budget a message nobody takes yet filled (1 KiB, on
  // the first connection ahead of the stripe frame) and which posts nothing until its receive:
  // peer 1's write fills every connection and waits. Then one stream is reset (its
  // buffers dropped, as a middlebox that resets it would): at peer 0's end, at peer 1's, and at
  // peer 1's with a run key. What that stream held goes again over the others, the message lands
  // whole, a message after it goes on, and peer 1, the pair's dialer, dials the lost stream again.
  constexpr std::size_t size = std::size_t{48} << 20, after = std::size_t{8} << 20;
  for (int mode = 0; mode < 3; ++mode) {
    const bool sender_end = mode >= 1;
    INFO((mode == 0 ? "peer 0's end" : mode == 1 ? "peer 1's end" : "peer 1's end, with a run key"));
    striped_ports ports_of_1;  // (peer 1's view, written before the barrier)
    bool cut = false, sending = false, filled = false;
    std::atomic<bool> started{false};
    std::vector<int> wrong(2, -1), streams(2, -1);
    std::vector<tr::traffic_stats> stats(2);
    const auto errors = harness::tcp::run_each(2, [&](tr::tcp_options& o) {
      o.streams = 4;
      o.stripe_min_bytes = std::uint64_t{256} << 10;
      o.stripe_piece_bytes = std::uint64_t{256} << 10;
      o.max_frame_bytes = size;
      o.max_queued_bytes = size;
      if (mode == 2) o.key = "a run key of thirty-two bytes...";
    }, [&](tr::tcp& ep) {
      const auto r = static_cast<std::size_t>(ep.rank());
      striped_wait(ep, 4);
      if (ep.rank() == 1) ports_of_1.publish(ep, 0);
      dt::collective::communicator(ep).barrier();
      if (ep.rank() == 1) {
        ep.send(0, 6, striped_pattern(1024, 1, 9));
        started = true;
        ep.send(0, 7, striped_pattern(size, 1, 0));
        ep.send(0, 8, striped_pattern(after, 1, 1));
        wrong[r] = 0;
      } else {
        const auto until = std::chrono::steady_clock::now() + 10s;
        sending = striped_started(started, until);
        // (until peer 1's write put bytes in every connection that peer 0 has not taken)
        const auto mine = ep.stream_ports_to(1);
        const auto theirs = ports_of_1.get();
        filled = striped_all_queued(theirs, until);
        const auto& at = sender_end ? theirs : mine;
        if (at.size() == 4) cut = bench::reset_connection(at[2].local, at[2].remote);
        int bad = ep.recv(1, 6) != striped_pattern(1024, 1, 9);  // (room for the next: it goes on)
        bad += ep.recv(1, 7) != striped_pattern(size, 1, 0);
        bad += ep.recv(1, 8) != striped_pattern(after, 1, 1);
        wrong[r] = bad;
      }
      dt::collective::communicator(ep).barrier();
      streams[r] = striped_until(ep, 1 - ep.rank(), 4, 10s);
      stats[r] = ep.stats();
    });
    for (const auto& e : errors) CHECK(harness::tcp::what(e) == "");
    CHECK(sending);
    CHECK(filled);
    CHECK(cut);
    CHECK(wrong == std::vector<int>{0, 0});
    CHECK(streams == std::vector<int>{4, 4});
    for (const auto& st : stats) CHECK(st.streams_lost == 1);
    CHECK(stats[1].streams_opened == 4);  // (three at the start, the lost one again)
    CHECK(stats[0].streams_opened == 0);
    CHECK(stats[1].pieces_resent >= 1);
    CHECK(stats[1].striped_sent == 2);
    CHECK(stats[0].striped_received == 2);
  }
}

TEST_CASE("tcp streams: pieces of a write that returned are kept until said landed, and go again when their stream is cut") {
  // Peer 0 stripes 32 MiB at peer 1, whose budget a 1 KiB message nobody takes yet filled: its
  // write fills every connection and waits, holding the pair's first connection, so the landed
  // frames peer 0 owes wait too (and peer 1 would not read them: its first connection waits at
  // that message). Meanwhile peer 1 stripes 6 MiB at peer 0, which reads it (the first
  // connection's send buffer made small, as a slow link's would be, so that the further streams
  // take pieces: on loopback the first would take them all): peer 1's write returns with none of
  // its pieces over further streams said landed, and peer 1 keeps copies. Peer 1 then resets its
  // ends of the three further streams: what went over them goes again over the first connection,
  // from peer 1's thread for that (its sending thread waits in a receive), whether peer 0 had
  // read it (dropped as a piece that came twice) or not.
  constexpr std::size_t big = std::size_t{32} << 20, size = std::size_t{6} << 20;
  bool filled = false, returned = false;
  int cut = 0;
  std::atomic<bool> sending{false};
  striped_ports ports_of_0;
  std::vector<int> wrong(2, -1), streams(2, -1);
  std::vector<tr::traffic_stats> stats(2);
  const auto errors = harness::tcp::run_each(2, [&](tr::tcp_options& o) {
    o.streams = 4;
    o.stripe_min_bytes = std::uint64_t{64} << 10;
    o.stripe_piece_bytes = std::uint64_t{64} << 10;
    o.max_frame_bytes = big;
    o.max_queued_bytes = big;
  }, [&](tr::tcp& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    striped_wait(ep, 4);
    if (ep.rank() == 0) ports_of_0.publish(ep, 1);
    dt::collective::communicator(ep).barrier();
    if (ep.rank() == 0) {
      ep.send(1, 6, striped_pattern(1024, 0, 9));
      sending = true;
      ep.send(1, 7, striped_pattern(big, 0, 0));
      wrong[r] = ep.recv(1, 8) != striped_pattern(size, 1, 0);
    } else {
      const auto until = std::chrono::steady_clock::now() + 10s;
      (void)striped_started(sending, until);
      // (until peer 0's write put bytes in every connection that this peer has not taken)
      filled = striped_all_queued(ports_of_0.get(), until);
      const auto first = ep.stream_ports_to(0).at(0);
      const int small = 16 << 10;
      (void)::setsockopt(bench::find_connection(first.local, first.remote), SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
      ep.send(0, 8, striped_pattern(size, 1, 0));
      returned = true;
      for (const auto& p : ep.stream_ports_to(0))
        if (p.stream > 0) cut += bench::reset_connection(p.local, p.remote);
      wrong[r] = ep.recv(0, 6) != striped_pattern(1024, 0, 9);  // (room for the next: it goes on)
      wrong[r] += ep.recv(0, 7) != striped_pattern(big, 0, 0);
    }
    dt::collective::communicator(ep).barrier();
    streams[r] = striped_until(ep, 1 - ep.rank(), 4, 10s);  // (peer 1, the dialer, dials the three again)
    stats[r] = ep.stats();
  });
  for (const auto& e : errors) CHECK(harness::tcp::what(e) == "");
  CHECK(filled);
  CHECK(returned);
  CHECK(cut == 3);
  CHECK(wrong == std::vector<int>{0, 0});
  CHECK(streams == std::vector<int>{4, 4});
  CHECK(stats[0].streams_lost == 3);
  CHECK(stats[1].streams_lost == 3);
  // (its pieces over the three streams: at least one)
  CHECK(stats[1].pieces_resent >= 1);
  CHECK(stats[1].pieces_resent <= size / (std::size_t{64} << 10));
}

TEST_CASE("tcp streams: a further stream lost between messages is dialed again by the pair's dialer") {
  // Two peers with four connections a pair; peer 1 dialed the pair. One stream is reset at
  // peer 0's end with nothing on it, then at peer 1's: each time peer 1 dials it again, and a
  // striped message after lands whole over four connections.
  std::vector<int> wrong(2, -1);
  std::vector<std::vector<int>> streams(2);
  std::vector<tr::traffic_stats> stats(2);
  std::vector<int> cut(2, 0);
  const auto errors = harness::tcp::run_each(2, [&](tr::tcp_options& o) { striped_options(o); }, [&](tr::tcp& ep) {
    const auto r = static_cast<std::size_t>(ep.rank());
    const int other = 1 - ep.rank();
    streams[r].push_back(striped_until(ep, other, 4, 10s));  // (before the barrier: peer 0 resets one right after it)
    dt::collective::communicator(ep).barrier();
    int bad = 0;
    for (int round = 0; round < 2; ++round) {
      if (ep.rank() == round) {
        const auto ports = ep.stream_ports_to(other);
        if (ports.size() == 4) cut[r] += bench::reset_connection(ports[1 + round].local, ports[1 + round].remote);
      }
      // (the lost stream counted here, then dialed again, before the message)
      const auto until = std::chrono::steady_clock::now() + 10s;
      while (ep.stats().streams_lost < static_cast<std::uint64_t>(round + 1) && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(2ms);
      streams[r].push_back(striped_until(ep, other, 4, 10s));
      dt::collective::communicator(ep).barrier();
      const auto m = striped_pattern((std::size_t{1} << 20) + 64, ep.rank(), round);
      ep.send(other, 4, m);
      bad += ep.recv(other, 4) != striped_pattern((std::size_t{1} << 20) + 64, other, round);
    }
    wrong[r] = bad;
    stats[r] = ep.stats();
  });
  for (const auto& e : errors) CHECK(harness::tcp::what(e) == "");
  CHECK(cut == std::vector<int>{1, 1});
  CHECK(wrong == std::vector<int>{0, 0});
  for (std::size_t r = 0; r < streams.size(); ++r) {
    INFO("peer " << r << "'s connections to the other: at the start, after each loss");
    CHECK(streams[r] == std::vector<int>{4, 4, 4});
  }
  for (const auto& st : stats) CHECK(st.streams_lost == 2);
  CHECK(stats[1].streams_opened == 5);  // (three at the start, two again)
  CHECK(stats[0].streams_opened == 0);
  CHECK(stats[0].striped_received == 2);
  CHECK(stats[1].striped_received == 2);
}

TEST_CASE("tcp streams: from the measured link, a pair opens streams while each connection is held at its window") {
  // Under streams_from_link a pair starts with one connection. Loopback's round trip is tens of
  // microseconds, so a connection is never held at a real window here: a window of 1 byte
  // (stream_window_bytes) makes every 1 MiB message look window-bound (at a round trip of 2 us,
  // down to 380 KB/s: on a loaded machine the messages took up to 0.7 s, 1.5 MB/s), and each asks for twice
  // the connections that carried its pieces, up to `streams` (8): measured where the messages
  // land, at peer 1, which dialed the pair and opens them, or at peer 0, which asks peer 1 in a
  // streams frame. (The sender's send buffers are made small, as a slow link's would be, so that
  // every connection takes pieces: on loopback the first would take them all, and the rule
  // counts only connections that carried some.) With a window of 1 GiB no rate on loopback comes
  // near it: the pair keeps one connection.
  struct outcome {
    std::vector<int> before, after;
    std::vector<int> wrong{-1, -1};
    std::vector<tr::traffic_stats> stats{2};
  };
  const auto run = [](int sender, std::uint64_t window) {
    outcome out;
    out.before.assign(2, -1);
    out.after.assign(2, -1);
    const auto errors = harness::tcp::run_each(2, [&](tr::tcp_options& o) {
      o.streams = 8;
      o.streams_from_link = true;
      o.stream_window_bytes = window;
      o.stripe_min_bytes = std::uint64_t{256} << 10;
      o.stripe_piece_bytes = std::uint64_t{64} << 10;
    }, [&](tr::tcp& ep) {
      const auto r = static_cast<std::size_t>(ep.rank());
      const int other = 1 - ep.rank();
      dt::collective::communicator(ep).barrier();
      out.before[r] = ep.streams_to(other);
      // Each message is measured once it landed, and the receiver answers whether to go on: until
      // the pair has 8 connections (10 s at most), or for 24 messages with the large window.
      const bool grows = window < 4096;
      const auto until = std::chrono::steady_clock::now() + 10s;
      int bad = 0;
      for (int i = 0, go_on = 1; go_on != 0; ++i) {
        const auto m = striped_pattern(std::size_t{1} << 20, sender, i % 7);
        if (ep.rank() == sender) {
          const int small = 64 << 10;
          for (const auto& p : ep.stream_ports_to(other))
            (void)::setsockopt(bench::find_connection(p.local, p.remote), SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
          ep.send(other, 4, m);
          go_on = std::to_integer<int>(ep.recv(other, 5).at(0));
        } else {
          bad += ep.recv(other, 4) != m;
          go_on = grows ? ep.streams_to(other) < 8 && std::chrono::steady_clock::now() < until : i + 1 < 24;
          ep.send(other, 5, tr::bytes(1, static_cast<std::byte>(go_on)));
        }
      }
      out.wrong[r] = bad;
      dt::collective::communicator(ep).barrier();
      if (!grows) std::this_thread::sleep_for(300ms);  // (a dial asked for by the last messages would be done)
      out.after[r] = striped_until(ep, other, grows ? 8 : 1, 10s);
      out.stats[r] = ep.stats();
    });
    for (const auto& e : errors) CHECK(harness::tcp::what(e) == "");
    return out;
  };
  for (int sender = 0; sender < 2; ++sender) {
    INFO("peer " << sender << " sends, peer " << 1 - sender << (sender == 0 ? " (the dialer)" : " (the acceptor)") << " measures");
    const auto grown = run(sender, 1);
    CHECK(grown.before == std::vector<int>{1, 1});
    CHECK(grown.wrong == std::vector<int>{0, 0});
    CHECK(grown.after == std::vector<int>{8, 8});
    CHECK(grown.stats[1].streams_opened == 7);
    CHECK(grown.stats[1 - sender].striped_received >= 1);  // (the later messages went over several)
    const auto kept = run(sender, std::uint64_t{1} << 30);
    CHECK(kept.before == std::vector<int>{1, 1});
    CHECK(kept.wrong == std::vector<int>{0, 0});
    CHECK(kept.after == std::vector<int>{1, 1});
    CHECK(kept.stats[1].streams_opened == 0);
  }
}

TEST_CASE("tcp streams: the count rule doubles a pair's connections only while each kept most of a window in flight") {
  using dt::transport::tcp_detail::streams_wanted;
  const double mib = 1 << 20, window = 2.8e6;  // (this machine's default: two thirds of a 4 MiB send buffer)
  // 1 Gbit/s with a 100 ms round trip: one connection moves 2.8 MB a round trip (28 MB/s), four
  // fill most of the link and each still keeps its window; at eight each keeps half of one (and
  // at 2.1 MB, three quarters, it doubles: 21 MB/s each).
  CHECK(streams_wanted(1, 16, 64 * mib, 64 * mib / 28e6, 0.1, window) == 2);
  CHECK(streams_wanted(4, 16, 64 * mib, 64 * mib / 112e6, 0.1, window) == 8);
  CHECK(streams_wanted(8, 16, 64 * mib, 64 * mib / 112e6, 0.1, window) == 8);
  CHECK(streams_wanted(8, 16, 64 * mib, 64 * mib / (8 * 21.1e6), 0.1, window) == 16);
  CHECK(streams_wanted(8, 16, 64 * mib, 64 * mib / (8 * 20.9e6), 0.1, window) == 8);
  CHECK(streams_wanted(4, 6, 64 * mib, 64 * mib / 112e6, 0.1, window) == 6);  // (up to `most`)
  CHECK(streams_wanted(6, 6, 64 * mib, 1e-3, 0.1, window) == 6);
  // 10 Mbit/s at 100 ms: the link holds one connection at 125 KB in flight; loopback at 1 GB/s
  // with 50 us: 50 KB.
  CHECK(streams_wanted(1, 16, 64 * mib, 64 * mib / 1.25e6, 0.1, window) == 1);
  CHECK(streams_wanted(1, 16, 64 * mib, 64 * mib / 1e9, 50e-6, window) == 1);
  // Nothing measured: as many as now.
  CHECK(streams_wanted(2, 16, 64 * mib, 0, 0.1, window) == 2);
  CHECK(streams_wanted(2, 16, 64 * mib, 1, 0, window) == 2);
  CHECK(dt::transport::tcp_detail::kernel_stream_window() > 0);
}

TEST_CASE("tcp streams: settings that cannot choose streams from the link are refused, named") {
  tr::tcp_options o;
  o.streams_from_link = true;
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("streams_from_link chooses up to `streams` connections a pair, and streams is 1"));
  o.streams = 17;
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("streams must be in [1, 16], got 17"));
}
