// End to end on one machine: the tiny preset learns the built-in corpus with AdamW within a
// few hundred steps (the loss must fall well below the uniform guess, log V).
#include <decentrain/decentrain.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

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

TEST_CASE("mixed precision: bf16 compute with f32 master weights tracks f32 training", "[nn][training]") {
  const auto text = dt::data::builtin_corpus(200000, 1);
  const auto tok = dt::data::char_tokenizer::from_text(text);
  const dt::data::token_dataset ds(tok.encode(text));
  auto cfg = dt::nn::gpt_preset("tiny");
  cfg.vocab_size = tok.vocab_size();
  cfg.block_size = 32;
  const auto train = [&](dt::dtype compute, int steps) {
    dt::rng init(1, "init");
    dt::nn::gpt<> model(cfg, init);
    model.set_compute_dtype(compute);
    dt::optim::adamw<> opt(model.parameters(), {3e-3, 0.9, 0.99, 1e-8, 0.1});
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step) {
      auto [x, y] = ds.batch(dt::data::split::train, step, 16, 32, 7);
      auto loss = model.loss(x, y);
      losses.push_back(loss.item());
      model.parameters().zero_grad();
      loss.backward();
      if (step == 0)
        for (const auto& e : model.parameters()) {
          INFO(e.name);
          CHECK(e.param.dtype() == dt::dtype::f32);        // master weights stay f32
          REQUIRE(e.param.grad().defined());
          CHECK(e.param.grad().dtype() == dt::dtype::f32);  // and receive f32 gradients
        }
      opt.step();
    }
    return losses;
  };
  const auto f32 = train(dt::dtype::f32, 150), mixed = train(dt::dtype::bf16, 150);
  // bf16 activations round at 8 bits: the first loss agrees to about 1%, and training follows.
  CHECK(mixed[0] == Approx(f32[0]).epsilon(0.01));
  CHECK(mixed[0] != f32[0]);  // the bf16 path really ran
  const auto tail_mean = [](const std::vector<double>& v) {
    double s = 0;
    for (std::size_t i = v.size() - 20; i < v.size(); ++i) s += v[i];
    return s / 20;
  };
  INFO("last-20 mean loss f32 " << tail_mean(f32) << ", bf16 " << tail_mean(mixed));
  CHECK(tail_mean(mixed) < f32[0] - 1.0);
  CHECK(tail_mean(mixed) == Approx(tail_mean(f32)).epsilon(0.03));

  dt::rng init(1, "init");
  dt::nn::gpt<> model(cfg, init);
  CHECK_THROWS_WITH(model.set_compute_dtype(dt::dtype::f64), Catch::Contains("compute dtype must be f32 or bf16"));
}
