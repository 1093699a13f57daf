// A group that survives its peers: when a peer dies, freezes or is cut off, the others agree on
// a new view without it (fault/membership.hpp) and the step goes on in that view. What is redone
// follows from where the failure struck: a collective that failed before the inner optimizer
// (sync all-reduce of gradients) redoes the step on the survivors; one in the communication
// policy's after_step (DiLoCo's outer round) is redone by the survivors, so their
// pseudo-gradients are averaged without the lost peer's. When a collective finished on some
// peers and not on others, those behind take the state of the one that got furthest, so every
// survivor ends each round with the same parameters, bit for bit.
//
// Data sharding follows the view: the trainer's communicator becomes the view's, so the
// parallel policy splits each step's rows among the survivors.
//
// Needs a transport with membership support (tcp, in_process; see transport/membership.hpp) and
// data parallelism (every peer holds the whole model). Peers joining a running group, and
// checkpoints of an elastic run, are not handled yet.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/fault/membership.hpp"
#include "decentrain/fault/policy.hpp"
#include "decentrain/io/checkpoint.hpp"

namespace decentrain::fault {

// One change of the group, as every survivor records it.
struct membership_change {
  std::uint64_t epoch = 0;       // the new view's
  std::vector<int> members;      // world ranks
  std::vector<int> removed;
  std::int64_t step = 0;         // the step the survivors continued from
  bool healed = false;           // this peer took another's state
  std::string cause;             // the error that started it, as this peer saw it
  double seconds = 0;            // from that error to the new view's first step, on this peer
  // When this peer installed the view (steady clock: on Linux the same clock in every process
  // of a machine, so bench/faults compares it with when it killed a peer).
  std::chrono::steady_clock::time_point installed{};
};

struct elastic {
  using policy_concept = policy_tag;
  static constexpr const char* name = "elastic";

  agreement_settings agreement{};
  // Fewer peers than this left: stop with an error rather than go on.
  int min_peers = 1;

  template <class Ctx>
  void start(Ctx& ctx) {
    decentrain::detail::check(ctx.network.has_membership(), "elastic: this transport cannot change its group (it has no "
                              "membership support; tcp and in_process do; under MPI a dead rank aborts the job unless "
                              "the MPI library has ULFM)");
    decentrain::detail::check(min_peers >= 1, "elastic: min_peers must be >= 1, got ", min_peers);
    decentrain::detail::check(agreement.timeout.count() > 0, "elastic: agreement.timeout must be > 0 ms");
    if (view_.members.empty()) {
      view_.epoch = 0;
      for (int r = 0; r < ctx.network.world(); ++r) view_.members.push_back(r);
      ctx.network.set_epoch(0);
    }
  }

  // A peer that another reported as failed stops before it computes a step the group will not
  // use: the alarm is checked at the start of every step, so a peer busy computing joins the
  // agreement within one step.
  template <class Ctx>
  void before_step(Ctx& ctx) {
    if (const auto a = ctx.network.alarmed())
      transport::fail_peer_because(transport::failure_cause::reported, a->failed, "membership", "elastic: peer ",
                                   a->reporter, " reports that peer ", a->failed, " failed (view ", a->epoch, ")");
  }

  template <class Ctx>
  void after_step(Ctx&) {}

  template <class Ctx>
  action on_error(Ctx& ctx, const transport::peer_error& e) {
    if (e.peer() >= 0 && e.peer() != ctx.network.rank() && e.cause() != transport::failure_cause::reported)
      suspects_.emplace(e.peer(), e.cause());
    cause_ = e.what();
    failed_at_ = std::chrono::steady_clock::now();
    return action::reform;
  }

  template <class Ctx>
  void reform(Ctx& ctx) {
    auto& ep = ctx.network;
    bool healed = false;
    for (;;) {
      decision d = agree(ep, view_, suspects_, position{ctx.step, static_cast<std::int8_t>(ctx.at)}, agreement);
      suspects_.clear();
      const auto failed = install(ep, d, agreement);
      view_ = d.next;
      ctx.set_view(view_.epoch, view_.members);
      decentrain::detail::check(static_cast<int>(view_.members.size()) >= min_peers, "elastic: ",
                                view_.members.size(), " peer(s) left in view ", view_.epoch, ", fewer than min_peers = ",
                                min_peers);
      if (failed) {  // a member of the new view failed already: agree again, from it
        if (failed->peer() >= 0) suspects_.emplace(failed->peer(), failed->cause());
        changes_.push_back(record(d, false));
        continue;
      }
      try {
        const auto got = transfer_state(ep, d, [&] { return io::encode_checkpoint(ctx.capture()); }, agreement);
        if (got) {
          ctx.adopt(io::decode_checkpoint(*got, "the state from peer " + std::to_string(d.donor)));
          ctx.at = static_cast<decltype(ctx.at)>(d.target.phase);
          healed = true;
        }
      } catch (const transport::peer_error& e) {
        if (e.peer() >= 0 && e.peer() != ep.rank()) suspects_.emplace(e.peer(), e.cause());
        changes_.push_back(record(d, false));
        continue;
      }
      changes_.push_back(record(d, healed));
      return;
    }
  }

  const view& current() const { return view_; }
  const std::vector<membership_change>& changes() const { return changes_; }

 private:
  membership_change record(const decision& d, bool healed) const {
    return membership_change{d.next.epoch, d.next.members, d.removed, d.target.step, healed, cause_,
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - failed_at_).count(),
                             std::chrono::steady_clock::now()};
  }

  view view_;
  suspicions suspects_;
  std::vector<membership_change> changes_;
  std::string cause_;
  std::chrono::steady_clock::time_point failed_at_{};
};

}  // namespace decentrain::fault
