// A peer that holds the run's key and lies, against a live TCP peer: it claims a connected rank,
// poses as joiners by the hundred, sends a joiner's data, floods a tag nobody reads. Each attack
// is bounded in time and count and runs on 127.0.0.1; the attacker is bench/hostile_peer.hpp,
// the library's own handshake with frames of its choosing.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <asio.hpp>

#include <atomic>
#include <chrono>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hostile_peer.hpp"
#include "resident_memory.hpp"

namespace dt = decentrain;
namespace tr = dt::transport;
namespace wire = dt::transport::wire;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

tr::tcp_options keyed(int rank, int world) { return bench::keyed_options("a run key of thirty-two bytes...", rank, world); }

// Rank `rank` of a keyed group of three that may grow to eight (so routes may name ranks past
// the three: those nobody is connected to).
tr::tcp_options keyed_of_eight(int rank) {
  auto o = keyed(rank, 3);
  o.max_world = 8;
  return o;
}

// Peers 0 and 1 of such a group, 1 joining through 0, and the options of its rank 2 (the liar).
struct honest_pair {
  tr::tcp peer0{keyed_of_eight(0)};
  tr::tcp peer1{joining(peer0)};
  asio::io_context io;
  tr::tcp_options as_two = keyed_of_eight(2);

  static tr::tcp_options joining(const tr::tcp& first) {
    auto o = keyed_of_eight(1);
    o.join = {first.address()};
    return o;
  }
};

// Peers 0 and 1 of a keyed group of two, connected (peer 1 without a listening socket where
// `one_listens` is false: it dials peer 0).
struct pair_of_peers {
  explicit pair_of_peers(int max_world = 0, bool one_listens = true) {
    auto o0 = keyed(0, 2);
    o0.max_world = max_world;
    peer0.emplace(o0);
    auto o1 = keyed(1, 2);
    o1.max_world = max_world;
    o1.join = {peer0->address()};
    if (!one_listens) o1.listen.clear();
    auto one = std::async(std::launch::async, [&] { return tr::tcp::join(o1); });
    peer0->connect();
    peer1.emplace(one.get());
  }
  // A message each way: nothing was replaced or split.
  bool still_one_pair(tr::tag_type tag) {
    auto echo = std::async(std::launch::async, [&] {
      auto m = peer1->recv(0, tag);
      peer1->send(0, tag, m);
    });
    const tr::bytes hello(100, std::byte{7});
    peer0->send(1, tag, hello);
    const auto back = peer0->recv(1, tag);
    echo.get();
    return back == hello;
  }
  std::optional<tr::tcp> peer0, peer1;
};

// Whether `done()` holds within `tries` x 10 ms (checked that often).
template <class F>
bool eventually(F done, int tries = 200) {
  for (int i = 0; i < tries; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

}  // namespace

TEST_CASE("tcp: a key holder claiming a rank that is connected and alive is refused, nothing is replaced or split") {
  pair_of_peers g(8);
  asio::io_context io;
  auto as_one = keyed(1, 2);
  for (const bool late : {true, false}) {
    bench::hostile_peer h(io, g.peer0->address(), as_one, wire::hello_purpose::data, late);
    CHECK_FALSE(h.answer());
    CHECK_THAT(h.refusal(), late ? Contains("connected to a live peer of rank 1; another process cannot take its rank")
                                 : Contains("is already connected to a peer of rank 1"));
    CHECK(g.still_one_pair(10 + late));
  }
  CHECK(g.peer0->admission().hijacks == 1);
  // Peer 1 hears peer 0 as before (the connection it holds was not closed).
  CHECK(g.peer1->connected() == std::vector<int>{0});
  CHECK(g.peer0->connected() == std::vector<int>{1});
}

TEST_CASE("tcp: a joiner not admitted yet may send only small membership frames, its data, floods and alarms end there") {
  pair_of_peers g(8);
  asio::io_context io;
  auto joiner = [&](int rank) {
    auto o = keyed(rank, 2);
    auto h = std::make_unique<bench::hostile_peer>(io, g.peer0->address(), o, wire::hello_purpose::data, true);
    const auto a = h->answer();
    REQUIRE(a);
    REQUIRE(a->head.type == wire::frame_type::welcome);
    return h;
  };
  const auto dropped = g.peer0->stats().malformed_frames;
  {  // data on a collective's tag
    auto h = joiner(2);
    h->send(5, tr::bytes(100, std::byte{'x'}));
    CHECK(h->closed_by_peer());
    CHECK_THAT(g.peer0->last_malformed(), Contains("only membership frames are read from a joiner"));
  }
  {  // a membership frame over the joiner's limit
    auto h = joiner(3);
    h->send(tr::membership_tag(2), tr::bytes(100 << 10, std::byte{1}));
    CHECK(h->closed_by_peer());
    CHECK_THAT(g.peer0->last_malformed(), Contains("a joiner's are at most 65536"));
  }
  {  // many small ones nobody takes
    auto h = joiner(4);
    for (int i = 0; i < 20 && !h->broken(); ++i) h->send(tr::membership_tag(2), tr::bytes(60 << 10, std::byte{1}));
    CHECK(h->closed_by_peer());
    CHECK_THAT(g.peer0->last_malformed(), Contains("more than 1048576 bytes that nobody took yet"));
  }
  CHECK(g.peer0->stats().malformed_frames == dropped + 3);
  // A member's alarm of a view far ahead is ignored (it would outlive every view installed).
  {
    const auto alarm = wire::encode_alarm(1000, 0);
    g.peer1->send(0, tr::alarm_tag, alarm);
    CHECK(g.still_one_pair(20));
    CHECK_FALSE(g.peer0->alarmed());
  }
  {  // a joiner's alarm: ignored, the joiner stays connected
    auto h = joiner(5);
    const auto alarm = wire::encode_alarm(0, 1);
    h->send(tr::alarm_tag, alarm);
    CHECK(g.still_one_pair(21));
    CHECK_FALSE(g.peer0->alarmed());
  }
  CHECK(g.still_one_pair(22));
}

TEST_CASE("tcp: a thousand fake joiners hold at most max_pending + max_joiners connections, and the group trains on") {
  pair_of_peers g(2048);
  asio::io_context io;
  std::vector<std::unique_ptr<bench::hostile_peer>> fakes;
  std::size_t welcomed = 0, turned_away = 0, most_connected = 0;
  int most_pending = 0;
  for (int rank = 2; rank < 1002; ++rank) {
    auto o = keyed(rank, 2);
    auto h = std::make_unique<bench::hostile_peer>(io, g.peer0->address(), o, wire::hello_purpose::data, true, 300ms);
    const auto a = h->answer();
    if (a && a->head.type == wire::frame_type::welcome) ++welcomed;
    else if (h->refusal().find("joiners waiting") != std::string::npos) ++turned_away;
    fakes.push_back(std::move(h));  // all held open
    most_connected = std::max(most_connected, g.peer0->connected().size());
    most_pending = std::max(most_pending, g.peer0->admission().pending);
  }
  const tr::tcp_options defaults;
  CHECK(welcomed == static_cast<std::size_t>(defaults.max_joiners));
  CHECK(turned_away == 1000 - welcomed);
  CHECK(most_connected <= 1 + static_cast<std::size_t>(defaults.max_joiners));
  CHECK(most_pending <= defaults.max_pending + 1);  // +1: sampled between an accept and its eviction
  CHECK(g.peer0->admission().joiners_turned_away == turned_away);
  CHECK(g.still_one_pair(30));
}

TEST_CASE("tcp: a member flooding a tag nobody reads holds at most its budget, a receive it stalls names it, and it is heard again") {
  auto o = keyed(0, 2);
  o.budget_grace = 1000ms;
  tr::tcp peer0(o);
  asio::io_context io;
  const auto address = peer0.address();
  const auto rss0 = bench::resident_bytes();
  // The attacker is peer 1 of the group: it floods 96 MiB on tag 999, which nobody reads, then
  // sends tag 7 (behind the flood on the stream), then tag 8.
  std::atomic<int> frames_written{0};
  auto attacker = std::async(std::launch::async, [&] {
    bench::hostile_peer h(io, address, keyed(1, 2), wire::hello_purpose::data, false, 20s);
    if (!h.answer()) return std::string("not welcomed: ") + h.refusal();
    const tr::bytes flood(16 << 20, std::byte{0x66});
    for (int i = 0; i < 6 && !h.broken(); ++i, ++frames_written) h.send(999, flood);
    h.send(7, tr::bytes(8, std::byte{7}));
    h.send(8, tr::bytes(8, std::byte{8}));
    // Stay until peer 0 is done with us (it closes at the end of the test).
    (void)h.closed_by_peer(6);  // at most 6 x 20 s
    return std::string(h.broken() ? "broken" : "ok");
  });
  peer0.connect();
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<tr::peer_error> stalled;
  try {
    (void)peer0.recv(1, 7);
  } catch (const tr::peer_error& e) {
    stalled = e;
  }
  const auto waited = std::chrono::steady_clock::now() - t0;
  const auto rss_paused = bench::resident_bytes();
  REQUIRE(stalled);
  CHECK(stalled->peer() == 1);
  CHECK(stalled->cause() == tr::failure_cause::convicted);
  CHECK_THAT(stalled->what(), Contains("over its budget") && Contains("tag 7"));
  CHECK(waited >= 900ms);
  CHECK(waited < 8s);
  CHECK(peer0.over_budget().at(1) == 1);
  // What it queued was dropped; its later messages arrive: the connection was kept.
  CHECK(peer0.recv(1, 7) == tr::bytes(8, std::byte{7}));
  CHECK(peer0.recv(1, 8) == tr::bytes(8, std::byte{8}));
  CHECK(frames_written == 6);
  // Peer 0 held at most its budget (64 MiB) and one frame being read, never the 96 MiB.
  CHECK(rss_paused < rss0 + (std::size_t{100} << 20));
  peer0.forget(1);
  CHECK(attacker.get() != "");
}

TEST_CASE("tcp: a codec's ring, which sends a whole step before it receives, finishes under a tight budget, saying what it expects") {
  // Each peer sends a 24 MB segment in 2 MB pieces to its neighbour before it receives the
  // neighbour's (collective::encoded_all_reduce with fp16 goes around the ring), while each takes at most
  // 2 MiB unasked from a peer: without the receivers' expect() all three stall on full queues
  // (and socket buffers) until their receive timeout.
  constexpr int world = 3;
  std::vector<tr::tcp_options> opts;
  for (int r = 0; r < world; ++r) {
    auto o = keyed(r, world);
    o.max_frame_bytes = 2 << 20;
    o.max_queued_bytes = 2 << 20;
    o.budget_grace = 60s;  // longer than the receive timeout: a stall here fails as a timeout
    opts.push_back(o);
  }
  tr::tcp peer0(opts[0]);
  for (int r = 1; r < world; ++r) opts[static_cast<std::size_t>(r)].join = {peer0.address()};
  constexpr std::size_t values = std::size_t{36} << 20;  // fp16: 24 MB segments, 12 pieces each
  auto run = [&](tr::tcp& p) {
    dt::collective::communicator<tr::tcp> c(p);
    std::vector<float> v(values, static_cast<float>(p.rank() + 1));
    dt::compress::fp16 codec;
    dt::collective::encoded_all_reduce(codec, c, std::span<float>(v), false);
    return v.front() + v.back();
  };
  std::vector<std::future<float>> others;
  for (int r = 1; r < world; ++r)
    others.push_back(std::async(std::launch::async, [&, r] {
      auto p = tr::tcp::join(opts[static_cast<std::size_t>(r)]);
      return run(p);
    }));
  peer0.connect();
  const auto t0 = std::chrono::steady_clock::now();
  const float mine = run(peer0);
  CHECK(mine == 12.0f);  // 1 + 2 + 3 at both ends
  for (auto& f : others) CHECK(f.get() == mine);
  CHECK(std::chrono::steady_clock::now() - t0 < 9s);
  CHECK(peer0.over_budget().empty());
}

TEST_CASE("tcp: a key holder's relay frames: routes it may not use close it, a circuit it opens carries nothing but to a stranger") {
  // Peers 0 and 1 of a keyed group of three whose rank 2 is the liar, connected to both.
  honest_pair pair;
  tr::tcp &peer0 = pair.peer0, &peer1 = pair.peer1;
  asio::io_context& io = pair.io;
  const tr::tcp_options& as_two = pair.as_two;
  auto member = [&](const std::string& at) {
    auto h = std::make_unique<bench::hostile_peer>(io, at, as_two, wire::hello_purpose::data, false);
    const auto a = h->answer();
    REQUIRE(a);
    REQUIRE(a->head.type == wire::frame_type::welcome);
    return h;
  };
  auto one = std::async(std::launch::async, [&] { peer1.connect(); });
  std::this_thread::sleep_for(200ms);
  auto to0 = member(peer0.address());
  peer0.connect();
  auto to1 = member(peer1.address());
  one.get();
  const auto relay = [](wire::relay_route r) { return wire::encode_route(r); };
  const auto dropped = peer0.stats().malformed_frames;
  {  // a frame "from peer 1", relayed on
    to0->write(wire::frame_type::relay, relay({wire::relay_kind::open, 1, 5}), {});
    CHECK(to0->closed_by_peer());
    CHECK_THAT(peer0.last_malformed(), Contains("peer 2 asked to relay a frame from peer 1 (a peer has its own frames relayed only)"));
  }
  {  // to the relay itself
    to0 = member(peer0.address());
    to0->write(wire::frame_type::relay, relay({wire::relay_kind::open, 2, 0}), {});
    CHECK(to0->closed_by_peer());
    CHECK_THAT(peer0.last_malformed(), Contains("peer 2 sent this peer a relay frame from itself"));
  }
  {  // an open that carries more than a reason
    to0 = member(peer0.address());
    to0->write(wire::frame_type::relay, relay({wire::relay_kind::open, 2, 1}), tr::bytes(4096, std::byte{1}));
    CHECK(to0->closed_by_peer());
    CHECK_THAT(peer0.last_malformed(), Contains("a relay frame that opens a circuit carries 4096 bytes (at most 1024)"));
  }
  CHECK(peer0.stats().malformed_frames == dropped + 3);
  {  // a circuit to peer 1 that carries garbage: peer 1 reads it as a stranger's, and closes it
    to0 = member(peer0.address());
    const auto strangers = peer1.stats().malformed_frames;
    to0->write(wire::frame_type::relay, relay({wire::relay_kind::open, 2, 1}), {});
    to0->write(wire::frame_type::relay, relay({wire::relay_kind::bytes, 2, 1}), tr::bytes(256, std::byte{0x5a}));
    bool closed = false;
    for (int i = 0; i < 200 && !closed; ++i) {
      closed = peer1.stats().malformed_frames > strangers && peer0.relaying().open_circuits == 0;
      if (!closed) std::this_thread::sleep_for(10ms);
    }
    CHECK(closed);
    CHECK_THAT(peer1.last_malformed(), Contains("bad magic"));
    CHECK(peer0.relaying().circuits_opened == 1);
    // Bytes on a circuit that is closed are dropped, and the liar stays connected.
    to0->write(wire::frame_type::relay, relay({wire::relay_kind::bytes, 2, 1}), tr::bytes(256, std::byte{0x5a}));
    bool counted = false;
    for (int i = 0; i < 200 && !counted; ++i) {
      counted = peer0.relaying().frames_dropped >= 1;
      if (!counted) std::this_thread::sleep_for(10ms);
    }
    CHECK(counted);
    CHECK_FALSE(to0->closed_by_peer());
  }
  {  // a punch that brings the relay an address (it has none to give), and one whose address is
     // a name to look up, not an address (tcp/punch.hpp)
    to0->write(wire::frame_type::relay, relay({wire::relay_kind::punch, 2, 1}), tr::bytes(8, std::byte{'1'}));
    CHECK(to0->closed_by_peer());
    CHECK_THAT(peer0.last_malformed(), Contains("a punch frame of 8 bytes (one asking a relay carries none)"));
    const std::string name = "example.org:80";
    to1->write(wire::frame_type::relay, relay({wire::relay_kind::punch, 0, 1}),
               tr::bytes(reinterpret_cast<const std::byte*>(name.data()), reinterpret_cast<const std::byte*>(name.data()) + name.size()));
    CHECK(to1->closed_by_peer());
    CHECK_THAT(peer1.last_malformed(), Contains("a punch frame's address 'example.org:80' is not IPV4:PORT"));
  }
  // Peers 0 and 1 still talk, over the connection they had.
  auto echo = std::async(std::launch::async, [&] { peer1.send(0, 9, peer1.recv(0, 9)); });
  const tr::bytes hello(100, std::byte{7});
  peer0.send(1, 9, hello);
  CHECK(peer0.recv(1, 9) == hello);
  echo.get();
  CHECK(peer1.relayed().empty());
}

TEST_CASE("tcp: a joiner not admitted yet has only its own circuits relayed, to members that accept no connections") {
  // Peer 0 of a keyed pair relays, peer 1 accepts no connections; the key holder poses as
  // joiners 3 to 7 (a joiner reaches such a member only through a relay, so a relay takes its
  // circuits to it; a rank whose connection was closed for a bad frame is refused for a while,
  // hence one rank a case).
  pair_of_peers g(8, false);
  asio::io_context io;
  auto joiner = [&](int rank) {
    auto h = std::make_unique<bench::hostile_peer>(io, g.peer0->address(), keyed(rank, 2), wire::hello_purpose::data, true);
    const auto a = h->answer();
    REQUIRE(a);
    REQUIRE(a->head.type == wire::frame_type::welcome);
    return h;
  };
  const auto relay = [](wire::relay_route r) { return wire::encode_route(r); };
  {  // a punch: the relay would make member 1 dial where the joiner says
    auto h = joiner(3);
    h->write(wire::frame_type::relay, relay({wire::relay_kind::punch, 3, 1}), {});
    CHECK(h->closed_by_peer());
    CHECK_THAT(g.peer0->last_malformed(), Contains("peer 3 joins and is not admitted yet, and sent a relay frame that only members send"));
  }
  {  // a circuit to the relay itself
    auto h = joiner(4);
    h->write(wire::frame_type::relay, relay({wire::relay_kind::open, 4, 0}), {});
    CHECK(h->closed_by_peer());
    CHECK_THAT(g.peer0->last_malformed(), Contains("peer 4 joins and is not admitted yet, and sent a relay frame for this peer"));
  }
  {  // a circuit to a peer the relay does not know (nor could a joiner's circuit go to a member
     // that listens: a joiner dials it)
    auto h = joiner(5);
    h->write(wire::frame_type::relay, relay({wire::relay_kind::resume, 5, 6}), {});
    CHECK(h->closed_by_peer());
    CHECK_THAT(g.peer0->last_malformed(), Contains("peer 5 joins and is not admitted yet, and asked for a circuit to peer 6, which this peer does not know"));
  }
  {  // bytes on no circuit: dropped, counted, the joiner kept
    auto h = joiner(6);
    const auto dropped = g.peer0->relaying().frames_dropped;
    h->write(wire::frame_type::relay, relay({wire::relay_kind::bytes, 6, 1}), tr::bytes(64, std::byte{1}));
    CHECK(eventually([&] { return g.peer0->relaying().frames_dropped > dropped; }));
    CHECK_FALSE(h->closed_by_peer());
  }
  {  // a circuit of its own to member 1: opened, and what it carries reaches member 1 as a
     // stranger's bytes (here garbage, which member 1 closes)
    auto h = joiner(7);
    const auto strangers = g.peer1->stats().malformed_frames;
    h->write(wire::frame_type::relay, relay({wire::relay_kind::open, 7, 1}), {});
    h->write(wire::frame_type::relay, relay({wire::relay_kind::bytes, 7, 1}), tr::bytes(256, std::byte{0x5a}));
    CHECK(eventually([&] { return g.peer1->stats().malformed_frames > strangers; }));
    CHECK_THAT(g.peer1->last_malformed(), Contains("bad magic"));
    CHECK(g.peer0->relaying().circuits_opened == 1);
    CHECK_FALSE(h->closed_by_peer());
  }
  CHECK(g.still_one_pair(12));
}

TEST_CASE("tcp: joiners not admitted yet hold half a relay's circuits at most") {
  // Peer 0 relays 4 circuits at most; the key holder, posing as joiners 2 to 5, asks it for a
  // circuit to member 1 (which accepts no connections) from each: two are opened, then refused.
  auto o0 = keyed(0, 2);
  o0.max_world = 8;
  o0.relay.max_circuits = 4;
  tr::tcp peer0(o0);
  auto o1 = keyed(1, 2);
  o1.max_world = 8;
  o1.join = {peer0.address()};
  o1.listen.clear();
  auto one = std::async(std::launch::async, [&] { return tr::tcp::join(o1); });
  peer0.connect();
  tr::tcp peer1 = one.get();
  asio::io_context io;
  std::vector<std::unique_ptr<bench::hostile_peer>> joiners;
  for (int rank = 2; rank <= 5; ++rank) {
    auto h = std::make_unique<bench::hostile_peer>(io, peer0.address(), keyed(rank, 2), wire::hello_purpose::data, true);
    REQUIRE(h->answer());
    h->write(wire::frame_type::relay, wire::encode_route({wire::relay_kind::open, rank, 1}), {});
    joiners.push_back(std::move(h));
  }
  CHECK(eventually([&] { return peer0.relaying().circuits_opened + peer0.relaying().circuits_refused >= 4; }, 300));
  CHECK(peer0.relaying().circuits_opened == 2);
  CHECK(peer0.relaying().circuits_refused == 2);
  CHECK_THAT(peer0.relaying().last_refusal, Contains("relays 2 circuits of joiners already (half its relay.max_circuits)"));
}

TEST_CASE("tcp: a key holder that floods a relay with opens and reads none of its refusals holds 64 KiB there at most") {
  // Rank 2 (the liar) asks peer 0 for circuits to a rank it is not connected to, 300,000 times,
  // and reads nothing: each refusal queues for the liar. Past 64 KiB of them they are dropped;
  // without that bound the relay would hold every one the sockets did not take (over 30 MB).
  honest_pair pair;
  tr::tcp &peer0 = pair.peer0, &peer1 = pair.peer1;
  asio::io_context& io = pair.io;
  const tr::tcp_options& as_two = pair.as_two;
  auto one = std::async(std::launch::async, [&] { peer1.connect(); });
  std::this_thread::sleep_for(200ms);
  bench::hostile_peer liar(io, peer0.address(), as_two, wire::hello_purpose::data, false);
  const auto welcome = liar.answer();
  REQUIRE(welcome);
  REQUIRE(welcome->head.type == wire::frame_type::welcome);
  peer0.connect();
  bench::hostile_peer to1(io, peer1.address(), as_two, wire::hello_purpose::data, false);
  REQUIRE(to1.answer());
  one.get();
  constexpr std::uint64_t opens = 300'000;
  for (std::uint64_t i = 0; i < opens && !liar.broken(); ++i)
    liar.write(wire::frame_type::relay, wire::encode_route({wire::relay_kind::open, 2, 5}), {});
  CHECK_FALSE(liar.broken());  // (the relay read them all)
  tr::relay_stats s;
  for (int i = 0; i < 500 && s.circuits_refused < opens; ++i) {
    s = peer0.relaying();
    if (s.circuits_refused < opens) std::this_thread::sleep_for(10ms);
  }
  CHECK(s.circuits_refused == opens);
  CHECK(s.frames_dropped >= opens / 2);  // (the sockets took about 33,000 of the refusals)
  CHECK(s.queued_bytes <= (std::uint64_t{64} << 10));
  CHECK_THAT(s.last_refusal, Contains("peer 0 is not connected to peer 5"));
  // Peers 0 and 1 still talk.
  auto echo = std::async(std::launch::async, [&] { peer1.send(0, 9, peer1.recv(0, 9)); });
  const tr::bytes hello(100, std::byte{7});
  peer0.send(1, 9, hello);
  CHECK(peer0.recv(1, 9) == hello);
  echo.get();
}
