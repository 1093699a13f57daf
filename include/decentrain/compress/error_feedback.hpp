// Error feedback: what the codec could not send this round is kept and added to the next
// payload, so nothing is lost, only delayed (Seide et al. 2014; Karimireddy et al. 2019). For a
// dense codec the whole payload is put on the codec's grid here (the residual keeps the
// difference) and then all-reduced through the codec's ring, whose first hop re-encodes it
// without further loss; for a sparse one, each payload that is gathered goes through encode
// below. sent + kept == payload + what was kept before, exactly up to f32 rounding. The
// residual is part of the checkpoint; a payload of another size than the residual's is an error
// (a residual never silently spills into the wrong values).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "decentrain/compress/all_reduce.hpp"
#include "decentrain/compress/codec.hpp"
#include "decentrain/compress/layout.hpp"
#include "decentrain/core/factory.hpp"
#include "decentrain/io/checkpoint.hpp"

namespace decentrain::compress {

template <class Codec>
struct error_feedback {
  static_assert(check_codec<Codec>());
  static constexpr const char* name = "ef";
  static constexpr bool dense = is_dense<Codec>();
  Codec codec{};

  std::string describe() const { return "ef(" + compress::describe(codec) + ")"; }
  std::size_t max_encoded_bytes(std::size_t n) const { return codec.max_encoded_bytes(n); }
  void set_layout(const layout& l) { compress::set_layout(codec, l); }

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

  template <class Comm>
  void all_reduce(Comm& comm, std::span<float> values, bool average) {
    if constexpr (dense) {
      if (comm.world() == 1) return;  // nothing is sent, nothing is lost
      // Onto the codec's grid here, with the residual; the ring's first hop then re-encodes
      // these values to the same payload.
      std::vector<std::byte> payload(codec.max_encoded_bytes(values.size()));
      payload.resize(charged(comm, [&] { return encode(std::span<const float>(values), payload); }));
      std::copy(sent_.begin(), sent_.end(), values.begin());
      ring_all_reduce(codec, comm, values, average);
    } else {
      gathered_all_reduce(*this, comm, values, average);
    }
  }

  const std::vector<float>& residual() const { return residual_; }
  // Adds what is kept into `values` and forgets it: for a round sent exactly (adaptive's f32
  // rounds), which then carries it all.
  void flush_into(std::span<float> values) {
    if (residual_.empty()) return;
    decentrain::detail::check(residual_.size() == values.size(), "error_feedback: a payload of ", values.size(),
                              " values, the residual holds ", residual_.size());
    for (std::size_t i = 0; i < values.size(); ++i) values[i] += residual_[i];
    std::fill(residual_.begin(), residual_.end(), 0.0f);
  }

  void save(io::checkpoint& c, const std::string& prefix) const {
    c.tensors[prefix + "residual"] = from_vector<cpu>(residual_, shape{static_cast<std::int64_t>(residual_.size())});
    if constexpr (requires { codec.save(c, prefix); }) codec.save(c, prefix + "inner.");
  }
  void load(const io::checkpoint& c, const std::string& prefix) {
    auto it = c.tensors.find(prefix + "residual");
    decentrain::detail::check(it != c.tensors.end(), "error_feedback: the checkpoint has no '", prefix, "residual'");
    decentrain::detail::check(it->second.dtype() == dtype::f32 && it->second.rank() == 1, "error_feedback: '", prefix,
                              "residual' must be a 1-D f32 tensor");
    residual_ = it->second.template to_vector<float>();
    if constexpr (requires { codec.load(c, prefix); }) codec.load(c, prefix + "inner.");
  }

 private:
  void add_residual(std::span<const float> values) {
    if (residual_.empty()) residual_.assign(values.size(), 0.0f);
    decentrain::detail::check(residual_.size() == values.size(), "error_feedback: a payload of ", values.size(),
                              " values, the residual holds ", residual_.size());
    wanted_.resize(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) wanted_[i] = values[i] + residual_[i];
  }
  std::vector<float> residual_, wanted_, sent_;
};

}  // namespace decentrain::compress
