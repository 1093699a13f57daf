// What the optimizers share: checking a parameter's dtype and running a kernel with its type.
#pragma once

#include <string_view>

#include "decentrain/autograd/variable.hpp"

namespace decentrain::optim::detail {

// Optimizers keep full-precision master weights: f32 (or f64 in tests). bf16 parameters are a
// storage format for copies, not something to update in place.
template <class Device, class F>
void with_master_type(std::string_view who, const std::string& name, const var<Device>& p, F&& f) {
  switch (p.dtype()) {
    case dtype::f32: return f(float{});
    case dtype::f64: return f(double{});
    default: break;
  }
  decentrain::detail::fail(who, ": parameter '", name, "' has dtype ", dtype_name(p.dtype()),
                           "; optimizers update f32 (or f64) master weights");
}

}  // namespace decentrain::optim::detail
