// Differentiable layer normalisation over the last dim with a gain and a bias.
#pragma once

#include <optional>

#include "decentrain/autograd/dispatch.hpp"
#include "decentrain/autograd/ops/cast.hpp"
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

// The stored form in which an op with compute type T hands `x` to a kernel that reads T or
// bf16: bf16 as it is where the device's kernels store bf16 (kernels::native_bf16), otherwise
// converted to T.
template <class Device>
tensor<Device> storage_for(const tensor<Device>& x, dtype compute) {
  return kernels::native_bf16<Device> && x.dtype() == dtype::bf16 ? x.contiguous() : contiguous_as(x, compute);
}

// f(bf16{}) for bf16 storage on a device whose kernels store bf16, otherwise f(T{}), T the
// compute type (see storage_for).
template <class Device, class T, class F>
void with_storage(dtype stored, F&& f) {
  if constexpr (kernels::native_bf16<Device>)
    if (stored == dtype::bf16) return f(bf16{});
  f(T{});
}

// Normalises `input` (or input + residual, whose sum goes to *sum) and records the layer_norm
// node over `normalised_input`: the var holding exactly the values that were normalised. The
// output is stored as `out_dtype`, the residual may be of another float dtype than the input:
// on a device whose kernels store bf16 they read and write bf16 themselves, so a bf16 branch
// and a bf16 output around an f32 residual stream cost no separate casts.
template <class Device>
var<Device> layer_norm_node(const tensor<Device>& input, const tensor<Device>* residual, tensor<Device>* sum,
                            const var<Device>& normalised_input, const var<Device>& weight,
                            const var<Device>& bias, double eps, dtype out_dtype) {
  const std::int64_t cols = input.size(-1);
  const std::int64_t rows = input.numel() / cols;
  const auto in_type = input.dtype();
  auto out = tensor<Device>::empty(input.shape(), kernel_dtype<Device>(out_dtype) == dtype::bf16 ? dtype::bf16 : in_type);
  auto mean = tensor<Device>::empty(shape{rows}, in_type), rstd = tensor<Device>::empty(shape{rows}, in_type);
  const auto res = residual ? storage_for(*residual, in_type) : tensor<Device>{};
  with_float_type(in_type, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    const auto w = compute_tensor(weight.value()), b = compute_tensor(bias.value());
    with_storage<Device, T>(out.dtype(), [&](auto out_tag) {
      using O = decltype(out_tag);
      with_storage<Device, T>(res.defined() ? res.dtype() : in_type, [&](auto res_tag) {
        using R = decltype(res_tag);
        kernels::layer_norm_forward(Device{}, out.template data<O>(), mean.template data<T>(),
                                    rstd.template data<T>(), input.template data<T>(), w.template data<T>(),
                                    b.template data<T>(), rows, cols, static_cast<T>(eps),
                                    res.defined() ? res.template data<R>() : static_cast<const R*>(nullptr),
                                    sum ? sum->template data<T>() : nullptr);
      });
    });
  });
  return record<Device>("layer_norm", stored_as(out, out_dtype), {normalised_input, weight, bias},
                        [mean, rstd, rows, cols](const tensor<Device>& g, node<Device>& n) {
    const auto cx = compute_tensor(n.input(0)), w = compute_tensor(n.input(1));
    const auto ct = cx.dtype();
    const auto cg = storage_for(g, ct);
    // The input's gradient so far takes this op's share in place where it can (the residual
    // stream's, which the next block's add has already given), otherwise a fresh one does.
    tensor<Device> dx, dw, db;
    bool dx_in_place = false;
    if (n.needs_grad(0)) {
      dx = n.grad_in_place(0, ct);
      dx_in_place = dx.defined();
      if (!dx_in_place) dx = zeros<Device>(cx.shape(), ct);
    }
    if (n.needs_grad(1)) dw = zeros<Device>(shape{cols}, ct);
    if (n.needs_grad(2)) db = zeros<Device>(shape{cols}, ct);
    with_float_type(ct, "layer_norm backward", [&](auto tag) {
      using T = decltype(tag);
      const auto ptr = [](tensor<Device>& t) { return t.defined() ? t.template data<T>() : nullptr; };
      with_storage<Device, T>(cg.dtype(), [&](auto g_tag) {
        using G = decltype(g_tag);
        kernels::layer_norm_backward(Device{}, ptr(dx), ptr(dw), ptr(db), cg.template data<G>(),
                                     cx.template data<T>(), w.template data<T>(),
                                     mean.template data<T>(), rstd.template data<T>(), rows, cols);
      });
    });
    if (dx.defined() && !dx_in_place) n.accumulate(0, std::move(dx));
    if (dw.defined()) n.accumulate(1, std::move(dw));
    if (db.defined()) n.accumulate(2, std::move(db));
  });
}

}  // namespace detail

// Layer normalisation over the last dim; the result is stored as `out_dtype` (x's dtype when
// not given): under mixed precision an f32 input gives the bf16 activations the next product
// reads, rounded once, as a cast after the op would.
template <class Device>
var<Device> layer_norm(const var<Device>& x, const var<Device>& weight, const var<Device>& bias,
                       double eps = 1e-5, std::optional<dtype> out_dtype = std::nullopt) {
  detail::check_layer_norm_args("layer_norm", x, weight, bias, eps);
  const auto od = out_dtype.value_or(x.dtype());
  detail::check(is_floating(od), "layer_norm: output dtype must be floating-point, got ", dtype_name(od));
  const auto cx = detail::compute_tensor(x.value());
  return detail::layer_norm_node<Device>(cx, nullptr, nullptr, x, weight, bias, eps, od);
}

// The pre-LN residual step `sum = x + branch; normed = layer_norm(sum)` in one pass over the
// rows (llm.c's fused residual + layer_norm): the same values and gradients as the two ops.
// The sum takes x's dtype (the branch, say the bf16 output of a block under mixed precision,
// is widened to it, as `x + cast(branch, x.dtype())`); `normed` is stored as `out_dtype`.
template <class Device>
struct residual_norm {
  var<Device> sum;
  var<Device> normed;
};

template <class Device>
residual_norm<Device> add_layer_norm(const var<Device>& x, const var<Device>& branch, const var<Device>& weight,
                                     const var<Device>& bias, double eps = 1e-5,
                                     std::optional<dtype> out_dtype = std::nullopt) {
  detail::check_layer_norm_args("add_layer_norm", x, weight, bias, eps);
  detail::check(branch.shape() == x.shape(), "add_layer_norm: the branch's shape ", branch.shape(),
                " must equal the residual's ", x.shape());
  detail::check(is_floating(branch.dtype()), "add_layer_norm: the branch must be floating-point, got ",
                dtype_name(branch.dtype()));
  const auto od = out_dtype.value_or(x.dtype());
  detail::check(is_floating(od), "add_layer_norm: output dtype must be floating-point, got ", dtype_name(od));
  if (x.dtype() == dtype::bf16) {
    // bf16 storage: the sum is rounded before it is normalised, which the fused kernel
    // (computing in f32) would skip; the two ops keep those semantics exactly.
    auto sum = x + cast(branch, x.dtype());
    auto normed = layer_norm(sum, weight, bias, eps, od);
    return {std::move(sum), std::move(normed)};
  }
  const auto xs = x.value().contiguous();
  const auto bs = branch.value();
  auto summed = tensor<Device>::empty(x.shape(), x.dtype());
  // Both nodes come from one kernel: `sum` is an add (its gradient passes to x and, in the
  // branch's dtype, to the branch), `normed` a layer_norm over `sum`.
  auto sum = record<Device>("add", summed, {x, branch}, [](const tensor<Device>& g, node<Device>& n) {
    n.accumulate(0, g);
    n.accumulate(1, g);
  });
  auto normed = detail::layer_norm_node(xs, &bs, &summed, sum, weight, bias, eps, od);
  return {std::move(sum), std::move(normed)};
}

}  // namespace decentrain
