// Global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_: when the L2 norm of all
// gradients together exceeds max_norm, every gradient is scaled by max_norm / (norm + 1e-6).
// The norm may span several peers (the stages of a pipeline): each gives its share.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "decentrain/autograd/math.hpp"
#include "decentrain/autograd/parameters.hpp"
#include "decentrain/kernels/optimizer.hpp"
#include "decentrain/optim/detail.hpp"

namespace decentrain::optim {

// This peer's share of a norm taken over several peers.
struct norm_share {
  // Parameters another peer counts (a tied copy held by two stages: counted once).
  std::vector<std::string> counted_elsewhere;
  // This peer's sum of squares -> everyone's (an all-reduce among the peers); none: this peer's.
  std::function<double(double)> total;
};

// Every gradient times `coef`: in place where nobody else sees the gradient (as PyTorch's mul_:
// a scaled copy of every gradient would hold a second set of them until the last was done), all
// of one type in one multi-tensor call (a GPU launch per gradient otherwise).
template <class Device>
void scale_grads(parameter_list<Device>& params, double coef) {
  std::vector<std::span<float>> f32_in_place;
  std::vector<std::span<double>> f64_in_place;
  for (auto& e : params) {
    auto& g = e.param.grad();
    if (!g.defined()) continue;
    if (!g.is_sole_owner()) g = math::affine(g, coef);
    else if (g.dtype() == dtype::f32) f32_in_place.emplace_back(g.template data<float>(), static_cast<std::size_t>(g.numel()));
    else if (g.dtype() == dtype::f64) f64_in_place.emplace_back(g.template data<double>(), static_cast<std::size_t>(g.numel()));
    else g = math::affine(g, coef);
  }
  kernels::scale_all(Device{}, std::span<const std::span<float>>(f32_in_place), static_cast<float>(coef));
  kernels::scale_all(Device{}, std::span<const std::span<double>>(f64_in_place), coef);
}

// Returns the norm before clipping (for logging). Parameters without gradients are ignored.
template <class Device>
double clip_grad_norm(parameter_list<Device>& params, double max_norm, const norm_share& share) {
  decentrain::detail::check(max_norm > 0.0, "clip_grad_norm: max_norm must be > 0, got ", max_norm);
  // Every gradient's sum of squares in one multi-tensor kernel call per master type, summed on
  // the gradients' device and read back once (a GPU synchronises once per clip).
  std::vector<tensor<Device>> grads;
  std::vector<std::span<const float>> f32;
  std::vector<std::span<const double>> f64;
  for (const auto& e : params) {
    if (!e.param.grad().defined()) continue;
    if (std::find(share.counted_elsewhere.begin(), share.counted_elsewhere.end(), e.name) != share.counted_elsewhere.end())
      continue;
    grads.push_back(e.param.grad().contiguous());
    const auto& g = grads.back();
    optim::detail::with_master_type("clip_grad_norm", e.name, e.param, [&](auto tag) {
      using T = decltype(tag);
      const std::span<const T> values(g.template data<T>(), static_cast<std::size_t>(g.numel()));
      if constexpr (std::is_same_v<T, float>) f32.push_back(values);
      else f64.push_back(values);
    });
  }
  auto partial = tensor<Device>::empty(shape{2}, dtype::f64);
  kernels::sum_of_squares(Device{}, std::span<const std::span<const float>>(f32), partial.template data<double>());
  kernels::sum_of_squares(Device{}, std::span<const std::span<const double>>(f64), partial.template data<double>() + 1);
  const double mine = grads.empty() ? 0.0 : math::sum(partial, {0}).item();
  const double total = share.total ? share.total(mine) : mine;
  const double norm = std::sqrt(total);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    grads.clear();  // so each gradient below is held by its parameter alone
    scale_grads(params, coef);
  }
  return norm;
}

template <class Device>
double clip_grad_norm(parameter_list<Device>& params, double max_norm) {
  return clip_grad_norm(params, max_norm, norm_share{});
}

#if defined(DECENTRAIN_COMPILED_LIB)
extern template double clip_grad_norm<cpu>(parameter_list<cpu>&, double);  // see config.hpp
#endif

}  // namespace decentrain::optim
