// Differentiable layer normalisation over the last dim with a gain and a bias.
#pragma once

#include "decentrain/autograd/dispatch.hpp"
#include "decentrain/autograd/variable.hpp"
#include "decentrain/kernels/layer_norm.hpp"

namespace decentrain {

namespace detail {

template <class Device>
void check_layer_norm_args(const char* op, const var<Device>& x, const var<Device>& weight,
                           const var<Device>& bias, double eps) {
  check(x.rank() >= 1 && x.size(-1) > 0, op, ": input needs rank >= 1 and a non-empty last dim, got shape ",
        x.shape());
  const std::int64_t cols = x.size(-1);
  check(weight.shape() == shape{cols} && bias.shape() == shape{cols}, op, ": weight ", weight.shape(),
        " and bias ", bias.shape(), " must both have shape (", cols, ",) to match input shape ", x.shape());
  check(eps > 0.0, op, ": eps must be > 0, got ", eps);
  check_same_dtype(op, x.value(), weight.value());
  check_same_dtype(op, x.value(), bias.value());
}

// Normalises `input` (or input + residual, whose sum goes to *sum) and records the layer_norm
// node over `normalised_input`: the var holding exactly the values that were normalised.
template <class Device>
var<Device> layer_norm_node(const tensor<Device>& input, const tensor<Device>* residual, tensor<Device>* sum,
                            const var<Device>& normalised_input, const var<Device>& weight,
                            const var<Device>& bias, double eps) {
  const std::int64_t cols = input.size(-1);
  const std::int64_t rows = input.numel() / cols;
  const auto ct = input.dtype();
  auto out = tensor<Device>::empty(input.shape(), ct);
  auto mean = tensor<Device>::empty(shape{rows}, ct), rstd = tensor<Device>::empty(shape{rows}, ct);
  with_float_type(ct, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    const auto w = compute_tensor(weight.value()), b = compute_tensor(bias.value());
    kernels::layer_norm_forward(Device{}, out.template data<T>(), mean.template data<T>(),
                                rstd.template data<T>(), input.template data<T>(), w.template data<T>(),
                                b.template data<T>(), rows, cols, static_cast<T>(eps),
                                residual ? residual->template data<T>() : nullptr,
                                sum ? sum->template data<T>() : nullptr);
  });
  return record<Device>("layer_norm", stored_as(out, weight.dtype()), {normalised_input, weight, bias},
                        [mean, rstd, rows, cols](const tensor<Device>& g, node<Device>& n) {
    const auto cx = compute_tensor(n.input(0)), w = compute_tensor(n.input(1));
    const auto cg = compute_tensor(g);
    const auto ct = cx.dtype();
    tensor<Device> dx, dw, db;
    if (n.needs_grad(0)) dx = zeros<Device>(cx.shape(), ct);
    if (n.needs_grad(1)) dw = zeros<Device>(shape{cols}, ct);
    if (n.needs_grad(2)) db = zeros<Device>(shape{cols}, ct);
    with_float_type(ct, "layer_norm backward", [&](auto tag) {
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

}  // namespace detail

template <class Device>
var<Device> layer_norm(const var<Device>& x, const var<Device>& weight, const var<Device>& bias,
                       double eps = 1e-5) {
  detail::check_layer_norm_args("layer_norm", x, weight, bias, eps);
  const auto cx = detail::compute_tensor(x.value());
  return detail::layer_norm_node<Device>(cx, nullptr, nullptr, x, weight, bias, eps);
}

// The pre-LN residual step `sum = x + branch; normed = layer_norm(sum)` in one pass over the
// rows (llm.c's fused residual + layer_norm): the same values and gradients as the two ops.
template <class Device>
struct residual_norm {
  var<Device> sum;
  var<Device> normed;
};

template <class Device>
residual_norm<Device> add_layer_norm(const var<Device>& x, const var<Device>& branch, const var<Device>& weight,
                                     const var<Device>& bias, double eps = 1e-5) {
  detail::check_layer_norm_args("add_layer_norm", x, weight, bias, eps);
  detail::check(branch.shape() == x.shape(), "add_layer_norm: the branch's shape ", branch.shape(),
                " must equal the residual's ", x.shape());
  detail::check_same_dtype("add_layer_norm", x.value(), branch.value());
  if (x.dtype() == dtype::bf16) {
    // bf16 storage: the sum is rounded before it is normalised, which the fused kernel
    // (computing in f32) would skip; the two ops keep those semantics exactly.
    auto sum = x + branch;
    auto normed = layer_norm(sum, weight, bias, eps);
    return {std::move(sum), std::move(normed)};
  }
  const auto xs = x.value().contiguous(), bs = branch.value().contiguous();
  auto summed = tensor<Device>::empty(x.shape(), x.dtype());
  // Both nodes come from one kernel: `sum` is an add (its gradient passes to x and branch),
  // `normed` a layer_norm over `sum`.
  auto sum = record<Device>("add", summed, {x, branch}, [](const tensor<Device>& g, node<Device>& n) {
    n.accumulate(0, g);
    n.accumulate(1, g);
  });
  auto normed = detail::layer_norm_node(xs, &bs, &summed, sum, weight, bias, eps);
  return {std::move(sum), std::move(normed)};
}

}  // namespace decentrain
