// The data-parallel baseline (DDP): every step, gradients are averaged across the replicas with
// one all-reduce of the flattened gradient (through Codec, combined by Aggregator: the mean, or
// a robust aggregator against peers that send poison), so every replica applies the same update.
#pragma once

#include <vector>

#include "decentrain/comm/policy.hpp"

namespace decentrain::comm {

template <class Codec = compress::identity, class Aggregator = collective::mean>
struct sync_allreduce {
  static_assert(compress::check_codec<Codec>());
  static_assert(collective::check_aggregator<Aggregator>());
  using policy_concept = policy_tag;
  static constexpr const char* name = "sync";
  // Every step ends with the replicas' parameters the same (the averaged gradient, the same
  // update): a stage's part may be taken from any of them (train/trainer.hpp's redeal).
  static constexpr bool replicas_equal_after_step = true;

  Codec codec{};
  Aggregator aggregator{};
  // Average the replicas' gradients by their step weights (ctx.step_weight: the rows each took,
  // say) instead of equally: the mean scales them (one all-reduce of a number more a step), a
  // robust aggregator weighs them (collective::encoded_all_reduce). Every replica the same.
  bool weighted = false;

  template <class Ctx>
  void start(Ctx& ctx) {
    prepare_codec(codec, aggregator, ctx);
    check_weighs(aggregator, weighted, "sync_allreduce");
    if (!ctx.resumed) broadcast_parameters(ctx, buffer_);
  }
  template <class Ctx>
  void after_backward(Ctx& ctx) {
    if (ctx.replicas.world() == 1) return;
    gather_grads(ctx.parameters, buffer_);
    collective::encoded_all_reduce(codec, ctx.replicas, std::span<float>(buffer_), true, aggregator, aggregation_,
                         weight_if(weighted, ctx.step_weight));
    scatter_grads(ctx.parameters, buffer_);
  }
  // What each replica's gradients looked like: dropped (non-finite, malformed) or far away.
  const collective::aggregation_record& aggregation() const { return aggregation_; }
  template <class Ctx>
  void after_step(Ctx&) {}
  void save(io::checkpoint& c) const { save_codec(codec, c, "comm.sync.codec."); }
  void load(const io::checkpoint& c) { load_codec(codec, c, "comm.sync.codec."); }

 private:
  std::vector<float> buffer_;
  collective::aggregation_record aggregation_;
};

}  // namespace decentrain::comm
