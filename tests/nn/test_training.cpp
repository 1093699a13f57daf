// End to end on one machine: the tiny preset learns the built-in corpus with AdamW within a
// few hundred steps (the loss must fall well below the uniform guess, log V).
#include <decentrain/decentrain.hpp>

#include <catch2/catch.hpp>

#include <cmath>

namespace dt = decentrain;

TEST_CASE("tiny GPT learns the built-in corpus", "[nn][training]") {
  const auto text = dt::data::builtin_corpus(200000, 1);
  const auto tok = dt::data::char_tokenizer::from_text(text);
  const dt::data::token_dataset ds(tok.encode(text));
  auto cfg = dt::nn::gpt_preset("tiny");
  cfg.vocab_size = tok.vocab_size();
  cfg.block_size = 32;
  dt::rng init(1, "init");
  dt::nn::gpt<> model(cfg, init);
  dt::optim::adamw<> opt(model.parameters(), {3e-3, 0.9, 0.99, 1e-8, 0.1});
  auto eval = [&] {
    dt::no_grad guard;
    double total = 0;
    for (int i = 0; i < 4; ++i) {
      auto [x, y] = ds.batch(dt::data::split::validation, i, 16, 32, 7);
      total += model.loss(x, y).item();
    }
    return total / 4;
  };
  const double before = eval();
  for (int step = 0; step < 300; ++step) {
    auto [x, y] = ds.batch(dt::data::split::train, step, 16, 32, 7);
    auto loss = model.loss(x, y);
    model.parameters().zero_grad();
    loss.backward();
    dt::optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
  }
  const double after = eval();
  INFO("val loss " << before << " -> " << after << " (uniform " << std::log(double(cfg.vocab_size)) << ")");
  CHECK(before == Approx(std::log(double(cfg.vocab_size))).margin(0.1));
  CHECK(after < 1.0);  // each character carries < 1 nat of surprise once words are learnt
}
