// Per-peer identities (transport/identity.hpp): each peer proves its rank with its own key, listed
// in the run's roster. A peer with the run's key but not the rank's identity, or another rank's
// identity, gets nowhere; frame keys differ per connection and are unknown to the other members.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <asio.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <string>
#include <thread>

#include "hostile_peer.hpp"

namespace dt = decentrain;
namespace tr = dt::transport;
namespace wire = dt::transport::wire;
namespace identity = dt::transport::identity;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

// A run's identities, as scripts/identities writes them, made with the library.
struct run_identities {
  std::filesystem::path dir;
  explicit run_identities(int ranks, const std::string& name) : dir(std::filesystem::temp_directory_path() / name) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    identity::roster roster;
    for (int r = 0; r < ranks; ++r) {
      const auto k = identity::key_pair::generate();
      k.write(key(r));
      roster.add(r, k.public_part());
    }
    std::ofstream(dir / "roster") << roster.text();
  }
  ~run_identities() { std::filesystem::remove_all(dir); }
  std::string key(int r) const { return (dir / ("rank-" + std::to_string(r) + ".key")).string(); }
  std::string roster() const { return (dir / "roster").string(); }
};

tr::tcp_options peer(int rank, int world, const run_identities& ids, int as = -1) {
  tr::tcp_options o;
  o.rank = rank;
  o.world = world;
  o.join_timeout = 10s;
  o.recv_timeout = 10s;
  o.identity.identity = ids.key(as < 0 ? rank : as);
  o.identity.roster = ids.roster();
  return o;
}

}  // namespace

TEST_CASE("identity: signatures verify only for their key, label and message, rosters are checked line by line") {
  const auto a = identity::key_pair::generate(), b = identity::key_pair::generate();
  const std::string text = "a transcript";
  const auto msg = std::as_bytes(std::span(text));
  const auto s = a.sign("label", msg);
  CHECK(identity::verify(a.public_part(), "label", msg, s));
  CHECK_FALSE(identity::verify(b.public_part(), "label", msg, s));
  CHECK_FALSE(identity::verify(a.public_part(), "other label", msg, s));
  auto changed = s;
  changed[10] ^= std::byte{1};
  CHECK_FALSE(identity::verify(a.public_part(), "label", msg, changed));
  CHECK_FALSE(identity::verify(a.public_part(), "label", msg, std::span(s).first(63)));

  // An X25519 exchange: both ends reach the same secret, a third party another.
  identity::exchange x, y, z;
  CHECK(x.secret(y.public_part()) == y.secret(x.public_part()));
  CHECK(x.secret(y.public_part()) != z.secret(y.public_part()));
  const std::array<std::byte, 32> zero{};  // a small-order point: refused, not a secret of zeros
  CHECK_THROWS_WITH(x.secret(zero), Contains("not a usable X25519 key"));

  identity::roster r;
  r.add(0, a.public_part());
  r.add(3, b.public_part());
  const auto back = identity::roster::parse(r.text(), "test");
  CHECK(*back.find(0) == a.public_part());
  CHECK(*back.find(3) == b.public_part());
  CHECK(back.find(1) == nullptr);
  const std::string key = identity::to_hex(a.public_part());
  auto refused = [](const std::string& t, const std::string& why) { CHECK_THROWS_WITH(identity::roster::parse(t, "R"), Contains(why)); };
  refused("", "lists no rank");
  refused("rank 0 ed25519\n", "line 1 is not");
  refused("rank x ed25519 " + key, "line 1 is not");
  refused("rank 0 rsa " + key, "key type \"rsa\"");
  refused("rank 0 ed25519 " + key.substr(2), "62 hex digits");
  refused("rank 0 ed25519 " + std::string(64, 'g'), "is not hexadecimal");
  refused("rank 70000 ed25519 " + key, "rank 70000 is outside");
  refused("rank 0 ed25519 " + key + " extra", "has more than");
  refused("# two\nrank 0 ed25519 " + key + "\nrank 0 ed25519 " + identity::to_hex(b.public_part()), "line 3: rank 0 is listed twice");
  refused("rank 0 ed25519 " + key + "\nrank 1 ed25519 " + key, "rank 1 has the same key as rank 0");

  // Options: both files or neither; a key others can read is refused; the roster must list this
  // peer's own key for its rank.
  run_identities ids(2, "decentrain_identity_options");
  tr::tcp_options o = peer(0, 2, ids);
  o.identity.roster.clear();
  CHECK_THROWS_WITH(o.validate(), Contains("missing: the roster"));
  CHECK_THROWS_WITH(tr::tcp(peer(0, 2, ids, 1)), Contains("lists another key for rank 0"));
  std::filesystem::permissions(ids.key(1), std::filesystem::perms::others_read, std::filesystem::perm_options::add);
  CHECK_THROWS_WITH(tr::tcp(peer(0, 2, ids, 1)), Contains("can be read or written by other users"));
}

TEST_CASE("tcp: peers with identities train, the run key alone, another rank's identity or a stranger's get nowhere") {
  run_identities ids(3, "decentrain_identity_run");
  tr::tcp peer0(peer(0, 3, ids));
  const auto address = peer0.address();
  auto joined = [&](int rank) {
    return std::async(std::launch::async, [&, rank] {
      auto o = peer(rank, 3, ids);
      o.join = {address};
      auto p = tr::tcp::join(o);
      dt::collective::communicator<tr::tcp> c(p);
      std::vector<float> v(1000, static_cast<float>(rank + 1));
      c.all_reduce(std::span<float>(v));
      return v[0];
    });
  };
  auto p1 = joined(1);
  auto p2 = joined(2);
  peer0.connect();
  {
    dt::collective::communicator<tr::tcp> c(peer0);
    std::vector<float> v(1000, 1.0f);
    c.all_reduce(std::span<float>(v));
    CHECK(v[999] == 6.0f);
  }
  CHECK(p1.get() == 6.0f);
  CHECK(p2.get() == 6.0f);

  // A peer of another run (its own roster) or with a run key only: refused at its hello, told which
  // credentials this peer needs, and nothing about the run.
  asio::io_context io;
  {
    tr::tcp_options stranger;
    stranger.rank = 1;
    stranger.world = 3;
    stranger.key = "a run key of thirty-two bytes...";
    bench::hostile_peer h(io, address, stranger, wire::hello_purpose::data, true);
    CHECK_FALSE(h.answer());
    CHECK_THAT(h.refusal(), Contains("the caller holds a run key and peer 0 has none"));
  }
  // A member's identity claiming another member's rank: its signature does not verify.
  auto claims = peer(1, 3, ids);
  claims.rank = 2;  // rank 2 of the roster, with rank 1's key
  claims.identity.identity = ids.key(1);
  claims.join = {address};
  claims.join_timeout = 1500ms;
  CHECK_THROWS(tr::tcp::join(claims));  // (its own start checks the roster: rank 2's key is not its)
  const auto before = peer0.admission().refused;
  {
    // The same by hand: a well-formed handshake for rank 2, signed with rank 1's key.
    dt::transport::tcp_detail::credentials c;
    c.self.emplace(identity::key_pair::read(ids.key(1)));
    c.roster = identity::roster::read(ids.roster());
    dt::transport::tcp_detail::handshake machine;
    wire::hello h;
    h.rank = 2;
    h.world = 3;
    h.late = true;
    const auto [host, port] = wire::split_address(address);
    asio::ip::tcp::socket s(io);
    s.connect({asio::ip::make_address(host), port});
    auto hello = machine.start(h, c);
    auto write = [&](wire::frame_type type, const tr::bytes& body) {
      const auto head = wire::encode_header({type, 0, body.size(), {}});
      std::vector<std::byte> out(head.begin(), head.end());
      out.insert(out.end(), body.begin(), body.end());
      const auto pad = wire::padding(body.size());
      out.insert(out.end(), pad.begin(), pad.end());
      asio::write(s, asio::buffer(out));
    };
    write(wire::frame_type::hello, hello);
    std::array<std::byte, wire::header_bytes> head{};
    REQUIRE(!bench::read_within(s, asio::buffer(head), 20s));
    const auto ch = wire::decode_header(head.data(), 1 << 20);
    REQUIRE(ch.type == wire::frame_type::challenge);
    tr::bytes body(ch.length + wire::padding(ch.length).size());
    REQUIRE(!bench::read_within(s, asio::buffer(body), 20s));
    body.resize(ch.length);
    bool unproven = false;
    const auto got = machine.on_challenge(c, body, address, unproven);  // peer 0 proves itself: rank 0 of the roster
    CHECK(got.rank == 0);
    write(wire::frame_type::proof, got.proof);
    CHECK(bench::closed_within(s, 20s));  // closed, no welcome
  }
  CHECK(peer0.admission().refused == before + 1);
  CHECK_THAT(peer0.admission().last_rejected, Contains("is not that rank of the roster"));
}

TEST_CASE("tcp: a stranger learns nothing of the run before it proves its credentials, a member is told each difference") {
  const std::string key = "a run key of thirty-two bytes...";
  tr::tcp_options o;
  o.world = 4;
  o.key = key;
  o.settings = "model=gpt2;steps=1000";
  tr::tcp peer0(o);
  asio::io_context io;
  tr::tcp_options caller = o;
  caller.rank = 1;
  caller.world = 3;
  caller.settings = "model=tiny;steps=1000";
  {  // no key: told a key is needed, not the world size or the settings
    auto stranger = caller;
    stranger.key.clear();
    bench::hostile_peer h(io, peer0.address(), stranger, wire::hello_purpose::data, false);
    CHECK_FALSE(h.answer());
    CHECK_THAT(h.refusal(), Contains("admits only peers holding the run's key"));
    CHECK_THAT(h.refusal(), !Contains("world") && !Contains("gpt2") && !Contains("settings"));
  }
  {  // a wrong key: the challenge, then nothing but a closed connection
    auto wrong = caller;
    wrong.key = "another key, also thirty-two....";
    CHECK_THROWS_WITH(bench::hostile_peer(io, peer0.address(), wrong, wire::hello_purpose::data, false),
                      Contains("does not hold this run's key"));
  }
  {  // the key: told the difference, in a goodbye sealed under the connection's keys
    bench::hostile_peer h(io, peer0.address(), caller, wire::hello_purpose::data, false);
    CHECK_FALSE(h.answer());
    CHECK_THAT(h.refusal(), Contains("world of 4") && Contains("in one of 3"));
    caller.world = 4;
    bench::hostile_peer g(io, peer0.address(), caller, wire::hello_purpose::data, false);
    CHECK_FALSE(g.answer());
    CHECK_THAT(g.refusal(), Contains("model is gpt2 here and tiny there"));
  }
}

TEST_CASE("tcp: two peers that accept no connections prove their identities to each other through a relay") {
  // Ranks 1 and 2 listen nowhere: 2 reaches 1 through peer 0, and their handshake (each proves
  // its rank with its own key, the frame keys from an exchange the relay is not a party to) runs
  // over the relay's circuit.
  run_identities ids(3, "decentrain_identity_relay");
  tr::tcp peer0(peer(0, 3, ids));
  const auto address = peer0.address();
  auto joined = [&](int rank) {
    return std::async(std::launch::async, [&, rank] {
      auto o = peer(rank, 3, ids);
      o.listen.clear();
      o.punch_within = std::chrono::milliseconds(0);  // (relays, not a punched hole)
      o.join = {address};
      auto p = tr::tcp::join(o);
      dt::collective::communicator<tr::tcp> c(p);
      std::vector<float> v(1000, static_cast<float>(rank + 1));
      c.all_reduce(std::span<float>(v));
      const auto relayed = p.relayed();
      c.barrier();
      return std::pair{v[0], relayed};
    });
  };
  auto p1 = joined(1);
  auto p2 = joined(2);
  peer0.connect();
  {
    dt::collective::communicator<tr::tcp> c(peer0);
    std::vector<float> v(1000, 1.0f);
    c.all_reduce(std::span<float>(v));
    CHECK(v[999] == 6.0f);
    c.barrier();
  }
  const auto one = p1.get(), two = p2.get();
  CHECK(one.first == 6.0f);
  CHECK(two.first == 6.0f);
  CHECK(one.second == std::map<int, int>{{2, 0}});
  CHECK(two.second == std::map<int, int>{{1, 0}});
}
