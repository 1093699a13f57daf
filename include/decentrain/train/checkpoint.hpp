// Moving a training run in and out of a checkpoint: the GPT's parameters ("model.<name>") and
// configuration ("config.*"), AdamW's state ("adamw.<name>.*") and the step. Resuming from it
// reproduces the uninterrupted run bit for bit (tests/train/test_checkpoint.cpp).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>

#include "decentrain/core/transfer.hpp"
#include "decentrain/io/checkpoint.hpp"
#include "decentrain/nn/gpt.hpp"
#include "decentrain/optim/adamw.hpp"

namespace decentrain::train {

// Model parameters ("model.<name>"), a GPT's configuration ("config.*"), AdamW state
// ("adamw.<name>.*") and the step, in one checkpoint. Any model with parameters() will do; the
// configuration is stored for models whose config() is a GPT's.
namespace detail {
// A model's parameters for reading, through its const parameters() where it has one.
template <class Model>
decltype(auto) parameters_to_read(const Model& m) {
  if constexpr (requires { m.parameters(); })
    return m.parameters();
  else
    return const_cast<Model&>(m).parameters();  // read only; the model offers no const access
}

// With `views`, host tensors go in as they are (io::checkpoint::views), GPU tensors as host copies.
template <class Device>
tensor<cpu> host_view_or_copy(const tensor<Device>& t, bool views) {
  if constexpr (std::is_same_v<Device, cpu>)
    if (views) return t;
  return host_copy(t);
}
}  // namespace detail

template <class Model, class Device>
io::checkpoint capture(const Model& model, const optim::adamw<Device>& optimizer, std::int64_t step, bool views = false) {
  io::checkpoint c;
  c.views = views;
  for (const auto& e : detail::parameters_to_read(model))
    c.tensors["model." + e.name] = detail::host_view_or_copy(e.param.value(), views);
  if constexpr (requires { { model.config() } -> std::convertible_to<nn::gpt_config>; }) {
    const nn::gpt_config cfg = model.config();
    c.counters["config.n_layer"] = cfg.n_layer;
    c.counters["config.n_head"] = cfg.n_head;
    c.counters["config.n_embd"] = cfg.n_embd;
    c.counters["config.block_size"] = cfg.block_size;
    c.counters["config.vocab_size"] = cfg.vocab_size;
    c.counters["config.bias"] = cfg.bias ? 1 : 0;
    std::ostringstream dropout;
    dropout.precision(17);
    dropout << cfg.dropout;
    c.text["config.dropout"] = dropout.str();
  }
  for (const auto& s : optimizer.state()) {
    c.tensors["adamw." + s.name + ".exp_avg"] = detail::host_view_or_copy(s.exp_avg, views);
    c.tensors["adamw." + s.name + ".exp_avg_sq"] = detail::host_view_or_copy(s.exp_avg_sq, views);
    c.counters["adamw." + s.name + ".step"] = s.step;
  }
  c.counters["step"] = step;
  return c;
}

inline nn::gpt_config config_of(const io::checkpoint& c) {
  nn::gpt_config cfg{c.counter("config.n_layer"), c.counter("config.n_head"), c.counter("config.n_embd"),
                     c.counter("config.block_size"), c.counter("config.vocab_size"), 0.0};
  auto it = c.text.find("config.dropout");
  decentrain::detail::check(it != c.text.end(), "checkpoint: missing text 'config.dropout'");
  cfg.dropout = std::stod(it->second);
  cfg.bias = c.counter("config.bias") != 0;
  cfg.validate();
  return cfg;
}

// Loads parameters and optimizer state into a model built with config_of(c) (any model whose
// parameters have the checkpoint's names and shapes); returns the step.
template <class Model, class Device>
std::int64_t restore(const io::checkpoint& c, Model& model, optim::adamw<Device>& optimizer) {
  if constexpr (requires { { model.config() } -> std::convertible_to<nn::gpt_config>; })
    decentrain::detail::check(config_of(c) == model.config(), "checkpoint: its model configuration differs from the model's");
  for (auto& e : model.parameters()) {
    const auto& t = c.tensor_at("model." + e.name);
    decentrain::detail::check(t.shape() == e.param.shape(), "checkpoint: 'model.", e.name, "' has shape ", t.shape(),
                              ", the model expects ", e.param.shape());
    e.param.value().copy_from(to_device<Device>(t));
  }
  auto state = optimizer.state();
  for (auto& s : state) {
    s.exp_avg = to_device<Device>(c.tensor_at("adamw." + s.name + ".exp_avg"));
    s.exp_avg_sq = to_device<Device>(c.tensor_at("adamw." + s.name + ".exp_avg_sq"));
    s.step = c.counter("adamw." + s.name + ".step");
  }
  optimizer.load_state(state);
  return c.counter("step");
}

}  // namespace decentrain::train
