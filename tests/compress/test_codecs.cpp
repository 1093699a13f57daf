// Every codec: round trips within its stated bound on random, constant, zero, huge, denormal
// inputs and odd sizes; error feedback's accounting; all-reduce through each codec on every
// transport for 1..8 peers (the same bits everywhere, near the exact mean); codec state through
// a checkpoint; hostile payloads rejected; peers with different settings refused.
#include <catch2/catch.hpp>

#include <decentrain/collective/any_codec.hpp>
#include <decentrain/collective/encoded_all_reduce.hpp>
#include <decentrain/compress/compress.hpp>
#include <decentrain/core/rng.hpp>
#include <decentrain/detail/hash.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <string_view>
#include <vector>

#include "support/peer_checks.hpp"
#include "support/transport_harness.hpp"

namespace dt = decentrain;
namespace cz = dt::compress;

namespace {

std::vector<float> random_values(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  dt::rng g(seed, "codec-test");
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(scale * g.normal());
  return v;
}

template <class Codec>
std::vector<float> round_trip(Codec& c, const std::vector<float>& in) {
  std::vector<std::byte> buf(c.max_encoded_bytes(in.size()));
  const auto size = c.encode(std::span<const float>(in), buf);
  REQUIRE(size <= buf.size());
  std::vector<float> out(in.size(), 0.0f);
  c.decode_add(std::span<const std::byte>(buf.data(), size), out);
  return out;
}

const std::vector<std::size_t> sizes = {1, 7, 63, 64, 65, 1001, 40000};

std::vector<std::vector<float>> inputs(std::size_t n) {
  std::vector<std::vector<float>> all;
  all.push_back(random_values(n, n));
  all.push_back(std::vector<float>(n, 0.37f));                // constant
  all.push_back(std::vector<float>(n, 0.0f));                 // all zero
  all.push_back(random_values(n, n + 1, 1e30));               // huge
  all.push_back(random_values(n, n + 2, 1e-40));              // f32 denormals
  auto mixed = random_values(n, n + 3);
  for (std::size_t i = 0; i < n; i += 5) mixed[i] *= 1e6f;  // magnitudes far apart
  all.push_back(mixed);
  return all;
}

// Whether every peer of `c` holds these very bits (a hash's max and min agree).
template <class Comm>
bool same_everywhere(Comm& c, const std::vector<float>& v) {
  const std::uint64_t h = dt::detail::fnv1a(std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * 4));
  std::uint64_t extremes[2] = {h, ~h};
  c.all_reduce(std::span<std::uint64_t>(extremes, 2), dt::collective::reduce_op::max);
  return extremes[0] == h && ~extremes[1] == h;
}

}  // namespace

TEST_CASE("codecs: fp16 and bf16 round to nearest within half an ulp of their width") {
  for (auto n : sizes)
    for (const auto& x : inputs(n)) {
      cz::fp16 h;
      cz::bf16 b;
      const auto yh = round_trip(h, x), yb = round_trip(b, x);
      for (std::size_t i = 0; i < n; ++i) {
        const double a = std::abs(static_cast<double>(x[i]));
        if (a <= 65504.0) {
          // 11 significant bits above 2^-14; a step of 2^-24 below.
          CHECK(std::abs(yh[i] - static_cast<double>(x[i])) <= std::max(a * 0x1p-11, 0x1p-25));
        } else {
          CHECK(std::abs(yh[i]) == 65504.0f);  // saturated, sign kept
          CHECK(std::signbit(yh[i]) == std::signbit(x[i]));
        }
        CHECK(std::abs(yb[i] - static_cast<double>(x[i])) <= std::max(a * 0x1p-8, 1e-38));
      }
    }
  // Infinities and NaN pass through (decode_add adds into zeros, so -0 arrives as +0).
  cz::fp16 h;
  const auto special = round_trip(h, {-0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()});
  CHECK(special[0] == 0.0f);
  CHECK(std::isinf(special[1]));
  CHECK(std::isnan(special[2]));
}

TEST_CASE("codecs: int8 and int4 blockwise land within half a step of each value, stochastic rounding is unbiased") {
  for (int bits : {8, 4})
    for (std::size_t block : {std::size_t{2}, std::size_t{64}, std::size_t{256}})
      for (auto n : sizes)
        for (const auto& x : inputs(n)) {
          auto check = [&](auto codec) {
            codec.block = block;
            const auto y = round_trip(codec, x);
            for (std::size_t b0 = 0; b0 < n; b0 += block) {
              float absmax = 0;
              for (std::size_t i = b0; i < std::min(n, b0 + block); ++i) absmax = std::max(absmax, std::abs(x[i]));
              const double half_step = absmax / decltype(codec)::levels / 2.0;
              for (std::size_t i = b0; i < std::min(n, b0 + block); ++i)
                // Plus f32's spacing among denormals, where the scale itself loses bits.
                CHECK(std::abs(static_cast<double>(y[i]) - x[i]) <= half_step * 1.0001 + 1e-43);
            }
          };
          if (bits == 8) check(cz::int8_blockwise{});
          else check(cz::int4_blockwise{});
        }
  // Stochastic: the mean of many roundings of 0.3 (in a block whose absmax is 1) is 0.3.
  cz::int4_blockwise s;
  s.mode = cz::rounding::stochastic;
  s.seed = 7;
  std::vector<float> x(64, 0.3f);
  x[0] = 1.0f;
  double mean = 0;
  const int rounds = 2000;
  for (int k = 0; k < rounds; ++k) mean += round_trip(s, x)[5];
  mean /= rounds;
  // Steps of 1/7: the draw is 2/7 or 3/7 (mean 0.3, sd 0.07 per draw, 0.0016 over 2000).
  CHECK(mean == Approx(0.3).margin(0.008));
  cz::int4_blockwise nearest;
  CHECK(round_trip(nearest, x)[5] == Approx(2.0 / 7.0));  // nearest is biased here: 0.2857
}

TEST_CASE("codecs: stochastic rounding is unbiased across the values of one call, and its draws are uniform") {
  // 40000 values of 0.3 in blocks of 64 whose absmax is 1: one call's codes average to 0.3 (the
  // draws of neighbouring values are independent enough; sd 0.046 per value, 0.0002 over all).
  for (int bits : {8, 4}) {
    std::vector<float> x(40000, 0.3f);
    for (std::size_t i = 0; i < x.size(); i += 64) x[i] = 1.0f;
    auto mean_of = [&](auto codec) {
      codec.mode = cz::rounding::stochastic;
      codec.seed = 3;
      const auto y = round_trip(codec, x);
      double sum = 0;
      std::size_t count = 0;
      for (std::size_t i = 0; i < y.size(); ++i)
        if (i % 64) sum += y[i], ++count;
      return sum / static_cast<double>(count);
    };
    CHECK((bits == 8 ? mean_of(cz::int8_blockwise{}) : mean_of(cz::int4_blockwise{})) == Approx(0.3).margin(0.002));
  }
  // The draws themselves: 16 equal bins each within 5 sd (62 values) of 4096 over 2^16
  // consecutive values (a mix that ignored the low bits would pile values into a few), and
  // each value's draw is the same through the call's key as through the stream's three numbers.
  std::vector<int> bins(16);
  const std::uint64_t key = dt::detail::draw_key(9, 4);
  for (std::uint32_t i = 0; i < (1u << 16); ++i) {
    const float d = dt::detail::unit_draw_in(dt::detail::draw_word(key, 0), i);
    REQUIRE(d >= 0.0f);
    REQUIRE(d < 1.0f);
    ++bins[static_cast<std::size_t>(d * 16)];
  }
  for (int b : bins) CHECK(std::abs(b - 4096) < 310);
  for (std::uint64_t i : {std::uint64_t{0}, std::uint64_t{77}, (std::uint64_t{1} << 32) - 1, std::uint64_t{1} << 32, (std::uint64_t{5} << 32) + 3}) {
    CHECK(dt::detail::unit_draw(9, 4, i) == dt::detail::unit_draw_in(dt::detail::draw_word(key, i >> 32), static_cast<std::uint32_t>(i)));
  }
  // Values 2^32 apart draw under different words.
  CHECK(dt::detail::draw_word(key, 0) != dt::detail::draw_word(key, 1));
}

TEST_CASE("codecs: an input value that is not finite is refused by encode, naming its index") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t at : {std::size_t{0}, std::size_t{5}, std::size_t{8}, std::size_t{13}, std::size_t{700}, std::size_t{1000}})
    for (float bad : {inf, -inf, nan}) {
      auto x = random_values(1001, 4);
      x[at] = bad;
      const std::string why = "value " + std::to_string(at) + " is ";
      auto refuses = [&](auto codec) {
        std::vector<std::byte> out(codec.max_encoded_bytes(x.size()));
        CHECK_THROWS_WITH(codec.encode(std::span<const float>(x), out), Catch::Contains(why));
      };
      cz::int8_blockwise stochastic;
      stochastic.mode = cz::rounding::stochastic;
      refuses(cz::int8_blockwise{});
      refuses(stochastic);
      refuses(cz::int4_blockwise{});
      refuses(cz::fp4{});
      refuses(cz::sign{});
      cz::sign small;
      small.block = 8;
      refuses(small);
    }
}

TEST_CASE("codecs: fp4 rounds each value to the nearest E2M1 point of its block's scale, ties to the even code") {
  const float grid[] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (std::size_t block : {std::size_t{2}, std::size_t{64}})
    for (auto n : sizes)
      for (const auto& x : inputs(n)) {
        cz::fp4 c;
        c.block = block;
        const auto y = round_trip(c, x);
        for (std::size_t b0 = 0; b0 < n; b0 += block) {
          float absmax = 0;
          for (std::size_t i = b0; i < std::min(n, b0 + block); ++i) absmax = std::max(absmax, std::abs(x[i]));
          const double s = absmax / 6.0f;
          for (std::size_t i = b0; i < std::min(n, b0 + block); ++i) {
            double nearest = 1e300;
            for (float g : grid) nearest = std::min(nearest, std::abs(g * s - std::abs(static_cast<double>(x[i]))));
            // The nearest point, up to the scale's own rounding (and f32's spacing among denormals).
            if (std::abs(static_cast<double>(y[i]) - x[i]) > nearest * 1.0001 + 1e-6 * s + 1e-43)
              FAIL_CHECK("fp4 value " << i << " of " << n << ": " << x[i] << " -> " << y[i]);
            if (y[i] != 0.0f) CHECK(std::signbit(y[i]) == std::signbit(x[i]));
          }
        }
      }
  // With absmax 6 the scale is 1: ties 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
  cz::fp4 c;
  c.block = 8;
  const auto y = round_trip(c, {6.0f, 0.25f, -0.75f, 1.25f, 1.75f, -2.5f, 3.5f, 5.0f});
  CHECK(y == std::vector<float>{6.0f, 0.0f, -1.0f, 1.0f, 2.0f, -2.0f, 4.0f, 4.0f});
  CHECK(cz::fp4{}.max_encoded_bytes(64 * 1000) == 1000 * (4 + 32));  // as int4: 7.1x fewer bytes than f32
}

TEST_CASE("codecs: sign's scale of magnitudes near f32's largest stays finite") {
  cz::sign c;
  const std::vector<float> x(1000, 3e38f);
  const auto y = round_trip(c, x);
  for (float v : y) CHECK(v == 3e38f);
}

TEST_CASE("codecs: sign sends the sign and each block's mean magnitude") {
  for (std::size_t block : {8, 256})
  for (auto n : sizes) {
    cz::sign c;
    c.block = block;
    const auto x = random_values(n, 11);
    const auto y = round_trip(c, x);
    for (std::size_t b0 = 0; b0 < n; b0 += block) {
      double mean = 0;
      const std::size_t e = std::min(n, b0 + block);
      for (std::size_t i = b0; i < e; ++i) mean += std::abs(x[i]);
      mean /= static_cast<double>(e - b0);
      for (std::size_t i = b0; i < e; ++i) {
        CHECK(std::abs(y[i]) == Approx(mean).epsilon(1e-6));
        CHECK(std::signbit(y[i]) == std::signbit(x[i]));
      }
    }
  }
}

TEST_CASE("codecs: top-k sends exactly the k largest magnitudes, as varint gaps or a bitmap") {
  for (auto n : sizes)
    for (double fraction : {0.01, 0.3, 1.0}) {
      cz::top_k c;
      c.fraction = fraction;
      const auto x = random_values(n, 5 + n);
      const auto y = round_trip(c, x);
      const std::size_t k = c.k_for(n);
      std::vector<float> mags(x.size());
      for (std::size_t i = 0; i < n; ++i) mags[i] = std::abs(x[i]);
      std::vector<float> sorted = mags;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      const float cut = sorted[k - 1];
      std::size_t kept = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (y[i] != 0.0f) {
          ++kept;
          CHECK(y[i] == x[i]);  // values travel as f32
          CHECK(mags[i] >= cut);
        }
      }
      CHECK(kept == k);
    }
  // The payload picks the smaller index form: 1% of 40000 as gaps, 30% as a bitmap.
  cz::top_k few, many;
  few.fraction = 0.01;
  many.fraction = 0.3;
  const auto x = random_values(40000, 3);
  std::vector<std::byte> a(few.max_encoded_bytes(x.size())), b(many.max_encoded_bytes(x.size()));
  a.resize(few.encode(x, a));
  b.resize(many.encode(x, b));
  CHECK(static_cast<int>(a[16]) == 0);
  CHECK(static_cast<int>(b[16]) == 1);
  CHECK(a.size() < 25 + 5 * 400 + 4 * 400);
}

TEST_CASE("codecs: top-k with int4 or int2 values keeps the same indices, each value's sign, and magnitudes on its block's grid") {
  for (int bits : {4, 2})
    for (auto n : sizes)
      for (const auto& x : inputs(n)) {
        cz::top_k exact, c;
        exact.fraction = c.fraction = 0.3;
        c.value_bits = bits;
        c.block = 16;
        const auto want = round_trip(exact, x), y = round_trip(c, x);
        std::vector<std::size_t> picked;
        for (std::size_t i = 0; i < n; ++i)
          if (want[i] != 0.0f || y[i] != 0.0f) picked.push_back(i);
        const double L = bits == 4 ? 8 : 2;
        for (std::size_t b0 = 0; b0 < picked.size(); b0 += 16) {
          float absmax = 0;
          for (std::size_t j = b0; j < std::min(picked.size(), b0 + 16); ++j) absmax = std::max(absmax, std::abs(x[picked[j]]));
          const double step = absmax / L;
          for (std::size_t j = b0; j < std::min(picked.size(), b0 + 16); ++j) {
            const std::size_t i = picked[j];
            const double xi = x[i], yi = y[i];
            CHECK(want[i] == x[i]);  // the same index is sent
            // Magnitude m / L of the absmax, m in 1..L: within half a step of |x|, or the
            // smallest magnitude for |x| below it.
            const double err = std::abs(yi - xi), bound = std::abs(xi) >= step ? step / 2 : step - std::abs(xi);
            if (err > bound * 1.0001 + 1e-6 * step + 1e-43)
              FAIL_CHECK("int" << bits << " top-k value " << i << " of " << n << ": " << x[i] << " -> " << y[i]);
            if (absmax > 0) CHECK(std::signbit(yi) == std::signbit(xi));
          }
        }
      }
  // 2% of 40000 values at 2 bits: 800 values, 13 scales, 200 bytes of codes, about one byte of
  // gap per index (two where a gap is 128 or more): about 140x fewer bytes than f32.
  cz::top_k c;
  c.fraction = 0.02;
  c.value_bits = 2;
  const auto x = random_values(40000, 8);
  std::vector<std::byte> b(c.max_encoded_bytes(x.size()));
  b.resize(c.encode(x, b));
  CHECK(b.size() <= 25 + 2 * 800 + 4 * 13 + 200);
  CHECK(b.size() * 130 < 4 * x.size());
}

TEST_CASE("codecs: error feedback sends everything eventually: sent + kept == inputs") {
  cz::error_feedback<cz::top_k> ef;
  ef.codec.fraction = 0.05;
  const std::size_t n = 1000;
  std::vector<double> input_total(n, 0.0), sent_total(n, 0.0);
  for (int round = 0; round < 30; ++round) {
    const auto x = random_values(n, 100 + static_cast<std::uint64_t>(round));
    for (std::size_t i = 0; i < n; ++i) input_total[i] += x[i];
    const auto y = round_trip(ef, x);
    for (std::size_t i = 0; i < n; ++i) sent_total[i] += y[i];
  }
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i)
    worst = std::max(worst, std::abs(sent_total[i] + ef.residual()[i] - input_total[i]));
  CHECK(worst < 1e-4);  // f32 rounding of 30 additions
  // Without the residual, 95% of each round would be lost:
  double dropped = 0;
  for (std::size_t i = 0; i < n; ++i) dropped = std::max(dropped, static_cast<double>(std::abs(ef.residual()[i])));
  CHECK(dropped > 0.1);
  // A payload of another size than the residual's is refused.
  CHECK_THROWS_WITH(round_trip(ef, std::vector<float>(10, 1.0f)), Catch::Contains("a payload of 10 values, the residual holds 1000"));
}

TEST_CASE("codecs: error feedback with a decay keeps payload + decay x what was kept, less what was sent") {
  std::map<double, double> largest_kept;
  for (double decay : {1.0, 0.95, 0.5}) {
    cz::error_feedback<cz::top_k> ef;
    ef.codec.fraction = 0.05;
    ef.decay = decay;
    const std::size_t n = 1000;
    std::vector<float> kept(n, 0.0f);
    double worst = 0, largest = 0;
    for (int round = 0; round < 20; ++round) {
      const auto x = random_values(n, 300 + static_cast<std::uint64_t>(round));
      const auto y = round_trip(ef, x);
      for (std::size_t i = 0; i < n; ++i) {
        const double want = x[i] + static_cast<double>(static_cast<float>(decay) * kept[i]) - y[i];
        worst = std::max(worst, std::abs(ef.residual()[i] - want));
        largest = std::max(largest, static_cast<double>(std::abs(ef.residual()[i])));
      }
      kept = ef.residual();
    }
    INFO("decay " << decay);
    CHECK(worst < 1e-5);
    largest_kept[decay] = largest;
  }
  // A residual that decays holds less than one that does not (95% of each round waits): the
  // undecayed one grows like the square root of the rounds, a decayed one levels off.
  CHECK(largest_kept[0.5] < 0.6 * largest_kept[1.0]);
  CHECK(largest_kept[0.95] < largest_kept[1.0]);
  // The decay is part of the settings peers compare, and a decay outside (0, 1] is refused.
  CHECK(dt::collective::parse_codec("topk:0.02,ef=0.95").describe() == "ef(topk(fraction=0.020000),decay=0.950000)");
  CHECK(dt::collective::parse_codec("topk:0.02,ef").describe() == "ef(topk(fraction=0.020000))");
  CHECK_THROWS_WITH(dt::collective::parse_codec("topk:0.02,ef=1.5"), Catch::Contains("ef=D takes a decay in (0, 1], got 1.5"));
  CHECK_THROWS_WITH(dt::collective::parse_codec("int8:ef=0"), Catch::Contains("ef=D takes a decay in (0, 1], got 0"));
  // A word where top-k takes a fraction is an unknown setting, not a bad number; dct names itself.
  CHECK_THROWS_WITH(dt::collective::parse_codec("topk:0.03,int3"), Catch::Contains("topk has no setting 'int3'") &&
                                                           Catch::Contains("int4 or int2 values"));
  CHECK_THROWS_WITH(dt::collective::parse_codec("dct:5"), Catch::Contains("codec 'dct:5': dct's fraction must be in (0, 1], got 5"));
  // The help's "NAME,SETTING" form is NAME:SETTING.
  CHECK(dt::collective::parse_codec("int8,ef").describe() == dt::collective::parse_codec("int8:ef").describe());
  cz::error_feedback<cz::int8_blockwise> bad;
  bad.decay = -1;
  CHECK_THROWS_WITH(round_trip(bad, std::vector<float>(10, 1.0f)), Catch::Contains("decay must be in (0, 1], got -1"));
  // An adaptive f32 round takes what is kept, decayed alike.
  cz::error_feedback<cz::top_k> a;
  a.codec.fraction = 0.1;
  a.decay = 0.5;
  const auto x = random_values(100, 17);
  (void)round_trip(a, x);
  const auto before = a.residual();
  std::vector<float> flushed(100, 1.0f);
  a.flush_into(flushed);
  for (std::size_t i = 0; i < 100; ++i) CHECK(flushed[i] == 1.0f + 0.5f * before[i]);
  CHECK(std::all_of(a.residual().begin(), a.residual().end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("codecs: chunk-wise top-k sends the k largest of every chunk") {
  for (std::size_t n : {1ul, 63ul, 64ul, 1000ul, 40000ul})
    for (std::size_t chunk : {1ul, 7ul, 64ul, 4096ul}) {
      cz::top_k c;
      c.fraction = 0.05;
      c.chunk = chunk;
      auto x = random_values(n, 11 + n + chunk);
      // The first chunk's values run 1000x larger: a global cut would spend everything there.
      for (std::size_t i = 0; i < std::min(n, chunk); ++i) x[i] *= 1000.0f;
      const auto y = round_trip(c, x);
      std::size_t total = 0;
      for (std::size_t from = 0; from < n; from += chunk) {
        const std::size_t size = std::min(chunk, n - from);
        const auto kc = std::clamp<std::size_t>(static_cast<std::size_t>(std::ceil(0.05 * static_cast<double>(size))), 1, size);
        std::vector<float> mags;
        for (std::size_t i = from; i < from + size; ++i) mags.push_back(std::abs(x[i]));
        std::sort(mags.begin(), mags.end(), std::greater<>());
        std::size_t kept = 0;
        for (std::size_t i = from; i < from + size; ++i)
          if (y[i] != 0.0f) {
            ++kept;
            CHECK(y[i] == x[i]);
            CHECK(std::abs(x[i]) >= mags[kc - 1]);
          }
        INFO("n " << n << ", chunk " << chunk << ", chunk at " << from);
        CHECK(kept == kc);
        total += kept;
      }
      CHECK(total == c.k_for(n));
    }
  // A count is per chunk; the settings name the chunk; the spec takes it.
  cz::top_k c;
  c.count = 3;
  c.chunk = 10;
  CHECK(c.k_for(25) == 3 + 3 + 3);
  CHECK(c.k_for(21) == 3 + 3 + 1);
  CHECK(dt::collective::parse_codec("topk:0.02,chunk=4096,int2,ef=0.95").describe() ==
        "ef(topk(fraction=0.020000,chunk=4096,int2,block=64),decay=0.950000)");
  CHECK_THROWS_WITH(dt::collective::parse_codec("topk:0.02,chunk=0"), Catch::Contains("chunk must be a whole number in [1,"));
}

TEST_CASE("codecs: top-k never sends a zero: a chunk with fewer values that are not zero sends only those") {
  // Five values that are not zero among 1000, in chunks of 100 with half of each to send: before,
  // the picks were filled up with zeros, which the 2-bit grid (no code for zero) brought back as
  // +-scale.
  std::vector<float> x(1000, 0.0f);
  for (std::size_t i : {3ul, 150ul, 151ul, 420ul, 999ul}) x[i] = static_cast<float>(i % 7) - 3.5f;
  for (int bits : {32, 2}) {
    INFO(bits << "-bit values");
    cz::top_k c;
    c.fraction = 0.5;
    c.chunk = 100;
    c.value_bits = bits;
    std::vector<std::byte> buf(c.max_encoded_bytes(x.size()));
    const auto size = c.encode(std::span<const float>(x), buf);
    std::uint64_t k = 0;
    std::memcpy(&k, buf.data() + 8, 8);  // the header: n, then k
    CHECK(k == 5);
    std::vector<float> y(x.size(), 0.0f);
    c.decode_add(std::span<const std::byte>(buf.data(), size), y);
    for (std::size_t i = 0; i < x.size(); ++i) {
      INFO("value " << i);
      CHECK((y[i] != 0.0f) == (x[i] != 0.0f));
      CHECK(std::signbit(y[i]) == std::signbit(x[i]));
    }
  }
  // All zero: nothing to send.
  cz::top_k c;
  const auto y = round_trip(c, std::vector<float>(64, 0.0f));
  CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("codecs: Gaia's filter sends what passes threshold x lr_scale x |w|, error feedback keeps the rest until it passes") {
  using filter = cz::significance<cz::top_k>;
  cz::error_feedback<filter> e;
  e.codec.codec.fraction = 1.0;  // every value the filter lets through, in f32
  e.codec.threshold = 0.01;
  const std::vector<float> w{1, 1, 1, 1, 10, 10, 0, -2};
  const std::vector<float> u{0.02f, 0.006f, -0.011f, 0.0f, 0.04f, 0.2f, 1e-6f, -0.03f};
  // Before a policy hands it the reference, the filter cannot judge and says so.
  std::vector<std::byte> buf(e.max_encoded_bytes(u.size()));
  CHECK_THROWS_WITH(e.encode(std::span<const float>(u), buf), Catch::Contains("no reference values were set"));
  const auto round = [&](double lr_scale) {
    cz::set_reference(e, std::span<const float>(w), lr_scale);
    const auto size = e.encode(std::span<const float>(u), buf);
    std::vector<float> sent(u.size(), 0.0f);
    e.decode_add(std::span<const std::byte>(buf.data(), size), sent);
    return sent;
  };
  // Round 1: 0.02 > 1% of 1, 0.011 > 1% of 1, 0.2 > 1% of 10, anything where w is 0, 0.03 > 1%
  // of 2; not 0.006 (of 1), 0 or 0.04 (of 10).
  std::vector<float> sent = round(1.0);
  CHECK(sent == std::vector<float>{0.02f, 0.0f, -0.011f, 0.0f, 0.0f, 0.2f, 1e-6f, -0.03f});
  CHECK(e.codec.passed() == 5);
  // Round 2: what was held back adds up; 0.012 of 1 passes now, 0.08 of 10 not yet.
  sent = round(1.0);
  CHECK(sent[1] == Approx(0.012f));
  CHECK(sent[4] == 0.0f);
  // Round 3 at half the peak learning rate: the threshold halves, and 0.12 of 10 passes (it
  // would have at the peak too); a lone 0.006 of 1 passes at 0.5%.
  sent = round(0.5);
  CHECK(sent[4] == Approx(0.12f));
  CHECK(sent[1] == Approx(0.006f));
  // Nothing is lost: everything sent over the rounds plus what is kept is what came in.
  // (the error feedback's own accounting is tested above; here: it holds with the filter inside)
  CHECK(std::all_of(e.residual().begin(), e.residual().end(), [](float r) { return std::abs(r) < 1e-6f; }));
  // A reference of another size, and a bad learning-rate scale, are refused.
  cz::set_reference(e, std::span<const float>(w).first(4), 1.0);
  CHECK_THROWS_WITH(e.encode(std::span<const float>(u), buf), Catch::Contains("against 4 reference values"));
  CHECK_THROWS_WITH(cz::set_reference(e, std::span<const float>(w), -1.0), Catch::Contains("lr_scale must be finite"));
}

TEST_CASE("codecs: Gaia's filter first lets top-k choose among what passed, as a veto it only takes out of top-k's choice") {
  // Weight 100 makes the largest update insignificant at 10%; top-2 of four.
  const std::vector<float> w{100, 1, 1, 1}, u{0.5f, 0.3f, 0.2f, 0.015f};
  cz::significance<cz::top_k> g;
  g.codec.count = 2;
  g.threshold = 0.1;
  cz::set_reference(g, std::span<const float>(w), 1.0);
  CHECK(round_trip(g, u) == std::vector<float>{0.0f, 0.3f, 0.2f, 0.0f});  // the two largest of what passed
  CHECK(g.passed() == 2);
  g.veto = true;
  CHECK(round_trip(g, u) == std::vector<float>{0.0f, 0.3f, 0.0f, 0.0f});  // top-2 is {0.5, 0.3}; 0.5 is vetoed
  CHECK(g.passed() == 1);
  CHECK(dt::collective::parse_codec("topk:0.03,ef,significance=1,veto").describe().find("significance(1.000000,veto,topk") != std::string::npos);
  CHECK_THROWS_WITH(dt::collective::parse_codec("topk:0.03,ef,veto"), Catch::Contains("veto is significance's"));
}

TEST_CASE("codecs: significance=T puts Gaia's filter inside a sparse codec's error feedback, other uses refused by name") {
  CHECK(dt::collective::parse_codec("topk:0.03,chunk=4096,int2,ef=0.95,significance=0.01").describe() ==
        "ef(significance(0.010000,topk(fraction=0.030000,chunk=4096,int2,block=64)),decay=0.950000)");
  CHECK(dt::collective::parse_codec("dct:0.02,chunk=64,ef,significance=0.5").describe().find("ef(significance(0.500000,dct") == 0);
  CHECK_THROWS_WITH(dt::collective::parse_codec("int8:ef,significance=0.01"), Catch::Contains("needs a sparse codec (topk or dct)"));
  CHECK_THROWS_WITH(dt::collective::parse_codec("topk:0.03,significance=0.01"), Catch::Contains("needs ',ef'"));
  CHECK_THROWS_WITH(dt::collective::parse_codec("topk:0.03,ef,significance=-1"), Catch::Contains("threshold >= 0"));
  CHECK_THROWS_WITH(dt::collective::parse_codec("topk:0.03,ef,significance=x"), Catch::Contains("significance"));
  CHECK_THROWS_WITH(dt::collective::parse_codec("identity:significance=0.1"), Catch::Contains("identity loses nothing"));
  CHECK_THROWS_WITH(dt::collective::parse_codec("powersgd:rank=2,significance=0.1"), Catch::Contains("not powersgd"));
}

TEST_CASE("codecs: state goes through a checkpoint, and a resumed codec encodes as the original would") {
  cz::error_feedback<cz::int8_blockwise> a;
  a.codec.mode = cz::rounding::stochastic;
  a.codec.seed = 3;
  for (int k = 0; k < 3; ++k) (void)round_trip(a, random_values(500, 40 + static_cast<std::uint64_t>(k)));
  dt::io::checkpoint c;
  a.save(c, "comm.test.codec.");
  cz::error_feedback<cz::int8_blockwise> b;
  b.codec.mode = cz::rounding::stochastic;
  b.codec.seed = 3;
  b.load(c, "comm.test.codec.");
  CHECK(b.residual() == a.residual());
  const auto next = random_values(500, 99);
  CHECK(round_trip(a, next) == round_trip(b, next));
}

TEST_CASE("codecs: a state handed to another peer leaves the residual out, and the taker keeps its own") {
  cz::error_feedback<cz::top_k> donor, member, joiner;
  donor.codec.fraction = member.codec.fraction = joiner.codec.fraction = 0.1;
  (void)round_trip(donor, random_values(200, 1));
  (void)round_trip(member, random_values(200, 2));
  dt::io::checkpoint c;
  donor.save(c, "comm.test.codec.");
  REQUIRE(c.tensors.count("comm.test.codec.own.residual") == 1);
  dt::io::leave_out_own_state(c);
  CHECK(c.tensors.count("comm.test.codec.own.residual") == 0);
  const auto own = member.residual();
  member.load(c, "comm.test.codec.");
  joiner.load(c, "comm.test.codec.");
  CHECK(member.residual() == own);     // a member behind keeps what it had not sent
  CHECK(joiner.residual().empty());    // a joiner has nothing unsent: it does not send the donor's again
  // A checkpoint of its own is read whole, also one that names the residual as before "own.".
  dt::io::checkpoint old;
  old.tensors["codec.residual"] = dt::from_vector<dt::cpu>(donor.residual(), dt::shape{200});
  joiner.load(old, "codec.");
  CHECK(joiner.residual() == donor.residual());
  CHECK_THROWS_WITH(joiner.load(dt::io::checkpoint{}, "codec."), Catch::Contains("the checkpoint has no 'codec.own.residual'"));
  CHECK(dt::io::is_own_key("comm.diloco.codec.own.residual"));
  CHECK(dt::io::is_own_key("own.x"));
  CHECK(!dt::io::is_own_key("comm.diloco.owner"));
}

TEST_CASE("codecs: hostile payloads are rejected with the reason, never decoded out of bounds") {
  std::vector<float> into(100, 0.0f);
  auto fails = [&](auto codec, std::vector<std::byte> payload, const char* why) {
    CHECK_THROWS_WITH(codec.decode_add(std::span<const std::byte>(payload), std::span<float>(into)), Catch::Contains(why));
  };
  auto encoded = [&](auto codec) {
    const auto x = random_values(100, 1);
    std::vector<std::byte> b(codec.max_encoded_bytes(100));
    b.resize(codec.encode(x, b));
    return b;
  };
  auto put_f32 = [](std::vector<std::byte>& b, std::size_t at, float v) { std::memcpy(b.data() + at, &v, 4); };
  fails(cz::fp16{}, std::vector<std::byte>(199), "a payload of 199 bytes for 100 values");
  fails(cz::int8_blockwise{}, std::vector<std::byte>(10), "a payload of 10 bytes");
  auto p = encoded(cz::int8_blockwise{});
  put_f32(p, 4, std::numeric_limits<float>::quiet_NaN());
  fails(cz::int8_blockwise{}, p, "block 1 has scale nan");
  p = encoded(cz::int8_blockwise{});
  put_f32(p, 0, -1.0f);
  fails(cz::int8_blockwise{}, p, "block 0 has scale -1");
  p = encoded(cz::int8_blockwise{});
  p[8 + 3] = std::byte{0x80};  // code -128 is never written
  fails(cz::int8_blockwise{}, p, "value 3 has code -128");
  p = encoded(cz::int4_blockwise{});
  p[8 + 2] = std::byte{0x08};  // nibble -8
  fails(cz::int4_blockwise{}, p, "value 4 has code -8");
  p = encoded(cz::sign{});
  put_f32(p, 0, std::numeric_limits<float>::infinity());
  fails(cz::sign{}, p, "block 0 has scale inf");
  p = encoded(cz::sign{});  // 100 signs: the last byte's upper four bits are padding
  p.back() |= std::byte{0x10};
  fails(cz::sign{}, p, "padding bits after value 99 are not 0");
  // top-k: count, format, indices and values.
  cz::top_k t;
  t.fraction = 0.05;
  const auto good = encoded(t);
  auto q = good;
  q[0] = std::byte{99};  // claims 99 values
  fails(t, q, "the payload is for 99 values, the receiver has 100");
  q = good;
  q[8] = std::byte{101};
  fails(t, q, "the payload says 101 values of 100");
  q = good;
  q[16] = std::byte{7};
  fails(t, q, "unknown index format 7");
  q = good;
  q[25] = std::byte{120};  // first gap: index 120
  fails(t, q, "index 120 is outside 100 values");
  q = good;
  put_f32(q, q.size() - 4, std::numeric_limits<float>::infinity());
  fails(t, q, "is inf");
  q = good;
  q.pop_back();
  fails(t, q, "cannot hold");
  fails(t, std::vector<std::byte>(5), "shorter than its header");
  // fp4: -0 is never written, the padding nibble is 0, scales are finite.
  p = encoded(cz::fp4{});
  p[8 + 1] = std::byte{0x08};
  fails(cz::fp4{}, p, "value 2 has code -0");
  p = encoded(cz::fp4{});
  put_f32(p, 0, std::numeric_limits<float>::infinity());
  fails(cz::fp4{}, p, "block 0 has scale inf");
  std::vector<float> odd(99, 0.0f);
  cz::fp4 f;
  std::vector<std::byte> fo(f.max_encoded_bytes(99));
  fo.resize(f.encode(random_values(99, 2), fo));
  fo.back() |= std::byte{0x30};
  CHECK_THROWS_WITH(f.decode_add(fo, odd), Catch::Contains("the padding nibble after value 98"));
  // top-k with int2 values: a negative scale, bits after the last code, a short value section.
  t.value_bits = 2;
  t.fraction = 0.03;  // 3 values: 6 bits of codes in one byte
  const auto small = encoded(t);
  q = small;
  put_f32(q, q.size() - 5, -2.0f);
  fails(t, q, "value block 0 has scale -2");
  q = small;
  q.back() |= std::byte{0x80};
  fails(t, q, "the padding bits after value 2 are not 0");
  q = small;
  q.pop_back();
  fails(t, q, "cannot hold");
}

TEMPLATE_TEST_CASE("codecs: all-reduce through each codec leaves every peer the same bits near the exact mean", "[collective]",
                   TRANSPORTS) {
  // Dense codecs go around the ring, or with the communicator's halving_doubling (4 and 8 peers)
  // by recursive halving and doubling.
  struct run_case {
    int n;
    bool halving;
  };
  for (const run_case k : {run_case{1, false}, {2, false}, {3, false}, {4, false}, {4, true}, {8, false}, {8, true}}) {
    const int n = k.n;
    const bool halving = k.halving;
    INFO(n << " peers" << (halving ? ", halving and doubling" : ""));
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      dt::collective::communicator c(ep, {.halving_doubling = halving});
      const std::size_t m = 5003;
      const auto input = [&](int rank) { return random_values(m, 1000 + static_cast<std::uint64_t>(rank)); };
      const auto own = input(c.rank());
      const std::string at = " with " + std::to_string(n) + " peers" + (halving ? " (halving, doubling)" : "") + ", at peer " +
                             std::to_string(c.rank());
      // Through `codec` from this peer's `values`: the result, and the bytes this peer sent.
      const auto reduce = [&](auto codec, std::vector<float> values) {
        const auto sent0 = c.traffic().bytes_sent;
        dt::collective::encoded_all_reduce(codec, c, std::span<float>(values), true);
        const auto sent = c.traffic().bytes_sent - sent0;
        checks.expect(same_everywhere(c, values), cz::describe(codec) + at + ": the peers' results differ");
        return std::pair{values, sent};
      };
      // Each value within `tolerance` of `expected`, and the whole within `relative` of it
      // normwise (a result of zeros, or one that lost a peer's part, is far in norm).
      const auto near = [&](const auto& codec, const std::vector<float>& got, const std::vector<float>& expected,
                            double tolerance, double relative) {
        double worst = 0, diff = 0, norm = 0;
        for (std::size_t i = 0; i < m; ++i) {
          const double d = static_cast<double>(got[i]) - expected[i];
          worst = std::max(worst, std::abs(d));
          diff += d * d;
          norm += static_cast<double>(expected[i]) * expected[i];
        }
        checks.expect(worst <= tolerance, cz::describe(codec) + at + ": worst error " + std::to_string(worst));
        checks.expect(norm > 0 && std::sqrt(diff / norm) <= relative,
                      cz::describe(codec) + at + ": normwise error " + std::to_string(std::sqrt(diff / norm)));
      };
      std::vector<float> exact = own;
      c.all_reduce(std::span<float>(exact), dt::collective::reduce_op::average);

      // Dense codecs on N(0, 1) values (means ~N(0, 1/n)): int8 steps of max/127 per hop, n - 1
      // hops plus the final encoding; int4 and fp4 eight times coarser.
      near(cz::fp16{}, reduce(cz::fp16{}, own).first, exact, 0.01, 0.005);
      const auto [int8_result, int8_bytes] = reduce(cz::int8_blockwise{}, own);
      near(cz::int8_blockwise{}, int8_result, exact, 0.05 * n, 0.05);
      near(cz::int4_blockwise{}, reduce(cz::int4_blockwise{}, own).first, exact, 0.5 * n, 0.4);
      near(cz::fp4{}, reduce(cz::fp4{}, own).first, exact, 0.5 * n, 0.4);
      if (n > 1) {
        // The ring sends 2 (n - 1) / n of the encoded buffer: 4 + 64 bytes per 64 values (and
        // so do halving and doubling).
        const double expected = 2.0 * (n - 1) / n * (m * (4.0 + 64.0) / 64.0);
        checks.expect(std::abs(static_cast<double>(int8_bytes) - expected) <= 0.05 * expected,
                      "int8" + at + ": sent " + std::to_string(int8_bytes) + " bytes, expected about " +
                          std::to_string(expected));
      }
      // Dense codecs on values their grid holds exactly, every partial sum too, so the mean is
      // known: bf16 and fp16 on small integers (sums up to 64 are exact in 8 bits); sign on one
      // sign pattern with a constant magnitude a peer (rank + 1) per block. A hop that lost
      // the values it was to add to misses the exact mean by a whole integer.
      std::vector<std::vector<float>> inputs;
      for (int r = 0; r <= n; ++r) inputs.push_back(input(r));  // input(n): nobody's, the sign pattern
      std::vector<float> integers(m), signs(m), integer_mean(m, 0.0f), sign_mean(m);
      for (std::size_t i = 0; i < m; ++i) {
        for (int r = 0; r < n; ++r) integer_mean[i] += std::round(std::clamp(2.0f * inputs[static_cast<std::size_t>(r)][i], -8.0f, 8.0f));
        integers[i] = std::round(std::clamp(2.0f * own[i], -8.0f, 8.0f));
        const float s = inputs.back()[i] >= 0 ? 1.0f : -1.0f;  // one pattern for all
        signs[i] = static_cast<float>(c.rank() + 1) * s;
        sign_mean[i] = static_cast<float>(n + 1) / 2.0f * s;  // the mean of 1..n
        integer_mean[i] /= static_cast<float>(n);
      }
      near(cz::bf16{}, reduce(cz::bf16{}, integers).first, integer_mean, 8.0 / 256, 1.0 / 256);
      near(cz::fp16{}, reduce(cz::fp16{}, integers).first, integer_mean, 8.0 / 2048, 1.0 / 2048);
      near(cz::sign{}, reduce(cz::sign{}, signs).first, sign_mean, 1e-6, 1e-6);

      // Gathered codecs: every peer decodes every payload, so the result is the mean of the
      // peers' own payloads decoded (each peer's inputs are known here), up to summation order.
      // Each is decoded into zeros and summed here, so a decode that overwrites what it should
      // add to cannot make its own expectation.
      const auto gathered = [&](auto codec) {
        std::vector<float> expected(m, 0.0f);
        for (int r = 0; r < n; ++r) {
          auto encoder = codec;
          std::vector<std::byte> payload(encoder.max_encoded_bytes(m));
          payload.resize(encoder.encode(inputs[static_cast<std::size_t>(r)], payload));
          std::vector<float> decoded(m, 0.0f);
          encoder.decode_add(payload, decoded);
          for (std::size_t i = 0; i < m; ++i) expected[i] += decoded[i];
        }
        for (auto& e : expected) e /= static_cast<float>(n);
        const auto [result, bytes] = reduce(codec, own);
        near(codec, result, expected, 1e-5, 1e-5);
        return bytes;
      };
      cz::top_k all;
      all.fraction = 1.0;
      near(all, reduce(all, own).first, exact, 1e-5, 1e-5);  // every value sent: the exact mean
      all.value_bits = 4;
      const auto gathered_bytes = gathered(all);
      if (n > 1) {
        // Each peer forwards n - 1 payloads at their own size (all the same here) and the sizes.
        std::vector<std::byte> own_payload(all.max_encoded_bytes(m));
        own_payload.resize(cz::top_k(all).encode(own, own_payload));
        checks.expect(gathered_bytes == static_cast<std::uint64_t>(n - 1) * (8 + own_payload.size()),
                      "top-k" + at + ": sent " + std::to_string(gathered_bytes) + " bytes");
      }
      cz::top_k some;
      some.fraction = 0.1;
      (void)gathered(some);
      (void)gathered(cz::dct_top_k{});
    });
    // Per peer: fp16, int8, int4, fp4 (2 + 1 each, int8's bytes when n > 1), bf16, fp16 and
    // sign on exact values, four gathered codecs (3 each), top-k's bytes when n > 1.
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)) * 30);
  }
}

#ifndef DECENTRAIN_MPI_SUITE
TEST_CASE("codecs: peers with different codec settings are refused at the first round, naming both") {
  dt::transport::in_process net(2);
  std::vector<std::string> errors(2);
  try {
    net.run([&](dt::transport::in_process::endpoint& ep) {
      dt::collective::communicator c(ep);
      cz::int8_blockwise codec;
      codec.block = ep.rank() == 0 ? 64 : 32;
      try {
        dt::collective::agree_codec(codec, c);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(ep.rank())] = e.what();
        throw;
      }
    });
  } catch (const std::exception&) {
  }
  for (const auto& e : errors) {
    CHECK_THAT(e, Catch::Contains("peer 0 int8(block=64)") && Catch::Contains("peer 1 int8(block=32)"));
  }
  // The same settings pass.
  dt::transport::in_process(3).run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator c(ep);
    dt::collective::agree_codec(cz::error_feedback<cz::top_k>{}, c);
  });
}

TEST_CASE("codecs: peers whose communicators set halving_doubling differently are told so by a codec's all-reduce") {
  // One of 4 peers would go by halving and doubling, the others around the ring: paired into
  // each other's messages they would fail on a size, or add the wrong parts. Every peer is told
  // which option differs; set alike, the same call goes through.
  for (const int odd : {-1, 1}) {
    INFO("the peer set otherwise: " << odd);
    std::vector<std::string> errors(4);
    std::vector<int> finished(4, 0);
    try {
      dt::transport::in_process(4).run([&](dt::transport::in_process::endpoint& ep) {
        const auto r = static_cast<std::size_t>(ep.rank());
        dt::collective::communicator c(ep, {.halving_doubling = ep.rank() != odd});
        std::vector<float> v(40'000, 1.0f);
        try {
          cz::int8_blockwise codec;
          dt::collective::encoded_all_reduce(codec, c, std::span<float>(v), true);
          finished[r] = 1;
        } catch (const std::exception& e) {
          errors[r] = e.what();
          throw;
        }
      });
    } catch (const std::exception&) {
    }
    for (std::size_t r = 0; r < 4; ++r) {
      INFO("peer " << r);
      if (odd < 0) {
        CHECK((finished[r] == 1 && errors[r].empty()));
      } else {
        CHECK(finished[r] == 0);
        CHECK_THAT(errors[r], Catch::Contains("set halving_doubling differently"));
      }
    }
  }
}
#endif

#ifndef DECENTRAIN_MPI_SUITE
TEST_CASE("codecs: adaptive sends f32 where the codec's work costs more than its bytes save, the codec where not") {
  auto rounds = [](dt::transport::in_process net, auto codec, int count) {
    std::vector<decltype(codec)> after(static_cast<std::size_t>(net.world()));
    std::vector<std::vector<float>> results(after.size());
    net.run([&](dt::transport::in_process::endpoint& ep) {
      dt::collective::communicator c(ep);
      auto mine = codec;
      std::vector<float> v;
      for (int k = 0; k < count; ++k) {
        v = random_values(1 << 20, 50 + static_cast<std::uint64_t>(ep.rank()));
        dt::collective::encoded_all_reduce(mine, c, std::span<float>(v), true);
      }
      after[static_cast<std::size_t>(ep.rank())] = mine;
      results[static_cast<std::size_t>(ep.rank())] = v;
    });
    CHECK(results[0] == results[1]);
    for (const auto& a : after) CHECK(a.codec_faster() == after[0].codec_faster());  // every peer chose the same
    return std::make_pair(after[0], results[0]);
  };
  cz::adaptive<cz::int8_blockwise> a8;
  // Ideal links: bytes cost nothing, the codec's encoding does.
  auto [ideal, exact] = rounds(dt::transport::in_process(2), a8, 3);
  CHECK(ideal.codec_seconds() > 0);
  CHECK(ideal.plain_seconds() == 0);
  CHECK_FALSE(ideal.codec_faster());
  // The third round went as f32: the exact mean.
  auto x0 = random_values(1 << 20, 50), x1 = random_values(1 << 20, 51);
  for (std::size_t i = 0; i < x0.size(); ++i) CHECK(exact[i] == (x0[i] + x1[i]) * 0.5f);
  // A wide-area link (the wan preset's 100 ms and 100 Mbit/s, without its losses, whose 0.3 s
  // retransmissions would land on one probe or the other): 4 MB as f32 take far longer than 1 MB
  // as int8 plus its encoding.
  const dt::transport::link_matrix wide(2, dt::transport::simulated_link{0.1, 12.5e6, 0.0, 0.0, 0.3});
  auto [wan, unused] = rounds(dt::transport::in_process(wide), a8, 2);
  CHECK(wan.codec_faster());
  CHECK(wan.codec_seconds() * 1.3 < wan.plain_seconds());  // 0.29 s against 0.44 s, two latencies in each
  // An error-feedback residual goes out with the f32 rounds.
  cz::adaptive<cz::error_feedback<cz::top_k>> ef;
  auto [flushed, unused2] = rounds(dt::transport::in_process(2), ef, 2);
  const auto& kept = flushed.codec.residual();
  CHECK(std::all_of(kept.begin(), kept.end(), [](float r) { return r == 0.0f; }));
  CHECK(dt::collective::parse_codec("int8:adaptive").describe() == "adaptive(int8(block=64),probe_every=100)");
}
#endif

TEST_CASE("codecs: DCT top-k sends the largest coefficients, all of them give the values back") {
  for (const std::size_t n : sizes) {
    cz::dct_top_k all;
    all.chunk = 16;
    all.select.fraction = 1.0;
    for (const auto& x : inputs(n)) {
      if (std::abs(x[0]) > 1e20f) continue;  // huge values: the transform's sums overflow f32
      const auto y = round_trip(all, x);
      double scale = 1e-30;
      for (float v : x) scale = std::max(scale, static_cast<double>(std::abs(v)));
      for (std::size_t i = 0; i < n; ++i) REQUIRE(std::abs(y[i] - x[i]) <= 1e-5 * scale);
    }
  }
  // A smooth signal puts its energy in a few coefficients: 1/16 of them carry it far better than
  // 1/16 of the raw values.
  std::vector<float> smooth(4096);
  for (std::size_t i = 0; i < smooth.size(); ++i) smooth[i] = static_cast<float>(std::sin(0.01 * static_cast<double>(i)));
  cz::dct_top_k dct;
  dct.select.fraction = 1.0 / 16;
  cz::top_k raw;
  raw.fraction = 1.0 / 16;
  auto error = [&](const std::vector<float>& y) {
    double e = 0;
    for (std::size_t i = 0; i < y.size(); ++i) e += std::pow(static_cast<double>(y[i]) - smooth[i], 2);
    return std::sqrt(e);
  };
  const double with_dct = error(round_trip(dct, smooth)), without = error(round_trip(raw, smooth));
  CHECK(with_dct < 0.1 * without);
  CHECK(dt::collective::parse_codec("dct:0.05,chunk=32,int2,ef").describe() == "ef(dct(chunk=32,topk(fraction=0.050000,int2,block=64)))");
  CHECK_THROWS_WITH(dt::collective::parse_codec("dct:chunk=1"), Catch::Contains("chunk must be a whole number in [2, 4096]"));
  // Coefficients whose transform overflows are refused, and nothing is added.
  {
    cz::dct_top_k d;
    d.select.fraction = 0.5;
    const auto x = random_values(256, 3);
    std::vector<std::byte> b(d.max_encoded_bytes(256));
    b.resize(d.encode(x, b));
    const float big = 3e38f;
    for (std::size_t j = 0; j < d.select.k_for(256); ++j) std::memcpy(b.data() + b.size() - 4 * (j + 1), &big, 4);
    std::vector<float> into(256, 0.0f);
    CHECK_THROWS_WITH(d.decode_add(std::span<const std::byte>(b), std::span<float>(into)), Catch::Contains("the decoded value"));
    CHECK(std::all_of(into.begin(), into.end(), [](float v) { return v == 0.0f; }));
  }
  // Error feedback in values: sent + kept == input.
  cz::error_feedback<cz::dct_top_k> ef;
  ef.codec.select.fraction = 0.05;
  const auto x = random_values(1001, 5);
  const auto y = round_trip(ef, x);
  for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(y[i] + ef.residual()[i] == Approx(x[i]).margin(1e-5));
}

namespace {
// M = u v^T + w z^T (rank 2), rows x cols, row-major.
std::vector<float> rank_two(std::size_t rows, std::size_t cols, std::uint64_t seed) {
  const auto u = random_values(rows, seed), v = random_values(cols, seed + 1), w = random_values(rows, seed + 2),
             z = random_values(cols, seed + 3);
  std::vector<float> m(rows * cols);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < cols; ++c) m[i * cols + c] = u[i] * v[c] + w[i] * z[c];
  return m;
}
// A payload of a 40 x 30 matrix, a bias of 30 and a 3 x 2 matrix (too small to gain).
const cz::layout small_layout = {{0, 40, 30}, {1200, 1, 30}, {1230, 3, 2}};
}  // namespace

TEST_CASE("codecs: PowerSGD sends rank-r factors of each matrix, the small pieces as they are") {
  cz::powersgd<> p;
  p.rank = 2;
  CHECK_THROWS_WITH(round_trip(p, random_values(1236, 1)), Catch::Contains("no layout"));
  p.set_layout(small_layout);
  CHECK_THROWS_WITH(round_trip(p, random_values(1237, 1)), Catch::Contains("the layout covers 1236 values, the payload has 1237"));
  CHECK(p.rank_of(small_layout[0]) == 2);
  CHECK(p.rank_of(small_layout[1]) == 0);
  CHECK(p.rank_of(small_layout[2]) == 0);
  CHECK(p.max_encoded_bytes(1236) == 8 + 4 * ((40 + 30) * 2 + 30 + 6));
  // A rank-2 matrix comes back from one power step, the rest exactly.
  auto x = rank_two(40, 30, 7);
  const auto tail = random_values(36, 9);
  x.insert(x.end(), tail.begin(), tail.end());
  const auto y = round_trip(p, x);
  for (std::size_t i = 0; i < 1200; ++i) REQUIRE(y[i] == Approx(x[i]).margin(1e-4));
  for (std::size_t i = 1200; i < 1236; ++i) REQUIRE(y[i] == x[i]);
  // A rank changed between rounds starts its factors again (no read past the old ones).
  p.rank = 3;
  CHECK(round_trip(p, x).size() == x.size());
  p.rank = 2;
  // Hostile payloads: wrong size, a non-finite factor, factors whose product overflows.
  std::vector<std::byte> b(p.max_encoded_bytes(1236));
  b.resize(p.encode(x, b));
  std::vector<float> into(1236);
  auto rejects = [&](std::vector<std::byte> payload, const char* why) {
    CHECK_THROWS_WITH(p.decode_add(std::span<const std::byte>(payload), std::span<float>(into)), Catch::Contains(why));
  };
  rejects(std::vector<std::byte>(b.begin(), b.end() - 4), "a payload of 708 bytes, expected 712");
  auto bad = b;
  const float nan = std::numeric_limits<float>::quiet_NaN(), big = 1e30f;
  std::memcpy(bad.data() + 8, &nan, 4);
  rejects(bad, "value 0 is nan");
  bad = b;
  for (std::size_t j = 0; j < 140; ++j) std::memcpy(bad.data() + 8 + 4 * j, &big, 4);
  rejects(bad, "factors too large");
  CHECK(std::all_of(into.begin(), into.end(), [](float v) { return v == 0.0f; }));
  CHECK(dt::collective::parse_codec("powersgd:rank=2,factors=int8").describe() ==
        "powersgd(rank=2,ef,seed=" + std::to_string(cz::powersgd<>{}.seed) + ",factors=int8(block=64))");
  CHECK_THROWS_WITH(dt::collective::parse_codec("powersgd:ef"), Catch::Contains("keeps its own error feedback"));
  CHECK_THROWS_WITH(dt::collective::parse_codec("powersgd:factors=topk"), Catch::Contains("factors must be one of"));
  CHECK_THROWS_WITH(dt::collective::parse_codec("powersgd:rank=0"), Catch::Contains("rank must be a whole number in [1, 4096]"));
}

TEMPLATE_TEST_CASE("codecs: PowerSGD all-reduce gives every peer the same low-rank mean, and keeps what it missed", "[collective]",
                   TRANSPORTS) {
  for (int n = 1; n <= 8; n += (n < 4 ? 1 : 4)) {
    INFO(n << " peers");
    harness::peer_checks checks;
    TestType::run(n, [&](auto& ep) {
      dt::collective::communicator c(ep);
      // Every peer's matrix is the same rank-2 one plus its own rank-2 part scaled by 1e-3: the
      // mean is close to rank 2, which rank 2 finds.
      auto mine = rank_two(40, 30, 11);
      const auto own = rank_two(40, 30, 100 + static_cast<std::uint64_t>(c.rank()));
      for (std::size_t i = 0; i < mine.size(); ++i) mine[i] += 1e-3f * own[i];
      const auto tail = random_values(36, 200 + static_cast<std::uint64_t>(c.rank()));
      mine.insert(mine.end(), tail.begin(), tail.end());
      std::vector<float> exact = mine;
      c.all_reduce(std::span<float>(exact), dt::collective::reduce_op::average);

      cz::powersgd<> p;
      p.rank = 2;
      p.set_layout(small_layout);
      auto v = mine;
      const auto sent0 = c.traffic().bytes_sent;
      dt::collective::encoded_all_reduce(p, c, std::span<float>(v), true);
      const auto sent = c.traffic().bytes_sent - sent0;
      const std::string at = " at peer " + std::to_string(c.rank());
      checks.expect(same_everywhere(c, v), "powersgd: the peers' results differ" + at);
      double worst = 0, plain_worst = 0;
      for (std::size_t i = 0; i < 1200; ++i) worst = std::max(worst, std::abs(static_cast<double>(v[i]) - exact[i]));
      for (std::size_t i = 1200; i < 1236; ++i) plain_worst = std::max(plain_worst, std::abs(static_cast<double>(v[i]) - exact[i]));
      checks.expect(worst <= 0.02, "powersgd: worst error " + std::to_string(worst) + at);
      checks.expect(plain_worst <= 1e-5, "powersgd: a plain value differs from the mean by " + std::to_string(plain_worst) + at);
      if (n == 1) {
        checks.expect(sent == 0, "powersgd: one peer sent " + std::to_string(sent) + " bytes");
        checks.expect(v == mine, "powersgd: one peer's values changed");
        return;
      }
      // Far fewer bytes than the f32 mean: (40 + 30) x 2 + 36 values instead of 1236, twice.
      std::vector<float> plain = mine;
      const auto plain0 = c.traffic().bytes_sent;
      c.all_reduce(std::span<float>(plain), dt::collective::reduce_op::average);
      const auto plain_sent = c.traffic().bytes_sent - plain0;
      checks.expect(sent * 5 < plain_sent,
                    "powersgd: sent " + std::to_string(sent) + " bytes, the f32 mean " + std::to_string(plain_sent) + at);
      // What the peers kept adds up to what the group's approximation missed.
      std::vector<float> kept = p.residual();
      c.all_reduce(std::span<float>(kept), dt::collective::reduce_op::sum);
      std::size_t off = 0;
      for (std::size_t i = 0; i < 1200; ++i)
        off += std::abs(kept[i] + static_cast<float>(n) * v[i] - static_cast<float>(n) * exact[i]) > 1e-4f * static_cast<float>(n);
      checks.expect(off == 0, "powersgd: kept + sent != input at " + std::to_string(off) + " values" + at);
    });
    checks.report(static_cast<std::size_t>(TestType::local_peers(n)) * 5);
  }
}

#ifndef DECENTRAIN_MPI_SUITE
TEST_CASE("codecs: PowerSGD's factors and residual go through a checkpoint, the resumed rounds are bit-identical") {
  // Rounds first .. first + count - 1, each peer's input a function of the round.
  auto rounds = [](int first, int count, const dt::io::checkpoint* from, dt::io::checkpoint* to) {
    std::vector<std::vector<float>> last(2);
    dt::transport::in_process(2).run([&](dt::transport::in_process::endpoint& ep) {
      dt::collective::communicator c(ep);
      cz::powersgd<cz::error_feedback<cz::int8_blockwise>> p;
      p.rank = 3;
      if (from) p.load(from[ep.rank()], "codec.");  // the trainer's order: restore, then the policy's start
      p.set_layout(small_layout);
      for (int k = first; k < first + count; ++k) {
        auto v = random_values(1236, 300 + static_cast<std::uint64_t>(k + 10 * ep.rank()));
        dt::collective::encoded_all_reduce(p, c, std::span<float>(v), true);
        last[static_cast<std::size_t>(ep.rank())] = v;
      }
      if (to) p.save(to[ep.rank()], "codec.");
    });
    CHECK(last[0] == last[1]);
    return last[0];
  };
  dt::io::checkpoint saved[2];
  (void)rounds(0, 2, nullptr, saved);
  CHECK(saved[0].tensors.at("codec.own.residual").numel() == 1236);
  CHECK(saved[0].tensors.at("codec.q").numel() == 30 * 3);
  CHECK(saved[1].tensors.count("codec.p.own.residual") == 1);  // the factors' own error feedback
  const auto whole = rounds(0, 4, nullptr, nullptr);
  CHECK(rounds(2, 2, saved, nullptr) == whole);
  CHECK(rounds(2, 2, nullptr, nullptr) != whole);  // the state mattered
}
#endif
