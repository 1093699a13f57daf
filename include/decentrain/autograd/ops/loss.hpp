// Differentiable fused cross-entropy with logits: the mean over rows of
// logsumexp(logits) - logits[target], skipping rows whose target is ignore_index.
#pragma once

#include <cmath>
#include <limits>

#include "decentrain/autograd/dispatch.hpp"
#include "decentrain/autograd/variable.hpp"
#include "decentrain/core/transfer.hpp"
#include "decentrain/kernels/cross_entropy.hpp"

namespace decentrain {

// logits (..., V) and integer targets (...). Returns a scalar in the compute dtype (f32 for bf16
// logits); NaN when every target is ignored (as PyTorch).
template <class Device>
var<Device> cross_entropy(const var<Device>& logits, const tensor<Device>& targets,
                          std::int32_t ignore_index = -1) {
  detail::check(logits.rank() >= 1 && logits.size(-1) > 0,
                "cross_entropy: logits need rank >= 1 and a non-empty class dim, got shape ", logits.shape());
  detail::check(targets.dtype() == dtype::i32, "cross_entropy: targets must be i32, got ",
                dtype_name(targets.dtype()));
  const std::int64_t V = logits.size(-1), N = logits.value().numel() / V;
  auto expected = logits.shape().sizes();
  expected.pop_back();
  detail::check(targets.shape() == shape(expected), "cross_entropy: targets shape ", targets.shape(),
                " does not match logits shape ", logits.shape(), " (expected ", shape(expected), ")");
  const auto ids = targets.contiguous();
  const auto host_ids = to_device<cpu>(ids);  // checked on the host, as embedding ids
  const auto* t = host_ids.template data<std::int32_t>();
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < N; ++i) {
    detail::check(t[i] == ignore_index || (t[i] >= 0 && t[i] < V), "cross_entropy: target ", t[i],
                  " at flat index ", i, " is outside [0, ", V, ") and is not ignore_index (",
                  ignore_index, ")");
    counted += t[i] != ignore_index;
  }
  const auto cl = detail::kernel_tensor(logits.value());
  // Each row's logsumexp, kept for the backward (N values in the compute dtype).
  auto row_lse = tensor<Device>::empty(shape{N}, detail::compute_dtype(logits.dtype()));
  double total = 0.0;
  detail::with_kernel_type<Device>(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    total = kernels::cross_entropy_forward(Device{}, cl.template data<T>(), ids.template data<std::int32_t>(), N,
                                           V, ignore_index, row_lse.template data<compute_type_t<T>>());
  });
  const double loss = counted ? total / static_cast<double>(counted) : std::numeric_limits<double>::quiet_NaN();
  // In the compute dtype (f32 for bf16 logits, as under autocast): a bf16 loss would keep three
  // significant digits, too few to follow training by.
  auto out = full<Device>(shape{}, loss, detail::compute_dtype(logits.dtype()));
  return record<Device>("cross_entropy", out, {logits},
                        [ids, row_lse, N, V, ignore_index, counted](const tensor<Device>& g, node<Device>& n) {
    if (counted == 0) return;
    const auto cl = detail::kernel_tensor(n.input(0));
    auto dl = tensor<Device>::empty(cl.shape(), cl.dtype());  // every element is written
    detail::with_kernel_type<Device>(cl.dtype(), "cross_entropy backward", [&](auto tag) {
      using T = decltype(tag);
      const auto per_row = static_cast<compute_type_t<T>>(g.item() / static_cast<double>(counted));
      kernels::cross_entropy_backward(Device{}, dl.template data<T>(), cl.template data<T>(),
                                      row_lse.template data<compute_type_t<T>>(), ids.template data<std::int32_t>(),
                                      N, V, ignore_index, per_row);
    });
    n.accumulate(0, std::move(dl));
  });
}

}  // namespace decentrain
