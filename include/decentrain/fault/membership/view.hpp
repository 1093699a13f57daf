// The values of an elastic group's membership: a view (an epoch and its members), where a peer
// stands in training, what an agreement decides, and the agreement's settings.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/peer_error.hpp"

namespace decentrain::fault {

struct view {
  std::uint64_t epoch = 0;
  std::vector<int> members;  // world ranks, ascending
  std::vector<int> barred;   // world ranks excluded from the run for good (convicted), ascending
  bool contains(int r) const { return std::binary_search(members.begin(), members.end(), r); }
  bool bars(int r) const { return std::binary_search(barred.begin(), barred.end(), r); }
};

// Where a peer stands in training: the step, and the phase within it (train::phase as a
// number: start, evaluation, stop check, step, stepped), ordered as the trainer goes through them.
struct position {
  std::int64_t step = 0;
  std::int8_t phase = 0;
  auto operator<=>(const position&) const = default;
};

struct agreement_settings {
  // How long a peer waits for another's report, view, marker or state: the deadline for a peer
  // that is alive (it answers heartbeats) but does not take part; a dead one fails at once.
  std::chrono::milliseconds timeout{60000};
  bool require_majority = true;
  std::size_t state_chunk_bytes = std::size_t{16} << 20;
  // Members at the target that serve the state to those behind, each a share of its chunks.
  int max_donors = 4;
  // The largest state a peer behind accepts from a donor (it holds all of it at once).
  std::uint64_t max_state_bytes = std::uint64_t{64} << 30;
  // How many members of a view may lie (agreement.hpp), the leader among them. -1: as many as
  // can be tolerated, fewer than a third of a view of 4 or more (none below 4). A departure or a
  // conviction then needs more than half of the view to say so, and a view is followed once a
  // quorum echoed it: when a partition leaves no side that quorum, every side waits for it to
  // heal (up to `patience`) rather than risk two models, where with 0 (crash faults only: every
  // member follows the protocol) a side with a majority of the view goes on and the others stop.
  int liars = -1;
  std::chrono::milliseconds patience{std::chrono::minutes(10)};
};

// Thrown by agree() on a peer that the next view leaves out while it is alive: its side of a
// partition has no majority, or the others went on without it (they did not hear from it in
// time). fault::elastic may then wait to be taken in again (elastic::left_out).
class left_out_error : public decentrain::error {
 public:
  using decentrain::error::error;
};

// What the survivors agreed on.
struct decision {
  view next;
  position target;              // where every member continues from
  int donor = -1;               // a member at `target`: the others behind it take its state
  std::vector<int> behind;      // members not at `target` (those who joined among them)
  std::vector<int> removed;     // members of the previous view left out
  std::vector<int> joined;      // members new to the group (they joined it running)
  std::vector<int> marked;      // members whose marker of `next` this peer took already (a joiner)
  std::map<int, std::string> named;  // members this peer caught lying in the agreement, and how
};

// The failures a peer knows of: whom it suspects, and whether each departed for certain.
using suspicions = std::map<int, transport::failure_cause>;

}  // namespace decentrain::fault
