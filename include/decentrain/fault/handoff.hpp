// A peer that leaves on purpose hands its unsent residual to its heir, which adds it to its own:
// the group's unsent mass is neither lost nor sent twice.
//
// What is handed over is the peer's own state (io/checkpoint.hpp's "own." tensors: what its
// codec has not sent yet, error feedback's residual), and the heir is the next member of the
// view after the leaver (the next after that when the first is gone too). A peer that dies hands
// nothing over; its unsent mass is lost with it, as its unfinished round is.
//
// On the wire, in the membership channel (a membership alarm does not fail the wait): a header
// (the encoded size, 8 bytes), then the encoded tensors in chunks. The leaver writes all of it
// before its goodbye, on the same connection, so an heir that finds the leaver gone has it queued
// already; the heir takes it before it installs the next view, which forgets what a removed peer
// sent (fault/membership.hpp's install).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/fault/membership.hpp"
#include "decentrain/io/checkpoint.hpp"
#include "decentrain/transport/membership.hpp"

namespace decentrain::fault {

inline constexpr transport::tag_type handoff_tag = transport::membership_tag(4);

// The members after `leaver` in the view's order, wrapping around: its heir first, then the
// next ones should the heir be gone too.
inline std::vector<int> heirs_of(int leaver, const view& v) {
  std::vector<int> out;
  const auto at = std::find(v.members.begin(), v.members.end(), leaver);
  if (at == v.members.end()) return out;
  out.insert(out.end(), std::next(at), v.members.end());
  out.insert(out.end(), v.members.begin(), at);
  return out;
}

// The heir of `leaver` as the survivors see it: the first member after it that `removed` does
// not list (-1: none).
inline int heir_of(int leaver, const view& v, const std::vector<int>& removed = {}) {
  for (int j : heirs_of(leaver, v))
    if (std::find(removed.begin(), removed.end(), j) == removed.end()) return j;
  return -1;
}

// The own tensors of a captured state that hold values (empty: nothing to hand over; a codec
// that has not encoded yet holds an empty residual).
inline io::checkpoint own_tensors(const io::checkpoint& c) {
  io::checkpoint out;
  for (const auto& [key, t] : c.tensors)
    if (io::is_own_key(key) && t.numel() > 0) out.tensors.emplace(key, t);
  return out;
}

// The leaver: sends `own` to `heir` (a header, then chunks of at most `chunk_bytes`).
template <class E>
void hand_over_to(E& ep, int heir, const io::checkpoint& own, std::size_t chunk_bytes) {
  const std::string blob = io::encode_checkpoint(own);
  const std::uint64_t size = blob.size();
  ep.send(heir, handoff_tag, std::as_bytes(std::span<const std::uint64_t>(&size, 1)));
  for (std::size_t at = 0; at < blob.size(); at += chunk_bytes)
    ep.send(heir, handoff_tag,
            std::as_bytes(std::span<const char>(blob.data() + at, std::min(chunk_bytes, blob.size() - at))));
}

// The heir: the handoff of `leaver`, when its header arrives within `wait` (none when the leaver
// is gone without one, or is alive and sent none: it was removed for another reason), the rest
// within `rest` of the header. A handoff over `max_bytes`, malformed or cut off is refused with
// an error naming the leaver. Memory grows only with the bytes that arrive.
template <class E>
std::optional<io::checkpoint> take_handoff(E& ep, int leaver, std::uint64_t max_bytes, std::chrono::milliseconds wait,
                                           std::chrono::milliseconds rest) {
  transport::bytes head;
  try {
    head = ep.recv_within(leaver, handoff_tag, wait);
  } catch (const transport::peer_error&) {
    return std::nullopt;
  }
  decentrain::detail::check(head.size() == 8, "elastic: peer ", leaver, " began a handoff with ", head.size(),
                            " bytes (expected 8)");
  std::uint64_t size;
  std::memcpy(&size, head.data(), 8);
  decentrain::detail::check(size > 0 && size <= max_bytes, "elastic: peer ", leaver, " announced a handoff of ", size,
                            " bytes; this peer takes at most ", max_bytes, " (agreement_settings::max_state_bytes)");
  const auto deadline = transport::now(ep) + rest;
  std::string blob;
  while (blob.size() < size) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - transport::now(ep));
    transport::bytes chunk;
    try {
      chunk = ep.recv_within(leaver, handoff_tag, std::max(left, std::chrono::milliseconds(0)));
    } catch (const transport::peer_error& e) {
      decentrain::detail::fail("elastic: the handoff from peer ", leaver, " was cut off after ", blob.size(), " of ", size,
                               " bytes: ", e.what());
    }
    decentrain::detail::check(!chunk.empty() && blob.size() + chunk.size() <= size, "elastic: peer ", leaver,
                              " sent a handoff chunk of ", chunk.size(), " bytes with ", size - blob.size(), " left");
    blob.append(reinterpret_cast<const char*>(chunk.data()), chunk.size());
  }
  return io::decode_checkpoint(blob, decentrain::detail::concat("the handoff from peer ", leaver));
}

}  // namespace decentrain::fault
