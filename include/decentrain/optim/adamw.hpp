// AdamW: Adam with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW. Weight
// decay applies to parameters of rank >= 2 (matrices and embeddings) and not to biases and
// layer-norm gains, the usual GPT recipe.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>
#include <string>
#include <utility>
#include <vector>

#include "decentrain/autograd/parameters.hpp"
#include "decentrain/kernels/optimizer.hpp"
#include "decentrain/optim/detail.hpp"

namespace decentrain::optim {

struct adamw_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;

  void validate() const {
    decentrain::detail::check(lr >= 0.0, "adamw: lr must be >= 0, got ", lr);
    decentrain::detail::check(beta1 >= 0.0 && beta1 < 1.0 && beta2 >= 0.0 && beta2 < 1.0,
                              "adamw: betas must be in [0, 1), got (", beta1, ", ", beta2, ")");
    decentrain::detail::check(eps > 0.0, "adamw: eps must be > 0, got ", eps);
    decentrain::detail::check(weight_decay >= 0.0, "adamw: weight_decay must be >= 0, got ", weight_decay);
  }
};

template <class Device = cpu>
class adamw {
 public:
  // The optimizer refers to `params`, which must outlive it and keep its entries.
  explicit adamw(parameter_list<Device>& params, adamw_options options = {})
      : params_(&params), options_(options) {
    options_.validate();
    for (const auto& e : params) {
      slots_.push_back({zeros<Device>(e.param.shape(), e.param.dtype()),
                        zeros<Device>(e.param.shape(), e.param.dtype()), 0, e.param.rank() >= 2});
    }
  }

  // One update of every parameter that has a gradient (others are skipped, as in PyTorch), all
  // of one master type in one multi-tensor kernel call.
  void step();

  void set_lr(double lr) {
    decentrain::detail::check(lr >= 0.0, "adamw: lr must be >= 0, got ", lr);
    options_.lr = lr;
  }
  const adamw_options& options() const { return options_; }
  // Whether parameter `name` is weight-decayed.
  bool decays(const std::string& name) const { return slots_[index_of(name)].decay; }

  // The state as named tensors ("<param>.exp_avg", "<param>.exp_avg_sq") plus per-parameter
  // step counts, for checkpoints. load_state takes what state() gave, checking every shape.
  struct state_entry {
    std::string name;
    tensor<Device> exp_avg, exp_avg_sq;
    std::int64_t step;
  };
  std::vector<state_entry> state() const {
    std::vector<state_entry> out;
    std::size_t i = 0;
    for (const auto& e : *params_) {
      const auto& s = slots_[i++];
      out.push_back({e.name, s.m, s.v, s.step});
    }
    return out;
  }
  void load_state(const std::vector<state_entry>& entries) {
    detail_check_size();
    decentrain::detail::check(entries.size() == slots_.size(), "adamw: state has ", entries.size(),
                              " entries but the optimizer has ", slots_.size(), " parameters");
    std::size_t i = 0;
    for (const auto& e : *params_) {
      const auto& in = entries[i];
      decentrain::detail::check(in.name == e.name, "adamw: state entry ", i, " is for '", in.name,
                                "' but parameter ", i, " is '", e.name, "'");
      decentrain::detail::check(in.exp_avg.shape() == e.param.shape() && in.exp_avg_sq.shape() == e.param.shape(),
                                "adamw: state for '", e.name, "' has shape ", in.exp_avg.shape(),
                                " but the parameter has shape ", e.param.shape());
      decentrain::detail::check(in.step >= 0, "adamw: negative step count for '", e.name, "'");
      slots_[i].m.copy_from(in.exp_avg);
      slots_[i].v.copy_from(in.exp_avg_sq);
      slots_[i].step = in.step;
      ++i;
    }
  }

 private:
  struct slot {
    tensor<Device> m, v;
    std::int64_t step;
    bool decay;
  };
  void detail_check_size() const {
    decentrain::detail::check(params_->size() == slots_.size(), "adamw: the parameter list changed size (",
                              slots_.size(), " -> ", params_->size(), ") after the optimizer was made");
  }
  std::size_t index_of(const std::string& name) const {
    std::size_t i = 0;
    for (const auto& e : *params_) {
      if (e.name == name) return i;
      ++i;
    }
    decentrain::detail::fail("adamw: no parameter named '", name, "'");
  }

  parameter_list<Device>* params_;
  adamw_options options_;
  std::vector<slot> slots_;
};

// Out of the class, so not inline: see DECENTRAIN_COMPILED_LIB in config.hpp.
template <class Device>
void adamw<Device>::step() {
  detail_check_size();
  std::vector<tensor<Device>> grads;  // contiguous copies live until the kernels are queued
  std::vector<kernels::adamw_tensor<float>> f32;
  std::vector<kernels::adamw_tensor<double>> f64;
  std::size_t i = 0;
  for (auto& e : *params_) {
    auto& moments = slots_[i++];
    if (!e.param.grad().defined()) continue;
    ++moments.step;
    const double wd = moments.decay ? options_.weight_decay : 0.0;
    grads.push_back(e.param.grad().contiguous());
    const auto& grad = grads.back();
    optim::detail::with_master_type("adamw", e.name, e.param, [&](auto tag) {
      using T = decltype(tag);
      kernels::adamw_tensor<T> t{e.param.value().template data<T>(), grad.template data<T>(),
                                 moments.m.template data<T>(), moments.v.template data<T>(), e.param.value().numel(),
                                 moments.step, wd};
      if constexpr (std::is_same_v<T, float>) f32.push_back(t);
      else f64.push_back(t);
    });
  }
  const kernels::adamw_hyper hyper{options_.lr, options_.beta1, options_.beta2, options_.eps};
  if (!f32.empty()) kernels::adamw_update(Device{}, std::span<const kernels::adamw_tensor<float>>(f32), hyper);
  if (!f64.empty()) kernels::adamw_update(Device{}, std::span<const kernels::adamw_tensor<double>>(f64), hyper);
}

#if defined(DECENTRAIN_COMPILED_LIB)
extern template class adamw<cpu>;
#endif

}  // namespace decentrain::optim
