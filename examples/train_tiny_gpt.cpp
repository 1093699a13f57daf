// A small GPT-2 trained from scratch on the built-in generated corpus in one process, written
// against the model, AdamW, schedule and data directly (no trainer): the single-machine
// example. The demo (scripts/demo) is the decentralized run through decentrain-gpt.
//
//   train_tiny_gpt [--steps N] [--seed S]
#include <decentrain/decentrain.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace dt = decentrain;

int main(int argc, char** argv) {
  std::int64_t steps = 1000;
  std::uint64_t seed = 1337;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", flag.c_str()); return 2; }
    if (flag == "--steps") steps = std::atoll(argv[i + 1]);
    else if (flag == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else { std::fprintf(stderr, "unknown option %s (expected --steps N or --seed S)\n", flag.c_str()); return 2; }
  }
  if (steps <= 0) { std::fprintf(stderr, "--steps must be positive\n"); return 2; }

  const std::string text = dt::data::builtin_corpus(std::size_t{1} << 20, seed);
  const auto tokenizer = dt::data::char_tokenizer::from_text(text);
  const dt::data::token_dataset dataset(tokenizer.encode(text));
  auto config = dt::nn::gpt_preset("tiny");
  config.vocab_size = tokenizer.vocab_size();
  config.block_size = 32;
  const std::int64_t B = 16, T = config.block_size;

  dt::rng init(seed, "init");
  dt::nn::gpt<> model(config, init);
  dt::optim::adamw<> optimizer(model.parameters(), {3e-3, 0.9, 0.99, 1e-8, 0.1});
  const dt::optim::cosine_schedule schedule{3e-3, 3e-4, steps / 10, steps};

  auto val_loss = [&] {
    dt::no_grad guard;
    double sum = 0;
    for (int i = 0; i < 8; ++i) {
      auto [x, y] = dataset.batch(dt::data::split::validation, i, B, T, seed);
      sum += model.loss(x, y).item();
    }
    return sum / 8;
  };

  std::printf("decentrain demo: GPT-2 'tiny' (%lld layers, width %lld), %lld parameters, vocab %lld,\n"
              "%zu training characters of the built-in corpus\n",
              static_cast<long long>(config.n_layer), static_cast<long long>(config.n_embd),
              static_cast<long long>(model.parameters().numel()), static_cast<long long>(config.vocab_size),
              dataset.tokens(dt::data::split::train).size());
  std::printf("initial val loss %.4f (uniform guess: %.4f)\n", val_loss(), std::log(static_cast<double>(config.vocab_size)));
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t step = 0; step < steps; ++step) {
    auto [x, y] = dataset.batch(dt::data::split::train, step, B, T, seed);
    auto loss = model.loss(x, y);
    model.parameters().zero_grad();
    loss.backward();
    dt::optim::clip_grad_norm(model.parameters(), 1.0);
    optimizer.set_lr(schedule(step));
    optimizer.step();
    if ((step + 1) % 50 == 0 || step + 1 == steps) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("step %4lld  train loss %.4f  lr %.2e  %.0f tokens/s\n", static_cast<long long>(step + 1),
                  loss.item(), schedule(step), static_cast<double>((step + 1) * B * T) / secs);
    }
  }
  const double final_val = val_loss();
  std::printf("val loss %.4f\n", final_val);

  // Greedy continuation of a prompt, to show what was learned.
  std::string sample = "where are the ";
  {
    dt::no_grad guard;
    for (int i = 0; i < 60; ++i) {
      const std::size_t from = sample.size() > static_cast<std::size_t>(T) ? sample.size() - static_cast<std::size_t>(T) : 0;
      const auto ctx = tokenizer.encode(std::string_view(sample).substr(from));
      const auto n = static_cast<std::int64_t>(ctx.size());
      const auto logits = model.logits(dt::from_vector(ctx, {1, n})).value().slice(1, n - 1, n).to_vector<float>();
      const auto best = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      sample += tokenizer.decode({best});
    }
  }
  std::printf("sample: \"%s\"\n", sample.c_str());
  return std::isfinite(final_val) ? 0 : 1;
}
