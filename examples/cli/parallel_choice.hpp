// --parallel data | pipeline | swarm as one parallel policy type: the CLI compiles a trainer for
// each pair of communication and fault policies, and a type per parallelism would double them.
// It forwards each member the trainer uses to the policy chosen.
#pragma once

#include <decentrain/decentrain.hpp>

#include <cstdint>
#include <vector>

namespace cli {

namespace dt = decentrain;

struct parallel_choice {
  using policy_concept = dt::parallel::policy_tag;
  static constexpr const char* name = "cli";
  using pipeline_type = dt::parallel::pipeline<dt::collective::any_codec>;
  using swarm_type = dt::parallel::swarm<dt::collective::any_codec>;

  pipeline_type pipe;  // one stage: data parallelism
  swarm_type pools;
  bool swarm = false;

  int stages() const { return swarm ? pools.stages : pipe.stages; }
  int micro_batches() const { return swarm ? pools.micro_batches : pipe.micro_batches; }
  const dt::collective::any_codec& codec() const { return swarm ? pools.codec : pipe.codec; }

  dt::parallel::placement place(int rank, int world) const { return swarm ? pools.place(rank, world) : pipe.place(rank, world); }
  int morph(int world, std::int64_t n_blocks) { return swarm ? pools.morph(world, n_blocks) : pipe.morph(world, n_blocks); }
  void regroup(const std::vector<int>& before, const std::vector<int>& before_stages, const std::vector<int>& after,
               std::int64_t n_blocks) {
    if (swarm) pools.regroup(before, before_stages, after, n_blocks);
    else pipe.morph(static_cast<int>(after.size()), n_blocks);
  }

  template <class Ctx>
  static constexpr bool check_model() {
    return pipeline_type::check_model<Ctx>() && swarm_type::check_model<Ctx>();
  }
  bool accumulates_gradients() const { return !swarm; }
  template <class Ctx>
  dt::parallel::step_result forward_backward(Ctx& ctx) {
    return swarm ? pools.forward_backward(ctx) : pipe.forward_backward(ctx);
  }
  template <class Ctx>
  double evaluate(Ctx& ctx, std::int64_t batch) {
    return swarm ? pools.evaluate(ctx, batch) : pipe.evaluate(ctx, batch);
  }
  template <class Ctx>
  dt::optim::norm_share grad_norm_share(Ctx& ctx) {
    return swarm ? pools.grad_norm_share(ctx) : pipe.grad_norm_share(ctx);
  }
  template <class Ctx>
  void after_averaging(Ctx& ctx) {
    if (swarm) pools.after_averaging(ctx);
  }
  template <class Ctx>
  void between_steps(Ctx& ctx) {
    if (swarm) pools.between_steps(ctx);
  }
  void save(dt::io::checkpoint& c) const {
    if (swarm) pools.save(c);
  }
  void load(const dt::io::checkpoint& c) {
    if (swarm) pools.load(c);
  }
  const dt::parallel::schedule::run_stats& last_run() const { return pipe.last_run(); }
  const dt::parallel::swarm_stats& swarm_stats() const { return pools.stats(); }
  auto take_checked(std::int64_t before_step) { return pools.take_checked(before_step); }
};

}  // namespace cli
