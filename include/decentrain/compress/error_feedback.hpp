// Error feedback: what the codec could not send this round is kept and added to the next
// payload, so nothing is lost, only delayed (Seide et al. 2014; Karimireddy et al. 2019). For a
// dense codec the whole payload is put on the codec's grid here (the residual keeps the
// difference) and then all-reduced through the codec's ring, whose first hop re-encodes it
// without further loss; for a sparse one, each payload that is gathered goes through encode
// below (collective::encoded_all_reduce does both). sent + kept == payload + decay x what was kept before, exactly up to f32 rounding.
// `decay` < 1 is SparseLoCo's (Sarfi et al. 2025) accumulator: what waits fades by that factor
// each round, so mass that could not go out for many rounds (computed from parameters long
// replaced) does not arrive late at full weight, and the decayed sum does the work of an outer
// momentum. The residual is part of the checkpoint; a payload of another size than the residual's
// is an error (a residual never silently spills into the wrong values).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "decentrain/compress/codec.hpp"
#include "decentrain/compress/layout.hpp"
#include "decentrain/core/factory.hpp"
#include "decentrain/io/checkpoint.hpp"

namespace decentrain::compress {

namespace detail {
// A peer's unsent residual from its checkpoint: "own.residual" under the codec's prefix (a
// checkpoint written before residuals were marked as the peer's own has "residual").
inline std::vector<float> load_residual(const io::checkpoint& c, const std::string& prefix, const char* who) {
  auto it = c.tensors.find(prefix + "own.residual");
  if (it == c.tensors.end()) it = c.tensors.find(prefix + "residual");
  decentrain::detail::check(it != c.tensors.end(), who, ": the checkpoint has no '", prefix, "own.residual'");
  decentrain::detail::check(it->second.dtype() == dtype::f32 && it->second.rank() == 1, who, ": '", it->first,
                            "' must be a 1-D f32 tensor");
  return it->second.template to_vector<float>();
}
}  // namespace detail

template <class Codec>
struct error_feedback {
  static_assert(check_codec<Codec>());
  static constexpr const char* name = "ef";
  static constexpr bool dense = is_dense<Codec>();
  Codec codec{};
  double decay = 1.0;  // in (0, 1]: what is kept is multiplied by this before the next payload

  std::string describe() const {
    return "ef(" + compress::describe(codec) + (decay == 1.0 ? std::string() : ",decay=" + std::to_string(decay)) + ")";
  }
  std::size_t max_encoded_bytes(std::size_t n) const { return codec.max_encoded_bytes(n); }
  void set_layout(const layout& l) { compress::set_layout(codec, l); }
  void set_reference(std::span<const float> reference, double lr_scale) {
    compress::set_reference(codec, reference, lr_scale);
  }

  // Encodes values + residual; the residual becomes what the payload does not carry.
  std::size_t encode(std::span<const float> values, std::span<std::byte> out) {
    add_residual(values);
    const std::size_t size = codec.encode(std::span<const float>(wanted_), out);
    sent_.assign(wanted_.size(), 0.0f);
    codec.decode_add(std::span<const std::byte>(out.data(), size), std::span<float>(sent_));
    for (std::size_t i = 0; i < wanted_.size(); ++i) residual_[i] = wanted_[i] - sent_[i];
    return size;
  }
  void decode_add(std::span<const std::byte> in, std::span<float> into) const { codec.decode_add(in, into); }

  // What the last encode sent, decoded (a dense codec's ring carries these values: its first hop
  // re-encodes them to the same payload).
  const std::vector<float>& sent() const { return sent_; }
  const std::vector<float>& residual() const { return residual_; }
  // Adds what is kept (decayed, as encode would) into `values` and forgets it: for a round sent
  // exactly (adaptive's f32 rounds), which then carries it all.
  void flush_into(std::span<float> values) {
    if (residual_.empty()) return;
    add_residual(values);
    std::copy(wanted_.begin(), wanted_.end(), values.begin());
    std::fill(residual_.begin(), residual_.end(), 0.0f);
  }

  // The residual is this peer's own (io::is_own_key): a state taken from another peer leaves it
  // out, and this peer keeps what it had not sent (a joiner: nothing).
  void save(io::checkpoint& c, const std::string& prefix) const {
    c.tensors[prefix + "own.residual"] = from_vector<cpu>(residual_, shape{static_cast<std::int64_t>(residual_.size())});
    if constexpr (requires { codec.save(c, prefix); }) codec.save(c, prefix + "inner.");
  }
  void load(const io::checkpoint& c, const std::string& prefix) {
    if (!io::leaves_out_own_state(c)) residual_ = detail::load_residual(c, prefix, "error_feedback");
    if constexpr (requires { codec.load(c, prefix); }) codec.load(c, prefix + "inner.");
  }

 private:
  void add_residual(std::span<const float> values) {
    decentrain::detail::check(decay > 0 && decay <= 1, "error_feedback: decay must be in (0, 1], got ", decay);
    if (residual_.empty()) residual_.assign(values.size(), 0.0f);
    decentrain::detail::check(residual_.size() == values.size(), "error_feedback: a payload of ", values.size(),
                              " values, the residual holds ", residual_.size());
    wanted_.resize(values.size());
    if (decay == 1.0) {
      for (std::size_t i = 0; i < values.size(); ++i) wanted_[i] = values[i] + residual_[i];
    } else {
      const auto d = static_cast<float>(decay);
      for (std::size_t i = 0; i < values.size(); ++i) wanted_[i] = values[i] + d * residual_[i];
    }
  }
  std::vector<float> residual_, wanted_, sent_;
};

}  // namespace decentrain::compress
