// What a TCP peer gives a stranger: a few seconds and a few kilobytes before it must say (and,
// with a run key, prove) who it is; and with a key, nothing at all: frames that are not the key
// holder's, modified, replayed or forged, are rejected, counted and end their connection. Every
// attack runs against a live peer on 127.0.0.1 and is bounded in time and count.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <asio.hpp>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "bounded_read.hpp"
#include "resident_memory.hpp"

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <thread>
#include <vector>

namespace dt = decentrain;
namespace tr = dt::transport;
namespace wire = dt::transport::wire;
namespace auth = dt::transport::auth;
using namespace std::chrono_literals;

namespace {

const std::string run_key = "a run key of thirty-two bytes...";

// A client socket whose blocking writes give up after two seconds; its reads go through
// bench::read_within, which keeps a limit (asio does not keep SO_RCVTIMEO's).
asio::ip::tcp::socket connect_to(asio::io_context& io, const std::string& address) {
  const auto [host, port] = wire::split_address(address);
  asio::ip::tcp::socket s(io);
  s.connect({asio::ip::make_address(host), port});
  const timeval limit{2, 0};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  return s;
}

// A frame as bytes: header (with `mac`), body, padding.
std::vector<std::byte> frame(wire::frame_type type, const tr::bytes& body, tr::tag_type tag = 0, auth::tag mac = {}) {
  const auto h = wire::encode_header({type, tag, body.size(), mac});
  std::vector<std::byte> out(h.size() + body.size() + wire::padding(body.size()).size(), std::byte{0});
  std::memcpy(out.data(), h.data(), h.size());
  if (!body.empty()) std::memcpy(out.data() + h.size(), body.data(), body.size());
  return out;
}

// The same, tagged with the next sequence number of `mac`.
std::vector<std::byte> sealed(auth::frame_mac& mac, wire::frame_type type, const tr::bytes& body, tr::tag_type tag = 0) {
  const auto h = wire::encode_header({type, tag, body.size(), {}});
  return frame(type, body, tag, mac.seal(std::span<const std::byte>(h).first(wire::header_used_bytes), body));
}

struct frame_in {
  wire::header head;
  tr::bytes body;
};

// Reads one frame; nullopt when the peer closed the connection (or ten seconds passed).
std::optional<frame_in> read_frame(asio::ip::tcp::socket& s) {
  std::array<std::byte, wire::header_bytes> head{};
  if (bench::read_within(s, asio::buffer(head), 10s)) return std::nullopt;
  frame_in f{wire::decode_header(head.data(), wire::max_control_bytes), {}};
  f.body.resize(f.head.length + wire::padding(f.head.length).size());
  if (bench::read_within(s, asio::buffer(f.body), 10s)) return std::nullopt;
  f.body.resize(f.head.length);
  return f;
}

// True once the peer has closed the connection (within ten seconds): everything it still sends
// is read and dropped.
bool closed_by_peer(asio::ip::tcp::socket& s) { return bench::closed_within(s, 10s); }

wire::hello hello_from(int rank, int world, std::string nonce = {}) {
  wire::hello h;
  h.rank = rank;
  h.world = world;
  h.credentials = nonce.empty() ? 0 : 1;  // a run key
  h.nonce = std::move(nonce);
  return h;
}

// The caller's half of the handshake done by hand, as a peer that holds `key` (or a stranger
// who pretends to) would do it.
struct keyed_caller {
  asio::ip::tcp::socket socket;
  tr::bytes transcript;
  std::optional<auth::session> keys;
};

keyed_caller call_with_key(asio::io_context& io, const std::string& address, const std::string& key, int rank, int world) {
  keyed_caller k{connect_to(io, address), {}, {}};
  const auto hello = wire::encode_body(hello_from(rank, world, auth::random_nonce()));
  asio::write(k.socket, asio::buffer(frame(wire::frame_type::hello, hello)));
  const auto challenge = read_frame(k.socket);
  REQUIRE(challenge);
  REQUIRE(challenge->head.type == wire::frame_type::challenge);
  REQUIRE(challenge->body.size() == wire::challenge_bytes);
  CHECK(wire::challenge_rank(challenge->body) == 0);  // the acceptor names itself, under its proof
  const std::size_t proof_at = wire::challenge_bytes - auth::proof_bytes;
  k.transcript = hello;
  k.transcript.insert(k.transcript.end(), challenge->body.begin(), challenge->body.begin() + static_cast<std::ptrdiff_t>(proof_at));
  REQUIRE(auth::same(std::span(challenge->body).subspan(proof_at), auth::acceptor_proof(key, k.transcript)));
  const auto proof = auth::dialer_proof(key, k.transcript);
  asio::write(k.socket, asio::buffer(frame(wire::frame_type::proof, tr::bytes(proof.begin(), proof.end()))));
  k.keys.emplace(key, k.transcript, true);
  return k;
}

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

tr::tcp_options two_peers(std::string key = {}) {
  tr::tcp_options o;
  o.world = 2;
  o.join_timeout = 10s;
  o.recv_timeout = 10s;
  o.key = std::move(key);
  return o;
}

// A real peer 1 joins `peer0` (listening at `address`) and a message of `size` bytes goes from it
// to peer 0: the peer under attack still takes in the peers of its run.
void real_peer_joins(tr::tcp& peer0, const tr::tcp_options& o, const std::string& address, std::size_t size) {
  auto o1 = o;
  o1.rank = 1;
  o1.join = {address};
  auto peer1 = std::async(std::launch::async, [&] {
    auto p = tr::tcp::join(o1);
    p.send(0, 9, tr::bytes(size, std::byte{1}));
    dt::collective::communicator<tr::tcp>(p).barrier();
  });
  peer0.connect();
  CHECK(peer0.recv(1, 9).size() == size);
  dt::collective::communicator<tr::tcp>(peer0).barrier();
  peer1.get();
}

}  // namespace

TEST_CASE("auth: key files are checked, frame tags depend on key, sequence, header and body") {
  const auto dir = std::filesystem::temp_directory_path() / ("decentrain-key-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "run.key").string();
  auto write = [&](const std::string& text, std::filesystem::perms perms) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    std::filesystem::permissions(path, perms);
  };
  using p = std::filesystem::perms;
  write(run_key + "\n", p::owner_read | p::owner_write);
  CHECK(auth::read_key_file(path) == run_key);  // the final newline is not part of the key
  std::string binary(20, '\x01');
  binary.back() = '\n';
  write(binary, p::owner_read | p::owner_write);
  CHECK(auth::read_key_file(path) == binary);  // random bytes are kept as they are, a final 0x0a too
  write("short\n", p::owner_read | p::owner_write);
  CHECK_THROWS_WITH(auth::read_key_file(path), Catch::Contains("has 5 bytes; it needs 16"));
  write(run_key, p::owner_read | p::owner_write | p::others_read);
  CHECK_THROWS_WITH(auth::read_key_file(path), Catch::Contains("can be read or written by other users") && Catch::Contains("chmod 600"));
  CHECK_THROWS_WITH(auth::read_key_file((dir / "missing").string()), Catch::Contains("is not a readable file"));
  std::filesystem::remove_all(dir);
  auto o = two_peers("too short");
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("has 9 bytes"));

  const tr::bytes transcript(40, std::byte{9});
  auth::session a(run_key, transcript, true), b(run_key, transcript, false);
  const std::array<std::byte, 24> head{std::byte{1}};
  const tr::bytes body(1000, std::byte{5});
  const auto t0 = a.send.seal(head, body);
  CHECK(b.receive.open(head, body, t0));
  const auto t1 = a.send.seal(head, body);
  CHECK(t1 != t0);  // the same frame again gets another tag (its sequence number)
  CHECK_FALSE(b.receive.open(head, body, t0));  // ...so a replay fails
  auth::session c(run_key, transcript, false);
  c.receive.open(head, body, t0);
  auto changed = body;
  changed[999] ^= std::byte{1};
  CHECK_FALSE(c.receive.open(head, changed, t1));
  auth::session d(run_key, transcript, false), e("another key, also long enough", transcript, true);
  CHECK_FALSE(d.receive.open(head, body, e.send.seal(head, body)));
}

TEST_CASE("tcp: peers holding the run key train, a missing or different key is refused at once, naming why") {
  auto o = two_peers(run_key);
  o.heartbeat_interval = 20ms;  // heartbeats are tagged frames too
  o.min_silence = 2000ms;
  tr::tcp peer0(o);
  struct attempt {
    std::string key, expected;
  };
  for (const auto& [key, expected] : {attempt{"", "admits only peers holding the run's key"},
                                      attempt{"another run's key, as long", "does not hold this run's key"}}) {
    auto o1 = o;
    o1.rank = 1;
    o1.join = {peer0.address()};
    o1.key = key;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(tr::tcp::join(o1), Catch::Contains(expected));
    CHECK(std::chrono::steady_clock::now() - t0 < 3s);  // not after join_timeout
  }
  {  // a peer with a key calling one without
    auto plain = two_peers();
    tr::tcp open_peer(plain);
    auto o1 = o;
    o1.rank = 1;
    o1.join = {open_peer.address()};
    CHECK_THROWS_WITH(tr::tcp::join(o1), Catch::Contains("has none; give every peer the same key"));
  }

  auto o1 = o;
  o1.rank = 1;
  o1.join = {peer0.address()};
  tr::bytes big(3 << 20);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>(i * 7 + i / 251);
  auto peer1 = std::async(std::launch::async, [&] {
    auto p = tr::tcp::join(o1);
    p.send(0, 1, tr::bytes{std::byte{42}});
    std::this_thread::sleep_for(200ms);  // heartbeats go both ways meanwhile
    p.send(0, 2, big);
    const auto back = p.recv(0, 3);
    dt::collective::communicator<tr::tcp>(p).barrier();
    return std::pair(back, p.stats());
  });
  peer0.connect();
  CHECK(peer0.recv(1, 1) == tr::bytes{std::byte{42}});
  std::vector<std::byte> landed(big.size());
  CHECK(tr::exchange(peer0, -1, {}, 1, std::span<std::byte>(landed), 2) == big.size());  // read in place, then checked
  CHECK(std::ranges::equal(landed, big));
  const auto beats = peer0.liveness_of(1);
  REQUIRE(beats);
  CHECK(beats->heartbeats >= 3);
  peer0.send(1, 3, big);
  dt::collective::communicator<tr::tcp>(peer0).barrier();
  const auto [back, stats1] = peer1.get();
  CHECK(back == big);
  CHECK(peer0.admission().bad_tags == 0);
  CHECK(stats1.rejected_frames == 0);
  CHECK(peer0.stats().malformed_frames == 0);
  // Refusals heard before any proof are believed the third time (one forged goodbye must not end
  // a join): three hellos without a key, three callers that closed after the challenge.
  CHECK(peer0.admission().refused == 6);
}

TEST_CASE("tcp: with a run key, a modified, replayed, forged or untagged frame is rejected, counted and ends its connection") {
  auto o = two_peers(run_key);
  o.heartbeat_interval = 0ms;  // this test's peer 1 sends none
  tr::tcp peer0(o);
  asio::io_context io;
  auto caller = call_with_key(io, peer0.address(), run_key, 1, 2);
  peer0.connect();  // the mesh is complete: peer 1 is the caller
  const auto welcome = read_frame(caller.socket);
  REQUIRE(welcome);
  REQUIRE(welcome->head.type == wire::frame_type::welcome);
  {
    const auto h = wire::encode_header(welcome->head);
    CHECK(caller.keys->receive.open(std::span<const std::byte>(h).first(wire::header_used_bytes), welcome->body, welcome->head.mac));
  }
  const tr::bytes body{std::byte{1}, std::byte{2}, std::byte{3}};
  const auto good = sealed(caller.keys->send, wire::frame_type::data, body, 5);
  asio::write(caller.socket, asio::buffer(good));
  CHECK(peer0.recv(1, 5) == body);

  std::vector<std::byte> bad;
  bool posted = false;
  SECTION("replayed") { bad = good; }
  SECTION("body modified") {
    bad = sealed(caller.keys->send, wire::frame_type::data, body, 5);
    bad[wire::header_bytes + 1] ^= std::byte{0x10};
  }
  SECTION("header modified (its message tag)") {
    bad = sealed(caller.keys->send, wire::frame_type::data, body, 5);
    bad[8] = std::byte{6};
  }
  SECTION("tagged with another key") {
    auth::session other("another run's key, as long", caller.transcript, true);
    bad = sealed(other.send, wire::frame_type::data, body, 5);
  }
  SECTION("untagged") { bad = frame(wire::frame_type::data, body, 5); }
  SECTION("modified while it lands in memory a receiver posted") {
    bad = sealed(caller.keys->send, wire::frame_type::data, tr::bytes(5000, std::byte{7}), 5);
    bad[wire::header_bytes + 4000] ^= std::byte{1};
    posted = true;
  }
  std::vector<std::byte> into(5000);
  std::future<std::size_t> receive;
  if (posted) {
    receive = std::async(std::launch::async, [&] { return tr::exchange(peer0, -1, {}, 1, std::span<std::byte>(into), 5); });
    std::this_thread::sleep_for(50ms);
  }
  asio::write(caller.socket, asio::buffer(bad));
  try {
    if (posted) receive.get();
    else (void)peer0.recv(1, 5);
    FAIL("a rejected frame was delivered");
  } catch (const tr::peer_error& e) {
    CHECK(e.peer() == 1);
    CHECK_THAT(e.what(), Catch::Contains("failed authentication") && Catch::Contains("failed its authentication tag"));
  }
  CHECK(closed_by_peer(caller.socket));
  CHECK(peer0.admission().bad_tags == 1);
  CHECK(peer0.stats().rejected_frames == 1);
  CHECK(peer0.stats().messages_received == 1);  // only the good frame
  // The path the sleep above was to set up: the forged body read into the posted memory (the
  // others through the mailbox).
  CHECK(peer0.stats().bodies_into_posted == (posted ? 1u : 0u));
}

TEST_CASE("tcp: with a run key, a stranger gets no further than the challenge: no key, a forged proof, frames out of turn") {
  auto o = two_peers(run_key);
  tr::tcp peer0(o);
  asio::io_context io;
  {  // no key at all: a goodbye saying why, and nothing else (no directory, no peers)
    for (auto purpose : {wire::hello_purpose::data, wire::hello_purpose::directory}) {
      auto s = connect_to(io, peer0.address());
      auto h = hello_from(1, 2);
      h.purpose = purpose;
      asio::write(s, asio::buffer(frame(wire::frame_type::hello, wire::encode_body(h))));
      const auto answer = read_frame(s);
      REQUIRE(answer);
      REQUIRE(answer->head.type == wire::frame_type::bye);
      const auto f = wire::decode_body<wire::farewell>(answer->body, "goodbye");
      CHECK(f.final);
      CHECK_THAT(f.reason, Catch::Contains("admits only peers holding the run's key"));
    }
    CHECK(peer0.admission().refused == 2);
  }
  {  // a nonce but no key: the challenge comes, the forged proof ends the connection
    auto s = connect_to(io, peer0.address());
    asio::write(s, asio::buffer(frame(wire::frame_type::hello, wire::encode_body(hello_from(1, 2, auth::random_nonce())))));
    const auto challenge = read_frame(s);
    REQUIRE(challenge);
    CHECK(challenge->head.type == wire::frame_type::challenge);
    asio::write(s, asio::buffer(frame(wire::frame_type::proof, tr::bytes(auth::proof_bytes, std::byte{0x5a}))));
    CHECK(closed_by_peer(s));
    CHECK(peer0.admission().refused == 3);
    CHECK_THAT(peer0.admission().last_rejected, Catch::Contains("did not verify"));
  }
  {  // data instead of the proof
    auto s = connect_to(io, peer0.address());
    asio::write(s, asio::buffer(frame(wire::frame_type::hello, wire::encode_body(hello_from(1, 2, auth::random_nonce())))));
    REQUIRE(read_frame(s));
    asio::write(s, asio::buffer(frame(wire::frame_type::data, tr::bytes(8), 5)));
    CHECK(closed_by_peer(s));
    CHECK_THAT(peer0.last_malformed(), Catch::Contains("expected the proof of the caller's credentials"));
  }
  {  // a recorded handshake replayed: the new challenge's nonce makes the old proof worthless
    auto first = call_with_key(io, peer0.address(), run_key, 1, 2);
    (void)read_frame(first.socket);  // welcome
    first.socket.close();
    auto s = connect_to(io, peer0.address());
    const tr::bytes hello(first.transcript.begin(),
                          first.transcript.end() - static_cast<std::ptrdiff_t>(wire::challenge_bytes - auth::proof_bytes));
    asio::write(s, asio::buffer(frame(wire::frame_type::hello, hello)));
    REQUIRE(read_frame(s));
    const auto old_proof = auth::dialer_proof(run_key, first.transcript);
    asio::write(s, asio::buffer(frame(wire::frame_type::proof, tr::bytes(old_proof.begin(), old_proof.end()))));
    CHECK(closed_by_peer(s));
    CHECK(peer0.admission().refused == 4);
  }
  real_peer_joins(peer0, o, peer0.address(), 4);  // the real peer 1 still joins
}

TEST_CASE("tcp: strangers hold a peer's memory and descriptors only briefly: slow hellos, idle connections and floods") {
  auto o = two_peers();
  o.handshake_timeout = 500ms;
  o.max_pending = 16;
  tr::tcp peer0(o);
  asio::io_context io;
  const auto rss0 = bench::resident_bytes();

  // A hello announced at 1 MiB is refused at its header, before any of its body is held.
  auto huge = connect_to(io, peer0.address());
  asio::write(huge, asio::buffer(wire::encode_header({wire::frame_type::hello, 0, std::uint64_t{1} << 20, {}})));
  CHECK(closed_by_peer(huge));
  CHECK_THAT(peer0.last_malformed(), Catch::Contains("has not said who it is"));

  // 400 strangers, half idle, half sending all but the last byte of the largest hello allowed.
  constexpr int strangers = 400;
  std::vector<asio::ip::tcp::socket> held;
  int most_pending = 0;
  for (int i = 0; i < strangers; ++i) {
    held.push_back(connect_to(io, peer0.address()));
    if (i % 2) {
      asio::write(held.back(), asio::buffer(wire::encode_header({wire::frame_type::hello, 0, wire::max_handshake_bytes, {}})));
      asio::write(held.back(), asio::buffer(tr::bytes(wire::max_handshake_bytes - 1, std::byte{1})));
    }
    most_pending = std::max(most_pending, peer0.admission().pending);
  }
  real_peer_joins(peer0, o, peer0.address(), 100);  // meanwhile the real peer joins and messages flow

  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (peer0.admission().pending > 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
  const auto a = peer0.admission();
  CHECK(a.pending == 0);
  CHECK(most_pending <= o.max_pending + 1);  // +1: sampled between an accept and its eviction
  CHECK(a.evicted + a.timed_out == strangers);
  CHECK(a.timed_out >= 1);
  int closed = 0;
  for (auto& s : held) closed += closed_by_peer(s);
  CHECK(closed == strangers);
  // Before: each slow hello pinned its announced body (up to 1 MiB) for as long as it stalled.
  CHECK(bench::resident_bytes() < rss0 + (std::size_t{16} << 20));
}

TEST_CASE("tcp: out of descriptors, a peer pauses between accepts instead of spinning, recovers, and shuts down") {
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &old) == 0);
  std::size_t open_now = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++open_now;
  auto o = two_peers();
  o.handshake_timeout = 3000ms;
  o.max_pending = 1000;  // above what fits: the descriptor limit is what is hit
  std::optional<tr::tcp> peer0(std::in_place, o);
  const std::string address = peer0->address();
  rlimit low = old;
  low.rlim_cur = open_now + 40;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  asio::io_context io;
  std::vector<asio::ip::tcp::socket> held;
  try {
    for (int i = 0; i < 200; ++i) held.push_back(connect_to(io, address));
  } catch (const std::exception&) {
    // this process (strangers and peer together) is out of descriptors
  }
  // The peer may have taken the last descriptor with an accept, leaving nothing waiting to be
  // accepted: then it never fails. So every descriptor still free is taken, one is given back
  // and a last connection takes it: one waits to be accepted, and none is free.
  std::this_thread::sleep_for(100ms);
  std::vector<int> filler;
  for (int fd = ::dup(0); fd >= 0; fd = ::dup(0)) filler.push_back(fd);
  if (!filler.empty()) {
    ::close(filler.back());
    filler.pop_back();
  }
  try {
    held.push_back(connect_to(io, address));
  } catch (const std::exception&) {
  }
  std::this_thread::sleep_for(300ms);
  const double cpu0 = cpu_seconds();
  std::this_thread::sleep_for(1s);
  const double busy = cpu_seconds() - cpu0;
  CHECK(held.size() < 200);
  CHECK(peer0->admission().accept_failures >= 1);
  CHECK(busy < 0.3);  // before: a thread retrying accept() in a loop, a whole core
  for (const int fd : filler) ::close(fd);
  held.clear();
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &old) == 0);

  auto o1 = o;
  o1.rank = 1;
  o1.join = {address};
  auto peer1 = std::async(std::launch::async, [&] {
    auto p = tr::tcp::join(o1);
    dt::collective::communicator<tr::tcp>(p).barrier();
  });
  peer0->connect();
  dt::collective::communicator<tr::tcp>(*peer0).barrier();
  peer1.get();
  const auto t0 = std::chrono::steady_clock::now();
  peer0.reset();
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
}
