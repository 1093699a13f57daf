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
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "decentrain/comm/diloco.hpp"
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
  Outer outer_optimizer{};
  Codec codec{};
  Aggregator aggregator{};

  template <class Ctx>
  void start(Ctx& ctx) {
    using decentrain::detail::check;
    check(inner_steps >= 1, "streaming_diloco: inner_steps must be >= 1, got ", inner_steps);
    check(fragments >= 1 && fragments <= inner_steps, "streaming_diloco: fragments must be in [1, inner_steps = ", inner_steps,
          "], got ", fragments);
    check(overlap >= 0 && overlap < inner_steps, "streaming_diloco: overlap must be in [0, inner_steps) (an exchange lands before ",
          "its fragment's next one starts), got ", overlap);
    check(mix >= 0 && mix <= 1, "streaming_diloco: mix must be in [0, 1], got ", mix);
    check(!(weighted && eager), "streaming_diloco: weighted and eager cannot be set together (an eager step stands in for ",
          "the average before the exchange, without the replicas' weights)");
    outer::validate(outer_optimizer, "streaming_diloco");
    prepare_codec(codec, aggregator, ctx);
    check_weighs(aggregator, weighted, "streaming_diloco");
    const auto ranges = detail::fragment_ranges(ctx.parameters, fragments, pattern);
    const auto whole = layout_of(ctx.parameters);
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
        for (const auto& m : whole)
          if (m.offset >= r.offset && m.offset < r.offset + r.size) l.push_back({p.size + (m.offset - r.offset), m.rows, m.cols});
        p.size += r.size;
      }
      compress::set_layout(p.codec, l);
      p.layout = std::move(l);
      // Fragment f synchronises after the steps s with (s + 1) = (f + 1) H / P (mod H): the last
      // one with DiLoCo's rounds, the others spread evenly before it.
      p.phase = ((static_cast<std::int64_t>(f) + 1) * inner_steps / fragments) % inner_steps;
      if (p.lands_after >= 0)
        check(p.buffer.size() == p.size, "streaming_diloco: restored fragment ", f, "'s average has ", p.buffer.size(),
              " values, the fragment ", p.size);
    }
    restored_.clear();
    if (ctx.resumed) {
      check(global_.size() == flat_size(ctx.parameters), "streaming_diloco: restored state has ", global_.size(),
            " values, the model has ", flat_size(ctx.parameters));
      check(!eager || eager_.size() == global_.size(), "streaming_diloco: eager updates asked for, but the restored state ",
            eager_.empty() ? "was saved without them" : "has the wrong size");
      check(eager || eager_.empty(), "streaming_diloco: the restored state was saved with eager updates, this policy has none");
      return;
    }
    broadcast_parameters(ctx, global_);
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

  template <class Ctx>
  void after_step(Ctx& ctx) {
    for (auto& p : parts_) p.weight.add(ctx);
    for (auto& p : parts_)  // exchanges due now land first (on the last step, every one)
      if (p.lands_after >= 0 && (p.lands_after <= ctx.step || ctx.last_step)) land(ctx, p, eager ? -1.0 : mix);
    if (ctx.last_step) {
      // Every fragment once more, all at once (their latencies overlap), merged with mix 0: the
      // run ends with every peer on the same global parameters.
      for (auto& p : parts_) send(ctx, p, ctx.step, true);
      for (auto& p : parts_) land(ctx, p, 0.0);
      return;
    }
    for (auto& p : parts_) {
      if ((ctx.step + 1) % inner_steps != p.phase) continue;
      if (eager) {
        send(ctx, p, ctx.step + inner_steps, true);  // lands right before this fragment's next one
        step_eagerly(ctx, p);
        continue;
      }
      send(ctx, p, ctx.step + overlap, overlap > 0);
      if (overlap == 0) land(ctx, p, mix);
    }
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
    for (auto& p : parts_) {
      p.settle();
      p.exchange.failure = nullptr;
      if (p.lands_after >= 0) p.weight.sum += p.sent.sum;  // (the next pseudo-gradient carries those steps)
      p.lands_after = -1;
    }
  }

  // A round: H steps, in which every fragment synchronises once (the last fragment sends after
  // the round's last step).
  bool ends_round_at(std::int64_t step) const { return ends_round(step, inner_steps); }

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
    const auto n = static_cast<std::size_t>(c.tensor_at("comm.streaming_diloco.global").numel());
    load_flat(c, "comm.streaming_diloco.global", global_, n);
    load_flat(c, "comm.streaming_diloco.momentum", momentum_, n);
    merges_ = c.counter("comm.streaming_diloco.merges");
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
      if (io::leaves_out_own_state(c)) {  // another peer's state: the codec keeps this peer's own (its unsent residual)
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

  // Starts fragment p's exchange of its pseudo-gradient (the outer parameters its round started
  // from, less the local ones), to be merged after step `lands_after`: on a lane thread when
  // `background`, else here, before returning.
  template <class Ctx>
  void send(Ctx& ctx, part& p, std::int64_t lands_after, bool background) {
    gather_values(ctx.parameters, local_);
    p.pseudo_gradient(eager_.empty() ? global_ : eager_, local_, p.buffer);
    p.lands_after = lands_after;
    p.sent.sum = std::exchange(p.weight.sum, 0.0);
    auto exchange = [&p, weigh = weighted](auto& comm) {
      const auto before = comm.traffic().bytes_sent;
      collective::encoded_all_reduce(p.codec, comm, std::span<float>(p.buffer), true, p.aggregator, p.record, weight_if(weigh, p.sent.sum));
      p.bytes = comm.traffic().bytes_sent - before;
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
  bool loaded_while_running_ = false;  // load() took a state into parts_ (see start)
  std::int64_t merges_ = 0;
  std::uint64_t peak_bytes_ = 0;
  collective::aggregation_record aggregation_;
};

}  // namespace decentrain::comm
