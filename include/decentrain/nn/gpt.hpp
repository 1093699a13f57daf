// GPT-2: token and learned position embeddings, pre-LN blocks (attention and MLP, each inside a
// residual), a final layer norm and an LM head tied to the token embedding. Parameter names
// and layouts are GPT-2's: wte, wpe, h.N.ln_1, h.N.attn.c_attn, ..., ln_f.
#pragma once

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "decentrain/nn/config.hpp"
#include "decentrain/nn/layers.hpp"

namespace decentrain::nn {

template <class Device>
struct gpt_block {
  layer_norm_layer<Device> ln_1;
  causal_self_attention<Device> attn;
  layer_norm_layer<Device> ln_2;
  nn::mlp<Device> mlp;

  gpt_block(parameter_list<Device>& params, const std::string& name, const gpt_config& cfg, rng& gen)
      : ln_1(params, name + ".ln_1", cfg.n_embd, cfg.bias),
        attn(params, name + ".attn", cfg.n_embd, cfg.n_head, residual_std(cfg), gen, cfg.bias),
        ln_2(params, name + ".ln_2", cfg.n_embd, cfg.bias),
        mlp(params, name + ".mlp", cfg.n_embd, residual_std(cfg), gen, cfg.bias) {}

  // Residual projections start smaller so the residual stream's variance does not grow with depth.
  static double residual_std(const gpt_config& cfg) {
    return 0.02 / std::sqrt(2.0 * static_cast<double>(cfg.n_layer));
  }
};

template <class Device = cpu>
class gpt {
 public:
  using config_type = gpt_config;
  using device_type = Device;

  // Builds and initialises the model from `init` (GPT-2 initialisation: N(0, 0.02) weights and
  // embeddings, residual projections N(0, 0.02 / sqrt(2 n_layer)), zero biases, unit gains).
  gpt(const gpt_config& cfg, rng& init);

  // Next-token logits (B, T, V) for token ids (B, T), T <= block_size. Dropout is applied only
  // when `dropout_rng` is given and the configuration has a non-zero rate.
  var<Device> logits(const tensor<Device>& idx, rng* dropout_rng = nullptr) const;

  // Mean cross-entropy of the next-token predictions; targets (B, T), ignore_index -1. The head
  // and the loss are one op (linear_cross_entropy), so the (B, T, V) logits are never kept.
  var<Device> loss(const tensor<Device>& idx, const tensor<Device>& targets, rng* dropout_rng = nullptr) const;

  // The dtype of the blocks' activations and products: f32 (default) or bf16 (mixed precision:
  // parameters, optimizer state and gradients stay f32). Not part of the configuration: a
  // checkpoint trained one way resumes either way.
  void set_compute_dtype(dtype t) {
    detail::check(t == dtype::f32 || t == dtype::bf16, "gpt: compute dtype must be f32 or bf16, got ", dtype_name(t));
    compute_ = t;
  }
  dtype compute_dtype() const { return compute_; }

  const gpt_config& config() const { return cfg_; }
  parameter_list<Device>& parameters() { return params_; }
  const parameter_list<Device>& parameters() const { return params_; }

 private:
  // The last layer norm's output (B, T, C) in the compute dtype: what the tied head multiplies.
  var<Device> hidden(const tensor<Device>& idx, rng* dropout_rng) const;

  var<Device> maybe_dropout(const var<Device>& x, rng* gen) const {
    if (gen == nullptr || cfg_.dropout == 0.0) return x;
    return dropout(x, cfg_.dropout, *gen, true);
  }

  gpt_config cfg_;
  dtype compute_ = dtype::f32;
  parameter_list<Device> params_;
  var<Device> wte_, wpe_;
  std::vector<std::unique_ptr<gpt_block<Device>>> blocks_;
  std::optional<layer_norm_layer<Device>> ln_f_;
};

// Defined out of the class, so not inline: a program built with DECENTRAIN_COMPILED_LIB takes
// gpt<cpu>'s forward pass (and with it every op and kernel it calls) from the compiled library
// instead of compiling it again (see config.hpp).
template <class Device>
gpt<Device>::gpt(const gpt_config& cfg, rng& init) : cfg_(cfg) {
  cfg_.validate();
  wte_ = params_.add("wte.weight", parameter(randn<Device>(shape{cfg.vocab_size, cfg.n_embd}, init, dtype::f32, 0.0, 0.02)));
  wpe_ = params_.add("wpe.weight", parameter(randn<Device>(shape{cfg.block_size, cfg.n_embd}, init, dtype::f32, 0.0, 0.02)));
  for (std::int64_t l = 0; l < cfg.n_layer; ++l)
    blocks_.push_back(std::make_unique<gpt_block<Device>>(params_, "h." + std::to_string(l), cfg_, init));
  ln_f_.emplace(params_, "ln_f", cfg.n_embd, cfg.bias);
}

template <class Device>
var<Device> gpt<Device>::logits(const tensor<Device>& idx, rng* dropout_rng) const {
  return matmul(hidden(idx, dropout_rng), cast(wte_, compute_), false, true);  // tied head: (B,T,C) x (V,C)^T
}

template <class Device>
var<Device> gpt<Device>::loss(const tensor<Device>& idx, const tensor<Device>& targets, rng* dropout_rng) const {
  return linear_cross_entropy(hidden(idx, dropout_rng), cast(wte_, compute_), targets, -1);
}

template <class Device>
var<Device> gpt<Device>::hidden(const tensor<Device>& idx, rng* dropout_rng) const {
  detail::check(idx.rank() == 2, "gpt: input ids must be (B, T), got shape ", idx.shape());
  const std::int64_t B = idx.size(0), T = idx.size(1);
  detail::check(T >= 1 && T <= cfg_.block_size, "gpt: sequence length ", T,
                " is outside [1, block_size = ", cfg_.block_size, "]");
  auto positions = arange<Device>(T, dtype::i32).reshape({1, T}).expand(shape{B, T}).contiguous();
  auto x = embedding(idx, wte_) + embedding(positions, wpe_);  // (B,T,C)
  x = maybe_dropout(x, dropout_rng);
  // Mixed precision (compute dtype bf16): the residual stream and layer norms stay in f32, as
  // under autocast; each layer norm stores its output in bf16, so the branch's products,
  // attention and GELU read and keep bf16 activations, and the next layer norm adds the
  // branch's bf16 output to the f32 stream. On the GPU those conversions happen inside the
  // layer norm kernels; elsewhere the op makes them around its kernel, with the same values.
  // Each branch's output is added to the residual stream by the next layer norm, which
  // normalises the sum in the same pass (x = x + branch; ln(x)).
  var<Device> branch;
  const auto norm = [&](const layer_norm_layer<Device>& ln) {
    if (!branch.defined()) return ln(x, compute_);
    auto [sum, normed] = ln(x, branch, compute_);
    x = std::move(sum);
    branch = var<Device>();
    return normed;
  };
  for (const auto& block : blocks_) {
    branch = maybe_dropout(block->attn(norm(block->ln_1)), dropout_rng);
    branch = maybe_dropout(block->mlp(norm(block->ln_2)), dropout_rng);
  }
  return norm(*ln_f_);
}

#if defined(DECENTRAIN_COMPILED_LIB)
extern template class gpt<cpu>;
#endif

}  // namespace decentrain::nn
