// The codecs' GPU kernels against the CPU codecs: the same payload bytes from blockwise encode
// (nearest and stochastic rounding, int8 and int4, odd sizes, denormal and mixed magnitudes), the
// same bits from decode_add, the same top-k indices and values; bad inputs and payloads refused.
#include <catch2/catch.hpp>

// The codecs and their kernels alone: the whole library through nvcc costs ~45 s a file.
#include <decentrain/compress/blockwise.hpp>
#include <decentrain/compress/top_k.hpp>
#include <decentrain/core/core.hpp>
#include <decentrain/kernels/quantize.hpp>

#include <cstring>
#include <limits>
#include <vector>

namespace dt = decentrain;
namespace cz = dt::compress;
using gpu = dt::cuda;

namespace {

std::vector<float> values(std::size_t n, std::uint64_t seed, double scale) {
  dt::rng g(seed, "cuda-codec-test");
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(scale * g.normal());
  for (std::size_t i = 3; i < n; i += 7) v[i] *= 1e4f;  // magnitudes far apart in a block
  return v;
}

template <class T>
struct device_buffer {
  explicit device_buffer(std::size_t n) : n(n), p(static_cast<T*>(dt::memory<gpu>::allocate(sizeof(T) * (n ? n : 1)))) {}
  ~device_buffer() { dt::memory<gpu>::deallocate(p, sizeof(T) * (n ? n : 1)); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  void put(const std::vector<T>& v) { dt::memory<gpu>::copy_from_host(p, v.data(), sizeof(T) * v.size()); }
  std::vector<T> get() const {
    std::vector<T> v(n);
    dt::memory<gpu>::copy_to_host(v.data(), p, sizeof(T) * n);
    return v;
  }
  std::size_t n;
  T* p;
};

template <int Bits>
void check_blockwise(std::size_t n, double scale, bool stochastic) {
  cz::blockwise<Bits> codec;
  codec.block = 64;
  codec.seed = 5;
  codec.mode = stochastic ? cz::rounding::stochastic : cz::rounding::nearest;
  const auto x = values(n, n + (stochastic ? 1 : 0), scale);
  std::vector<std::byte> cpu_payload(codec.max_encoded_bytes(n));
  cpu_payload.resize(codec.encode(std::span<const float>(x), cpu_payload));  // call 0

  device_buffer<float> dx(n);
  dx.put(x);
  device_buffer<std::byte> dp(cpu_payload.size());
  dt::kernels::blockwise_encode<Bits>(gpu{}, dx.p, static_cast<std::int64_t>(n), {64, stochastic, 5, 0}, dp.p);
  const auto gpu_payload = dp.get();
  INFO(Bits << " bits, n = " << n << ", scale " << scale << (stochastic ? ", stochastic" : ", nearest"));
  REQUIRE(gpu_payload.size() == cpu_payload.size());
  CHECK(std::memcmp(gpu_payload.data(), cpu_payload.data(), cpu_payload.size()) == 0);

  // Decoding the same bytes on both adds the same bits.
  auto into = values(n, 77, 1.0);
  auto cpu_into = into;
  codec.decode_add(std::span<const std::byte>(cpu_payload), std::span<float>(cpu_into));
  device_buffer<float> dy(n);
  dy.put(into);
  dt::kernels::blockwise_decode_add<Bits>(gpu{}, dp.p, cpu_payload.size(), static_cast<std::int64_t>(n), 64, dy.p);
  CHECK(dy.get() == cpu_into);
}

}  // namespace

TEST_CASE("cuda codecs: blockwise int8 and int4 write the CPU codec's payload byte for byte and decode to its bits") {
  for (const std::size_t n : {1, 63, 64, 65, 1001, 40000, 1 << 20})
    for (const double scale : {1.0, 1e-40, 1e30})
      for (const bool stochastic : {false, true}) {
        check_blockwise<8>(n, scale, stochastic);
        check_blockwise<4>(n, scale, stochastic);
      }
}

TEST_CASE("cuda codecs: non-finite values and payloads the encoder could not write are refused, nothing added") {
  auto x = values(1000, 1, 1.0);
  x[517] = std::numeric_limits<float>::quiet_NaN();
  device_buffer<float> dx(x.size());
  dx.put(x);
  device_buffer<std::byte> dp(cz::int8_blockwise{}.max_encoded_bytes(x.size()));
  CHECK_THROWS_WITH(dt::kernels::blockwise_encode<8>(gpu{}, dx.p, 1000, {}, dp.p), Catch::Contains("not finite"));

  x[517] = 0.5f;
  cz::int8_blockwise codec;
  std::vector<std::byte> payload(codec.max_encoded_bytes(1000));
  payload.resize(codec.encode(std::span<const float>(x), payload));
  device_buffer<float> dy(1000);
  dy.put(std::vector<float>(1000, 0.0f));
  auto refused = [&](std::vector<std::byte> bad, const char* why) {
    device_buffer<std::byte> db(bad.size());
    db.put(bad);
    CHECK_THROWS_WITH(dt::kernels::blockwise_decode_add<8>(gpu{}, db.p, bad.size(), 1000, 64, dy.p), Catch::Contains(why));
  };
  auto bad = payload;
  bad[4 * 16 + 300] = std::byte{0x80};
  refused(bad, "a code below -127");
  bad = payload;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.data() + 8, &nan, 4);
  refused(bad, "scale is not finite");
  refused(std::vector<std::byte>(payload.begin(), payload.end() - 1), "a payload of");
  const auto y = dy.get();
  CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("cuda codecs: top-k of magnitudes picks the CPU codec's indices and values, ties to the lower index") {
  for (const std::size_t n : {1, 100, 40000, 1 << 20}) {
    auto x = values(n, n, 1.0);
    for (std::size_t i = 10; i < n; i += 97) x[i] = x[i % 13];  // ties
    cz::top_k codec;
    codec.fraction = 0.01;
    const std::size_t k = codec.k_for(n);
    std::vector<std::byte> payload(codec.max_encoded_bytes(n));
    payload.resize(codec.encode(std::span<const float>(x), payload));
    std::vector<float> sent(n, 0.0f);
    codec.decode_add(std::span<const std::byte>(payload), std::span<float>(sent));

    device_buffer<float> dx(n), dv(k);
    device_buffer<std::int32_t> di(k);
    dx.put(x);
    dt::kernels::top_k_magnitude(gpu{}, dx.p, static_cast<std::int64_t>(n), static_cast<std::int64_t>(k), di.p, dv.p);
    const auto at = di.get();
    const auto v = dv.get();
    INFO("n = " << n << ", k = " << k);
    CHECK(std::is_sorted(at.begin(), at.end()));
    std::vector<float> picked(n, 0.0f);
    for (std::size_t j = 0; j < k; ++j) picked[static_cast<std::size_t>(at[j])] = v[j];
    CHECK(picked == sent);
  }
}
