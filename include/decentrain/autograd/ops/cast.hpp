// Differentiable dtype conversion: the forward rounds to `t`, the backward brings the gradient
// back to the input's dtype. Mixed precision is built from it: f32 master weights cast to bf16
// where they meet bf16 activations, their gradients arriving in f32.
#pragma once

#include "decentrain/autograd/variable.hpp"

namespace decentrain {

template <class Device>
var<Device> cast(const var<Device>& x, dtype t) {
  detail::check(is_floating(t), "cast: target dtype must be floating-point, got ", dtype_name(t));
  if (x.dtype() == t) return x;
  const dtype from = x.dtype();
  return record<Device>("cast", x.value().to(t), {x}, [from](const tensor<Device>& g, node<Device>& n) {
    n.accumulate(0, g.dtype() == from ? g : g.to(from));
  });
}

}  // namespace decentrain
