// The simulated links: time on a link is accounted as if the bytes travelled.
#include <catch2/catch.hpp>

#include <decentrain/collective/communicator.hpp>
#include <decentrain/detail/activity.hpp>
#include <decentrain/transport/in_process.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/peer_checks.hpp"

namespace dt = decentrain;
using dt::transport::in_process;
using dt::transport::simulated_link;
using dt::transport::link_matrix;

TEST_CASE("in_process: a message costs size / bandwidth + latency on the receiver's clock") {
  link_matrix links(2, simulated_link{0.1, 12.5e6, 0.0, 0.0, 0.3});  // 100 ms, 100 Mbit/s
  in_process net(links);
  std::vector<dt::transport::traffic_stats> stats(2);
  net.run([&](in_process::endpoint& ep) {
    std::vector<std::byte> payload(12'500'000);  // one second on the wire
    if (ep.rank() == 0) {
      ep.computed(0.5);
      ep.send(1, 1, payload);
      ep.send(1, 2, payload);  // queues behind the first on the same link
    } else {
      (void)ep.recv(0, 1);
      (void)ep.recv(0, 2);
    }
    stats[static_cast<std::size_t>(ep.rank())] = ep.stats();
  });
  CHECK(stats[0].clock_seconds == Approx(0.5));          // sending does not block the sender
  CHECK(stats[1].clock_seconds == Approx(0.5 + 2.0 + 0.1));
  CHECK(stats[1].wait_seconds == Approx(2.6));
  CHECK(stats[1].bytes_received == 25'000'000);
}

TEST_CASE("in_process: drops cost retransmission timeouts, reproducibly from the seed") {
  auto run = [](std::uint64_t seed) {
    in_process net(link_matrix(2, simulated_link{0.01, 1e9, 0.0, 0.3, 0.2}), {seed, std::chrono::milliseconds(5000)});
    std::vector<dt::transport::traffic_stats> s(2);
    net.run([&](in_process::endpoint& ep) {
      for (int i = 0; i < 200; ++i) {  // ping-pong, so every delay adds up
        if (ep.rank() == 0) {
          ep.send(1, 1, {});
          (void)ep.recv(1, 2);
        } else {
          (void)ep.recv(0, 1);
          ep.send(0, 2, {});
        }
      }
      s[static_cast<std::size_t>(ep.rank())] = ep.stats();
    });
    return s;
  };
  const auto a = run(1), b = run(1), c = run(2);
  CHECK(a[0].clock_seconds == b[0].clock_seconds);
  CHECK(a[0].clock_seconds != c[0].clock_seconds);
  // 400 transmissions, each attempt lost with p = 0.3: about 171 retransmissions expected.
  const auto resent = a[0].retransmissions + a[1].retransmissions;
  CHECK(resent > 120);
  CHECK(resent < 230);
  CHECK(a[0].clock_seconds == Approx(400 * 0.01 + static_cast<double>(resent) * 0.2).epsilon(1e-6));
}

TEST_CASE("in_process: presets and bad settings") {
  CHECK(dt::transport::links::preset("wan", 4).at(0, 1).latency_s == Approx(0.1));
  const auto h = dt::transport::links::heterogeneous(5, 3);
  CHECK(h.at(1, 2).bandwidth_bytes_per_s == h.at(2, 1).bandwidth_bytes_per_s);
  CHECK_THROWS_WITH(dt::transport::links::preset("moon", 2), Catch::Contains("unknown link preset 'moon'"));
  CHECK_THROWS_WITH(link_matrix(2, simulated_link{0.0, 0.0}), Catch::Contains("bandwidth"));
  CHECK_THROWS_WITH(in_process(3).at(3), Catch::Contains("rank 3"));
}

TEST_CASE("in_process: a failing peer wakes the others with the cause instead of leaving them blocked") {
  in_process net(link_matrix(3, simulated_link{}), {0, std::chrono::milliseconds(60000)});
  CHECK_THROWS_WITH(net.run([](in_process::endpoint& ep) {
                      if (ep.rank() == 2) throw dt::error("disk full");
                      (void)ep.recv(2, 1);  // would wait a minute without the abort
                    }),
                    Catch::Contains("disk full"));
}

TEST_CASE("in_process: a small all-reduce waits log2(N) link latencies, not a reduce-and-broadcast's 2 log2(N)") {
  // Recursive doubling on links of 100 ms: 4 peers finish in 200 ms, 8 in 300 ms; peers beyond a
  // power of two add at most two hops (a tree reduce then broadcast would take 400 and 600 ms).
  for (int n = 2; n <= 8; ++n) {
    INFO(n << " peers");
    in_process net(link_matrix(n, simulated_link{0.1, 1e12}));
    std::vector<double> clock(static_cast<std::size_t>(n));
    harness::peer_checks checks;
    net.run([&](in_process::endpoint& ep) {
      dt::collective::communicator comm(ep);
      std::vector<float> v(16, static_cast<float>(ep.rank()));
      comm.all_reduce(std::span<float>(v));
      PEER_CHECK(checks, v[15] == static_cast<float>(n * (n - 1) / 2));
      clock[static_cast<std::size_t>(ep.rank())] = ep.stats().clock_seconds;
    });
    checks.report(static_cast<std::size_t>(n));
    const int rounds = std::bit_width(static_cast<unsigned>(n)) - 1;
    const double slowest = *std::max_element(clock.begin(), clock.end());
    if (std::has_single_bit(static_cast<unsigned>(n)))
      CHECK(slowest == Approx(0.1 * rounds));
    else
      CHECK(slowest <= 0.1 * (rounds + 2) + 1e-9);
  }
}

TEST_CASE("in_process: over high-latency links the ring pays one latency per step, not one per chunk") {
  // 16 MiB over 4 peers on links of 100 ms and 12.5 MB/s: each peer sends 1.5 x 16 MiB, 2.01 s of
  // wire time, plus 6 steps of 100 ms, plus 2 for the peers' check (on a communicator's first
  // ring) that they use the same sizes. Chunk by chunk (4 chunks a segment): 24 latencies.
  const int n = 4;
  const double latency = 0.1, bandwidth = 12.5e6;
  auto run = [&](dt::collective::options opts, dt::transport::access_link access = {}) {
    in_process net(link_matrix(n, simulated_link{latency, bandwidth}, access));
    double slowest = 0;
    std::mutex m;
    harness::peer_checks checks;
    net.run([&](in_process::endpoint& ep) {
      dt::collective::communicator comm(ep, opts);
      if (opts.in_flight_multiple > 0) PEER_CHECK(checks, comm.settings().window_bytes >= std::size_t{10'000'000});
      std::vector<float> v(std::size_t{4} << 20, static_cast<float>(ep.rank() + 1));
      comm.all_reduce(std::span<float>(v), dt::collective::reduce_op::sum, dt::collective::algorithm::ring);
      PEER_CHECK(checks, std::all_of(v.begin(), v.end(), [](float x) { return x == 10.0f; }));
      std::lock_guard lock(m);
      slowest = std::max(slowest, ep.stats().clock_seconds);
    });
    checks.report(n);
    return slowest;
  };
  const double wire = 1.5 * static_cast<double>(std::size_t{16} << 20) / bandwidth;
  const double windowed = run({});
  CHECK(windowed >= wire);
  CHECK(windowed <= 1.05 * (wire + (2 * (n - 1) + 2) * latency));
  const double chunked = run({.in_flight_multiple = 0.0});  // one chunk per step, as before
  CHECK(chunked > windowed + 1.5);
  // Each peer sends to one neighbour and hears from the other: its own connection at the links'
  // rate (access links) costs the ring nothing more.
  CHECK(run({}, dt::transport::access_link{bandwidth, bandwidth}) == Approx(windowed));
}

TEST_CASE("in_process: a transfer taking 10 s of link time beside 10 s of compute costs about 10 s, not 20") {
  link_matrix links(2, simulated_link{0.05, 1e6, 0.0, 0.0, 0.3});  // 1 MB/s: 10 MB is 10 s on the wire
  in_process net(links);
  std::vector<dt::transport::traffic_stats> stats(2);
  net.run([&](in_process::endpoint& ep) {
    dt::collective::communicator c(ep);
    std::vector<std::byte> payload(10'000'000);
    auto h = c.start([&](auto& lane) {
      if (lane.rank() == 0) lane.send_to(1, std::span<const std::byte>(payload));
      else lane.recv_from(0, std::span<std::byte>(payload));
    });
    ep.computed(10.0);  // the training thread computes while the bytes travel
    h.wait();
    stats[static_cast<std::size_t>(ep.rank())] = ep.stats();
  });
  // The receiver: the bytes land at 10 s + latency, 0.05 s after its compute ended.
  CHECK(stats[1].clock_seconds == Approx(10.05).margin(0.01));
  CHECK(stats[1].wait_seconds == Approx(0.05).margin(0.01));
  CHECK(stats[0].clock_seconds == Approx(10.0).margin(0.01));
  CHECK(stats[0].wait_seconds < 0.01);
}

TEST_CASE("in_process: transfers in flight at once share a link's bandwidth, each filling the other's gaps") {
  link_matrix links(2, simulated_link{0.0, 1e6, 0.0, 0.0, 0.3});
  in_process net(links);
  std::vector<double> clock(2);
  net.run([&](in_process::endpoint& ep) {
    dt::collective::communicator c(ep);
    // Two background transfers of 5 s each, started together: together they need the link for 10 s.
    std::vector<std::byte> a(5'000'000), b(5'000'000);
    auto transfer = [&](std::vector<std::byte>& buffer) {
      return c.start([&](auto& lane) {
        if (lane.rank() == 0) lane.send_to(1, std::span<const std::byte>(buffer));
        else lane.recv_from(0, std::span<std::byte>(buffer));
      });
    };
    auto first = transfer(a);
    auto second = transfer(b);
    first.wait();
    second.wait();
    clock[static_cast<std::size_t>(ep.rank())] = ep.stats().clock_seconds;
  });
  CHECK(clock[1] == Approx(10.0).margin(0.01));

  // The schedule itself: a message sent at an earlier simulated time than one already booked
  // (another thread got there first in real time) takes the gap before it, then the link after it.
  dt::transport::link_schedule link;
  CHECK(link.book(10.0, 2.0) == Approx(12.0));  // [10, 12)
  CHECK(link.book(9.0, 3.0) == Approx(14.0));   // [9, 10) + [12, 14)
  CHECK(link.book(0.0, 1.0) == Approx(1.0));    // [0, 1): free
  CHECK(link.book(14.0, 0.0) == Approx(14.0));  // nothing to send: no time on the link
  CHECK(link.book(13.0, 1.0) == Approx(15.0));  // [14, 15)
}

TEST_CASE("in_process: a peer's access link is shared by all it sends and all it receives") {
  // Links of 100 ms that would carry anything at once; each peer's own connection 1 MB/s each
  // way. Every message is 1 MB: one second of a connection.
  using dt::transport::access_link;
  const std::vector<std::byte> megabyte(1'000'000);
  // Each rank's clock after it received what the scenario sends it, and when each message landed
  // (its own arrival, not the clock after its recv: the order rank 0 asks in is not the order the
  // downlink took them in).
  struct outcome {
    std::vector<double> clock;
    std::vector<std::vector<double>> landed;
  };
  auto run = [&](access_link access, const std::vector<std::pair<int, int>>& sends) {
    in_process net(link_matrix(3, simulated_link{0.1, 1e12}, access));
    std::vector<double> clock(3);
    std::vector<std::vector<double>> landed(3);
    net.run([&](in_process::endpoint& ep) {
      const int me = ep.rank();
      for (const auto& [from, to] : sends)
        if (from == me) ep.send(to, 1, megabyte);
      for (const auto& [from, to] : sends)
        if (to == me) {
          const int source[1] = {from};
          landed[static_cast<std::size_t>(me)].push_back(ep.recv_any(source, 1).arrival_s);
        }
      clock[static_cast<std::size_t>(me)] = ep.stats().clock_seconds;
    });
    return outcome{clock, landed};
  };
  const access_link shared{1e6, 1e6};
  // Fan-out, by hand: rank 0's uplink carries the first message in [0, 1) and the second in
  // [1, 2); each lands 100 ms after its last byte left: 1.1 and 2.1 (not 1.1 for both, as two
  // links of their own would give).
  const auto fan_out = run(shared, {{0, 1}, {0, 2}}).clock;
  CHECK(fan_out[0] == Approx(0.0));  // sending does not block the sender
  CHECK(fan_out[1] == Approx(1.1));
  CHECK(fan_out[2] == Approx(2.1));
  // Fan-in: both start at 0, rank 0's downlink takes one in [0.1, 1.1) and the other in
  // [1.1, 2.1), whichever thread books it first.
  const auto fan_in = run(shared, {{1, 0}, {2, 0}});
  REQUIRE(fan_in.landed[0].size() == 2);
  CHECK(std::min(fan_in.landed[0][0], fan_in.landed[0][1]) == Approx(1.1));
  CHECK(std::max(fan_in.landed[0][0], fan_in.landed[0][1]) == Approx(2.1));
  CHECK(fan_in.clock[0] == Approx(2.1));
  // Both: rank 1 sends to 0 and 2 while 2 sends to 0. Rank 1's uplink: [0, 1) to 0, [1, 2) to 2;
  // rank 0's downlink takes one of the two messages for it in [0.1, 1.1) and the other in
  // [1.1, 2.1); rank 2's downlink [1.1, 2.1).
  const auto both = run(shared, {{1, 0}, {1, 2}, {2, 0}}).clock;
  CHECK(both[0] == Approx(2.1));
  CHECK(both[2] == Approx(2.1));
  // Uneven: 2 MB/s up and 0.5 MB/s down. The receiver's downlink sets the pace: its first byte
  // lands at 0.1, its last 2 s later (the uplink's 0.5 s hide under it).
  const auto uneven = run(access_link{2e6, 0.5e6}, {{0, 1}}).clock;
  CHECK(uneven[1] == Approx(2.1));
  // Not modelled (the default): each pair's own link alone, as before access links.
  const auto apart = run(access_link{}, {{0, 1}, {0, 2}}).clock;
  CHECK(apart[1] == Approx(0.1 + 1e6 / 1e12));
  CHECK(apart[2] == Approx(0.1 + 1e6 / 1e12));
  // The presets set it; a link's bandwidth alone is the slowest of the three.
  const auto wan = dt::transport::links::wan(4);
  CHECK(wan.access(3).uplink_bytes_per_s == Approx(12.5e6));
  const auto h = dt::transport::links::heterogeneous(5, 3);
  CHECK(h.bandwidth(1, 2) == Approx(std::min(h.access(1).uplink_bytes_per_s, h.access(2).downlink_bytes_per_s)));
  CHECK_THROWS_WITH(link_matrix(2, simulated_link{}, access_link{0.0, 1.0}), Catch::Contains("uplink and downlink must be > 0"));
  CHECK_THROWS_WITH(wan.access(4), Catch::Contains("rank 4 is outside a world of 4"));
}

TEST_CASE("in_process: a deterministic run's recv_any takes the message due first, try_recv what arrived by the clock") {
  // Peer 1 sends at simulated second 2, peer 2 at second 1 (whatever the threads' real order);
  // peer 0 polls, then asks for both at second 3 with peer 1 listed first.
  dt::transport::in_process::options o;
  o.deterministic = dt::transport::in_process::deterministic_run{};
  dt::transport::in_process net(dt::transport::links::ideal(3), o);
  std::vector<int> order;
  std::vector<bool> polled;
  double clock = 0;
  net.run([&](dt::transport::in_process::endpoint& ep) {
    const auto one_byte = std::as_bytes(std::span<const char>("x", 1));
    if (ep.rank() > 0) {
      ep.computed(ep.rank() == 1 ? 2.0 : 1.0);
      ep.send(0, 8, one_byte);
      ep.send(0, 7, one_byte);
      return;
    }
    polled.push_back(ep.try_recv(2, 8).has_value());  // second 0: nothing has arrived
    dt::transport::pause(ep, std::chrono::milliseconds(1500));
    polled.push_back(ep.try_recv(2, 8).has_value());  // arrived at second 1
    polled.push_back(ep.try_recv(1, 8).has_value());  // arrives at second 2: not yet
    dt::transport::pause(ep, std::chrono::milliseconds(1500));  // both have arrived by second 3
    const int both[2] = {1, 2};
    for (int i = 0; i < 2; ++i) order.push_back(ep.recv_any(both, 7).source);
    clock = ep.stats().clock_seconds;
  });
  CHECK(polled == std::vector<bool>{false, true, false});
  CHECK(order == std::vector<int>{2, 1});  // the earlier arrival first, not the first listed
  CHECK(clock == 3.0);
}

namespace {
// Runs fn on `n` peers and returns run()'s error text and the seconds it took (the receive
// timeout is a minute: only the deadlock watch ends these runs within seconds).
template <class F>
std::pair<std::string, double> run_for_error(int n, F&& fn) {
  in_process::options o;
  o.recv_timeout = std::chrono::milliseconds(60000);
  in_process net(dt::transport::links::ideal(n), o);
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    net.run(fn);
  } catch (const std::exception& e) {
    error = e.what();
  }
  return {error, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}
}  // namespace

TEST_CASE("in_process: a deadlock is reported at once: each peer's wait and step and call named") {
  SECTION("peers that disagree on whom to pair with: each waits for the next") {
    const auto [error, seconds] = run_for_error(3, [](in_process::endpoint& ep) {
      dt::detail::this_thread_activity().step = 12;
      const int r = ep.rank();
      ep.send((r + 1) % 3, 5, std::vector<std::byte>(4));  // to the next, who waits for the one after it
      (void)ep.recv((r + 1) % 3, 5);
    });
    INFO(error);
    CHECK(seconds < 10);
    CHECK_THAT(error, Catch::StartsWith("in_process: deadlock: every running peer waits for a message that no peer will send"));
    CHECK_THAT(error, Catch::Contains("peer 0, step 12: recv from peer 1, tag 5; queued here, not taken: from peer 2, tag 5"));
    CHECK_THAT(error, Catch::Contains("peer 1, step 12: recv from peer 2, tag 5"));
    CHECK_THAT(error, Catch::Contains("peer 2, step 12: recv from peer 0, tag 5"));
  }
  SECTION("one peer in an all-reduce, the other in a broadcast of another size") {
    const auto [error, seconds] = run_for_error(2, [](in_process::endpoint& ep) {
      dt::collective::communicator<in_process::endpoint> c(ep);
      std::vector<float> v(4, 1.0f);
      if (ep.rank() == 0) c.all_reduce(std::span<float>(v));
      else c.broadcast(std::span<float>(v), 0);  // takes peer 0's first message as its data, and ends
    });
    INFO(error);
    CHECK(seconds < 10);
    CHECK_THAT(error, Catch::Contains("peer 0, in all_reduce: recv from peer 1"));
    CHECK_THAT(error, Catch::Contains("peer 1: ended"));
  }
  SECTION("a peer waits for one that has ended: what it was sent instead is named") {
    const auto [error, seconds] = run_for_error(2, [](in_process::endpoint& ep) {
      if (ep.rank() == 1) return ep.send(0, 8, std::vector<std::byte>(4));  // tag 8, not 7
      (void)ep.recv(1, 7);
    });
    INFO(error);
    CHECK(seconds < 10);
    CHECK_THAT(error, Catch::Contains("peer 0: recv from peer 1, tag 7; queued here, not taken: from peer 1, tag 8"));
    CHECK_THAT(error, Catch::Contains("peer 1: ended"));
  }
  SECTION("no report while a peer computes, or waits with a timeout of its own") {
    std::vector<std::string> got(2);
    const auto [error, seconds] = run_for_error(2, [&](in_process::endpoint& ep) {
      if (ep.rank() == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // computing: the other's wait is no deadlock
        ep.send(1, 3, std::vector<std::byte>(4));
        try {
          (void)ep.recv_within(1, 4, std::chrono::milliseconds(1500));  // ended by its own timeout...
        } catch (const std::exception& e) {
          got[0] = e.what();
        }
        ep.send(1, 9, std::vector<std::byte>(4));  // ... after which it sends what the other waits for
      } else {
        got[1] = std::to_string(ep.recv(0, 3).size());
        got[1] += " " + std::to_string(ep.recv(0, 9).size());  // waits while peer 0 waits on its own timeout
      }
    });
    INFO(error);
    CHECK(error.empty());
    CHECK(got[1] == "4 4");
    CHECK_THAT(got[0], Catch::Contains("within 1500 ms"));
  }
}

TEST_CASE("in_process: a peer's compute speed scales what its compute costs its clock") {
  in_process::options o;
  o.speeds = {1.0, 2.0, 4.0};
  in_process net(dt::transport::links::ideal(3), o);
  std::vector<double> clocks(3), speeds(3);
  net.run([&](in_process::endpoint& ep) {
    ep.computed(1.0);
    clocks[static_cast<std::size_t>(ep.rank())] = ep.stats().clock_seconds;
    speeds[static_cast<std::size_t>(ep.rank())] = dt::transport::compute_speed(ep);
  });
  CHECK(clocks == std::vector<double>{1.0, 0.5, 0.25});
  CHECK(speeds == std::vector<double>{1.0, 2.0, 4.0});

  // spread: 1x to 4x on a log scale, each speed once, in an order the seed draws.
  auto sorted = dt::transport::speeds::spread(4, 7);
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted[0] == 1.0);
  CHECK(sorted[1] == Approx(std::pow(4.0, 1.0 / 3)));
  CHECK(sorted[2] == Approx(std::pow(4.0, 2.0 / 3)));
  CHECK(sorted[3] == 4.0);
  CHECK(dt::transport::speeds::spread(4, 7) == dt::transport::speeds::spread(4, 7));
  bool orders_differ = false;
  for (std::uint64_t seed = 1; seed < 8; ++seed) orders_differ |= dt::transport::speeds::spread(4, seed) != dt::transport::speeds::spread(4, 0);
  CHECK(orders_differ);
  CHECK(dt::transport::speeds::spread(1) == std::vector<double>{1.0});

  in_process::options bad;
  bad.speeds = {1.0, 2.0};
  CHECK_THROWS_WITH(in_process(dt::transport::links::ideal(3), bad), Catch::Contains("speeds names 2 ranks, the network has 3"));
  bad.speeds = {1.0, 0.0, 2.0};
  CHECK_THROWS_WITH(in_process(dt::transport::links::ideal(3), bad), Catch::Contains("the speed of rank 1 must be a number > 0, got 0"));
  CHECK_THROWS_WITH(dt::transport::speeds::spread(4, 0, 0.5), Catch::Contains("fastest must be >= 1"));
}
