// Differentiable fused causal self-attention: softmax(q k^T / sqrt(D) + causal mask) v per
// head, for q, k, v of shape (B, T, C) split into n_head heads of D = C / n_head columns.
#pragma once

#include <concepts>
#include <vector>

#include "decentrain/autograd/dispatch.hpp"
#include "decentrain/autograd/ops/shape.hpp"
#include "decentrain/autograd/variable.hpp"
#include "decentrain/kernels/attention.hpp"

namespace decentrain {

namespace detail {
// Devices with a bf16 attention kernel (tensor cores on the GPU) run bf16 activations through it:
// bf16 in and out, f32 logsumexp, f32 arithmetic inside.
template <class Device>
concept has_bf16_attention = requires(bf16* o, float* s, const bf16* c, const float* cs, std::int64_t n) {
  kernels::attention_forward_bf16(Device{}, o, s, c, c, c, n, n, n, n, n);
  kernels::attention_backward_bf16(Device{}, o, o, o, c, c, cs, c, c, c, n, n, n, n, n);
  { kernels::attention_bf16_supported(Device{}, n, n, n, {c}) } -> std::convertible_to<bool>;
};

// Where q, k and v start and how far apart their rows are, in `parts`: three contiguous
// (B, T, C) tensors, or one contiguous (B, T, 3C) fused projection whose column blocks they are.
template <class P>
struct qkv_rows {
  P* q;
  P* k;
  P* v;
  std::int64_t ld;
};
template <class P, class Device>
qkv_rows<P> rows_of(const std::vector<tensor<Device>>& parts, std::int64_t C) {
  if (parts.size() == 3) return {parts[0].template data<P>(), parts[1].template data<P>(), parts[2].template data<P>(), C};
  P* p = parts[0].template data<P>();
  return {p, p + C, p + 2 * C, 3 * C};
}

// Whether the bf16 kernels take `parts` (see qkv_rows).
template <class Device>
bool bf16_attention_takes(const std::vector<tensor<Device>>& parts, std::int64_t C, std::int64_t n_head) {
  if constexpr (has_bf16_attention<Device>) {
    const auto r = rows_of<bf16>(parts, C);
    return kernels::attention_bf16_supported(Device{}, C, n_head, r.ld, {r.q, r.k, r.v});
  } else {
    return false;
  }
}

// The bf16 kernels over `parts` (bf16, contiguous, see qkv_rows), recorded over `inputs` (one
// var per part): each part's gradient is written whole by the backward kernels.
template <class Device>
var<Device> causal_attention_bf16(const std::vector<tensor<Device>>& parts, const std::vector<var<Device>>& inputs,
                                  std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t n_head) {
  auto out = tensor<Device>::empty(shape{B, T, C}, dtype::bf16);
  auto lse = tensor<Device>::empty(shape{B, n_head, T}, dtype::f32);
  const auto rows = rows_of<bf16>(parts, C);
  kernels::attention_forward_bf16(Device{}, out.template data<bf16>(), lse.template data<float>(), rows.q, rows.k, rows.v, B,
                                  T, C, n_head, rows.ld);
  return record<Device>("causal_attention", out, inputs,
                        [parts, out, lse, B, T, C, n_head](const tensor<Device>& g, node<Device>& n) {
    const auto gb = g.dtype() == dtype::bf16 ? g.contiguous() : g.to(dtype::bf16);
    std::vector<tensor<Device>> grads;
    for (const auto& p : parts) grads.push_back(tensor<Device>::empty(p.shape(), dtype::bf16));
    const auto in = rows_of<bf16>(parts, C);
    const auto d = rows_of<bf16>(grads, C);
    kernels::attention_backward_bf16(Device{}, d.q, d.k, d.v, gb.template data<bf16>(), out.template data<bf16>(),
                                     lse.template data<float>(), in.q, in.k, in.v, B, T, C, n_head, in.ld);
    for (std::size_t i = 0; i < grads.size(); ++i) n.accumulate(i, std::move(grads[i]));
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
      const std::vector<tensor<Device>> parts{q.value().contiguous(), k.value().contiguous(), v.value().contiguous()};
      if (detail::bf16_attention_takes(parts, C, n_head))
        return detail::causal_attention_bf16(parts, {q, k, v}, B, T, C, n_head);
    }
  }
  const auto q_in = detail::compute_tensor(q.value()), k_in = detail::compute_tensor(k.value()),
             v_in = detail::compute_tensor(v.value());
  auto out = tensor<Device>::empty(q.shape(), q_in.dtype());
  // The device decides what the backward needs: the probabilities (B, H, T, T) on the CPU,
  // only the logsumexp per row (B, H, T) on the GPU, which recomputes the rest.
  auto saved = tensor<Device>::empty(shape(kernels::attention_saved_sizes(Device{}, B, n_head, T)), q_in.dtype());
  detail::with_float_type(q.dtype(), "causal_attention", [&](auto tag) {
    using T_ = decltype(tag);
    kernels::attention_forward(Device{}, out.template data<T_>(), saved.template data<T_>(),
                               q_in.template data<T_>(), k_in.template data<T_>(),
                               v_in.template data<T_>(), B, T, C, n_head);
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

// Causal attention over a fused projection qkv (B, T, 3C) whose column blocks are q, k and v:
// the same values and gradients as splitting it first. Where the bf16 kernels run, they read
// the three blocks in place and write the gradient as one (B, T, 3C) tensor, so neither pass
// copies q, k, v apart or stitches their gradients together.
template <class Device>
var<Device> causal_attention(const var<Device>& qkv, std::int64_t n_head) {
  detail::check(qkv.rank() == 3 && qkv.size(2) % 3 == 0,
                "causal_attention: a fused qkv must be (B, T, 3C), got shape ", qkv.shape());
  const std::int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  detail::check(n_head > 0 && C % n_head == 0, "causal_attention: n_head = ", n_head,
                " must be positive and divide C = ", C);
  if constexpr (detail::has_bf16_attention<Device>) {
    if (qkv.dtype() == dtype::bf16) {
      const std::vector<tensor<Device>> parts{qkv.value().contiguous()};
      if (detail::bf16_attention_takes(parts, C, n_head)) return detail::causal_attention_bf16(parts, {qkv}, B, T, C, n_head);
    }
  }
  auto q_k_v = split(qkv, {C, C, C}, -1);
  return causal_attention(q_k_v[0], q_k_v[1], q_k_v[2], n_head);
}

}  // namespace decentrain
