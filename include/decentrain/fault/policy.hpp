// What a fault policy is: a struct of settings that opts in with
// `using policy_concept = fault::policy_tag;` and decides what failures mean. The trainer calls
//   start(ctx)                    once, before anything is exchanged: resume from disk through
//                                 ctx.restore, or take a running group's state through ctx.adopt
//                                 (with ctx.at: the peer then goes on from that phase)
//   after_step(ctx)               after every step (ctx.steps_done counts it): checkpoints,
//                                 membership
//   action on_error(ctx, e)       when a step fails because of a peer (e: transport::peer_error,
//                                 naming the peer and the operation): rethrow, redo the step's
//                                 failed part, or re-form the group and then redo
// and, where the policy has them,
//   before_step(ctx)              at the start of every step, inside its error handling (elastic
//                                 checks its alarm here)
//   reform(ctx)                   re-form the group (needed when on_error may say action::reform);
//                                 it may change the group (ctx.set_view) and give this peer
//                                 another peer's state (ctx.adopt, with ctx.step and ctx.at)
//   on_stop(ctx)                  the run stops early (Ctrl-C): save what must not be lost
//   leave(ctx)                    before on_stop, when this peer stops alone
//                                 (trainer_options::stop_alone): tell the others it goes
// `Ctx` is a train::peer_context; train/concepts.hpp checks each member.
#pragma once

#include "decentrain/detail/meta.hpp"
#include "decentrain/transport/peer_error.hpp"

namespace decentrain::fault {

struct policy_tag {};

template <class P>
concept declares_fault_policy = decentrain::detail::opts_into<P, policy_tag>;

enum class action {
  rethrow,  // the error ends the run on this peer
  redo,     // run the failed part of the step again (its collectives too)
  reform,   // call the policy's reform(ctx), then redo
};

inline const char* action_name(action a) {
  switch (a) {
    case action::rethrow: return "rethrow";
    case action::redo: return "redo";
    case action::reform: return "reform";
  }
  return "?";
}

}  // namespace decentrain::fault
