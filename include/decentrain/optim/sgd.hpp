// SGD with optional momentum, Nesterov momentum and (coupled) weight decay, as torch.optim.SGD.
// DiLoCo's outer optimizer is this with Nesterov momentum 0.9 and lr 0.7.
#pragma once

#include <string>
#include <vector>

#include "decentrain/autograd/parameters.hpp"
#include "decentrain/kernels/optimizer.hpp"
#include "decentrain/optim/detail.hpp"

namespace decentrain::optim {

struct sgd_options {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;

  void validate() const {
    decentrain::detail::check(lr >= 0.0, "sgd: lr must be >= 0, got ", lr);
    decentrain::detail::check(momentum >= 0.0, "sgd: momentum must be >= 0, got ", momentum);
    decentrain::detail::check(weight_decay >= 0.0, "sgd: weight_decay must be >= 0, got ", weight_decay);
    decentrain::detail::check(!nesterov || (momentum > 0.0 && dampening == 0.0),
                              "sgd: Nesterov momentum needs momentum > 0 and dampening 0");
  }
};

template <class Device = cpu>
class sgd {
 public:
  explicit sgd(parameter_list<Device>& params, sgd_options options = {}) : params_(&params), options_(options) {
    options_.validate();
    for (const auto& e : params) buffers_.push_back({zeros<Device>(e.param.shape(), e.param.dtype()), false});
  }

  void step() {
    decentrain::detail::check(params_->size() == buffers_.size(), "sgd: the parameter list changed size after the optimizer was made");
    std::size_t i = 0;
    for (auto& e : *params_) {
      auto& buf = buffers_[i++];
      if (!e.param.grad().defined()) continue;
      const auto grad = e.param.grad().contiguous();
      optim::detail::with_master_type("sgd", e.name, e.param, [&](auto tag) {
        using T = decltype(tag);
        kernels::sgd_update(Device{}, e.param.value().template data<T>(), grad.template data<T>(),
                            buf.momentum.template data<T>(), e.param.value().numel(), options_.lr,
                            options_.momentum, options_.dampening, options_.nesterov,
                            options_.weight_decay, !buf.started);
      });
      buf.started = true;
    }
  }

  void set_lr(double lr) {
    decentrain::detail::check(lr >= 0.0, "sgd: lr must be >= 0, got ", lr);
    options_.lr = lr;
  }
  const sgd_options& options() const { return options_; }

  // Momentum buffers by parameter name (undefined before a parameter's first step).
  std::vector<std::pair<std::string, tensor<Device>>> state() const {
    std::vector<std::pair<std::string, tensor<Device>>> out;
    std::size_t i = 0;
    for (const auto& e : *params_) {
      const auto& b = buffers_[i++];
      out.emplace_back(e.name, b.started ? b.momentum : tensor<Device>());
    }
    return out;
  }
  void load_state(const std::vector<std::pair<std::string, tensor<Device>>>& entries) {
    decentrain::detail::check(entries.size() == buffers_.size(), "sgd: state has ", entries.size(),
                              " entries but the optimizer has ", buffers_.size(), " parameters");
    std::size_t i = 0;
    for (const auto& e : *params_) {
      const auto& [name, t] = entries[i];
      decentrain::detail::check(name == e.name, "sgd: state entry ", i, " is for '", name, "' but parameter ", i, " is '", e.name, "'");
      buffers_[i].started = t.defined();
      if (t.defined()) {
        decentrain::detail::check(t.shape() == e.param.shape(), "sgd: momentum for '", e.name, "' has shape ",
                                  t.shape(), " but the parameter has shape ", e.param.shape());
        buffers_[i].momentum.copy_from(t);
      }
      ++i;
    }
  }

 private:
  struct buffer {
    tensor<Device> momentum;
    bool started;
  };
  parameter_list<Device>* params_;
  sgd_options options_;
  std::vector<buffer> buffers_;
};

}  // namespace decentrain::optim
