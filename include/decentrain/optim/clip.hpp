// Global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_: when the L2 norm of all
// gradients together exceeds max_norm, every gradient is scaled by max_norm / (norm + 1e-6).
#pragma once

#include <cmath>

#include "decentrain/autograd/math.hpp"
#include "decentrain/autograd/parameters.hpp"
#include "decentrain/kernels/optimizer.hpp"
#include "decentrain/optim/detail.hpp"

namespace decentrain::optim {

// Returns the norm before clipping (for logging). Parameters without gradients are ignored.
template <class Device>
double clip_grad_norm(parameter_list<Device>& params, double max_norm) {
  decentrain::detail::check(max_norm > 0.0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  // One partial sum per gradient, on the gradients' device, summed and read back once (a GPU
  // then synchronises once per clip, not once per tensor).
  auto partial = tensor<Device>::empty(shape{static_cast<std::int64_t>(params.size())}, dtype::f64);
  std::int64_t used = 0;
  for (const auto& e : params) {
    if (!e.param.grad().defined()) continue;
    const auto g = e.param.grad().contiguous();
    optim::detail::with_master_type("clip_grad_norm", e.name, e.param, [&](auto tag) {
      using T = decltype(tag);
      kernels::sum_of_squares(Device{}, g.template data<T>(), g.numel(), partial.template data<double>() + used++);
    });
  }
  const double total = used ? math::sum(partial.slice(0, 0, used), {0}).item() : 0.0;
  const double norm = std::sqrt(total);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    for (auto& e : params) {
      if (!e.param.grad().defined()) continue;
      e.param.grad() = math::affine(e.param.grad(), coef);
    }
  }
  return norm;
}

}  // namespace decentrain::optim
