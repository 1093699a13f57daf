// Differentiable fused causal self-attention: softmax(q k^T / sqrt(D) + causal mask) v per
// head, for q, k, v of shape (B, T, C) split into n_head heads of D = C / n_head columns.
#pragma once

#include "decentrain/autograd/dispatch.hpp"
#include "decentrain/autograd/variable.hpp"
#include "decentrain/kernels/attention.hpp"

namespace decentrain {

template <class Device>
var<Device> causal_attention(const var<Device>& q, const var<Device>& k, const var<Device>& v,
                             std::int64_t n_head) {
  detail::check(q.rank() == 3, "causal_attention: q must be (B, T, C), got shape ", q.shape());
  detail::check(k.shape() == q.shape() && v.shape() == q.shape(), "causal_attention: q ", q.shape(),
                ", k ", k.shape(), " and v ", v.shape(), " must have the same shape");
  detail::check(n_head > 0 && q.size(2) % n_head == 0, "causal_attention: n_head = ", n_head,
                " must be positive and divide C = ", q.size(2));
  detail::check_same_dtype("causal_attention", q.value(), k.value());
  detail::check_same_dtype("causal_attention", q.value(), v.value());
  const std::int64_t B = q.size(0), T = q.size(1), C = q.size(2);
  const auto cq = detail::compute_tensor(q.value()), ck = detail::compute_tensor(k.value()),
             cv = detail::compute_tensor(v.value());
  auto out = tensor<Device>::empty(q.shape(), cq.dtype());
  // The device decides what the backward needs: the probabilities (B, H, T, T) on the CPU,
  // only the logsumexp per row (B, H, T) on the GPU, which recomputes the rest.
  auto saved = tensor<Device>::empty(shape(kernels::attention_saved_sizes(Device{}, B, n_head, T)), cq.dtype());
  detail::with_float_type(q.dtype(), "causal_attention", [&](auto tag) {
    using T_ = decltype(tag);
    kernels::attention_forward(Device{}, out.template data<T_>(), saved.template data<T_>(),
                               cq.template data<T_>(), ck.template data<T_>(),
                               cv.template data<T_>(), B, T, C, n_head);
  });
  // `out` in the compute dtype is kept as well: for f32 it is the very storage the next op
  // keeps anyway, so it costs nothing.
  return record<Device>("causal_attention", detail::stored_as(out, q.dtype()), {q, k, v},
                        [out, saved, B, T, C, n_head](const tensor<Device>& g, node<Device>& n) {
    const auto cq = detail::compute_tensor(n.input(0)), ck = detail::compute_tensor(n.input(1)),
               cv = detail::compute_tensor(n.input(2)), cg = detail::compute_tensor(g);
    auto dq = zeros<Device>(cq.shape(), cq.dtype()), dk = zeros<Device>(cq.shape(), cq.dtype()),
         dv = zeros<Device>(cq.shape(), cq.dtype());
    detail::with_float_type(cq.dtype(), "causal_attention backward", [&](auto tag) {
      using T_ = decltype(tag);
      kernels::attention_backward(Device{}, dq.template data<T_>(), dk.template data<T_>(),
                                  dv.template data<T_>(), cg.template data<T_>(), out.template data<T_>(),
                                  saved.template data<T_>(), cq.template data<T_>(),
                                  ck.template data<T_>(), cv.template data<T_>(), B, T, C, n_head);
    });
    n.accumulate(0, std::move(dq));
    n.accumulate(1, std::move(dk));
    n.accumulate(2, std::move(dv));
  });
}

}  // namespace decentrain
