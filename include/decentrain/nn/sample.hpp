// Text generation from a language model: top-k cut, temperature, then one draw from the softmax
// per token (llm.c's sampler.h, in the library so every program samples the same way).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "decentrain/autograd/grad_mode.hpp"
#include "decentrain/core/factory.hpp"
#include "decentrain/core/rng.hpp"
#include "decentrain/core/transfer.hpp"
#include "decentrain/detail/error.hpp"

namespace decentrain {
namespace nn {

struct sample_options {
  double temperature = 0.8;   // < 1 sharpens the distribution, > 1 flattens it
  std::int64_t top_k = 40;    // draw only among the k most likely tokens; 0: among all
  std::int64_t tokens = 200;  // how many tokens generate() appends

  // Throws decentrain::error naming the first bad field.
  void validate() const {
    detail::check(std::isfinite(temperature) && temperature > 0, "sample_options: temperature must be finite and > 0, got ",
                  temperature);
    detail::check(top_k >= 0, "sample_options: top_k must be >= 0 (0: no cut), got ", top_k);
    detail::check(tokens >= 0, "sample_options: tokens must be >= 0, got ", tokens);
  }
};

}  // namespace nn

namespace detail {

// One uniform draw from softmax(logits / temperature) over the top-k logits. Tokens that tie
// with the k-th largest logit are all kept, so the cut never depends on an arbitrary order.
template <class T>
std::int32_t sample_next(std::span<const T> logits, const nn::sample_options& opt, rng& gen) {
  opt.validate();
  check(!logits.empty(), "sample_next: no logits");
  check(logits.size() <= std::size_t{1} << 31, "sample_next: ", logits.size(), " logits do not fit token ids (std::int32_t)");
  std::vector<double> w(logits.begin(), logits.end());
  for (std::size_t i = 0; i < w.size(); ++i)
    check(!std::isnan(w[i]) && w[i] != INFINITY, "sample_next: logit ", i, " is ", w[i], " (expected a number or -inf)");
  const double mx = *std::max_element(w.begin(), w.end());
  check(mx != -INFINITY, "sample_next: every logit is -inf, so no token can be drawn");
  if (opt.top_k > 0 && static_cast<std::size_t>(opt.top_k) < w.size()) {
    std::vector<double> sorted = w;
    const auto kth = sorted.begin() + (opt.top_k - 1);
    std::nth_element(sorted.begin(), kth, sorted.end(), std::greater<>());
    const double cut = *kth;
    for (auto& l : w)
      if (l < cut) l = -INFINITY;
  }
  double total = 0;
  for (auto& l : w) total += (l = std::exp((l - mx) / opt.temperature));  // the max gives 1, so total >= 1
  // Walks the cumulative weights; tokens of weight 0 (cut, or underflowed) are stepped over, so
  // neither a draw of exactly 0 nor a rounding shortfall at the end can pick one.
  double u = gen.uniform() * total;
  std::size_t last = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (w[i] == 0) continue;
    last = i;
    if ((u -= w[i]) <= 0) return static_cast<std::int32_t>(i);
  }
  return static_cast<std::int32_t>(last);
}

}  // namespace detail

namespace nn {

// The next token given one position's logits (one per vocabulary entry). Uses one
// gen.uniform() per call, so a seeded stream gives the same tokens every run.
inline std::int32_t sample_next(std::span<const float> logits, const sample_options& opt, rng& gen) {
  return detail::sample_next(logits, opt, gen);
}
inline std::int32_t sample_next(std::span<const double> logits, const sample_options& opt, rng& gen) {
  return detail::sample_next(logits, opt, gen);
}

// `prompt` followed by opt.tokens sampled tokens. Each step runs the model (no graph) on the
// last block_size tokens, as it was trained, and samples from the last position's logits.
// Model: config() with block_size and vocab_size, logits(ids (1, T)) -> (1, T, vocab), and
// device_type (nn::gpt).
template <class Model>
std::vector<std::int32_t> generate(Model& model, std::vector<std::int32_t> prompt, const sample_options& opt, rng& gen) {
  using Device = typename Model::device_type;
  opt.validate();
  const auto& cfg = model.config();
  detail::check(!prompt.empty(), "generate: the prompt is empty (the model needs at least one token to start from)");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    detail::check(prompt[i] >= 0 && prompt[i] < cfg.vocab_size, "generate: prompt token ", prompt[i], " at position ", i,
                  " is outside the vocabulary [0, ", cfg.vocab_size, ")");
  no_grad guard;
  auto ids = std::move(prompt);
  ids.reserve(ids.size() + static_cast<std::size_t>(opt.tokens));
  for (std::int64_t i = 0; i < opt.tokens; ++i) {
    const auto n = std::min<std::int64_t>(static_cast<std::int64_t>(ids.size()), cfg.block_size);
    const std::vector<std::int32_t> context(ids.end() - n, ids.end());
    const auto all = model.logits(to_device<Device>(from_vector(context, shape{1, n}))).value();
    const auto last = to_device<cpu>(all.slice(1, n - 1, n).contiguous()).template to_vector<float>();
    detail::check(static_cast<std::int64_t>(last.size()) == cfg.vocab_size, "generate: the model gave ", last.size(),
                  " logits for a vocabulary of ", cfg.vocab_size);
    ids.push_back(sample_next(std::span<const float>(last), opt, gen));
  }
  return ids;
}

}  // namespace nn
}  // namespace decentrain
