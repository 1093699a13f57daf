// DiLoCo (Douillard et al., 2023): each peer runs H = inner_steps inner optimizer steps from the
// shared global parameters; then the pseudo-gradient (global - local) is averaged across the
// replicas (sent through Codec, combined by Aggregator) and applied to the global parameters by an outer optimizer,
// Nesterov momentum by default (lr 0.7, momentum 0.9, the paper's settings), and every peer
// starts the next round from the new global parameters. Peers talk once per H steps instead of
// every step. The average is one all-reduce among all the replicas, or Moshpit's rounds in small
// groups (`moshpit`: comm/moshpit.hpp), so that no collective spans every replica.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "decentrain/comm/moshpit.hpp"
#include "decentrain/comm/outer.hpp"
#include "decentrain/comm/policy.hpp"

namespace decentrain::comm {


template <class Outer = outer::nesterov, class Codec = compress::identity, class Aggregator = collective::mean>
struct diloco {
  static_assert(outer::check_outer<Outer>());
  static_assert(compress::check_codec<Codec>());
  static_assert(collective::check_aggregator<Aggregator>());
  using policy_concept = policy_tag;
  static constexpr const char* name = "diloco";

  std::int64_t inner_steps = 50;  // H: inner steps per round
  Outer outer_optimizer{};
  Codec codec{};
  Aggregator aggregator{};
  // Average the replicas' pseudo-gradients by the weight of their rounds (the sum of
  // ctx.step_weight over the round's steps: the rows each took, say) instead of equally
  // (collective::encoded_all_reduce: the mean scales, a robust aggregator weighs). Every replica the same.
  bool weighted = false;
  // Work sized to speed (DyLU: Liu et al., 2024, "Asynchronous Local-SGD Training for Language
  // Modeling"): a replica takes as many inner steps as fit in the time the slowest needs for
  // inner_steps (about H_i = H s_slowest / s_i, s being the compute seconds an inner step took it, the
  // slowest's agreed by one 8-byte all-reduce a round; the first round sized after its first
  // step), spread over the round's steps and made up as it goes (speed_sizing), and its
  // pseudo-gradient weighs by the rows it trained (as `weighted`). Every replica's round then
  // takes about as long, so none waits for the slowest. Every replica the same; not with
  // `moshpit` (the speeds' all-reduce would span every replica).
  bool sized_to_speed = false;
  // Set: the pseudo-gradients are averaged by this grid's Moshpit rounds (exact for n = M^d with
  // its default rounds) instead of one all-reduce; every replica the same.
  std::optional<moshpit_grid> moshpit{};
  // Its state laid out over the parameters (flat tensors of save(), in parameter order): a
  // pipeline's re-deal moves each parameter's share with the parameter (train/redeal.hpp).
  static constexpr std::array<const char*, 2> per_parameter_state = {"comm.diloco.global", "comm.diloco.momentum"};

  template <class Ctx>
  void start(Ctx& ctx) {
    decentrain::detail::check(inner_steps >= 1, "diloco: inner_steps must be >= 1, got ", inner_steps);
    decentrain::detail::check(!(sized_to_speed && moshpit), "diloco: sized_to_speed needs one all-reduce of the "
                              "replicas' speeds a round, which Moshpit's averaging is there to avoid: set one of them");
    outer::validate(outer_optimizer, "diloco");
    if (moshpit) moshpit->validate("diloco");
    prepare_codec(codec, aggregator, ctx, moshpit ? ", averaged by " + moshpit->describe() : std::string());
    check_weighs(aggregator, weighs(), "diloco");
    if (ctx.resumed) {  // restored: local parameters may be mid-round, the global ones came with the state
      decentrain::detail::check(global_.size() == flat_size(ctx.parameters), "diloco: restored state has ", global_.size(),
                                " values, the model has ", flat_size(ctx.parameters));
      return;
    }
    broadcast_parameters(ctx, global_);
    momentum_.assign(global_.size(), 0.0f);
    momentum_started_ = false;
    speed_ = {};
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
  template <class Ctx>
  void after_backward(Ctx&) {}

  // Inner steps this replica takes in `step` (the trainer asks): 1, or under sized_to_speed its
  // share of the inner steps that fit before the round's deadline (speed_sizing).
  std::int64_t local_steps(std::int64_t step) const {
    return sized_to_speed ? speed_.share(inner_steps - step % inner_steps) : 1;
  }

  template <class Ctx>
  void after_step(Ctx& ctx) {
    weight_.add(ctx);
    if (sized_to_speed) {
      speed_.add(ctx);
      // Not measured yet (a run's first step): the rest of the first round is sized at once.
      if (speed_.round_steps == 0 && !ends_round(ctx, inner_steps))
        speed_.next_round(ctx, inner_steps, inner_steps - 1 - ctx.step % inner_steps);
    }
    if (!ends_round(ctx, inner_steps)) return;
    gather_values(ctx.parameters, delta_);
    for (std::size_t i = 0; i < delta_.size(); ++i) delta_[i] = global_[i] - delta_[i];  // pseudo-gradient
    compress::set_reference(codec, std::span<const float>(global_), ctx.lr_scale);  // for a significance filter
    if (moshpit) {
      std::optional<double> w = weight_if(weighs(), weight_.sum);
      averager_.average(*moshpit, codec, aggregator, ctx.replicas, std::span<float>(delta_),
                        rounds_ * moshpit->rounds_per_average(ctx.replicas.world()), w);
    } else {
      collective::encoded_all_reduce(codec, ctx.replicas, std::span<float>(delta_), true, aggregator, aggregation_,
                                     weight_if(weighs(), weight_.sum));
    }
    if (sized_to_speed) speed_.next_round(ctx, inner_steps, inner_steps);
    outer::step(outer_optimizer, global_, delta_, momentum_, !momentum_started_);
    momentum_started_ = true;
    scatter_values(ctx.parameters, global_);
    ++rounds_;
    weight_.sum = 0;
  }

  bool ends_round_at(std::int64_t step) const { return ends_round(step, inner_steps); }
  // A re-formed view: Moshpit's groups are other peers.
  void drop_in_flight() { averager_.forget(); }
  std::int64_t rounds() const { return rounds_; }
  // What each replica's pseudo-gradients looked like: dropped (non-finite, malformed) or far away.
  const collective::aggregation_record& aggregation() const { return aggregation_; }

  void save(io::checkpoint& c) const {
    c.tensors["comm.diloco.global"] = flat_tensor(global_, c);
    c.tensors["comm.diloco.momentum"] = flat_tensor(momentum_, c);
    c.counters["comm.diloco.momentum_started"] = momentum_started_ ? 1 : 0;
    c.counters["comm.diloco.rounds"] = rounds_;
    save_codec(codec, c, "comm.diloco.codec.");
    weight_.save(c, "comm.diloco.");
    if (sized_to_speed) speed_.save(c, "comm.diloco.");
  }
  void load(const io::checkpoint& c) {
    const auto n = static_cast<std::size_t>(c.tensor_at("comm.diloco.global").numel());
    load_flat(c, "comm.diloco.global", global_, n);
    load_flat(c, "comm.diloco.momentum", momentum_, n);
    momentum_started_ = c.counter("comm.diloco.momentum_started") != 0;
    rounds_ = c.counter("comm.diloco.rounds");
    load_codec(codec, c, "comm.diloco.codec.");
    weight_.load(c, "comm.diloco.");
    speed_ = {};
    if (sized_to_speed) speed_.load(c, "comm.diloco.");
  }
  // This round's inner steps on this replica as planned when sized (sized_to_speed; inner_steps
  // until it measured).
  std::int64_t round_inner_steps() const { return std::max(inner_steps, speed_.round_steps); }

 private:
  std::vector<float> global_, momentum_, delta_;
  bool momentum_started_ = false;
  std::int64_t rounds_ = 0;
  bool weighs() const { return weighted || sized_to_speed; }

  round_weight weight_;
  speed_sizing speed_;
  collective::aggregation_record aggregation_;
  moshpit_averager averager_;
};

}  // namespace decentrain::comm
