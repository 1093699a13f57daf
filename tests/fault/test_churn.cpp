// The deterministic churn simulator: in-process peers taking turns on simulated time, killed,
// started again and joining as a seeded churn schedule says, under fault::elastic. The same seed
// must give the same run: the same losses at every step, the same membership history and the
// same final parameters, bit for bit; another seed a different history.
#include "support/trainer_fixture.hpp"

#include <bit>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

using namespace fixture;
using dt::train::trainer_options;

namespace {

struct process_record {
  std::vector<std::pair<std::int64_t, std::uint64_t>> losses;  // (step, the loss's bits: a step taken as another's state has NaN)
  std::vector<std::string> changes;                     // every membership change, as text
  std::vector<float> params;                            // at the end (empty: killed)
  std::string failure;
};

struct churn_run {
  std::map<std::pair<int, std::uint64_t>, process_record> processes;  // (rank, process)
  std::size_t kills = 0, starts = 0;
};

churn_run simulate(std::uint64_t churn_seed, std::int64_t steps) {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>, dt::parallel::data, dt::fault::elastic>;
  dt::transport::random_churn churn;
  churn.peers = 4;
  churn.joiners = 1;
  churn.seconds = static_cast<double>(steps) * 0.8;  // a step is 1 simulated second; none near the end
  churn.every_min_s = 15;
  churn.every_max_s = 30;
  churn.down_min_s = 3;
  churn.down_max_s = 10;
  churn.min_alive = 3;
  dt::transport::in_process::options o;
  o.peers_fail_alone = true;
  o.initial_peers = 4;
  o.deterministic = dt::transport::in_process::deterministic_run{1.0, churn.make(churn_seed)};
  churn_run out;
  for (const auto& e : o.deterministic->churn) (e.what == dt::transport::churn_event::kind::kill ? out.kills : out.starts)++;
  dt::transport::in_process net(dt::transport::links::lan(5), o);
  trainer_options opts;
  opts.steps = steps;
  opts.batch_size = 2;
  opts.eval_batches = 1;
  dt::comm::diloco<> comm;
  comm.inner_steps = 4;
  dt::fault::elastic fault;
  fault.agreement.timeout = std::chrono::milliseconds(5000);
  std::mutex m;
  net.run([&](dt::transport::in_process::endpoint& ep) {
    const auto key = std::pair{ep.rank(), net.restarts(ep.rank())};
    process_record rec;
    Trainer t(tiny_gpt(), opts, ep, comm, {}, fault);
    t.on_step([&](const dt::train::step_metrics& s) { rec.losses.emplace_back(s.step, std::bit_cast<std::uint64_t>(s.loss)); });
    auto keep = [&] {
      for (const auto& c : t.fault().changes()) {
        std::ostringstream text;  // (not string + string: g++ 12 -O2 warns falsely, -Wrestrict)
        text << "view " << c.epoch << " at step " << c.step << " members";
        for (int r : c.members) text << ' ' << r;
        text << " after " << c.seconds << " s: " << c.cause << (c.healed ? " (healed)" : "");
        rec.changes.push_back(text.str());
      }
      std::lock_guard lock(m);
      out.processes[key] = rec;
    };
    try {
      t.fit(small_corpus().data);
    } catch (...) {
      keep();
      throw;
    }
    rec.params = flat_params(t.model().parameters());
    keep();
  });
  for (auto& [key, rec] : out.processes) rec.failure = net.failure(key.first);
  return out;
}

}  // namespace

TEST_CASE("churn simulator: the same seed gives the same run, bit for bit; another seed another history") {
  const std::int64_t steps = 120;
  const auto a = simulate(7, steps);
  const auto b = simulate(7, steps);
  REQUIRE(a.kills >= 3);
  REQUIRE(a.starts >= 3);
  REQUIRE(a.processes.size() == b.processes.size());
  std::size_t finished = 0, healed_in = 0;
  std::vector<float> final_params;
  for (const auto& [key, ra] : a.processes) {
    INFO("peer " << key.first << ", process " << key.second);
    REQUIRE(b.processes.count(key));
    const auto& rb = b.processes.at(key);
    CHECK(ra.losses == rb.losses);
    CHECK(ra.changes == rb.changes);
    CHECK(ra.params == rb.params);
    CHECK(ra.failure.empty());
    if (!ra.params.empty()) {
      ++finished;
      if (final_params.empty()) final_params = ra.params;
      CHECK(ra.params == final_params);  // every peer that finished ends with the same model
      CHECK(ra.losses.back().first == steps);
    }
    if (key.second > 0 || key.first == 4) healed_in += ra.losses.empty() ? 0 : 1;
  }
  CHECK(finished >= 4);
  CHECK(healed_in >= 4);  // processes started by the schedule (the joiner, and killed ones again) were admitted and trained

  const auto c = simulate(8, steps);
  std::vector<std::string> history_a, history_c;
  for (const auto& [key, r] : a.processes) history_a.insert(history_a.end(), r.changes.begin(), r.changes.end());
  for (const auto& [key, r] : c.processes) history_c.insert(history_c.end(), r.changes.begin(), r.changes.end());
  CHECK(history_a != history_c);
}

TEST_CASE("in_process deterministic: waits end on simulated time, in the order of the clocks, whatever the threads do") {
  dt::transport::in_process::options o;
  o.deterministic = dt::transport::in_process::deterministic_run{};
  o.recv_timeout = std::chrono::milliseconds(10000);
  dt::transport::in_process net(dt::transport::links::lan(3), o);
  std::vector<std::string> order;  // appended in turn: one peer runs at a time
  std::vector<double> clocks(3);
  net.run([&](dt::transport::in_process::endpoint& ep) {
    const std::byte b{1};
    if (ep.rank() == 0) {
      ep.computed(5.0);  // sends at 5 s simulated
      ep.send(1, 7, std::span<const std::byte>(&b, 1));
      order.push_back("0 sent");
    } else if (ep.rank() == 1) {
      (void)ep.recv(0, 7);  // arrives after 5 s
      order.push_back("1 received");
    } else {
      try {
        (void)ep.recv_within(0, 8, std::chrono::milliseconds(2000));  // never sent: times out at 2 s simulated
      } catch (const dt::transport::peer_error& e) {
        order.push_back(std::string("2 timed out: ") + e.what());
      }
    }
    clocks[static_cast<std::size_t>(ep.rank())] = ep.stats().clock_seconds;
  });
  // Peer 0 runs first (all clocks at 0: the lowest rank) until it waits, so it sends at once;
  // then the earliest event is peer 2's deadline at 2 s, before the message lands at 5 s.
  REQUIRE(order.size() == 3);
  CHECK(order[0] == "0 sent");
  CHECK(order[1].find("2 timed out") == 0);
  CHECK(order[1].find("within 2000 ms") != std::string::npos);
  CHECK(order[2] == "1 received");
  CHECK(clocks[2] == 2.0);
  CHECK(clocks[1] > 5.0);
}

TEST_CASE("in_process deterministic: a rank started again is refused until the others forgot its old process") {
  dt::transport::in_process::options o;
  o.peers_fail_alone = true;
  o.deterministic = dt::transport::in_process::deterministic_run{};
  o.deterministic->churn = {{1.0, dt::transport::churn_event::kind::kill, 1}, {2.0, dt::transport::churn_event::kind::start, 1}};
  dt::transport::in_process net(dt::transport::links::ideal(2), o);
  std::vector<int> connected_before, connected_after;
  bool joined_late = false;
  net.run([&](dt::transport::in_process::endpoint& ep) {
    if (ep.rank() == 1) {
      if (!ep.joined_late()) return (void)ep.recv(0, 1);  // killed at 1 s while it waits
      joined_late = true;
      for (int i = 0; i < 3 && ep.connected().empty(); ++i) {
        ep.pause(std::chrono::milliseconds(1000));
        ep.rediscover();
      }
      connected_after = ep.connected();
      return;
    }
    ep.pause(std::chrono::milliseconds(3000));  // the new process of 1 has started
    connected_before = ep.connected();          // refused: this peer still counts on the old one
    ep.forget(1);
    ep.pause(std::chrono::milliseconds(2000));
  });
  CHECK(joined_late);
  CHECK(connected_before.empty());
  CHECK(connected_after == std::vector<int>{0});
  CHECK(net.restarts(1) == 1);
  CHECK(net.failure(1).empty());
}
