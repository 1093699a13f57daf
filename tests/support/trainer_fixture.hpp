// What the trainer and policy tests share: a small corpus, a one-layer GPT for it, flat
// parameter vectors to compare, a bf16 codec written as a user would write one, and a wrapper
// that records a policy's gradients or makes it fail once.
#pragma once

#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace fixture {

namespace dt = decentrain;

struct corpus {
  dt::data::char_tokenizer tok;
  dt::data::token_dataset data;
};
inline const corpus& small_corpus() {
  static const corpus c = [] {
    const auto text = dt::data::builtin_corpus(std::size_t{1} << 16, 5);
    auto tok = dt::data::char_tokenizer::from_text(text);
    return corpus{tok, dt::data::token_dataset(tok.encode(text))};
  }();
  return c;
}

// One layer, width 32, block 16, for the small corpus's vocabulary.
inline dt::nn::gpt_config tiny_gpt() {
  auto c = dt::nn::gpt_preset("tiny");
  c.vocab_size = small_corpus().tok.vocab_size();
  c.block_size = 16;
  c.n_layer = 1;
  c.n_embd = 32;
  c.n_head = 2;
  return c;
}

// The largest difference of `a` from the reference `b`, relative to b's largest magnitude (a
// size mismatch counts as 1e30).
inline double relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 1e30;
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale == 0 ? worst : worst / scale;
}
inline double uniform_loss() { return std::log(static_cast<double>(small_corpus().tok.vocab_size())); }

// `steps` steps of 2 rows, evaluated once at the end on one batch.
inline dt::train::trainer_options small_run(std::int64_t steps) {
  dt::train::trainer_options o;
  o.steps = steps;
  o.batch_size = 2;
  o.eval_batches = 1;
  o.eval_every = 0;
  return o;
}

inline std::vector<float> flat_params(const dt::parameter_list<dt::cpu>& p) {
  std::vector<float> v;
  dt::comm::gather_values(p, v);
  return v;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

// The replicas' spread: the largest difference between two replicas in any coordinate, infinite
// when a value is not finite. Mixing by a doubly stochastic matrix never widens it.
inline double spread(const std::vector<std::vector<float>>& replicas) {
  double most = 0;
  for (std::size_t i = 0; !replicas.empty() && i < replicas[0].size(); ++i) {
    double low = INFINITY, high = -INFINITY;
    for (const auto& r : replicas) {
      REQUIRE(r.size() == replicas[0].size());
      if (!std::isfinite(r[i])) return INFINITY;
      low = std::min(low, static_cast<double>(r[i]));
      high = std::max(high, static_cast<double>(r[i]));
    }
    most = std::max(most, high - low);
  }
  return most;
}

// Values rounded to bf16 (nearest even), 2 bytes each: a codec from outside the library.
struct bf16_codec {
  std::size_t max_encoded_bytes(std::size_t n) const { return 2 * n; }
  std::size_t encode(std::span<const float> in, std::span<std::byte> out) {
    for (std::size_t i = 0; i < in.size(); ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, &in[i], 4);
      bits += 0x7fffu + ((bits >> 16) & 1u);
      const auto half = static_cast<std::uint16_t>(bits >> 16);
      std::memcpy(out.data() + 2 * i, &half, 2);
    }
    return 2 * in.size();
  }
  void decode_add(std::span<const std::byte> in, std::span<float> into) const {
    dt::detail::check(in.size() == 2 * into.size(), "bf16_codec: a payload of ", in.size(), " bytes for ", into.size(),
                      " values");
    for (std::size_t i = 0; i < into.size(); ++i) {
      std::uint16_t half;
      std::memcpy(&half, in.data() + 2 * i, 2);
      const std::uint32_t bits = static_cast<std::uint32_t>(half) << 16;
      float v;
      std::memcpy(&v, &bits, 4);
      into[i] += v;
    }
  }
};
static_assert(dt::compress::codec<bf16_codec>);

// Wraps a communication policy: records the gradients each peer holds right after the
// policy's after_backward on step 0 (flat, or by name), and can throw a peer error once at a given step (on every
// peer alike, before any message is sent, like a collective that failed and was abandoned).
template <class Inner>
struct probe {
  using policy_concept = dt::comm::policy_tag;
  Inner inner{};
  // Each peer's gradients at step grads_at, after the inner policy's after_backward (and before it).
  std::vector<std::vector<float>>* grads = nullptr;
  std::vector<std::vector<float>>* grads_before = nullptr;
  std::int64_t grads_at = 0;
  // The same by parameter name, where peers hold different parameters (a pipeline's stages).
  std::vector<std::map<std::string, std::vector<float>>>* named = nullptr;
  std::int64_t fail_at = -1;
  bool failed = false;
  // Each peer's parameters right before the inner policy's after_step of the last step.
  std::vector<std::vector<float>>* before_last = nullptr;

  template <class Ctx>
  void start(Ctx& ctx) {
    inner.start(ctx);
  }
  template <class Ctx>
  void after_backward(Ctx& ctx) {
    if (grads_before && ctx.step == grads_at)
      dt::comm::gather_grads(ctx.parameters, (*grads_before)[static_cast<std::size_t>(ctx.comm.rank())]);
    inner.after_backward(ctx);
    if (grads && ctx.step == grads_at) dt::comm::gather_grads(ctx.parameters, (*grads)[static_cast<std::size_t>(ctx.comm.rank())]);
    if (named && ctx.step == 0)
      for (const auto& e : ctx.parameters) {
        const auto g = e.param.grad().contiguous();
        (*named)[static_cast<std::size_t>(ctx.comm.rank())][e.name].assign(g.template data<float>(),
                                                                           g.template data<float>() + g.numel());
      }
  }
  template <class Ctx>
  void after_step(Ctx& ctx) {
    if (ctx.step == fail_at && !failed) {
      failed = true;
      throw dt::transport::peer_error((ctx.comm.rank() + 1) % ctx.comm.world(), "all_reduce", "injected: the peer went away");
    }
    if (before_last && ctx.last_step) dt::comm::gather_values(ctx.parameters, (*before_last)[static_cast<std::size_t>(ctx.comm.rank())]);
    inner.after_step(ctx);
  }
  // (the inner policy's work sized to speed, where it has it)
  std::int64_t local_steps(std::int64_t step) const
    requires requires(const Inner& i, std::int64_t s) { i.local_steps(s); }
  {
    return inner.local_steps(step);
  }
  bool accumulates() const
    requires requires(const Inner& i) { i.accumulates(); }
  {
    return inner.accumulates();
  }
  void save(dt::io::checkpoint& c) const { inner.save(c); }
  void load(const dt::io::checkpoint& c) { inner.load(c); }
};

// Trains `world` in-process peers and returns each peer's parameters at its last evaluation.
template <class Trainer>
std::vector<std::vector<float>> final_params(int world, const typename Trainer::model_config& cfg,
                                             dt::train::trainer_options opts, typename Trainer::comm_policy comm = {},
                                             std::vector<dt::train::fit_result>* results = nullptr,
                                             typename Trainer::parallel_policy parallel = {},
                                             typename Trainer::fault_policy fault = {}) {
  std::vector<std::vector<float>> params(static_cast<std::size_t>(world));
  auto r = dt::train::fit_in_process<Trainer>(
      dt::transport::in_process(world), cfg, opts, small_corpus().data, comm,
      [&](Trainer& t) {
        t.on_eval([&, &t = t](const dt::train::eval_point&) {
          params[static_cast<std::size_t>(t.rank())] = flat_params(t.model().parameters());
        });
      },
      1, parallel, fault);
  if (results) *results = r;
  return params;
}

// Each peer's checkpoint after `step` steps of the full run's schedule (stopped through a hook),
// and the final parameters of a run resumed from such checkpoints.
template <class Trainer>
std::vector<dt::io::checkpoint> stop_at(int world, std::int64_t step, const typename Trainer::model_config& cfg,
                                        const dt::train::trainer_options& opts, const typename Trainer::comm_policy& comm,
                                        const typename Trainer::parallel_policy& parallel = {}) {
  std::vector<dt::io::checkpoint> saved(static_cast<std::size_t>(world));
  dt::transport::in_process(world).run([&](dt::transport::in_process::endpoint& ep) {
    Trainer t(cfg, opts, ep, comm, parallel);
    struct stop {};
    t.on_step([&](const dt::train::step_metrics& m) {
      if (m.step == step) {
        saved[static_cast<std::size_t>(ep.rank())] = t.capture();
        throw stop{};
      }
    });
    try {
      (void)t.fit(small_corpus().data);
    } catch (const stop&) {
    }
  });
  return saved;
}
template <class Trainer>
std::vector<std::vector<float>> resume_from(const std::vector<dt::io::checkpoint>& saved, const typename Trainer::model_config& cfg,
                                            const dt::train::trainer_options& opts, const typename Trainer::comm_policy& comm,
                                            const typename Trainer::parallel_policy& parallel = {}) {
  std::vector<std::vector<float>> params(saved.size());
  dt::transport::in_process(static_cast<int>(saved.size())).run([&](dt::transport::in_process::endpoint& ep) {
    Trainer t(cfg, opts, ep, comm, parallel);
    t.restore(saved[static_cast<std::size_t>(ep.rank())]);
    (void)t.fit(small_corpus().data);
    params[static_cast<std::size_t>(ep.rank())] = flat_params(t.model().parameters());
  });
  return params;
}

}  // namespace fixture
