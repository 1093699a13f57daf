// The reverse-mode autograd engine: a `var` is a tensor plus, when it came from an op that
// needs gradients, the node that made it. `backward()` walks the nodes in reverse topological
// order, each node adding (+=) its inputs' gradients. Read this file first; every op in
// autograd/ops/ is a forward computation plus one `record` call.
#pragma once

#include "decentrain/fwd.hpp"
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "decentrain/autograd/grad_mode.hpp"
#include "decentrain/core/factory.hpp"
#include "decentrain/core/tensor.hpp"
#include "decentrain/kernels/elementwise.hpp"
#include "decentrain/kernels/native_bf16.hpp"

namespace decentrain {

template <class Device>
struct node;

namespace detail {

template <class Device>
struct var_state {
  tensor<Device> value;
  tensor<Device> grad;  // undefined until a gradient arrives
  bool requires_grad = false;
  std::shared_ptr<node<Device>> creator;  // null for leaves
};

// grad += g, adopting g's storage when nobody else can see it.
template <class Device>
void accumulate_grad(var_state<Device>& state, tensor<Device> g) {
  detail::check(g.shape() == state.value.shape(), "autograd: gradient of shape ", g.shape(),
                " does not match its variable's shape ", state.value.shape());
  if (g.dtype() != state.value.dtype()) g = g.to(state.value.dtype());
  if (!state.grad.defined()) {
    state.grad = g.is_sole_owner() ? std::move(g) : g.clone();
    return;
  }
  if (state.grad.dtype() == dtype::bf16 && !kernels::native_bf16<Device>) {  // add in f32, round once
    auto sum = state.grad.to(dtype::f32);
    auto add = g.to(dtype::f32);
    kernels::axpy(Device{}, sum.template data<float>(), add.template data<float>(), sum.numel());
    state.grad = sum.to(dtype::bf16);
    return;
  }
  const auto src = g.contiguous();
  visit_dtype(state.grad.dtype(), [&](auto tag) {
    using T = decltype(tag);
    constexpr bool native_bf16 = std::is_same_v<T, bf16> && kernels::native_bf16<Device>;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || native_bf16) {
      kernels::axpy(Device{}, state.grad.template data<T>(), src.template data<T>(),
                    state.grad.numel());
    } else {
      detail::fail("autograd: gradients of dtype ", dtype_name(state.grad.dtype()), " are not supported");
    }
  });
}

}  // namespace detail

// A recorded op: its inputs and the function that turns the output's gradient into theirs.
template <class Device>
struct node {
  std::string op_name;
  std::vector<std::shared_ptr<detail::var_state<Device>>> inputs;
  std::function<void(const tensor<Device>& grad_out, node& self)> backward;

  bool needs_grad(std::size_t i) const { return inputs[i]->requires_grad; }
  const tensor<Device>& input(std::size_t i) const { return inputs[i]->value; }
  // Adds g to input i's gradient; ignored when that input needs none.
  void accumulate(std::size_t i, tensor<Device> g) {
    if (needs_grad(i)) detail::accumulate_grad(*inputs[i], std::move(g));
  }
  // Input i's gradient so far, for an op whose kernel adds its share into it in place (instead
  // of filling a fresh buffer and adding that): defined only when there is one, of dtype `t`,
  // contiguous and held by nobody else, so no holder of a gradient sees it change. Otherwise
  // undefined, and the op hands a fresh gradient to accumulate.
  tensor<Device> grad_in_place(std::size_t i, dtype t) const {
    if (!needs_grad(i)) return {};
    const auto& g = inputs[i]->grad;
    if (!g.defined() || g.dtype() != t || !g.is_sole_owner()) return {};
    return g;
  }
};

template <class Device>
class var {
 public:
  using device_type = Device;

  var() = default;
  // A leaf. Parameters are leaves with requires_grad = true.
  explicit var(tensor<Device> value, bool requires_grad = false)
      : state_(std::make_shared<detail::var_state<Device>>()) {
    detail::check(value.defined(), "var: cannot wrap an undefined tensor");
    detail::check(!requires_grad || is_floating(value.dtype()),
                  "var: a tensor of dtype ", dtype_name(value.dtype()), " cannot require gradients");
    state_->value = std::move(value);
    state_->requires_grad = requires_grad;
  }

  bool defined() const { return state_ != nullptr; }
  const tensor<Device>& value() const { return checked().value; }
  // Mutable access for optimizers, which update parameters in place under no_grad.
  tensor<Device>& value() { return checked().value; }
  const tensor<Device>& grad() const { return checked().grad; }
  tensor<Device>& grad() { return checked().grad; }
  bool requires_grad() const { return checked().requires_grad; }
  bool is_leaf() const { return checked().creator == nullptr; }
  const decentrain::shape& shape() const { return value().shape(); }
  std::int64_t size(std::int64_t axis) const { return value().size(axis); }
  std::size_t rank() const { return value().rank(); }
  decentrain::dtype dtype() const { return value().dtype(); }
  double item() const { return value().item(); }

  // Forgets the accumulated gradient (the next backward starts from zero).
  void zero_grad() { checked().grad = tensor<Device>(); }

  // Back-propagates from this scalar (seed 1).
  void backward() {
    detail::check(value().numel() == 1, "backward() without a gradient needs a scalar output, got shape ",
                  shape(), "; pass the output gradient explicitly");
    backward(ones<Device>(shape(), dtype()));
  }

  // Back-propagates `grad_out` (same shape as this value). Gradients accumulate (+=) into
  // every leaf that requires them; intermediate gradients and the graph are freed as the
  // pass goes, so calling backward twice through the same graph is an error.
  void backward(const tensor<Device>& grad_out) {
    detail::check(requires_grad(), "backward() called on a value that does not require gradients "
                  "(no input required them, or it was computed under no_grad)");
    detail::check(grad_out.shape() == shape(), "backward: gradient shape ", grad_out.shape(),
                  " does not match output shape ", shape());
    auto order = topological_order();
    detail::accumulate_grad(*state_, grad_out);
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      // Let go of this state when done with it: every op that read its value has run its
      // backward, so unless the caller holds it, its value (an activation) is freed now and
      // memory drops as the pass goes, instead of at the end.
      const auto s_owner = std::move(*it);
      detail::var_state<Device>& s = *s_owner;
      auto n = s.creator;
      if (!n || !s.grad.defined()) continue;
      detail::check(static_cast<bool>(n->backward), "backward through the graph of '", n->op_name,
                    "' a second time: its saved values were freed by the first backward");
      auto g = std::move(s.grad);
      s.grad = tensor<Device>();
      n->backward(g, *n);
      // Free the saved tensors and the links to inputs now, and a long chain is never torn
      // down by deep recursive destructors.
      n->backward = nullptr;
      n->inputs.clear();
    }
  }

  // Internal: used by ops to build results and by the engine.
  const std::shared_ptr<detail::var_state<Device>>& state() const { return state_; }

 private:
  detail::var_state<Device>& checked() const {
    detail::check(state_ != nullptr, "use of an undefined var");
    return *state_;
  }

  // States reachable from this var, inputs before outputs (iterative DFS: deep graphs must
  // not overflow the stack). Owning pointers: backward unlinks nodes as it goes, and the
  // order must keep every state alive until the pass reaches it.
  std::vector<std::shared_ptr<detail::var_state<Device>>> topological_order() const {
    std::vector<std::shared_ptr<detail::var_state<Device>>> order;
    std::unordered_set<detail::var_state<Device>*> seen{state_.get()};
    std::vector<std::pair<std::shared_ptr<detail::var_state<Device>>, std::size_t>> stack{{state_, 0}};
    while (!stack.empty()) {
      auto& [s, next] = stack.back();
      if (s->creator && next < s->creator->inputs.size()) {
        auto child = s->creator->inputs[next++];
        if (child->requires_grad && seen.insert(child.get()).second) stack.emplace_back(std::move(child), 0);
      } else {
        order.push_back(std::move(s));
        stack.pop_back();
      }
    }
    return order;
  }

  std::shared_ptr<detail::var_state<Device>> state_;
};

template <class Device>
var<Device> parameter(tensor<Device> value) {
  return var<Device>(std::move(value), true);
}

// Wraps an op's output. When grad mode is on and any input needs gradients, the output
// remembers `backward`; otherwise no graph is kept at all.
template <class Device, class Backward>
var<Device> record(std::string op_name, tensor<Device> value,
                   std::vector<var<Device>> inputs, Backward&& backward) {
  var<Device> out(std::move(value));
  bool needs = false;
  for (const auto& in : inputs) needs = needs || in.requires_grad();
  if (!needs || !grad_enabled()) return out;
  auto n = std::make_shared<node<Device>>();
  n->op_name = std::move(op_name);
  for (auto& in : inputs) n->inputs.push_back(in.state());
  n->backward = std::forward<Backward>(backward);
  out.state()->requires_grad = true;
  out.state()->creator = std::move(n);
  return out;
}

}  // namespace decentrain
