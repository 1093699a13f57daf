// Members that lie in the membership protocol (fault/membership/agreement.hpp): forged views,
// reports that accuse an honest peer, a leader that shows different views to different members,
// joiners that are never admissible. The honest members run agree() on in-process peers (or
// train over TCP); the liar speaks the protocol by hand. With 5 members one liar is tolerated: no
// honest member is barred, stops or is split off, and the liar is named. Catch's checks run on
// this thread, from what each peer recorded.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <asio.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hostile_peer.hpp"
#include "random_insider.hpp"
#include "support/trainer_fixture.hpp"

namespace dt = decentrain;
namespace fd = dt::fault::detail;
using namespace std::chrono_literals;
using Catch::Contains;

namespace {

struct outcome {
  std::optional<dt::fault::decision> d;
  std::string failure;
};

// Members 0..n-1 of view `current` agree; `liar` (if >= 0) runs `lie(ep)` instead. Returns each
// honest member's outcome.
std::map<int, outcome> agree_with(int n, const dt::fault::view& current, int liar,
                                  const std::function<void(dt::transport::in_process::endpoint&)>& lie,
                                  std::map<int, dt::fault::suspicions> suspects = {}) {
  dt::transport::in_process::options o;
  o.recv_timeout = 20s;
  dt::transport::in_process net(dt::transport::links::ideal(n), o);
  dt::fault::agreement_settings s;
  s.timeout = 1500ms;
  s.patience = 8s;
  std::map<int, outcome> out;
  std::mutex m;
  net.run([&](dt::transport::in_process::endpoint& ep) {
    if (ep.rank() == liar) return lie(ep);
    outcome r;
    try {
      r.d = dt::fault::agree(ep, current, suspects[ep.rank()], dt::fault::position{10, 3}, s);
    } catch (const std::exception& e) {
      r.failure = e.what();
    }
    std::lock_guard lock(m);
    out[ep.rank()] = std::move(r);
  });
  return out;
}

dt::fault::view five() {
  dt::fault::view v;
  v.members = {0, 1, 2, 3, 4};
  return v;
}

fd::message report_of(std::uint64_t epoch, std::int64_t step, int leader = 0) {
  fd::message r;
  r.what = fd::kind::report;
  r.epoch = epoch;
  r.step = step;
  r.phase = 3;
  r.donor = leader;
  return r;
}

// Every honest member decided the same view: returns it (checks run here, on the test's thread).
dt::fault::view same_view(const std::map<int, outcome>& out) {
  std::optional<dt::fault::view> v;
  for (const auto& [r, o] : out) {
    INFO("peer " << r << ": " << o.failure);
    REQUIRE(o.d);
    if (!v) v = o.d->next;
    CHECK(o.d->next.members == v->members);
    CHECK(o.d->next.barred == v->barred);
    CHECK(o.d->next.epoch == v->epoch);
  }
  REQUIRE(v);
  return *v;
}

}  // namespace

TEST_CASE("membership: a liar that accuses an honest member alone, as departed and of poison, has it neither removed nor barred") {
  // Peer 4 reports peer 1 departed and convicted; it follows the protocol otherwise.
  const auto out = agree_with(5, five(), 4, [](auto& ep) {
    auto r = report_of(0, 10);
    r.departed = {1};
    r.convicted = {2};
    for (int j : {0, 1, 2, 3}) fd::post(ep, j, r);
    const auto v = fd::await(ep, 0, dt::transport::now(ep) + 10s, [](const fd::message& m) { return m.what == fd::kind::view; });
    fd::message e;
    e.what = fd::kind::echo;
    e.epoch = 1;
    e.donor = 0;
    e.digest = fd::digest_of(v);
    for (int j : {0, 1, 2, 3}) fd::post(ep, j, e);
  });
  const auto v = same_view(out);
  CHECK(v.members == std::vector<int>{0, 1, 2, 3, 4});  // all kept, the liar too (it only lied)
  CHECK(v.barred.empty());
}

TEST_CASE("membership: forged views (a rank out of range, sent by a member that does not lead) are followed by no one") {
  const auto out = agree_with(5, five(), 4, [](auto& ep) {
    // To the leader and to the others: a view of epoch 1 naming rank 5000, then one that leaves
    // out peer 2, both from a member that does not lead; and its report.
    fd::message v;
    v.what = fd::kind::view;
    v.epoch = 1;
    v.ranks = {0, 1, 5000};
    v.departed = {2, 3, 4};
    v.donor = 0;
    fd::message w = v;
    w.ranks = {0, 1, 3, 4};
    w.departed = {2};
    for (int j : {0, 1, 2, 3}) {
      fd::post(ep, j, v);
      fd::post(ep, j, w);
      fd::post(ep, j, report_of(0, 10));
    }
    const auto real = fd::await(ep, 0, dt::transport::now(ep) + 10s, [](const fd::message& m) { return m.what == fd::kind::view; });
    fd::message e;
    e.what = fd::kind::echo;
    e.epoch = 1;
    e.donor = 0;
    e.digest = fd::digest_of(real);
    for (int j : {0, 1, 2, 3}) fd::post(ep, j, e);
  });
  const auto v = same_view(out);
  CHECK(v.members == std::vector<int>{0, 1, 2, 3, 4});
  // And the view a leader sends is checked: rank 5000 is refused, naming what is wrong.
  auto bad = fd::message{};
  bad.what = fd::kind::view;
  bad.epoch = 1;
  bad.ranks = {0, 1, 5000};
  bad.departed = {2, 3, 4};
  bad.donor = 0;
  CHECK_THAT(*fd::invalid_view(bad, five(), 8), Contains("name a rank outside [0, 8)"));
  bad.ranks = {1, 0};
  CHECK_THAT(*fd::invalid_view(bad, five(), 8), Contains("not ascending"));
  bad.ranks = {0, 1};
  bad.departed = {2, 3};
  CHECK_THAT(*fd::invalid_view(bad, five(), 8), Contains("neither keeps nor removes member 4"));
  bad.departed = {2, 3, 4};
  bad.donor = 3;
  CHECK_THAT(*fd::invalid_view(bad, five(), 8), Contains("donor 3 is not a member at the target"));
  auto five_barred = five();
  five_barred.barred = {6};
  bad.donor = 0;
  CHECK_THAT(*fd::invalid_view(bad, five_barred, 8), Contains("lifts the bar on peer 6"));
  auto r = report_of(0, 10);
  r.convicted = {7};
  CHECK_THAT(*fd::invalid_report(r, five(), 8), Contains("outside the view"));
  r = report_of(3, 10);
  CHECK_THAT(*fd::invalid_report(r, five(), 8), Contains("a report of view 3 in view 0"));
  r = report_of(0, 10, 6);
  CHECK_THAT(*fd::invalid_report(r, five(), 8), Contains("a report to a leader outside the view"));
}

TEST_CASE("membership: a leader that shows two views is caught by the echoes, followed by no one, and barred by the others") {
  // Peer 0 leads: it takes the reports, then sends peers 1 and 2 one view and peers 3 and 4
  // another, each well-formed and justified by the reports (they differ in the donor only), so
  // only the echoes can tell. Or it leaves out a member that reported: the reports tell.
  for (const bool justified : {true, false}) {
    const auto out = agree_with(5, five(), 0, [&](auto& ep) {
      for (int j : {1, 2, 3, 4})
        (void)fd::await(ep, j, dt::transport::now(ep) + 10s, [](const fd::message& m) { return m.what == fd::kind::report; });
      fd::message v1;
      v1.what = fd::kind::view;
      v1.epoch = 1;
      v1.step = 10;
      v1.phase = 3;
      v1.ranks = {0, 1, 2, 3, 4};
      v1.donor = 1;
      fd::message v2 = v1;
      v2.donor = 2;
      if (!justified) {
        v1.ranks = {0, 1, 2, 3};
        v1.departed = {4};
      }
      for (int j : {1, 2}) fd::post(ep, j, v1);
      for (int j : {3, 4}) fd::post(ep, j, v2);
      dt::transport::pause(ep, 6s);  // then it waits, as a member that went on would
    });
    INFO((justified ? "two views, each justified" : "a view that leaves out a member that reported"));
    const auto v = same_view(out);
    CHECK(v.members == std::vector<int>{1, 2, 3, 4});
    // Two views of one leader reach every honest member as echoes: all accuse it, and it is
    // barred. A view the reports do not justify is refused by those who got it, who name it
    // (peers 1 and 2 here); the others only find that no quorum followed it: 0 is left out.
    CHECK(v.barred == (justified ? std::vector<int>{0} : std::vector<int>{}));
    for (const int r : justified ? std::vector<int>{1, 2, 3, 4} : std::vector<int>{1, 2}) {
      INFO("peer " << r);
      REQUIRE(out.at(r).d->named.count(0));
      CHECK_THAT(out.at(r).d->named.at(0), Contains(justified ? "sent different views of epoch 1" : "it leaves out peer 4, which reported here"));
    }
  }
}

TEST_CASE("membership: against insiders a partition that leaves no side the echo quorum waits for the heal, crash-only rules let the majority go on") {
  // Peers 3 and 4 never answer (cut off, not departed): 0-2 are 3 of 5, short of the quorum of 4.
  auto run = [](int liars) {
    dt::transport::in_process::options o;
    o.recv_timeout = 20s;
    dt::transport::in_process net(dt::transport::links::ideal(5), o);
    std::mutex m;
    std::map<int, outcome> out;
    net.run([&](dt::transport::in_process::endpoint& ep) {
      if (ep.rank() >= 3) return dt::transport::pause(ep, 8s);
      dt::fault::agreement_settings s;
      s.timeout = 1000ms;
      s.patience = 4s;
      s.liars = liars;
      outcome r;
      try {
        r.d = dt::fault::agree(ep, five(), {}, dt::fault::position{10, 3}, s);
      } catch (const std::exception& e) {
        r.failure = e.what();
      }
      std::lock_guard lock(m);
      out[ep.rank()] = std::move(r);
    });
    return out;
  };
  const auto tolerated = run(-1);
  for (int r : {0, 1, 2}) {
    INFO("peer " << r);
    CHECK_FALSE(tolerated.at(r).d);  // waited its patience out, then left out (no side trained meanwhile)
    CHECK_THAT(tolerated.at(r).failure, Contains("whose view a quorum followed within 4000 ms"));
  }
  CHECK(same_view(run(0)).members == std::vector<int>{0, 1, 2});
}

TEST_CASE("elastic over TCP: two hundred fake joiners, connected and saying nothing or that they reach too few, cost the group no view change") {
  // Three key-holding peers train; meanwhile 200 callers that hold the key join peer 0 as new
  // ranks: half say nothing, half say hello naming only peer 0. None is admissible (a joiner must
  // reach every member), so none may start an agreement.
  const std::string key = "a run key of thirty-two bytes...";
  auto cfg = dt::nn::gpt_preset("tiny");
  cfg.vocab_size = 32;
  cfg.block_size = 16;
  cfg.n_layer = 1;
  std::vector<std::int32_t> tokens(1 << 14);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>((i * 7 + i / 5) % 32);
  const dt::data::token_dataset data(tokens);
  dt::train::trainer_options opts;
  opts.steps = 60;
  opts.batch_size = 2;
  opts.eval_batches = 1;
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>, dt::parallel::data, dt::fault::elastic>;
  dt::comm::diloco<> comm;
  comm.inner_steps = 2;
  dt::fault::elastic fault;
  fault.agreement.timeout = 5s;
  std::vector<dt::transport::tcp_options> o(3);
  for (int r = 0; r < 3; ++r) {
    o[static_cast<std::size_t>(r)].rank = r;
    o[static_cast<std::size_t>(r)].world = 3;
    o[static_cast<std::size_t>(r)].max_world = 512;
    o[static_cast<std::size_t>(r)].key = key;
    o[static_cast<std::size_t>(r)].join_timeout = 10s;
    o[static_cast<std::size_t>(r)].recv_timeout = 20s;
  }
  dt::transport::tcp peer0(o[0]);
  const auto address = peer0.address();
  std::vector<std::uint64_t> changes(3, 99);
  std::vector<std::vector<float>> params(3);
  std::vector<std::string> failures(3);
  std::atomic<int> steps0{0};
  std::atomic<bool> zero_ended{false};  // peer 0 finished or failed: nothing more to wait for
  auto train = [&](int r, dt::transport::tcp ep) {
    try {
      Trainer t(cfg, opts, ep, comm, {}, fault);
      if (r == 0) t.on_step([&](const dt::train::step_metrics& m) { steps0 = static_cast<int>(m.step); });
      t.fit(data);
      changes[static_cast<std::size_t>(r)] = t.fault().change_count();
      dt::comm::gather_values(t.model().parameters(), params[static_cast<std::size_t>(r)]);
    } catch (const std::exception& e) {
      failures[static_cast<std::size_t>(r)] = e.what();
    }
    if (r == 0) zero_ended = true;
  };
  // Until peer 0 has done `steps` steps, it has ended, or a minute has passed.
  const auto wait_for_zero = [&](int steps) {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (steps0 < steps && !zero_ended && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  };
  std::vector<std::thread> peers;
  for (int r = 1; r < 3; ++r)
    peers.emplace_back([&, r] {
      auto oo = o[static_cast<std::size_t>(r)];
      oo.join = {address};
      train(r, dt::transport::tcp::join(oo));
    });
  peer0.connect();
  std::thread zero([&] { train(0, peer0); });
  std::thread fakes([&] {
    asio::io_context io;
    std::vector<std::unique_ptr<bench::hostile_peer>> held;
    wait_for_zero(5);
    for (int rank = 3; rank < 203; ++rank) {
      auto oo = o[0];
      oo.rank = rank;
      try {
        auto h = std::make_unique<bench::hostile_peer>(io, address, oo, dt::transport::wire::hello_purpose::data, true, 300ms);
        if (h->answer() && rank % 2) {
          fd::message hello;
          hello.what = fd::kind::hello;
          hello.ranks = {0};
          const auto b = dt::transport::wire::encode_body(hello);
          h->send(fd::protocol_tag, b);
        }
        held.push_back(std::move(h));
      } catch (const std::exception&) {
      }
    }
    wait_for_zero(static_cast<int>(opts.steps));
  });
  zero.join();
  for (auto& p : peers) p.join();
  fakes.join();
  for (int r = 0; r < 3; ++r) {
    INFO("peer " << r << ": " << failures[static_cast<std::size_t>(r)]);
    CHECK(failures[static_cast<std::size_t>(r)].empty());
    CHECK(changes[static_cast<std::size_t>(r)] == 0);  // no view change at all
    CHECK(params[static_cast<std::size_t>(r)] == params[0]);
  }
  CHECK(peer0.admission().joiners_turned_away >= 200 - 16);
}

namespace {

// A TCP peer whose first large state chunk goes out with one byte changed: a donor that serves
// what its offer did not say.
struct lying_donor {
  dt::transport::tcp ep;
  std::shared_ptr<std::atomic<bool>> lied = std::make_shared<std::atomic<bool>>(false);

  int rank() const { return ep.rank(); }
  int world() const { return ep.world(); }
  void send(int peer, dt::transport::tag_type tag, std::span<const std::byte> data) {
    if (tag == fd::state_tag && data.size() >= 4096 && !lied->exchange(true)) {
      dt::transport::bytes changed(data.begin(), data.end());
      changed[100] ^= std::byte{0x40};
      return ep.send(peer, tag, changed);
    }
    ep.send(peer, tag, data);
  }
  dt::transport::bytes recv(int peer, dt::transport::tag_type tag) { return ep.recv(peer, tag); }
  dt::transport::received recv_any(std::span<const int> sources, dt::transport::tag_type tag) { return ep.recv_any(sources, tag); }
  std::optional<dt::transport::bytes> try_recv(int peer, dt::transport::tag_type tag) { return ep.try_recv(peer, tag); }
  dt::transport::traffic_stats stats() const { return ep.stats(); }
  void computed(double s) { ep.computed(s); }
  dt::transport::bytes recv_within(int peer, dt::transport::tag_type tag, std::chrono::milliseconds t) {
    return ep.recv_within(peer, tag, t);
  }
  void discard_before(int peer, dt::transport::tag_type tag) { ep.discard_before(peer, tag); }
  void set_epoch(std::uint64_t e) { ep.set_epoch(e); }
  std::optional<dt::transport::alarm> alarmed() const { return ep.alarmed(); }
  void forget(int peer) { ep.forget(peer); }
  void bar(int peer, const std::string& reason) { ep.bar(peer, reason); }
  void leave(const std::string& reason) { ep.leave(reason); }
  bool joined_late() const { return ep.joined_late(); }
  std::vector<int> connected() const { return ep.connected(); }
  int capacity() const { return ep.capacity(); }
  void rediscover() { ep.rediscover(); }
  void set_members(const std::vector<int>& m) { ep.set_members(m); }
  void expect(int peer, dt::transport::tag_type tag, std::uint64_t size) { ep.expect(peer, tag, size); }
  void allow(dt::transport::tag_type tag, std::uint64_t size) { ep.allow(tag, size); }
};
static_assert(dt::transport::joining_endpoint<lying_donor>);

}  // namespace

TEST_CASE("elastic over TCP: a donor whose chunk does not hash as its offer said is named, and the chunk is taken from another") {
  // Three members under sync all-reduce hold the same state and all serve a joiner; peer 1 changes
  // a byte of the first chunk it serves.
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::sync_allreduce<>, dt::parallel::data, dt::fault::elastic>;
  auto cfg = dt::nn::gpt_preset("tiny");
  cfg.vocab_size = 32;
  cfg.block_size = 16;
  cfg.n_layer = 1;
  std::vector<std::int32_t> tokens(1 << 14);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>((i * 7 + i / 5) % 32);
  const dt::data::token_dataset data(tokens);
  dt::train::trainer_options opts;
  opts.steps = 60;
  opts.batch_size = 2;
  opts.eval_batches = 1;
  dt::fault::elastic fault;
  fault.agreement.timeout = 10s;
  fault.agreement.state_chunk_bytes = 4096;  // many chunks, every donor serves some
  dt::transport::tcp_options base;
  base.world = 3;
  base.max_world = 4;
  base.recv_timeout = 20s;
  base.join_timeout = 10s;
  dt::transport::tcp first(base);
  const auto seed = first.address();
  // The joiner waits for peer 0's step 5, at most a minute, and no longer once a member has
  // ended (the group will not open to it then).
  std::atomic<bool> open{false}, member_ended{false};
  std::vector<std::vector<float>> params(4);
  std::vector<std::vector<dt::fault::membership_change>> changes(4);
  std::vector<std::string> failures(4);
  auto run_peer = [&](int r, std::optional<dt::transport::tcp> pre) {
    try {
      auto o = base;
      o.rank = r;
      o.join = {seed};
      if (r == 3) {
        const auto deadline = std::chrono::steady_clock::now() + 60s;
        while (!open && !member_ended && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
        if (!open)
          throw dt::error(member_ended ? "a member ended before the group opened to the joiner"
                                       : "the group did not open to the joiner within 60 s");
      }
      dt::transport::tcp ep = pre ? std::move(*pre) : dt::transport::tcp(o);
      ep.connect();
      auto train = [&](auto endpoint) {
        Trainer t(cfg, opts, std::move(endpoint), dt::comm::sync_allreduce<>{}, {}, fault);
        t.on_step([&, r](const dt::train::step_metrics& m) {
          if (r == 0 && m.step == 5) open = true;
          if (t.members().size() < 4) std::this_thread::sleep_for(20ms);
        });
        t.fit(data);
        dt::comm::gather_values(t.model().parameters(), params[static_cast<std::size_t>(r)]);
        changes[static_cast<std::size_t>(r)] = t.fault().changes();
      };
      if (r == 1) train(lying_donor{std::move(ep)});
      else train(std::move(ep));
    } catch (const std::exception& e) {
      failures[static_cast<std::size_t>(r)] = e.what();
    }
    if (r < 3) member_ended = true;
  };
  std::vector<std::thread> threads;
  threads.emplace_back(run_peer, 0, std::move(first));
  for (int r = 1; r < 4; ++r) threads.emplace_back(run_peer, r, std::nullopt);
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) {
    INFO("peer " << r << ": " << failures[static_cast<std::size_t>(r)]);
    CHECK(failures[static_cast<std::size_t>(r)].empty());
    CHECK(params[static_cast<std::size_t>(r)] == params[0]);
  }
  const auto& joined = changes[3];
  REQUIRE(!joined.empty());
  REQUIRE(joined.front().named.count(1));
  CHECK_THAT(joined.front().named.at(1), Contains("did not hash as its offer said"));
  CHECK(joined.front().healed);
}

// bench/random_insider.hpp: peer 3 of 4 trains under fault::elastic over TCP and, after each of
// its steps, sends the honest peers 24 messages of every type a member may send (the membership
// protocol's six kinds, alarms, state offers and chunks, handoffs, data frames), half well-formed
// and in range, half with random fields or bytes. bench/attacks runs it for 10 minutes.
TEST_CASE("elastic over TCP: a member that sends every message type, half of them with random fields, for 10 s stops no honest peer, which end equal",
          "[insiders][random-insider]") {
  bench::random_insider::settings s;
  s.duration = 10s;  // bench/attacks runs the same for 10 minutes
  s.seed = 20261126;
  const auto out = bench::random_insider::run<dt::comm::sync_allreduce<>>(fixture::tiny_gpt(), fixture::small_corpus().data, s);
  std::int64_t total = 0;
  for (const auto& [what, n] : out.sent) total += n;
  INFO("sent " << total << " (" << out.well_formed << " well-formed), liar back " << out.liar_returns
               << " times, last: " << out.liar_last_error << "; " << out.views << " views; RSS " << out.rss_start_mb
               << " -> " << out.rss_peak_mb << " MB");
  for (std::size_t r = 0; r < out.honest_errors.size(); ++r) {
    INFO("honest peer " << r << ": " << out.honest_errors[r]);
    CHECK(out.honest_errors[r].empty());
    CHECK(out.honest_steps[r] >= 10);
  }
  CHECK(out.honest_equal());
  CHECK(out.sent.size() == 10);  // six membership kinds, alarms, state, handoffs, data
  CHECK(2 * out.well_formed + 1 >= total);
  CHECK(total >= 200);
  // Three honest peers in this process, each holding at most a member's budget and control room
  // (64 + 4 MiB) of what the liar sent: growth beyond that would be a leak.
  CHECK(out.rss_peak_mb - out.rss_start_mb <= 3 * 68 + 64);
}
