// The per-step metrics' derived figures: utilisation and send rates.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

namespace dt = decentrain;

TEST_CASE("send_rate: the peak is taken over at least a second of clock, not over one burst") {
  dt::train::send_rate rate;
  CHECK(rate.peak() == 0);
  // 1 MB every half second: 2 MB/s once a second has passed.
  for (int i = 0; i <= 10; ++i) rate.add(0.5 * i, static_cast<std::uint64_t>(i) * 1'000'000);
  CHECK(rate.peak() == Approx(2e6));
  // Idle, then 10 MB within 0.1 s: the shortest run of steps that ends there and spans a second
  // is 5.0 .. 6.1 s, so 10 MB over 1.1 s, not over 0.1 s.
  rate.add(5.5, 10'000'000);
  rate.add(6.0, 10'000'000);
  rate.add(6.1, 20'000'000);
  CHECK(rate.peak() == Approx(10e6 / 1.1));
  dt::train::step_metrics m;
  m.bytes_sent = 30'000'000;
  m.clock_s = 10;
  m.compute_s = 9;
  CHECK(m.mean_send_rate() == Approx(3e6));
  CHECK(m.utilisation() == Approx(0.9));
}
