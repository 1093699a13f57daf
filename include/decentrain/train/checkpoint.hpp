// Moving a training run in and out of a checkpoint: the model's parameters ("model.<name>") and
// configuration ("config.*", for a configuration that names its fields), AdamW's state
// ("adamw.<name>.*") and the step. Resuming from it reproduces the uninterrupted run bit for bit
// (tests/train/test_checkpoint.cpp).
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>

#include "decentrain/core/transfer.hpp"
#include "decentrain/io/checkpoint.hpp"
#include "decentrain/optim/adamw.hpp"

namespace decentrain::train {

// A model configuration a checkpoint can keep: one that hands each field to visit(name, field)
// (nn::gpt_config::fields). Whole numbers and flags go in as counters "config.<name>", the others
// as text (a double to its last bit).
template <class Config>
concept storable_config = std::equality_comparable<Config> && requires(const Config& c, Config& m) {
  c.fields([](const char*, const auto&) {});
  m.fields([](const char*, auto&) {});
};

template <storable_config Config>
void save_config(io::checkpoint& c, const Config& cfg) {
  cfg.fields([&](const char* name, const auto& v) {
    const auto key = std::string("config.") + name;
    if constexpr (std::is_integral_v<std::remove_cvref_t<decltype(v)>>) {
      c.counters[key] = static_cast<std::int64_t>(v);
    } else {
      std::ostringstream text;
      text.precision(17);
      text << v;
      c.text[key] = text.str();
    }
  });
}

// The configuration a checkpoint keeps (validated where the type can: validate()). A field the
// configuration names optional (Config::optional_field) and the checkpoint lacks, because it was
// written before the field existed, keeps its default; any other missing field is an error.
template <storable_config Config>
Config config_of(const io::checkpoint& c) {
  Config cfg{};
  cfg.fields([&](const char* name, auto& v) {
    using field = std::remove_cvref_t<decltype(v)>;
    const auto key = std::string("config.") + name;
    if constexpr (requires { { Config::optional_field(name) } -> std::convertible_to<bool>; })
      if (Config::optional_field(name) && !c.counters.contains(key) && !c.text.contains(key)) return;  // its default
    if constexpr (std::is_integral_v<field>) {
      v = static_cast<field>(c.counter(key));
    } else {
      const auto it = c.text.find(key);
      decentrain::detail::check(it != c.text.end(), "checkpoint: missing text '", key, "'");
      std::istringstream text(it->second);
      text >> v;
      decentrain::detail::check(!text.fail() && text.eof(), "checkpoint: '", key, "' is '", it->second, "', not a value of its field");
    }
  });
  if constexpr (requires { cfg.validate(); }) cfg.validate();
  return cfg;
}

// Model parameters ("model.<name>"), its configuration ("config.*"), AdamW state
// ("adamw.<name>.*") and the step, in one checkpoint. Any model with parameters() will do; the
// configuration is stored for models whose config() is storable_config.
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
  if constexpr (requires { requires storable_config<std::remove_cvref_t<decltype(model.config())>>; })
    save_config(c, model.config());
  for (const auto& s : optimizer.state()) {
    c.tensors["adamw." + s.name + ".exp_avg"] = detail::host_view_or_copy(s.exp_avg, views);
    c.tensors["adamw." + s.name + ".exp_avg_sq"] = detail::host_view_or_copy(s.exp_avg_sq, views);
    c.counters["adamw." + s.name + ".step"] = s.step;
  }
  c.counters["step"] = step;
  return c;
}

// Loads parameters and optimizer state into a model built with config_of<its config>(c) (any model whose
// parameters have the checkpoint's names and shapes); returns the step.
template <class Model, class Device>
std::int64_t restore(const io::checkpoint& c, Model& model, optim::adamw<Device>& optimizer) {
  if constexpr (requires { requires storable_config<std::remove_cvref_t<decltype(model.config())>>; })
    decentrain::detail::check(config_of<std::remove_cvref_t<decltype(model.config())>>(c) == model.config(),
                              "checkpoint: its model configuration differs from the model's");
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
