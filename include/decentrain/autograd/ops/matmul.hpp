// Differentiable matrix products: matmul (batched, with transposes), linear (x W + b) and
// linear_gelu (the MLP's first layer, fused).
#pragma once

#include "decentrain/autograd/math.hpp"
#include "decentrain/autograd/variable.hpp"
#include "decentrain/kernels/activation.hpp"
#include "decentrain/kernels/linear.hpp"

namespace decentrain {

namespace detail {
// Gradients of c = op(a) op(b), each written into a buffer shaped like its operand (a 2-D
// operand of a batched product receives the sum over the batch).
template <class Device>
void matmul_backward(const tensor<Device>& g, node<Device>& n, bool ta, bool tb) {
  const auto a = math::gemm_operand(n.input(0)), b = math::gemm_operand(n.input(1));
  const auto gc = math::gemm_operand(g);
  const dtype result = detail::kernel_dtype<Device>(g.dtype());
  if (n.needs_grad(0)) {
    auto da = tensor<Device>::empty(a.shape(), result);
    if (!ta) math::gemm_batched(false, !tb, gc, b, da, 1.0, 0.0);  // dA = dC op(B)^T
    else math::gemm_batched(tb, true, b, gc, da, 1.0, 0.0);        // dA = op(B) dC^T
    n.accumulate(0, std::move(da));
  }
  if (n.needs_grad(1)) {
    auto db = tensor<Device>::empty(b.shape(), result);
    if (!tb) math::gemm_batched(!ta, false, a, gc, db, 1.0, 0.0);  // dB = op(A)^T dC
    else math::gemm_batched(true, ta, gc, a, db, 1.0, 0.0);        // dB = dC^T op(A)
    n.accumulate(1, std::move(db));
  }
}
}  // namespace detail

// op(a) x op(b) over the last two dims. Leading (batch) dims must be equal, or one operand
// must be 2-D and is then shared by every batch entry.
template <class Device>
var<Device> matmul(const var<Device>& a, const var<Device>& b, bool trans_a = false,
                   bool trans_b = false) {
  return record<Device>("matmul", math::matmul(a.value(), b.value(), trans_a, trans_b), {a, b},
                        [trans_a, trans_b](const tensor<Device>& g, node<Device>& n) {
                          detail::matmul_backward(g, n, trans_a, trans_b);
                        });
}

namespace detail {
// x W (+ b), then GELU when `with_gelu`: one fused kernel call forward (kernels/linear.hpp);
// with GELU the pre-activation is kept, in the activation dtype, for the backward pass.
template <class Device>
var<Device> linear_op(const var<Device>& x, const var<Device>& weight, const var<Device>* bias, bool with_gelu) {
  const char* name = with_gelu ? "linear_gelu" : "linear";
  detail::check(weight.rank() == 2, name, ": weight must be 2-D (in, out), got shape ", weight.shape());
  detail::check(x.rank() >= 1 && x.size(-1) == weight.size(0), name, ": input shape ", x.shape(),
                " does not match weight shape ", weight.shape(), " (expected last input dim ",
                weight.size(0), ")");
  if (bias) {
    detail::check(bias->rank() == 1 && bias->size(0) == weight.size(1), name, ": bias shape ",
                  bias->shape(), " does not match weight shape ", weight.shape(), " (expected (",
                  weight.size(1), ",))");
    detail::check_same_dtype(name, x.value(), bias->value());
  }
  detail::check_same_dtype(name, x.value(), weight.value());
  // Leading dims are flattened so the product is one GEMM of (rows, in) x (in, out).
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < x.rank(); ++d) rows *= x.shape()[d];
  const std::int64_t in = weight.size(0), width = weight.size(1);
  auto out_sizes = x.shape().sizes();
  out_sizes.back() = width;
  const auto x2 = math::gemm_operand(x.value()).reshape({rows, in});
  const auto w = math::gemm_operand(weight.value());
  const dtype result = detail::kernel_dtype<Device>(x.dtype());
  const auto b = bias ? detail::contiguous_as(bias->value(), result) : tensor<Device>{};
  auto out = tensor<Device>::empty(shape({rows, width}), result);
  auto pre = with_gelu ? tensor<Device>::empty(shape({rows, width}), result) : tensor<Device>{};
  const auto run = [&](auto in_tag, auto out_tag) {
    using In = decltype(in_tag);
    using Out = decltype(out_tag);
    kernels::linear_forward(Device{}, rows, width, in, x2.template data<In>(), w.template data<In>(),
                            bias ? b.template data<Out>() : nullptr, out.template data<Out>(),
                            with_gelu ? pre.template data<Out>() : nullptr);
  };
  if (x2.dtype() == dtype::bf16) {
    if constexpr (kernels::native_bf16<Device>) run(bf16{}, bf16{});
    else detail::fail(name, ": bf16 operands on a device without a bf16 GEMM");
  } else {
    detail::with_float_type(result, name, [&](auto tag) { run(tag, tag); });
  }
  out = detail::stored_as(out.reshape(out_sizes), x.dtype());
  if (with_gelu) pre = detail::stored_as(std::move(pre), x.dtype());

  std::vector<var<Device>> inputs{x, weight};
  if (bias) inputs.push_back(*bias);
  return record<Device>(name, out, inputs, [rows, in, width, pre](const tensor<Device>& g, node<Device>& n) {
    const dtype result = detail::kernel_dtype<Device>(g.dtype());
    tensor<Device> g_pre = g;
    if (pre.defined()) {  // through GELU first, then stored as an unfused GELU's gradient would be
      const auto cp = detail::kernel_tensor(pre), cg = detail::contiguous_as(g, cp.dtype());
      auto d = tensor<Device>::empty(cp.shape(), cp.dtype());  // written whole by the kernel
      detail::with_kernel_type<Device>(pre.dtype(), "linear_gelu backward", [&](auto tag) {
        using T = decltype(tag);
        kernels::gelu_backward(Device{}, d.template data<T>(), cp.template data<T>(), cg.template data<T>(), cp.numel());
      });
      g_pre = detail::stored_as(std::move(d), g.dtype());
    }
    const auto g2 = math::gemm_operand(g_pre).reshape({rows, width});
    if (n.needs_grad(0)) {
      auto dx = tensor<Device>::empty(shape({rows, in}), result);
      math::gemm_batched(false, true, g2, math::gemm_operand(n.input(1)), dx, 1.0, 0.0);
      n.accumulate(0, dx.reshape(n.input(0).shape()));
    }
    if (n.needs_grad(1)) {
      auto dw = tensor<Device>::empty(shape({in, width}), result);
      const auto x2 = math::gemm_operand(n.input(0)).reshape({rows, in});
      math::gemm_batched(true, false, x2, g2, dw, 1.0, 0.0);
      n.accumulate(1, std::move(dw));
    }
    if (n.inputs.size() > 2 && n.needs_grad(2)) n.accumulate(2, math::sum(g2, {0}));
  });
}
}  // namespace detail

// x (..., in) times weight (in, out) plus bias (out,): one GEMM over all leading dims.
template <class Device>
var<Device> linear(const var<Device>& x, const var<Device>& weight, const var<Device>& bias) {
  return detail::linear_op(x, weight, &bias, false);
}

// x (..., in) times weight (in, out), without a bias.
template <class Device>
var<Device> linear(const var<Device>& x, const var<Device>& weight) {
  return detail::linear_op<Device>(x, weight, nullptr, false);
}

// gelu(linear(x, weight, bias)) as one op: the MLP's first layer. Same values and gradients as
// the two ops (bit for bit on the CPU); a GPU fuses bias and GELU into the GEMM.
template <class Device>
var<Device> linear_gelu(const var<Device>& x, const var<Device>& weight, const var<Device>& bias) {
  return detail::linear_op(x, weight, &bias, true);
}

// gelu(linear(x, weight)) as one op.
template <class Device>
var<Device> linear_gelu(const var<Device>& x, const var<Device>& weight) {
  return detail::linear_op<Device>(x, weight, nullptr, true);
}

}  // namespace decentrain
