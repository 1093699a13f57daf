// Differentiable matrix products: matmul (batched, with transposes), linear (x W + b),
// linear_gelu (the MLP's first layer, fused) and linear_gelu_linear (the whole MLP).
#pragma once

#include "decentrain/autograd/deferred.hpp"
#include "decentrain/autograd/math.hpp"
#include "decentrain/autograd/variable.hpp"
#include "decentrain/kernels/activation.hpp"
#include "decentrain/kernels/linear.hpp"

namespace decentrain {

namespace detail {
// Gradients of c = op(a) op(b), each written into a buffer shaped like its operand (a 2-D
// operand of a batched product receives the sum over the batch).
template <class Device>
void matmul_backward(const tensor<Device>& g, node<Device>& n, bool ta, bool tb) {
  const auto a = math::gemm_operand(n.input(0)), b = math::gemm_operand(n.input(1));
  const auto gc = math::gemm_operand(g);
  const dtype result = detail::kernel_dtype<Device>(g.dtype());
  if (n.needs_grad(0)) {
    auto da = tensor<Device>::empty(a.shape(), result);
    if (!ta) math::gemm_batched(false, !tb, gc, b, da, 1.0, 0.0);  // dA = dC op(B)^T
    else math::gemm_batched(tb, true, b, gc, da, 1.0, 0.0);        // dA = op(B) dC^T
    n.accumulate(0, std::move(da));
  }
  if (n.needs_grad(1)) {
    auto db = tensor<Device>::empty(b.shape(), result);
    if (!tb) math::gemm_batched(!ta, false, a, gc, db, 1.0, 0.0);  // dB = op(A)^T dC
    else math::gemm_batched(true, ta, gc, a, db, 1.0, 0.0);        // dB = dC^T op(A)
    n.accumulate(1, std::move(db));
  }
}
}  // namespace detail

// op(a) x op(b) over the last two dims. Leading (batch) dims must be equal, or one operand
// must be 2-D and is then shared by every batch entry.
template <class Device>
var<Device> matmul(const var<Device>& a, const var<Device>& b, bool trans_a = false,
                   bool trans_b = false) {
  return record<Device>("matmul", math::matmul(a.value(), b.value(), trans_a, trans_b), {a, b},
                        [trans_a, trans_b](const tensor<Device>& g, node<Device>& n) {
                          detail::matmul_backward(g, n, trans_a, trans_b);
                        });
}

namespace detail {
// Checks a linear layer's weight (in, out) and bias (out,) against what it multiplies: the
// input x, or (x null) the `in` columns the op's previous layer produces.
template <class Device>
void check_linear(const char* name, const char* which, const var<Device>* x, std::int64_t in, const var<Device>& weight,
                  const var<Device>* bias) {
  detail::check(weight.rank() == 2, name, ": ", which, "weight must be 2-D (in, out), got shape ", weight.shape());
  if (x)
    detail::check(x->rank() >= 1 && x->size(-1) == weight.size(0), name, ": input shape ", x->shape(), " does not match ",
                  which, "weight shape ", weight.shape(), " (expected last input dim ", weight.size(0), ")");
  else
    detail::check(weight.size(0) == in, name, ": ", which, "weight shape ", weight.shape(), " does not match the ", in,
                  " columns it multiplies (expected (", in, ", out))");
  if (bias) {
    detail::check(bias->rank() == 1 && bias->size(0) == weight.size(1), name, ": ", which, "bias shape ", bias->shape(),
                  " does not match ", which, "weight shape ", weight.shape(), " (expected (", weight.size(1), ",))");
    detail::check_same_dtype(name, weight.value(), bias->value());
  }
}

// The number of rows of x with its leading dims flattened.
template <class Device>
std::int64_t flat_rows(const var<Device>& x) {
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < x.rank(); ++d) rows *= x.shape()[d];
  return rows;
}

// out = x2 w + b for x2 (rows, in) and w (in, width) in the kernel dtype (b undefined: none);
// with `pre`, GELU follows and pre keeps the product. out and pre are written whole.
template <class Device>
void linear_values(const char* name, const tensor<Device>& x2, const tensor<Device>& w, const tensor<Device>& b,
                   tensor<Device>& out, tensor<Device>* pre = nullptr) {
  const std::int64_t rows = x2.size(0), in = x2.size(1), width = w.size(1);
  const auto run = [&](auto in_tag, auto out_tag) {
    using In = decltype(in_tag);
    using Out = decltype(out_tag);
    kernels::linear_forward(Device{}, rows, width, in, x2.template data<In>(), w.template data<In>(),
                            b.defined() ? b.template data<Out>() : nullptr, out.template data<Out>(),
                            pre ? pre->template data<Out>() : nullptr);
  };
  if (x2.dtype() == dtype::bf16) {
    if constexpr (kernels::native_bf16<Device>) run(bf16{}, bf16{});
    else detail::fail(name, ": bf16 operands on a device without a bf16 GEMM");
  } else {
    detail::with_float_type(out.dtype(), name, [&](auto tag) { run(tag, tag); });
  }
}

// Where a put-off gradient of `s` goes: the leaf it is, or the leaf it was cast from (mixed
// precision multiplies a bf16 copy of an f32 parameter; the gradient is rounded to the copy's
// dtype first, as accumulating into the copy and the cast's backward would), else null: a weight
// computed some other way gets its gradient at once, through the graph, before the graph is gone.
template <class Device>
std::shared_ptr<var_state<Device>> deferred_target(std::shared_ptr<var_state<Device>> s) {
  while (s && s->creator) {
    const auto& n = *s->creator;
    if (n.op_name != "cast" || n.inputs.size() != 1) return nullptr;
    s = n.inputs[0];
  }
  return s;
}

// The weight's and the bias's gradients of x2 w + b, given the product's gradient g2 (rows,
// width), both in the kernel dtype; w and b are inputs `iw` and `ib` of the node (has_bias
// false: no bias). Inside a defer_weight_gradients scope they are queued there instead, x2 and
// g2 kept until the queue runs (autograd/deferred.hpp), and added to the parameters themselves.
template <class Device>
void linear_param_grads(node<Device>& n, const tensor<Device>& x2, const tensor<Device>& g2, std::size_t iw, bool has_bias,
                        std::size_t ib) {
  using state = std::shared_ptr<var_state<Device>>;
  const state w = n.needs_grad(iw) ? n.inputs[iw] : nullptr, b = has_bias && n.needs_grad(ib) ? n.inputs[ib] : nullptr;
  if (!w && !b) return;
  // Each gradient is made in the kernel dtype, rounded to the dtype of what the layer multiplied
  // (or added), and added to `to`.
  const dtype w_type = w ? w->value.dtype() : g2.dtype(), b_type = b ? b->value.dtype() : g2.dtype();
  const auto make = [w_type, b_type](const state& weight, const state& bias, const tensor<Device>& x, const tensor<Device>& g) {
    const auto rounded = [](tensor<Device> t, dtype to) { return t.dtype() == to ? t : t.to(to); };
    if (weight) {
      auto dw = tensor<Device>::empty(shape({x.size(1), g.size(1)}), g.dtype());
      math::gemm_batched(true, false, x, g, dw, 1.0, 0.0);
      accumulate_grad(*weight, rounded(std::move(dw), w_type));
    }
    if (bias) accumulate_grad(*bias, rounded(math::sum(g, {0}), b_type));
  };
  if (auto* later = deferred_weight_gradients()) {
    const state w_leaf = deferred_target(w), b_leaf = deferred_target(b);
    if ((!w || w_leaf) && (!b || b_leaf)) {
      later->defer([make, w_leaf, b_leaf, x2, g2] { make(w_leaf, b_leaf, x2, g2); });
      return;
    }
  }
  make(w, b, x2, g2);
}

// The gradients of a linear layer whose input, weight and bias are the node's inputs 0, 1 and
// 2 (has_bias false: no bias), given the product's gradient g2 (rows, width) in the kernel dtype.
template <class Device>
void linear_grads(node<Device>& n, const tensor<Device>& g2, std::int64_t rows, std::int64_t in, bool has_bias) {
  if (n.needs_grad(0)) {
    auto dx = tensor<Device>::empty(shape({rows, in}), g2.dtype());
    math::gemm_batched(false, true, g2, math::gemm_operand(n.input(1)), dx, 1.0, 0.0);
    n.accumulate(0, dx.reshape(n.input(0).shape()));
  }
  if (n.needs_grad(1) || (has_bias && n.needs_grad(2)))
    linear_param_grads(n, math::gemm_operand(n.input(0)).reshape({rows, in}), g2, 1, has_bias, 2);
}

// x W (+ b), then GELU when `with_gelu`: one fused kernel call forward (kernels/linear.hpp);
// with GELU the pre-activation is kept, in the activation dtype, for the backward pass.
template <class Device>
var<Device> linear_op(const var<Device>& x, const var<Device>& weight, const var<Device>* bias, bool with_gelu) {
  const char* name = with_gelu ? "linear_gelu" : "linear";
  check_linear(name, "", &x, 0, weight, bias);
  detail::check_same_dtype(name, x.value(), weight.value());
  // Leading dims are flattened so the product is one GEMM of (rows, in) x (in, width).
  const std::int64_t rows = flat_rows(x), in = weight.size(0), width = weight.size(1);
  auto out_sizes = x.shape().sizes();
  out_sizes.back() = width;
  const auto x2 = math::gemm_operand(x.value()).reshape({rows, in});
  const dtype out_type = detail::kernel_dtype<Device>(x.dtype());
  auto out = tensor<Device>::empty(shape({rows, width}), out_type);
  auto pre = with_gelu ? tensor<Device>::empty(shape({rows, width}), out_type) : tensor<Device>{};
  linear_values(name, x2, math::gemm_operand(weight.value()), bias ? detail::contiguous_as(bias->value(), out_type) : tensor<Device>{},
                out, with_gelu ? &pre : nullptr);
  out = detail::stored_as(out.reshape(out_sizes), x.dtype());
  if (with_gelu) pre = detail::stored_as(std::move(pre), x.dtype());

  std::vector<var<Device>> inputs{x, weight};
  if (bias) inputs.push_back(*bias);
  return record<Device>(name, out, inputs, [rows, in, width, pre](const tensor<Device>& g, node<Device>& n) {
    tensor<Device> g_pre = g;
    if (pre.defined()) {  // through GELU first, then stored as an unfused GELU's gradient would be
      const auto cp = detail::kernel_tensor(pre), cg = detail::contiguous_as(g, cp.dtype());
      auto d = tensor<Device>::empty(cp.shape(), cp.dtype());  // written whole by the kernel
      detail::with_kernel_type<Device>(pre.dtype(), "linear_gelu backward", [&](auto tag) {
        using T = decltype(tag);
        kernels::gelu_backward(Device{}, d.template data<T>(), cp.template data<T>(), cg.template data<T>(), cp.numel());
      });
      g_pre = detail::stored_as(std::move(d), g.dtype());
    }
    linear_grads(n, math::gemm_operand(g_pre).reshape({rows, width}), rows, in, n.inputs.size() > 2);
  });
}

// linear(gelu(linear(x, w1, b1)), w2, b2) as one op (biases both given or both null).
template <class Device>
var<Device> linear_gelu_linear_op(const var<Device>& x, const var<Device>& w1, const var<Device>* b1, const var<Device>& w2,
                                  const var<Device>* b2) {
  const char* name = "linear_gelu_linear";
  check_linear(name, "first ", &x, 0, w1, b1);
  check_linear<Device>(name, "second ", nullptr, w1.size(1), w2, b2);
  detail::check_same_dtype(name, x.value(), w1.value());
  detail::check_same_dtype(name, x.value(), w2.value());
  const std::int64_t rows = flat_rows(x), in = w1.size(0), hidden = w1.size(1), width = w2.size(1);
  auto out_sizes = x.shape().sizes();
  out_sizes.back() = width;
  const dtype out_type = detail::kernel_dtype<Device>(x.dtype());
  auto h = tensor<Device>::empty(shape({rows, hidden}), out_type);
  auto pre = tensor<Device>::empty(shape({rows, hidden}), out_type);
  linear_values(name, math::gemm_operand(x.value()).reshape({rows, in}), math::gemm_operand(w1.value()),
                b1 ? detail::contiguous_as(b1->value(), out_type) : tensor<Device>{}, h, &pre);
  // Kept as the two ops would keep them: in the activation dtype.
  h = detail::stored_as(std::move(h), x.dtype());
  pre = detail::stored_as(std::move(pre), x.dtype());
  auto out = tensor<Device>::empty(shape({rows, width}), out_type);
  linear_values(name, math::gemm_operand(h), math::gemm_operand(w2.value()),
                b2 ? detail::contiguous_as(b2->value(), out_type) : tensor<Device>{}, out);
  out = detail::stored_as(out.reshape(out_sizes), x.dtype());

  const bool has_bias = b1 != nullptr;
  std::vector<var<Device>> inputs{x, w1};
  if (has_bias) inputs.push_back(*b1);
  inputs.push_back(w2);
  if (has_bias) inputs.push_back(*b2);
  const std::size_t iw2 = has_bias ? 3 : 2;
  auto backward = [rows, in, hidden, width, has_bias, iw2, h, pre](const tensor<Device>& g, node<Device>& n) mutable {
    const dtype result = detail::kernel_dtype<Device>(g.dtype());
    const auto g2 = math::gemm_operand(g).reshape({rows, width});
    linear_param_grads(n, math::gemm_operand(h), g2, iw2, has_bias, /*second bias: input*/ 4);
    h = tensor<Device>{};  // the second layer's input is done with: free it before d_pre exists (unless its weight
                           // gradient was put off, autograd/deferred.hpp, which keeps it)
    if (!n.needs_grad(0) && !n.needs_grad(1) && !(has_bias && n.needs_grad(2))) return;
    // (g w2^T) * gelu'(pre) in one kernel call; stored as the two ops would store it.
    const auto cp = detail::kernel_tensor(pre);
    pre = tensor<Device>{};
    const auto w2k = math::gemm_operand(n.input(iw2));
    auto d_pre = tensor<Device>::empty(shape({rows, hidden}), result);
    detail::with_kernel_type<Device>(g.dtype(), "linear_gelu_linear backward", [&](auto tag) {
      using T = decltype(tag);
      kernels::linear_backward_through_gelu(Device{}, rows, hidden, width, g2.template data<T>(), w2k.template data<T>(),
                                            cp.template data<T>(), d_pre.template data<T>());
    });
    linear_grads(n, math::gemm_operand(detail::stored_as(std::move(d_pre), g.dtype())), rows, in, has_bias);
  };
  return record<Device>(name, out, inputs, std::move(backward));
}
}  // namespace detail

// x (..., in) times weight (in, out) plus bias (out,): one GEMM over all leading dims.
template <class Device>
var<Device> linear(const var<Device>& x, const var<Device>& weight, const var<Device>& bias) {
  return detail::linear_op(x, weight, &bias, false);
}

// x (..., in) times weight (in, out), without a bias.
template <class Device>
var<Device> linear(const var<Device>& x, const var<Device>& weight) {
  return detail::linear_op<Device>(x, weight, nullptr, false);
}

// gelu(linear(x, weight, bias)) as one op: the MLP's first layer. Same values and gradients as
// the two ops (bit for bit on the CPU); a GPU fuses bias and GELU into the GEMM.
template <class Device>
var<Device> linear_gelu(const var<Device>& x, const var<Device>& weight, const var<Device>& bias) {
  return detail::linear_op(x, weight, &bias, true);
}

// gelu(linear(x, weight)) as one op.
template <class Device>
var<Device> linear_gelu(const var<Device>& x, const var<Device>& weight) {
  return detail::linear_op<Device>(x, weight, nullptr, true);
}

// linear(linear_gelu(x, w1, b1), w2, b2), a GPT's MLP, as one op. The forward pass is the two
// ops'; the backward pass never holds the gradient of the GELU's output: the second product's
// input gradient g w2^T is multiplied by gelu'(pre) as it is formed
// (kernels::linear_backward_through_gelu, on a GPU cuBLASLt's DGELU epilogue), which saves
// writing and reading a (rows, hidden) tensor and one kernel. Same values and gradients as the
// two ops, bit for bit on the CPU in f32 and f64 (in bf16 the GELU output's gradient is not
// rounded to bf16 first).
template <class Device>
var<Device> linear_gelu_linear(const var<Device>& x, const var<Device>& w1, const var<Device>& b1, const var<Device>& w2,
                               const var<Device>& b2) {
  return detail::linear_gelu_linear_op(x, w1, &b1, w2, &b2);
}

// linear(linear_gelu(x, w1), w2), without biases, as one op.
template <class Device>
var<Device> linear_gelu_linear(const var<Device>& x, const var<Device>& w1, const var<Device>& w2) {
  return detail::linear_gelu_linear_op<Device>(x, w1, nullptr, w2, nullptr);
}

}  // namespace decentrain
