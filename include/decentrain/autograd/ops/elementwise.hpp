// Differentiable elementwise ops: +, -, *, / with broadcasting, and the same with a scalar.
#pragma once

#include "decentrain/autograd/math.hpp"
#include "decentrain/autograd/variable.hpp"

namespace decentrain {

namespace detail {
template <class Device>
var<Device> binary_op(kernels::binary_op op, const char* name, const var<Device>& a,
                      const var<Device>& b) {
  auto out = math::binary(op, name, a.value(), b.value());
  return record<Device>(name, out, {a, b}, [op](const tensor<Device>& g, node<Device>& n) {
    const auto &x = n.input(0), &y = n.input(1);
    using kernels::binary_op;
    if (n.needs_grad(0)) {
      tensor<Device> ga = g;
      if (op == binary_op::mul) ga = math::mul(g, y);
      if (op == binary_op::div) ga = math::div(g, y);
      n.accumulate(0, math::sum_to_shape(ga, x.shape()));
    }
    if (n.needs_grad(1)) {
      tensor<Device> gb = g;
      if (op == binary_op::sub) gb = math::affine(g, -1.0);
      if (op == binary_op::mul) gb = math::mul(g, x);
      if (op == binary_op::div) gb = math::affine(math::div(math::div(math::mul(g, x), y), y), -1.0);
      n.accumulate(1, math::sum_to_shape(gb, y.shape()));
    }
  });
}
}  // namespace detail

template <class Device> var<Device> add(const var<Device>& a, const var<Device>& b) { return detail::binary_op(kernels::binary_op::add, "add", a, b); }
template <class Device> var<Device> sub(const var<Device>& a, const var<Device>& b) { return detail::binary_op(kernels::binary_op::sub, "sub", a, b); }
template <class Device> var<Device> mul(const var<Device>& a, const var<Device>& b) { return detail::binary_op(kernels::binary_op::mul, "mul", a, b); }
template <class Device> var<Device> div(const var<Device>& a, const var<Device>& b) { return detail::binary_op(kernels::binary_op::div, "div", a, b); }

// x * scale + shift
template <class Device>
var<Device> affine(const var<Device>& x, double scale, double shift = 0.0) {
  return record<Device>("affine", math::affine(x.value(), scale, shift), {x},
                        [scale](const tensor<Device>& g, node<Device>& n) {
                          n.accumulate(0, math::affine(g, scale));
                        });
}

// numerator / x
template <class Device>
var<Device> reciprocal(const var<Device>& x, double numerator = 1.0) {
  auto out = math::reciprocal(x.value(), numerator);
  return record<Device>("reciprocal", out, {x}, [out](const tensor<Device>& g, node<Device>& n) {
    // d(c/x)/dx = -c/x^2 = -(c/x)/x
    n.accumulate(0, math::affine(math::div(math::mul(g, out), n.input(0)), -1.0));
  });
}

template <class Device> var<Device> operator+(const var<Device>& a, const var<Device>& b) { return add(a, b); }
template <class Device> var<Device> operator-(const var<Device>& a, const var<Device>& b) { return sub(a, b); }
template <class Device> var<Device> operator*(const var<Device>& a, const var<Device>& b) { return mul(a, b); }
template <class Device> var<Device> operator/(const var<Device>& a, const var<Device>& b) { return div(a, b); }
template <class Device> var<Device> operator-(const var<Device>& x) { return affine(x, -1.0); }
template <class Device> var<Device> operator+(const var<Device>& x, double s) { return affine(x, 1.0, s); }
template <class Device> var<Device> operator+(double s, const var<Device>& x) { return affine(x, 1.0, s); }
template <class Device> var<Device> operator-(const var<Device>& x, double s) { return affine(x, 1.0, -s); }
template <class Device> var<Device> operator-(double s, const var<Device>& x) { return affine(x, -1.0, s); }
template <class Device> var<Device> operator*(const var<Device>& x, double s) { return affine(x, s); }
template <class Device> var<Device> operator*(double s, const var<Device>& x) { return affine(x, s); }
template <class Device> var<Device> operator/(const var<Device>& x, double s) {
  detail::check(s != 0.0, "division of a var by the scalar 0");
  return affine(x, 1.0 / s);
}
template <class Device> var<Device> operator/(double s, const var<Device>& x) { return reciprocal(x, s); }

}  // namespace decentrain
