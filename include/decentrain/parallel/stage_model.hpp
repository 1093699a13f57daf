// What a model cut into stages must offer the policies that run it in parts (parallel::pipeline,
// parallel::swarm), beside a constructor that builds one part (nn::gpt has them); each member
// checked with a sentence naming it.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

#include "decentrain/autograd/variable.hpp"
#include "decentrain/core/rng.hpp"

namespace decentrain::parallel {

template <class Ctx>
constexpr bool check_stage_model() {
  using D = typename Ctx::device_type;
  using M = typename Ctx::model_type;
  static_assert(requires(const M& m, int s, const var<D>& in, const tensor<D>& ids, rng* r) {
                  { m.stage_forward(s, in, ids, ids, r) } -> std::same_as<var<D>>;
                },
                "parallel::pipeline and swarm: the model needs `var<D> stage_forward(int stage, const var<D>& in, const "
                "tensor<D>& ids, const tensor<D>& targets, rng* dropout) const` (a model stage's forward; the last returns "
                "the loss)");
  static_assert(requires(const M& m) { { m.stream_width() } -> std::convertible_to<std::int64_t>; },
                "parallel::pipeline and swarm: the model needs `std::int64_t stream_width() const` (C of the (B, T, C) "
                "stream between stages)");
  static_assert(requires(const M& m) { { m.tied_parameters() } -> std::same_as<std::vector<std::string>>; },
                "parallel::pipeline and swarm: the model needs `std::vector<std::string> tied_parameters() const` "
                "(parameters held by the first and the last stage, whose gradients are summed; empty when none)");
  return true;
}

}  // namespace decentrain::parallel
