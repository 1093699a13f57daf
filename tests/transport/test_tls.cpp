// TLS on the TCP transport (transport/tls.hpp): only peers with a certificate of the run's CA get
// in, a certificate that names a rank admits only that rank, and what goes over the wire cannot
// be read or changed without the connection's keys. Certificates come from scripts/tls_certs
// (openssl); every peer runs on 127.0.0.1 and every wait is bounded.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <asio.hpp>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "bounded_read.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace dt = decentrain;
namespace tr = dt::transport;
namespace wire = dt::transport::wire;
namespace auth = dt::transport::auth;
namespace tls = dt::transport::tls;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

#if DECENTRAIN_HAS_TLS

namespace {

// A run CA with peers "rank 0" to "rank 2" and one named "decentrain peer", and a second CA (another
// run) with its own "rank 1": made once per test program by scripts/tls_certs.
const fs::path& certificates() {
  static const fs::path dir = [] {
    const auto d = fs::temp_directory_path() / ("decentrain-tls-" + std::to_string(::getpid()));
    fs::remove_all(d);
    const std::string script = DECENTRAIN_SOURCE_DIR "/scripts/tls_certs";
    const auto run = [&](const std::string& args) {
      const auto cmd = "bash " + script + " " + args + " >/dev/null";
      REQUIRE(std::system(cmd.c_str()) == 0);
    };
    run(d.string() + " 3 --days 2 --name 'decentrain peer'");
    run((d / "other").string() + " 2 --days 2");
    return d;
  }();
  // (removed when the test program ends, however its cases went)
  static const struct removed_at_exit {
    fs::path d;
    ~removed_at_exit() {
      std::error_code ignored;
      fs::remove_all(d, ignored);
    }
  } cleanup{dir};
  return dir;
}

tls::options certified(const std::string& stem, const fs::path& dir = certificates()) {
  return {(dir / (stem + ".pem")).string(), (dir / (stem + ".key")).string(), (dir / "ca.pem").string(), false};
}

tr::tcp_options peer(int rank, int world, tls::options t, std::vector<std::string> join = {}) {
  tr::tcp_options o;
  o.rank = rank;
  o.world = world;
  o.join = std::move(join);
  o.join_timeout = 10s;
  o.recv_timeout = 10s;
  o.tls = std::move(t);
  return o;
}

// A frame sealed (and encrypted) under `keys`, as bytes: header, body, padding.
std::vector<std::byte> encrypted_frame(auth::frame_mac& keys, wire::frame_type type, tr::bytes body, tr::tag_type tag = 0) {
  auto h = wire::encode_header({type, tag, body.size(), {}});
  const auto mac = keys.seal(std::span<const std::byte>(h).first(wire::header_used_bytes), body, body);
  std::memcpy(h.data() + wire::tag_offset, mac.data(), mac.size());
  std::vector<std::byte> out(h.size() + body.size() + wire::padding(body.size()).size(), std::byte{0});
  std::memcpy(out.data(), h.data(), h.size());
  if (!body.empty()) std::memcpy(out.data() + h.size(), body.data(), body.size());
  return out;
}

struct raw_frame {
  wire::header head;
  tr::bytes body;  // as it crossed the wire
};

// (nothing once the peer closed, or ten seconds passed)
std::optional<raw_frame> read_raw(asio::ip::tcp::socket& s) {
  std::array<std::byte, wire::header_bytes> head{};
  if (bench::read_within(s, asio::buffer(head), 10s)) return std::nullopt;
  raw_frame f{wire::decode_header(head.data(), std::uint64_t{1} << 30), {}};
  f.body.resize(f.head.length + wire::padding(f.head.length).size());
  if (bench::read_within(s, asio::buffer(f.body), 10s)) return std::nullopt;
  f.body.resize(f.head.length);
  return f;
}

bool contains(const tr::bytes& haystack, const std::string& needle) {
  const auto* n = reinterpret_cast<const std::byte*>(needle.data());
  return std::search(haystack.begin(), haystack.end(), n, n + needle.size()) != haystack.end();
}

}  // namespace

TEST_CASE("tls: settings are checked at start, each problem named") {
  const auto& d = certificates();
  auto o = certified("rank-0");
  CHECK_NOTHROW(tls::make_context(o, 0));
  auto missing = o;
  missing.ca.clear();
  CHECK_THROWS_WITH(missing.validate(), Catch::Contains("needs all three") && Catch::Contains("missing: the CA"));
  auto foreign = o;
  foreign.ca = (d / "other" / "ca.pem").string();
  CHECK_THROWS_WITH(tls::make_context(foreign, 0), Catch::Contains("does not verify against the run's CA"));
  auto mismatched = o;
  mismatched.private_key = (d / "rank-1.key").string();
  CHECK_THROWS_WITH(tls::make_context(mismatched, 0), Catch::Contains("does not belong to certificate"));
  const auto open_key = d / "open.key";
  fs::copy_file(d / "rank-0.key", open_key, fs::copy_options::overwrite_existing);
  fs::permissions(open_key, fs::perms::owner_read | fs::perms::owner_write | fs::perms::others_read);
  auto readable = o;
  readable.private_key = open_key.string();
  CHECK_THROWS_WITH(readable.validate(), Catch::Contains("can be read or written by other users") && Catch::Contains("chmod 600"));
  auto unnamed = certified("decentrain_peer");
  unnamed.bind_ranks = true;
  CHECK_THROWS_WITH(tls::make_context(unnamed, 0), Catch::Contains("bind_ranks needs certificates named \"rank N\""));
  auto another = o;
  another.bind_ranks = true;
  CHECK_NOTHROW(tls::make_context(another, 0));
  CHECK_THROWS_WITH(tls::make_context(another, 1), Catch::Contains("is for rank 0, and this peer is rank 1"));
  auto nowhere = o;
  nowhere.certificate = (d / "none.pem").string();
  CHECK_THROWS_WITH(nowhere.validate(), Catch::Contains("none.pem' is not a file"));
  CHECK(tls::rank_named("rank 12") == 12);
  CHECK(tls::rank_named("rank ") == -1);
  CHECK(tls::rank_named("rank 1x") == -1);
  CHECK(tls::rank_named("decentrain peer") == -1);
}

TEST_CASE("tls: a group with certificates and a run key trains, its frames large and small arriving whole") {
  const int world = 3;
  std::vector<tr::tcp_options> opts;
  for (int r = 0; r < world; ++r) {
    opts.push_back(peer(r, world, certified("rank-" + std::to_string(r))));
    opts.back().tls.bind_ranks = true;
    opts.back().key = "a run key of thirty-two bytes...";
    opts.back().heartbeat_interval = 20ms;  // heartbeats are encrypted frames too
    opts.back().min_silence = 2000ms;
  }
  tr::tcp peer0(opts[0]);
  std::vector<std::future<std::vector<float>>> others;
  const auto run = [](tr::tcp& p) {
    dt::collective::communicator<tr::tcp> comm(p);
    std::vector<float> v(300000);  // 1.2 MB: read in place, in pieces
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(p.rank() + 1) * static_cast<float>(i % 97);
    comm.all_reduce(std::span<float>(v), dt::collective::reduce_op::sum);
    std::this_thread::sleep_for(100ms);  // heartbeats go both ways
    comm.barrier();
    return v;
  };
  for (int r = 1; r < world; ++r) {
    opts[static_cast<std::size_t>(r)].join = {peer0.address()};
    others.push_back(std::async(std::launch::async, [&, r] {
      auto p = tr::tcp::join(opts[static_cast<std::size_t>(r)]);
      return run(p);
    }));
  }
  peer0.connect();
  const auto mine = run(peer0);
  for (std::size_t i = 0; i < mine.size(); i += 997) CHECK(mine[i] == 6.0f * static_cast<float>(i % 97));
  for (auto& f : others) CHECK(f.get() == mine);
  CHECK(peer0.admission().bad_tags == 0);
  CHECK(peer0.admission().refused == 0);
  CHECK(peer0.stats().malformed_frames == 0);
}

TEST_CASE("tls: what crosses the wire is encrypted, and a changed byte or a replayed frame is rejected") {
  auto o0 = peer(0, 2, certified("rank-0"));
  o0.heartbeat_interval = 0ms;  // nothing but the frames below on the connection
  tr::tcp peer0(o0);
  // Peer 1 by hand: the TLS handshake through the library's own dial, then frames read and
  // written raw, as an eavesdropper would see them (and as a tamperer could change them).
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  const auto [host, port] = wire::split_address(peer0.address());
  s.connect({asio::ip::make_address(host), port});
  const timeval limit{2, 0};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  const auto ctx = tls::make_context(certified("rank-1"), 1);
  const auto e = tls::dial(*ctx, s, 2000ms, peer0.address());
  CHECK(e.certified_rank == 0);  // peer 0's certificate names it
  auth::session keys(e.dialer_to_acceptor, e.acceptor_to_dialer, true);
  wire::hello h;
  h.rank = 1;
  h.world = 2;
  asio::write(s, asio::buffer(encrypted_frame(keys.send, wire::frame_type::hello, wire::encode_body(h))));
  peer0.connect();
  auto welcome = read_raw(s);
  REQUIRE(welcome);
  CHECK(welcome->head.type == wire::frame_type::welcome);
  const auto open = [&](raw_frame& f) {
    const auto head = wire::encode_header(f.head);
    return keys.receive.open_in_place(std::span<const std::byte>(head).first(wire::header_used_bytes), f.body, f.head.mac);
  };
  CHECK(open(*welcome));

  const std::string secret = "the model's weights, which nobody on the path may read";
  std::string text;
  while (text.size() < 20000) text += secret;
  const tr::bytes plain(reinterpret_cast<const std::byte*>(text.data()), reinterpret_cast<const std::byte*>(text.data()) + text.size());
  peer0.send(1, 7, plain);
  auto data = read_raw(s);
  REQUIRE(data);
  CHECK(data->head.type == wire::frame_type::data);
  CHECK(data->head.length == plain.size());
  CHECK_FALSE(contains(data->body, secret.substr(0, 16)));  // no 16 bytes of it in the clear
  CHECK(open(*data));
  CHECK(data->body == plain);  // ...and the keys read it

  // To peer 0: a good frame lands; then one with a byte changed, or the good one again.
  const auto good = encrypted_frame(keys.send, wire::frame_type::data, plain, 8);
  asio::write(s, asio::buffer(good));
  CHECK(peer0.recv(1, 8) == plain);
  std::vector<std::byte> bad;
  SECTION("a byte of the ciphertext changed") {
    bad = encrypted_frame(keys.send, wire::frame_type::data, plain, 8);
    bad[wire::header_bytes + 100] ^= std::byte{1};
  }
  SECTION("replayed") { bad = good; }
  bool posted = false;
  SECTION("a byte changed in a frame that lands in memory a receiver posted (decrypted there)") {
    bad = encrypted_frame(keys.send, wire::frame_type::data, plain, 8);
    bad[wire::header_bytes + 5000] ^= std::byte{1};
    posted = true;
  }
  std::vector<std::byte> into(plain.size());
  std::future<std::size_t> receive;
  if (posted) {
    receive = std::async(std::launch::async, [&] { return tr::exchange(peer0, -1, {}, 1, std::span<std::byte>(into), 8); });
    std::this_thread::sleep_for(50ms);
  }
  asio::write(s, asio::buffer(bad));
  try {
    if (posted) receive.get();
    else (void)peer0.recv(1, 8);
    FAIL("a rejected frame was delivered");
  } catch (const tr::peer_error& err) {
    CHECK(err.peer() == 1);
    CHECK_THAT(err.what(), Catch::Contains("failed its authentication tag"));
  }
  CHECK(peer0.admission().bad_tags == 1);
  CHECK(peer0.stats().bodies_into_posted == (posted ? 1u : 0u));  // the path the sleep was to set up
}

TEST_CASE("tls: callers without a certificate of the run's CA, or with another rank's, are refused at once, naming why") {
  auto o0 = peer(0, 2, certified("rank-0"));
  o0.tls.bind_ranks = true;
  tr::tcp peer0(o0);
  struct attempt {
    std::string name;
    tr::tcp_options caller;
    std::string expected;
  };
  const auto& d = certificates();
  std::vector<attempt> attempts{
      {"no TLS", peer(1, 2, {}, {peer0.address()}), "admits only peers with a certificate of the run's CA"},
      {"another run's CA", peer(1, 2, certified("rank-1", d / "other"), {peer0.address()}),
       "certificate does not verify against this run's CA"},
      {"rank 2's certificate", peer(1, 2, certified("rank-2"), {peer0.address()}), "its certificate is for rank 2"},
      {"a certificate that names no rank", peer(1, 2, certified("decentrain_peer"), {peer0.address()}), "names no rank"},
  };
  for (auto& a : attempts) {
    INFO(a.name);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(tr::tcp::join(a.caller), Catch::Contains(a.expected));
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);  // not at join_timeout (10 s)
  }
  CHECK(peer0.admission().refused >= 12);  // three tries of each

  // A caller with TLS calling a peer without: named on both sides.
  tr::tcp plain(peer(0, 2, {}));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(tr::tcp::join(peer(1, 2, certified("rank-1"), {plain.address()})),
                    Catch::Contains("does not speak TLS: does it run without it?"));
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(plain.admission().refused >= 1);  // told in a plain goodbye
}

TEST_CASE("tls: a dialer that finds another rank's certificate at a peer's address does not take it for that peer") {
  // A stale directory: peer 1 told the seed its address and went away; another peer, holding
  // rank 0's certificate, now listens there. Peer 2 dials that address expecting rank 1.
  auto o0 = peer(0, 3, certified("rank-0"));
  o0.join_timeout = 6s;
  tr::tcp peer0(o0);
  std::string error0;
  std::thread t0([&] {
    try {
      peer0.connect();
    } catch (const std::exception& e) {
      error0 = e.what();
    }
  });
  std::string stale;
  {
    auto o1 = peer(1, 3, certified("rank-1"), {peer0.address()});
    o1.join_timeout = 1s;
    tr::tcp peer1(o1);
    stale = peer1.address();
    CHECK_THROWS(peer1.connect());  // peer 2 never came
  }
  auto o_other = peer(0, 1, certified("rank-0"));
  o_other.listen = stale;
  tr::tcp other(o_other);
  auto o2 = peer(2, 3, certified("rank-2"), {peer0.address()});
  o2.join_timeout = 3s;
  CHECK_THROWS_WITH(tr::tcp::join(o2), Catch::Contains("has a certificate for \"rank 0\", not for rank 1"));
  t0.join();
  CHECK(!error0.empty());  // the group never formed: peer 0 gave up at its join timeout
}

#else

TEST_CASE("tls: without OpenSSL's libssl, TLS settings are refused with a message") {
  tr::tcp_options o;
  o.tls = {"a.pem", "a.key", "ca.pem", false};
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("this build has no TLS"));
}

#endif

TEST_CASE("tls: two peers that accept no connections run TLS end to end through a relay, certificates bound to ranks") {
  // Ranks 1 and 2 listen nowhere: 2 reaches 1 through peer 0, and their TLS handshake, with
  // certificates that name the ranks, runs over the relay's circuit: the relay carries only the
  // records of a TLS session it is not a party to.
  const int world = 3;
  std::vector<tr::tcp_options> opts;
  for (int r = 0; r < world; ++r) {
    opts.push_back(peer(r, world, certified("rank-" + std::to_string(r))));
    opts.back().tls.bind_ranks = true;
    if (r > 0) {
      opts.back().listen.clear();
      opts.back().punch_within = std::chrono::milliseconds(0);  // (relays, not a punched hole)
    }
  }
  tr::tcp peer0(opts[0]);
  const auto run = [](tr::tcp& p) {
    dt::collective::communicator<tr::tcp> comm(p);
    std::vector<float> v(300000);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(p.rank() + 1) * static_cast<float>(i % 97);
    comm.all_reduce(std::span<float>(v), dt::collective::reduce_op::sum);
    const auto relayed = p.relayed();
    comm.barrier();
    return std::pair{v, relayed};
  };
  std::vector<std::future<std::pair<std::vector<float>, std::map<int, int>>>> others;
  for (int r = 1; r < world; ++r) {
    opts[static_cast<std::size_t>(r)].join = {peer0.address()};
    others.push_back(std::async(std::launch::async, [&, r] {
      auto p = tr::tcp::join(opts[static_cast<std::size_t>(r)]);
      return run(p);
    }));
  }
  peer0.connect();
  const auto [mine, none] = run(peer0);
  for (std::size_t i = 0; i < mine.size(); i += 997) CHECK(mine[i] == 6.0f * static_cast<float>(i % 97));
  CHECK(none.empty());
  const auto one = others[0].get(), two = others[1].get();
  CHECK(one.first == mine);
  CHECK(two.first == mine);
  CHECK(one.second == std::map<int, int>{{2, 0}});
  CHECK(two.second == std::map<int, int>{{1, 0}});
  CHECK(peer0.relaying().circuits_opened == 1);
  CHECK(peer0.relaying().bytes_forwarded > 0);
}
