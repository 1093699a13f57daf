// GPT-2: token and learned position embeddings, pre-LN blocks (attention and MLP, each inside a
// residual), a final layer norm and an LM head tied to the token embedding. Parameter names
// and layouts are GPT-2's: wte, wpe, h.N.ln_1, h.N.attn.c_attn, ..., ln_f. The model can be cut
// into pipeline stages at whole blocks (nn::part): the first stage holds the embeddings, the
// last the final layer norm and the head, and both hold the tied token embedding. With a
// subspace (gpt_config::subspace, nn/subspace.hpp), the stages pass k coefficients a token
// instead of the residual stream, and the head is untied: lm_head at the last stage, and the
// token and position embeddings' learned parts (k wide) at the first.
#pragma once

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "decentrain/nn/config.hpp"
#include "decentrain/nn/layers.hpp"
#include "decentrain/nn/part.hpp"
#include "decentrain/nn/subspace.hpp"

namespace decentrain::nn {

template <class Device>
struct gpt_block {
  layer_norm_layer<Device> ln_1;
  causal_self_attention<Device> attn;
  layer_norm_layer<Device> ln_2;
  nn::mlp<Device> mlp;

  gpt_block(parameter_list<Device>& params, const std::string& name, const gpt_config& cfg, rng& gen)
      : ln_1(params, name + ".ln_1", cfg.n_embd, cfg.bias),
        attn(params, name + ".attn", cfg.n_embd, cfg.n_head, residual_std(cfg), gen, cfg.bias, cfg.subspace),
        ln_2(params, name + ".ln_2", cfg.n_embd, cfg.bias),
        mlp(params, name + ".mlp", cfg.n_embd, residual_std(cfg), gen, cfg.bias, cfg.subspace) {}

  // Residual projections start smaller so the residual stream's variance does not grow with
  // depth. Into a subspace of k, they write k coefficients instead of C values, each drawn
  // sqrt(C / k) wider: a branch adds as much to the stream's variance either way.
  static double residual_std(const gpt_config& cfg) {
    const double widen = cfg.subspace > 0 ? std::sqrt(static_cast<double>(cfg.n_embd) / static_cast<double>(cfg.subspace)) : 1.0;
    return 0.02 / std::sqrt(2.0 * static_cast<double>(cfg.n_layer)) * widen;
  }
};

template <class Device = cpu>
class gpt {
 public:
  using config_type = gpt_config;
  using device_type = Device;

  // Builds and initialises the model from `init` (GPT-2 initialisation: N(0, 0.02) weights and
  // embeddings, residual projections N(0, 0.02 / sqrt(2 n_layer)), zero biases, unit gains).
  // With a part, only that stage's parameters, with the values the whole model gives them (the
  // draws of the other stages' parameters are made and dropped): the stages of a pipeline
  // start where one peer holding the whole model starts.
  gpt(const gpt_config& cfg, rng& init, const nn::part& part = {});

  // Next-token logits (B, T, V) for token ids (B, T), T <= block_size. Dropout is applied only
  // when `dropout_rng` is given and the configuration has a non-zero rate.
  var<Device> logits(const tensor<Device>& idx, rng* dropout_rng = nullptr) const;

  // Mean cross-entropy of the next-token predictions; targets (B, T), ignore_index -1. The head
  // and the loss are one op (linear_cross_entropy), so the (B, T, V) logits are never kept.
  var<Device> loss(const tensor<Device>& idx, const tensor<Device>& targets, rng* dropout_rng = nullptr) const;

  // Model stage s's forward (see nn::part; s is one of the part's stages): stage 0 reads the
  // token ids, the others `in`, the residual stream (B, T, C) in f32 that the stage before
  // returned; the last stage returns the loss of `targets`, the others the residual stream after
  // their blocks. On the whole model, stage 0 is loss(idx, targets).
  var<Device> stage_forward(int s, const var<Device>& in, const tensor<Device>& idx, const tensor<Device>& targets,
                            rng* dropout_rng = nullptr) const;
  // The parameters held by both the first and the last stage: their gradients are summed
  // between the two (the token embedding, tied to the head; none with a subspace).
  std::vector<std::string> tied_parameters() const {
    return subspace_ ? std::vector<std::string>{} : std::vector<std::string>{"wte.weight"};
  }
  // The width of what goes between stages: the residual stream's C, or a subspace's k.
  std::int64_t stream_width() const { return subspace_ ? cfg_.subspace : cfg_.n_embd; }
  const nn::part& part() const { return part_; }

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
  var<Device> hidden(const tensor<Device>& idx, rng* dropout_rng) const {
    return run_blocks(embed(idx, dropout_rng), dropout_rng, true);
  }
  // Token plus position embeddings of ids (B, T): the residual stream's start.
  var<Device> embed(const tensor<Device>& idx, rng* dropout_rng) const;
  // With a subspace: the stream's fixed part for ids (B, T), and coefficients (..., k) as the
  // stream's values (..., C), in f32 so that what a stage adds stays in the subspace to f32's
  // rounding (the next stage keeps only the subspace's part).
  var<Device> fixed_part(const tensor<Device>& idx) const {
    return embedding(idx, subspace_->fixed_token) + embedding(positions(idx), subspace_->fixed_position);
  }
  var<Device> to_stream(const var<Device>& coefficients) const {
    return subspace_ ? matmul(cast(coefficients, dtype::f32), subspace_->basis, false, true) : coefficients;
  }
  tensor<Device> positions(const tensor<Device>& idx) const {
    const std::int64_t B = idx.size(0), T = idx.size(1);
    return arange<Device>(T, dtype::i32).reshape({1, T}).expand(shape{B, T}).contiguous();
  }
  // The blocks of this part's chunk `chunk` (all of them: -1) on the residual stream x; with
  // `final_norm`, the final layer norm's output in the compute dtype, else the stream after the
  // last block's residual add.
  var<Device> run_blocks(var<Device> x, rng* dropout_rng, bool final_norm, int chunk = -1) const;
  void check_whole(const char* what) const {
    detail::check(part_.whole(), "gpt: ", what, " needs the whole model; this one is stage ", part_.stage, " of ",
                  part_.stages, " (use stage_forward)");
  }

  var<Device> maybe_dropout(const var<Device>& x, rng* gen) const {
    if (gen == nullptr || cfg_.dropout == 0.0) return x;
    return dropout(x, cfg_.dropout, *gen, true);
  }

  gpt_config cfg_;
  nn::part part_;
  dtype compute_ = dtype::f32;
  parameter_list<Device> params_;
  var<Device> wte_, wpe_, head_;  // head_: wte_ (tied), or lm_head with a subspace
  std::optional<subspace_frame<Device>> subspace_;
  std::vector<std::unique_ptr<gpt_block<Device>>> blocks_;
  std::vector<std::int64_t> chunk_start_;  // where each chunk's blocks start in blocks_, and the end
  std::optional<layer_norm_layer<Device>> ln_f_;
};

// Defined out of the class, so not inline: a program built with DECENTRAIN_COMPILED_LIB takes
// gpt<cpu>'s forward pass (and with it every op and kernel it calls) from the compiled library
// instead of compiling it again (see config.hpp).
template <class Device>
gpt<Device>::gpt(const gpt_config& cfg, rng& init, const nn::part& part) : cfg_(cfg), part_(part) {
  cfg_.validate();
  (void)part_.blocks_per_stage(cfg.n_layer);  // checks the cut
  // A parameter of another stage is drawn as the whole model draws it, on the host, and dropped.
  // (Under skip_init nothing is drawn, so there is nothing to keep in step.)
  const bool drawn = !skip_init::active();
  const auto draw = [&](bool mine, const char* name, shape s) {
    if (mine) return params_.add(name, parameter(randn<Device>(s, init, dtype::f32, 0.0, 0.02)));
    if (drawn) (void)randn<cpu>(s, init, dtype::f32, 0.0, 0.02);
    return var<Device>();
  };
  if (cfg_.subspace == 0) {
    wte_ = draw(part_.first() || part_.last(), "wte.weight", shape{cfg.vocab_size, cfg.n_embd});
    wpe_ = draw(part_.first(), "wpe.weight", shape{cfg.block_size, cfg.n_embd});
    head_ = wte_;
  } else {
    // The head is drawn where the tied model draws wte; the learned embeddings start at zero
    // (the fixed embedding alone, as random as GPT-2's first one).
    subspace_.emplace(cfg_);
    head_ = draw(part_.last(), "lm_head.weight", shape{cfg.vocab_size, cfg.n_embd});
    if (part_.first()) {
      wte_ = params_.add("wte.weight", parameter(zeros<Device>(shape{cfg.vocab_size, cfg.subspace})));
      wpe_ = params_.add("wpe.weight", parameter(zeros<Device>(shape{cfg.block_size, cfg.subspace})));
    }
  }
  for (int s = 0; s < part_.model_stages(); ++s) {
    const auto [begin, end] = part_.block_range(cfg.n_layer, s);
    if (part_.holds(s)) chunk_start_.push_back(static_cast<std::int64_t>(blocks_.size()));
    for (std::int64_t l = begin; l < end; ++l) {
      if (part_.holds(s)) {
        blocks_.push_back(std::make_unique<gpt_block<Device>>(params_, "h." + std::to_string(l), cfg_, init));
      } else if (drawn) {
        parameter_list<cpu> elsewhere;
        (void)gpt_block<cpu>(elsewhere, "h." + std::to_string(l), cfg_, init);
      }
    }
  }
  chunk_start_.push_back(static_cast<std::int64_t>(blocks_.size()));
  if (part_.last()) ln_f_.emplace(params_, "ln_f", cfg.n_embd, cfg.bias);
}

template <class Device>
var<Device> gpt<Device>::logits(const tensor<Device>& idx, rng* dropout_rng) const {
  check_whole("logits()");
  return matmul(hidden(idx, dropout_rng), cast(head_, compute_), false, true);  // head: (B,T,C) x (V,C)^T
}

template <class Device>
var<Device> gpt<Device>::loss(const tensor<Device>& idx, const tensor<Device>& targets, rng* dropout_rng) const {
  check_whole("loss()");
  return linear_cross_entropy(hidden(idx, dropout_rng), cast(head_, compute_), targets, -1);
}

template <class Device>
var<Device> gpt<Device>::stage_forward(int s, const var<Device>& in, const tensor<Device>& idx, const tensor<Device>& targets,
                                       rng* dropout_rng) const {
  detail::check(part_.holds(s), "gpt: stage ", s, " of ", part_.model_stages(), " is not part of this one (peer ", part_.stage,
                " of ", part_.stages, ", ", part_.chunks, " chunk(s))");
  const int chunk = part_.chunk_of(s);
  var<Device> x;
  if (s == 0) {
    x = embed(idx, dropout_rng);
  } else {
    detail::check(in.defined() && in.rank() == 3 && in.size(2) == stream_width() && in.dtype() == dtype::f32,
                  "gpt: stage ", s, " reads ", subspace_ ? "the subspace's coefficients" : "the residual stream", " (B, T, ",
                  stream_width(), ") in f32 from the stage before, got ", in.defined() ? in.shape() : shape{}, " ",
                  in.defined() ? dtype_name(in.dtype()) : "(nothing)");
    if (subspace_) {
      detail::check(idx.rank() == 2 && idx.size(0) == in.size(0) && idx.size(1) == in.size(1), "gpt: stage ", s,
                    " rebuilds the stream from the token ids, which must be (B, T) = (", in.size(0), ", ", in.size(1),
                    ") as the coefficients are, got ", idx.shape());
      x = fixed_part(idx) + to_stream(in);
    } else {
      x = in;
    }
  }
  if (s + 1 < part_.model_stages()) {
    auto out = run_blocks(std::move(x), dropout_rng, false, chunk);
    // The stream less its fixed part lies in the subspace: its coefficients are all the next stage needs.
    return subspace_ ? matmul(out - fixed_part(idx), subspace_->basis) : out;
  }
  return linear_cross_entropy(run_blocks(std::move(x), dropout_rng, true, chunk), cast(head_, compute_), targets, -1);
}

template <class Device>
var<Device> gpt<Device>::embed(const tensor<Device>& idx, rng* dropout_rng) const {
  detail::check(idx.rank() == 2, "gpt: input ids must be (B, T), got shape ", idx.shape());
  const std::int64_t T = idx.size(1);
  detail::check(T >= 1 && T <= cfg_.block_size, "gpt: sequence length ", T,
                " is outside [1, block_size = ", cfg_.block_size, "]");
  const auto pos = positions(idx);
  auto learned = maybe_dropout(embedding(idx, wte_) + embedding(pos, wpe_), dropout_rng);  // (B,T,C), or (B,T,k)
  return subspace_ ? fixed_part(idx) + to_stream(learned) : learned;
}

template <class Device>
var<Device> gpt<Device>::run_blocks(var<Device> x, rng* dropout_rng, bool final_norm, int chunk) const {
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
  const auto from = chunk < 0 ? 0 : chunk_start_[static_cast<std::size_t>(chunk)];
  const auto to = chunk < 0 ? static_cast<std::int64_t>(blocks_.size()) : chunk_start_[static_cast<std::size_t>(chunk) + 1];
  for (auto b = from; b < to; ++b) {
    const auto& block = blocks_[static_cast<std::size_t>(b)];
    branch = to_stream(maybe_dropout(block->attn(norm(block->ln_1)), dropout_rng));
    branch = to_stream(maybe_dropout(block->mlp(norm(block->ln_2)), dropout_rng));
  }
  if (final_norm) return norm(*ln_f_);
  // A stage that hands the stream on adds its last branch itself (the same f32 sum the next
  // layer norm would form).
  return branch.defined() ? x + cast(branch, x.dtype()) : x;
}

#if defined(DECENTRAIN_COMPILED_LIB)
extern template class gpt<cpu>;
#endif

}  // namespace decentrain::nn
