// Differentiable fused causal self-attention: softmax(q k^T / sqrt(D) + causal mask) v per
// head, for q, k, v of shape (B, T, C) split into n_head heads of D = C / n_head columns.
#pragma once

#include <concepts>

#include "decentrain/autograd/dispatch.hpp"
#include "decentrain/autograd/variable.hpp"
#include "decentrain/kernels/attention.hpp"

namespace decentrain {

namespace detail {
// Devices with a bf16 attention kernel (tensor cores on the GPU) run bf16 activations through it:
// bf16 in and out, f32 logsumexp, f32 arithmetic inside.
template <class Device>
concept has_bf16_attention = requires(bf16* o, float* s, const bf16* c, const float* cs, std::int64_t n) {
  kernels::attention_forward_bf16(Device{}, o, s, c, c, c, n, n, n, n);
  kernels::attention_backward_bf16(Device{}, o, o, o, c, c, cs, c, c, c, n, n, n, n);
  { kernels::attention_bf16_supported(Device{}, n, n, {c}) } -> std::convertible_to<bool>;
};

template <class Device>
var<Device> causal_attention_bf16(const tensor<Device>& q, const tensor<Device>& k, const tensor<Device>& v,
                                  const var<Device>& vq, const var<Device>& vk, const var<Device>& vv,
                                  std::int64_t n_head) {
  const std::int64_t B = q.size(0), T = q.size(1), C = q.size(2);
  auto out = tensor<Device>::empty(q.shape(), dtype::bf16);
  auto lse = tensor<Device>::empty(shape{B, n_head, T}, dtype::f32);
  kernels::attention_forward_bf16(Device{}, out.template data<bf16>(), lse.template data<float>(),
                                  q.template data<bf16>(), k.template data<bf16>(), v.template data<bf16>(), B, T, C,
                                  n_head);
  return record<Device>("causal_attention", out, {vq, vk, vv},
                        [q, k, v, out, lse, B, T, C, n_head](const tensor<Device>& g, node<Device>& n) {
    const auto gb = g.dtype() == dtype::bf16 ? g.contiguous() : g.to(dtype::bf16);
    auto dq = tensor<Device>::empty(q.shape(), dtype::bf16), dk = tensor<Device>::empty(q.shape(), dtype::bf16),
         dv = tensor<Device>::empty(q.shape(), dtype::bf16);
    kernels::attention_backward_bf16(Device{}, dq.template data<bf16>(), dk.template data<bf16>(),
                                     dv.template data<bf16>(), gb.template data<bf16>(), out.template data<bf16>(),
                                     lse.template data<float>(), q.template data<bf16>(), k.template data<bf16>(),
                                     v.template data<bf16>(), B, T, C, n_head);
    n.accumulate(0, std::move(dq));
    n.accumulate(1, std::move(dk));
    n.accumulate(2, std::move(dv));
  });
}
}  // namespace detail

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
  if constexpr (detail::has_bf16_attention<Device>) {
    if (q.dtype() == dtype::bf16) {
      const auto bq = q.value().contiguous(), bk = k.value().contiguous(), bv = v.value().contiguous();
      if (kernels::attention_bf16_supported(Device{}, C, n_head,
                                            {bq.template data<bf16>(), bk.template data<bf16>(), bv.template data<bf16>()}))
        return detail::causal_attention_bf16(bq, bk, bv, q, k, v, n_head);
    }
  }
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
