// The deterministic churn simulator: in-process peers taking turns on simulated time, killed,
// started again and joining as a seeded churn schedule says, under fault::elastic. The same seed
// must give the same run: the same losses at every step, the same membership history and the
// same final parameters, bit for bit; another seed a different history.
#include "support/trainer_fixture.hpp"

#include <algorithm>
#include <bit>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

using namespace fixture;
using dt::train::trainer_options;

namespace {

struct process_record {
  std::vector<std::pair<std::int64_t, std::uint64_t>> losses;  // (step, the loss's bits: a step taken as another's state has NaN)
  std::vector<std::string> changes;                     // every membership change, as text
  std::vector<float> params;                            // at the end (empty: killed)
  std::string failure;
  // With a deadline: the replicas' rounds this process closed without (as leader), the rounds it
  // missed, the steps it skipped, and the rounds it led.
  std::int64_t dropped = 0, missed = 0, skipped = 0, led = 0;
};

// Trains `t` on the small corpus, recording every step's loss in `rec`, and calls `keep` when
// fit ends, also when it throws (the parameters only when it finished).
template <class Trainer, class Keep>
void fit_recording(Trainer& t, process_record& rec, Keep&& keep) {
  t.on_step([&](const dt::train::step_metrics& s) { rec.losses.emplace_back(s.step, std::bit_cast<std::uint64_t>(s.loss)); });
  try {
    t.fit(small_corpus().data);
  } catch (...) {
    keep();
    throw;
  }
  rec.params = flat_params(t.model().parameters());
  keep();
}

struct churn_run {
  std::map<std::pair<int, std::uint64_t>, process_record> processes;  // (rank, process)
  std::size_t kills = 0, starts = 0;
};

// `deadline`: DiLoCo sized to speed on peers of speeds 1x-2.5x with a straggler tail (an inner
// step 10x as long with probability 0.1), each round closed at the observed deadline
// (comm/round_deadline.hpp): the replicas pass a round's start apart, a late one skipping it.
churn_run simulate(std::uint64_t churn_seed, std::int64_t steps, bool deadline = false) {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>, dt::parallel::data, dt::fault::elastic>;
  dt::transport::random_churn churn;
  churn.peers = 4;
  churn.joiners = 1;
  // (a step is 1 simulated second, with a deadline about 2: its slowest peer's straggling inner
  // steps; no churn near the end)
  churn.seconds = static_cast<double>(steps) * (deadline ? 1.2 : 0.8);
  churn.every_min_s = 15;
  churn.every_max_s = 30;
  churn.down_min_s = 3;
  churn.down_max_s = 10;
  churn.min_alive = 3;
  dt::transport::in_process::options o;
  o.peers_fail_alone = true;
  o.initial_peers = 4;
  o.deterministic = dt::transport::in_process::deterministic_run{1.0, churn.make(churn_seed)};
  if (deadline) {
    o.speeds = {1.0, 2.5, 1.5, 2.0, 1.25};
    o.straggle = {0.1, 10};
  }
  churn_run out;
  for (const auto& e : o.deterministic->churn) (e.what == dt::transport::churn_event::kind::kill ? out.kills : out.starts)++;
  dt::transport::in_process net(dt::transport::links::lan(5), o);
  trainer_options opts;
  opts.steps = steps;
  opts.batch_size = 2;
  opts.eval_batches = 1;
  dt::comm::diloco<> comm;
  comm.inner_steps = 4;
  if (deadline) {
    comm.sized_to_speed = true;
    comm.deadline.emplace();
  }
  dt::fault::elastic fault;
  // (with a deadline: a straggling inner step, up to 10 s, is not a frozen peer, the alarm being
  // seen at a step's start; members take a joiner in at a round's start, rounds of about 10 s)
  fault.agreement.timeout = std::chrono::milliseconds(deadline ? 15000 : 5000);
  if (deadline) fault.admission_timeout = std::chrono::milliseconds(45000);
  std::mutex m;
  net.run([&](dt::transport::in_process::endpoint& ep) {
    const auto key = std::pair{ep.rank(), net.restarts(ep.rank())};
    process_record rec;
    Trainer t(tiny_gpt(), opts, ep, comm, {}, fault);
    auto keep = [&] {
      for (const auto& c : t.fault().changes()) {
        std::ostringstream text;  // (not string + string: g++ 12 -O2 warns falsely, -Wrestrict)
        text << "view " << c.epoch << " at step " << c.step << " members";
        for (int r : c.members) text << ' ' << r;
        text << " after " << c.seconds << " s: " << c.cause << (c.healed ? " (healed)" : "");
        rec.changes.push_back(text.str());
      }
      rec.dropped = t.policy().deadlines().dropped();
      rec.missed = t.policy().deadlines().missed();
      rec.led = static_cast<std::int64_t>(t.policy().deadlines().rounds().size());
      rec.skipped = t.skipped_steps();
      std::lock_guard lock(m);
      out.processes[key] = rec;
    };
    fit_recording(t, rec, keep);
  });
  for (auto& [key, rec] : out.processes) rec.failure = net.failure(key.first);
  return out;
}

// Runs `a` and `b` of one seed: the same, process by process; none failed; every process that
// finished ends on one model at the run's end. Returns how many finished, and how many processes
// the schedule started (the joiner, killed ones again) were admitted and trained.
std::pair<std::size_t, std::size_t> check_replayed(const churn_run& a, const churn_run& b, std::int64_t steps) {
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
    INFO("failure: " << ra.failure);
    CHECK(ra.failure.empty());
    if (!ra.params.empty()) {
      ++finished;
      if (final_params.empty()) final_params = ra.params;
      CHECK(ra.params == final_params);  // every peer that finished ends with the same model
      CHECK(ra.losses.back().first == steps);
    }
    if (key.second > 0 || key.first == 4) healed_in += ra.losses.empty() ? 0 : 1;
  }
  return {finished, healed_in};
}

}  // namespace

TEST_CASE("churn simulator: the same seed gives the same run, bit for bit, and another seed another history") {
  const std::int64_t steps = 120;
  const auto a = simulate(7, steps);
  const auto b = simulate(7, steps);
  REQUIRE(a.kills >= 3);
  REQUIRE(a.starts >= 3);
  const auto [finished, healed_in] = check_replayed(a, b, steps);
  CHECK(finished >= 4);
  CHECK(healed_in >= 4);  // processes started by the schedule (the joiner, and killed ones again) were admitted and trained

  const auto c = simulate(8, steps);
  std::vector<std::string> history_a, history_c;
  for (const auto& [key, r] : a.processes) history_a.insert(history_a.end(), r.changes.begin(), r.changes.end());
  for (const auto& [key, r] : c.processes) history_c.insert(history_c.end(), r.changes.begin(), r.changes.end());
  CHECK(history_a != history_c);
}

TEST_CASE("churn simulator: rounds closed at a deadline go on through kills and joins, every survivor on one model") {
  // Under fault::elastic with a deadline the members do not meet at a round's start: a late
  // replica skips it. A joiner is taken in by the member that sees it (the others are alarmed),
  // a kill is found where the leader or a member waits, and whoever is behind the view's target
  // takes the state of one at it.
  const std::int64_t steps = 120;
  const auto a = simulate(7, steps, true);
  const auto b = simulate(7, steps, true);
  REQUIRE(a.kills >= 3);
  const auto [finished, healed_in] = check_replayed(a, b, steps);
  CHECK(finished >= 4);
  CHECK(healed_in >= 4);
  std::int64_t dropped = 0, missed = 0, skipped = 0, led = 0;
  for (const auto& [key, r] : a.processes) {
    led += r.led;
    if (key.second == 0 && !r.params.empty()) {  // (a process started again counts from its start)
      dropped = std::max(dropped, r.dropped);
      missed = std::max(missed, r.missed);
      skipped = std::max(skipped, r.skipped);
    }
  }
  // The deadline was at work: rounds closed without a late replica, which took the group's
  // average and skipped ahead (the counts of a peer that ran the whole run).
  INFO("rounds led " << led << "; a peer of the whole run: contributions dropped " << dropped << ", rounds missed " << missed
                     << ", steps skipped " << skipped);
  CHECK(led >= steps / 8);
  CHECK(dropped >= 3);
  CHECK(missed >= 3);
  CHECK(skipped >= 3);
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

TEST_CASE("in_process deterministic: a group of its peers keeps the simulated clock and waits on it") {
  // (a view after a group change is one: DiLoCo's round deadline times its replicas on it)
  dt::transport::in_process::options o;
  o.deterministic = dt::transport::in_process::deterministic_run{};
  dt::transport::in_process net(dt::transport::links::ideal(2), o);
  std::vector<double> before(2, -1), after(2, -1), beneath(2, -1);
  net.run([&](dt::transport::in_process::endpoint& ep) {
    using endpoint = dt::transport::in_process::endpoint;
    const auto r = static_cast<std::size_t>(ep.rank());
    dt::collective::group_view<endpoint> view(std::shared_ptr<endpoint>(std::shared_ptr<endpoint>{}, &ep), {0, 1}, 7);
    const auto seconds = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double>(t.time_since_epoch()).count();
    };
    before[r] = seconds(dt::transport::now(view));
    dt::transport::pause(view, std::chrono::milliseconds(2500));  // simulated: no real sleep
    after[r] = seconds(dt::transport::now(view));
    beneath[r] = seconds(dt::transport::now(ep));
  });
  CHECK(before == std::vector<double>{0.0, 0.0});
  CHECK(after == std::vector<double>{2.5, 2.5});
  CHECK(beneath == after);
}

TEST_CASE("in_process deterministic: a goodbye arrives after what was sent before it, as on a TCP stream") {
  dt::transport::in_process::options o;
  o.deterministic = dt::transport::in_process::deterministic_run{};
  dt::transport::in_process net(dt::transport::links::lan(2), o);  // 10 Gbit/s: 10 MB take 8 ms on the wire
  std::size_t got = 0;
  std::string after;
  net.run([&](dt::transport::in_process::endpoint& ep) {
    if (ep.rank() == 1) {
      ep.send(0, 7, std::vector<std::byte>(10'000'000));
      ep.leave("peer 1 stopped");
      return;
    }
    got = ep.recv(1, 7).size();  // not failed by the goodbye, whose news would travel faster
    try {
      (void)ep.recv(1, 7);
    } catch (const dt::transport::peer_error& e) {
      after = e.what();
    }
  });
  CHECK(got == 10'000'000);
  CHECK(after.find("peer 1 stopped") != std::string::npos);
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

namespace {

struct partition_run {
  std::map<int, process_record> peers;
  std::vector<std::vector<std::int64_t>> removed_then_joined;  // per peer: each view's (removed count, joined count)
};

// `peers` (5) DiLoCo peers on simulated LAN links, 60 steps of 1 simulated second, with `cuts`
// (none: a clean run) and the elastic policy's `left_out`.
// `liars` 0: crash faults only, so a side with a majority of the view goes on (with liars
// tolerated, the default, no side of a 3 + 2 cut has the echo quorum of 4: all wait for the heal).
partition_run run_partitioned(std::vector<dt::transport::in_process::partition> cuts, dt::fault::elastic::when_left_out left_out,
                              int liars = 0, int peers = 5) {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>, dt::parallel::data, dt::fault::elastic>;
  dt::transport::in_process::options o;
  o.peers_fail_alone = true;
  o.deterministic = dt::transport::in_process::deterministic_run{};
  o.deterministic->partitions = std::move(cuts);
  o.recv_timeout = std::chrono::milliseconds(4000);  // a peer cut off is suspected at this deadline
  dt::transport::in_process net(dt::transport::links::lan(peers), o);
  trainer_options opts;
  opts.steps = 60;
  opts.batch_size = 2;
  opts.eval_batches = 1;
  dt::comm::diloco<> comm;
  comm.inner_steps = 4;
  dt::fault::elastic fault;
  fault.agreement.timeout = std::chrono::milliseconds(3000);
  fault.agreement.liars = liars;
  fault.left_out = left_out;
  fault.rejoin_timeout = std::chrono::milliseconds(120000);
  partition_run out;
  out.removed_then_joined.resize(static_cast<std::size_t>(peers));
  std::mutex m;
  net.run([&](dt::transport::in_process::endpoint& ep) {
    process_record rec;
    Trainer t(tiny_gpt(), opts, ep, comm, {}, fault);
    auto keep = [&] {
      std::vector<std::int64_t> counts;
      for (const auto& c : t.fault().changes()) {
        rec.changes.push_back(c.cause);
        counts.push_back(static_cast<std::int64_t>(c.removed.size()));
        counts.push_back(static_cast<std::int64_t>(c.joined.size()));
      }
      std::lock_guard lock(m);
      out.peers[ep.rank()] = rec;
      out.removed_then_joined[static_cast<std::size_t>(ep.rank())] = counts;
    };
    fit_recording(t, rec, keep);
  });
  for (auto& [r, rec] : out.peers) rec.failure = net.failure(r);
  return out;
}

}  // namespace

TEST_CASE("churn simulator: a partition: the minority waits and rejoins, and the run ends as one model") {
  using when = dt::fault::elastic::when_left_out;
  // Peers 3 and 4 are cut off from 0-2 from 20 s to 45 s: longer than the agreement's deadlines.
  const auto cut = std::vector<dt::transport::in_process::partition>{{20.0, 45.0, {3, 4}}};
  const auto run = run_partitioned(cut, when::rejoin);
  REQUIRE(run.peers.size() == 5);
  const auto& reference = run.peers.at(0).params;
  REQUIRE(!reference.empty());
  for (const auto& [r, rec] : run.peers) {
    std::string history;
    for (const auto& c : rec.changes) history += "\n  " + c;
    INFO("peer " << r << ": " << rec.failure << history);
    CHECK(rec.failure.empty());
    CHECK((rec.params == reference));  // one model after the partition healed
    REQUIRE(!rec.losses.empty());
    CHECK(rec.losses.back().first == 60);
  }
  // The majority went on without 3 and 4, then took them in again: a view that removed two and
  // one that admitted two.
  CHECK(run.removed_then_joined[0] == std::vector<std::int64_t>{2, 0, 0, 2});
  // The minority stopped training while cut off: its losses skip the steps the majority trained
  // meanwhile (it took the group's state at its admission), and it says why.
  for (int r : {3, 4}) {
    const auto& rec = run.peers.at(r);
    std::size_t skipped = 0;
    for (std::size_t i = 1; i < rec.losses.size(); ++i)
      skipped += static_cast<std::size_t>(std::max<std::int64_t>(0, rec.losses[i].first - rec.losses[i - 1].first - 1));
    CHECK(skipped >= 10);
    REQUIRE(!rec.changes.empty());
    CHECK(rec.changes.front().find("without a majority") != std::string::npos);
    CHECK(rec.changes.front().find("waited to be taken in again") != std::string::npos);
  }
  CHECK((run_partitioned(cut, when::rejoin).peers.at(4).params == run.peers.at(4).params));  // replayed: the same run

  // Healed at other moments: while the minority still waits on a leader of the other side, in
  // the middle of its agreements, or once it stopped. Never a second group: one model each time.
  for (const double heal : {26.0, 31.0, 34.0, 38.0, 43.0}) {
    const auto r = run_partitioned({{20.0, heal, {3, 4}}}, when::rejoin);
    for (const auto& [rank, rec] : r.peers) {
      INFO("healed at " << heal << " s, peer " << rank << ": " << rec.failure);
      CHECK(rec.failure.empty());
      CHECK((rec.params == r.peers.at(0).params));
    }
  }
}

TEST_CASE("churn simulator: a partition: by default the minority stops with the reason, and a short one only delays") {
  using when = dt::fault::elastic::when_left_out;
  const auto stopped = run_partitioned({{20.0, 45.0, {3, 4}}}, when::stop);
  for (int r : {0, 1, 2}) {
    INFO("peer " << r << ": " << stopped.peers.at(r).failure);
    CHECK(stopped.peers.at(r).failure.empty());
    CHECK((stopped.peers.at(r).params == stopped.peers.at(0).params));
  }
  for (int r : {3, 4}) {
    const auto& f = stopped.peers.at(r).failure;
    INFO("peer " << r << ": " << f);
    CHECK(stopped.peers.at(r).params.empty());
    CHECK(f.find("without a majority this side stops") != std::string::npos);
    CHECK(f.find("elastic::left_out = stop") != std::string::npos);
  }
  // Healed within the deadlines: what crossed it arrived late, nobody was left out, and every
  // step's loss is what the clean run has.
  const auto brief = run_partitioned({{20.0, 21.5, {3, 4}}}, when::stop);
  const auto clean = run_partitioned({}, when::stop);
  for (int r = 0; r < 5; ++r) {
    INFO("peer " << r << ": " << brief.peers.at(r).failure);
    CHECK(brief.peers.at(r).changes.empty());
    CHECK(brief.peers.at(r).losses == clean.peers.at(r).losses);
    CHECK((brief.peers.at(r).params == clean.peers.at(r).params));
  }
}

TEST_CASE("churn simulator: an even partition 2|2: the side with the lowest rank goes on, the other stops") {
  using when = dt::fault::elastic::when_left_out;
  // Two of four is half, not a majority: exactly one side may go on, or two models train. The
  // tie goes to the side holding the lowest rank, whichever side the cut names.
  for (const auto& cut_off : {std::vector<int>{2, 3}, std::vector<int>{0, 1}}) {
    const auto run = run_partitioned({{20.0, 45.0, cut_off}}, when::stop, 0, 4);
    REQUIRE(run.peers.size() == 4);
    for (int r : {0, 1}) {
      INFO("cut off: peers " << cut_off[0] << " and " << cut_off[1] << "; peer " << r << ": " << run.peers.at(r).failure);
      CHECK(run.peers.at(r).failure.empty());
      REQUIRE(!run.peers.at(r).losses.empty());
      CHECK(run.peers.at(r).losses.back().first == 60);
      CHECK((run.peers.at(r).params == run.peers.at(0).params));
    }
    // The first of them to see the cut counts 2 of 4; the other may see it gone by then (1 of 3).
    for (int r : {2, 3}) {
      const auto& f = run.peers.at(r).failure;
      INFO("cut off: peers " << cut_off[0] << " and " << cut_off[1] << "; peer " << r << ": " << f);
      CHECK(run.peers.at(r).params.empty());
      CHECK(f.find("without a majority this side stops") != std::string::npos);
    }
    CHECK((run.peers.at(2).failure.find("only 2 of the 4 peers") != std::string::npos ||
           run.peers.at(3).failure.find("only 2 of the 4 peers") != std::string::npos));
  }
}

TEST_CASE("in_process deterministic: bad partitions are refused with the reason") {
  dt::transport::in_process::options o;
  o.deterministic = dt::transport::in_process::deterministic_run{};
  o.deterministic->partitions = {{5.0, 2.0, {1}}};
  CHECK_THROWS_WITH(dt::transport::in_process(dt::transport::links::ideal(3), o), Catch::Contains("from_s <= until_s"));
  o.deterministic->partitions = {{0.0, 2.0, {7}}};
  CHECK_THROWS_WITH(dt::transport::in_process(dt::transport::links::ideal(3), o), Catch::Contains("rank 7"));
  o.deterministic->partitions = {{0.0, 2.0, {}}};
  CHECK_THROWS_WITH(dt::transport::in_process(dt::transport::links::ideal(3), o), Catch::Contains("names no peer"));
}

TEST_CASE("elastic: left_out = rejoin on a transport without joiners is refused with the reason") {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>, dt::parallel::data, dt::fault::elastic>;
  dt::fault::elastic fault;
  fault.left_out = dt::fault::elastic::when_left_out::rejoin;
  trainer_options opts;
  opts.steps = 1;
  opts.batch_size = 2;
  CHECK_THROWS_WITH(dt::transport::in_process(2).run([&](dt::transport::in_process::endpoint& ep) {
    Trainer t(tiny_gpt(), opts, ep, dt::comm::diloco<>{}, {}, fault);
    t.fit(small_corpus().data);
  }),
                    Catch::Contains("left_out = rejoin needs a network that takes joiners"));
}

namespace {
// DiLoCo every 4 steps whose top-k sends 5% of each round: 95% waits in the error-feedback residual.
using ef_diloco = dt::comm::diloco<dt::comm::outer::nesterov, dt::compress::error_feedback<dt::compress::top_k>>;
using ef_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, ef_diloco, dt::parallel::data, dt::fault::elastic>;
ef_diloco residual_keeping_diloco() {
  ef_diloco comm;
  comm.inner_steps = 4;
  comm.codec.codec.fraction = 0.05;
  return comm;
}
}  // namespace

TEST_CASE("churn simulator: a joiner takes the group's state but not a member's unsent error-feedback residual") {
  using Trainer = ef_trainer;
  dt::transport::in_process::options o;
  o.peers_fail_alone = true;
  o.initial_peers = 4;
  o.deterministic = dt::transport::in_process::deterministic_run{};
  o.deterministic->churn = {{10.0, dt::transport::churn_event::kind::start, 4}};
  dt::transport::in_process net(dt::transport::links::lan(5), o);
  trainer_options opts;
  opts.steps = 32;
  opts.batch_size = 2;
  opts.eval_batches = 1;
  const auto comm = residual_keeping_diloco();
  dt::fault::elastic fault;
  fault.agreement.timeout = std::chrono::milliseconds(5000);
  struct seen {
    std::map<std::int64_t, std::vector<float>> residual;  // after each step
    std::vector<float> params;
  };
  std::map<int, seen> peers;
  std::mutex m;
  net.run([&](dt::transport::in_process::endpoint& ep) {
    Trainer t(tiny_gpt(), opts, ep, comm, {}, fault);
    seen mine;
    t.on_step([&](const dt::train::step_metrics& s) { mine.residual[s.step] = t.policy().codec.residual(); });
    t.fit(small_corpus().data);
    mine.params = flat_params(t.model().parameters());
    std::lock_guard lock(m);
    peers[ep.rank()] = mine;
  });
  REQUIRE(peers.size() == 5);
  const auto& joiner = peers.at(4).residual;
  REQUIRE(!joiner.empty());
  const std::int64_t first = joiner.begin()->first;  // its first step in the group (metrics count from 1)
  INFO("the joiner's first step: " << first);
  CHECK(first > comm.inner_steps);
  CHECK((first - 1) % comm.inner_steps == 0);  // admitted at a round's start
  // Until its first round ends it has sent nothing, so it holds nothing unsent, while every
  // member it took the state from holds 95% of its rounds so far: taking that over would send it
  // a second time.
  CHECK(joiner.at(first).empty());
  for (int r = 0; r < 4; ++r) {
    const auto& member = peers.at(r).residual.at(first);
    CHECK(std::count_if(member.begin(), member.end(), [](float v) { return v != 0.0f; }) > 0);
  }
  const auto& after_round = joiner.at(first + comm.inner_steps - 1);
  CHECK(std::count_if(after_round.begin(), after_round.end(), [](float v) { return v != 0.0f; }) > 0);
  for (int r = 1; r < 5; ++r) CHECK((peers.at(r).params == peers.at(0).params));
}

TEST_CASE("churn simulator: a peer that stops alone hands its residual to its heir, which adds it exactly") {
  // Deterministic (messages take the lan preset's time, a goodbye arrives after what was sent
  // before it): peer 3 stops at a round's start, the others find it gone at that step's check
  // for joiners, and its heir, peer 0, takes its residual before the step.
  using Trainer = ef_trainer;
  dt::transport::in_process::options o;
  o.peers_fail_alone = true;
  o.deterministic = dt::transport::in_process::deterministic_run{};
  dt::transport::in_process net(dt::transport::links::lan(4), o);
  trainer_options opts;
  opts.steps = 16;
  opts.batch_size = 2;
  opts.eval_batches = 1;
  opts.stop_alone = true;
  const auto comm = residual_keeping_diloco();
  dt::fault::elastic fault;
  fault.agreement.timeout = std::chrono::milliseconds(5000);
  struct seen {
    std::map<std::int64_t, std::vector<float>> residual;  // after each step
    std::vector<float> final_residual;
    std::vector<dt::fault::membership_change> changes;
  };
  std::map<int, seen> peers;
  std::mutex m;
  net.run([&](dt::transport::in_process::endpoint& ep) {
    Trainer t(tiny_gpt(), opts, ep, comm, {}, fault);
    seen mine;
    t.on_step([&](const dt::train::step_metrics& s) { mine.residual[s.step] = t.policy().codec.residual(); });
    if (ep.rank() == 3) t.stop_when([&t] { return t.step() >= 8; });
    t.fit(small_corpus().data);
    mine.final_residual = t.policy().codec.residual();
    mine.changes = t.fault().changes();
    std::lock_guard lock(m);
    peers[ep.rank()] = mine;
  });
  REQUIRE(peers.size() == 4);
  const auto& leaver = peers.at(3).residual.at(8);  // after step 7, the round's exchange
  REQUIRE(std::count_if(leaver.begin(), leaver.end(), [](float v) { return v != 0.0f; }) > 0);
  CHECK(std::all_of(peers.at(3).final_residual.begin(), peers.at(3).final_residual.end(), [](float v) { return v == 0.0f; }));
  // Step 8 exchanges nothing: the heir's residual after it is its own after step 7 plus the
  // leaver's, value for value; the other members' are as they were.
  const auto& before = peers.at(0).residual.at(8);
  const auto& after = peers.at(0).residual.at(9);
  REQUIRE(before.size() == leaver.size());
  REQUIRE(after.size() == leaver.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < after.size(); ++i) differ += after[i] != before[i] + leaver[i] ? 1 : 0;
  CHECK(differ == 0);
  for (int r : {1, 2}) CHECK(peers.at(r).residual.at(9) == peers.at(r).residual.at(8));
  REQUIRE(peers.at(0).changes.size() == 1);
  CHECK(peers.at(0).changes[0].removed == std::vector<int>{3});
  CHECK(peers.at(0).changes[0].inherited == std::vector<int>{3});
  for (int r : {1, 2}) CHECK(peers.at(r).changes.at(0).inherited.empty());
}
