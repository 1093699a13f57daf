// GPT-2 model configuration and the named presets. The parameter count is computed from the
// configuration alone, so a 124M model's size can be reported without allocating it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "decentrain/detail/error.hpp"

namespace decentrain::nn {

struct gpt_config {
  std::int64_t n_layer = 2;
  std::int64_t n_head = 2;
  std::int64_t n_embd = 64;
  std::int64_t block_size = 64;
  std::int64_t vocab_size = 256;
  double dropout = 0.0;
  // GPT-2 has biases in every linear and layer norm; nanoGPT's `bias=False` drops them all,
  // which trains slightly better on small data (the convergence recipe in bench/RESULTS.md).
  bool bias = true;
  // Protocol Models' subspace (arXiv 2506.01260), for a model cut into stages: k > 0 confines
  // what the model learns in its residual stream to a fixed k-dimensional subspace shared by
  // every layer (the blocks' output projections write k coefficients, the learned token and
  // position embeddings are k wide), on top of a fixed high-rank embedding every stage can
  // rebuild from the token ids. The stream between stages is then k coefficients a token, not
  // n_embd, in both directions and without loss; the head is untied (lm_head). 0: off (GPT-2).
  std::int64_t subspace = 0;

  // Throws decentrain::error naming the first bad field.
  void validate() const {
    detail::check(n_layer > 0, "gpt_config: n_layer must be positive, got ", n_layer);
    detail::check(n_head > 0, "gpt_config: n_head must be positive, got ", n_head);
    detail::check(n_embd > 0 && n_embd % n_head == 0, "gpt_config: n_embd (", n_embd,
                  ") must be a positive multiple of n_head (", n_head, ")");
    detail::check(block_size > 0, "gpt_config: block_size must be positive, got ", block_size);
    detail::check(vocab_size > 0 && vocab_size <= (std::int64_t{1} << 31) - 1,
                  "gpt_config: vocab_size must be in [1, 2^31), got ", vocab_size);
    detail::check(dropout >= 0.0 && dropout < 1.0, "gpt_config: dropout must be in [0, 1), got ", dropout);
    detail::check(subspace >= 0 && subspace < n_embd, "gpt_config: subspace must be in [0, n_embd = ", n_embd,
                  ") (0: off), got ", subspace);
  }

  // Trainable parameters (the LM head is tied to the token embedding, so counted once; with a
  // subspace, the head is its own and the fixed embedding is not trained).
  std::int64_t parameter_count() const {
    const std::int64_t c = n_embd, b = bias ? 1 : 0, out = subspace > 0 ? subspace : c;
    const std::int64_t per_block = (1 + b) * c                // ln_1
                                   + c * 3 * c + b * 3 * c      // attn.c_attn
                                   + c * out + b * out          // attn.c_proj
                                   + (1 + b) * c                // ln_2
                                   + c * 4 * c + b * 4 * c      // mlp.c_fc
                                   + 4 * c * out + b * out;     // mlp.c_proj
    const std::int64_t head = subspace > 0 ? vocab_size * c : 0;
    return vocab_size * out + block_size * out + head + n_layer * per_block + (1 + b) * c;
  }
  // A field a checkpoint written before it existed lacks, read as its default (train/checkpoint.hpp).
  static bool optional_field(const std::string& name) { return name == "subspace"; }

  // Every field, by name, to visit(name, field): how a checkpoint keeps a configuration without
  // knowing the model (train/checkpoint.hpp).
  template <class Visit>
  void fields(Visit&& visit) const {
    each_field(*this, visit);
  }
  template <class Visit>
  void fields(Visit&& visit) {
    each_field(*this, visit);
  }

  friend bool operator==(const gpt_config&, const gpt_config&) = default;

 private:
  template <class Self, class Visit>
  static void each_field(Self& self, Visit& visit) {
    visit("n_layer", self.n_layer);
    visit("n_head", self.n_head);
    visit("n_embd", self.n_embd);
    visit("block_size", self.block_size);
    visit("vocab_size", self.vocab_size);
    visit("bias", self.bias);
    visit("dropout", self.dropout);
    visit("subspace", self.subspace);
  }
};

// `tiny` (tests), `shakespeare-char` (nanoGPT's character model), `gpt2-124m` (GPT-2 small).
// The vocabulary of the first two is a placeholder that the data's tokenizer replaces.
inline gpt_config gpt_preset(std::string_view name) {
  if (name == "tiny") return {2, 2, 64, 64, 256, 0.0};
  if (name == "shakespeare-char") return {6, 6, 384, 256, 65, 0.2};
  if (name == "gpt2-124m") return {12, 12, 768, 1024, 50257, 0.0};
  detail::fail("unknown model preset '", std::string(name),
               "' (expected tiny, shakespeare-char or gpt2-124m)");
}

}  // namespace decentrain::nn
