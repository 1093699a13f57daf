// The GPT-2 model: configuration checks, parameter names and counts, initialisation, and
// parity of the whole model (forward and every gradient) with the PyTorch fixture.
#include "support/fixture.hpp"

#include <decentrain/nn/nn.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <vector>

namespace nn = decentrain::nn;
using Catch::Matchers::Contains;

TEST_CASE("presets and parameter counts", "[nn][gpt]") {
  CHECK(nn::gpt_preset("gpt2-124m").parameter_count() == 124439808);  // GPT-2 small, tied head
  CHECK(nn::gpt_preset("shakespeare-char").n_layer == 6);
  CHECK_THROWS_WITH(nn::gpt_preset("gpt5"), Contains("unknown model preset 'gpt5'"));
  for (auto cfg : {nn::gpt_preset("tiny"), nn::gpt_config{3, 3, 24, 7, 11, 0.0}}) {
    dt::rng gen(1, "init");
    nn::gpt<> model(cfg, gen);
    CHECK(model.parameters().numel() == cfg.parameter_count());
    CHECK(model.parameters().size() == static_cast<std::size_t>(4 + 12 * cfg.n_layer));
  }
}

TEST_CASE("configurations are validated", "[nn][gpt]") {
  CHECK_THROWS_WITH((nn::gpt_config{2, 3, 64, 8, 10, 0.0}.validate()), Contains("n_embd (64) must be a positive multiple of n_head (3)"));
  CHECK_THROWS_WITH((nn::gpt_config{0, 2, 64, 8, 10, 0.0}.validate()), Contains("n_layer must be positive"));
  CHECK_THROWS_WITH((nn::gpt_config{2, 2, 64, 8, 10, 1.0}.validate()), Contains("dropout must be in [0, 1)"));
  dt::rng gen(1, "init");
  nn::gpt<> model(nn::gpt_preset("tiny"), gen);
  CHECK_THROWS_WITH(model.logits(dt::zeros(dt::shape{1, 65}, dt::dtype::i32)), Contains("sequence length 65 is outside [1, block_size = 64]"));
  CHECK_THROWS_WITH(model.logits(dt::zeros(dt::shape{65}, dt::dtype::i32)), Contains("must be (B, T)"));
  CHECK_THROWS_WITH(model.logits(dt::full(dt::shape{1, 2}, 300, dt::dtype::i32)), Contains("id 300"));
}

TEST_CASE("GPT-2 initialisation: names, statistics and residual scaling", "[nn][gpt]") {
  dt::rng gen(3, "init");
  const nn::gpt_config cfg{4, 4, 128, 32, 200, 0.0};
  nn::gpt<> model(cfg, gen);
  auto stddev = [&](const std::string& name) {
    const auto v = model.parameters().get(name).value().to_vector<double>();
    double s = 0;
    for (double x : v) s += x * x;
    return std::sqrt(s / static_cast<double>(v.size()));
  };
  CHECK(stddev("wte.weight") == Approx(0.02).epsilon(0.05));
  CHECK(stddev("h.0.attn.c_attn.weight") == Approx(0.02).epsilon(0.05));
  CHECK(stddev("h.3.mlp.c_proj.weight") == Approx(0.02 / std::sqrt(8.0)).epsilon(0.05));
  CHECK(stddev("h.1.attn.c_proj.bias") == 0.0);
  CHECK(model.parameters().get("ln_f.weight").value().to_vector<float>() == std::vector<float>(128, 1.f));
  CHECK(model.parameters().get("h.2.attn.c_attn.weight").shape() == dt::shape{128, 384});
  dt::rng again(3, "init");
  nn::gpt<> twin(cfg, again);
  CHECK(dt::allclose(twin.parameters().get("h.3.mlp.c_fc.weight").value(),
                     model.parameters().get("h.3.mlp.c_fc.weight").value(), 0.0, 0.0));
}

TEST_CASE("the model matches PyTorch's GPT-2 forward and backward", "[nn][gpt][parity]") {
  const fixture fx(DECENTRAIN_FIXTURE_DIR "/gpt_block.dtfx");
  const auto c = fx["config"].to_vector<std::int32_t>();
  const nn::gpt_config cfg{c[4], c[3], c[2], c[1], c[0], 0.0};
  dt::rng gen(0, "init");
  nn::gpt<> model(cfg, gen);
  for (auto& e : model.parameters()) e.param.value().copy_from(fx["param." + e.name]);
  auto logits = model.logits(fx["idx"]);
  const auto cmp = dt::compare(logits.value(), fx["logits"], 1e-4, 1e-5);
  INFO(cmp.message);
  CHECK(cmp.close);
  auto loss = model.loss(fx["idx"], fx["targets"]);
  CHECK(loss.item() == Approx(fx["loss"].item()).epsilon(1e-5));
  loss.backward();
  for (auto& e : model.parameters()) {
    INFO(e.name);
    const auto g = dt::compare(e.param.grad(), fx["grad." + e.name], 1e-4, 1e-5);
    INFO(g.message);
    CHECK(g.close);
  }
}

TEST_CASE("dropout is off without an rng and reproducible with one", "[nn][gpt]") {
  dt::rng gen(1, "init");
  auto cfg = nn::gpt_preset("tiny");
  cfg.dropout = 0.2;
  nn::gpt<> model(cfg, gen);
  const auto idx = dt::from_vector(std::vector<std::int32_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  const auto plain = model.logits(idx).value();
  CHECK(dt::allclose(model.logits(idx).value(), plain, 0.0, 0.0));
  dt::rng a(9, "dropout"), b(9, "dropout");
  const auto dropped = model.logits(idx, &a).value();
  CHECK_FALSE(dt::allclose(dropped, plain, 1e-3, 1e-3));
  CHECK(dt::allclose(model.logits(idx, &b).value(), dropped, 0.0, 0.0));
}

TEST_CASE("the bias-free variant has no biases and counts its parameters", "[nn][gpt]") {
  auto cfg = nn::gpt_preset("tiny");
  cfg.bias = false;
  dt::rng gen(1, "init");
  nn::gpt<> model(cfg, gen);
  CHECK(model.parameters().numel() == cfg.parameter_count());
  CHECK(model.parameters().size() == static_cast<std::size_t>(2 + 6 * cfg.n_layer + 1));
  for (const auto& e : model.parameters()) CHECK(e.name.find(".bias") == std::string::npos);
  auto with_bias = cfg;
  with_bias.bias = true;
  CHECK(with_bias.parameter_count() - cfg.parameter_count() == cfg.n_layer * (1 + 3 + 1 + 1 + 4 + 1) * cfg.n_embd + cfg.n_embd);  // ln_1, c_attn, c_proj, ln_2, c_fc, mlp.c_proj; ln_f
  auto loss = model.loss(dt::from_vector(std::vector<std::int32_t>{1, 2, 3}, {1, 3}), dt::from_vector(std::vector<std::int32_t>{2, 3, 4}, {1, 3}));
  loss.backward();
  for (const auto& e : model.parameters()) CHECK(e.param.grad().defined());
}

namespace {
nn::gpt_config subspace_config(std::int64_t k) {
  nn::gpt_config cfg{4, 2, 32, 16, 20, 0.0};
  cfg.subspace = k;
  return cfg;
}
}  // namespace

TEST_CASE("a subspace model: k-wide projections and learned embeddings, an untied head, counted and validated", "[nn][gpt][subspace]") {
  const auto cfg = subspace_config(4);
  dt::rng gen(1, "init");
  nn::gpt<> model(cfg, gen);
  CHECK(model.parameters().numel() == cfg.parameter_count());
  CHECK(model.parameters().get("h.0.attn.c_proj.weight").shape() == dt::shape{32, 4});
  CHECK(model.parameters().get("h.3.mlp.c_proj.weight").shape() == dt::shape{128, 4});
  CHECK(model.parameters().get("h.3.mlp.c_proj.bias").shape() == dt::shape{4});
  CHECK(model.parameters().get("wte.weight").shape() == dt::shape{20, 4});
  CHECK(model.parameters().get("wpe.weight").shape() == dt::shape{16, 4});
  CHECK(model.parameters().get("lm_head.weight").shape() == dt::shape{20, 32});
  CHECK(model.tied_parameters().empty());
  CHECK(model.stream_width() == 4);
  CHECK_THROWS_WITH(subspace_config(32).validate(), Contains("subspace must be in [0, n_embd = 32)"));
  CHECK_THROWS_WITH(subspace_config(-1).validate(), Contains("subspace must be in [0, n_embd = 32)"));
  // The fixed frame comes from the configuration alone: two builds agree, whatever the run's seed.
  const nn::subspace_frame<dt::cpu> a(cfg), b(cfg);
  CHECK(dt::allclose(a.basis.value(), b.basis.value(), 0.0, 0.0));
  CHECK(dt::allclose(a.fixed_token.value(), b.fixed_token.value(), 0.0, 0.0));
  const auto u = a.basis.value().to_vector<double>();
  double worst = 0;  // U^T U = I
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      double dot = 0;
      for (int r = 0; r < 32; ++r) dot += u[static_cast<std::size_t>(r * 4 + i)] * u[static_cast<std::size_t>(r * 4 + j)];
      worst = std::max(worst, std::abs(dot - (i == j ? 1.0 : 0.0)));
    }
  CHECK(worst < 1e-6);
  // Not a GPT-2: no Hugging Face layout either way.
  CHECK_THROWS_WITH(dt::train::export_gpt2_weights(model), Contains("confines its residual stream to a subspace"));
  dt::rng other(1, "init");
  nn::gpt<> plain(nn::gpt_config{4, 2, 32, 16, 20, 0.0}, other);
  CHECK_THROWS_WITH(dt::train::import_gpt2_weights(model, dt::train::export_gpt2_weights(plain)), Contains("subspace 4"));
}

TEST_CASE("a subspace model's stages pass k coefficients a token and compute the whole model's loss", "[nn][gpt][subspace]") {
  for (std::int64_t k : {1, 4, 12}) {
    INFO("k = " << k);
    const auto cfg = subspace_config(k);
    dt::rng gen(7, "init");
    nn::gpt<> whole(cfg, gen);
    // Train the whole model a few steps first, so that the learned parts are not zero.
    dt::optim::adamw_options o;
    o.lr = 1e-2;
    dt::optim::adamw<dt::cpu> opt(whole.parameters(), o);
    dt::rng data(3, "data");
    const auto ids = dt::uniform(dt::shape{2, 16}, data, 0.0, 20.0, dt::dtype::f32).to(dt::dtype::i32);
    const auto targets = dt::uniform(dt::shape{2, 16}, data, 0.0, 20.0, dt::dtype::f32).to(dt::dtype::i32);
    for (int step = 0; step < 5; ++step) {
      whole.parameters().zero_grad();
      whole.loss(ids, targets).backward();
      opt.step();
    }
    const double loss = whole.loss(ids, targets).value().item<float>();
    // The same weights cut into 3 stages (4 blocks: 2, 1, 1).
    std::vector<std::unique_ptr<nn::gpt<>>> stages;
    for (int s = 0; s < 3; ++s) {
      dt::rng again(7, "init");
      stages.push_back(std::make_unique<nn::gpt<>>(cfg, again, nn::part{s, 3, {}}));
      for (auto& e : stages.back()->parameters()) e.param.value().copy_from(whole.parameters().get(e.name).value());
    }
    dt::var<dt::cpu> x;
    for (int s = 0; s < 2; ++s) {
      x = stages[static_cast<std::size_t>(s)]->stage_forward(s, x, ids, targets);
      CHECK(x.shape() == dt::shape{2, 16, k});
      x = dt::var<dt::cpu>(x.value());  // what travels: the coefficients alone
    }
    const double piped = stages[2]->stage_forward(2, x, ids, targets).value().item<float>();
    CHECK(piped == Approx(loss).epsilon(1e-5));
  }
  // Coefficients of the wrong width or for other ids are refused by name.
  const auto cfg = subspace_config(4);
  dt::rng gen(7, "init");
  nn::gpt<> last(cfg, gen, nn::part{1, 2, {}});
  const auto ids = dt::zeros(dt::shape{2, 16}, dt::dtype::i32);
  CHECK_THROWS_WITH(last.stage_forward(1, dt::var<dt::cpu>(dt::zeros(dt::shape{2, 16, 32})), ids, ids),
                    Contains("the subspace's coefficients (B, T, 4)"));
  CHECK_THROWS_WITH(last.stage_forward(1, dt::var<dt::cpu>(dt::zeros(dt::shape{2, 8, 4})), ids, ids),
                    Contains("must be (B, T) = (2, 8)"));
}

TEST_CASE("a checkpoint written before the subspace field reads as a model without one, other fields stay required",
          "[nn][gpt][subspace]") {
  auto cfg = subspace_config(4);
  dt::io::checkpoint c;
  dt::train::save_config(c, cfg);
  CHECK(dt::train::config_of<nn::gpt_config>(c) == cfg);
  c.counters.erase("config.subspace");
  cfg.subspace = 0;
  CHECK(dt::train::config_of<nn::gpt_config>(c) == cfg);
  c.counters.erase("config.n_layer");
  CHECK_THROWS_WITH(dt::train::config_of<nn::gpt_config>(c), Contains("missing counter 'config.n_layer'"));
}
