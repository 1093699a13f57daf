// Fault policies decide what happens around failures: checkpoints, membership, robust
// aggregation. `none` does nothing: a failed peer ends the run with the error that says why.
#pragma once

#include <concepts>

#include "decentrain/detail/meta.hpp"

namespace decentrain::fault {

struct policy_tag {};

template <class P>
concept declares_fault_policy = decentrain::detail::opts_into<P, policy_tag>;

template <class P, class Ctx>
concept fault_policy = declares_fault_policy<P> && requires(P& p, Ctx& ctx) { p.after_step(ctx); };

struct none {
  using policy_concept = policy_tag;
  static constexpr const char* name = "none";
  template <class Ctx>
  void after_step(Ctx&) {}
};

}  // namespace decentrain::fault
