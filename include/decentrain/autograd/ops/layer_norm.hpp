// Differentiable layer normalisation over the last dim with a gain and a bias.
#pragma once

#include "decentrain/autograd/dispatch.hpp"
#include "decentrain/autograd/variable.hpp"
#include "decentrain/kernels/layer_norm.hpp"

namespace decentrain {

template <class Device>
var<Device> layer_norm(const var<Device>& x, const var<Device>& weight, const var<Device>& bias,
                       double eps = 1e-5) {
  detail::check(x.rank() >= 1 && x.size(-1) > 0,
                "layer_norm: input needs rank >= 1 and a non-empty last dim, got shape ", x.shape());
  const std::int64_t cols = x.size(-1);
  detail::check(weight.shape() == shape{cols} && bias.shape() == shape{cols},
                "layer_norm: weight ", weight.shape(), " and bias ", bias.shape(),
                " must both have shape (", cols, ",) to match input shape ", x.shape());
  detail::check(eps > 0.0, "layer_norm: eps must be > 0, got ", eps);
  detail::check_same_dtype("layer_norm", x.value(), weight.value());
  detail::check_same_dtype("layer_norm", x.value(), bias.value());
  const std::int64_t rows = x.value().numel() / cols;
  const auto cx = detail::compute_tensor(x.value());
  const auto ct = cx.dtype();
  auto out = tensor<Device>::empty(x.shape(), ct);
  auto mean = tensor<Device>::empty(shape{rows}, ct), rstd = tensor<Device>::empty(shape{rows}, ct);
  detail::with_float_type(x.dtype(), "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    const auto w = detail::compute_tensor(weight.value()), b = detail::compute_tensor(bias.value());
    kernels::layer_norm_forward(Device{}, out.template data<T>(), mean.template data<T>(),
                                rstd.template data<T>(), cx.template data<T>(), w.template data<T>(),
                                b.template data<T>(), rows, cols, static_cast<T>(eps));
  });
  return record<Device>("layer_norm", detail::stored_as(out, x.dtype()), {x, weight, bias},
                        [mean, rstd, rows, cols](const tensor<Device>& g, node<Device>& n) {
    const auto cx = detail::compute_tensor(n.input(0)), w = detail::compute_tensor(n.input(1));
    const auto cg = detail::compute_tensor(g);
    const auto ct = cx.dtype();
    tensor<Device> dx, dw, db;
    if (n.needs_grad(0)) dx = zeros<Device>(cx.shape(), ct);
    if (n.needs_grad(1)) dw = zeros<Device>(shape{cols}, ct);
    if (n.needs_grad(2)) db = zeros<Device>(shape{cols}, ct);
    detail::with_float_type(ct, "layer_norm backward", [&](auto tag) {
      using T = decltype(tag);
      const auto ptr = [](tensor<Device>& t) { return t.defined() ? t.template data<T>() : nullptr; };
      kernels::layer_norm_backward(Device{}, ptr(dx), ptr(dw), ptr(db), cg.template data<T>(),
                                   cx.template data<T>(), w.template data<T>(),
                                   mean.template data<T>(), rstd.template data<T>(), rows, cols);
    });
    if (dx.defined()) n.accumulate(0, std::move(dx));
    if (dw.defined()) n.accumulate(1, std::move(dw));
    if (db.defined()) n.accumulate(2, std::move(db));
  });
}

}  // namespace decentrain
