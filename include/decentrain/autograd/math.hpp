// Tensor arithmetic without a graph: broadcasting elementwise ops, reductions and batched
// matmul. The autograd ops run their forward and backward passes through these, and users may
// call them directly on tensors.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "decentrain/autograd/dispatch.hpp"
#include "decentrain/core/factory.hpp"
#include "decentrain/kernels/elementwise.hpp"
#include "decentrain/kernels/gemm.hpp"
#include "decentrain/kernels/reduce.hpp"
#include "decentrain/kernels/select.hpp"

namespace decentrain::math {

// Strides that read `x` as if it had `out` shape (0 on broadcast dims).
inline std::vector<std::int64_t> broadcast_strides(const shape& x, const shape& out) {
  std::vector<std::int64_t> strides(out.rank(), 0);
  const auto own = contiguous_strides(x);
  const std::size_t lead = out.rank() - x.rank();
  for (std::size_t d = 0; d < x.rank(); ++d) strides[lead + d] = x[d] == 1 ? 0 : own[d];
  return strides;
}

template <class Device>
tensor<Device> binary(kernels::binary_op op, std::string_view name, const tensor<Device>& a,
                      const tensor<Device>& b) {
  detail::check_same_dtype(name, a, b);
  shape out_shape;
  try {
    out_shape = broadcast_shapes(a.shape(), b.shape());
  } catch (const error& e) {
    detail::fail(name, ": ", e.what());
  }
  const auto ca = detail::compute_tensor(a), cb = detail::compute_tensor(b);
  auto out = tensor<Device>::empty(out_shape, ca.dtype());
  detail::with_float_type(a.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    kernels::binary(Device{}, op, out.template data<T>(), out_shape.sizes(), ca.template data<T>(),
                    broadcast_strides(a.shape(), out_shape), cb.template data<T>(),
                    broadcast_strides(b.shape(), out_shape));
  });
  return detail::stored_as(std::move(out), a.dtype());
}

template <class Device>
tensor<Device> add(const tensor<Device>& a, const tensor<Device>& b) { return binary(kernels::binary_op::add, "add", a, b); }
template <class Device>
tensor<Device> sub(const tensor<Device>& a, const tensor<Device>& b) { return binary(kernels::binary_op::sub, "sub", a, b); }
template <class Device>
tensor<Device> mul(const tensor<Device>& a, const tensor<Device>& b) { return binary(kernels::binary_op::mul, "mul", a, b); }
template <class Device>
tensor<Device> div(const tensor<Device>& a, const tensor<Device>& b) { return binary(kernels::binary_op::div, "div", a, b); }

// x * scale + shift
template <class Device>
tensor<Device> affine(const tensor<Device>& x, double scale, double shift = 0.0) {
  const auto cx = detail::compute_tensor(x);
  auto out = tensor<Device>::empty(x.shape(), cx.dtype());
  detail::with_float_type(x.dtype(), "affine", [&](auto tag) {
    using T = decltype(tag);
    kernels::affine(Device{}, out.template data<T>(), cx.template data<T>(), x.numel(),
                    static_cast<T>(scale), static_cast<T>(shift));
  });
  return detail::stored_as(std::move(out), x.dtype());
}

// numerator / x
template <class Device>
tensor<Device> reciprocal(const tensor<Device>& x, double numerator = 1.0) {
  const auto cx = detail::compute_tensor(x);
  auto out = tensor<Device>::empty(x.shape(), cx.dtype());
  detail::with_float_type(x.dtype(), "reciprocal", [&](auto tag) {
    using T = decltype(tag);
    kernels::reciprocal(Device{}, out.template data<T>(), cx.template data<T>(), x.numel(),
                        static_cast<T>(numerator));
  });
  return detail::stored_as(std::move(out), x.dtype());
}

// Sums `axes` away (kept as size-1 dims when keepdim), scaled by `scale`.
template <class Device>
tensor<Device> sum(const tensor<Device>& x, std::vector<std::int64_t> axes, bool keepdim = false,
                   double scale = 1.0) {
  std::vector<bool> reduced(x.rank(), false);
  for (auto a : axes) {
    const auto d = x.shape().normalize_axis(a);
    detail::check(!reduced[d], "sum: axis ", a, " is listed twice");
    reduced[d] = true;
  }
  std::vector<std::int64_t> kept_sizes, order_kept, order_reduced, out_sizes;
  std::int64_t kept = 1, count = 1;
  for (std::size_t d = 0; d < x.rank(); ++d) {
    if (reduced[d]) {
      count *= x.shape()[d];
      order_reduced.push_back(static_cast<std::int64_t>(d));
      if (keepdim) out_sizes.push_back(1);
    } else {
      kept *= x.shape()[d];
      order_kept.push_back(static_cast<std::int64_t>(d));
      out_sizes.push_back(x.shape()[d]);
    }
  }
  auto out = tensor<Device>::empty(shape(out_sizes), detail::kernel_dtype<Device>(x.dtype()));
  // Reduced dims leading: column sums of the contiguous input. Otherwise move them last.
  const bool leading = std::is_sorted(reduced.begin(), reduced.end(), std::greater<>());
  tensor<Device> src = x;
  if (!leading) {
    std::vector<std::int64_t> order = order_kept;
    order.insert(order.end(), order_reduced.begin(), order_reduced.end());
    src = x.permute(order);
  }
  src = detail::kernel_tensor(src);
  detail::with_kernel_type<Device>(x.dtype(), "sum", [&](auto tag) {
    using T = decltype(tag);
    const auto s = static_cast<compute_type_t<T>>(scale);
    if (leading) kernels::sum_columns(Device{}, out.template data<T>(), src.template data<T>(), count, kept, s);
    else kernels::sum_rows(Device{}, out.template data<T>(), src.template data<T>(), kept, count, s);
  });
  return detail::stored_as(std::move(out), x.dtype());
}

// Sums a broadcast result back to `target` (the gradient of broadcasting).
template <class Device>
tensor<Device> sum_to_shape(const tensor<Device>& x, const shape& target) {
  if (x.shape() == target) return x;
  std::vector<std::int64_t> axes;
  const std::size_t lead = x.rank() - target.rank();
  for (std::size_t d = 0; d < x.rank(); ++d)
    if (d < lead || (target[d - lead] == 1 && x.shape()[d] != 1)) axes.push_back(static_cast<std::int64_t>(d));
  return sum(x, axes, true).reshape(target);
}

// Materialises x broadcast to `target`.
template <class Device>
tensor<Device> broadcast_to(const tensor<Device>& x, const shape& target) {
  return x.expand(target).contiguous();
}

// A matrix operand of a batched GEMM: (..., rows, cols), or a plain 2-D matrix shared by
// every batch entry.
struct matmul_dims {
  std::int64_t batch, m, n, k;
  std::vector<std::int64_t> batch_sizes;
};

template <class Device>
matmul_dims matmul_shapes(const tensor<Device>& a, const tensor<Device>& b, bool trans_a, bool trans_b) {
  detail::check(a.rank() >= 2 && b.rank() >= 2, "matmul: operands need rank >= 2, got shapes ",
                a.shape(), " and ", b.shape());
  const std::int64_t ar = a.size(-2), ac = a.size(-1), br = b.size(-2), bc = b.size(-1);
  matmul_dims d{1, trans_a ? ac : ar, trans_b ? br : bc, trans_a ? ar : ac, {}};
  const std::int64_t kb = trans_b ? bc : br;
  detail::check(d.k == kb, "matmul: inner dimensions differ: ", a.shape(), (trans_a ? "^T" : ""),
                " x ", b.shape(), (trans_b ? "^T" : ""), " (", d.k, " vs ", kb, ")");
  const auto& big = a.rank() >= b.rank() ? a : b;
  d.batch_sizes.assign(big.shape().sizes().begin(), big.shape().sizes().end() - 2);
  if (a.rank() > 2 && b.rank() > 2) {
    detail::check(a.rank() == b.rank() &&
                      std::equal(a.shape().begin(), a.shape().end() - 2, b.shape().begin()),
                  "matmul: batch dimensions differ: ", a.shape(), " vs ", b.shape(),
                  " (batched operands must have equal leading dims, or one must be 2-D)");
  }
  for (auto s : d.batch_sizes) d.batch *= s;
  return d;
}

// An operand for gemm_batched: bf16 stays bf16 where the device multiplies bf16 natively
// (kernels::native_bf16: tensor cores, f32 accumulation, and the result may be bf16, rounded
// once); elsewhere it is widened to the compute dtype, as every op does.
template <class Device>
tensor<Device> gemm_operand(const tensor<Device>& x) {
  return detail::kernel_tensor(x);
}

// c = alpha * op(a) op(b) + beta * c over a batch. Any operand may be 2-D while the others are
// batched: a 2-D a or b is shared by every entry, and a 2-D c sums the entries (the gradient of
// a shared weight). All three must be contiguous; a, b and c share the compute dtype, or a and
// b are bf16 and c is f32 or bf16 where the device has a bf16 GEMM (see gemm_operand).
template <class Device>
void gemm_batched(bool trans_a, bool trans_b, const tensor<Device>& a, const tensor<Device>& b,
                  tensor<Device>& c, double alpha, double beta) {
  const auto d = matmul_shapes(a, b, trans_a, trans_b);
  const bool a_batched = a.rank() > 2, b_batched = b.rank() > 2, c_batched = c.rank() > 2;
  // Batched a (not transposed) times a shared b: one tall GEMM instead of `batch` small ones.
  const bool tall = a_batched && !b_batched && c_batched && !trans_a;
  // Shared-weight gradient a^T b summed over the batch: also one GEMM, over batch * rows.
  const bool folded = a_batched && b_batched && !c_batched && trans_a && !trans_b;
  const auto run = [&](auto in_tag, auto out_tag) {
    using In = decltype(in_tag);
    using Out = decltype(out_tag);
    using Scalar = compute_type_t<Out>;
    const In* pa = a.template data<In>();
    const In* pb = b.template data<In>();
    Out* pc = c.template data<Out>();
    const std::int64_t lda = a.size(-1), ldb = b.size(-1), ldc = d.n;
    if (tall) {
      kernels::gemm(Device{}, false, trans_b, d.batch * d.m, d.n, d.k, static_cast<Scalar>(alpha), pa,
                    lda, pb, ldb, static_cast<Scalar>(beta), pc, ldc);
      return;
    }
    if (folded) {
      kernels::gemm(Device{}, true, false, d.m, d.n, d.batch * d.k, static_cast<Scalar>(alpha), pa,
                    lda, pb, ldb, static_cast<Scalar>(beta), pc, ldc);
      return;
    }
    for (std::int64_t i = 0; i < d.batch; ++i) {
      const Scalar step_beta = (!c_batched && i > 0) ? Scalar(1) : static_cast<Scalar>(beta);
      kernels::gemm(Device{}, trans_a, trans_b, d.m, d.n, d.k, static_cast<Scalar>(alpha),
                    pa + (a_batched ? i * d.m * d.k : 0), lda, pb + (b_batched ? i * d.k * d.n : 0),
                    ldb, step_beta, pc + (c_batched ? i * d.m * d.n : 0), ldc);
    }
  };
  if constexpr (kernels::native_bf16<Device>) {
    if (a.dtype() == dtype::bf16) {
      detail::check(b.dtype() == dtype::bf16 && (c.dtype() == dtype::f32 || c.dtype() == dtype::bf16),
                    "matmul: a bf16 product needs bf16 operands and an f32 or bf16 result, got ",
                    dtype_name(b.dtype()), " and ", dtype_name(c.dtype()));
      if (c.dtype() == dtype::f32) return run(bf16{}, float{});
      // A bf16 c that sums batch entries one GEMM after another would round after each: those
      // sum in f32 and round once.
      if (!c_batched && d.batch > 1 && !folded) {
        auto wide = beta == 0.0 ? tensor<Device>::empty(c.shape(), dtype::f32) : c.to(dtype::f32);
        gemm_batched(trans_a, trans_b, a, b, wide, alpha, beta);
        c.copy_from(wide);
        return;
      }
      return run(bf16{}, bf16{});
    }
  }
  detail::check(a.dtype() == c.dtype() && b.dtype() == c.dtype(), "matmul: operands ", dtype_name(a.dtype()),
                " and ", dtype_name(b.dtype()), " do not match the result's ", dtype_name(c.dtype()));
  detail::with_float_type(c.dtype(), "matmul", [&](auto tag) { run(tag, tag); });
}

// op(a) x op(b) written into `out`, which must already have the result's shape and dtype
// and be contiguous (as torch.matmul(..., out=)): no allocation on the hot path.
template <class Device>
void matmul_into(const tensor<Device>& a, const tensor<Device>& b, tensor<Device>& out,
                 bool trans_a = false, bool trans_b = false) {
  detail::check_same_dtype("matmul", a, b);
  const auto d = matmul_shapes(a, b, trans_a, trans_b);
  auto sizes = d.batch_sizes;
  sizes.push_back(d.m);
  sizes.push_back(d.n);
  detail::check(out.defined() && out.shape() == shape(sizes) && out.dtype() == a.dtype() &&
                    out.is_contiguous(),
                "matmul_into: out must be a contiguous ", dtype_name(a.dtype()), " tensor of shape ",
                shape(sizes), ", got ", (out.defined() ? out.shape().to_string() : "undefined"));
  const auto ca = gemm_operand(a), cb = gemm_operand(b);
  if (out.dtype() == detail::kernel_dtype<Device>(out.dtype())) {
    gemm_batched(trans_a, trans_b, ca, cb, out, 1.0, 0.0);
  } else {
    auto wide = tensor<Device>::empty(out.shape(), detail::compute_dtype(out.dtype()));
    gemm_batched(trans_a, trans_b, ca, cb, wide, 1.0, 0.0);
    out.copy_from(wide);
  }
}

// op(a) x op(b), batched over leading dims (see gemm_batched), in a new tensor.
template <class Device>
tensor<Device> matmul(const tensor<Device>& a, const tensor<Device>& b, bool trans_a = false,
                      bool trans_b = false) {
  detail::check_same_dtype("matmul", a, b);
  const auto d = matmul_shapes(a, b, trans_a, trans_b);
  auto sizes = d.batch_sizes;
  sizes.push_back(d.m);
  sizes.push_back(d.n);
  auto out = tensor<Device>::empty(shape(sizes), a.dtype());
  matmul_into(a, b, out, trans_a, trans_b);
  return out;
}

// The k largest entries of a 1-D tensor, largest first, and their positions (i32). Ties keep
// the lower position first, and every device returns the same positions (see
// kernels/cpu/select.hpp for where -0, +0 and NaN go).
template <class Device>
std::pair<tensor<Device>, tensor<Device>> top_k(const tensor<Device>& x, std::int64_t k) {
  detail::check(x.rank() == 1, "top_k: expects a 1-D tensor, got shape ", x.shape());
  detail::check(k >= 0 && k <= x.numel(), "top_k: k = ", k, " is outside [0, ", x.numel(), "]");
  detail::check(x.numel() <= std::numeric_limits<std::int32_t>::max(), "top_k: ", x.numel(),
                " elements are more than i32 positions can address");
  const auto cx = detail::compute_tensor(x).contiguous();
  auto values = tensor<Device>::empty(shape{k}, cx.dtype());
  auto positions = tensor<Device>::empty(shape{k}, dtype::i32);
  detail::with_float_type(x.dtype(), "top_k", [&](auto tag) {
    using T = decltype(tag);
    kernels::top_k(Device{}, cx.template data<T>(), cx.numel(), k, values.template data<T>(),
                   positions.template data<std::int32_t>());
  });
  return {detail::stored_as(std::move(values), x.dtype()), std::move(positions)};
}

}  // namespace decentrain::math
