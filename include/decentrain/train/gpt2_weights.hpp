// GPT-2 weights in Hugging Face's layout, for starting from published checkpoints and handing
// models back: names wte.weight, wpe.weight, h.N.ln_1.weight, h.N.attn.c_attn.weight ([in, out],
// GPT-2's Conv1D layout, which is also ours), ..., ln_f.bias. Accepted on import: an optional
// "transformer." prefix, and ignored: lm_head.weight (tied to wte) and the attention mask
// buffers h.N.attn.bias / h.N.attn.masked_bias. Anything else missing, extra or misshapen is an
// error naming it: a partial load never happens silently.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "decentrain/core/transfer.hpp"
#include "decentrain/io/safetensors.hpp"
#include "decentrain/nn/gpt.hpp"

namespace decentrain::train {

namespace detail {
inline bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
// Our name for a file entry, or "" when the entry is to be ignored.
inline std::string gpt2_name(std::string name) {
  if (name.rfind("transformer.", 0) == 0) name = name.substr(12);
  if (name == "lm_head.weight" || ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) return {};
  return name;
}
inline io::named_tensors normalized(const io::named_tensors& tensors) {
  io::named_tensors out;
  for (const auto& [name, t] : tensors) {
    auto ours = gpt2_name(name);
    if (!ours.empty()) out.emplace(std::move(ours), t);
  }
  return out;
}
}  // namespace detail

// The configuration GPT-2 weights imply; the head count is not stored and must be given.
inline nn::gpt_config gpt2_config(const io::named_tensors& file, std::int64_t n_head) {
  const auto tensors = detail::normalized(file);
  auto get = [&](const std::string& name) -> const tensor<cpu>& {
    auto it = tensors.find(name);
    decentrain::detail::check(it != tensors.end(), "GPT-2 weights: missing tensor '", name, "'");
    return it->second;
  };
  const auto& wte = get("wte.weight");
  const auto& wpe = get("wpe.weight");
  decentrain::detail::check(wte.rank() == 2 && wpe.rank() == 2 && wte.size(1) == wpe.size(1),
                            "GPT-2 weights: wte.weight ", wte.shape(), " and wpe.weight ", wpe.shape(),
                            " must be (vocab, C) and (block, C)");
  std::int64_t layers = 0;
  while (tensors.count("h." + std::to_string(layers) + ".ln_1.weight")) ++layers;
  nn::gpt_config cfg{layers, n_head, wte.size(1), wpe.size(0), wte.size(0), 0.0};
  cfg.bias = tensors.count("ln_f.bias") != 0;  // a bias-free model (nanoGPT's bias=False) has none
  cfg.validate();
  return cfg;
}

// Copies every parameter from `file` into `model` (converting dtype where needed).
template <class Device>
void import_gpt2_weights(nn::gpt<Device>& model, const io::named_tensors& file) {
  decentrain::detail::check(model.config().subspace == 0, "GPT-2 weights: they do not fit a model whose residual stream is "
                            "confined to a subspace (subspace ", model.config().subspace, "); start it from its own initialisation");
  const auto tensors = detail::normalized(file);
  std::set<std::string> unused;
  for (const auto& [name, t] : tensors) unused.insert(name);
  for (auto& e : model.parameters()) {
    auto it = tensors.find(e.name);
    decentrain::detail::check(it != tensors.end(), "GPT-2 weights: missing tensor '", e.name, "'");
    decentrain::detail::check(it->second.shape() == e.param.shape(), "GPT-2 weights: '", e.name, "' has shape ",
                              it->second.shape(), ", the model expects ", e.param.shape());
    decentrain::detail::check(is_floating(it->second.dtype()), "GPT-2 weights: '", e.name, "' has dtype ",
                              dtype_name(it->second.dtype()));
    e.param.value().copy_from(to_device<Device>(it->second));
    unused.erase(e.name);
  }
  // A pipeline stage takes its own tensors; the rest belong to the other stages.
  decentrain::detail::check(unused.empty() || !model.part().whole(), "GPT-2 weights: unexpected tensor '", unused.empty() ? "" : *unused.begin(),
                            "' (", unused.size(), " in all) does not belong to a ", model.config().n_layer, "-layer GPT-2");
}

template <class Device>
io::named_tensors export_gpt2_weights(const nn::gpt<Device>& model) {
  decentrain::detail::check(model.config().subspace == 0, "GPT-2 weights: this model confines its residual stream to a subspace "
                            "(subspace ", model.config().subspace, "), so it is not a GPT-2 and has no Hugging Face layout; "
                            "keep its checkpoint instead");
  io::named_tensors out;
  for (const auto& e : model.parameters()) out.emplace(e.name, host_copy(e.param.value()));
  return out;
}

}  // namespace decentrain::train
