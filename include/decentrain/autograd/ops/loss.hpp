// Differentiable fused cross-entropy with logits: the mean over rows of
// logsumexp(logits) - logits[target], skipping rows whose target is ignore_index; and the same
// of a linear layer's output without keeping the (rows, classes) logits (linear_cross_entropy).
#pragma once

#include <cmath>
#include <limits>
#include <string_view>

#include "decentrain/autograd/dispatch.hpp"
#include "decentrain/autograd/math.hpp"
#include "decentrain/autograd/variable.hpp"
#include "decentrain/core/transfer.hpp"
#include "decentrain/kernels/cross_entropy.hpp"

namespace decentrain {

namespace detail {
// Checks integer targets on the host: i32, shaped as the leading dims of `operand` (the logits
// or the input, named `operand_name`), ids in [0, V) or ignore_index. Returns how many count.
template <class Device>
std::int64_t count_targets(std::string_view op, const tensor<Device>& targets, std::string_view operand_name,
                           const shape& operand, std::int64_t V, std::int32_t ignore_index) {
  check(targets.dtype() == dtype::i32, op, ": targets must be i32, got ", dtype_name(targets.dtype()));
  auto expected = operand.sizes();
  expected.pop_back();
  check(targets.shape() == shape(expected), op, ": targets shape ", targets.shape(), " does not match ",
        operand_name, " shape ", operand, " (expected ", shape(expected), ")");
  const auto host_ids = to_device<cpu>(targets.contiguous());
  const auto* t = host_ids.template data<std::int32_t>();
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < host_ids.numel(); ++i) {
    check(t[i] == ignore_index || (t[i] >= 0 && t[i] < V), op, ": target ", t[i], " at flat index ", i,
          " is outside [0, ", V, ") and is not ignore_index (", ignore_index, ")");
    counted += t[i] != ignore_index;
  }
  return counted;
}

inline double mean_or_nan(double total, std::int64_t counted) {
  return counted ? total / static_cast<double>(counted) : std::numeric_limits<double>::quiet_NaN();
}
}  // namespace detail

// logits (..., V) and integer targets (...). Returns a scalar in the compute dtype (f32 for bf16
// logits); NaN when every target is ignored (as PyTorch).
template <class Device>
var<Device> cross_entropy(const var<Device>& logits, const tensor<Device>& targets,
                          std::int32_t ignore_index = -1) {
  detail::check(logits.rank() >= 1 && logits.size(-1) > 0,
                "cross_entropy: logits need rank >= 1 and a non-empty class dim, got shape ", logits.shape());
  const std::int64_t V = logits.size(-1), N = logits.value().numel() / V;
  const std::int64_t counted =
      detail::count_targets("cross_entropy", targets, "logits", logits.shape(), V, ignore_index);
  const auto ids = targets.contiguous();
  const auto logits_in = detail::kernel_tensor(logits.value());
  // Each row's logsumexp, kept for the backward (N values in the compute dtype).
  auto row_lse = tensor<Device>::empty(shape{N}, detail::compute_dtype(logits.dtype()));
  double total = 0.0;
  detail::with_kernel_type<Device>(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    total = kernels::cross_entropy_forward(Device{}, logits_in.template data<T>(), ids.template data<std::int32_t>(), N,
                                           V, ignore_index, row_lse.template data<compute_type_t<T>>());
  });
  // In the compute dtype (f32 for bf16 logits, as under autocast): a bf16 loss would keep three
  // significant digits, too few to follow training by.
  auto out = full<Device>(shape{}, detail::mean_or_nan(total, counted), detail::compute_dtype(logits.dtype()));
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

// cross_entropy(matmul(x, weight, false, true), targets): x (..., C), weight (V, C) (a linear
// layer's weight as (out, in), or a tied embedding table), targets (...). The same loss and
// gradients, without the (rows, V) logits alive between forward and backward: rows go through
// in chunks of `chunk_rows` (0: as many as fill 256 MiB of logits), and for each chunk the
// forward computes the logits, the loss and, when gradients are wanted, the logits' gradient
// in place of the logits and its products with weight and x. The backward only scales those
// by the loss's gradient. For a GPT-2 head (V = 50304) at 32 x 1024 tokens that is two 3.3 GB
// buffers of bf16 logits and their gradient less. Under no_grad only the loss is computed.
template <class Device>
var<Device> linear_cross_entropy(const var<Device>& x, const var<Device>& weight, const tensor<Device>& targets,
                                 std::int32_t ignore_index = -1, std::int64_t chunk_rows = 0) {
  constexpr const char* name = "linear_cross_entropy";
  detail::check(weight.rank() == 2 && weight.size(0) > 0 && weight.size(1) > 0, name,
                ": weight must be a non-empty (classes, in) matrix, got shape ", weight.shape());
  detail::check(x.rank() >= 1 && x.size(-1) == weight.size(1), name, ": input shape ", x.shape(),
                " does not match weight shape ", weight.shape(), " (expected last input dim ", weight.size(1), ")");
  detail::check_same_dtype(name, x.value(), weight.value());
  detail::check(chunk_rows >= 0, name, ": chunk_rows must be >= 0 (0 picks it), got ", chunk_rows);
  const std::int64_t V = weight.size(0), C = weight.size(1), N = x.value().numel() / C;
  const std::int64_t counted = detail::count_targets(name, targets, "input", x.shape(), V, ignore_index);
  const auto ids = targets.contiguous();
  const dtype stored = x.dtype(), kernel = detail::kernel_dtype<Device>(stored), accum = detail::compute_dtype(stored);
  if (chunk_rows == 0) {
    const std::int64_t budget = std::int64_t{256} << 20, per_row = V * static_cast<std::int64_t>(dtype_size(kernel));
    chunk_rows = std::max<std::int64_t>(128, budget / per_row / 128 * 128);
  }
  chunk_rows = std::max<std::int64_t>(1, std::min(chunk_rows, N));
  const bool want_dx = grad_enabled() && x.requires_grad() && counted > 0;
  const bool want_dw = grad_enabled() && weight.requires_grad() && counted > 0;

  const auto x2 = math::gemm_operand(x.value()).reshape({N, C});
  const auto w = math::gemm_operand(weight.value());
  auto logits = tensor<Device>::empty(shape{chunk_rows, V}, kernel);
  auto row_lse = tensor<Device>::empty(shape{chunk_rows}, accum);
  auto row_loss = tensor<Device>::empty(shape{1, N}, dtype::f64);
  tensor<Device> dx = want_dx ? tensor<Device>::empty(shape{N, C}, kernel) : tensor<Device>{};
  tensor<Device> dw = want_dw ? tensor<Device>::empty(shape{V, C}, accum) : tensor<Device>{};
  // Where bf16 is emulated (the kernels run in f32), the logits and their gradient are rounded
  // to bf16 as a device with bf16 kernels stores them, so both compute the same values.
  const bool round_to_stored = kernel != stored;
  const auto rounded = [&](tensor<Device> t) { return round_to_stored ? t.to(stored).to(kernel) : t; };
  for (std::int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
    const std::int64_t rows = std::min(chunk_rows, N - r0);
    const auto xc = x2.slice(0, r0, r0 + rows);
    auto lc = logits.slice(0, 0, rows);
    math::gemm_batched(false, true, xc, w, lc, 1.0, 0.0);  // (rows, C) x (V, C)^T
    lc = rounded(lc);
    const auto* chunk_ids = ids.template data<std::int32_t>() + r0;
    detail::with_kernel_type<Device>(stored, name, [&](auto tag) {
      using T = decltype(tag);
      kernels::cross_entropy_rows(Device{}, lc.template data<T>(), chunk_ids, rows, V, ignore_index,
                                  row_lse.template data<compute_type_t<T>>(), row_loss.template data<double>() + r0);
      if (want_dx || want_dw)  // the gradient of the mean loss, written over the logits
        kernels::cross_entropy_backward(Device{}, lc.template data<T>(), lc.template data<T>(),
                                        row_lse.template data<compute_type_t<T>>(), chunk_ids, rows, V, ignore_index,
                                        static_cast<compute_type_t<T>>(1.0 / static_cast<double>(counted)));
    });
    if (!want_dx && !want_dw) continue;
    lc = rounded(lc);
    if (want_dx) {
      auto dxc = dx.slice(0, r0, r0 + rows);
      math::gemm_batched(false, false, lc, w, dxc, 1.0, 0.0);  // (rows, V) x (V, C)
    }
    if (want_dw) math::gemm_batched(true, false, lc, xc, dw, 1.0, r0 == 0 ? 0.0 : 1.0);  // (rows, V)^T x (rows, C)
  }
  const double total = math::sum(row_loss, {1}).item();
  auto out = full<Device>(shape{}, detail::mean_or_nan(total, counted), accum);
  if (dx.defined()) dx = dx.reshape(x.shape());
  // The backward runs once; it hands its buffers over (a gradient held by nobody else is adopted,
  // not copied).
  return record<Device>(name, out, {x, weight}, [dx, dw](const tensor<Device>& g, node<Device>& n) mutable {
    const double scale = g.item();
    const auto scaled = [scale](tensor<Device> t) { return scale == 1.0 ? t : math::affine(t, scale); };
    if (dx.defined()) n.accumulate(0, scaled(std::move(dx)));
    if (dw.defined()) n.accumulate(1, scaled(std::move(dw)));
  });
}

}  // namespace decentrain
