// How long a peer may stay silent before it is suspected, from what its heartbeats measured.
//
// A fixed timeout is either too short for a slow link or far too long for a frozen peer
// (without heartbeats a SIGSTOPped peer holds the others up for all of tcp's recv_timeout).
// Every heartbeat that arrives updates two smoothed estimates, as TCP's retransmission timer
// does (RFC 6298: gains 1/8 for the mean, 1/4 for the deviation):
// the gap between consecutive heartbeats (the sender's interval plus its scheduling delays and
// the link's jitter) and the round trip (echoed timestamps, so no clocks need to agree). The
// deadline allows `misses` gaps of mean plus four deviations, plus one round trip with four
// deviations, and never less than a floor: on loopback the floor decides, on a loaded machine or
// a jittery link the measurements do.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>

namespace decentrain::transport {

class liveness {
 public:
  using clock = std::chrono::steady_clock;
  static constexpr int misses = 4;

  // A heartbeat arrived at `now`; `round_trip_s` is its measured round trip (negative: none,
  // when the sender had nothing of ours to echo yet).
  void heartbeat(clock::time_point now, double round_trip_s) {
    if (last_beat_) {
      const double gap = std::chrono::duration<double>(now - *last_beat_).count();
      smooth(gap, gap_, gap_dev_, gaps_ > 0);
      ++gaps_;
    }
    last_beat_ = now;
    if (round_trip_s >= 0) {
      smooth(round_trip_s, rtt_, rtt_dev_, rtts_ > 0);
      ++rtts_;
    }
  }

  // How long this peer may be silent; `floor` until enough was measured and never less.
  std::chrono::milliseconds deadline(std::chrono::milliseconds floor) const {
    if (gaps_ < 2) return floor;
    const double s = misses * (gap_ + 4 * gap_dev_) + rtt_ + 4 * rtt_dev_;
    return std::max(floor, std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(s * 1000))));
  }

  double round_trip_seconds() const { return rtts_ > 0 ? rtt_ : -1; }
  double gap_seconds() const { return gaps_ > 0 ? gap_ : -1; }
  std::uint64_t heartbeats() const { return gaps_ + (last_beat_ ? 1 : 0); }

 private:
  static void smooth(double sample, double& mean, double& dev, bool have) {
    if (!have) {
      mean = sample;
      dev = sample / 2;
      return;
    }
    dev = 0.75 * dev + 0.25 * std::abs(sample - mean);
    mean = 0.875 * mean + 0.125 * sample;
  }

  std::optional<clock::time_point> last_beat_;
  double gap_ = 0, gap_dev_ = 0, rtt_ = 0, rtt_dev_ = 0;
  std::uint64_t gaps_ = 0, rtts_ = 0;
};

}  // namespace decentrain::transport
