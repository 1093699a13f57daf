// A message's tag: what a receiver matches besides the source. Collectives put a channel in the
// high 32 bits (the world's, a group's, a lane's; see collective::communicator) and a call
// number in the low ones.
#pragma once

#include <cstdint>
#include <string>

namespace decentrain::transport {

using tag_type = std::uint64_t;

// "tag 7", or "tag 7 of channel 0x70327000" where the channel is not the world's: for messages
// that name a wait.
inline std::string describe_tag(tag_type tag) {
  const auto channel = static_cast<std::uint32_t>(tag >> 32);
  std::string out = "tag " + std::to_string(static_cast<std::uint32_t>(tag));
  if (channel == 0) return out;
  static constexpr char digits[] = "0123456789abcdef";
  out += " of channel 0x";
  for (int shift = 28; shift >= 0; shift -= 4) out += digits[(channel >> shift) & 0xf];
  return out;
}

}  // namespace decentrain::transport
