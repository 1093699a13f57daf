// Differentiable reductions: sum and mean over any set of axes.
#pragma once

#include <vector>

#include "decentrain/autograd/math.hpp"
#include "decentrain/autograd/variable.hpp"

namespace decentrain {

namespace detail {
template <class Device>
var<Device> reduce_op(const char* name, const var<Device>& x, std::vector<std::int64_t> axes,
                      bool keepdim, bool average) {
  std::int64_t count = 1;
  auto kept_sizes = x.shape().sizes();  // x's rank with 1 on the reduced dims
  for (auto a : axes) {
    const auto d = x.shape().normalize_axis(a);
    count *= x.shape()[d];
    kept_sizes[d] = 1;
  }
  const double scale = average ? 1.0 / static_cast<double>(count) : 1.0;
  auto out = math::sum(x.value(), axes, keepdim, scale);
  const shape kept(kept_sizes);
  return record<Device>(name, out, {x}, [kept, scale](const tensor<Device>& g, node<Device>& n) {
    n.accumulate(0, math::broadcast_to(math::affine(g.reshape(kept), scale), n.input(0).shape()));
  });
}
}  // namespace detail

// Sum over `axes` (all axes when empty).
template <class Device>
var<Device> sum(const var<Device>& x, std::vector<std::int64_t> axes = {}, bool keepdim = false) {
  if (axes.empty())
    for (std::size_t d = 0; d < x.rank(); ++d) axes.push_back(static_cast<std::int64_t>(d));
  return detail::reduce_op("sum", x, std::move(axes), keepdim, false);
}

// Mean over `axes` (all axes when empty).
template <class Device>
var<Device> mean(const var<Device>& x, std::vector<std::int64_t> axes = {}, bool keepdim = false) {
  if (axes.empty())
    for (std::size_t d = 0; d < x.rank(); ++d) axes.push_back(static_cast<std::int64_t>(d));
  return detail::reduce_op("mean", x, std::move(axes), keepdim, true);
}

}  // namespace decentrain
