// The layers a GPT-2 is made of: linear, layer norm, causal self-attention with a fused qkv
// projection, and the 4x MLP. Each owns its parameters under GPT-2's (Hugging Face) names
// and registers them in a parameter_list, so checkpoints and safetensors can address them.
#pragma once

#include <cmath>
#include <optional>
#include <string>

#include "decentrain/autograd/autograd.hpp"
#include "decentrain/core/factory.hpp"

namespace decentrain::nn {

// Parameters are kept in f32 (the master copy) and meet activations in the activations' dtype:
// under mixed precision a bf16 input casts the weights to bf16 for the product, and their
// gradients come back in f32 (the cast op). In f32 the casts are no-ops.

// GPT-2 initialisation: weights N(0, std), biases zero. `has_bias` false leaves the bias out.
template <class Device>
struct linear_layer {
  var<Device> weight;  // (in, out), as GPT-2's Conv1D stores it
  var<Device> bias;    // (out,), undefined without a bias

  linear_layer(parameter_list<Device>& params, const std::string& name, std::int64_t in,
               std::int64_t out, double init_std, rng& gen, bool has_bias = true)
      : weight(params.add(name + ".weight", parameter(randn<Device>(shape{in, out}, gen, dtype::f32, 0.0, init_std)))) {
    if (has_bias) bias = params.add(name + ".bias", parameter(zeros<Device>(shape{out})));
  }

  var<Device> operator()(const var<Device>& x) const {
    const auto w = cast(weight, x.dtype());
    return bias.defined() ? linear(x, w, cast(bias, x.dtype())) : linear(x, w);
  }
};

template <class Device>
struct layer_norm_layer {
  var<Device> weight;  // (C,): gain 1
  var<Device> bias;    // (C,): shift 0; without a bias, a constant zero that takes no gradient

  layer_norm_layer(parameter_list<Device>& params, const std::string& name, std::int64_t width,
                   bool has_bias = true)
      : weight(params.add(name + ".weight", parameter(ones<Device>(shape{width})))),
        bias(has_bias ? params.add(name + ".bias", parameter(zeros<Device>(shape{width})))
                      : var<Device>(zeros<Device>(shape{width}))) {}

  // The result is stored as `out` (x's dtype when not given).
  var<Device> operator()(const var<Device>& x, std::optional<dtype> out = std::nullopt) const {
    return layer_norm(x, cast(weight, x.dtype()), cast(bias, x.dtype()), 1e-5, out);
  }
  // x + branch, and that sum normalised, in one pass (see add_layer_norm).
  residual_norm<Device> operator()(const var<Device>& x, const var<Device>& branch,
                                   std::optional<dtype> out = std::nullopt) const {
    return add_layer_norm(x, branch, cast(weight, x.dtype()), cast(bias, x.dtype()), 1e-5, out);
  }
};

template <class Device>
struct causal_self_attention {
  std::int64_t n_head, n_embd;
  linear_layer<Device> c_attn, c_proj;

  // The output projection writes `out` columns: the width, or a subspace's k (gpt_config::subspace).
  causal_self_attention(parameter_list<Device>& params, const std::string& name, std::int64_t width,
                        std::int64_t heads, double proj_std, rng& gen, bool has_bias = true, std::int64_t out = 0)
      : n_head(heads), n_embd(width),
        c_attn(params, name + ".c_attn", width, 3 * width, 0.02, gen, has_bias),
        c_proj(params, name + ".c_proj", width, out > 0 ? out : width, proj_std, gen, has_bias) {}

  var<Device> operator()(const var<Device>& x) const {  // (B,T,C) -> (B,T,out)
    return c_proj(causal_attention(c_attn(x), n_head));  // q, k, v: column blocks of the fused projection
  }
};

template <class Device>
struct mlp {
  linear_layer<Device> c_fc, c_proj;

  mlp(parameter_list<Device>& params, const std::string& name, std::int64_t width, double proj_std, rng& gen,
      bool has_bias = true, std::int64_t out = 0)
      : c_fc(params, name + ".c_fc", width, 4 * width, 0.02, gen, has_bias),
        c_proj(params, name + ".c_proj", 4 * width, out > 0 ? out : width, proj_std, gen, has_bias) {}

  // c_proj(gelu(c_fc(x))) as one op (linear_gelu_linear): bias and GELU fused into the first
  // product, and the backward multiplies by gelu' as the second product's input gradient forms.
  var<Device> operator()(const var<Device>& x) const {
    const auto w1 = cast(c_fc.weight, x.dtype()), w2 = cast(c_proj.weight, x.dtype());
    if (!c_fc.bias.defined()) return linear_gelu_linear(x, w1, w2);
    return linear_gelu_linear(x, w1, cast(c_fc.bias, x.dtype()), w2, cast(c_proj.bias, x.dtype()));
  }
};

}  // namespace decentrain::nn
