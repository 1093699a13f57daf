// The codec that sends f32 values as they are, through the collectives' own all-reduce (the
// pipelined ring or recursive doubling): what every policy uses unless told otherwise.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <string>

#include "decentrain/collective/communicator.hpp"
#include "decentrain/compress/codec.hpp"

namespace decentrain::compress {

struct identity {
  static constexpr const char* name = "identity";
  static constexpr bool dense = true;
  std::string describe() const { return "identity"; }

  std::size_t max_encoded_bytes(std::size_t values) const { return values * sizeof(float); }
  std::size_t encode(std::span<const float> values, std::span<std::byte> out) {
    if (!values.empty()) std::memcpy(out.data(), values.data(), values.size_bytes());
    return values.size_bytes();
  }
  void decode_add(std::span<const std::byte> payload, std::span<float> into) const {
    decentrain::detail::check(payload.size() == into.size_bytes(), "identity codec: a payload of ", payload.size(),
                              " bytes for ", into.size(), " values");
    for (std::size_t i = 0; i < into.size(); ++i) {
      float v;
      std::memcpy(&v, payload.data() + i * sizeof(float), sizeof v);
      into[i] += v;
    }
  }
  // No encoding to do: the plain all-reduce, which adds up as it goes instead of gathering.
  template <class Comm>
  void all_reduce(Comm& comm, std::span<float> values, bool average) {
    comm.all_reduce(values, average ? collective::reduce_op::average : collective::reduce_op::sum);
  }
};

static_assert(check_codec<identity>());

}  // namespace decentrain::compress
