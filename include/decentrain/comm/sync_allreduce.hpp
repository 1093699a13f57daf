// The data-parallel baseline (DDP): every step, gradients are averaged across peers with one
// all-reduce of the flattened gradient, so every peer applies the same update.
#pragma once

#include <string>
#include <vector>

#include "decentrain/comm/policy.hpp"

namespace decentrain::comm {

struct sync_allreduce {
  using policy_concept = policy_tag;
  static constexpr const char* name = "sync";

  template <class Ctx>
  void start(Ctx& ctx) {
    if (!ctx.resumed) broadcast_parameters(ctx, buffer_);
  }
  template <class Ctx>
  void after_backward(Ctx& ctx) {
    if (ctx.comm.world() == 1) return;
    gather_grads(ctx.parameters, buffer_);
    ctx.comm.all_reduce(std::span<float>(buffer_), collective::reduce_op::average);
    scatter_grads(ctx.parameters, buffer_);
  }
  template <class Ctx>
  void after_step(Ctx&) {}
  void save(io::checkpoint&) const {}
  void load(const io::checkpoint&) {}

 private:
  std::vector<float> buffer_;
};

}  // namespace decentrain::comm
