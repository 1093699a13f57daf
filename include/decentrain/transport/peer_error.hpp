// The error a transport or a collective throws when a peer fails it: the peer that did (dead,
// silent past its deadline, sending what it must not) and the operation that noticed. A fault
// policy's on_error receives it and decides whether to rethrow, redo the round or re-form the
// group; everything else that goes wrong stays a plain decentrain::error.
#pragma once

#include <string>
#include <utility>

#include "decentrain/detail/error.hpp"

namespace decentrain::transport {

class peer_error : public decentrain::error {
 public:
  peer_error(int peer, std::string operation, const std::string& message)
      : decentrain::error(message), peer_(peer), operation_(std::move(operation)) {}
  // The rank (in the world of the endpoint that threw) of the peer that failed.
  int peer() const { return peer_; }
  // What noticed: "send", "receive", or the collective ("all_reduce", "broadcast", ...).
  const std::string& operation() const { return operation_; }

 private:
  int peer_;
  std::string operation_;
};

template <class... Parts>
[[noreturn]] void fail_peer(int peer, std::string operation, Parts&&... parts) {
  throw peer_error(peer, std::move(operation), decentrain::detail::concat(std::forward<Parts>(parts)...));
}

}  // namespace decentrain::transport
