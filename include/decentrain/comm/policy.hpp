// What a communication policy is: a struct of settings that opts in with
// `using policy_concept = comm::policy_tag;` and answers the trainer at the points it asks for.
// The trainer calls, per peer:
//   start(ctx)            once, before the first step (make every peer start from rank 0's model)
//   after_backward(ctx)   every step, gradients computed, before clipping and the optimizer
//   after_step(ctx)       every step, after the inner optimizer (ctx.last_step on the final one)
//   save(checkpoint&) const / load(const checkpoint&)   its own state, under "comm.<name>."
// `ctx` is a train::peer_context (parameters, communicator, step); see train/trainer.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "decentrain/autograd/parameters.hpp"
#include "decentrain/collective/communicator.hpp"
#include "decentrain/core/factory.hpp"
#include "decentrain/detail/meta.hpp"
#include "decentrain/io/checkpoint.hpp"

namespace decentrain::comm {

struct policy_tag {};

template <class P>
concept declares_comm_policy = decentrain::detail::opts_into<P, policy_tag>;

template <class P, class Ctx>
concept comm_policy = declares_comm_policy<P> && requires(P& p, const P& cp, Ctx& ctx, io::checkpoint& out,
                                                          const io::checkpoint& in) {
  p.start(ctx);
  p.after_backward(ctx);
  p.after_step(ctx);
  cp.save(out);
  p.load(in);
};

// Parameters and gradients as one flat f32 buffer on the host, in parameter-list order, so one
// collective call moves all of them (fewer, larger messages than one per tensor). On a GPU each
// tensor is copied to or from the host buffer; on the CPU the copies are plain memcpy.
template <class Device>
std::size_t flat_size(const parameter_list<Device>& params) { return static_cast<std::size_t>(params.numel()); }

template <class Device>
void gather_values(const parameter_list<Device>& params, std::vector<float>& out) {
  out.resize(flat_size(params));
  std::size_t at = 0;
  for (const auto& e : params) {
    const auto& v = e.param.value();
    decentrain::detail::check(v.dtype() == dtype::f32 && v.is_contiguous(), "comm: parameter '", e.name,
                              "' must be a contiguous f32 tensor to be communicated");
    memory<Device>::copy_to_host(out.data() + at, v.raw_data(), v.nbytes());
    at += static_cast<std::size_t>(v.numel());
  }
}

template <class Device>
void scatter_values(parameter_list<Device>& params, std::span<const float> in) {
  std::size_t at = 0;
  for (auto& e : params) {
    auto& v = e.param.value();
    memory<Device>::copy_from_host(v.raw_data(), in.data() + at, v.nbytes());
    at += static_cast<std::size_t>(v.numel());
  }
}

// A parameter without a gradient (unused this step) contributes zeros.
template <class Device>
void gather_grads(const parameter_list<Device>& params, std::vector<float>& out) {
  out.resize(flat_size(params));
  std::size_t at = 0;
  for (const auto& e : params) {
    const auto n = static_cast<std::size_t>(e.param.value().numel());
    if (e.param.grad().defined()) {
      const auto g = e.param.grad().contiguous();
      decentrain::detail::check(g.dtype() == dtype::f32, "comm: the gradient of '", e.name, "' must be f32");
      memory<Device>::copy_to_host(out.data() + at, g.raw_data(), n * sizeof(float));
    } else {
      std::fill_n(out.data() + at, n, 0.0f);
    }
    at += n;
  }
}

template <class Device>
void scatter_grads(parameter_list<Device>& params, std::span<const float> in) {
  std::size_t at = 0;
  for (auto& e : params) {
    const auto n = static_cast<std::size_t>(e.param.value().numel());
    if (!e.param.grad().defined()) e.param.grad() = zeros<Device>(e.param.shape(), dtype::f32);
    auto& g = e.param.grad();
    decentrain::detail::check(g.is_contiguous(), "comm: the gradient of '", e.name, "' is not contiguous");
    memory<Device>::copy_from_host(g.raw_data(), in.data() + at, n * sizeof(float));
    at += n;
  }
}

// Periodic policies communicate after every `inner_steps`-th step, and after the last one.
template <class Ctx>
bool ends_round(const Ctx& ctx, std::int64_t inner_steps) {
  return (ctx.step + 1) % inner_steps == 0 || ctx.last_step;
}

// Makes every peer hold rank 0's parameters (peers seeded alike already agree; this makes it so).
template <class Ctx>
void broadcast_parameters(Ctx& ctx, std::vector<float>& buffer) {
  gather_values(ctx.parameters, buffer);
  ctx.comm.broadcast(std::span<float>(buffer), 0);
  scatter_values(ctx.parameters, buffer);
}

inline tensor<cpu> flat_tensor(const std::vector<float>& v) { return from_vector<cpu>(v, shape{static_cast<std::int64_t>(v.size())}); }
inline void load_flat(const io::checkpoint& c, const std::string& name, std::vector<float>& out, std::size_t expected) {
  const auto& t = c.tensor_at(name);
  decentrain::detail::check(t.numel() == static_cast<std::int64_t>(expected) && t.dtype() == dtype::f32, "checkpoint: '",
                            name, "' has ", t.numel(), " elements of ", dtype_name(t.dtype()), ", expected ", expected, " f32");
  out = t.template to_vector<float>();
}

}  // namespace decentrain::comm
