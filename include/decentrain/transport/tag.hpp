// A message's tag: what a receiver matches besides the source. Collectives put a channel in the
// high 32 bits (the world's, a group's, a lane's; see collective::communicator) and a call
// number in the low ones.
#pragma once

#include <cstdint>

namespace decentrain::transport {

using tag_type = std::uint64_t;

}  // namespace decentrain::transport
