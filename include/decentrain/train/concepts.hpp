// Every slot of trainer<Model, CommPolicy, ParallelPolicy, FaultPolicy> on one page. Each
// check_*() static_asserts member by member (the one definition of a slot), so a policy that
// lacks a hook, or has it with another signature, is told which one and how it should read.
// `Ctx` is train::peer_context<Model>.
//
//   slot      opts in with                               members
//   Model     -                                          config_type; Model(const config_type&, rng&);
//                                                        parameter_list<D>& parameters()
//                                                        (optional: Model(const config_type&, rng&, const nn::part&),
//                                                        one stage's part, for a parallel policy that places
//                                                        several stages)
//   Comm      using policy_concept = comm::policy_tag;   void start(Ctx&); void after_backward(Ctx&);
//                                                        void after_step(Ctx&);
//                                                        void save(io::checkpoint&) const; void load(const io::checkpoint&)
//                                                        (optional: void drop_in_flight(), waits for what it
//                                                        runs in the background and drops it; called before
//                                                        the group changes;
//                                                        bool ends_round_at(std::int64_t step) const, where
//                                                        rounds end: joiners are taken in after them;
//                                                        std::int64_t catch_up(), the step this peer goes on
//                                                        from after the step just taken (0: the next; a round
//                                                        its group closed without it: diloco's deadline), and
//                                                        bool catches_up() const, whether it may skip steps;
//                                                        std::int64_t local_steps(std::int64_t step) const,
//                                                        the inner steps this peer takes in `step` (work
//                                                        sized to speed: diloco's sized_to_speed), each on
//                                                        rows of its own; its after_backward must then
//                                                        exchange nothing, unless
//                                                        bool accumulates() const says they are
//                                                        micro-batches of one step (sync's target_batch):
//                                                        their gradients add up (where the parallel
//                                                        policy's bool accumulates_gradients() const
//                                                        says it does) and after_backward and the
//                                                        optimizer run once, after the last;
//                                                        void size_state(Ctx&), its per-parameter state at
//                                                        the model's size before the fault policy starts,
//                                                        so that a state taken from a peer lands in it;
//                                                        static constexpr bool replicas_equal_after_step,
//                                                        true where every step leaves the replicas the same
//                                                        parameters: a pipeline's re-deal then takes a part
//                                                        from any replica, spreading the bytes;
//                                                        static constexpr bool replicas_differ, true where
//                                                        the replicas hold different parameters between
//                                                        exchanges (gossip): the trainer then measures their
//                                                        consensus distance at each evaluation;
//                                                        static constexpr bool asynchronous, true where
//                                                        peers do not wait for one another (ad_psgd): no
//                                                        fault policy that re-forms the group (reform);
//                                                        static constexpr std::array<const char*, N>
//                                                        per_parameter_state, keys of save()'s flat tensors
//                                                        laid out over the parameters, which a pipeline's
//                                                        re-deal moves with them)
//   Parallel  using policy_concept = parallel::policy_tag;  parallel::placement place(int rank, int world) const;
//                                                        parallel::step_result forward_backward(Ctx&);
//                                                        double evaluate(Ctx&, std::int64_t batch)
//                                                        (optional: static constexpr bool check_model<Ctx>(),
//                                                        what it needs of the model, asserted member by member;
//                                                        optim::norm_share grad_norm_share(Ctx&), the clipping
//                                                        norm's share of a peer holding a part of the model;
//                                                        int morph(int world, std::int64_t n_blocks), a new
//                                                        shape when the group re-forms, or void regroup(before,
//                                                        before_stages, after, n_blocks), places kept across
//                                                        views; void between_steps(Ctx&), where a placement
//                                                        may change (ctx.redeal); void after_averaging(Ctx&),
//                                                        after the comm policy's after_backward; save/load of
//                                                        its own state in the checkpoint; static constexpr bool
//                                                        weights_vary, the comm policy must then be `weighted`)
//   Fault     using policy_concept = fault::policy_tag;  void start(Ctx&); void after_step(Ctx&);
//                                                        fault::action on_error(Ctx&, const transport::peer_error&)
//                                                        (optional: void before_step(Ctx&); void reform(Ctx&);
//                                                        void on_stop(Ctx&); void leave(Ctx&))
//   Codec     (inside a comm policy; compress/codec.hpp) max_encoded_bytes, encode, decode_add
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <type_traits>

#include "decentrain/comm/policy.hpp"
#include "decentrain/compress/codec.hpp"
#include "decentrain/fault/policy.hpp"
#include "decentrain/io/checkpoint.hpp"
#include "decentrain/optim/clip.hpp"
#include "decentrain/parallel/policy.hpp"
#include "decentrain/train/context.hpp"

namespace decentrain::train {

template <class M>
constexpr bool check_model() {
  using D = model_device_t<M>;
  static_assert(requires { typename M::config_type; }, "trainer<Model, ...>: Model needs `using config_type = ...;`");
  if constexpr (requires { typename M::config_type; }) {
    static_assert(std::constructible_from<M, const typename M::config_type&, rng&>,
                  "trainer<Model, ...>: Model needs a constructor `Model(const config_type&, rng& init)`");
  }
  static_assert(requires(M& m) { { m.parameters() } -> std::same_as<parameter_list<D>&>; },
                "trainer<Model, ...>: Model needs `parameter_list<D>& parameters()`, D being Model::device_type "
                "(or dt::cpu when Model has none)");
  return true;
}

template <class P, class Ctx>
constexpr bool check_comm_policy() {
  static_assert(comm::declares_comm_policy<P>,
                "trainer<Model, CommPolicy, ...>: CommPolicy must declare `using policy_concept = decentrain::comm::policy_tag;` "
                "(is a parallel or fault policy in the communication slot? the order is <Model, Comm, Parallel, Fault>)");
  if constexpr (comm::declares_comm_policy<P>) {  // (else the tag alone is the error)
    static_assert(requires(P& p, Ctx& c) { p.start(c); },
                  "comm policy: needs `template <class Ctx> void start(Ctx&)` (once, before the first step)");
    static_assert(requires(P& p, Ctx& c) { p.after_backward(c); },
                  "comm policy: needs `template <class Ctx> void after_backward(Ctx&)` (every step, gradients computed)");
    static_assert(requires(P& p, Ctx& c) { p.after_step(c); },
                  "comm policy: needs `template <class Ctx> void after_step(Ctx&)` (every step, after the inner optimizer)");
    static_assert(requires(const P& p, io::checkpoint& out) { p.save(out); },
                  "comm policy: needs `void save(io::checkpoint&) const` (an empty body when it has no state)");
    static_assert(requires(P& p, const io::checkpoint& in) { p.load(in); },
                  "comm policy: needs `void load(const io::checkpoint&)` (an empty body when it has no state)");
    if constexpr (requires { &P::ends_round_at; })
      static_assert(requires(const P& p, std::int64_t step) { { p.ends_round_at(step) } -> std::convertible_to<bool>; },
                    "comm policy: ends_round_at must read `bool ends_round_at(std::int64_t step) const` (whether "
                    "after_step of `step` ends a round: the same answer on every peer)");
    if constexpr (requires { &P::local_steps; })
      static_assert(requires(const P& p, std::int64_t step) { { p.local_steps(step) } -> std::convertible_to<std::int64_t>; },
                    "comm policy: local_steps must read `std::int64_t local_steps(std::int64_t step) const` (the inner "
                    "steps this peer takes in `step`, at least 1)");
    if constexpr (requires { &P::catch_up; })
      static_assert(requires(P& p) { { p.catch_up() } -> std::convertible_to<std::int64_t>; },
                    "comm policy: catch_up must read `std::int64_t catch_up()` (the step this peer goes on from "
                    "after the step just taken, where its group is; 0: the next step)");
    if constexpr (requires { &P::catches_up; })
      static_assert(requires(const P& p) { { p.catches_up() } -> std::convertible_to<bool>; },
                    "comm policy: catches_up must read `bool catches_up() const` (whether catch_up may skip steps)");
    if constexpr (requires { &P::accumulates; })
      static_assert(requires(const P& p) { { p.accumulates() } -> std::convertible_to<bool>; },
                    "comm policy: accumulates must read `bool accumulates() const` (whether a step's inner steps are "
                    "micro-batches whose gradients add up, exchanged and stepped once)");
    if constexpr (requires { P::per_parameter_state; })
      static_assert(requires {
        std::string(*std::begin(P::per_parameter_state));
        std::integral_constant<std::size_t, std::size(P::per_parameter_state)>{};
      },
                    "comm policy: per_parameter_state must read `static constexpr std::array<const char*, N> "
                    "per_parameter_state` (keys of save()'s flat tensors laid out over the parameters, in their order)");
  }
  return true;
}

template <class P, class Ctx>
constexpr bool check_parallel_policy() {
  static_assert(parallel::declares_parallel_policy<P>,
                "trainer<Model, Comm, ParallelPolicy, ...>: ParallelPolicy must declare "
                "`using policy_concept = decentrain::parallel::policy_tag;` (for example parallel::data)");
  if constexpr (parallel::declares_parallel_policy<P>) {
    static_assert(requires(const P& p, int r) { { p.place(r, r) } -> std::same_as<parallel::placement>; },
                  "parallel policy: needs `parallel::placement place(int rank, int world) const` (its stage and replicas)");
    static_assert(requires(P& p, Ctx& c) { { p.forward_backward(c) } -> std::same_as<parallel::step_result>; },
                  "parallel policy: needs `template <class Ctx> parallel::step_result forward_backward(Ctx&)` "
                  "(one step's forward and backward, gradients left in the parameters)");
    static_assert(requires(P& p, Ctx& c, std::int64_t i) { { p.evaluate(c, i) } -> std::convertible_to<double>; },
                  "parallel policy: needs `template <class Ctx> double evaluate(Ctx&, std::int64_t batch)` "
                  "(the validation loss of one batch)");
    // What the policy needs of the model, where it says (parallel::data: a loss).
    if constexpr (requires { P::template check_model<Ctx>(); }) static_assert(P::template check_model<Ctx>());
    if constexpr (requires { &P::template grad_norm_share<Ctx>; })
      static_assert(requires(P& p, Ctx& c) { { p.grad_norm_share(c) } -> std::same_as<optim::norm_share>; },
                    "parallel policy: grad_norm_share must read `template <class Ctx> optim::norm_share grad_norm_share(Ctx&)` "
                    "(this peer's share of the clipping norm)");
  }
  return true;
}

template <class P, class Ctx>
constexpr bool check_fault_policy() {
  static_assert(fault::declares_fault_policy<P>,
                "trainer<Model, Comm, Parallel, FaultPolicy>: FaultPolicy must declare "
                "`using policy_concept = decentrain::fault::policy_tag;` (for example fault::none)");
  if constexpr (fault::declares_fault_policy<P>) {
    static_assert(requires(P& p, Ctx& c) { p.start(c); },
                  "fault policy: needs `template <class Ctx> void start(Ctx&)` (once, before anything is exchanged)");
    static_assert(requires(P& p, Ctx& c) { p.after_step(c); },
                  "fault policy: needs `template <class Ctx> void after_step(Ctx&)` (after every step)");
    static_assert(requires(P& p, Ctx& c, const transport::peer_error& e) { { p.on_error(c, e) } -> std::same_as<fault::action>; },
                  "fault policy: needs `template <class Ctx> fault::action on_error(Ctx&, const transport::peer_error&)` "
                  "(rethrow, redo or reform)");
  }
  return true;
}

// Every slot: the first policy not in its slot is the one error (policies in the wrong order
// would otherwise fail each slot's every member), else each slot member by member.
template <class M, class Comm, class Parallel, class Fault, class Ctx>
constexpr bool check_slots() {
  static_assert(check_model<M>());
  if constexpr (!comm::declares_comm_policy<Comm>)
    static_assert(check_comm_policy<Comm, Ctx>());
  else if constexpr (!parallel::declares_parallel_policy<Parallel>)
    static_assert(check_parallel_policy<Parallel, Ctx>());
  else if constexpr (!fault::declares_fault_policy<Fault>)
    static_assert(check_fault_policy<Fault, Ctx>());
  else {
    static_assert(check_comm_policy<Comm, Ctx>());
    static_assert(check_parallel_policy<Parallel, Ctx>());
    static_assert(check_fault_policy<Fault, Ctx>());
    // An asynchronous policy's peers stand at different steps; a fault policy that re-forms the
    // group (fault::elastic) agrees on one step for every member.
    if constexpr (requires { requires Comm::asynchronous; })
      static_assert(!requires(Fault& f, Ctx& c) { f.reform(c); },
                    "trainer: comm::ad_psgd and other asynchronous policies leave each peer at its own step, and this fault "
                    "policy re-forms the group at a step every member shares (fault::elastic): use fault::checkpoint_every "
                    "or fault::none");
  }
  return true;
}

template <class C>
constexpr bool check_codec() {
  return compress::check_codec<C>();
}

}  // namespace decentrain::train
