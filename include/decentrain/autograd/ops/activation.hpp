// Differentiable GELU (tanh form), softmax and log-softmax over the last dim.
#pragma once

#include "decentrain/autograd/dispatch.hpp"
#include "decentrain/autograd/variable.hpp"
#include "decentrain/kernels/activation.hpp"
#include "decentrain/kernels/softmax.hpp"

namespace decentrain {

template <class Device>
var<Device> gelu(const var<Device>& x) {
  const auto x_in = detail::kernel_tensor(x.value());
  auto out = tensor<Device>::empty(x.shape(), x_in.dtype());
  detail::with_kernel_type<Device>(x.dtype(), "gelu", [&](auto tag) {
    using T = decltype(tag);
    kernels::gelu_forward(Device{}, out.template data<T>(), x_in.template data<T>(), x_in.numel());
  });
  return record<Device>("gelu", detail::stored_as(out, x.dtype()), {x},
                        [](const tensor<Device>& g, node<Device>& n) {
    const auto cx = detail::kernel_tensor(n.input(0)), cg = detail::contiguous_as(g, cx.dtype());
    auto dx = tensor<Device>::empty(cx.shape(), cx.dtype());  // written whole by the kernel
    detail::with_kernel_type<Device>(n.input(0).dtype(), "gelu backward", [&](auto tag) {
      using T = decltype(tag);
      kernels::gelu_backward(Device{}, dx.template data<T>(), cx.template data<T>(),
                             cg.template data<T>(), cx.numel());
    });
    n.accumulate(0, std::move(dx));
  });
}

namespace detail {
template <class Device>
var<Device> softmax_op(const var<Device>& x, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  check(x.rank() >= 1 && x.size(-1) > 0, name, ": needs a non-empty last dim, got shape ", x.shape());
  const auto cx = compute_tensor(x.value());
  const std::int64_t cols = x.size(-1), rows = x.value().numel() / cols;
  auto out = tensor<Device>::empty(x.shape(), cx.dtype());
  with_float_type(x.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    kernels::softmax_forward(Device{}, out.template data<T>(), cx.template data<T>(), rows, cols, log);
  });
  return record<Device>(name, stored_as(out, x.dtype()), {x},
                        [out, rows, cols, log](const tensor<Device>& g, node<Device>& n) {
    const auto cg = compute_tensor(g);
    auto dx = zeros<Device>(out.shape(), out.dtype());
    with_float_type(out.dtype(), "softmax backward", [&](auto tag) {
      using T = decltype(tag);
      kernels::softmax_backward(Device{}, dx.template data<T>(), out.template data<T>(),
                                cg.template data<T>(), rows, cols, log);
    });
    n.accumulate(0, std::move(dx));
  });
}
}  // namespace detail

// Softmax over the last dim.
template <class Device>
var<Device> softmax(const var<Device>& x) { return detail::softmax_op(x, false); }

// Log of the softmax over the last dim, computed stably.
template <class Device>
var<Device> log_softmax(const var<Device>& x) { return detail::softmax_op(x, true); }

}  // namespace decentrain
