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
// Peers may also join the running group (tcp: a peer whose connect() finds the group running, a
// new rank or one the group has left out): at the start of the next round of the communication
// policy (comm/policy.hpp's ends_round_at) the members find that one of them sees it connected
// and start an agreement together, the leader admits every joiner that the members and the
// other joiners admitted reach, and each takes the state from the members at the target, in
// chunks from several of them at once (transfer_state).
//
// A partition: the side with a majority of the view goes on (fault/membership.hpp); a peer on
// the other side, or one the others went on without, either stops with the error (`left_out`:
// stop) or forgets the old group and waits to be taken in again as a joiner (rejoin): once the
// partition heals it reaches the group, is admitted at a round's start and takes the group's
// state, so the run ends as one model. What the minority trained alone is dropped, as a
// joiner's would be: it never averages into the group's.
//
// A peer asked to stop alone (trainer_options::stop_alone: Ctrl-C on one machine) says goodbye,
// so the others leave it out at once instead of at its heartbeat deadline. Before that it hands
// what its codec has not sent yet to the next member of the view, which adds it to its own
// (fault/handoff.hpp): nothing of the group's unsent mass is lost or sent twice.
//
// A peer that sends poison is excluded (`exclusion`): when the communication policy's
// aggregation (collective/robust_all_reduce.hpp) found a member's contributions dropped
// (non-finite, malformed) or far from the aggregate in `times` of its last `of_last` calls, the
// others agree on a view without it, which bars it for good (fault/membership.hpp). No vote is
// needed to start: the honest peers see the same contributions and reach the same verdicts, so
// each finds the same peer at the same call.
//
// Checkpoints (`checkpoints`, off while its dir is empty): each peer writes its own folder; a
// restarted group starts from each peer's newest, and when those differ (a peer killed while
// saving, or restarted without its files) the ones behind take the state of the furthest, as
// after a failure. A peer that joins a running group takes the group's state, not its files.
//
// A pipeline (peers holding parts of the model) re-forms otherwise: once a view holds, the
// trainer deals the parts out again over it (ctx.redeal: the pipeline's morph picks the shape,
// each member takes its new part from the members at the target), in place of the state
// transfer above. A stage whose every replica is lost is taken from the checkpoints the members
// can read (their own folders, and the lost peers' where `checkpoints.dir` is shared storage, as
// Varuna's is): the group goes back to the newest step whose files hold every part; with none,
// the run stops naming the stage. A restarted group deals out the parts its files hold whatever
// shape wrote them (a job that re-formed before it stopped). A joiner takes its part the same way
// (it holds nothing the group can use; the shape is picked for the view with it), as does a peer
// left out that rejoins. A policy's exclusions (its tally counts a stage's replicas) are data
// parallelism's.
//
// Needs a transport with membership support (tcp, in_process; see transport/membership.hpp;
// joiners: tcp, and in_process in a deterministic run).
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "decentrain/collective/robust_all_reduce.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/fault/checkpoint_every.hpp"
#include "decentrain/fault/handoff.hpp"
#include "decentrain/fault/membership.hpp"
#include "decentrain/fault/policy.hpp"
#include "decentrain/io/checkpoint.hpp"

namespace decentrain::fault {

// One change of the group, as every survivor records it.
struct membership_change {
  std::uint64_t epoch = 0;       // the new view's
  std::vector<int> members;      // world ranks
  std::vector<int> removed;
  std::vector<int> joined;
  std::int64_t step = 0;         // the step the survivors continued from
  bool healed = false;           // this peer took another's state
  std::string cause;             // the error that started it, as this peer saw it
  double seconds = 0;            // from that error to the new view's first step, on this peer
  // When this peer installed the view, on the transport's clock (transport::now): the steady
  // clock, on Linux the same in every process of a machine, so bench/faults compares it with when
  // it killed a peer; simulated time on a deterministic in_process network.
  std::chrono::steady_clock::time_point installed{};
  std::vector<int> inherited;    // removed peers whose unsent residual this peer took over (their heir)
  bool healed_in_place = false;  // the state taken landed in this peer's own tensors: no copy of it was made
  std::map<int, std::string> named;  // members this peer caught lying in the agreement, and how (fault/membership/agreement.hpp)
};

struct elastic {
  using policy_concept = policy_tag;
  static constexpr const char* name = "elastic";

  agreement_settings agreement{};
  // Fewer peers than this left: stop with an error rather than go on.
  int min_peers = 1;
  // A peer that joins a running group waits this long to be admitted (0: twice agreement.timeout).
  std::chrono::milliseconds admission_timeout{0};
  // A peer left out of the next view while alive (its side of a partition has no majority, or the
  // others went on without it): stop with the error, or rejoin: forget the old group and wait up
  // to `rejoin_timeout` to be admitted again once it reaches the group (see above). rejoin needs
  // a network that takes joiners: tcp, or a deterministic in_process network (its partitions).
  enum class when_left_out { stop, rejoin };
  when_left_out left_out = when_left_out::stop;
  std::chrono::milliseconds rejoin_timeout{std::chrono::minutes(10)};
  // This peer's checkpoints, in dir/peer-R-of-W with W its transport's world() at the start (the
  // group's first world; for a tcp joiner its rank + 1 if that is more) (dir empty: none);
  // `every`, `keep_last`, `background` and `resume` as for fault::checkpoint_every, except that
  // peers resume from their own newest step and those behind then take the furthest's state.
  checkpoint_every checkpoints{};
  // A peer that stops alone hands its codec's unsent residual to its heir (fault/handoff.hpp).
  // The heir of a removed peer waits up to `handoff_wait` for a handoff to begin (it has usually
  // arrived long before: the leaver wrote it before its goodbye; a dead peer's closed connection
  // ends the wait at once, and a peer removed while alive, cut off or frozen, sends none: the
  // wait is what that view change costs the heir), each of its chunks then within
  // agreement.timeout, at most agreement.max_state_bytes in all.
  bool hand_over = true;
  std::chrono::milliseconds handoff_wait{2000};
  // How many of the latest membership changes changes() keeps.
  std::size_t changes_kept = 1000;
  // Members whose contributions were suspicious (see above) in at least `times` of the policy's
  // last `of_last` aggregations are excluded; times = 0: never (they are only reported). A
  // flagged call is one in which a peer was dropped or lay more than peer_tally::far_factor (3)
  // times the typical distance from the aggregate.
  struct exclusion_rule {
    int times = 3;
    int of_last = 5;
  } exclusion{};

  template <class Ctx>
  void start(Ctx& ctx) {
    decentrain::detail::check(ctx.network.has_membership(), "elastic: this transport cannot change its group (it has no "
                              "membership support; tcp and in_process do; under MPI a dead rank aborts the job unless "
                              "the MPI library has ULFM)");
    decentrain::detail::check(min_peers >= 1, "elastic: min_peers must be >= 1, got ", min_peers);
    decentrain::detail::check(agreement.timeout.count() > 0, "elastic: agreement.timeout must be > 0 ms");
    // A peer left out rejoins as a joiner: on a network that takes none it would only wait out
    // rejoin_timeout, so that is refused here.
    decentrain::detail::check(left_out == when_left_out::stop || ctx.network.takes_joiners(),
                              "elastic: left_out = rejoin needs a network that takes joiners (tcp, or a deterministic "
                              "in_process network); this one takes none, use left_out = stop");
    decentrain::detail::check(rejoin_timeout.count() > 0, "elastic: rejoin_timeout must be > 0 ms");
    decentrain::detail::check(exclusion.times >= 0 && exclusion.of_last >= exclusion.times && exclusion.of_last <= 64,
                              "elastic: exclusion needs 0 <= times <= of_last <= 64, got times = ", exclusion.times,
                              ", of_last = ", exclusion.of_last);
    if (!view_.members.empty()) return;
    // Whether the policy keeps own state (a codec's residual; the same on every member): only
    // then does an heir wait for a handoff. Captured here, before the policy starts, once.
    const auto state = ctx.capture_views();  // (names only: no copy of the state)
    keeps_own_ = std::any_of(state.tensors.begin(), state.tensors.end(), [](const auto& t) { return io::is_own_key(t.first); });
    if (keeps_own_ && hand_over) {
      // A leaver writes its handoff before its goodbye, before its heir can know of it: taken
      // whole, up to the size of this peer's own state (what a handoff holds) and some room.
      std::uint64_t own = 0;
      for (const auto& [key, t] : state.tensors)
        if (io::is_own_key(key)) own += t.nbytes();
      transport::allow(ctx.network, handoff_tag, 2 * own + (std::uint64_t{1} << 20));
    }
    folder_world_ = ctx.network.world();
    if (saves()) checkpoints.open(ctx.network.rank(), folder_world_);
    if (ctx.network.joined_late()) {  // admitted by the running group, and given its state
      failed_at_ = transport::now(ctx.network);
      cause_ = "joined the running group";
      const auto patience = admission_timeout.count() > 0 ? admission_timeout : 2 * agreement.timeout;
      converge(ctx, await_admission(ctx.network, patience));
      ctx.joined = true;
      return;
    }
    view_.epoch = 0;
    for (int r = 0; r < ctx.network.world(); ++r) view_.members.push_back(r);
    ctx.network.set_epoch(0);
    if (saves() && checkpoints.resume) resume(ctx);
  }

  // A peer that another reported as failed stops before it computes a step the group will not
  // use: the alarm is checked at the start of every step, so a peer busy computing joins the
  // agreement within one step.
  //
  // So is a member that the aggregation convicted of sending poison (see exclusion).
  //
  // Joiners are taken in at the start of a round (ctx.round_start: after the communication
  // policy's round, where every member stands at the same point and DiLoCo's members hold the
  // same parameters): the members ask one another whether any of them sees a joiner ready (one
  // small all-reduce a round, on transports that take joiners), and all start the agreement
  // together, so none is behind another and every member at the target can serve the state.
  // Where the replicas pass a round's start apart (ctx.replicas_meet_at_round_start false:
  // DiLoCo's deadline), there is no meeting: see below.
  template <class Ctx>
  void before_step(Ctx& ctx) {
    if (const int guilty = convict(ctx); guilty >= 0)
      transport::fail_peer_because(transport::failure_cause::convicted, guilty, "aggregation", "elastic: peer ", guilty,
                                   "'s contributions were dropped (non-finite or malformed) or far from the aggregate in ",
                                   std::popcount(history_[guilty] & window()), " of the last ", exclusion.of_last,
                                   " aggregations (exclusion: ", exclusion.times, " of ", exclusion.of_last,
                                   "); the group excludes it");
    if (const auto a = ctx.network.alarmed())
      transport::fail_peer_because(transport::cause_of(*a), a->failed, "membership", "elastic: ",
                                   transport::describe(*a));
    if (!ctx.round_start || !ctx.network.takes_joiners()) return;
    std::int64_t joiner = ready_joiner(ctx);  // -1: none seen here
    // (replicas that pass a round's start apart, one late skipping it: the member that sees the
    // joiner starts the agreement alone, the others join it when alarmed, and those behind the
    // furthest take its state, as after a failure)
    if (ctx.replicas_meet_at_round_start) ctx.comm.all_reduce(std::span<std::int64_t>(&joiner, 1), collective::reduce_op::max);
    if (joiner >= 0)
      transport::fail_peer_because(transport::failure_cause::joining, static_cast<int>(joiner), "membership",
                                   "elastic: peer ", joiner, " joins the running group (view ", view_.epoch, ", step ",
                                   ctx.step, ")");
  }

  template <class Ctx>
  void after_step(Ctx& ctx) {
    if (saves() && checkpoints.due(ctx)) {
      try {
        checkpoints.save_as(ctx, ctx.network.rank(), folder_world_);
      } catch (const transport::peer_error&) {
        // The policy holds a failed exchange (Streaming DiLoCo): this step's state is not the
        // group's, so it is not saved; the failure is handled where the exchange lands.
      }
    }
  }

  // Stopped alone (trainer_options::stop_alone): a goodbye to every peer, so they leave this one
  // out as soon as they next need it instead of at its deadline.
  template <class Ctx>
  void leave(Ctx& ctx) {
    if (hand_over) hand_over_own(ctx);
    ctx.network.leave(decentrain::detail::concat("peer ", ctx.network.rank(), " stopped at step ", ctx.steps_done));
  }

  // Stopped (alone or with the group): saves, and waits for the write.
  template <class Ctx>
  void on_stop(Ctx& ctx) {
    if (!saves()) return;
    checkpoints.save_as(ctx, ctx.network.rank(), folder_world_);
    checkpoints.wait();
  }

  template <class Ctx>
  action on_error(Ctx& ctx, const transport::peer_error& e) {
    if (e.peer() >= 0 && e.peer() != ctx.network.rank() && e.cause() != transport::failure_cause::reported &&
        e.cause() != transport::failure_cause::joining)
      suspects_.emplace(e.peer(), e.cause());
    cause_ = e.what();
    failed_at_ = transport::now(ctx.network);
    return action::reform;
  }

  template <class Ctx>
  void reform(Ctx& ctx) {
    converge(ctx, std::nullopt);
  }

  const view& current() const { return view_; }
  // The group's changes as this peer saw them, the latest `changes_kept` (older ones are
  // dropped, so a run under churn for days stays the same size), and how many there were.
  const std::vector<membership_change>& changes() const { return changes_; }
  std::uint64_t change_count() const { return change_count_; }
  // State bytes this peer sent to members behind (and joiners) as a donor.
  std::uint64_t state_bytes_served() const { return served_; }
  // The heir this peer handed its unsent residual to when it stopped alone (-1: none).
  int handed_to() const { return handed_to_; }

 private:
  // Agrees on views (starting from `first` when given: a joiner's admission) until one holds:
  // every member installed it and those behind took the state of those at the target.
  template <class Ctx>
  void converge(Ctx& ctx, std::optional<decision> first) {
    auto& ep = ctx.network;
    bool healed = false, in_place = false;
    for (;;) {
      if (!first) (void)convict(ctx);  // woken by another's alarm: what this peer has seen counts too
      decision d;
      if (first) {
        d = std::move(*first);
      } else {
        for (int j : accused_) suspects_.emplace(j, transport::failure_cause::convicted);
        try {
          d = agree(ep, view_, suspects_, position{ctx.step, static_cast<std::int8_t>(ctx.at)}, agreement, &joiner_reach_);
        } catch (const left_out_error& e) {
          if (left_out == when_left_out::stop)
            throw left_out_error(decentrain::detail::concat(e.what(), "; it stops here (elastic::left_out = stop)"));
          d = rejoin(ctx, e.what());
        }
      }
      first.reset();
      suspects_.clear();
      take_handoffs(ctx, d);  // before install forgets what the removed peers sent
      const auto failed = install(ep, d, agreement);
      view_ = d.next;
      ctx.set_view(view_.epoch, view_.members);
      decentrain::detail::check(static_cast<int>(view_.members.size()) >= min_peers, "elastic: ",
                                view_.members.size(), " peer(s) left in view ", view_.epoch, ", fewer than min_peers = ",
                                min_peers);
      if (failed) {  // a member of the new view failed already: agree again, from it
        if (failed->peer() >= 0) suspects_.emplace(failed->peer(), failed->cause());
        note(record(ep, d, false));
        continue;
      }
      try {
        // A pipeline deals its parts out again over the new view (the trainer's redeal): those
        // behind take their new part from members at the target, as every member does.
        if (ctx.redeal) {
          ctx.redeal(d.behind, d.target.step, [this] { return saved_files(); });
          healed = std::find(d.behind.begin(), d.behind.end(), ep.rank()) != d.behind.end();
          ctx.at = static_cast<decltype(ctx.at)>(d.target.phase);
        } else {
          // A state taken lands in this peer's own tensors (which it then loads onto themselves):
          // no second copy of gigabytes, which a fresh process pays for page by page.
          const auto got = transfer_state(ep, d, [&] { return shared_state(ctx); }, agreement, [&] { return ctx.capture_views(); },
                                          &torn_);
          served_ += got.bytes_served;
          for (const auto& [j, how] : got.named) named_.emplace(j, how);
          if (got.state) {
            torn_ = true;  // the decode writes into this peer's tensors
            io::checkpoint taken;
            try {
              taken = io::decode_checkpoint(got.state->pieces(), "the state from peer(s) " + list(got.donors), got.state->into());
            } catch (const decentrain::error& e) {
              // A state that does not decode (its checksum fails): this peer stays torn, and takes
              // the state again in the next view, from others if the donor is left out.
              named_.emplace(got.reference, e.what());
              transport::fail_peer_because(transport::failure_cause::convicted, got.reference, "state", "elastic: ", e.what());
            }
            ctx.adopt(std::move(taken));
            torn_ = false;
            in_place = got.state->in_place();
            ctx.at = static_cast<decltype(ctx.at)>(d.target.phase);
            healed = true;
          }
        }
      } catch (const transport::peer_error& e) {
        if (e.peer() >= 0 && e.peer() != ep.rank()) suspects_.emplace(e.peer(), e.cause());
        note(record(ep, d, false));
        cause_ = e.what();  // why the next view is needed
        continue;
      }
      auto change = record(ep, d, healed);
      change.healed_in_place = in_place;
      for (const auto& [j, how] : named_) change.named.emplace(j, how);
      named_.clear();
      for (auto& [j, own] : inherited_) {  // after a state taken from a donor, which kept this peer's own
        try {
          ctx.absorb(own, decentrain::detail::concat("elastic: the handoff from peer ", j));
          change.inherited.push_back(j);
        } catch (const decentrain::error& e) {
          change.cause += decentrain::detail::concat("; ", e.what(), ": refused");
        }
      }
      inherited_.clear();
      note(std::move(change));
      for (int j : d.joined) join_tries_.erase(j);  // a later rejoin of its rank waits its grace again
      note_contributions(ctx);  // the tally's ranks are the new view's from here
      // A member this peer found guilty that the group kept (not enough of the others saw it so
      // yet): the accusation stands, in every report of this peer's from here, without starting
      // another agreement of its own; the evidence starts again.
      std::erase_if(accused_, [&](int j) { return !view_.contains(j); });
      for (auto& [j, h] : history_)
        if (view_.contains(j) && std::popcount(h & window()) >= exclusion.times) {
          accused_.insert(j);
          h = 0;
        }
      return;
    }
  }

  // Stopping alone: this peer's unsent residual to its heir (the next member after it that takes
  // the bytes), and none of it kept: its state, saved next by on_stop, holds none, so a restart of
  // this peer does not send it a second time (x + -x is exactly 0). Nothing here stops the
  // goodbye: a state that cannot be captured (a failed exchange in flight) or an heir that cannot
  // be reached leaves the residual with this peer, as a dead peer's.
  template <class Ctx>
  void hand_over_own(Ctx& ctx) {
    try {
      const auto own = own_tensors(ctx.capture());
      if (own.tensors.empty()) return;
      for (int heir : heirs_of(ctx.network.rank(), view_)) {
        try {
          hand_over_to(ctx.network, heir, own, agreement.state_chunk_bytes);
        } catch (const transport::peer_error&) {
          continue;  // gone: the survivors count the next member as the heir
        }
        handed_to_ = heir;
        auto minus = own;
        for (auto& [key, t] : minus.tensors) {
          auto v = t.template to_vector<float>();
          for (auto& x : v) x = -x;
          t = from_vector<cpu>(v, t.shape());
        }
        ctx.absorb(minus, "elastic: what this peer handed over");
        return;
      }
    } catch (const std::exception&) {
    }
  }

  // The handoffs of the removed members whose heir this peer is (in the view they left). Only
  // taken here (this peer's state is not touched before the view holds: a policy with an exchange
  // in flight cannot save it yet); checked against this peer's own state and added once the view
  // holds. What is malformed is refused and noted in the change's cause.
  template <class Ctx>
  void take_handoffs(Ctx& ctx, const decision& d) {
    if (!hand_over || !keeps_own_) return;  // no own state in this group's policy: nobody hands any over
    for (int j : d.removed) {
      if (d.next.bars(j) || heir_of(j, view_, d.removed) != ctx.network.rank() || inherited_.count(j)) continue;
      try {
        // The rest within half the agreement's deadline: the members wait for this peer's marker.
        if (auto h = take_handoff(ctx.network, j, agreement.max_state_bytes, handoff_wait, agreement.timeout / 2))
          inherited_.emplace(j, std::move(*h));
      } catch (const std::exception& e) {  // also what a hostile size would make the allocator throw
        cause_ += decentrain::detail::concat("; ", e.what(), ": refused");
      }
    }
  }

  // Left out (see left_out): forgets the old group, as the group forgot this peer, and waits to
  // be admitted as a joiner; the caller then installs the view and takes the group's state.
  template <class Ctx>
  decision rejoin(Ctx& ctx, const std::string& why) {
    auto& ep = ctx.network;
    for (int j : view_.members)
      if (j != ep.rank()) ep.forget(j);
    suspects_.clear();
    accused_.clear();
    cause_ = decentrain::detail::concat(why, "; it waited to be taken in again");
    try {
      return await_admission(ep, rejoin_timeout);
    } catch (const decentrain::error& e) {
      throw left_out_error(decentrain::detail::concat(why, "; it then waited ", rejoin_timeout.count(),
                                                      " ms to be taken in again, in vain: ", e.what()));
    }
  }

  // Brings each member's record of suspicious calls up to date with the policy's tally (its
  // ranks are the view's members in order), suspects every member found guilty, and returns the
  // first (-1: none).
  template <class Ctx>
  int convict(Ctx& ctx) {
    const collective::peer_tally* t = ctx.contributions;
    if (exclusion.times == 0 || t == nullptr) return -1;
    const std::int64_t calls = t->calls - seen_calls_;
    for (std::size_t i = 0; i < view_.members.size(); ++i) {
      const std::int64_t flagged = t->suspicious(i) - (i < seen_suspicious_.size() ? seen_suspicious_[i] : 0);
      auto& h = history_[view_.members[i]];
      for (std::int64_t k = 0; k < std::min<std::int64_t>(calls, 64); ++k)
        h = (h << 1) | (k < flagged ? 1u : 0u);  // the order within the new calls does not matter for a count
    }
    note_contributions(ctx);
    int first = -1;
    for (int j : view_.members) {  // every guilty member goes in the agreement
      if (j == ctx.network.rank() || accused_.count(j) || std::popcount(history_[j] & window()) < exclusion.times) continue;
      suspects_.emplace(j, transport::failure_cause::convicted);
      if (first < 0) first = j;
    }
    return first;
  }
  std::uint64_t window() const {
    return exclusion.of_last == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << exclusion.of_last) - 1;
  }
  template <class Ctx>
  void note_contributions(Ctx& ctx) {
    const collective::peer_tally* t = ctx.contributions;
    if (t == nullptr) return;
    seen_calls_ = t->calls;
    seen_suspicious_.resize(t->non_finite.size());
    for (std::size_t i = 0; i < seen_suspicious_.size(); ++i) seen_suspicious_[i] = t->suspicious(i);
  }

  bool saves() const { return !checkpoints.dir.empty(); }
  // The checkpoint files this peer sees in the group's folders (its own, and the others' where
  // the directory is shared); none without checkpoints.
  std::map<int, std::map<std::int64_t, std::filesystem::path>> saved_files() const {
    std::map<int, std::map<std::int64_t, std::filesystem::path>> files;
    if (!saves()) return files;
    for (int r = 0; r < folder_world_; ++r)
      for (auto s : checkpoints.saved_steps(r, folder_world_)) files[r][s] = checkpoints.file(r, folder_world_, s);
    return files;
  }

  // A joiner connected to this peer that is due an agreement: one that says (its hellos) it
  // reaches every member, half a second after it connected here (time to reach the other
  // members too), then at most once a second while the others do not reach it yet; and at most
  // one such agreement a second for all joiners. A joiner that never reaches every member (or
  // sends no hello) costs the group no agreement. -1: none.
  template <class Ctx>
  int ready_joiner(Ctx& ctx) {
    const auto now = transport::now(ctx.network);
    std::erase_if(joiner_reach_, [&](const auto& j) { return view_.contains(j.first); });
    if (last_join_ != std::chrono::steady_clock::time_point{} && now - last_join_ < std::chrono::seconds(1)) return -1;
    for (int j : ctx.network.connected()) {  // outside the view: a joiner
      if (view_.contains(j) || view_.bars(j)) continue;
      read_hellos(ctx.network, j, joiner_reach_);
      if (!reaches_all(joiner_reach_, j, view_)) continue;
      auto& [seen, last] = join_tries_[j];
      if (seen == std::chrono::steady_clock::time_point{}) seen = now;
      if (now - seen < std::chrono::milliseconds(500)) continue;
      if (last != std::chrono::steady_clock::time_point{} && now - last < std::chrono::seconds(1)) continue;
      last = last_join_ = now;
      return j;
    }
    return -1;
  }

  // A restarted group: every peer restores its own newest checkpoint (none: it starts from
  // step 0), and when they are of different steps the group agrees on a view as after a failure,
  // those behind taking the state of the furthest.
  template <class Ctx>
  void resume(Ctx& ctx) {
    const int rank = ctx.network.rank();
    std::int64_t step = ctx.steps_done;
    // This peer's newest checkpoint that reads back whole: a damaged newer one is passed over
    // (checkpoints.unreadable() says which), and the group converges as for any peers of
    // different steps. A step-0 file (stopped before the first step) is a fresh start: every peer
    // without files starts as that, and restoring it would start this one's policy as resumed
    // and the others' not.
    if (auto newest = checkpoints.newest_intact(rank, folder_world_); newest && newest->first > step) {
      step = newest->second.counter("step");
      ctx.restore(newest->second);
      ctx.step = ctx.steps_done = step;
    }
    std::string passed_over;
    for (const auto& [s, why] : checkpoints.unreadable())
      passed_over += decentrain::detail::concat("; this peer passed over its checkpoint of step ", s, ", which does not read back: ", why);
    std::int64_t range[2] = {step, -step};
    try {
      ctx.comm.all_reduce(std::span<std::int64_t>(range, 2), collective::reduce_op::max);
    } catch (const transport::peer_error& e) {
      // A peer that finished this all-reduce first found the steps differ and started the
      // agreement; its alarm can reach this one before the all-reduce's last message is taken.
      // Join the agreement (the start is outside the trainer's error routing).
      (void)on_error(ctx, e);
      cause_ = decentrain::detail::concat("the peers' newest checkpoints differ (this one's is of step ", step,
                                          "; another peer started the agreement: ", e.what(), ")", passed_over);
      converge(ctx, std::nullopt);
      return;
    }
    if (range[0] == -range[1]) return;
    cause_ = decentrain::detail::concat("the peers' newest checkpoints are of steps ", -range[1], " to ", range[0], passed_over);
    failed_at_ = transport::now(ctx.network);
    converge(ctx, std::nullopt);
  }

  // This peer's state as another takes it: without what stays with each peer (its rank, dropout
  // stream and byte count, and what its codec has not sent yet; adopt keeps its own), so members
  // that hold the same model encode the same bytes and can serve one joiner together, and no
  // unsent mass is taken over and sent twice. Encoded from views of this peer's memory, which
  // stays as it is while the state is served.
  template <class Ctx>
  static io::encoded_checkpoint shared_state(Ctx& ctx) {
    auto c = ctx.capture_views();
    c.rngs.erase("dropout");
    for (const char* own : {"trainer.rank", "trainer.world", "trainer.policy_bytes_sent"}) c.counters.erase(own);
    io::leave_out_own_state(c);
    return io::encoded_checkpoint(std::move(c));
  }
  static std::string list(const std::vector<int>& ranks) {
    std::string s;
    for (int r : ranks) {
      if (!s.empty()) s += ", ";
      s += std::to_string(r);
    }
    return s;
  }

  void note(membership_change c) {
    changes_.push_back(std::move(c));
    if (changes_.size() > changes_kept)
      changes_.erase(changes_.begin(), changes_.begin() + static_cast<std::ptrdiff_t>(changes_.size() - changes_kept));
    ++change_count_;
  }
  template <class E>
  membership_change record(const E& ep, const decision& d, bool healed) const {
    const auto now = transport::now(ep);
    auto c = membership_change{d.next.epoch, d.next.members, d.removed, d.joined, d.target.step, healed, cause_,
                               std::chrono::duration<double>(now - failed_at_).count(), now, {}, false, d.named};
    return c;
  }

  view view_;
  suspicions suspects_;
  std::vector<membership_change> changes_;
  std::uint64_t change_count_ = 0;
  std::string cause_;
  std::uint64_t served_ = 0;
  // A state transfer that failed after its first chunks had landed over this peer's own: until a
  // state is taken whole, this peer's own is not (fault::transfer_state).
  bool torn_ = false;
  int handed_to_ = -1;
  bool keeps_own_ = false;
  std::map<int, io::checkpoint> inherited_;  // handoffs taken, added once the view holds
  int folder_world_ = 0;  // the W of this peer's checkpoint folder
  // Per joiner seen connected: when it was first seen, and when it last started an agreement.
  std::map<int, std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>> join_tries_;
  std::chrono::steady_clock::time_point last_join_{};  // the last agreement a joiner started here
  joiner_reach joiner_reach_;  // what the joiners connected here say they reach
  std::map<int, std::string> named_;  // donors caught serving what their offer did not say, until recorded
  std::chrono::steady_clock::time_point failed_at_{};
  // Per world rank, whether each of its last (up to 64) aggregations found it suspicious (bit 0:
  // the latest); and the tally as last read (calls, and suspicious calls per rank of the view).
  std::map<int, std::uint64_t> history_;
  std::set<int> accused_;  // members this peer found guilty that the group kept: its accusation stands
  std::int64_t seen_calls_ = 0;
  std::vector<std::int64_t> seen_suspicious_;
};

}  // namespace decentrain::fault
