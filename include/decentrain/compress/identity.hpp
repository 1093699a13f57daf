// The codec that sends f32 values as they are: what every policy uses unless told otherwise.
// Nothing to encode, so collective::encoded_all_reduce sends it through the communicator's own
// all-reduce (the pipelined ring or recursive doubling), which adds up as it goes.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <string>

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
};

static_assert(check_codec<identity>());

}  // namespace decentrain::compress
