// Aggregators on crafted inputs (known medians, trimmed means, clipping), their specs, and the
// robust all-reduce on every transport for 1 to 8 peers with peers that send NaN, infinities,
// huge values or malformed payloads: dropped or outvoted, reported per peer, and every honest
// peer left with the same bits.
#include <catch2/catch.hpp>

#include <decentrain/collective/collective.hpp>
#include <decentrain/compress/compress.hpp>
#include <decentrain/detail/hash.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "support/peer_checks.hpp"
#include "support/transport_harness.hpp"

namespace dt = decentrain;
namespace col = dt::collective;

namespace {
std::vector<float> combine(auto aggregator, const std::vector<std::vector<float>>& in) {
  std::vector<std::span<const float>> parts(in.begin(), in.end());
  std::vector<float> out(in.front().size());
  aggregator.combine(col::contributions(parts), std::span<float>(out));
  return out;
}

// Peer r's honest contribution: a common value plus noise in [-0.01, 0.01] (so every honest peer
// lies about as far from the aggregate as the others).
float honest(int r, std::size_t i) {
  const auto u = static_cast<float>(dt::detail::splitmix64(static_cast<std::uint64_t>(r) * 1000003u + i) >> 40) / float(1 << 24);
  return std::sin(0.01f * static_cast<float>(i)) + 0.02f * (u - 0.5f);
}

enum class bad { none, nan, inf, huge };
float value_of(bad b, int r, std::size_t i) {
  switch (b) {
    case bad::nan: return i % 3 == 0 ? std::numeric_limits<float>::quiet_NaN() : honest(r, i);
    case bad::inf: return i == 5 ? -std::numeric_limits<float>::infinity() : honest(r, i);
    case bad::huge: return 1e6f;
    default: return honest(r, i);
  }
}
}  // namespace

TEST_CASE("aggregators: known answers on crafted contributions", "[aggregate]") {
  const std::vector<std::vector<float>> odd = {{1, 10}, {5, -2}, {3, 4}, {100, 0}, {-7, 2}};
  CHECK(combine(col::median{}, odd) == std::vector<float>{3, 2});
  CHECK(combine(col::mean{}, odd) == std::vector<float>{102.0f / 5, 14.0f / 5});
  const std::vector<std::vector<float>> even = {{1}, {8}, {4}, {2}};
  CHECK(combine(col::median{}, even) == std::vector<float>{3});
  // 8 values, trim 0.25: two off each end, the mean of the middle four.
  const std::vector<std::vector<float>> eight = {{9}, {1}, {1000}, {2}, {3}, {-500}, {4}, {5}};
  CHECK(combine(col::trimmed_mean{}, eight) == std::vector<float>{(2 + 3 + 4 + 5) / 4.0f});
  CHECK(col::trimmed_mean{0.4}.trimmed(8) == 3);
  CHECK(col::trimmed_mean{0.4}.trimmed(3) == 1);  // at most (n - 1) / 2: one value remains
  CHECK(col::trimmed_mean{0.25}.trimmed(2) == 0);
  CHECK(combine(col::trimmed_mean{0.0}, even) == combine(col::mean{}, even));
  CHECK_THROWS_WITH(combine(col::trimmed_mean{0.5}, even), Catch::Contains("trim must be in [0, 0.5)"));

  // Centered clipping: a radius beyond every distance gives the mean in one iteration; the
  // adaptive radius keeps a far outlier's pull under radius / n.
  const std::vector<std::vector<float>> near = {{1, 1}, {2, 2}, {3, 0}, {2, 1}};
  const auto wide = combine(col::centered_clip{1, 1e9}, near), m = combine(col::mean{}, near);
  CHECK(wide[0] == Approx(m[0]));
  CHECK(wide[1] == Approx(m[1]));
  std::vector<std::vector<float>> attacked = {{1.0f}, {1.1f}, {0.9f}, {1.05f}, {0.95f}, {1.0f}, {1.02f}, {1e9f}};
  const auto clipped = combine(col::centered_clip{}, attacked);
  CHECK(std::abs(clipped[0] - 1.0f) < 0.1f);
  CHECK(combine(col::mean{}, attacked)[0] > 1e8f);
  CHECK_THROWS_WITH(combine(col::centered_clip{0, 0}, near), Catch::Contains("iterations must be >= 1"));
  CHECK_THROWS_WITH(combine(col::median{}, {{1, 2}, {3}}), Catch::Contains("a contribution has 1 values, the output 2"));
}

TEST_CASE("aggregators: sender-mean averages each coordinate over the peers that sent it", "[aggregate]") {
  // Coordinate 0: all four sent; 1: one peer; 2: two; 3: none.
  const std::vector<std::vector<float>> sparse = {{1, 0, 2, 0}, {3, 0, 0, 0}, {5, -6, 4, 0}, {7, 0, 0, 0}};
  CHECK(combine(col::sender_mean{}, sparse) == std::vector<float>{4, -6, 3, 0});
  CHECK(combine(col::mean{}, sparse) == std::vector<float>{4, -1.5f, 1.5f, 0});
  const std::vector<std::vector<float>> dense = {{1, 10}, {5, -2}, {3, 4}};
  CHECK(combine(col::sender_mean{}, dense) == combine(col::mean{}, dense));
  CHECK(col::parse_aggregator("sender-mean").describe() == "sender-mean");
  CHECK(!col::parse_aggregator("sender-mean").averages_in_flight());  // it must see every contribution
  CHECK_THROWS_WITH(col::parse_aggregator("sender-mean:bucket=2"), Catch::Contains("sender-mean takes no bucket=S"));
}

TEMPLATE_TEST_CASE("robust all-reduce: sender-mean through top-k moves a coordinate one peer sent by its value", "[aggregate]",
                   TRANSPORTS) {
  std::vector<std::vector<float>> results(4);
  TestType::run(4, [&](auto& ep) {
    dt::collective::communicator c(ep);
    dt::compress::top_k codec;
    codec.count = 1;
    std::vector<float> v(8, 0.001f);
    v[static_cast<std::size_t>(ep.rank())] = 2.0f * static_cast<float>(ep.rank() + 1);
    col::sender_mean a;
    col::aggregation_record record;
    dt::collective::encoded_all_reduce(codec, c, std::span<float>(v), true, a, record);
    results[static_cast<std::size_t>(ep.rank())] = v;  // checked on the test's thread
  });
  for (const auto& v : results) CHECK(v == std::vector<float>{2, 4, 6, 8, 0, 0, 0, 0});
}

TEST_CASE("aggregators: large finite contributions never add up to infinity (found by fuzz/specs)", "[aggregate]") {
  // Each pair sums past FLT_MAX; every aggregate of them lies between them and is finite.
  const float big = 3e38f;
  const std::vector<std::vector<float>> pairs = {{big, -big}, {big, big}, {-big, -big}, {big, -big}};
  auto finite = [](const std::vector<float>& v) { return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); }); };
  CHECK(combine(col::median{}, pairs) == std::vector<float>{big, -big});
  CHECK(combine(col::trimmed_mean{0.0}, pairs) == std::vector<float>{big / 2, -big / 2});
  CHECK(finite(combine(col::centered_clip{}, pairs)));
  CHECK(finite(combine(col::centered_clip{3, 1.0}, pairs)));
  col::bucketing<col::median> b;
  CHECK(finite(combine(b, pairs)));
}

template <class Inner>
col::bucketing<Inner> buckets_of(std::size_t size) {
  col::bucketing<Inner> b;
  b.size = size;
  return b;
}

TEST_CASE("aggregators: bucketing averages random groups, the same groups on every peer", "[aggregate]") {
  std::vector<std::vector<float>> in;
  for (int r = 0; r < 7; ++r) in.push_back({static_cast<float>(r * r), static_cast<float>(-r)});
  // Buckets of one are the contributions themselves; one bucket of all is the mean.
  CHECK(combine(buckets_of<col::median>(1), in) == combine(col::median{}, in));
  const auto all = combine(buckets_of<col::median>(7), in), m = combine(col::mean{}, in);
  CHECK(all[0] == Approx(m[0]));
  CHECK(all[1] == Approx(m[1]));
  // Two peers' bucketing aggregators called alike draw the same groups; the groups change per call.
  auto a = buckets_of<col::median>(2), b = buckets_of<col::median>(2);
  std::vector<std::span<const float>> parts(in.begin(), in.end());
  std::vector<float> first_a(2), first_b(2), second_a(2);
  a.combine(col::contributions(parts), first_a);
  b.combine(col::contributions(parts), first_b);
  CHECK(first_a == first_b);
  bool differs = false;
  for (int k = 0; k < 8 && !differs; ++k) {
    a.combine(col::contributions(parts), second_a);
    differs = second_a != first_a;
  }
  CHECK(differs);
}

TEST_CASE("aggregators: specs from the command line", "[aggregate]") {
  CHECK(col::parse_aggregator("mean").averages_in_flight());
  CHECK(!col::parse_aggregator("mean:partitioned").averages_in_flight());
  CHECK(col::parse_aggregator("median:partitioned").per_partition());
  CHECK(col::parse_aggregator("centered-clip:iterations=2,radius=0.5").describe() ==
        "centered-clip:iterations=2,radius=0.500000");
  CHECK(col::parse_aggregator("trimmed-mean:trim=0.1,bucket=2").describe().find("bucket=2") != std::string::npos);
  CHECK(col::parse_aggregator("centered-clip:bucket=2,partitioned").per_partition());
  // describe() is a spec that makes the same aggregator (peers compare it; logs show it).
  for (const char* spec : {"mean", "median:partitioned", "trimmed-mean:trim=0.1", "centered-clip:iterations=2,bucket=3,seed=9",
                           "centered-clip:bucket=2,partitioned"}) {
    const auto once = col::parse_aggregator(spec).describe();
    CHECK(col::parse_aggregator(once).describe() == once);
  }
  CHECK_THROWS_WITH(col::parse_aggregator("median:seed=3"), Catch::Contains("seed=S goes with bucket=S"));
  CHECK_THROWS_WITH(col::parse_aggregator("krum"), Catch::Contains("unknown aggregator 'krum'"));
  // As the command line's help writes it: NAME,SETTING is NAME:SETTING.
  CHECK(col::parse_aggregator("median,partitioned").per_partition());
  CHECK(col::parse_aggregator("median,partitioned").describe() == col::parse_aggregator("median:partitioned").describe());
  CHECK_THROWS_WITH(col::parse_aggregator("median:trim=0.1"), Catch::Contains("unknown setting 'trim' for median"));
  CHECK_THROWS_WITH(col::parse_aggregator("trimmed-mean:trim=0.5"), Catch::Contains("trim must be in [0, 0.5)"));
  CHECK_THROWS_WITH(col::parse_aggregator("centered-clip:iterations=0"), Catch::Contains("iterations must be a whole number"));
  CHECK_THROWS_WITH(col::parse_aggregator("centered-clip:radius=x"), Catch::Contains("radius expects a number, got 'x'"));
  CHECK_THROWS_WITH(col::parse_aggregator("median:bucket=0"), Catch::Contains("bucket must be a whole number"));
  CHECK_THROWS_WITH(col::parse_aggregator("median:,"), Catch::Contains("an empty setting"));
}

TEMPLATE_TEST_CASE("robust all-reduce: bad peers are dropped or outvoted, named, and honest peers agree", "[aggregate]",
                   TRANSPORTS) {
  // Each with the fewest peers for which it keeps two bad ones out (one NaN, one huge; the NaN is
  // dropped before any aggregator sees it): trimming one from each end needs 4 kept, buckets of
  // two need four buckets. The mean is there for the NaN drop and the report, not the range.
  struct entry {
    col::any_aggregator aggregator;
    int holds_from;
  };
  const std::vector<entry> aggregators = {{col::median{}, 1},
                                          {col::trimmed_mean{}, 4},
                                          {col::centered_clip{}, 1},
                                          {col::bucketing<col::centered_clip>{}, 8},
                                          {col::partitioned<col::median>{}, 1},
                                          {col::partitioned<col::centered_clip>{}, 1},
                                          {col::partitioned<col::mean>{}, 1000}};
  for (int n = 1; n <= 8; ++n) {
    // Up to two bad peers, never half or more: the last ranks, one sending NaN or -inf, one huge values.
    const int bad_peers = std::min(2, (n - 1) / 2);
    auto kind = [&](int r) {
      if (r < n - bad_peers) return bad::none;
      if (r == n - 1) return n % 2 ? bad::huge : bad::nan;
      return n % 2 ? bad::inf : bad::huge;
    };
    const std::size_t size = 1000 + static_cast<std::size_t>(n);  // slices of uneven sizes
    for (const auto& e : aggregators) {
      const auto& prototype = e.aggregator;  // not a structured binding: clang 14 cannot capture one
      const bool robust = n >= e.holds_from;
      INFO(prototype.describe() << " with " << n << " peers");
      harness::peer_checks checks;
      TestType::run(n, [&](auto& ep) {
        dt::collective::communicator c(ep);
        const int r = c.rank();
        auto aggregator = prototype;
        col::aggregation_record record;
        std::vector<float> v(size);
        for (std::size_t i = 0; i < size; ++i) v[i] = value_of(kind(r), r, i);
        col::robust_all_reduce(aggregator, c, std::span<float>(v), record);
        // Every honest peer holds the same bits; every value within the honest peers' range.
        const std::string at = " at peer " + std::to_string(r);
        const bool same = c.all_same(dt::detail::hash_words(std::as_bytes(std::span<const float>(v))));
        checks.expect(same, "the peers' results differ" + at);
        // Each value within the honest peers' range of that coordinate (their spread is 0.02,
        // the coordinates' values span [-1, 1]), with a margin of half the spread.
        std::size_t outside = 0, first = size;
        for (std::size_t i = 0; i < size && robust; ++i) {
          float low = 1e30f, high = -1e30f;
          for (int p = 0; p < n - bad_peers; ++p) {
            low = std::min(low, honest(p, i));
            high = std::max(high, honest(p, i));
          }
          if (!(v[i] >= low - 0.01f && v[i] <= high + 0.01f) && outside++ == 0) first = i;
        }
        checks.expect(outside == 0, std::to_string(outside) + " values outside their coordinate's honest range, the first " +
                                        (first < size ? std::to_string(first) + " at " + std::to_string(v[first]) : "") + at);
        // The report: NaN and infinity senders dropped, huge senders far away, honest ones kept.
        // Per partition a verdict needs a majority of the slices' aggregators: the -inf sender
        // poisons one value, so one slice, and is dropped there but not reported.
        if (!checks.expect(record.last.peers.size() == static_cast<std::size_t>(n), "a report of the wrong size" + at)) return;
        const bool per_slice = col::is_partitioned(prototype);
        for (int p = 0; p < n; ++p) {
          const auto k = kind(p);
          const auto seen = record.last.peers[static_cast<std::size_t>(p)];
          const bool reported = k == bad::nan || (k == bad::inf && (!per_slice || n == 1));
          const std::string of = " for peer " + std::to_string(p) + at;
          checks.expect(seen == (reported ? col::verdict::non_finite : col::verdict::kept), "the wrong verdict" + of);
          if (k == bad::huge && robust) checks.expect(record.tally.far[static_cast<std::size_t>(p)] == 1, "not counted far" + of);
          if (k == bad::none && n > 2)
            checks.expect(record.tally.suspicious(static_cast<std::size_t>(p)) == 0, "an honest peer suspected" + of);
        }
      });
      checks.report(static_cast<std::size_t>(TestType::local_peers(n)) * (3 + static_cast<std::size_t>(n)));
    }
  }
}

template <class Codec, class Harness>
void mean_drops_a_nan_sender(Codec prototype) {
  INFO(dt::compress::describe(prototype));
  harness::peer_checks checks;
  Harness::run(4, [&](auto& ep) {
    dt::collective::communicator c(ep);
    const int r = c.rank();
    Codec codec = prototype;
    col::mean aggregator;
    col::aggregation_record record;
    for (int round = 0; round < 2; ++round) {
      // Round 0 all honest (summed on the way, nothing seen per peer); round 1 peer 2 sends NaN (a
      // codec that refuses to encode it, as int8 does, never lets it out).
      std::vector<float> v(512, static_cast<float>(r + 1));
      if (round == 1 && r == 2) v[100] = std::numeric_limits<float>::quiet_NaN();
      dt::collective::encoded_all_reduce(codec, c, std::span<float>(v), true, aggregator, record);
      const float expected = round == 0 ? 2.5f : (1 + 2 + 4) / 3.0f;
      const std::string at = " in round " + std::to_string(round) + " at peer " + std::to_string(r);
      checks.expect(std::abs(v[0] - expected) <= 0.02f * expected, "the mean is " + std::to_string(v[0]) + at);
      checks.expect(std::isfinite(v[100]), "a value is not finite" + at);
      checks.expect(record.last.peers[2] == (round == 0 ? col::verdict::kept : col::verdict::non_finite),
                    "peer 2's verdict" + at);
      checks.expect(record.last.distance.empty() == (round == 0), "distances measured or not" + at);
    }
    checks.expect(record.tally.calls == 2 && record.tally.non_finite == std::vector<std::int64_t>{0, 0, 1, 0},
                  "the tally at peer " + std::to_string(r));
  });
  checks.report(static_cast<std::size_t>(Harness::local_peers(4)) * 9);
}

TEMPLATE_TEST_CASE("robust all-reduce: the mean drops a NaN sender and names it, also through a codec", "[aggregate]",
                   TRANSPORTS) {
  mean_drops_a_nan_sender<dt::compress::identity, TestType>({});
  mean_drops_a_nan_sender<dt::compress::bf16, TestType>({});
  mean_drops_a_nan_sender<dt::compress::error_feedback<dt::compress::bf16>, TestType>({});  // gathered: not dense
}

namespace {
// A codec written for this test: f32 after a 4-byte mark that its decoder checks, and peer 1
// sending a wrong mark (a payload this codec could not have written).
struct marked {
  static constexpr const char* name = "marked";
  std::uint32_t mark = 0x6d61726b;
  std::size_t max_encoded_bytes(std::size_t n) const { return 4 + n * sizeof(float); }
  std::size_t encode(std::span<const float> v, std::span<std::byte> out) {
    std::memcpy(out.data(), &mark, 4);
    std::memcpy(out.data() + 4, v.data(), v.size_bytes());
    return 4 + v.size_bytes();
  }
  void decode_add(std::span<const std::byte> in, std::span<float> into) const {
    std::uint32_t m = 0;
    dt::detail::check(in.size() == 4 + into.size_bytes(), "marked: wrong size");
    std::memcpy(&m, in.data(), 4);
    dt::detail::check(m == 0x6d61726b, "marked: wrong mark");
    for (std::size_t i = 0; i < into.size(); ++i) {
      float x;
      std::memcpy(&x, in.data() + 4 + 4 * i, 4);
      into[i] += x;
    }
  }
};
}  // namespace

TEMPLATE_TEST_CASE("robust all-reduce: a malformed payload is left out, not the end of the call", "[aggregate]", TRANSPORTS) {
  harness::peer_checks checks;
  TestType::run(5, [&](auto& ep) {
    dt::collective::communicator c(ep);
    const int r = c.rank();
    marked codec;
    if (r == 1) codec.mark = 0xbad;
    col::median aggregator;
    col::aggregation_record record;
    std::vector<float> v(64, static_cast<float>(r));
    dt::collective::encoded_all_reduce(codec, c, std::span<float>(v), true, aggregator, record);
    PEER_CHECK(checks, v[0] == 2.5f);  // the median of 0, 2, 3, 4
    PEER_CHECK(checks, record.last.peers[1] == col::verdict::malformed);
    PEER_CHECK(checks, record.tally.malformed[1] == 1);
    // Per partition the payloads would have to be f32: a codec there is refused, naming both.
    col::partitioned<col::median> per_slice;
    harness::expect_throws_with(
        checks, [&] { dt::collective::encoded_all_reduce(codec, c, std::span<float>(v), true, per_slice, record); },
        "aggregates per partition, which sends f32 values", "a codec under partitioned<median>");
  });
  checks.report(static_cast<std::size_t>(TestType::local_peers(5)) * 4);
}

namespace {
// How peer 4 of 5 lies when it aggregates slice 4 of a partitioned<median> all-reduce.
enum class aggregator_lie {
  blames_peer_0,   // aggregates honestly, but says peer 0's contribution and slice 0 were non-finite
  returns_nan,     // sends everyone NaN as its slice's aggregate
};

struct partition_run {
  std::vector<col::aggregation_record> records;  // of the honest peers 0-3
  std::vector<std::vector<float>> results;
};

// Peers 0-3 run partitioned<median>; peer 4 follows its protocol by hand (the three all-to-alls).
// Each honest peer's record and result are returned and checked on the test's thread: Catch2's
// INFO and CHECK are not safe to call from the peers' threads at once.
partition_run lying_aggregator(aggregator_lie lie) {
  constexpr int n = 5;
  constexpr std::size_t size = 1000, share = size / n;
  partition_run run;
  run.records.resize(n - 1);
  run.results.resize(n - 1);
  dt::transport::in_process(n).run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator c(ep);
    const int r = c.rank();
    std::vector<float> v(size);
    for (std::size_t i = 0; i < size; ++i) v[i] = 1.0f + 0.01f * static_cast<float>(r) + 0.001f * static_cast<float>(i % 7);
    if (r < n - 1) {
      col::partitioned<col::median> aggregator;
      col::robust_all_reduce(aggregator, c, std::span<float>(v), run.records[static_cast<std::size_t>(r)]);
      run.results[static_cast<std::size_t>(r)] = v;
      return;
    }
    auto slice = [&](std::vector<float>& b, std::size_t k) { return std::span<float>(b).subspan(k * share, share); };
    std::vector<float> got(n * share), result(share);
    std::vector<std::span<const float>> out(n);
    std::vector<std::span<float>> in(n);
    for (std::size_t p = 0; p < n; ++p) {
      out[p] = slice(v, p);
      in[p] = std::span<float>(got).subspan(p * share, share);
    }
    c.all_to_all(std::span<const std::span<const float>>(out), std::span<const std::span<float>>(in));
    for (std::size_t i = 0; i < share; ++i) {  // its slice's median, honestly
      std::vector<float> column;
      for (std::size_t p = 0; p < n; ++p) column.push_back(got[p * share + i]);
      std::sort(column.begin(), column.end());
      result[i] = column[n / 2];
    }
    if (lie == aggregator_lie::returns_nan) std::fill(result.begin(), result.end(), std::numeric_limits<float>::quiet_NaN());
    for (std::size_t p = 0; p < n; ++p) {
      out[p] = result;
      in[p] = slice(v, p);
    }
    c.all_to_all(std::span<const std::span<const float>>(out), std::span<const std::span<float>>(in));
    // Its view: per peer a verdict and a squared distance, then per aggregate slice whether it
    // arrived non-finite.
    std::vector<double> view(3 * n, 0.0), views(3 * n * n);
    if (lie == aggregator_lie::blames_peer_0) {
      view[0] = 1.0;      // peer 0's contribution: "non-finite"
      view[2 * n] = 1.0;  // slice 0's aggregate: "arrived non-finite"
    }
    std::vector<std::span<const double>> vout(n, std::span<const double>(view));
    std::vector<std::span<double>> vin(n);
    for (std::size_t k = 0; k < n; ++k) vin[k] = std::span<double>(views).subspan(k * 3 * n, 3 * n);
    c.all_to_all(std::span<const std::span<const double>>(vout), std::span<const std::span<double>>(vin));
  });
  return run;
}
}  // namespace

TEST_CASE("robust all-reduce per partition: a lying aggregator cannot have an honest peer reported", "[aggregate]") {
  // Peer 4 says peer 0 sent non-finite values and that slice 0 came back non-finite. One of five
  // is not a majority: peer 0 stays kept and unsuspected, as aggregator and as contributor.
  const auto run = lying_aggregator(aggregator_lie::blames_peer_0);
  for (std::size_t r = 0; r < run.records.size(); ++r) {
    for (std::size_t p = 0; p < 5; ++p) {
      INFO("peer " << r << " on peer " << p);
      CHECK(run.records[r].last.peers[p] == col::verdict::kept);
      CHECK_FALSE(run.records[r].last.suspicious(p));
    }
    CHECK(run.results[r][0] == Approx(1.02f));  // the median of 1.00 ... 1.04
    CHECK(run.results[r] == run.results[0]);
  }
}

TEST_CASE("robust all-reduce per partition: an aggregator that returns NaN leaves zeros, and is named", "[aggregate]") {
  // Peer 4 aggregates slice 4 (values 800-999) and sends NaN back to all. The honest peers take
  // zeros there (no update in that slice this call), keep the median elsewhere, hold the same
  // bits, and the four of them outvote the one: peer 4 is reported non-finite.
  const auto run = lying_aggregator(aggregator_lie::returns_nan);
  for (std::size_t r = 0; r < run.records.size(); ++r) {
    INFO("peer " << r);
    const auto& v = run.results[r];
    CHECK(std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); }));
    CHECK(v[0] == Approx(1.02f));
    CHECK(v[799] == Approx(1.02f + 0.001f * static_cast<float>(799 % 7)));
    CHECK(std::all_of(v.begin() + 800, v.end(), [](float x) { return x == 0.0f; }));
    CHECK(v == run.results[0]);
    const auto& report = run.records[r].last;
    CHECK(report.peers[4] == col::verdict::non_finite);
    for (std::size_t p = 0; p < 4; ++p) CHECK(report.peers[p] == col::verdict::kept);
    CHECK(run.records[r].tally.suspicious(4) == 1);
  }
}

namespace {
std::vector<float> combine_weighted(auto aggregator, const std::vector<std::vector<float>>& in, const std::vector<double>& w) {
  std::vector<std::span<const float>> parts(in.begin(), in.end());
  std::vector<float> out(in.front().size());
  aggregator.combine_weighted(col::contributions(parts), std::span<const double>(w), std::span<float>(out));
  return out;
}
}  // namespace

TEST_CASE("aggregators: weighted, equal weights give the unweighted answer and a heavy contribution pulls", "[aggregate]") {
  const std::vector<std::vector<float>> in = {{1, 10, -3}, {2, 20, 0}, {3, 30, 5}, {100, -5, 1}};
  const std::vector<double> equal = {2, 2, 2, 2};
  CHECK(combine_weighted(col::median{}, in, equal) == combine(col::median{}, in));
  CHECK(combine_weighted(col::trimmed_mean{}, in, equal) == combine(col::trimmed_mean{}, in));
  CHECK(combine_weighted(col::centered_clip{}, in, equal) == combine(col::centered_clip{}, in));
  const auto m = combine_weighted(col::mean{}, in, equal), plain = combine(col::mean{}, in);
  for (std::size_t i = 0; i < m.size(); ++i) CHECK(m[i] == Approx(plain[i]).epsilon(1e-6));
  // The third contribution weighs 5 of 8: more than half, so the weighted median is its value.
  const std::vector<double> heavy = {1, 1, 5, 1};
  CHECK(combine_weighted(col::median{}, in, heavy) == std::vector<float>{3, 30, 5});
  // Trimming 0.25 of the weight (2 of 8) off each end: 1 x 1 + 5 x ... per coordinate, what lies
  // in the middle 4: coordinate 0 sorted 1(1) 2(1) 3(5) 100(1): 2 trimmed below (values 1 and 2),
  // 2 above (100, and 1 of 3's 5): 3 x 4 / 4 = 3.
  CHECK(combine_weighted(col::trimmed_mean{}, in, heavy)[0] == Approx(3.0f));
  const auto wm = combine_weighted(col::mean{}, in, heavy);
  CHECK(wm[0] == Approx((1 + 2 + 15 + 100) / 8.0));
  // Bucketing weighs its groups' means by their total weight; sender-mean cannot weigh.
  col::bucketing<col::median> buckets;
  buckets.size = 1;  // groups of one: the weighted median of the contributions themselves
  CHECK(combine_weighted(buckets, in, heavy) == std::vector<float>{3, 30, 5});
  static_assert(col::can_weigh<col::median>() && col::can_weigh<col::partitioned<col::trimmed_mean>>());
  static_assert(!col::can_weigh<col::sender_mean>() && !col::can_weigh<col::bucketing<col::sender_mean>>());
  CHECK_THROWS_WITH(combine_weighted(col::median{}, in, std::vector<double>{1, 1, -1, 1}),
                    Catch::Contains("a contribution's weight is -1, not a positive number"));
}

TEMPLATE_TEST_CASE("robust all-reduce: weighted contributions, a claimed weight capped and a negative one dropped", "[aggregate]",
                   col::median, col::partitioned<col::median>) {
  // Four peers send r + 1 everywhere; peer 3 claims `lie` as its weight, the others 1.
  const auto run = [](double lie) {
    std::vector<std::vector<float>> got(4);
    std::vector<col::aggregation_report> reports(4);
    dt::transport::in_process(4).run([&](dt::transport::in_process::endpoint& ep) {
      dt::collective::communicator comm(ep);
      std::vector<float> v(5, static_cast<float>(ep.rank() + 1));
      TestType aggregator;
      col::aggregation_record record;
      dt::compress::identity codec;
      dt::collective::encoded_all_reduce(codec, comm, std::span<float>(v), true, aggregator, record, ep.rank() == 3 ? lie : 1.0);
      got[static_cast<std::size_t>(ep.rank())] = v;
      reports[static_cast<std::size_t>(ep.rank())] = record.last;
    });
    return std::pair(got, reports);
  };
  // Weights 1, 1, 1, 2: the weighted median of 1, 2, 3, 4 is 3 (the plain one 2.5).
  const auto two = run(2.0).first;
  for (const auto& v : two) CHECK(v == std::vector<float>(5, 3.0f));
  // A claim of 1e9 counts as 2 (twice the median weight): the same answer, not peer 3's 4.
  const auto [huge, huge_reports] = run(1e9);
  for (const auto& v : huge) CHECK(v == std::vector<float>(5, 3.0f));
  CHECK(huge_reports[0].peers[3] == col::verdict::kept);
  // A negative weight, or one that is not a number, drops the contribution as malformed: the
  // median of 1, 2, 3.
  for (const double bad : {-1.0, std::nan("")}) {
    const auto [dropped, reports] = run(bad);
    for (const auto& v : dropped) CHECK(v == std::vector<float>(5, 2.0f));
    for (const auto& r : reports) CHECK(r.peers[3] == col::verdict::malformed);
  }
}
