// The conformance suite every transport passes: ordered tagged point-to-point messages, and the
// collectives on top of them for 1..8 peers and sizes that do not divide by the peer count.
#include <catch2/catch.hpp>

#include <decentrain/collective/communicator.hpp>
#include <decentrain/detail/hash.hpp>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

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
    TestType::run(n, [&](auto& ep) {
      const int r = ep.rank();
      REQUIRE(ep.world() == n);
      for (int p = 0; p < n; ++p) {
        for (int i = 0; i < 3; ++i) ep.send(p, 10, bytes_of("from " + std::to_string(r) + " #" + std::to_string(i)));
        ep.send(p, 20, bytes_of("tag 20 from " + std::to_string(r)));
        ep.send(p, 30, {});  // empty messages are messages too
      }
      for (int p = 0; p < n; ++p) {
        // Tag 20 first although it was sent after the tag-10 messages: matching is by tag.
        CHECK(text_of(ep.recv(p, 20)) == "tag 20 from " + std::to_string(p));
        for (int i = 0; i < 3; ++i) CHECK(text_of(ep.recv(p, 10)) == "from " + std::to_string(p) + " #" + std::to_string(i));
        CHECK(ep.recv(p, 30).empty());
      }
      const auto s = ep.stats();
      CHECK(s.messages_sent == static_cast<std::uint64_t>(5 * n));
      CHECK(s.messages_received == static_cast<std::uint64_t>(5 * n));
      CHECK(s.bytes_sent == s.bytes_received);  // everyone sent everyone the same kinds of messages
    });
  }
}

TEMPLATE_TEST_CASE("transport: large messages arrive intact", "[transport]", TRANSPORTS) {
  TestType::run(2, [&](auto& ep) {
    std::vector<std::uint32_t> big(3'000'001);
    std::iota(big.begin(), big.end(), static_cast<std::uint32_t>(ep.rank()) * 7u);
    ep.send(1 - ep.rank(), 1, std::as_bytes(std::span<const std::uint32_t>(big)));
    const auto got = ep.recv(1 - ep.rank(), 1);
    REQUIRE(got.size() == big.size() * 4);
    std::vector<std::uint32_t> back(big.size());
    std::memcpy(back.data(), got.data(), got.size());
    CHECK(back.front() == static_cast<std::uint32_t>(1 - ep.rank()) * 7u);
    CHECK(back.back() == static_cast<std::uint32_t>(1 - ep.rank()) * 7u + 3'000'000u);
  });
}

TEMPLATE_TEST_CASE("transport: exchange lands messages in order in the caller's memory; a size that differs is reported, not written",
                   "[transport]", TRANSPORTS) {
  for (int n : {1, 2, 3}) {
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
        CHECK(got == in.size() * 4);
        CHECK(in == pattern(left, i, 70'000));
      }
      // A message of another size than the memory offered: its size comes back, the memory is
      // left alone, and the next message of that tag is still the next one received.
      ep.send(right, 5, std::as_bytes(std::span<const std::uint32_t>(pattern(r, 0, 3))));
      ep.send(right, 5, std::as_bytes(std::span<const std::uint32_t>(pattern(r, 1, 5))));
      std::vector<std::uint32_t> in(5, 0xABABABABu);
      CHECK(dt::transport::exchange(ep, -1, {}, left, std::as_writable_bytes(std::span<std::uint32_t>(in)), 5) == 12);
      CHECK(in == std::vector<std::uint32_t>(5, 0xABABABABu));
      CHECK(dt::transport::exchange(ep, -1, {}, left, std::as_writable_bytes(std::span<std::uint32_t>(in)), 5) == 20);
      CHECK(in == pattern(left, 1, 5));
      // To itself, and empty.
      const auto mine = pattern(r, 7, 9);
      std::vector<std::uint32_t> back(9);
      CHECK(dt::transport::exchange(ep, r, std::as_bytes(std::span<const std::uint32_t>(mine)), r,
                                    std::as_writable_bytes(std::span<std::uint32_t>(back)), 6) == 36);
      CHECK(back == mine);
      CHECK(dt::transport::exchange(ep, right, {}, left, {}, 8) == 0);
      const auto s = ep.stats();
      CHECK(s.messages_received == 8);
      CHECK(s.bytes_received == 4 * 280'000 + 12 + 20 + 36);
    });
  }
}

TEMPLATE_TEST_CASE("transport: one exchange of many messages lands each in its own memory, in order, as it arrives",
                   "[transport]", TRANSPORTS) {
  for (int n : {1, 2, 3}) {
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
        if (sent[i] == offered[i]) CHECK(ins[i] == pattern(left, i, sent[i]));  // complete when reported
      });
      CHECK(order == std::vector<std::size_t>{0, 1, 2, 3, 4});
      CHECK(sizes == std::vector<std::size_t>{280'000, 0, 20, 120'000, 4});
      CHECK(ins[2] == std::vector<std::uint32_t>(7, 0xABABABABu));
      // A callback that throws ends the exchange; what it did not take is not left posted, and
      // later receives of the tag find the rest in order.
      ep.send(right, 10, std::as_bytes(std::span<const std::uint32_t>(outs[0])));
      ep.send(right, 10, std::as_bytes(std::span<const std::uint32_t>(outs[3])));
      CHECK_THROWS_WITH(dt::transport::exchange(ep, -1, {}, left, in_spans, 10,
                                                [&](std::size_t, std::size_t) { throw dt::error("stop here"); }),
                        Catch::Contains("stop here"));
      CHECK(ins[0] == pattern(left, 0, 70'000));
      std::vector<std::uint32_t> rest(30'000);
      CHECK(dt::transport::exchange(ep, -1, {}, left, std::as_writable_bytes(std::span<std::uint32_t>(rest)), 10) == 120'000);
      CHECK(rest == pattern(left, 3, 30'000));
    });
  }
}

TEMPLATE_TEST_CASE("transport: a bad peer index is an error naming it", "[transport]", TRANSPORTS) {
  TestType::run(2, [&](auto& ep) {
    CHECK_THROWS_WITH(ep.send(2, 1, {}), Catch::Contains("peer 2"));
    CHECK_THROWS_WITH(ep.recv(-1, 1), Catch::Contains("peer -1"));
  });
}

TEMPLATE_TEST_CASE("collective: all-reduce is exact for integers, 1..8 peers, uneven sizes, both algorithms",
                   "[collective]", TRANSPORTS) {
  for (int n = 1; n <= 8; ++n) {
    TestType::run(n, [&](auto& ep) {
      dt::collective::communicator comm(ep, {.chunk_bytes = 4096, .recursive_doubling_below_bytes = 1024});
      for (std::size_t size : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100003}}) {
        for (auto algo : {algorithm::ring, algorithm::recursive_doubling, algorithm::automatic}) {
          std::vector<std::int64_t> v(size);
          for (std::size_t i = 0; i < size; ++i) v[i] = static_cast<std::int64_t>(i * 31 + 1) * (ep.rank() + 1) - 5;
          comm.all_reduce(std::span<std::int64_t>(v), reduce_op::sum, algo);
          const std::int64_t ranks_sum = static_cast<std::int64_t>(n) * (n + 1) / 2;
          bool all_equal = true;
          for (std::size_t i = 0; i < size; ++i)
            all_equal = all_equal && v[i] == static_cast<std::int64_t>(i * 31 + 1) * ranks_sum - 5 * n;
          CHECK(all_equal);
          std::vector<std::int32_t> m(size);
          for (std::size_t i = 0; i < size; ++i) m[i] = static_cast<std::int32_t>((i + static_cast<std::size_t>(ep.rank()) * 13) % 17);
          comm.all_reduce(std::span<std::int32_t>(m), reduce_op::max, algo);
          bool max_ok = true;
          for (std::size_t i = 0; i < size; ++i) {
            std::int32_t expect = 0;
            for (int r = 0; r < n; ++r) expect = std::max(expect, static_cast<std::int32_t>((i + static_cast<std::size_t>(r) * 13) % 17));
            max_ok = max_ok && m[i] == expect;
          }
          CHECK(max_ok);
        }
      }
    });
  }
}

TEMPLATE_TEST_CASE("collective: float all-reduce averages within tolerance and leaves every peer identical",
                   "[collective]", TRANSPORTS) {
  for (int n : {2, 3, 4, 7}) {
    const std::size_t size = 50'001;
    TestType::run(n, [&](auto& ep) {
      dt::collective::communicator comm(ep, {.chunk_bytes = 8192});
      std::vector<float> v(size);
      for (std::size_t i = 0; i < size; ++i) v[i] = std::sin(static_cast<float>(i) * 0.01f + static_cast<float>(ep.rank()));
      comm.all_reduce(std::span<float>(v), reduce_op::average);
      double worst = 0;
      for (std::size_t i = 0; i < size; ++i) {
        double expect = 0;
        for (int r = 0; r < n; ++r) expect += std::sin(static_cast<float>(i) * 0.01f + static_cast<float>(r));
        worst = std::max(worst, std::abs(v[i] - expect / n));
      }
      CHECK(worst < 1e-6);  // a handful of float roundings of values of size <= 1
      // Bit-identical on every peer: compare a checksum of the result across peers.
      const std::uint64_t sum = dt::detail::fnv1a(std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * 4));
      const auto sums = comm.all_gather(std::span<const std::uint64_t>(&sum, 1));
      CHECK(std::all_of(sums.begin(), sums.end(), [&](std::uint64_t s) { return s == sum; }));
    });
  }
}

TEMPLATE_TEST_CASE("collective: recursive doubling leaves every peer with the same bits, 1..8 peers", "[collective]",
                   TRANSPORTS) {
  // Sums of floats of mixed magnitudes round differently in different orders, and max(-0, +0)
  // depends on the order of its operands: the peers must still agree bit for bit.
  for (int n = 1; n <= 8; ++n) {
    TestType::run(n, [&](auto& ep) {
      dt::collective::communicator comm(ep);
      const int r = ep.rank();
      std::vector<float> v(301), m(301);
      for (std::size_t i = 0; i < v.size(); ++i) {
        v[i] = std::ldexp(1.0f + 0.1f * static_cast<float>(i % 7), static_cast<int>((i + static_cast<std::size_t>(r) * 5) % 40) - 20);
        m[i] = (i + static_cast<std::size_t>(r)) % 2 ? 0.0f : -0.0f;
      }
      comm.all_reduce(std::span<float>(v), reduce_op::sum, algorithm::recursive_doubling);
      comm.all_reduce(std::span<float>(m), reduce_op::max, algorithm::recursive_doubling);
      CHECK(std::all_of(m.begin(), m.end(), [](float x) { return x == 0.0f; }));
      const auto bits = [](const std::vector<float>& x) {
        return dt::detail::fnv1a(std::string_view(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float)));
      };
      const std::uint64_t mine[2] = {bits(v), bits(m)};
      const auto all = comm.all_gather(std::span<const std::uint64_t>(mine, 2));
      for (int q = 0; q < n; ++q) {
        CHECK(all[static_cast<std::size_t>(2 * q)] == mine[0]);
        CHECK(all[static_cast<std::size_t>(2 * q + 1)] == mine[1]);
      }
    });
  }
}

TEMPLATE_TEST_CASE("collective: broadcast from every root and all-gather", "[collective]", TRANSPORTS) {
  for (int n = 1; n <= 8; ++n) {
    TestType::run(n, [&](auto& ep) {
      dt::collective::communicator comm(ep);
      for (int root = 0; root < n; ++root) {
        std::vector<double> v(1001, ep.rank() == root ? 0.5 + root : -1.0);
        comm.broadcast(std::span<double>(v), root);
        CHECK(std::all_of(v.begin(), v.end(), [&](double x) { return x == 0.5 + root; }));
      }
      std::vector<std::int32_t> mine(5, ep.rank() * 10);
      const auto all = comm.all_gather(std::span<const std::int32_t>(mine));
      REQUIRE(all.size() == static_cast<std::size_t>(5 * n));
      for (int r = 0; r < n; ++r) CHECK(all[static_cast<std::size_t>(5 * r + 4)] == r * 10);
      comm.barrier();
      CHECK(comm.traffic().calls == static_cast<std::uint64_t>(n + 2));
    });
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
