// The fault policy that does nothing: no checkpoints, and a failed peer ends the run with the
// error that names it.
#pragma once

#include "decentrain/fault/policy.hpp"

namespace decentrain::fault {

struct none {
  using policy_concept = policy_tag;
  static constexpr const char* name = "none";
  template <class Ctx>
  void start(Ctx&) {}
  template <class Ctx>
  void after_step(Ctx&) {}
  template <class Ctx>
  action on_error(Ctx&, const transport::peer_error&) {
    return action::rethrow;
  }
};

}  // namespace decentrain::fault
