// Local SGD (periodic averaging): peers train on their own for H steps, then replace their
// parameters by the average across peers. Optimizer state stays local.
#pragma once

#include <cstdint>
#include <vector>

#include "decentrain/comm/policy.hpp"

namespace decentrain::comm {

template <std::int64_t H = 50>
struct local_sgd {
  static_assert(H >= 1, "local_sgd<H>: H (inner steps between averages) must be >= 1");
  using policy_concept = policy_tag;
  static constexpr const char* name = "local-sgd";

  std::int64_t inner_steps = H;  // run-time override of H (the command line's --inner-steps)

  template <class Ctx>
  void start(Ctx& ctx) {
    decentrain::detail::check(inner_steps >= 1, "local_sgd: inner_steps must be >= 1, got ", inner_steps);
    if (!ctx.resumed) broadcast_parameters(ctx, buffer_);
  }
  template <class Ctx>
  void after_backward(Ctx&) {}
  template <class Ctx>
  void after_step(Ctx& ctx) {
    if (!ends_round(ctx, inner_steps)) return;
    gather_values(ctx.parameters, buffer_);
    ctx.comm.all_reduce(std::span<float>(buffer_), collective::reduce_op::average);
    scatter_values(ctx.parameters, buffer_);
  }
  void save(io::checkpoint&) const {}
  void load(const io::checkpoint&) {}

 private:
  std::vector<float> buffer_;
};

}  // namespace decentrain::comm
