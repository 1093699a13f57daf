// Streaming DiLoCo (Douillard et al., 2025, arXiv 2501.18512): DiLoCo whose parameters are cut
// into P fragments that synchronise one after the other, each every H inner steps but offset by
// H / P steps from the next, so a synchronisation moves 1/P of the model (P times less peak
// bandwidth). A fragment's exchange runs in the background beside the next `overlap` (tau) inner
// steps; when it lands, the outer optimizer updates the fragment's global copy and the peer
// merges it into what it trained meanwhile: local = mix * local + (1 - mix) * global.
// With one fragment, no overlap and mix 0 this is DiLoCo step for step; with one fragment and
// overlap >= 1 it is DiLoCo with its communication hidden behind compute.
//
// Eager updates (Kale et al., 2025, arXiv 2502.12996) overlap a fragment's exchange with a whole
// round instead: at its synchronisation a peer takes its outer step at once, with a stand-in for
// the average it has not received yet, made of its own new pseudo-gradient and the others' from
// the round before: stand-in = last average + (own_t - own_{t-1}) / M for M peers. The average
// arrives by the fragment's next synchronisation and serves the next stand-in; meanwhile it
// advances a global copy that every peer holds alike (the delayed outer steps), on which the run
// ends. With one peer the stand-in is the true average: eager updates are DiLoCo step for step.
//
// Tuned (`tune`, the command line's --auto), the policy picks H, P, tau and the codec itself
// from what the replicas measure (comm/auto_tuning.hpp's choose_streaming), after its first step,
// and again when the rounds' measures drift from those the pick came from; and the codec of the
// run's last exchange, which nothing is left to hide, from the time the run has to spare
// (pick_last_exchange).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "decentrain/comm/auto_tuning.hpp"
#include "decentrain/comm/diloco.hpp"
#include "decentrain/comm/link_probe.hpp"
#include "decentrain/comm/outer.hpp"
#include "decentrain/comm/policy.hpp"
#include "decentrain/comm/streaming_fragment.hpp"

namespace decentrain::comm {


template <class Outer = outer::nesterov, class Codec = compress::identity, class Aggregator = collective::mean>
struct streaming_diloco {
  static_assert(outer::check_outer<Outer>());
  static_assert(compress::check_codec<Codec>());
  static_assert(collective::check_aggregator<Aggregator>());
  using policy_concept = policy_tag;
  static constexpr const char* name = "streaming_diloco";

  std::int64_t inner_steps = 50;  // H: steps between two synchronisations of the same fragment
  std::int64_t fragments = 4;     // P
  std::int64_t overlap = 1;       // tau: inner steps an exchange runs beside before it is merged (< H)
  double mix = 0.5;               // alpha: the share of its own parameters a peer keeps at a merge
  fragment_pattern pattern = fragment_pattern::strided;
  // Eager updates: an exchange runs beside a whole round and the peer steps at once with a
  // stand-in (see above); overlap and mix do not apply. Keeps two more copies of the model (the
  // peer's own outer parameters and their momentum) and two pseudo-gradients per fragment.
  bool eager = false;
  // Average the replicas' pseudo-gradients of a fragment by the weight of the steps it covers
  // (the sum of ctx.step_weight since the fragment's last exchange: the rows each took, say)
  // instead of equally; one all-reduce of a number more an exchange, in the exchange's
  // background. Not with eager updates (their stand-in needs the weights before the exchange).
  bool weighted = false;
  // Work sized to speed (diloco's sized_to_speed, DyLU): a replica takes as many inner steps a
  // step as fit in the time the slowest replica needs for one (speed_sizing), so that every
  // replica comes to each exchange at about one time and none waits there for the slowest; its
  // pseudo-gradients weigh by the rows it trained (as `weighted`). The slowest replica's seconds
  // per inner step are agreed on a lane after the second step (the first warms caches and
  // allocates: its time is not the replica's speed; the first round sized from its start once
  // that lands: nobody waits for it) and then at each round's end on a lane beside the
  // next round (read at its end: each round is sized by the speeds of the round before the
  // last). With tune, a pick's new rounds move the deadline of the round running by the steps
  // they add to it or take from it (speed_sizing::shift_round). Every replica the same; not with
  // eager updates.
  bool sized_to_speed = false;
  Outer outer_optimizer{};
  Codec codec{};
  Aggregator aggregator{};
  // Set: H, the fragments, the overlap and the codec are picked from measures so that the
  // compute stays busy behind the exchanges (auto_tuning::choose_streaming): first from the links
  // probed at the start and the slowest replica's first steps, once the probe has landed (it runs
  // on a lane beside the first steps, and nothing is sent before that pick: comm/link_probe.hpp;
  // on a transport without lanes, after step 0); then at rounds' ends from what the
  // rounds measured (the slowest replica's seconds per inner step, its exchanges' times against
  // the prediction; agreed by a 16-byte all-reduce in the background, read a round later): the
  // first round with an exchange measured replaces the probe's model, and the pick is made again
  // where the measures are off by more than tune->drift (the exchanges in flight land first).
  // The seconds per inner step are the slowest replica's, which is what a step takes sized to
  // speed too. Every replica the same; not with eager updates.
  std::optional<auto_tuning<Codec>> tune{};

  template <class Ctx>
  void start(Ctx& ctx) {
    using decentrain::detail::check;
    last_exchange_.reset();
    if (!ctx.resumed && given_) {  // a fresh run of a policy that picked in an earlier one: from the settings given
      inner_steps = given_->inner_steps;
      fragments = given_->fragments;
      overlap = given_->overlap;
      codec = given_->codec;
      given_.reset();
    }
    check(inner_steps >= 1, "streaming_diloco: inner_steps must be >= 1, got ", inner_steps);
    check(fragments >= 1 && fragments <= inner_steps, "streaming_diloco: fragments must be in [1, inner_steps = ", inner_steps,
          "], got ", fragments);
    check(overlap >= 0 && overlap < inner_steps, "streaming_diloco: overlap must be in [0, inner_steps) (an exchange lands before ",
          "its fragment's next one starts), got ", overlap);
    check(mix >= 0 && mix <= 1, "streaming_diloco: mix must be in [0, 1], got ", mix);
    check(!((weighted || sized_to_speed) && eager), "streaming_diloco: ", weighted ? "weighted" : "sized_to_speed",
          " and eager cannot be set together (an eager step stands in for the average before the exchange, without the ",
          "replicas' weights)");
    outer::validate(outer_optimizer, "streaming_diloco");
    if (tune) {
      tune->validate("streaming_diloco");
      check(!eager, "streaming_diloco: tune picks the overlap of each exchange, which eager updates do not have: eager does not go ",
            "with it");
    }
    prepare_codec(codec, aggregator, ctx,
                  (tune ? ", " + tune->describe() : std::string()) + (sized_to_speed ? ", sized to speed" : ""));
    check_weighs(aggregator, weighs(), "streaming_diloco");
    whole_ = layout_of(ctx.parameters);
    if (tune) for (auto& c : tune->codecs) compress::set_layout(c, whole_);  // (priced with the model's shapes; cut() gives each fragment its own)
    if (tune) {  // every fragment count's cut that the model's layers allow: to pick from, and to cut by
      const auto layers = static_cast<std::int64_t>(detail::layer_units(ctx.parameters).size());
      cuts_.assign(tune->fragment_counts.size(), {});
      largest_.assign(tune->fragment_counts.size(), 0);
      for (std::size_t k = 0; k < cuts_.size(); ++k) {
        if (tune->fragment_counts[k] > layers) continue;
        cuts_[k] = detail::fragment_ranges(ctx.parameters, tune->fragment_counts[k], pattern);
        for (const auto& f : cuts_[k]) {
          std::size_t n = 0;
          for (const auto& r : f) n += r.size;
          largest_[k] = std::max(largest_[k], n);
        }
      }
    }
    const auto ranges = detail::fragment_ranges(ctx.parameters, fragments, pattern);
    // (over TCP the clocks of a group's members count from its forming, a joiner's from its own
    // joining, for as long as its process runs: its lead is not made up, and it sends no clock)
    if (ctx.joined) clock_shared_ = false;
    // Started again with a state loaded while it ran (a restore, or a heal, before another fit):
    // its fragments hold that state already.
    if (ctx.resumed && loaded_while_running_) {
      for (auto& p : parts_) {
        p.settle();
        if (p.exchange.failure) p.lands_after = -1;  // (a fit that failed) dropped, as at a group change
      }
      restored_ = std::move(parts_);
    }
    loaded_while_running_ = false;
    // A state captured before the first step holds no fragments yet.
    const bool restored = ctx.resumed && !restored_.empty();
    check(!restored || restored_.size() == ranges.size(), "streaming_diloco: the restored state has ", restored_.size(),
          " fragments, this policy has ", ranges.size());
    cut(ranges, restored);
    restored_.clear();
    if (ctx.resumed) {
      check(global_.size() == flat_size(ctx.parameters), "streaming_diloco: restored state has ", global_.size(),
            " values, the model has ", flat_size(ctx.parameters));
      check(!eager || eager_.size() == global_.size(), "streaming_diloco: eager updates asked for, but the restored state ",
            eager_.empty() ? "was saved without them" : "has the wrong size");
      check(eager || eager_.empty(), "streaming_diloco: the restored state was saved with eager updates, this policy has none");
      // Tuned from a state that was not: the group probes now (a joiner takes the members' tuned state).
      pick_tried_ = tuned_state_;
      if (!tuned_state_) forget_measures();
      if (tune && !tuned_state_ && !ctx.joined) probe_.start(ctx.replicas, global_.size(), tune->probe_values, first_pick_by(ctx));
      return;
    }
    broadcast_parameters(ctx, global_);
    speeds_.forget();
    speed_ = {};
    lead_ = {};
    choices_.clear();
    round_from_ = 0;
    codec_at_ = own_codec;
    pick_tried_ = tuned_state_ = calibrated_ = false;
    forget_measures();
    if (tune) probe_.start(ctx.replicas, global_.size(), tune->probe_values, first_pick_by(ctx));
    momentum_.assign(global_.size(), 0.0f);
    if (eager) {
      eager_ = global_;
      eager_momentum_.assign(global_.size(), 0.0f);
    } else {
      eager_.clear();
      eager_momentum_.clear();
    }
  }

  template <class Ctx>
  void after_backward(Ctx&) {}

  // Inner steps this replica takes in `step` (the trainer asks): 1, or sized to speed its share
  // of the inner steps that fit before the round's end (speed_sizing).
  std::int64_t local_steps(std::int64_t step) const { return sized_to_speed ? speed_.share(steps_left(step)) : 1; }

  template <class Ctx>
  void after_step(Ctx& ctx) {
    for (auto& p : parts_) p.weight.add(ctx);
    if (!sized_to_speed || ctx.last_step) return exchange(ctx);
    size_to_speed(ctx);
    exchange(ctx);
    lead_.until(clock_of(ctx));
  }

  // Before the fault policy starts: the outer state at the model's size (values set by start or
  // by a state loaded), so that a state a joiner takes from the members lands in it rather than
  // in new memory (fault::elastic). A state restored already keeps its size (start checks it).
  template <class Ctx>
  void size_state(Ctx& ctx) {
    if (!global_.empty()) return;
    global_.resize(flat_size(ctx.parameters));
    momentum_.resize(global_.size());
  }
  // The group changes (the trainer calls this first: the exchanges run on the group's
  // communicator): every exchange in flight is waited for and dropped, by every member alike. One
  // that a lost peer took part in may have finished on some members and failed on others; a member
  // that merged it already has stepped past the others, who take its state. A dropped exchange
  // costs its fragment one outer step (the local parameters keep their progress, and without
  // eager updates the fragment's next pseudo-gradient carries it); joiners come in at a round
  // start, where with overlap the last fragment's exchange is in flight.
  void drop_in_flight() {
    forget_measures();
    speeds_.forget();
    for (auto& p : parts_) {
      p.settle();
      p.exchange.failure = nullptr;
      if (p.lands_after >= 0) p.weight.sum += p.sent.sum;  // (the next pseudo-gradient carries those steps)
      p.lands_after = -1;
    }
  }

  // A round: H steps, in which every fragment synchronises once (the last fragment sends after
  // the round's last step).
  // (Tuned, the rounds count from the pick's step on.)
  bool ends_round_at(std::int64_t step) const { return step + 1 >= round_from_ && into_round(step) % inner_steps == 0; }
  // Tuned: the picks so far (a resumed run's earlier ones are one placeholder with step -1).
  const std::vector<tuning_choice>& choices() const { return choices_; }
  // Tuned: the pick of the codec of the run's last exchange (pick_last_exchange), once the run's
  // last step has sent it.
  const std::optional<tuning_choice>& last_exchange() const { return last_exchange_; }

  // Exchanges merged so far (one per fragment per round).
  std::int64_t merges() const { return merges_; }
  // The most bytes one exchange put on the wire from this peer: the peak a link must carry
  // within `overlap` steps for the exchange to stay hidden.
  std::uint64_t peak_exchange_bytes() const { return peak_bytes_; }
  const collective::aggregation_record& aggregation() const { return aggregation_; }

  // An exchange in flight is waited for (not merged): its result is saved with the step it is
  // merged after, so a run resumed from here merges the same values at the same step.
  void save(io::checkpoint& c) const {
    c.tensors["comm.streaming_diloco.global"] = flat_tensor(global_, c);
    c.tensors["comm.streaming_diloco.momentum"] = flat_tensor(momentum_, c);
    c.counters["comm.streaming_diloco.fragments"] = static_cast<std::int64_t>(parts_.size());
    c.counters["comm.streaming_diloco.merges"] = merges_;
    if (tune && !choices_.empty()) {  // (before the pick: the settings given, as an untuned policy's)
      c.counters["comm.streaming_diloco.tune.inner_steps"] = inner_steps;
      c.counters["comm.streaming_diloco.tune.overlap"] = overlap;
      c.counters["comm.streaming_diloco.tune.round_from"] = round_from_;
      c.counters["comm.streaming_diloco.tune.codec"] = codec_at_ == own_codec ? -1 : static_cast<std::int64_t>(codec_at_);
      c.text["comm.streaming_diloco.tune.codec_name"] = compress::describe(codec);
      save_measure(c, "comm.streaming_diloco.tune.basis.", basis_);
      save_measure(c, "comm.streaming_diloco.tune.recent.", recent_);
      c.counters["comm.streaming_diloco.tune.calibrated"] = calibrated_ ? 1 : 0;
      save_exact(c, "comm.streaming_diloco.tune.busy", choices_.back().busy);  // (the last exchange's spare time is priced from it)
      // The round's measures so far, and the last round's agreed in the background (waited for).
      save_exact(c, "comm.streaming_diloco.tune.round_compute_s", round_.compute_s);
      save_exact(c, "comm.streaming_diloco.tune.round_ratio", round_.ratio);
      c.counters["comm.streaming_diloco.tune.round_steps"] = round_.steps;
      const bool agreed = measures_.pending && measures_.settle();
      c.counters["comm.streaming_diloco.tune.agreed"] = agreed ? 1 : 0;
      save_exact(c, "comm.streaming_diloco.tune.agreed_step_s", agreed ? measures_.values[0] : 0.0);
      save_exact(c, "comm.streaming_diloco.tune.agreed_ratio", agreed ? measures_.values[1] : 0.0);
    }
    if (sized_to_speed) {
      speed_.save(c, "comm.streaming_diloco.");
      // The speeds agreed in the background, waited for (a failed agreement: none).
      const bool agreed = speeds_.pending && speeds_.settle();
      c.counters["comm.streaming_diloco.speed_agreed"] = agreed ? 1 : 0;
      save_exact(c, "comm.streaming_diloco.speed_agreed_s", agreed ? speeds_.values[0] : 0.0);
    }
    if (!eager_.empty()) {
      c.tensors["comm.streaming_diloco.eager"] = flat_tensor(eager_, c);
      c.tensors["comm.streaming_diloco.eager_momentum"] = flat_tensor(eager_momentum_, c);
    }
    for (std::size_t f = 0; f < parts_.size(); ++f) {
      const auto& p = parts_[f];
      const auto prefix = decentrain::detail::concat("comm.streaming_diloco.fragment", f, ".");
      p.settle();
      // One that failed may have finished on other members: no state of this step is the
      // group's, so none is saved. Its error is thrown here (fault::elastic skips this save) and
      // again at the step it lands, where the fault policy handles it.
      if (p.exchange.failure) std::rethrow_exception(p.exchange.failure);
      p.save(c, prefix, !eager_.empty());
    }
  }
  void load(const io::checkpoint& c) {
    const auto codec_before = codec_at_;
    const auto n = static_cast<std::size_t>(c.tensor_at("comm.streaming_diloco.global").numel());
    load_flat(c, "comm.streaming_diloco.global", global_, n);
    load_flat(c, "comm.streaming_diloco.momentum", momentum_, n);
    merges_ = c.counter("comm.streaming_diloco.merges");
    const bool tuned = c.counters.contains("comm.streaming_diloco.tune.inner_steps");
    if (tuned && !tune)
      decentrain::detail::fail("checkpoint: written by a Streaming DiLoCo that picked its own settings (H ",
                               c.counter("comm.streaming_diloco.tune.inner_steps"), " when saved); resume it with tune set (--auto)");
    tuned_state_ = tuned;
    if (tuned) load_pick(c);
    if (sized_to_speed) {
      speeds_.forget();  // (this replica's own agreement in flight, if any: the state's replaces it)
      speed_.load(c, "comm.streaming_diloco.");
      speeds_.loaded(c.counters.contains("comm.streaming_diloco.speed_agreed") && c.counter("comm.streaming_diloco.speed_agreed") != 0);
      speeds_.values[0] = load_exact(c, "comm.streaming_diloco.speed_agreed_s", "a number of seconds").value_or(0.0);
      speeds_.values[1] = 0;  // (no lead is read from a checkpoint: clock_lead)
      lead_ = {};
    }
    const bool saved_eager = c.tensors.count("comm.streaming_diloco.eager") != 0;
    if (saved_eager) {  // (not cleared first: the state may be a view of these very vectors)
      load_flat(c, "comm.streaming_diloco.eager", eager_, n);
      load_flat(c, "comm.streaming_diloco.eager_momentum", eager_momentum_, n);
    } else {
      eager_.clear();
      eager_momentum_.clear();
    }
    const auto count = c.counter("comm.streaming_diloco.fragments");
    decentrain::detail::check(count >= 0 && count <= 1 << 20, "checkpoint: comm.streaming_diloco.fragments is ", count);
    restored_.clear();
    restored_.resize(static_cast<std::size_t>(count));
    for (std::size_t f = 0; f < restored_.size(); ++f) {
      auto& p = restored_[f];
      const auto prefix = decentrain::detail::concat("comm.streaming_diloco.fragment", f, ".");
      p.codec = codec;
      p.load(c, prefix, saved_eager);
    }
    // Before start, or a state from before the first step: start takes them in. While it runs
    // (fault::elastic: a member behind takes another's state) the fragments take the state in
    // now, their codecs keeping this policy's layout.
    loaded_while_running_ = !parts_.empty() && !restored_.empty();
    if (!loaded_while_running_) return;
    using decentrain::detail::check;
    // Tuned, the state's pick may not be the one this peer cut by (a joiner; a member whose exchange
    // failed where the others went on to pick again): cut by the state's.
    if (tune && (restored_.size() != parts_.size() || cut_inner_steps_ != inner_steps || codec_before != codec_at_)) {
      for (auto& p : parts_) p.settle();
      cut(cut_for(static_cast<std::int64_t>(restored_.size())), false);
    }
    check(restored_.size() == parts_.size(), "streaming_diloco: the state taken has ", restored_.size(), " fragments, this policy has ",
          parts_.size());
    std::size_t values = 0;
    for (const auto& p : parts_) values += p.size;
    check(n == values, "streaming_diloco: the state taken has ", n, " values, the model has ", values);
    check(eager == saved_eager, "streaming_diloco: the state taken was ", saved_eager ? "" : "not ",
          "saved with eager updates, this policy has ", eager ? "them" : "none");
    for (std::size_t f = 0; f < parts_.size(); ++f) {
      auto& p = parts_[f];
      p.settle();  // waits for anything still in flight: the state taken replaces it
      p.exchange.failure = nullptr;
      check(restored_[f].lands_after < 0 || restored_[f].buffer.size() == p.size, "streaming_diloco: fragment ", f,
            "'s average in the state taken has ", restored_[f].buffer.size(), " values, the fragment ", p.size);
      // Another peer's state: the codec keeps this peer's own (its unsent residual), where it is the same codec.
      if (io::leaves_out_own_state(c) && codec_before == codec_at_) {
        restored_[f].codec = std::move(p.codec);
        load_codec(restored_[f].codec, c, decentrain::detail::concat("comm.streaming_diloco.fragment", f, ".codec."));
      }
      p.take(std::move(restored_[f]));
      compress::set_layout(p.codec, p.layout);
    }
    restored_.clear();
  }

 private:
  using part = streaming_fragment<Codec, Aggregator>;

  // The fragments from `ranges` (one a fragment), each its phase in the round, with the
  // restored ones' state (restored_) or this policy's codec.
  void cut(const std::vector<std::vector<detail::value_range>>& ranges, bool restored) {
    using decentrain::detail::check;
    cut_inner_steps_ = inner_steps;
    parts_.clear();
    parts_.reserve(ranges.size());  // never reallocated while an exchange runs
    for (std::size_t f = 0; f < ranges.size(); ++f) {
      auto& p = parts_.emplace_back();
      p.ranges = ranges[f];
      if (restored) p.take(std::move(restored_[f]));  // its codec's state too; the layout is set below, as diloco's
      else p.codec = codec;
      p.aggregator = aggregator;
      compress::layout l;  // the codec sees the fragment's matrices, packed one after the other
      for (const auto& r : p.ranges) {
        for (const auto& m : whole_)
          if (m.offset >= r.offset && m.offset < r.offset + r.size) l.push_back({p.size + (m.offset - r.offset), m.rows, m.cols});
        p.size += r.size;
      }
      compress::set_layout(p.codec, l);
      p.layout = std::move(l);
      // Fragment f synchronises after the steps s with (s + 1) = (f + 1) H / P (mod H): the last
      // one with DiLoCo's rounds, the others spread evenly before it.
      p.phase = ((static_cast<std::int64_t>(f) + 1) * inner_steps / static_cast<std::int64_t>(ranges.size())) % inner_steps;
      if (p.lands_after >= 0)
        check(p.buffer.size() == p.size, "streaming_diloco: restored fragment ", f, "'s average has ", p.buffer.size(),
              " values, the fragment ", p.size);
    }
  }
  // Tuned: the cut into `count` fragments made at the start.
  const std::vector<std::vector<detail::value_range>>& cut_for(std::int64_t count) const {
    for (std::size_t k = 0; k < cuts_.size(); ++k)
      if (tune->fragment_counts[k] == count && !cuts_[k].empty()) return cuts_[k];
    decentrain::detail::fail("streaming_diloco: ", count, " fragments are not among tune's fragment counts that fit the model");
  }
  // Where the communicator's automatic all-reduce turns from recursive doubling to the ring.
  template <class Ctx>
  static std::size_t rd_below(Ctx& ctx) { return ctx.replicas.settings().recursive_doubling_below_bytes; }
  // Steps into the current round after `step` (1 after a round's first step; a multiple of H at
  // its end).
  std::int64_t into_round(std::int64_t step) const { return step + 1 - round_from_; }
  bool weighs() const { return weighted || sized_to_speed; }
  // Sized to speed: steps of the round from `step` on, `step` included.
  std::int64_t steps_left(std::int64_t step) const {
    const std::int64_t into = (step - round_from_) % inner_steps;
    return inner_steps - (into < 0 ? into + inner_steps : into);
  }

  // After a step: the exchanges that land now, and those due to start.
  template <class Ctx>
  void exchange(Ctx& ctx) {
    bool picked = !tune || pick_tried_;
    if (tune && !pick_tried_ && !ctx.last_step) picked = first_pick(ctx);
    else if (tune && !choices_.empty() && !ctx.last_step) measure_round(ctx);
    else if (tune && ctx.last_step) forget_measures();  // (nothing in flight outlives the run)
    for (auto& p : parts_)  // exchanges due now land first (on the last step, every one)
      if (p.lands_after >= 0 && (p.lands_after <= ctx.step || ctx.last_step)) land(ctx, p, eager ? -1.0 : mix);
    if (ctx.last_step) {
      // Every fragment once more, all at once (their latencies overlap), merged with mix 0: the
      // run ends with every peer on the same global parameters. Tuned, through the codec that
      // keeps the run's compute share (pick_last_exchange); the rounds' codecs are back after it.
      last_exchange_ = pick_last_exchange(ctx);
      if (last_exchange_)  // (from agreed measures; checked: peers set apart fail alike, naming it)
        check_same_settings(ctx, decentrain::detail::concat("codec ", last_exchange_->codec, " (", last_exchange_->codec_name, ")"),
                            "streaming_diloco: the replicas picked different codecs for the run's last exchange",
                            "the same tune and measures (the pick comes from them)");
      std::vector<Codec> rounds;
      if (last_exchange_ && last_exchange_->codec != codec_at_)
        for (auto& p : parts_) {
          rounds.push_back(std::exchange(p.codec, tune->codecs[last_exchange_->codec]));
          compress::set_layout(p.codec, p.layout);
        }
      const auto restore = [&] {
        for (auto& p : parts_) p.settle();  // (no lane is left inside a codec it replaces)
        for (std::size_t f = 0; f < rounds.size(); ++f) parts_[f].codec = std::move(rounds[f]);
      };
      try {
        // (an error feedback's residual of the rounds goes out with it, as adaptive's f32 rounds send it)
        for (std::size_t f = 0; f < parts_.size(); ++f) send(ctx, parts_[f], ctx.step, true, rounds.empty() ? nullptr : &rounds[f]);
        for (auto& p : parts_) land(ctx, p, 0.0);
      } catch (...) {
        restore();
        throw;
      }
      restore();
      return;
    }
    if (!picked) return;  // (the probe still runs beside the steps: nothing is sent before the first pick)
    for (auto& p : parts_) {
      if (into_round(ctx.step) % inner_steps != p.phase) continue;
      if (eager) {
        send(ctx, p, ctx.step + inner_steps, true);  // lands right before this fragment's next one
        step_eagerly(ctx, p);
        continue;
      }
      send(ctx, p, ctx.step + overlap, overlap > 0);
      if (overlap == 0) land(ctx, p, mix);
    }
  }

  // Tuned: the codec of the run's last exchange (auto_tuning::choose_last_exchange), which
  // nothing hides: the run has its compute (the run's steps at the slowest replica's seconds per
  // inner step) over tune->busy to take, less what the rounds' pick left exposed (its predicted
  // busy share); what remains is the last exchange's. None untuned, before a pick, with the
  // settings given kept, or alone.
  template <class Ctx>
  std::optional<tuning_choice> pick_last_exchange(Ctx& ctx) const {
    if (!tune || tune->codecs.empty() || choices_.empty() || codec_at_ == own_codec || ctx.replicas.world() <= 1) return std::nullopt;
    const double rounds_busy = choices_.back().busy > 0 ? choices_.back().busy : tune->busy;
    const double compute = static_cast<double>(std::max(ctx.run_steps, ctx.step + 1)) * recent_.step_s;
    const double spare = std::max(0.0, compute / tune->busy - compute / rounds_busy);
    std::vector<std::size_t> sizes;
    for (const auto& p : parts_) sizes.push_back(p.size);
    auto c = tune->choose_last_exchange(recent_, sizes, ctx.replicas.world(), codec_at_, spare, rd_below(ctx));
    c.step = ctx.step;
    c.inner_steps = inner_steps;
    c.overlap = overlap;
    c.busy = compute > 0 ? compute / (compute / rounds_busy + c.exchange_s) : 1.0;
    const auto ms = [](double s) { return std::round(s * 1e3) / 1e3; };  // (printed to the millisecond)
    c.why = decentrain::detail::concat("the run's last exchange: ", ms(spare), " s to spare");
    if (c.codec != codec_at_)
      c.why += decentrain::detail::concat(", ", compress::describe(codec), " would take ",
                                          ms(exchanges_at_once_seconds(codec, sizes, ctx.replicas.world(), recent_, rd_below(ctx))), " s");
    return c;
  }
  // Sized to speed, after each step but the last: the step's compute counted; after the second
  // (the run's first is cold: counted in neither the measure nor the deadline, every replica
  // took one inner step in it), the speeds go to their agreement on a lane, and the rest of the
  // round is sized once it lands (one inner step a step until then); at each round's end the
  // speeds the lane agreed over the round before size the next round, and this round's go to
  // their agreement. With the speeds goes each replica's clock (at the cold step's end, then at
  // each round's end); once it lands, the lead it shows lengthens the round then running
  // (clock_lead).
  template <class Ctx>
  void size_to_speed(Ctx& ctx) {
    speed_.add(ctx);
    const double clock = clock_of(ctx);
    lead_.arrive(ctx.step, clock, ctx.step_compute_s);
    const std::int64_t left = steps_left(ctx.step + 1);  // (a round's end: the whole next round)
    if (speed_.round_steps == 0 && !ends_round_at(ctx.step)) {  // not sized yet: the first round
      if (into_round(ctx.step) == 1 && left > 1) {  // the run's first step: cold
        lead_.sent(clock);
        return speed_.discard_measure();
      }
      if (!speeds_.pending) agree_speed(ctx, clock_shared_ ? lead_.sent_s : 0.0);  // (after the run's second step)
      if (!speeds_.flight.handle.landed()) return;  // (where it ran here, as without lanes, it sizes now)
      const double mine = speed_.seconds_per_step();
      const auto agreed = take_speeds();
      // (the round's steps measured: those since the cold first, in the round)
      speed_.rest_of_round_from(agreed.slowest.value_or(mine), mine, inner_steps, left, inner_steps - left);
      speed_.deadline_s += lead_.make_up(shared(agreed.latest), clock_of(ctx), speed_.deadline_s, false);
      return;
    }
    if (!ends_round_at(ctx.step)) {
      // (the speeds wait for the round's end; the clocks are read as soon as they land)
      if (lead_.awaited() && speeds_.pending && speeds_.flight.handle.landed())
        speed_.deadline_s +=
            lead_.make_up(shared(speeds_.settle() ? positive(speeds_.values[1]) : std::nullopt), clock_of(ctx), speed_.deadline_s, false);
      return;
    }
    // (no new agreement, or a failed one, which sizes nothing as the group is changing: the last one's)
    const auto agreed = take_speeds();
    const double mine = agree_speed(ctx, clock_shared_ ? clock : 0.0);
    speed_.next_round_from(agreed.slowest.value_or(speed_.slowest_s), mine > 0 ? mine : speed_.per_step_s, inner_steps, left);
    speed_.deadline_s += lead_.make_up(shared(agreed.latest), clock_of(ctx), speed_.deadline_s, true);
    lead_.sent(clock);
  }
  // This replica's seconds per inner step since the sizing, and a clock of its own (< 0: none),
  // sent to the speeds' agreement on a lane.
  template <class Ctx>
  double agree_speed(Ctx& ctx, double clock) {
    const double mine = speed_.seconds_per_step();
    speeds_.values[0] = std::isfinite(mine) && mine > 0 ? mine : 0.0;
    speeds_.values[1] = std::max(0.0, clock);
    speeds_.start(ctx.replicas);
    return mine;
  }
  // Where an agreement was pending and landed: the slowest replica's seconds per inner step and
  // the latest clock, each where it is a positive number.
  struct agreed_speeds {
    std::optional<double> slowest, latest;
  };
  agreed_speeds take_speeds() {
    if (!speeds_.take()) return {};
    return {positive(speeds_.values[0]), positive(speeds_.values[1])};
  }
  std::optional<double> shared(std::optional<double> latest) const { return clock_shared_ ? latest : std::nullopt; }
  static std::optional<double> positive(double v) { return std::isfinite(v) && v > 0 ? std::optional<double>(v) : std::nullopt; }
  template <class Ctx>
  static double clock_of(Ctx& ctx) {
    return ctx.replicas.endpoint().stats().clock_seconds;
  }

  // The step after which the first pick comes at the latest: the first round no longer than
  // the longest the pick may set.
  template <class Ctx>
  std::int64_t first_pick_by(Ctx& ctx) const {
    return ctx.step + tune->longest_round(ctx.run_steps) - 1;
  }
  // Once the start's probe of the links has landed on every replica (link_probe: the step after
  // which they take it is agreed with it; without a lane, the first step): the pick from its
  // links and the slowest replica's compute, the same on every replica; where no compute was
  // measured, the settings given, recorded as the pick. False before (nothing is sent
  // meanwhile). A group changed before the pick (the probe forgotten) probes again.
  template <class Ctx>
  bool first_pick(Ctx& ctx) {
    if (!probe_.running()) probe_.start(ctx.replicas, global_.size(), tune->probe_values, first_pick_by(ctx));
    // (sized to speed: the steps from here go at the sizing's pace once it has landed)
    const std::int64_t next_inner = !sized_to_speed ? 1 : speed_.round_steps != 0 ? local_steps(ctx.step + 1) : 0;
    const auto probed = probe_.after_step(ctx.replicas, ctx.step, ctx.step_compute_s, ctx.local_steps, next_inner);
    if (!probed) return false;
    pick_tried_ = true;
    link_ = probed->link;
    link_.small_s = probed->small_s;  // (a small f32 fragment's exchange goes by recursive doubling)
    link_.step_s = 0;
    tuning_measure m = link_;
    m.step_s = probed->link.step_s;
    tuning_choice c;
    if (m.step_s > 0) {
      c = tune->choose_streaming(m, largest_, ctx.replicas.world(), codec, ctx.run_steps, rd_below(ctx));
      c.why = "start";
    } else {  // (no compute clock: the settings given kept, a pick all the same, so a state says it was made)
      c.inner_steps = inner_steps;
      c.fragments = fragments;
      c.overlap = overlap;
      c.codec = codec_at_;  // (the policy's own: none of tune's is picked yet)
      c.codec_name = compress::describe(codec);
      c.measured = m;
      c.why = "start: no compute measured, the settings given kept";
    }
    c.step = ctx.step;
    calibrated_ = false;
    apply(ctx, std::move(c), m);
    return true;
  }
  // Sets the pick `c` (made from measures `m`, the same on every replica): what is in flight lands
  // first (a fresh run's first pick has sent nothing yet, and keeps its round's start; any other
  // starts a round after this step), then the fragments are cut again. A pick of the settings in
  // use changes only the measures judged against.
  template <class Ctx>
  void apply(Ctx& ctx, tuning_choice c, const tuning_measure& m) {
    const auto settings = decentrain::detail::concat(c.inner_steps, " inner steps, ", c.fragments, " fragments, overlap ",
                                                     c.overlap, ", codec ", c.codec_name);
    decentrain::detail::check(ctx.replicas.all_same(decentrain::detail::fnv1a(settings)), "streaming_diloco: the replicas picked ",
                              "different settings after step ", ctx.step, " (this one: ", settings, ")");
    const std::size_t at = tune->codecs.empty() ? own_codec : c.codec;
    if (!choices_.empty() && c.inner_steps == inner_steps && c.fragments == fragments && c.overlap == overlap && at == codec_at_) {
      basis_ = recent_ = m;
      round_ = {};
      choices_.push_back(std::move(c));
      return;
    }
    const bool fresh = merges_ == 0 && std::none_of(parts_.begin(), parts_.end(), [](const part& p) { return p.lands_after >= 0; });
    if (!given_ && codec_at_ == own_codec) given_ = given_settings{inner_steps, fragments, overlap, codec};
    const std::int64_t left_before = steps_left(ctx.step + 1);
    for (auto& p : parts_)
      if (p.lands_after >= 0) land(ctx, p, mix);
    const bool started = std::any_of(parts_.begin(), parts_.end(), [](const part& p) { return p.momentum_started; });
    inner_steps = c.inner_steps;
    fragments = c.fragments;
    overlap = c.overlap;
    if (at != own_codec && at != codec_at_) codec = tune->codecs[at];
    codec_at_ = at;
    // Weighed, each new fragment carries the old ones' weight (by their values: a replica's
    // weight against the others' is its rows' share, much the same over any span of steps).
    round_weight carried;
    std::size_t values = 0;
    for (const auto& p : parts_) {
      carried.sum += p.weight.sum * static_cast<double>(p.size);
      carried.through = std::max(carried.through, p.weight.through);
      values += p.size;
    }
    if (values > 0) carried.sum /= static_cast<double>(values);
    cut(cut_for(fragments), false);
    for (auto& p : parts_) p.weight = carried;
    for (auto& p : parts_) p.momentum_started = started;  // (the flat momentum holds its values)
    round_from_ = fresh ? 0 : ctx.step + 1;
    if (sized_to_speed) speed_.shift_round(inner_steps, steps_left(ctx.step + 1) - left_before);
    basis_ = recent_ = m;
    round_ = {};
    choices_.push_back(std::move(c));
  }
  // At a round's end (tuned, after the first pick): the measures agreed from the round before
  // judged against the pick's (the first replacing the probe's model), picked again where they
  // drifted; then this round's measures go to their agreement, in the background.
  template <class Ctx>
  void measure_round(Ctx& ctx) {
    round_.compute_s += ctx.step_compute_s;
    round_.steps += std::max<std::int64_t>(1, ctx.local_steps);
    if (!ends_round_at(ctx.step)) return;
    // (a failed agreement measures nothing: the group is changing, and the fault policy hears of
    // it from the exchanges)
    if (measures_.take()) {
      const double step_s = measures_.values[0], ratio = measures_.values[1];
      if (step_s > 0 && std::isfinite(step_s) && std::isfinite(ratio) && ratio >= 0) {
        std::size_t largest = 0;
        for (const auto& p : parts_) largest = std::max(largest, p.size);
        // The exchanges went by the pick's algorithm (recursive doubling or the ring): its
        // figures scaled by what they took over the prediction, the other's as they were. (No
        // exchange landed in that round: the link as the measures so far have it.)
        const bool rd = by_recursive_doubling(codec, largest, basis_, rd_below(ctx));
        tuning_measure now = ratio > 0 ? scaled_for(basis_, rd, ratio) : recent_;
        now.step_s = step_s;
        // Until an exchange was measured, the rounds' figures replace the probe's and the first
        // step's; after that they are smoothed.
        const bool first = !calibrated_;
        recent_ = calibrated_ ? tune->smoothed(recent_, now) : now;
        calibrated_ = calibrated_ || ratio > 0;
        const int world = ctx.replicas.world();
        const auto [off, what] = auto_tuning<Codec>::drift_of(recent_, basis_, exchange_seconds(codec, largest, world, recent_, rd_below(ctx)),
                                                              exchange_seconds(codec, largest, world, basis_, rd_below(ctx)), 0.0);
        if (off > tune->drift) {
          auto c = tune->choose_streaming(recent_, largest_, world, codec, ctx.run_steps, rd_below(ctx));
          c.step = ctx.step;
          c.why = decentrain::detail::concat(first ? "measured: " : "drift: ", what, " ", std::lround(100 * off), "% off");
          const auto m = recent_;
          return apply(ctx, std::move(c), m);  // (the next round's measures start afresh)
        }
      }
    }
    // This round's: the seconds per inner step and the exchanges' time over their prediction
    // (the slowest replica's, as it holds the others up).
    auto& agreed = measures_.values;
    agreed[0] = round_.steps > 0 ? round_.compute_s / static_cast<double>(round_.steps) : 0.0;
    agreed[1] = round_.ratio;
    for (double& v : agreed)
      if (!std::isfinite(v) || v < 0) v = 0;
    round_ = {};
    measures_.start(ctx.replicas);
  }
  void forget_measures() {
    probe_.forget();
    measures_.forget();
    round_ = {};
  }
  // A tuned state's settings (before its fragments are read: they are cut by them).
  void load_pick(const io::checkpoint& c) {
    using decentrain::detail::check;
    inner_steps = c.counter("comm.streaming_diloco.tune.inner_steps");
    overlap = c.counter("comm.streaming_diloco.tune.overlap");
    round_from_ = c.counter("comm.streaming_diloco.tune.round_from");
    fragments = c.counter("comm.streaming_diloco.fragments");
    const auto at = c.counter("comm.streaming_diloco.tune.codec");
    const auto picks = static_cast<std::int64_t>(tune->codecs.size());
    check(inner_steps >= 1 && overlap >= 0 && overlap < inner_steps && fragments >= 1 && round_from_ >= 0 && at >= -1 &&
              at < std::max<std::int64_t>(picks, 1),
          "checkpoint: streaming_diloco's tuned settings (H ", inner_steps, ", ", fragments, " fragments, overlap ", overlap,
          ", round from step ", round_from_, ", codec ", at, " of ", picks, ") do not fit this policy's tune");
    check(std::find(tune->fragment_counts.begin(), tune->fragment_counts.end(), fragments) != tune->fragment_counts.end(),
          "checkpoint: streaming_diloco picked ", fragments, " fragments, which this policy's tune does not offer");
    forget_measures();  // (this replica's own agreement in flight, if any: the state's replaces it)
    basis_ = load_measure(c, "comm.streaming_diloco.tune.basis.");
    recent_ = load_measure(c, "comm.streaming_diloco.tune.recent.");
    calibrated_ = c.counters.contains("comm.streaming_diloco.tune.calibrated") && c.counter("comm.streaming_diloco.tune.calibrated") != 0;
    const auto seconds = [&c](const char* key) { return load_exact(c, key, "a number").value_or(0.0); };
    round_.compute_s = seconds("comm.streaming_diloco.tune.round_compute_s");
    round_.ratio = seconds("comm.streaming_diloco.tune.round_ratio");
    round_.steps = c.counters.contains("comm.streaming_diloco.tune.round_steps") ? c.counter("comm.streaming_diloco.tune.round_steps") : 0;
    measures_.loaded(c.counters.contains("comm.streaming_diloco.tune.agreed") && c.counter("comm.streaming_diloco.tune.agreed") != 0);
    auto& agreed = measures_.values;
    agreed[0] = seconds("comm.streaming_diloco.tune.agreed_step_s");
    agreed[1] = seconds("comm.streaming_diloco.tune.agreed_ratio");
    check(round_.steps >= 0 && std::isfinite(round_.compute_s) && std::isfinite(round_.ratio) && std::isfinite(agreed[0]) &&
              std::isfinite(agreed[1]),
          "checkpoint: streaming_diloco's tuned measures are not numbers");
    if (at >= 0 && picks > 0) {
      const auto saved = c.text.find("comm.streaming_diloco.tune.codec_name");
      const auto& offered = tune->codecs[static_cast<std::size_t>(at)];
      check(saved == c.text.end() || saved->second == compress::describe(offered), "checkpoint: streaming_diloco picked codec ",
            at, ", '", saved == c.text.end() ? "" : saved->second, "', where this policy's tune has '", compress::describe(offered),
            "' (its codecs must be the same, in the same order)");
      if (static_cast<std::size_t>(at) != codec_at_) codec = offered;
    }
    codec_at_ = at < 0 ? own_codec : static_cast<std::size_t>(at);
    if (choices_.empty()) choices_.resize(1, tuning_choice{});  // (the pick itself is not in the checkpoint, but its busy share)
    choices_.back().busy = seconds("comm.streaming_diloco.tune.busy");
    check(std::isfinite(choices_.back().busy) && choices_.back().busy >= 0 && choices_.back().busy <= 1,
          "checkpoint: streaming_diloco's tuned busy share ", choices_.back().busy, " is not in [0, 1]");
    pick_tried_ = true;
  }

  // Starts fragment p's exchange of its pseudo-gradient (the outer parameters its round started
  // from, less the local ones), to be merged after step `lands_after`: on a lane thread when
  // `background`, else here, before returning.
  // `residual_of`: a codec whose error-feedback residual goes into this exchange (the rounds'
  // codec, where the run's last exchange takes another).
  template <class Ctx>
  void send(Ctx& ctx, part& p, std::int64_t lands_after, bool background, Codec* residual_of = nullptr) {
    gather_values(ctx.parameters, local_);
    p.pseudo_gradient(eager_.empty() ? global_ : eager_, local_, p.buffer);
    p.lands_after = lands_after;
    p.sent.sum = std::exchange(p.weight.sum, 0.0);
    // Weighed on the way (a mean): the weights' sum on a lane beside the exchange, each replica's
    // pseudo-gradient scaled by its own weight, the average scaled when settled. The weight in
    // units of a round of one inner step a step (the same on every replica), so that what the
    // codec encodes stays near the pseudo-gradient's size (rows by the thousand would overflow
    // fp16); were the unit to differ between replicas, the average would still be a weighted one.
    const bool beside = weighs() && collective::averages_in_flight(p.aggregator);
    if (beside) {
      const double unit = std::max(1.0, static_cast<double>(ctx.batch_size) * static_cast<double>(inner_steps));
      p.weights_sum = p.sent.sum / unit;
      const auto f = static_cast<float>(p.weights_sum);
      p.weighing.handle = ctx.replicas.start([&p](auto& comm) { comm.all_reduce(std::span<double>(&p.weights_sum, 1)); });
      p.weighed_world = ctx.replicas.world();
      for (auto& v : p.buffer) v *= f;
    }
    if (residual_of)
      if constexpr (requires { residual_of->flush_into(std::span<float>(p.buffer)); }) residual_of->flush_into(std::span<float>(p.buffer));
    auto exchange = [&p, weigh = weighs() && !beside](auto& comm) {
      const auto before = comm.traffic().bytes_sent;
      const double t0 = comm.endpoint().stats().clock_seconds;
      collective::encoded_all_reduce(p.codec, comm, std::span<float>(p.buffer), true, p.aggregator, p.record, weight_if(weigh, p.sent.sum));
      p.bytes = comm.traffic().bytes_sent - before;
      p.took_s = comm.endpoint().stats().clock_seconds - t0;
    };
    if (background) p.exchange.handle = ctx.replicas.start(exchange);
    else exchange(ctx.replicas);
  }

  // Eager updates, right after fragment p's send (local_ still holds the parameters it was
  // computed from): the peer's outer step with the stand-in for the average, from which the
  // fragment trains on. Reads the pseudo-gradient from previous_own, not from the buffer that
  // the lane now owns.
  template <class Ctx>
  void step_eagerly(Ctx& ctx, part& p) {
    const auto peers = static_cast<float>(ctx.replicas.world());
    const bool first = p.previous_own.empty();
    auto& now = stand_in_;  // this round's pseudo-gradient, then the stand-in made from it
    p.pseudo_gradient(eager_, local_, now);
    p.previous_own.resize(now.size());  // the last round's, read before it is overwritten
    for (std::size_t i = 0; i < now.size(); ++i) {
      const float own = now[i];
      now[i] = first ? own / peers : p.previous_average[i] + (own - p.previous_own[i]) / peers;
      p.previous_own[i] = own;
    }
    p.outer_step(outer_optimizer, eager_, stand_in_, eager_momentum_, !p.eager_started);
    p.eager_started = true;
    p.copy_ranges(eager_, local_);
    scatter_values(ctx.parameters, local_);
  }

  // Waits for fragment p's exchange and applies the outer optimizer to its global values; then
  // merges them into the local ones, keeping `keep` of those, or, when `keep` < 0 (eager
  // updates), leaves the local ones alone and keeps the average for the next stand-in.
  template <class Ctx>
  void land(Ctx& ctx, part& p, double keep) {
    p.settle();
    if (p.exchange.failure) {
      auto e = std::exchange(p.exchange.failure, nullptr);
      p.lands_after = -1;
      p.weight.sum += p.sent.sum;
      std::rethrow_exception(e);
    }
    p.lands_after = -1;
    peak_bytes_ = std::max(peak_bytes_, p.bytes);
    if (tune && !choices_.empty()) {  // (the last pick's model of the link predicted it)
      const double predicted = exchange_seconds(p.codec, p.size, ctx.replicas.world(), basis_, rd_below(ctx));
      if (predicted > 0 && std::isfinite(p.took_s) && p.took_s >= 0) round_.ratio = std::max(round_.ratio, p.took_s / predicted);
    }
    aggregation_.last = p.record.last;
    aggregation_.tally.add(p.record.last);
    const bool merge = keep >= 0;
    if (merge) gather_values(ctx.parameters, local_);
    p.outer_step(outer_optimizer, global_, p.buffer, momentum_, !p.momentum_started);
    p.momentum_started = true;
    const auto k = static_cast<float>(keep), g = static_cast<float>(1.0 - keep);
    if (merge)
      for (const auto& r : p.ranges)
        for (std::size_t i = r.offset; i < r.offset + r.size; ++i)
          local_[i] = keep == 0 ? global_[i] : k * local_[i] + g * global_[i];
    ++merges_;
    if (merge) scatter_values(ctx.parameters, local_);
    else p.previous_average.swap(p.buffer);
  }

  std::vector<float> global_, momentum_, local_, stand_in_;
  std::vector<float> eager_, eager_momentum_;  // eager updates: this peer's outer parameters
  std::vector<part> parts_, restored_;
  compress::layout whole_;  // the parameters'
  // Tuned: each of tune's fragment counts' cut (empty where the model has too few layers) and
  // its largest fragment's values; the probe's links; the round's first step under the pick;
  // the codec's index in tune's (own_codec: the policy's own); the pick.
  std::vector<std::vector<std::vector<detail::value_range>>> cuts_;
  std::vector<std::size_t> largest_;
  link_probe probe_;                      // the start's, until the first pick
  tuning_measure link_, basis_, recent_;  // the probe's, the last pick's, the rounds' since (smoothed)
  bool calibrated_ = false;               // a round's measures have replaced the probe's model
  struct round_measures {
    double compute_s = 0, ratio = 0;  // compute, the slowest exchange landed over its prediction
    std::int64_t steps = 0;
  } round_;
  // A few numbers agreed (their maximum over the replicas) on a lane beside the steps and read
  // a round later: the rounds' measures (tuned) and the replicas' speeds (sized to speed).
  template <std::size_t N>
  struct lane_agreement {
    double values[N] = {};
    bool pending = false;  // started and not read yet
    mutable typename part::in_flight flight;
    mutable bool settled = true, ok = true;

    template <class Comm>
    void start(Comm& replicas) {
      settled = false;
      flight.handle = replicas.start([this](auto& comm) { comm.all_reduce(std::span<double>(values, N), collective::reduce_op::max); });
      pending = true;
    }
    // Waits for it; false where it failed (remembered until the next one).
    bool settle() const {
      if (settled) return ok;
      settled = true;
      try {
        flight.handle.wait();
        ok = true;
      } catch (...) {
        ok = false;
      }
      return ok;
    }
    // Whether one was pending and landed; it is no longer pending.
    bool take() { return std::exchange(pending, false) && settle(); }
    void forget() {
      (void)settle();
      pending = false;
    }
    // From a checkpoint: `agreed`, the values are an agreement's, to be read (not an earlier
    // failure's, which forget() remembers).
    void loaded(bool agreed) {
      pending = agreed;
      settled = ok = true;
    }
  };
  lane_agreement<2> measures_;  // tuned: the last round's seconds per inner step and exchange ratio
  // Sized to speed: the sizing, the slowest replica's seconds per inner step and the latest
  // clock (at the cold first step's end, then at a round's end) agreed on a lane, and this
  // replica's lead by the clock.
  speed_sizing speed_;
  lane_agreement<2> speeds_;
  clock_lead lead_;
  bool clock_shared_ = true;  // this process's clock counts from the group's forming (it never joined a running group)
  // The settings a first pick replaced (a later fresh start begins from them again).
  struct given_settings {
    std::int64_t inner_steps, fragments, overlap;
    Codec codec;
  };
  std::optional<given_settings> given_;
  std::int64_t cut_inner_steps_ = 0;  // the H the fragments' phases were cut by
  std::int64_t round_from_ = 0;
  static constexpr std::size_t own_codec = static_cast<std::size_t>(-1);
  std::size_t codec_at_ = own_codec;
  std::vector<tuning_choice> choices_;
  std::optional<tuning_choice> last_exchange_;
  bool pick_tried_ = false, tuned_state_ = false;
  bool loaded_while_running_ = false;  // load() took a state into parts_ (see start)
  std::int64_t merges_ = 0;
  std::uint64_t peak_bytes_ = 0;
  collective::aggregation_record aggregation_;
};

}  // namespace decentrain::comm
