// Local SGD (periodic averaging): replicas train on their own for `inner_steps` steps, then
// replace their parameters by the average across replicas (sent through Codec, combined by
// Aggregator). Optimizer state stays local.
#pragma once

#include <cstdint>
#include <vector>

#include "decentrain/comm/policy.hpp"

namespace decentrain::comm {

template <class Codec = compress::identity, class Aggregator = collective::mean>
struct local_sgd {
  static_assert(compress::check_codec<Codec>());
  static_assert(collective::check_aggregator<Aggregator>());
  using policy_concept = policy_tag;
  static constexpr const char* name = "local-sgd";

  std::int64_t inner_steps = 50;  // steps between averages
  Codec codec{};
  Aggregator aggregator{};
  // Average the replicas by the weight of their rounds (the sum of ctx.step_weight over the
  // round's steps: the rows each took, say) instead of equally (collective::encoded_all_reduce: the mean
  // scales, a robust aggregator weighs). Every replica the same.
  bool weighted = false;

  template <class Ctx>
  void start(Ctx& ctx) {
    decentrain::detail::check(inner_steps >= 1, "local_sgd: inner_steps must be >= 1, got ", inner_steps);
    prepare_codec(codec, aggregator, ctx);
    check_weighs(aggregator, weighted, "local_sgd");
    if (!ctx.resumed) broadcast_parameters(ctx, buffer_);
  }
  template <class Ctx>
  void after_backward(Ctx&) {}
  template <class Ctx>
  void after_step(Ctx& ctx) {
    weight_.add(ctx);
    if (!ends_round(ctx, inner_steps)) return;
    gather_values(ctx.parameters, buffer_);
    collective::encoded_all_reduce(codec, ctx.replicas, std::span<float>(buffer_), true, aggregator, aggregation_,
                         weight_if(weighted, weight_.sum));
    scatter_values(ctx.parameters, buffer_);
    weight_.sum = 0;
  }
  bool ends_round_at(std::int64_t step) const { return ends_round(step, inner_steps); }
  const collective::aggregation_record& aggregation() const { return aggregation_; }
  void save(io::checkpoint& c) const {
    save_codec(codec, c, "comm.local_sgd.codec.");
    weight_.save(c, "comm.local_sgd.");
  }
  void load(const io::checkpoint& c) {
    load_codec(codec, c, "comm.local_sgd.codec.");
    weight_.load(c, "comm.local_sgd.");
  }

 private:
  std::vector<float> buffer_;
  round_weight weight_;
  collective::aggregation_record aggregation_;
};

}  // namespace decentrain::comm
