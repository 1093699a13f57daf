// The error a transport or a collective throws when a peer fails it: the peer that did (dead,
// silent past its deadline, sending what it must not) and the operation that noticed. A fault
// policy's on_error receives it and decides whether to rethrow, redo the round or re-form the
// group; everything else that goes wrong stays a plain decentrain::error.
#pragma once

#include <string>
#include <utility>

#include "decentrain/detail/error.hpp"

namespace decentrain::transport {

// How sure the transport is that the peer is gone. An elastic group counts a departed peer out
// of its quorum (a closed connection means the process ended or said goodbye) but not a silent
// or excluding one, which may be alive behind a partition.
enum class failure_cause {
  departed,  // its connection closed, or it was killed (in_process)
  silent,    // it missed a deadline (heartbeat or receive timeout)
  excluded,  // it stopped listening to this peer (heard nothing from it in time, or left it out
             // of a view): it is alive, and this peer may be the one that was frozen or cut off
  reported,  // another peer reported it failed (the membership alarm)
  joining,   // no failure: the group changes its view to take in a peer that joins
  convicted, // alive, but what it sent was poison (dropped as non-finite or malformed, or far
             // from the aggregate, too often: fault::elastic::exclusion): the group excludes it
  other,     // it sent something malformed, or the cause is not known
};

// The cause in words, as an error message about the peer would put it.
inline const char* describe(failure_cause c) {
  switch (c) {
    case failure_cause::departed: return "departed";
    case failure_cause::silent: return "silent past its deadline";
    case failure_cause::excluded: return "stopped listening to this peer";
    case failure_cause::reported: return "reported failed by another peer";
    case failure_cause::joining: return "the group takes in a joiner";
    case failure_cause::convicted: return "sent poison too often";
    case failure_cause::other: break;
  }
  return "failed";
}

class peer_error : public decentrain::error {
 public:
  peer_error(int peer, std::string operation, const std::string& message, failure_cause cause = failure_cause::other)
      : decentrain::error(message), peer_(peer), operation_(std::move(operation)), cause_(cause) {}
  // The rank (in the world of the endpoint that threw) of the peer that failed.
  int peer() const { return peer_; }
  // What noticed: "send", "receive", or the collective ("all_reduce", "broadcast", ...).
  const std::string& operation() const { return operation_; }
  failure_cause cause() const { return cause_; }

 private:
  int peer_;
  std::string operation_;
  failure_cause cause_;
};

template <class... Parts>
[[noreturn]] void fail_peer(int peer, std::string operation, Parts&&... parts) {
  throw peer_error(peer, std::move(operation), decentrain::detail::concat(std::forward<Parts>(parts)...));
}
template <class... Parts>
[[noreturn]] void fail_peer_because(failure_cause cause, int peer, std::string operation, Parts&&... parts) {
  throw peer_error(peer, std::move(operation), decentrain::detail::concat(std::forward<Parts>(parts)...), cause);
}

}  // namespace decentrain::transport
