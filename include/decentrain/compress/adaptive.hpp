// adaptive<Codec>: all-reduces through Codec where that is faster than plain f32, and as plain
// f32 where it is not. On a fast link encoding can cost more than the bytes it saves (prime-diloco
// found its uint8 all-reduce slower than f32 on a fast link; bench/codec_allreduce measures where
// each codec wins here). Every `probe_every` rounds it times one round through the codec and the
// next as f32, on the endpoint's clock (wall time on real transports, link time plus charged
// compute on simulated ones); each probe's time is the slowest peer's (an 8-byte all-reduce), so
// every peer makes the same choice, and the faster path carries the rounds until the next probe.
// A probe is one round: a lost packet's retransmission during one of them can tip the choice
// until the next pair.
// An error-feedback codec's residual is sent along when a round goes as f32, so nothing it kept
// is lost or held back for long.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "decentrain/compress/codec.hpp"
#include "decentrain/compress/layout.hpp"
#include "decentrain/io/checkpoint.hpp"

namespace decentrain::compress {

template <class Codec>
struct adaptive {
  static_assert(check_codec<Codec>());
  static constexpr const char* name = "adaptive";
  Codec codec{};
  std::int64_t probe_every = 100;  // rounds from one pair of probes to the next (>= 2)

  std::string describe() const {
    return "adaptive(" + compress::describe(codec) + ",probe_every=" + std::to_string(probe_every) + ")";
  }
  // Used directly (outside all_reduce) it is the codec.
  std::size_t max_encoded_bytes(std::size_t n) const { return codec.max_encoded_bytes(n); }
  void set_layout(const layout& l) { compress::set_layout(codec, l); }
  void set_reference(std::span<const float> reference, double lr_scale) {
    compress::set_reference(codec, reference, lr_scale);
  }
  std::size_t encode(std::span<const float> in, std::span<std::byte> out) { return codec.encode(in, out); }
  void decode_add(std::span<const std::byte> in, std::span<float> into) const { codec.decode_add(in, into); }

  // A round (collective::encoded_all_reduce runs it): whether it goes through the codec, and
  // whether it is a probe, whose time (the slowest peer's) goes to probed() after it.
  struct round_plan {
    bool through_codec;
    bool probe;
  };
  round_plan begin_round() {
    decentrain::detail::check(probe_every >= 2, "adaptive codec: probe_every must be >= 2, got ", probe_every);
    phase_ = round_++ % probe_every;
    return {phase_ == 0 || (phase_ > 1 && codec_faster_), phase_ <= 1};
  }
  void probed(double seconds) {
    (phase_ == 0 ? codec_seconds_ : plain_seconds_) = seconds;
    if (phase_ == 1) codec_faster_ = codec_seconds_ < plain_seconds_;
  }

  // Whether the rounds between probes go through the codec, and the last probes' times.
  bool codec_faster() const { return codec_faster_; }
  double codec_seconds() const { return codec_seconds_; }
  double plain_seconds() const { return plain_seconds_; }

  void save(io::checkpoint& c, const std::string& prefix) const {
    c.counters[prefix + "round"] = round_;
    c.counters[prefix + "codec_faster"] = codec_faster_ ? 1 : 0;
    c.counters[prefix + "codec_ns"] = static_cast<std::int64_t>(codec_seconds_ * 1e9);
    c.counters[prefix + "plain_ns"] = static_cast<std::int64_t>(plain_seconds_ * 1e9);
    if constexpr (requires { codec.save(c, prefix); }) codec.save(c, prefix + "inner.");
  }
  void load(const io::checkpoint& c, const std::string& prefix) {
    auto counter = [&](const std::string& key) {
      auto it = c.counters.find(prefix + key);
      decentrain::detail::check(it != c.counters.end(), "adaptive codec: the checkpoint has no '", prefix, key, "'");
      return it->second;
    };
    round_ = counter("round");
    codec_faster_ = counter("codec_faster") != 0;
    codec_seconds_ = static_cast<double>(counter("codec_ns")) * 1e-9;
    plain_seconds_ = static_cast<double>(counter("plain_ns")) * 1e-9;
    if constexpr (requires { codec.load(c, prefix); }) codec.load(c, prefix + "inner.");
  }

 private:
  std::int64_t round_ = 0, phase_ = 0;
  bool codec_faster_ = true;
  double codec_seconds_ = 0, plain_seconds_ = 0;
};

}  // namespace decentrain::compress
