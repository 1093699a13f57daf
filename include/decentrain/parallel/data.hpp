// Data parallelism: every peer holds the whole model and trains on its own rows of the global
// batch (rows rank*B .. rank*B+B-1 of step `step`), one forward and one backward per step.
#pragma once

#include <concepts>
#include <cstdint>

#include "decentrain/autograd/variable.hpp"
#include "decentrain/core/transfer.hpp"
#include "decentrain/data/dataset.hpp"
#include "decentrain/parallel/policy.hpp"

namespace decentrain::parallel {

struct data {
  using policy_concept = policy_tag;
  static constexpr const char* name = "data";
  // Adds a step's inner steps' gradients up where the trainer asks (ctx.accumulating).
  bool accumulates_gradients() const { return true; }

  placement place(int, int world) const { return everyone(world); }

  // What this policy needs of the model (the trainer asserts it where the policy has one).
  template <class Ctx>
  static constexpr bool check_model() {
    using D = typename Ctx::device_type;
    static_assert(requires(typename Ctx::model_type& m, const tensor<D>& ids, rng* r) {
                    { m.loss(ids, ids, r) } -> std::same_as<var<D>>;
                  },
                  "parallel::data: the model needs `var<D> loss(const tensor<D>& ids, const tensor<D>& targets, rng* dropout)`");
    return true;
  }

  template <class Ctx>
  step_result forward_backward(Ctx& ctx) {
    using D = typename Ctx::device_type;
    const std::int64_t B = ctx.batch_size, T = ctx.block;
    // Rows of their own for each of a step's inner steps (ctx.sub_step, where work is sized to
    // speed): the k-th takes the rows of a world k times over, the first those of this one.
    const std::int64_t world = ctx.comm.world();
    auto [x, y] = ctx.dataset.template batch<cpu>(decentrain::data::split::train, ctx.step, B, T, ctx.seed,
                                                  ctx.sub_step * world + ctx.comm.rank(), (ctx.sub_step + 1) * world);
    auto loss = ctx.model.loss(to_device<D>(x), to_device<D>(y), &ctx.dropout);
    if (!ctx.accumulating || ctx.sub_step == 0) ctx.parameters.zero_grad();  // (else added to: ctx.accumulating)
    loss.backward();
    return {loss.item(), B, B * T, static_cast<double>(B)};
  }

  template <class Ctx>
  double evaluate(Ctx& ctx, std::int64_t batch) {
    using D = typename Ctx::device_type;
    auto [x, y] = ctx.dataset.template batch<cpu>(decentrain::data::split::validation, batch, ctx.batch_size, ctx.block,
                                                  ctx.seed, ctx.comm.rank(), ctx.comm.world());
    return ctx.model.loss(to_device<D>(x), to_device<D>(y)).item();
  }
};

}  // namespace decentrain::parallel
