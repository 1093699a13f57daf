// The conformance suite every transport passes: ordered tagged point-to-point messages, and the
// collectives on top of them for 1..8 peers and sizes that do not divide by the peer count.
#include <catch2/catch.hpp>

#include <decentrain/collective/communicator.hpp>
#include <decentrain/detail/hash.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "support/peer_checks.hpp"
#include "support/transport_harness.hpp"

namespace dt = decentrain;
using dt::collective::algorithm;
using dt::collective::reduce_op;

namespace {
std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span<const char>(s.data(), s.size())); }
std::string text_of(const dt::transport::bytes& b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }
}  // namespace

TEMPLATE_TEST_CASE("transport: tagged messages arrive in order and are matched by source and tag", "[transport]", TRANSPORTS) {
  for (int n : {1, 2, 3, 5}) {
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      const int r = ep.rank();
      if (!PEER_CHECK(checks, ep.world() == n)) return;
      for (int p = 0; p < n; ++p) {
        for (int i = 0; i < 3; ++i) ep.send(p, 10, bytes_of("from " + std::to_string(r) + " #" + std::to_string(i)));
        ep.send(p, 20, bytes_of("tag 20 from " + std::to_string(r)));
        ep.send(p, 30, {});  // empty messages are messages too
      }
      for (int p = 0; p < n; ++p) {
        // Tag 20 first although it was sent after the tag-10 messages: matching is by tag.
        PEER_CHECK(checks, text_of(ep.recv(p, 20)) == "tag 20 from " + std::to_string(p));
        for (int i = 0; i < 3; ++i) PEER_CHECK(checks, text_of(ep.recv(p, 10)) == "from " + std::to_string(p) + " #" + std::to_string(i));
        PEER_CHECK(checks, ep.recv(p, 30).empty());
      }
      const auto s = ep.stats();
      PEER_CHECK(checks, s.messages_sent == static_cast<std::uint64_t>(5 * n));
      PEER_CHECK(checks, s.messages_received == static_cast<std::uint64_t>(5 * n));
      PEER_CHECK(checks, s.bytes_sent == s.bytes_received);  // everyone sent everyone the same kinds of messages
    });
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)));
  }
}

TEMPLATE_TEST_CASE("transport: large messages arrive intact", "[transport]", TRANSPORTS) {
  harness::peer_checks checks;
  TestType::run(2, [&](auto& ep) {
    std::vector<std::uint32_t> big(3'000'001);
    std::iota(big.begin(), big.end(), static_cast<std::uint32_t>(ep.rank()) * 7u);
    ep.send(1 - ep.rank(), 1, std::as_bytes(std::span<const std::uint32_t>(big)));
    const auto got = ep.recv(1 - ep.rank(), 1);
    if (!PEER_CHECK(checks, got.size() == big.size() * 4)) return;
    std::vector<std::uint32_t> back(big.size());
    std::memcpy(back.data(), got.data(), got.size());
    PEER_CHECK(checks, back.front() == static_cast<std::uint32_t>(1 - ep.rank()) * 7u);
    PEER_CHECK(checks, back.back() == static_cast<std::uint32_t>(1 - ep.rank()) * 7u + 3'000'000u);
  });
  checks.report(static_cast<std::size_t>(TestType::local_peers(2)));
}

TEMPLATE_TEST_CASE("transport: exchange lands messages in order in the caller's memory, a size that differs is reported, not written",
                   "[transport]", TRANSPORTS) {
  for (int n : {1, 2, 3}) {
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      const int r = ep.rank(), right = (r + 1) % n, left = (r + n - 1) % n;
      auto pattern = [](int from, int i, std::size_t count) {
        std::vector<std::uint32_t> v(count);
        std::iota(v.begin(), v.end(), static_cast<std::uint32_t>(from * 1'000'000 + i * 10'000));
        return v;
      };
      // Several messages with one tag (as a ring all-reduce sends them), large enough to arrive
      // in pieces; each lands in the buffer of its own exchange, in the order sent.
      for (int i = 0; i < 4; ++i) {
        const auto out = pattern(r, i, 70'000);
        std::vector<std::uint32_t> in(70'000, 0);
        const auto got = dt::transport::exchange(ep, right, std::as_bytes(std::span<const std::uint32_t>(out)), left,
                                                 std::as_writable_bytes(std::span<std::uint32_t>(in)), 4);
        PEER_CHECK(checks, got == in.size() * 4);
        PEER_CHECK(checks, in == pattern(left, i, 70'000));
      }
      // A message of another size than the memory offered: its size comes back, the memory is
      // left alone, and the next message of that tag is still the next one received.
      ep.send(right, 5, std::as_bytes(std::span<const std::uint32_t>(pattern(r, 0, 3))));
      ep.send(right, 5, std::as_bytes(std::span<const std::uint32_t>(pattern(r, 1, 5))));
      std::vector<std::uint32_t> in(5, 0xABABABABu);
      PEER_CHECK(checks, dt::transport::exchange(ep, -1, {}, left, std::as_writable_bytes(std::span<std::uint32_t>(in)), 5) == 12);
      PEER_CHECK(checks, in == std::vector<std::uint32_t>(5, 0xABABABABu));
      PEER_CHECK(checks, dt::transport::exchange(ep, -1, {}, left, std::as_writable_bytes(std::span<std::uint32_t>(in)), 5) == 20);
      PEER_CHECK(checks, in == pattern(left, 1, 5));
      // To itself, and empty.
      const auto mine = pattern(r, 7, 9);
      std::vector<std::uint32_t> back(9);
      PEER_CHECK(checks, dt::transport::exchange(ep, r, std::as_bytes(std::span<const std::uint32_t>(mine)), r,
                                    std::as_writable_bytes(std::span<std::uint32_t>(back)), 6) == 36);
      PEER_CHECK(checks, back == mine);
      PEER_CHECK(checks, dt::transport::exchange(ep, right, {}, left, {}, 8) == 0);
      const auto s = ep.stats();
      PEER_CHECK(checks, s.messages_received == 8);
      PEER_CHECK(checks, s.bytes_received == 4 * 280'000 + 12 + 20 + 36);
    });
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)));
  }
}

TEMPLATE_TEST_CASE("transport: one exchange of many messages lands each in its own memory, in order, as it arrives",
                   "[transport]", TRANSPORTS) {
  for (int n : {1, 2, 3}) {
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      const int r = ep.rank(), right = (r + 1) % n, left = (r + n - 1) % n;
      auto pattern = [](int from, std::size_t i, std::size_t count) {
        std::vector<std::uint32_t> v(count);
        std::iota(v.begin(), v.end(), static_cast<std::uint32_t>(from * 1'000'000 + static_cast<int>(i) * 10'000));
        return v;
      };
      // The third message is smaller than its memory: its size is reported, its memory left
      // alone, and the messages after it still land in their own.
      const std::vector<std::size_t> sent{70'000, 0, 5, 30'000, 1}, offered{70'000, 0, 7, 30'000, 1};
      std::vector<std::vector<std::uint32_t>> outs, ins;
      std::vector<std::span<const std::byte>> out_spans;
      std::vector<std::span<std::byte>> in_spans;
      for (std::size_t i = 0; i < sent.size(); ++i) {
        outs.push_back(pattern(r, i, sent[i]));
        ins.emplace_back(offered[i], 0xABABABABu);
      }
      for (std::size_t i = 0; i < sent.size(); ++i) {
        out_spans.push_back(std::as_bytes(std::span<const std::uint32_t>(outs[i])));
        in_spans.push_back(std::as_writable_bytes(std::span<std::uint32_t>(ins[i])));
      }
      std::vector<std::size_t> order, sizes;
      dt::transport::exchange(ep, right, out_spans, left, in_spans, 9, [&](std::size_t i, std::size_t size) {
        order.push_back(i);
        sizes.push_back(size);
        if (sent[i] == offered[i]) PEER_CHECK(checks, ins[i] == pattern(left, i, sent[i]));  // complete when reported
      });
      PEER_CHECK(checks, order == std::vector<std::size_t>{0, 1, 2, 3, 4});
      PEER_CHECK(checks, sizes == std::vector<std::size_t>{280'000, 0, 20, 120'000, 4});
      PEER_CHECK(checks, ins[2] == std::vector<std::uint32_t>(7, 0xABABABABu));
      // A callback that throws ends the exchange; what it did not take is not left posted, and
      // later receives of the tag find the rest in order.
      ep.send(right, 10, std::as_bytes(std::span<const std::uint32_t>(outs[0])));
      ep.send(right, 10, std::as_bytes(std::span<const std::uint32_t>(outs[3])));
      harness::expect_throws_with(checks, [&] { (void)(dt::transport::exchange(ep, -1, {}, left, in_spans, 10,
                                                [&](std::size_t, std::size_t) { throw dt::error("stop here"); })); }, "stop here", "dt::transport::exchange(ep, -1, {}, left, in_spans, 10, [&](std::size_t, std::size_t) { throw dt::error(\"stop here\"); })");
      PEER_CHECK(checks, ins[0] == pattern(left, 0, 70'000));
      std::vector<std::uint32_t> rest(30'000);
      PEER_CHECK(checks, dt::transport::exchange(ep, -1, {}, left, std::as_writable_bytes(std::span<std::uint32_t>(rest)), 10) == 120'000);
      PEER_CHECK(checks, rest == pattern(left, 3, 30'000));
    });
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)));
  }
}

TEMPLATE_TEST_CASE("transport: recv_any takes messages from a set as they come, naming the sender, and try_recv never waits",
                   "[transport]", TRANSPORTS) {
  for (int n : {2, 4}) {
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      const int r = ep.rank();
      std::vector<int> others;
      for (int p = 1; p < n; ++p) others.push_back(p);
      if (r != 0) {
        for (int i = 0; i < 3; ++i) ep.send(0, 40, bytes_of(std::to_string(r) + "#" + std::to_string(i)));
        ep.send(0, 41, bytes_of("from " + std::to_string(r)));
        // Tag 43 only once peer 0 said so: before that, its try_recv must find nothing.
        PEER_CHECK(checks, text_of(ep.recv(0, 44)) == "go");
        ep.send(0, 43, bytes_of("polled " + std::to_string(r)));
        return;
      }
      // Every message of the set, once, each sender's in order, the sender named.
      std::vector<int> next(static_cast<std::size_t>(n), 0);
      for (int k = 0; k < 3 * (n - 1); ++k) {
        const auto m = ep.recv_any(others, 40);
        if (!PEER_CHECK(checks, m.source >= 1 && m.source < n)) return;
        auto& i = next[static_cast<std::size_t>(m.source)];
        PEER_CHECK(checks, text_of(m.data) == std::to_string(m.source) + "#" + std::to_string(i));
        ++i;
      }
      for (int p = 1; p < n; ++p) PEER_CHECK(checks, next[static_cast<std::size_t>(p)] == 3);
      // Only from the set asked: the last peer's tag-41 message stays for a recv that names it.
      const int first_only[1] = {1};
      const auto one = ep.recv_any(first_only, 41);
      PEER_CHECK(checks, one.source == 1 && text_of(one.data) == "from 1");
      for (int p = 2; p < n; ++p) PEER_CHECK(checks, text_of(ep.recv(p, 41)) == "from " + std::to_string(p));
      // try_recv: nothing sent yet on tag 43, so none at once; then polled until it comes.
      for (int p = 1; p < n; ++p) PEER_CHECK(checks, !ep.try_recv(p, 43).has_value());
      for (int p = 1; p < n; ++p) ep.send(p, 44, bytes_of("go"));
      for (int p = 1; p < n; ++p) {
        std::optional<dt::transport::bytes> got;
        for (int tries = 0; !got && tries < 20000; ++tries) {  // at most 20 s
          got = ep.try_recv(p, 43);
          if (!got) dt::transport::pause(ep, std::chrono::milliseconds(1));
        }
        if (PEER_CHECK(checks, got.has_value())) PEER_CHECK(checks, text_of(*got) == "polled " + std::to_string(p));
      }
      const auto s = ep.stats();
      PEER_CHECK(checks, s.messages_received == static_cast<std::uint64_t>(5 * (n - 1)));
      // Bad sets and peers are refused, naming them.
      harness::expect_throws_with(checks, [&] { (void)(ep.recv_any({}, 40)); }, "none of the peers", "ep.recv_any({}, 40)");
      const int outside[2] = {1, n};
      harness::expect_throws_with(checks, [&] { (void)(ep.recv_any(outside, 40)); }, "peer " + std::to_string(n),
                                  "ep.recv_any({1, n}, 40)");
      harness::expect_throws_with(checks, [&] { (void)(ep.try_recv(-1, 40)); }, "peer -1", "ep.try_recv(-1, 40)");
    });
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)));
  }
}

TEMPLATE_TEST_CASE("transport: a bad peer index is an error naming it", "[transport]", TRANSPORTS) {
  harness::peer_checks checks;
  TestType::run(2, [&](auto& ep) {
    harness::expect_throws_with(checks, [&] { (void)(ep.send(2, 1, {})); }, "peer 2", "ep.send(2, 1, {})");
    harness::expect_throws_with(checks, [&] { (void)(ep.recv(-1, 1)); }, "peer -1", "ep.recv(-1, 1)");
  });
  checks.report(static_cast<std::size_t>(TestType::local_peers(2)));
}

TEMPLATE_TEST_CASE("collective: all-reduce is exact for integers, 1..8 peers, uneven sizes, every algorithm",
                   "[collective]", TRANSPORTS) {
  for (int n = 1; n <= 8; ++n) {
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      dt::collective::communicator comm(ep, {.chunk_bytes = 4096, .recursive_doubling_below_bytes = 1024});
      for (std::size_t size : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100003}}) {
        for (auto algo : {algorithm::ring, algorithm::recursive_doubling, algorithm::halving_doubling, algorithm::automatic}) {
          std::vector<std::int64_t> v(size);
          for (std::size_t i = 0; i < size; ++i) v[i] = static_cast<std::int64_t>(i * 31 + 1) * (ep.rank() + 1) - 5;
          comm.all_reduce(std::span<std::int64_t>(v), reduce_op::sum, algo);
          const std::int64_t ranks_sum = static_cast<std::int64_t>(n) * (n + 1) / 2;
          bool all_equal = true;
          for (std::size_t i = 0; i < size; ++i)
            all_equal = all_equal && v[i] == static_cast<std::int64_t>(i * 31 + 1) * ranks_sum - 5 * n;
          PEER_CHECK(checks, all_equal);
          std::vector<std::int32_t> m(size);
          for (std::size_t i = 0; i < size; ++i) m[i] = static_cast<std::int32_t>((i + static_cast<std::size_t>(ep.rank()) * 13) % 17);
          comm.all_reduce(std::span<std::int32_t>(m), reduce_op::max, algo);
          bool max_ok = true;
          for (std::size_t i = 0; i < size; ++i) {
            std::int32_t expect = 0;
            for (int r = 0; r < n; ++r) expect = std::max(expect, static_cast<std::int32_t>((i + static_cast<std::size_t>(r) * 13) % 17));
            max_ok = max_ok && m[i] == expect;
          }
          PEER_CHECK(checks, max_ok);
        }
      }
    });
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)));
  }
}

TEMPLATE_TEST_CASE("collective: float all-reduce averages within tolerance and leaves every peer identical, every algorithm",
                   "[collective]", TRANSPORTS) {
  // 200 KB, under recursive_doubling_below_bytes: left to `automatic` it would never reach the
  // ring, so each algorithm is named.
  for (int n : {2, 3, 4, 7}) {
    const std::size_t size = 50'001;
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      dt::collective::communicator comm(ep, {.chunk_bytes = 8192});
      for (auto algo : {algorithm::ring, algorithm::recursive_doubling, algorithm::halving_doubling}) {
        std::vector<float> v(size);
        for (std::size_t i = 0; i < size; ++i) v[i] = std::sin(static_cast<float>(i) * 0.01f + static_cast<float>(ep.rank()));
        comm.all_reduce(std::span<float>(v), reduce_op::average, algo);
        double worst = 0;
        for (std::size_t i = 0; i < size; ++i) {
          double expect = 0;
          for (int r = 0; r < n; ++r) expect += std::sin(static_cast<float>(i) * 0.01f + static_cast<float>(r));
          worst = std::max(worst, std::abs(v[i] - expect / n));
        }
        // A handful of float roundings of values of size <= 1. (Peers run on threads, where
        // Catch's INFO is not safe, so the failure names its case in the compared string.)
        const std::string name = algo == algorithm::ring                 ? "ring"
                                 : algo == algorithm::recursive_doubling ? "recursive doubling"
                                                                         : "halving, doubling";
        PEER_CHECK(checks, (worst < 1e-6 ? "" : name + ": worst error " + std::to_string(worst)) == "");
        // Bit-identical on every peer: compare a checksum of the result across peers.
        const std::uint64_t sum = dt::detail::fnv1a(std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * 4));
        const auto sums = comm.all_gather(std::span<const std::uint64_t>(&sum, 1));
        PEER_CHECK(checks, std::all_of(sums.begin(), sums.end(), [&](std::uint64_t s) { return s == sum; }));
      }
    });
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)));
  }
}

namespace {
// Peer r's value at i in the exact-average test: k(i) + (2r - (n - 1)) c(i). The offsets cancel
// over the n peers, so the mean is k(i) exactly; all are small multiples of 1/4, so every partial
// sum is exact in any order and only the final scaling by 1/n can round. Every 97th element is
// -0 on every peer (the mean is -0: a sum of -0s keeps the sign), the next one -0 but +0 on
// peer 0 (the mean is +0).
float average_input(std::size_t i, int r, int n) {
  if (i % 97 == 0) return -0.0f;
  if (i % 97 == 1) return r == 0 ? 0.0f : -0.0f;
  const float k = 0.25f * (static_cast<float>(i % 1000) - 500.0f), c = static_cast<float>(i % 13 + 1);
  return k + static_cast<float>(2 * r - (n - 1)) * c;
}
double average_expected(std::size_t i) {
  if (i % 97 == 0) return -0.0;
  if (i % 97 == 1) return 0.0;
  return 0.25 * (static_cast<double>(i % 1000) - 500.0);  // k(i); a zero k is +0 (x + -x is +0)
}
// `got` is the exact mean, sign of a zero included; where 1/n is not a float (n not a power of
// two) the scaling may round once, so one ulp either side is accepted there.
bool is_average(float got, double expected, int n) {
  const auto want = static_cast<float>(expected);
  if (std::signbit(got) != std::signbit(want)) return false;
  if (got == want) return true;
  const bool inexact_scale = (n & (n - 1)) != 0;
  return inexact_scale && (got == std::nextafter(want, INFINITY) || got == std::nextafter(want, -INFINITY));
}
}  // namespace

TEMPLATE_TEST_CASE("collective: float average is the exact mean (-0 kept) by every algorithm, 1..8 peers, uneven sizes",
                   "[collective]", TRANSPORTS) {
  for (int n = 1; n <= 8; ++n) {
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      // Small chunks, so a segment spans several; sizes that are not multiples of n, and one
      // smaller than n (empty segments); each algorithm named, and a buffer just over the
      // switch that `automatic` sends round the ring.
      dt::collective::communicator comm(ep, {.chunk_bytes = 4096});
      struct run_case {
        std::size_t size;
        algorithm algo;
        const char* what;
      };
      std::vector<run_case> cases;
      for (std::size_t size : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100'003}}) {
        cases.push_back({size, algorithm::ring, "ring"});
        cases.push_back({size, algorithm::recursive_doubling, "recursive doubling"});
        cases.push_back({size, algorithm::halving_doubling, "halving, doubling"});
      }
      cases.push_back({comm.settings().recursive_doubling_below_bytes / sizeof(float) + 12'345, algorithm::automatic,
                       "automatic over the switch (ring)"});
      for (const auto& k : cases) {
        std::vector<float> v(k.size);
        for (std::size_t i = 0; i < k.size; ++i) v[i] = average_input(i, ep.rank(), n);
        comm.all_reduce(std::span<float>(v), reduce_op::average, k.algo);
        std::size_t wrong = 0, first = 0;
        for (std::size_t i = 0; i < k.size; ++i)
          if (!is_average(v[i], average_expected(i), n) && wrong++ == 0) first = i;
        // The case and the first wrong value in the compared string (INFO is not thread-safe).
        std::ostringstream failure;
        if (wrong)
          failure << std::setprecision(9) << k.what << ", " << n << " peers, " << k.size << " floats: " << wrong
                  << " wrong, the first at " << first << ": got " << v[first] << ", expected " << average_expected(first);
        PEER_CHECK(checks, failure.str() == "");
      }
    });
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)));
  }
}

TEMPLATE_TEST_CASE("collective: recursive doubling leaves every peer with the same bits, 1..8 peers", "[collective]",
                   TRANSPORTS) {
  // Sums of floats of mixed magnitudes round differently in different orders, and max(-0, +0)
  // depends on the order of its operands: the peers must still agree bit for bit.
  for (int n = 1; n <= 8; ++n) {
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      dt::collective::communicator comm(ep);
      const int r = ep.rank();
      std::vector<float> v(301), m(301);
      for (std::size_t i = 0; i < v.size(); ++i) {
        v[i] = std::ldexp(1.0f + 0.1f * static_cast<float>(i % 7), static_cast<int>((i + static_cast<std::size_t>(r) * 5) % 40) - 20);
        // Every third element is -0 on every peer, so its max is -0 whatever the order; the
        // others mix -0 and +0, whose max may be either zero as long as all peers agree.
        m[i] = i % 3 == 0 || (i + static_cast<std::size_t>(r)) % 2 == 0 ? -0.0f : 0.0f;
      }
      comm.all_reduce(std::span<float>(v), reduce_op::sum, algorithm::recursive_doubling);
      comm.all_reduce(std::span<float>(m), reduce_op::max, algorithm::recursive_doubling);
      PEER_CHECK(checks, std::all_of(m.begin(), m.end(), [](float x) { return x == 0.0f; }));
      bool minus_zero_kept = true;
      for (std::size_t i = 0; i < m.size(); i += 3) minus_zero_kept = minus_zero_kept && std::signbit(m[i]);
      PEER_CHECK(checks, minus_zero_kept);
      const auto bits = [](const std::vector<float>& x) {
        return dt::detail::fnv1a(std::string_view(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float)));
      };
      const std::uint64_t mine[2] = {bits(v), bits(m)};
      const auto all = comm.all_gather(std::span<const std::uint64_t>(mine, 2));
      for (int q = 0; q < n; ++q) {
        PEER_CHECK(checks, all[static_cast<std::size_t>(2 * q)] == mine[0]);
        PEER_CHECK(checks, all[static_cast<std::size_t>(2 * q + 1)] == mine[1]);
      }
    });
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)));
  }
}

TEMPLATE_TEST_CASE("collective: a partitioned all-reduce is exact for any counts, zeros included, and leaves every peer the same bits",
                   "[collective]", TRANSPORTS) {
  for (int n = 1; n <= 8; ++n) {
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      // 64-byte chunks: every range of more than 8 int64 or 16 floats goes in several messages.
      dt::collective::communicator comm(ep, {.chunk_bytes = 64, .in_flight_multiple = 0});
      const int r = ep.rank();
      const std::size_t size = 1001;
      // Equal-ish counts; everything on the last peer (the others are clients); odd ranks reduce
      // nothing and the rest share unevenly.
      std::vector<std::vector<std::size_t>> partitions(3, std::vector<std::size_t>(static_cast<std::size_t>(n), 0));
      for (int q = 0; q < n; ++q) partitions[0][static_cast<std::size_t>(q)] = size / n + (q < static_cast<int>(size % n) ? 1 : 0);
      partitions[1].back() = size;
      std::size_t given = 0;
      for (int q = 0; q < n; q += 2) given += partitions[2][static_cast<std::size_t>(q)] = q == 0 ? 0 : 37 * static_cast<std::size_t>(q);
      partitions[2][0] = size - given;
      for (const auto& counts : partitions) {
        std::vector<std::int64_t> v(size);
        for (std::size_t i = 0; i < size; ++i) v[i] = static_cast<std::int64_t>(i * 31 + 1) * (r + 1) - 5;
        comm.partitioned_all_reduce(std::span<std::int64_t>(v), std::span<const std::size_t>(counts));
        const std::int64_t ranks_sum = static_cast<std::int64_t>(n) * (n + 1) / 2;
        bool exact = true;
        for (std::size_t i = 0; i < size; ++i) exact = exact && v[i] == static_cast<std::int64_t>(i * 31 + 1) * ranks_sum - 5 * n;
        PEER_CHECK(checks, exact);
        std::vector<std::int32_t> m(size);
        for (std::size_t i = 0; i < size; ++i) m[i] = static_cast<std::int32_t>((i + static_cast<std::size_t>(r) * 13) % 17);
        comm.partitioned_all_reduce(std::span<std::int32_t>(m), std::span<const std::size_t>(counts), reduce_op::max);
        bool max_ok = true;
        for (std::size_t i = 0; i < size; ++i) {
          std::int32_t expect = 0;
          for (int q = 0; q < n; ++q) expect = std::max(expect, static_cast<std::int32_t>((i + static_cast<std::size_t>(q) * 13) % 17));
          max_ok = max_ok && m[i] == expect;
        }
        PEER_CHECK(checks, max_ok);
        // Floats of mixed magnitudes, averaged: the same bits everywhere, within rounding of the mean.
        std::vector<float> f(size);
        for (std::size_t i = 0; i < size; ++i)
          f[i] = std::ldexp(1.0f + 0.1f * static_cast<float>(i % 7), static_cast<int>((i + static_cast<std::size_t>(r) * 5) % 40) - 20);
        comm.partitioned_all_reduce(std::span<float>(f), std::span<const std::size_t>(counts), reduce_op::average);
        bool near_mean = true;
        for (std::size_t i = 0; i < size; ++i) {
          double mean = 0;
          for (int q = 0; q < n; ++q)
            mean += std::ldexp(1.0 + 0.1 * static_cast<double>(i % 7), static_cast<int>((i + static_cast<std::size_t>(q) * 5) % 40) - 20);
          mean /= n;
          near_mean = near_mean && std::abs(f[i] - mean) <= 1e-6 * std::abs(mean);
        }
        PEER_CHECK(checks, near_mean);
        const std::uint64_t mine = dt::detail::fnv1a(std::string_view(reinterpret_cast<const char*>(f.data()), f.size() * sizeof(float)));
        const auto all = comm.all_gather(std::span<const std::uint64_t>(&mine, 1));
        PEER_CHECK(checks, std::all_of(all.begin(), all.end(), [&](std::uint64_t h) { return h == mine; }));
      }
      // A client (count 0) moves its buffer out and the result in, nothing more (counts the peers
      // agreed on already: the first call with new counts compares them).
      std::vector<std::int64_t> v(size, 1);
      comm.partitioned_all_reduce(std::span<std::int64_t>(v), std::span<const std::size_t>(partitions[1]));
      const auto before = comm.traffic();
      comm.partitioned_all_reduce(std::span<std::int64_t>(v), std::span<const std::size_t>(partitions[1]));
      PEER_CHECK(checks, v.front() == n * n && v.back() == n * n);
      if (r < n - 1) {
        PEER_CHECK(checks, comm.traffic().bytes_sent - before.bytes_sent == size * sizeof(std::int64_t));
        PEER_CHECK(checks, comm.traffic().bytes_received - before.bytes_received == size * sizeof(std::int64_t));
      }
    });
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)));
  }
}

TEMPLATE_TEST_CASE("collective: peers given different counts for a partitioned all-reduce all get an error, not a wrong sum",
                   "[collective]", TRANSPORTS) {
  // Peer 1 puts the boundary between peers 0 and 1 elsewhere: peer 0 would wait for values peer 1
  // never sends it, or (with other counts) sum values of other elements. The peers compare their
  // counts first, and every one of them fails.
  CHECK_THROWS_WITH(TestType::run(3,
                                  [&](auto& ep) {
                                    dt::collective::communicator comm(ep);
                                    const std::size_t counts[2][3] = {{4, 2, 4}, {2, 4, 4}};
                                    std::vector<float> v(10, 1.0f);
                                    comm.partitioned_all_reduce(std::span<float>(v),
                                                                std::span<const std::size_t>(counts[ep.rank() == 1 ? 1 : 0]));
                                  }),
                    Catch::Contains("the peers were given different counts (peer ") &&
                        Catch::Contains("every peer must give the same counts"));
  harness::peer_checks checks;
  TestType::run(2, [&](auto& ep) {
    dt::collective::communicator comm(ep);
    std::vector<float> v(10, 1.0f);
    const std::size_t three[3] = {4, 3, 3}, short_of[2] = {4, 5};
    harness::expect_throws_with(checks, [&] { comm.partitioned_all_reduce(std::span<float>(v), std::span<const std::size_t>(three)); },
                                "needs one count per peer (2), got 3", "three counts");
    harness::expect_throws_with(checks, [&] { comm.partitioned_all_reduce(std::span<float>(v), std::span<const std::size_t>(short_of)); },
                                "the counts add up to 9 values, the buffer has 10", "counts short of the buffer");
  });
  checks.report(static_cast<std::size_t>(TestType::local_peers(2)) * 2);
}

TEMPLATE_TEST_CASE("collective: broadcast from every root and all-gather", "[collective]", TRANSPORTS) {
  for (int n = 1; n <= 8; ++n) {
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      dt::collective::communicator comm(ep);
      for (int root = 0; root < n; ++root) {
        std::vector<double> v(1001, ep.rank() == root ? 0.5 + root : -1.0);
        comm.broadcast(std::span<double>(v), root);
        PEER_CHECK(checks, std::all_of(v.begin(), v.end(), [&](double x) { return x == 0.5 + root; }));
      }
      std::vector<std::int32_t> mine(5, ep.rank() * 10);
      const auto all = comm.all_gather(std::span<const std::int32_t>(mine));
      if (!PEER_CHECK(checks, all.size() == static_cast<std::size_t>(5 * n))) return;
      for (int r = 0; r < n; ++r) PEER_CHECK(checks, all[static_cast<std::size_t>(5 * r + 4)] == r * 10);
      comm.barrier();
      PEER_CHECK(checks, comm.traffic().calls == static_cast<std::uint64_t>(n + 2));
    });
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)));
  }
}

TEMPLATE_TEST_CASE("collective: peers that disagree on the size get an error naming the peer", "[collective]", TRANSPORTS) {
  CHECK_THROWS_WITH(TestType::run(2,
                                  [&](auto& ep) {
                                    dt::collective::communicator comm(ep);
                                    std::vector<float> v(ep.rank() == 0 ? 100 : 101, 1.0f);
                                    comm.all_reduce(std::span<float>(v), reduce_op::sum, algorithm::recursive_doubling);
                                  }),
                    Catch::Contains("sent") && Catch::Contains("bytes where"));
}

TEMPLATE_TEST_CASE("collective: peers given different ring sizes get an error, not a wrong sum", "[collective]", TRANSPORTS) {
  // Same chunks, different windows: every message has the size the receiver expects, but they
  // would pair chunks of different steps. The first ring all-reduce compares the sizes instead.
  CHECK_THROWS_WITH(TestType::run(3,
                                  [&](auto& ep) {
                                    dt::collective::communicator comm(
                                        ep, {.chunk_bytes = 1024, .window_bytes = ep.rank() == 1 ? 4096u : 1024u, .in_flight_multiple = 0});
                                    std::vector<float> v(30'000, 1.0f);
                                    comm.all_reduce(std::span<float>(v), reduce_op::sum, algorithm::ring);
                                  }),
                    Catch::Contains("different ring sizes") && Catch::Contains("window_bytes from 1024 to 4096"));
}
