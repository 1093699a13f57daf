// The communicator's seams for policies, on every transport: sub-groups with their own tag
// space, pairwise messages, collectives started in the background, all-gather + combine, codecs
// through the gathered all-reduce, and peer errors that name the peer and the collective.
#include <catch2/catch.hpp>

#include <decentrain/collective/communicator.hpp>
#include <decentrain/compress/compress.hpp>
#include <decentrain/detail/hash.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string_view>
#include <vector>

#include "support/peer_checks.hpp"
#include "support/trainer_fixture.hpp"
#include "support/transport_harness.hpp"

namespace dt = decentrain;
using dt::collective::reduce_op;

using toy_bf16 = fixture::bf16_codec;  // a codec written outside the library

TEMPLATE_TEST_CASE("communicator: groups all-reduce among their members only, concurrently with the world", "[collective]",
                   TRANSPORTS) {
  for (int n : {2, 3, 5}) {
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      dt::collective::communicator c(ep);
      const int r = c.rank();
      // Even and odd ranks form two groups; both all-reduce at the same time, then the world.
      std::vector<int> members;
      for (int k = r % 2; k < n; k += 2) members.push_back(k);
      auto g = c.group(members);
      PEER_CHECK(checks, g.world() == static_cast<int>(members.size()));
      PEER_CHECK(checks, g.rank() == static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin()));
      std::vector<std::int64_t> v(1000, r + 1);
      g.all_reduce(std::span<std::int64_t>(v));
      std::int64_t expected = 0;
      for (int k : members) expected += k + 1;
      PEER_CHECK(checks, v.front() == expected);
      PEER_CHECK(checks, v.back() == expected);
      std::int64_t all = r;
      c.all_reduce(std::span<std::int64_t>(&all, 1));
      PEER_CHECK(checks, all == n * (n - 1) / 2);
      harness::expect_throws_with(checks, [&] { (void)c.group({(r + 1) % n}); }, "is not one of the group's members", "group({other})");
    });
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)) * 6);
  }
}

TEMPLATE_TEST_CASE("communicator: pairwise messages keep order per pair and need no global call order", "[collective]",
                   TRANSPORTS) {
  harness::peer_checks checks;
  TestType::run(4, [&](auto& ep) {
    dt::collective::communicator c(ep);
    const int r = c.rank(), partner = r ^ 1;
    // Pairs talk a different number of times: no global order to keep.
    const int rounds = r < 2 ? 3 : 5;
    for (int k = 0; k < rounds; ++k) {
      std::vector<float> out(7, static_cast<float>(10 * r + k)), in(7);
      c.exchange_with(partner, std::span<const float>(out), std::span<float>(in));
      PEER_CHECK(checks, in[6] == static_cast<float>(10 * partner + k));
    }
    if (r == 0) {
      const std::int32_t hello[2] = {1, 2};
      c.send_to(3, std::span<const std::int32_t>(hello));
    }
    if (r == 3) {
      std::int32_t got[2] = {};
      c.recv_from(0, std::span<std::int32_t>(got));
      PEER_CHECK(checks, got[1] == 2);
    }
    std::int64_t x = 1;
    c.all_reduce(std::span<std::int64_t>(&x, 1));  // the collectives' tags were not disturbed
    PEER_CHECK(checks, x == 4);
  });
  checks.report(TestType::local_peers(4) == 4 ? 21 : 4 * static_cast<std::size_t>(TestType::local_peers(4)));  // 4 to 7 a peer
}

TEMPLATE_TEST_CASE("communicator: a background all-reduce finishes while the world's collectives go on", "[collective]",
                   TRANSPORTS) {
  for (int n : {1, 2, 4}) {
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      dt::collective::communicator c(ep);
      std::vector<float> big(300000, static_cast<float>(c.rank() + 1));
      const auto sent_at_start = c.traffic().bytes_sent;
      auto h = c.all_reduce_async(std::span<float>(big), reduce_op::sum);
      // Blocking collectives in between, on the same communicator.
      for (int k = 0; k < 3; ++k) {
        std::int64_t v = k;
        c.all_reduce(std::span<std::int64_t>(&v, 1));
        PEER_CHECK(checks, v == k * n);
      }
      h.wait();
      PEER_CHECK(checks, h.ready());
      PEER_CHECK(checks, big[0] == static_cast<float>(n * (n + 1) / 2));
      PEER_CHECK(checks, big[299999] == static_cast<float>(n * (n + 1) / 2));
      // Its bytes are counted by wait() at the latest: a ring sends 2 (n - 1) / n of the buffer.
      const double ring_bytes = 2.0 * (n - 1) / n * 1.2e6;
      PEER_CHECK(checks, static_cast<double>(c.traffic().bytes_sent - sent_at_start) >= ring_bytes);
    });
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)) * 7);
  }
}

#ifndef DECENTRAIN_MPI_SUITE  // in-process only: not once per MPI rank
TEST_CASE("communicator: on simulated links a background transfer overlaps compute instead of adding to it") {
  // 4 peers, 10 MB/s links with 50 ms latency: a 40 MB ring all-reduce takes about 2 * 3/4 * 40 / 10
  // = 6 s of link time. Beside 10 s of compute it must cost about 10 s, not 16.
  dt::transport::in_process net(dt::transport::link_matrix(4, {0.05, 10e6, 0.0, 0.0, 0.2}));
  std::vector<double> clocks(4), waits(4), blocking(4);
  harness::peer_checks checks;
  net.run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator c(ep);
    std::vector<float> v(10'000'000, 1.0f);
    auto h = c.all_reduce_async(std::span<float>(v), reduce_op::sum);
    ep.computed(10.0);
    h.wait();
    clocks[static_cast<std::size_t>(ep.rank())] = ep.stats().clock_seconds;
    waits[static_cast<std::size_t>(ep.rank())] = ep.stats().wait_seconds;
    PEER_CHECK(checks, v[123] == 4.0f);
    // The same transfer blocking, for the link time it takes on its own.
    const double t0 = ep.stats().clock_seconds;
    c.all_reduce(std::span<float>(v), reduce_op::sum);
    blocking[static_cast<std::size_t>(ep.rank())] = ep.stats().clock_seconds - t0;
  });
  checks.report(4);
  for (int r = 0; r < 4; ++r) {
    INFO("peer " << r << ": clock " << clocks[r] << " s, waited " << waits[r] << " s, the transfer alone " << blocking[r] << " s");
    CHECK(blocking[r] > 5.0);             // the transfer is long...
    CHECK(blocking[r] < 10.0);            // ...but shorter than the compute,
    CHECK(clocks[r] == Approx(10.0).margin(0.01));  // so overlapped it costs nothing beyond the compute
    CHECK(waits[r] < 0.01);
  }
}
#endif

#ifndef DECENTRAIN_MPI_SUITE  // in-process only: bytes per pair of simulated peers
TEST_CASE("communicator: halving_doubling has automatic halve and double in worlds of 2^k, and peers set otherwise are refused") {
  // 1.2 MB of f32, over recursive_doubling_below_bytes: automatic takes the ring, which sends to
  // the next peer only, or with halving_doubling in a world of 2^k recursive halving and doubling,
  // whose first round pairs peer 0 with peer 2 (the agreement on the sizes sends 0 to 2 only bytes).
  const auto run = [](int world, bool halving, int odd_one_out = -1) {
    dt::transport::in_process net(dt::transport::links::ideal(world));
    std::vector<int> right(static_cast<std::size_t>(world), 0);
    net.run([&](dt::transport::in_process::endpoint& ep) {
      dt::collective::communicator comm(ep, {.halving_doubling = halving != (ep.rank() == odd_one_out), .in_flight_multiple = 0});
      std::vector<float> v(300'000, static_cast<float>(ep.rank() + 1));
      comm.all_reduce(std::span<float>(v), reduce_op::sum);
      const auto want = static_cast<float>(world * (world + 1) / 2);
      right[static_cast<std::size_t>(ep.rank())] = std::all_of(v.begin(), v.end(), [&](float x) { return x == want; });
    });
    CHECK(std::all_of(right.begin(), right.end(), [](int ok) { return ok != 0; }));
    return net.bytes_sent(0, 2);
  };
  CHECK(run(4, false) < 1000);
  CHECK(run(4, true) > 500'000);  // half the buffer in the reduce-scatter, a quarter in the all-gather
  CHECK(run(8, true) > 500'000);
  CHECK(run(6, true) < 1000);  // (not 2^k: the ring)
  CHECK_THROWS_WITH(run(4, true, 1), Catch::Contains("set halving_doubling differently"));
}
#endif

TEMPLATE_TEST_CASE("communicator: all_gather_combine hands every peer the same contributions in rank order", "[collective]",
                   TRANSPORTS) {
  for (int n : {1, 3, 4}) {
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      dt::collective::communicator c(ep);
      const int r = c.rank();
      // Peer r contributes r*r, except the last, which contributes a wild value: the median ignores it.
      std::vector<float> v(5, r == n - 1 && n > 2 ? 1e30f : static_cast<float>(r * r));
      c.all_gather_combine(std::span<float>(v), [&](std::span<const std::span<const float>> parts, std::span<float> out) {
        PEER_CHECK(checks, parts.size() == static_cast<std::size_t>(n));
        for (std::size_t i = 0; i < out.size(); ++i) {
          std::vector<float> column;
          for (const auto& p : parts) column.push_back(p[i]);
          std::sort(column.begin(), column.end());
          out[i] = column[column.size() / 2];
        }
      });
      const float expected = n == 1 ? 0.0f : n == 3 ? 1.0f : 4.0f;  // medians of {0}, {0,1,1e30}, {0,1,4,1e30}
      PEER_CHECK(checks, v[0] == expected);
      PEER_CHECK(checks, v[4] == expected);
    });
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)) * 3);
  }
}

TEMPLATE_TEST_CASE("codec: a user's codec all-reduces through the gathered path, bit-identical on every peer", "[collective]",
                   TRANSPORTS) {
  for (int n : {1, 2, 3, 5}) {
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      dt::collective::communicator c(ep);
      std::vector<float> v(1001);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.001f * static_cast<float>(i) + static_cast<float>(c.rank());
      toy_bf16 codec;
      dt::collective::encoded_all_reduce(codec, c, std::span<float>(v), true);
      // The same bits on every peer (each process of an MPI run sees only its own): the
      // largest and the smallest hash over the peers are this peer's.
      const std::uint64_t h = dt::detail::fnv1a(std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * 4));
      std::uint64_t extremes[2] = {h, ~h};
      c.all_reduce(std::span<std::uint64_t>(extremes, 2), reduce_op::max);
      PEER_CHECK(checks, extremes[0] == h);
      PEER_CHECK(checks, ~extremes[1] == h);
      // Exact mean within bf16's rounding (8 bits of mantissa: relative 2^-8 per value).
      for (std::size_t i = 0; i < v.size(); i += 97) {
        const double exact = 0.001 * static_cast<double>(i) + (n - 1) / 2.0;
        PEER_CHECK(checks, std::abs(v[i] - exact) <= 0.004 * (std::abs(exact) + 1.0));
      }
      // identity goes through the ring and is exact for these sums of small integers plus one value.
      std::vector<float> w(64, static_cast<float>(c.rank()));
      dt::compress::identity id;
      dt::collective::encoded_all_reduce(id, c, std::span<float>(w), false);
      PEER_CHECK(checks, w[0] == static_cast<float>(n * (n - 1) / 2));
    });
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)) * 14);
  }
}

#ifndef DECENTRAIN_MPI_SUITE
TEST_CASE("codec: a payload over the codec's bound is rejected naming the peer, never decoded") {
  dt::transport::in_process net(2);
  CHECK_THROWS_WITH(net.run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator c(ep);
    std::vector<float> v(8, 1.0f);
    if (ep.rank() == 1) {
      // A hostile peer: the sizes go first (one 8-byte all-gather), and it claims more than the
      // bound; the receivers refuse before any payload is received or decoded.
      const std::uint64_t lie = 1000;
      (void)c.all_gather(std::span<const std::uint64_t>(&lie, 1));
      return;
    }
    toy_bf16 codec;
    dt::collective::encoded_all_reduce(codec, c, std::span<float>(v), true);
  }),
                    Catch::Contains("peer 1 sent a payload of 1000 bytes, over the bound of 16"));
}

TEST_CASE("communicator: a peer that fails mid-collective surfaces as a peer_error naming it and the collective") {
  dt::transport::in_process net(dt::transport::links::ideal(3), {0, std::chrono::milliseconds(5000)});
  std::vector<int> peers(3, -2);
  std::vector<std::string> operations(3);
  try {
    net.run([&](dt::transport::in_process::endpoint& ep) {
      dt::collective::communicator c(ep);
      if (ep.rank() == 2) throw std::runtime_error("peer 2 dies");
      std::vector<float> v(100, 1.0f);
      try {
        c.all_reduce(std::span<float>(v));
      } catch (const dt::transport::peer_error& e) {
        peers[static_cast<std::size_t>(ep.rank())] = e.peer();
        operations[static_cast<std::size_t>(ep.rank())] = e.operation();
        throw;
      }
    });
  } catch (const std::exception&) {
  }
  CHECK(peers[0] == 2);
  CHECK(peers[1] == 2);
  CHECK(operations[0] == "all_reduce");
  CHECK(operations[1] == "all_reduce");
}
#endif
