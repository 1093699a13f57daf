// What a codec is: how a communication policy's f32 payload is put on the wire. A codec is a
// value type of settings (and any state it keeps, such as an error-feedback residual) with
//   std::size_t max_encoded_bytes(std::size_t values) const   an upper bound of encode's output
//   std::size_t encode(std::span<const float> values, std::span<std::byte> out)
//                                                             writes the payload, returns its size
//   void decode_add(std::span<const std::byte> payload, std::span<float> into) const
//                                                             adds the decoded values into `into`;
//                                                             throws decentrain::error on a payload
//                                                             it could not have written
// and may add
//   template <class Comm> void all_reduce(Comm&, std::span<float>, bool average)
//                                                             a collective of its own (identity: the ring)
//   void save(io::checkpoint&, const std::string& prefix) const / void load(const io::checkpoint&, const std::string& prefix)
// Users write their own codecs without touching the library (as nlohmann/json's adl_serializer).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/peer_error.hpp"

namespace decentrain::compress {

// One static_assert per member, so a codec that lacks one is told which.
template <class C>
constexpr bool check_codec() {
  static_assert(std::is_copy_constructible_v<C>, "codec: a codec must be copyable (a value type of settings)");
  static_assert(requires(const C& c, std::size_t n) { { c.max_encoded_bytes(n) } -> std::convertible_to<std::size_t>; },
                "codec: needs `std::size_t max_encoded_bytes(std::size_t values) const`");
  static_assert(requires(C& c, std::span<const float> in, std::span<std::byte> out) {
                  { c.encode(in, out) } -> std::convertible_to<std::size_t>;
                },
                "codec: needs `std::size_t encode(std::span<const float> values, std::span<std::byte> out)` "
                "returning the payload's size");
  static_assert(requires(const C& c, std::span<const std::byte> in, std::span<float> out) { c.decode_add(in, out); },
                "codec: needs `void decode_add(std::span<const std::byte> payload, std::span<float> into) const`");
  return true;
}

template <class C>
concept codec = std::is_copy_constructible_v<C> && requires(C& c, const C& cc, std::size_t n, std::span<const float> in,
                                                            std::span<std::byte> out, std::span<const std::byte> payload,
                                                            std::span<float> into) {
  { cc.max_encoded_bytes(n) } -> std::convertible_to<std::size_t>;
  { c.encode(in, out) } -> std::convertible_to<std::size_t>;
  cc.decode_add(payload, into);
};

// The sum (or mean) of every peer's `values` as sent through `codec`, left in `values` on every
// peer. A codec with a collective of its own runs it; any other is gathered: each peer's payload
// (its size in front) goes to every peer, which decodes and adds them up in rank order, so every
// peer ends with the same bits. A payload whose stated size is beyond the codec's bound is
// rejected naming the peer (a transport::peer_error); decode_add checks the rest. Each payload
// travels padded to the bound, as one message (so within the transport's message size).
template <class Codec, class Comm>
void all_reduce(Codec& codec, Comm& comm, std::span<float> values, bool average) {
  static_assert(check_codec<Codec>());
  if constexpr (requires { codec.all_reduce(comm, values, average); }) {
    codec.all_reduce(comm, values, average);
  } else {
    const std::size_t bound = codec.max_encoded_bytes(values.size());
    std::vector<std::byte> mine(sizeof(std::uint64_t) + bound);
    const std::uint64_t size = codec.encode(std::span<const float>(values), std::span<std::byte>(mine).subspan(sizeof(std::uint64_t)));
    decentrain::detail::check(size <= bound, "codec: encode wrote ", size, " bytes, over its own bound of ", bound);
    std::memcpy(mine.data(), &size, sizeof size);
    const auto all = comm.all_gather(std::span<const std::byte>(mine));
    std::fill(values.begin(), values.end(), 0.0f);
    for (int r = 0; r < comm.world(); ++r) {
      const auto payload = std::span<const std::byte>(all).subspan(static_cast<std::size_t>(r) * mine.size(), mine.size());
      std::uint64_t n = 0;
      std::memcpy(&n, payload.data(), sizeof n);
      if (n > bound)
        transport::fail_peer(r, "all_reduce", "codec: peer ", r, " sent a payload of ", n, " bytes, over the bound of ",
                             bound, " for ", values.size(), " values");
      codec.decode_add(payload.subspan(sizeof n, static_cast<std::size_t>(n)), values);
    }
    if (average && comm.world() > 1) {
      const float scale = 1.0f / static_cast<float>(comm.world());
      for (auto& v : values) v *= scale;
    }
  }
}

}  // namespace decentrain::compress
