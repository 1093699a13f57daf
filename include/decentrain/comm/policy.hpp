// What a communication policy is: a struct of settings (and a codec) that opts in with
// `using policy_concept = comm::policy_tag;` and answers the trainer at the points it asks for.
// The trainer calls, per peer:
//   start(ctx)            once, before the first step (make every peer start from rank 0's model;
//                         prepare_codec checks that every replica uses the same codec settings
//                         and aggregator
//                         and tells a codec that works per matrix the parameters' shapes)
//   after_backward(ctx)   every step, gradients computed, before clipping and the optimizer
//   after_step(ctx)       every step, after the inner optimizer (ctx.last_step on the final one)
//   save(checkpoint&) const / load(const checkpoint&)   its own state, under "comm.<name>."
//   ends_round_at(step) const   (optional) whether after_step of `step` ends a round, a function
//                         of the step alone (the same answer on every peer): a fault policy takes
//                         joiners in at the start of the next step, where every replica stands
//                         at the same point. Without it, every step ends one.
// `ctx` is a train::peer_context: the parameters, ctx.replicas (the peers holding the same
// parameters, whom a policy averages with), ctx.comm (the whole world), the step. The helpers
// below gather and scatter parameters and gradients as one flat buffer. train/concepts.hpp
// checks each member; docs/guide.md has a whole policy written from scratch.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "decentrain/autograd/parameters.hpp"
#include "decentrain/collective/aggregators.hpp"
#include "decentrain/collective/communicator.hpp"
#include "decentrain/collective/encoded_all_reduce.hpp"
#include "decentrain/compress/codec.hpp"
#include "decentrain/compress/identity.hpp"
#include "decentrain/compress/layout.hpp"
#include "decentrain/core/factory.hpp"
#include "decentrain/detail/hash.hpp"
#include "decentrain/detail/meta.hpp"
#include "decentrain/io/checkpoint.hpp"

namespace decentrain::comm {

struct policy_tag {};

template <class P>
concept declares_comm_policy = decentrain::detail::opts_into<P, policy_tag>;

// Parameters and gradients as one flat f32 buffer on the host, in parameter-list order, so one
// collective call moves all of them (fewer, larger messages than one per tensor). On the CPU
// each tensor is copied straight into or out of the host buffer; on a GPU the tensors are first
// packed into one device buffer, so the host transfer (which synchronises) happens once.
template <class Device>
std::size_t flat_size(const parameter_list<Device>& params) { return static_cast<std::size_t>(params.numel()); }

namespace detail {
// Calls f(tensor, offset) for each parameter's value (or gradient, when `grads`), offsets in
// elements of the flat buffer; a missing gradient is passed as an undefined tensor.
template <class Device, class F>
void for_each_flat(const parameter_list<Device>& params, bool grads, F&& f) {
  std::size_t at = 0;
  for (const auto& e : params) {
    const auto& v = e.param.value();
    decentrain::detail::check(v.dtype() == dtype::f32 && v.is_contiguous(), "comm: parameter '", e.name,
                              "' must be a contiguous f32 tensor to be communicated");
    if (grads && e.param.grad().defined())
      decentrain::detail::check(e.param.grad().dtype() == dtype::f32, "comm: the gradient of '", e.name, "' must be f32");
    f(grads ? e.param.grad() : v, at, static_cast<std::size_t>(v.numel()));
    at += static_cast<std::size_t>(v.numel());
  }
}

template <class Device>
void gather_flat(const parameter_list<Device>& params, bool grads, std::vector<float>& out) {
  out.resize(flat_size(params));
  if constexpr (std::is_same_v<Device, cpu>) {
    for_each_flat(params, grads, [&](const tensor<cpu>& t, std::size_t at, std::size_t n) {
      if (t.defined()) std::memcpy(out.data() + at, t.contiguous().template data<float>(), n * sizeof(float));
      else std::fill_n(out.data() + at, n, 0.0f);  // a parameter unused this step contributes zeros
    });
  } else {
    auto flat = zeros<Device>(shape{static_cast<std::int64_t>(out.size())}, dtype::f32);
    for_each_flat(params, grads, [&](const tensor<Device>& t, std::size_t at, std::size_t n) {
      const auto a = static_cast<std::int64_t>(at), b = static_cast<std::int64_t>(at + n);
      if (t.defined()) flat.slice(0, a, b).copy_from(t.reshape({b - a}));
    });
    memory<Device>::copy_to_host(out.data(), flat.raw_data(), flat.nbytes());
  }
}

template <class Device>
void scatter_flat(parameter_list<Device>& params, bool grads, std::span<const float> in) {
  if (grads)
    for (auto& e : params)
      if (!e.param.grad().defined()) e.param.grad() = zeros<Device>(e.param.shape(), dtype::f32);
  if constexpr (std::is_same_v<Device, cpu>) {
    for_each_flat(params, grads, [&](const tensor<cpu>& t, std::size_t at, std::size_t n) {
      decentrain::detail::check(t.is_contiguous(), "comm: a gradient is not contiguous");
      std::memcpy(t.template data<float>(), in.data() + at, n * sizeof(float));
    });
  } else {
    auto flat = tensor<Device>::empty(shape{static_cast<std::int64_t>(in.size())}, dtype::f32);
    memory<Device>::copy_from_host(flat.raw_data(), in.data(), flat.nbytes());
    for_each_flat(params, grads, [&](const tensor<Device>& t, std::size_t at, std::size_t n) {
      auto target = t;  // a handle on the same storage
      target.copy_from(flat.slice(0, static_cast<std::int64_t>(at), static_cast<std::int64_t>(at + n)).reshape(t.shape()));
    });
  }
}
}  // namespace detail

template <class Device>
void gather_values(const parameter_list<Device>& params, std::vector<float>& out) { detail::gather_flat(params, false, out); }
template <class Device>
void scatter_values(parameter_list<Device>& params, std::span<const float> in) { detail::scatter_flat(params, false, in); }
// A parameter without a gradient (unused this step) contributes zeros.
template <class Device>
void gather_grads(const parameter_list<Device>& params, std::vector<float>& out) { detail::gather_flat(params, true, out); }
template <class Device>
void scatter_grads(parameter_list<Device>& params, std::span<const float> in) { detail::scatter_flat(params, true, in); }

// Periodic policies communicate after every `inner_steps`-th step, and after the last one.
inline bool ends_round(std::int64_t step, std::int64_t inner_steps) { return (step + 1) % inner_steps == 0; }
template <class Ctx>
bool ends_round(const Ctx& ctx, std::int64_t inner_steps) {
  return ends_round(ctx.step, inner_steps) || ctx.last_step;
}

// Weighted averaging (a policy's `weighted`): its weight, where it weighs, for
// collective::encoded_all_reduce, which weighs each replica's contribution by what it says (under the
// mean by scaling, w R / (w_1 + ... + w_R); any other aggregator gets the weights, capped).
inline std::optional<double> weight_if(bool weighted, double weight) {
  return weighted ? std::optional<double>(weight) : std::nullopt;
}
// In a policy's start: an aggregator that cannot weigh contributions is refused by name.
template <class Aggregator>
void check_weighs(const Aggregator& aggregator, bool weighted, const char* who) {
  decentrain::detail::check(!weighted || collective::averages_in_flight(aggregator) || collective::can_weigh<Aggregator>(), who,
                            ": weighted averaging with aggregator '", collective::describe_aggregator(aggregator),
                            "', which cannot weigh contributions (mean, median, trimmed-mean, centered-clip, and bucketing ",
                            "or partitioned of those, can)");
}

// A replica's weight over a round of a periodic policy: the sum of its steps' ctx.step_weight
// (each step once, though the trainer calls after_step again after a failed exchange), kept in
// the policy's checkpoint so that a resumed round weighs what the uninterrupted one does.
// A non-negative double in a checkpoint, exactly (counters are integers): as text. Reading a
// key that is not there gives nullopt; one that is not such a number is refused, naming `what`.
inline void save_exact(io::checkpoint& c, const std::string& key, double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", v);
  c.text[key] = text;
}
inline std::optional<double> load_exact(const io::checkpoint& c, const std::string& key, const char* what) {
  const auto it = c.text.find(key);
  if (it == c.text.end()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  decentrain::detail::check(end != it->second.c_str() && *end == '\0' && std::isfinite(v) && v >= 0, "checkpoint: '", key,
                            "' is '", it->second, "', not ", what);
  return v;
}

struct round_weight {
  double sum = 0;
  std::int64_t through = -1;  // the last step counted

  template <class Ctx>
  void add(const Ctx& ctx) {
    if (ctx.step <= through) return;
    sum += ctx.step_weight;
    through = ctx.step;
  }
  void save(io::checkpoint& c, const std::string& prefix) const {
    save_exact(c, prefix + "round_weight", sum);
    c.counters[prefix + "round_weight_through"] = through;
  }
  // A checkpoint without them (written before policies weighed rounds) starts the round at 0.
  void load(const io::checkpoint& c, const std::string& prefix) {
    const auto at = c.counters.find(prefix + "round_weight_through");
    through = at == c.counters.end() ? -1 : at->second;
    sum = load_exact(c, prefix + "round_weight", "a weight").value_or(0.0);
  }
};

// Work sized to speed (a periodic policy's sized_to_speed, DyLU): each replica takes as many
// inner steps as fit before the round's deadline, the time the slowest replica needs for one
// inner step a step of the round. The replicas agree on the slowest one's seconds per inner step
// at each round's end; during the round each step takes its share of what still fits: the
// seconds left to the deadline over this replica's seconds per inner step (measured so far this
// round), spread over the round's steps left. A step that ran slow is made up by the steps after
// it, so measurements that wander from round to round (peers sharing cores, caches, clocks)
// cost little waiting; the slowest replica, one inner step a step, also takes more where it ran
// fast. A share is a whole number of inner steps: of the two next to the spread, a step takes the
// one that ends it nearer the slowest replica's pace (the deadline less the steps after it at the
// slowest one's seconds), so a 1.22x replica takes 1, 1, 1, 1, 2, ... and keeps within half an
// inner step of the slowest one all through the round (each step's spread rounded alone, it
// would take 1 until past mid-round and run ahead by the clock, to wait where an exchange lands
// mid-round: streaming_diloco's). Seconds are compute seconds on this peer's clock.
struct speed_sizing {
  static constexpr std::int64_t max_ratio = 64;  // the most inner steps a step
  double compute_s = 0;          // compute seconds of the inner steps since the sizing, on this peer's clock
  std::int64_t steps = 0;        // inner steps taken since the sizing
  std::int64_t round_steps = 0;  // inner steps a whole round was planned at when sized (0: not sized yet)
  double deadline_s = 0;         // compute seconds from the sizing to the round's end (0: not sized)
  double per_step_s = 0;         // this replica's seconds per inner step at the sizing
  double slowest_s = 0;          // the slowest replica's, agreed at the sizing
  bool agreed = false;           // slowest_s is the agreed figure (a peer's that is not a number: this one's own)
  std::int64_t through = -1;     // the last step counted (a redone after_step counts once)
  // The deadline's margin over the slowest replica's time, a share of it (the policy's setting:
  // diloco's headroom; not state, a load keeps it).
  double headroom = 0;

  template <class Ctx>
  void add(const Ctx& ctx) {
    if (ctx.step <= through) return;
    compute_s += ctx.step_compute_s;
    steps += ctx.local_steps;
    through = ctx.step;
  }
  // The inner steps of a step with `steps_left` steps of the round left, this one included: 1
  // until sized; then its share of the inner steps that fit before the deadline, rounded towards
  // the slowest replica's pace (at least 1, at most max_ratio).
  std::int64_t share(std::int64_t steps_left) const {
    if (deadline_s <= 0 || steps_left < 1) return 1;
    const double each = steps > 0 && compute_s > 0 ? compute_s / static_cast<double>(steps) : per_step_s;
    if (!(each > 0)) return 1;
    const double fit = std::max(0.0, deadline_s - compute_s) / each;
    const double spread = std::min(fit / static_cast<double>(steps_left), static_cast<double>(max_ratio));
    if (!(step_s() > 0)) return std::clamp<std::int64_t>(std::llround(spread), 1, max_ratio);  // a state loaded without speeds
    const double below = std::floor(spread);
    // Where this step should end: the steps after it at the slowest one's seconds before the deadline.
    const double pace = deadline_s - static_cast<double>(steps_left - 1) * step_s();
    const double behind = (pace - compute_s) / each - below;  // inner steps short of the pace after `below`
    return std::clamp<std::int64_t>(static_cast<std::int64_t>(below) + (behind > 0.5 ? 1 : 0), 1, max_ratio);
  }
  // After a step with `steps_left` of the round's `inner_steps` steps after it (a round's end:
  // all of the next round's): the replicas agree on the slowest one's seconds per inner step (one
  // all-reduce of a double, which also leaves them at about one time, and carries the largest of
  // each of `also_max`: up to 3 more values the caller agrees on), and the deadline is steps_left
  // of them. Nothing measured (no compute clock): not sized, one inner step a step. A value that
  // is not a number (from a peer) counts as this replica's own.
  template <class Ctx>
  void next_round(Ctx& ctx, std::int64_t inner_steps, std::int64_t steps_left, std::span<double> also_max = {}) {
    decentrain::detail::check(also_max.size() <= 3, "speed_sizing: at most 3 values ride along, got ", also_max.size());
    std::array<double, 4> values{seconds_per_step(), 0, 0, 0};
    std::copy(also_max.begin(), also_max.end(), values.begin() + 1);
    ctx.replicas.all_reduce(std::span<double>(values.data(), 1 + also_max.size()), collective::reduce_op::max);
    std::copy_n(values.begin() + 1, also_max.size(), also_max.begin());
    next_round_from(values[0], seconds_per_step(), inner_steps, steps_left);
  }
  // As next_round, with the slowest replica's seconds per inner step agreed otherwise (the
  // leader of a round with a deadline hands it out) and this replica's own as measured (a
  // round's typical step, say).
  void next_round_from(double slowest, double mine, std::int64_t inner_steps, std::int64_t steps_left) {
    agreed = std::isfinite(slowest);
    slowest_s = agreed ? slowest : mine;
    compute_s = 0;
    steps = 0;
    per_step_s = mine;
    set_round(inner_steps, steps_left);
  }
  // As next_round_from, for the rest of a round of which `done` steps were taken unsized (one
  // inner step a step, while the speeds' agreement was in flight): the deadline counts from the
  // round's start, so a replica that ran ahead meanwhile has that much less to fill. Sized after
  // the round's first step, as a waited-for agreement sizes, the deadline is that of the steps left.
  // What was counted before the round (a first pick that set rounds shorter than the steps taken
  // unsized) is no part of it: the round's share of the count, its `done` steps' (each one inner
  // step), is what it spent.
  void rest_of_round_from(double slowest, double mine, std::int64_t inner_steps, std::int64_t steps_left, std::int64_t done) {
    done = std::min(done, steps);
    const double spent = steps > 0 ? compute_s * static_cast<double>(done) / static_cast<double>(steps) : 0.0;
    next_round_from(slowest, mine, inner_steps, steps_left);
    if (done > 1 && deadline_s > 0)
      deadline_s = std::max(0.0, deadline_s + static_cast<double>(done) * step_s() - spent);
  }
  // Unmeasured again (a fresh run), keeping the policy's headroom.
  void reset() {
    const double margin = headroom;
    *this = {};
    headroom = margin;
  }
  // Forgets what was counted since the sizing: a step whose time is not the replica's speed (a
  // run's first: caches filling, memory allocated).
  void discard_measure() {
    compute_s = 0;
    steps = 0;
  }
  // This replica's seconds per inner step as measured (since the sizing, else at it; 0: none).
  double pace() const { return steps > 0 && compute_s > 0 ? compute_s / static_cast<double>(steps) : per_step_s; }
  // This replica's seconds per inner step since the sizing (0: none taken).
  double seconds_per_step() const { return steps > 0 ? compute_s / static_cast<double>(steps) : 0.0; }
  // The deadline again for a round of `inner_steps` with `steps_left` after this step (a tuned
  // policy's new H), from the speeds agreed last.
  void set_round(std::int64_t inner_steps, std::int64_t steps_left) {
    if (!(per_step_s > 0) || !(slowest_s > 0)) {
      deadline_s = per_step_s = 0;
      round_steps = inner_steps;
      return;
    }
    deadline_s = static_cast<double>(steps_left) * step_s();
    plan_round(inner_steps);
  }
  // Mid-round, a tuned policy's new rounds (streaming_diloco): the round running now has `more`
  // steps left than it was sized for (fewer where negative), and its deadline moves by as many
  // of the slowest replica's steps (this replica's own where none is known: a state saved before
  // the slowest was). What the replica has filled of it so far, and a lead made up (clock_lead),
  // stay counted. Not sized yet: the first sizing counts the new round.
  void shift_round(std::int64_t inner_steps, std::int64_t more) {
    if (round_steps == 0) return;
    if (deadline_s > 0 && per_step_s > 0) {
      deadline_s = std::max(0.0, deadline_s + static_cast<double>(more) * step_s());
      plan_round(inner_steps);
    } else {
      round_steps = inner_steps;
    }
  }
  void save(io::checkpoint& c, const std::string& prefix) const {
    save_exact(c, prefix + "speed_compute_s", compute_s);
    save_exact(c, prefix + "speed_slowest_s", slowest_s);
    save_exact(c, prefix + "speed_deadline_s", deadline_s);
    save_exact(c, prefix + "speed_per_step_s", per_step_s);
    c.counters[prefix + "speed_steps"] = steps;
    c.counters[prefix + "speed_round_steps"] = round_steps;
    c.counters[prefix + "speed_through"] = through;
  }
  // A checkpoint without them (written before sizing, or by a replica that did not size) starts
  // unmeasured; one without a deadline (written before deadlines) takes one inner step a step
  // until the round's end. Another replica's state (one handed over: fault::elastic's adopt)
  // brings the round's time left, not the pace: see go_on_at_own_pace.
  void load(const io::checkpoint& c, const std::string& prefix) {
    const double own = pace();
    reset();
    const auto seconds = load_exact(c, prefix + "speed_compute_s", "a number of seconds");
    if (!seconds) return;
    compute_s = *seconds;
    deadline_s = load_exact(c, prefix + "speed_deadline_s", "a number of seconds").value_or(0.0);
    per_step_s = load_exact(c, prefix + "speed_per_step_s", "a number of seconds").value_or(0.0);
    slowest_s = load_exact(c, prefix + "speed_slowest_s", "a number of seconds").value_or(0.0);
    steps = c.counter(prefix + "speed_steps");
    round_steps = c.counter(prefix + "speed_round_steps");
    through = c.counter(prefix + "speed_through");
    decentrain::detail::check(steps >= 0 && round_steps >= 0, "checkpoint: '", prefix, "speed_steps' (", steps, ") or '",
                              prefix, "speed_round_steps' (", round_steps, ") is negative");
    if (io::leaves_out_own_state(c)) go_on_at_own_pace(own);
  }

 private:
  // A step's seconds: the slowest replica's inner step (this one's, where it measured slower),
  // and the margin.
  double step_s() const { return std::max(slowest_s, per_step_s) * (1 + headroom); }
  // A state taken from another replica mid-round (loaded over this one's, whose pace was `own`):
  // the round's time left is the donor's deadline less what it computed, and this replica fills
  // it at its own pace, not the donor's. Taken as it stood, a fast replica would plan at a slow
  // donor's pace for the rest of the round, and report that pace as its own at the round's end,
  // where the slowest replica's sizes every replica's next round. A replica with no pace yet (a
  // joiner) plans at the donor's until its own steps measure it.
  void go_on_at_own_pace(double own) {
    const double donor = pace(), left = std::max(0.0, deadline_s - compute_s);
    compute_s = 0;
    steps = 0;
    per_step_s = own > 0 ? own : donor;
    if (deadline_s > 0) deadline_s = left;
    if (round_steps > 0 && donor > 0 && per_step_s > 0) {
      const double faster = std::clamp(donor / per_step_s, 1.0 / max_ratio, static_cast<double>(max_ratio));
      round_steps = std::max<std::int64_t>(1, std::llround(static_cast<double>(round_steps) * faster));
    }
  }
  void plan_round(std::int64_t inner_steps) {
    round_steps = std::min(max_ratio * inner_steps,
                           std::max<std::int64_t>(inner_steps, std::llround(static_cast<double>(inner_steps) * step_s() / per_step_s)));
  }
};

// Sized to speed where a round's end holds nobody (streaming_diloco: the exchanges run beside
// the next round): a replica that reaches a round's end before the slowest one goes on, so what
// it ends short of the slowest (which takes one inner step a step at least, and overshoots the
// deadline in a round it runs slower than agreed; whose cold first step is longer too) adds up
// round after round, a lead by the clock that the run's last exchange, with nothing left to hide
// behind, spends waiting. Each replica's clock rides with the speeds' agreement (their maximum:
// the latest replica's); once it lands, the lead it shows, less what the replica waited since (a
// landing that held it caught up that much) and less a lengthening the clock sent did not show
// yet, lengthens the deadline of the round then running. Waits are the clock's time that was not
// compute, counted step by step. Nothing of it is saved: a state loaded (a resume, a state taken
// from another replica) awaits no reading, as the clocks it would compare are not this run's, and
// the next round's end sends afresh.
struct clock_lead {
  double sent_s = -1;    // this replica's clock sent to the agreement, its reading awaited (-1: none)
  double waited_s = 0;   // of its clock since then, the time not computing
  double unseen_s = 0;   // the lengthening of the round the clock sent starts (none where it was read mid-round)
  double mark_s = -1;    // the clock when the last after_step ended (-1: not read since the start; not saved)
  std::int64_t through = -1;  // the last step whose compute was counted (a redone after_step counts once)

  // At the start of after_step: the clock since the last one ended, less the step's compute.
  void arrive(std::int64_t step, double clock_s, double step_compute_s) {
    if (step <= through) step_compute_s = 0;
    through = std::max(through, step);
    if (mark_s >= 0) waited_s += std::max(0.0, clock_s - mark_s - step_compute_s);
    mark_s = clock_s;
  }
  // Later in it, or at its end: the time since the last reading (an agreement that ran in place,
  // the landings that held the replica) counts as waiting.
  void until(double clock_s) {
    if (mark_s >= 0) waited_s += std::max(0.0, clock_s - mark_s);
    mark_s = clock_s;
  }
  bool awaited() const { return sent_s >= 0; }
  // With the clock now and the latest clock the agreement came back with (nullopt: none landed,
  // it was not a number, or this replica's clock is not the group's): the lengthening of the
  // deadline of the round now running, or where `round_end`, of the one it starts; at most
  // `cap_s` (a round's deadline: a lead longer than a round is no drift, and a peer that lies
  // about its clock costs no more than that). 0 where no reading was awaited.
  double make_up(std::optional<double> latest_s, double clock_s, double cap_s, bool round_end) {
    until(clock_s);
    double lead = 0;
    if (latest_s && awaited()) lead = std::max(0.0, *latest_s - sent_s) - unseen_s - waited_s;
    const double extra = std::clamp(lead, 0.0, std::max(0.0, cap_s));
    sent_s = -1;
    unseen_s = round_end ? extra : 0.0;
    return extra;
  }
  // `clock_s` (read at arrive) goes to the agreement: the waits count from there.
  void sent(double clock_s) {
    sent_s = clock_s;
    waited_s = mark_s >= 0 ? std::max(0.0, mark_s - clock_s) : 0.0;
  }
};

// A target batch (a synchronous policy's target_batch: hivemind's rule): a step ends once the
// replicas together have trained on the target's rows, each taking micro-batches as its speed
// allows, so none waits long for the slowest. Each replica measures what a micro-batch costs it
// (its forward and backward passes) and what a step costs it besides (the optimizer, the clip);
// the replicas exchange those (an all-gather of two numbers each) after steps 0, every - 1,
// 2 every - 1, ..., and after any step at which the group is not the one of the last deal
// (fault::elastic: peers left or joined); until the first, each takes an equal share. The
// target's micro-batches are dealt so that the step's longest compute is least (shares()), the
// same on every replica.
struct batch_sizing {
  // What a replica's step costs it: fixed_s + k x batch_s for k micro-batches (compute seconds).
  struct cost {
    double batch_s = 0, fixed_s = 0;
  };
  std::int64_t every = 10;     // steps between exchanges of the costs
  double passes_s = 0;         // since the last exchange: the micro-batches' compute seconds,
  double fixed_s = 0;          // the rest of the steps' compute seconds,
  std::int64_t taken = 0;      // the micro-batches,
  std::int64_t steps = 0;      // and the steps
  std::int64_t current = 0;    // this replica's micro-batches a step (0: an equal share, not sized yet)
  std::int64_t through = -1;   // the last step counted (a redone after_step counts once)
  std::int64_t group = 0;      // the group's size at the last deal (0: none yet)

  // Micro-batches this replica takes in a step, of `total` for the group of `world`.
  std::int64_t share(std::int64_t total, int world) const {
    return current > 0 ? current : (total + world - 1) / world;
  }
  // `total` micro-batches dealt to replicas of these costs so that the longest of their steps,
  // fixed_s + k batch_s, is least, at least one each: the level of time at which they would have
  // taken the total (bisected), then each next one to the replica that would finish it soonest
  // (the lowest rank on a tie). A cost that is not a number, or a micro-batch that costs nothing
  // (unmeasured, or from a peer that lies), gives every replica an equal share.
  static std::vector<std::int64_t> shares(std::int64_t total, const std::vector<cost>& costs) {
    const auto n = static_cast<std::int64_t>(costs.size());
    std::vector<std::int64_t> k(costs.size(), (total + n - 1) / n);
    double hi = 0;
    for (const auto& c : costs) {
      if (!(c.batch_s > 0) || !std::isfinite(c.batch_s) || !(c.fixed_s >= 0) || !std::isfinite(c.fixed_s)) return k;
      hi = std::max(hi, c.fixed_s + static_cast<double>(total) * c.batch_s);
    }
    if (!std::isfinite(hi)) return k;
    // Micro-batches each replica finishes by time t (at least one, at most the total), and their sum.
    const auto by = [&](double t) {
      std::int64_t sum = 0;
      for (std::size_t i = 0; i < k.size(); ++i) {
        const double fit = std::floor((t - costs[i].fixed_s) / costs[i].batch_s);
        k[i] = fit < 1 ? 1 : fit > static_cast<double>(total) ? total : static_cast<std::int64_t>(fit);
        sum += k[i];
      }
      return sum;
    };
    double lo = 0;
    for (int i = 0; i < 200 && lo < hi; ++i) {
      const double mid = lo + (hi - lo) / 2;
      if (mid <= lo || mid >= hi) break;
      (by(mid) >= total ? hi : lo) = mid;
    }
    for (std::int64_t dealt = by(lo); dealt < total; ++dealt) {
      std::size_t soonest = 0;
      const auto finish = [&](std::size_t i) { return costs[i].fixed_s + static_cast<double>(k[i] + 1) * costs[i].batch_s; };
      for (std::size_t i = 1; i < k.size(); ++i)
        if (finish(i) < finish(soonest)) soonest = i;
      ++k[soonest];
    }
    return k;
  }
  // After a step: counts it (once, though a failed after_step is redone), then deals where it is
  // time to (every replica alike: the step, and the group's size, which a joiner takes with the
  // state; a deal that failed is done again with the redone after_step).
  template <class Ctx>
  void add(Ctx& ctx, std::int64_t total) {
    if (ctx.step > through) {
      through = ctx.step;
      passes_s += ctx.step_passes_s;
      fixed_s += ctx.step_compute_s - ctx.step_passes_s;
      taken += ctx.local_steps;
      ++steps;
    }
    if (ctx.step != 0 && (ctx.step + 1) % every != 0 && ctx.replicas.world() == group) return;
    const cost mine{taken > 0 ? passes_s / static_cast<double>(taken) : 0.0,
                    steps > 0 ? std::max(0.0, fixed_s / static_cast<double>(steps)) : 0.0};
    const auto costs = ctx.replicas.all_gather(std::span<const cost>(&mine, 1));
    current = shares(total, costs)[static_cast<std::size_t>(ctx.replicas.rank())];
    group = ctx.replicas.world();
    // (member by member: nvcc 13's front end drops the designators of a designated initializer
    // holding a dependent expression in a template, and fills the members in order)
    passes_s = fixed_s = 0;
    taken = steps = 0;
  }
  void save(io::checkpoint& c, const std::string& prefix) const {
    save_exact(c, prefix + "batch_passes_s", passes_s);
    save_exact(c, prefix + "batch_fixed_s", fixed_s);
    c.counters[prefix + "batch_taken"] = taken;
    c.counters[prefix + "batch_steps"] = steps;
    c.counters[prefix + "batch_current"] = current;
    c.counters[prefix + "batch_through"] = through;
    c.counters[prefix + "batch_group"] = group;
  }
  // A checkpoint without them (written without a target batch) starts unmeasured (its period kept).
  void load(const io::checkpoint& c, const std::string& prefix) {
    const auto keep = every;
    *this = {};
    every = keep;
    const auto passes = load_exact(c, prefix + "batch_passes_s", "a number of seconds");
    if (!passes) return;
    passes_s = *passes;
    fixed_s = load_exact(c, prefix + "batch_fixed_s", "a number of seconds").value_or(0.0);
    taken = c.counter(prefix + "batch_taken");
    steps = c.counter(prefix + "batch_steps");
    current = c.counter(prefix + "batch_current");
    through = c.counter(prefix + "batch_through");
    group = c.counters.contains(prefix + "batch_group") ? c.counter(prefix + "batch_group") : 0;
    decentrain::detail::check(taken >= 0 && steps >= 0 && current >= 0, "checkpoint: '", prefix, "batch_taken' (", taken,
                              "), '", prefix, "batch_steps' (", steps, ") or '", prefix, "batch_current' (", current,
                              ") is negative");
  }
};

// Every replica must use the same settings (`settings`: a policy's graph, period, ...), or the
// sends of one meet receives of another that never come: one 16-byte comparison, and where they
// differ every peer fails with "<mismatch> (this one: <settings>); every peer must use <what>".
// A joiner's settings were the members' when it was admitted: it compares nothing.
template <class Ctx>
void check_same_settings(Ctx& ctx, const std::string& settings, const char* mismatch, const char* what) {
  if (ctx.joined) return;
  decentrain::detail::check(ctx.replicas.all_same(decentrain::detail::fnv1a(settings)), mismatch, " (this one: ", settings,
                            "); every peer must use ", what);
}

// Makes every replica hold the first replica's parameters. Peers seeded alike already hold the
// same bits: a 16-byte comparison of the parameters' hashes finds that, and the whole model goes
// out from the first replica only when they differ (on a slow link, megabytes not sent).
template <class Ctx>
void broadcast_parameters(Ctx& ctx, std::vector<float>& buffer) {
  gather_values(ctx.parameters, buffer);
  if (ctx.replicas.all_same(decentrain::detail::hash_words(std::as_bytes(std::span<const float>(buffer))))) return;
  ctx.replicas.broadcast(std::span<float>(buffer), 0);
  scatter_values(ctx.parameters, buffer);
}

// What a policy does with its codec and aggregator in start(): every replica must use the same
// codec settings and combine alike (one 16-byte comparison; where they differ, every peer fails
// naming what differs), and a codec that works per matrix learns the parameters' shapes.
template <class Device>
compress::layout layout_of(const parameter_list<Device>& params) {
  compress::layout l;
  std::size_t at = 0;
  for (const auto& e : params) {
    const auto& s = e.param.value().shape();
    const auto n = static_cast<std::size_t>(s.numel());
    const std::size_t cols = s.rank() ? static_cast<std::size_t>(s[s.rank() - 1]) : 1;
    l.push_back({at, cols ? n / cols : 0, cols});
    at += n;
  }
  return l;
}
// `combining` names anything else in how the replicas combine that all must share (DiLoCo's
// Moshpit grid), compared in the same 16 bytes.
template <class Codec, class Aggregator, class Ctx>
void prepare_codec(Codec& codec, const Aggregator& aggregator, Ctx& ctx, const std::string& combining = "") {
  static_assert(collective::check_aggregator<Aggregator>());
  if (!ctx.joined) {  // a joiner's members are mid-run
    const std::string aggregation = collective::describe_aggregator(aggregator) + combining;
    if (!ctx.replicas.all_same(decentrain::detail::fnv1a(compress::describe(codec) + " | " + aggregation))) {
      collective::agree_codec(codec, ctx.replicas);  // fails naming every peer's codec, where those differ
      decentrain::detail::fail("aggregator: the peers combine contributions differently (this one uses '", aggregation,
                               "'); every peer must use the same aggregator");
    }
  }
  compress::set_layout(codec, layout_of(ctx.parameters));
}
template <class Codec, class Ctx>
void prepare_codec(Codec& codec, Ctx& ctx) {
  prepare_codec(codec, collective::mean{}, ctx);
}

// A codec's state in the policy's checkpoint, where the codec has any.
template <class Codec>
void save_codec(const Codec& codec, io::checkpoint& c, const std::string& prefix) {
  if constexpr (requires { codec.save(c, prefix); }) codec.save(c, prefix);
}
template <class Codec>
void load_codec(Codec& codec, const io::checkpoint& c, const std::string& prefix) {
  if constexpr (requires { codec.load(c, prefix); }) codec.load(c, prefix);
}

// `v` as a tensor of checkpoint `c`: a view of v's memory when c takes views
// (io::checkpoint::views), else a copy.
inline tensor<cpu> flat_tensor(const std::vector<float>& v, const io::checkpoint& c) {
  const shape s{static_cast<std::int64_t>(v.size())};
  // A view's writer is a decode over this state (the vector itself is not const).
  return c.views ? tensor<cpu>::borrow(const_cast<float*>(v.data()), s) : from_vector<cpu>(v, s);
}
// Into `out`'s own memory (no second vector of the state's size), unless the tensor is a view of
// it already (a state decoded over this one).
inline void load_flat(const io::checkpoint& c, const std::string& name, std::vector<float>& out, std::size_t expected) {
  const auto& t = c.tensor_at(name);
  decentrain::detail::check(t.numel() == static_cast<std::int64_t>(expected) && t.dtype() == dtype::f32, "checkpoint: '",
                            name, "' has ", t.numel(), " elements of ", dtype_name(t.dtype()), ", expected ", expected, " f32");
  const auto flat = t.contiguous();
  const float* p = flat.template data<float>();
  if (p == out.data() && out.size() == expected) return;  // decoded in place
  out.assign(p, p + expected);
}

}  // namespace decentrain::comm
