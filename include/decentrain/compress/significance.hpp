// Gaia's significance filter (Hsieh et al., NSDI 2017) in front of a sparse codec: of a payload
// of updates to parameters w, only the entries whose relative size |u_i| / |w_i| passes a
// threshold go on to the codec; the others become zeros, which a sparse codec does not send
// (top-k skips them). Error feedback around the filter keeps what it held back, so a small update
// is not lost: it goes out once its accumulated change passes the threshold (Gaia's accumulation).
// The threshold falls with the inner learning rate, as Gaia lowers it while the rate decays: an
// entry passes when |u_i| > threshold x lr_scale x |w_i|, lr_scale being the rate over its peak.
// The communication policy hands the filter w and lr_scale before each payload
// (compress::set_reference; DiLoCo gives its global parameters). Gaia's bounded-staleness barrier
// between data centres is the policy's round here: every peer applies a round's significant
// updates at the same step.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "decentrain/compress/codec.hpp"
#include "decentrain/compress/layout.hpp"
#include "decentrain/io/checkpoint.hpp"

namespace decentrain::compress {

template <class Codec>
struct significance {
  static_assert(check_codec<Codec>());
  static_assert(!is_dense<Codec>(), "significance: the filter's zeros would still be sent by a dense codec; use a sparse one (top_k)");
  static constexpr const char* name = "significance";
  static constexpr bool dense = false;
  Codec codec{};
  double threshold = 0.01;  // the relative change an entry needs at the peak learning rate (Gaia's 1%)
  // false: the filter goes first and the codec chooses among what passed (Gaia's filter). true:
  // the codec chooses first (top-k: the largest values) and the filter takes out of that choice
  // what is not significant, so it only ever sends less (the codec must keep no state of its own
  // between payloads: it encodes twice).
  bool veto = false;

  std::string describe() const {
    return "significance(" + std::to_string(threshold) + (veto ? ",veto," : ",") + compress::describe(codec) + ")";
  }
  std::size_t max_encoded_bytes(std::size_t n) const { return codec.max_encoded_bytes(n); }
  void set_layout(const layout& l) { compress::set_layout(codec, l); }
  void set_reference(std::span<const float> reference, double lr_scale) {
    decentrain::detail::check(std::isfinite(lr_scale) && lr_scale >= 0, "significance filter: lr_scale must be finite and >= 0, got ",
                              lr_scale);
    reference_.assign(reference.begin(), reference.end());
    lr_scale_ = lr_scale;
  }

  std::size_t encode(std::span<const float> in, std::span<std::byte> out) {
    decentrain::detail::check(std::isfinite(threshold) && threshold >= 0, "significance filter: threshold must be finite and >= 0, got ",
                              threshold);
    decentrain::detail::check(!reference_.empty() || in.empty(),
                              "significance filter: no reference values were set (the communication policy hands over "
                              "the parameters the payload updates: comm::diloco does)");
    decentrain::detail::check(reference_.size() == in.size(), "significance filter: a payload of ", in.size(),
                              " values against ", reference_.size(), " reference values");
    const double t = threshold * lr_scale_;
    if (veto) {  // what the codec would send of the whole payload
      chosen_.assign(in.size(), 0.0f);
      const std::size_t size = codec.encode(in, out);
      codec.decode_add(std::span<const std::byte>(out.data(), size), std::span<float>(chosen_));
    }
    filtered_.resize(in.size());
    passed_ = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const bool keep = (!veto || chosen_[i] != 0.0f) &&
                        std::abs(static_cast<double>(in[i])) > t * std::abs(static_cast<double>(reference_[i]));
      filtered_[i] = keep ? in[i] : 0.0f;
      passed_ += keep;
    }
    return codec.encode(std::span<const float>(filtered_), out);
  }
  void decode_add(std::span<const std::byte> in, std::span<float> into) const { codec.decode_add(in, into); }

  // How many entries passed the filter in the last payload.
  std::size_t passed() const { return passed_; }

  void save(io::checkpoint& c, const std::string& prefix) const {
    if constexpr (requires { codec.save(c, prefix); }) codec.save(c, prefix);
  }
  void load(const io::checkpoint& c, const std::string& prefix) {
    if constexpr (requires { codec.load(c, prefix); }) codec.load(c, prefix);
  }

 private:
  std::vector<float> reference_, filtered_, chosen_;
  double lr_scale_ = 1.0;
  std::size_t passed_ = 0;
};

}  // namespace decentrain::compress
