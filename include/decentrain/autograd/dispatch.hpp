// How ops pick the arithmetic type: f32 and f64 compute natively, bf16 is widened to f32 for
// the math and narrowed back for storage (or, on a device whose kernels store bf16 themselves,
// handed to them as it is: kernels/native_bf16.hpp), integer tensors are rejected with the op's name.
#pragma once

#include <string_view>

#include "decentrain/core/tensor.hpp"
#include "decentrain/kernels/native_bf16.hpp"

namespace decentrain::detail {

template <class F>
decltype(auto) with_float_type(dtype t, std::string_view op, F&& f) {
  switch (t) {
    case dtype::f32:
    case dtype::bf16: return f(float{});
    case dtype::f64: return f(double{});
    case dtype::i32: break;
  }
  fail(op, ": expected a floating-point tensor (f32, f64 or bf16), got ", dtype_name(t));
}

inline dtype compute_dtype(dtype t) { return t == dtype::bf16 ? dtype::f32 : t; }

// The dtype a kernel of Device reads and writes for a tensor of dtype `t`: bf16 itself where the
// device's kernels store bf16 (kernels::native_bf16), otherwise the compute dtype.
template <class Device>
dtype kernel_dtype(dtype t) {
  return kernels::native_bf16<Device> && t == dtype::bf16 ? t : compute_dtype(t);
}

// `x` contiguous in `t` (a copy only when needed).
template <class Device>
tensor<Device> contiguous_as(const tensor<Device>& x, dtype t) {
  return x.dtype() == t ? x.contiguous() : x.to(t);
}

// A contiguous tensor in the compute dtype (a copy only when needed).
template <class Device>
tensor<Device> compute_tensor(const tensor<Device>& x) {
  return contiguous_as(x, compute_dtype(x.dtype()));
}

// A contiguous tensor in the dtype Device's kernels take for it (kernel_dtype).
template <class Device>
tensor<Device> kernel_tensor(const tensor<Device>& x) {
  return contiguous_as(x, kernel_dtype<Device>(x.dtype()));
}

// with_float_type for the ops whose kernels take bf16 storage on a native_bf16 device: there
// f(bf16{}) for bf16, so such an op's kernels must exist for bf16 on every such device.
template <class Device, class F>
decltype(auto) with_kernel_type(dtype t, std::string_view op, F&& f) {
  if constexpr (kernels::native_bf16<Device>)
    if (t == dtype::bf16) return f(bf16{});
  return with_float_type(t, op, f);
}

// The result stored in `t`, the dtype the caller handed in.
template <class Device>
tensor<Device> stored_as(tensor<Device> y, dtype t) {
  return y.dtype() == t ? y : y.to(t);
}

template <class Device>
void check_same_dtype(std::string_view op, const tensor<Device>& a, const tensor<Device>& b) {
  check(a.dtype() == b.dtype(), op, ": dtype mismatch: ", dtype_name(a.dtype()), " vs ",
        dtype_name(b.dtype()), " (convert one with .to(dtype) first)");
}

}  // namespace decentrain::detail
