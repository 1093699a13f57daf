// Sampling (nn/sample.hpp): the top-k cut, temperature and the softmax draw against
// frequencies computed here, determinism by seed, the context generate() gives the model, and
// the errors for bad options, logits and prompts.
#include <decentrain/nn/gpt.hpp>
#include <decentrain/nn/sample.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

namespace dt = decentrain;
namespace nn = decentrain::nn;
using Catch::Matchers::Contains;

namespace {

std::int32_t argmax(const std::vector<float>& v) {
  return static_cast<std::int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// A stand-in model whose logits are known: at the last position token (last id + 1) % V wins
// by 10, at every earlier position token 0 does. It records each context it is given and
// whether a graph was being recorded.
struct successor_model {
  using device_type = dt::cpu;
  nn::gpt_config cfg{1, 1, 8, 4, 10, 0.0};
  std::vector<std::vector<std::int32_t>> contexts;
  std::vector<bool> grad_was_on;

  const nn::gpt_config& config() const { return cfg; }
  dt::var<dt::cpu> logits(const dt::tensor<dt::cpu>& idx) {
    contexts.push_back(idx.to_vector<std::int32_t>());
    grad_was_on.push_back(dt::grad_enabled());
    const std::int64_t T = idx.shape()[1], V = cfg.vocab_size;
    std::vector<float> out(static_cast<std::size_t>(T * V), 0.0f);
    for (std::int64_t t = 0; t + 1 < T; ++t) out[static_cast<std::size_t>(t * V)] = 10.0f;
    out[static_cast<std::size_t>((T - 1) * V + (contexts.back().back() + 1) % V)] = 10.0f;
    return dt::var<dt::cpu>(dt::from_vector(out, dt::shape{1, T, V}));
  }
};

}  // namespace

TEST_CASE("sample: top_k = 1 is the argmax, whatever the temperature", "[nn][sample]") {
  dt::rng values(11, "logits"), gen(12, "sample");
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> logits(37);
    for (auto& l : logits) l = static_cast<float>(3 * values.normal());
    for (double temperature : {0.1, 1.0, 50.0}) {
      const nn::sample_options opt{temperature, 1, 0};
      CHECK(nn::sample_next(logits, opt, gen) == argmax(logits));
    }
  }
  // Tokens tied with the k-th largest logit all stay in the draw.
  const std::vector<float> tied{1, 3, -2, 3, 0};
  std::vector<int> seen(tied.size());
  for (int i = 0; i < 1000; ++i) ++seen[static_cast<std::size_t>(nn::sample_next(tied, {1.0, 1, 0}, gen))];
  CHECK(seen == std::vector<int>{0, seen[1], 0, seen[3], 0});
  CHECK(seen[1] > 400);
  CHECK(seen[3] > 400);
}

TEST_CASE("sample: a small temperature concentrates the draws on the largest logit", "[nn][sample]") {
  const std::vector<float> logits{0.0f, 1.0f, 0.9f, -2.0f, 0.95f};
  dt::rng gen(3, "sample");
  int others = 0;
  for (int i = 0; i < 2000; ++i) others += nn::sample_next(logits, {1e-3, 0, 0}, gen) != 1;
  CHECK(others == 0);
  // At temperature 1 the same logits give the others a large share: the test above can fail.
  for (int i = 0; i < 2000; ++i) others += nn::sample_next(logits, {1.0, 0, 0}, gen) != 1;
  CHECK(others > 1000);
}

TEST_CASE("sample: draw frequencies match the softmax of the top-k logits over temperature", "[nn][sample]") {
  const std::vector<double> logits{0.5, -1.0, 2.0, 0.0, 1.2, -0.3};
  struct config {
    double temperature;
    std::int64_t top_k;
    std::vector<std::size_t> kept;  // the top_k largest, by hand
  };
  for (const auto& c : {config{0.7, 0, {0, 1, 2, 3, 4, 5}}, config{1.3, 3, {2, 4, 0}}, config{0.5, 6, {0, 1, 2, 3, 4, 5}},
                        config{2.0, 2, {2, 4}}}) {
    std::vector<double> p(logits.size(), 0.0);
    double total = 0;
    for (auto i : c.kept) total += p[i] = std::exp(logits[i] / c.temperature);
    for (auto& x : p) x /= total;
    const int draws = 200'000;
    std::vector<int> count(logits.size());
    dt::rng gen(static_cast<std::uint64_t>(c.top_k) + 100, "sample");
    for (int i = 0; i < draws; ++i) ++count[static_cast<std::size_t>(nn::sample_next(logits, {c.temperature, c.top_k, 0}, gen))];
    for (std::size_t i = 0; i < logits.size(); ++i) {
      CAPTURE(c.temperature, c.top_k, i, p[i], count[i]);
      if (p[i] == 0) {
        CHECK(count[i] == 0);  // cut by top-k: never drawn
      } else {
        const double freq = static_cast<double>(count[i]) / draws, sigma = std::sqrt(p[i] * (1 - p[i]) / draws);
        CHECK(std::abs(freq - p[i]) < 5 * sigma);
      }
    }
  }
}

TEST_CASE("sample: the same seed gives the same tokens, another seed others", "[nn][sample]") {
  const std::vector<float> flat(256, 0.0f);
  const auto draw = [&](std::uint64_t seed) {
    dt::rng gen(seed, "sample");
    std::vector<std::int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(nn::sample_next(flat, {1.0, 0, 0}, gen));
    return out;
  };
  CHECK(draw(5) == draw(5));
  CHECK(draw(5) != draw(6));
  const auto used = draw(5);
  CHECK(std::set<std::int32_t>(used.begin(), used.end()).size() > 32);  // flat means spread out

  dt::rng init(1, "init");
  nn::gpt<> model(nn::gpt_config{2, 2, 32, 16, 40, 0.0}, init);
  const auto generate = [&](std::uint64_t seed) {
    dt::rng gen(seed, "sample");
    return nn::generate(model, {1, 2, 3}, {1.0, 0, 30}, gen);
  };
  const auto a = generate(7);
  CHECK(a.size() == 33);
  CHECK(a == generate(7));
  CHECK(a != generate(8));
}

TEST_CASE("sample: generate gives the model the last block_size tokens, under no_grad, and draws from the last position",
          "[nn][sample]") {
  successor_model model;  // block_size 4, vocabulary 10
  dt::rng gen(1, "sample");
  const auto out = nn::generate(model, {7, 8}, {1.0, 1, 6}, gen);
  CHECK(out == std::vector<std::int32_t>{7, 8, 9, 0, 1, 2, 3, 4});
  CHECK(model.contexts == std::vector<std::vector<std::int32_t>>{{7, 8}, {7, 8, 9}, {7, 8, 9, 0}, {8, 9, 0, 1}, {9, 0, 1, 2}, {0, 1, 2, 3}});
  CHECK(std::none_of(model.grad_was_on.begin(), model.grad_was_on.end(), [](bool on) { return on; }));
  CHECK(dt::grad_enabled());  // and recording is back on afterwards
  // A prompt longer than block_size starts from its last block_size tokens.
  model.contexts.clear();
  CHECK(nn::generate(model, {1, 2, 3, 4, 5, 6}, {1.0, 1, 1}, gen) == std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7});
  CHECK(model.contexts == std::vector<std::vector<std::int32_t>>{{3, 4, 5, 6}});
  CHECK(nn::generate(model, {4}, {1.0, 40, 0}, gen) == std::vector<std::int32_t>{4});  // no tokens asked for
}

TEST_CASE("sample: generate on a GPT is the CLI's loop (model.logits on the last block_size tokens, then sample_next)",
          "[nn][sample]") {
  const nn::gpt_config cfg{2, 2, 32, 8, 50, 0.0};
  dt::rng init(2, "init");
  nn::gpt<> model(cfg, init);
  const std::vector<std::int32_t> prompt{5, 17, 3, 49, 0, 22, 8, 31, 12, 40, 2};  // longer than block_size
  for (const nn::sample_options opt : {nn::sample_options{1.0, 1, 12}, nn::sample_options{0.8, 5, 12}}) {
    dt::rng gen(9, "sample"), same(9, "sample");
    const auto got = nn::generate(model, prompt, opt, gen);
    std::vector<std::int32_t> want = prompt;
    for (std::int64_t i = 0; i < opt.tokens; ++i) {
      dt::no_grad guard;
      const auto n = std::min<std::int64_t>(static_cast<std::int64_t>(want.size()), cfg.block_size);
      const std::vector<std::int32_t> ctx(want.end() - n, want.end());
      const auto logits = model.logits(dt::from_vector(ctx, dt::shape{1, n})).value();
      const auto last = logits.slice(1, n - 1, n).contiguous().to_vector<float>();
      want.push_back(nn::sample_next(last, opt, same));
    }
    CAPTURE(opt.temperature, opt.top_k);
    CHECK(got == want);
  }
}

TEST_CASE("sample: bad options, logits and prompts are errors naming the value", "[nn][sample]") {
  CHECK_NOTHROW(nn::sample_options{}.validate());
  CHECK_THROWS_WITH((nn::sample_options{0.0, 40, 10}.validate()), Contains("temperature must be finite and > 0, got 0"));
  CHECK_THROWS_WITH((nn::sample_options{-1.0, 40, 10}.validate()), Contains("temperature must be finite and > 0, got -1"));
  CHECK_THROWS_WITH((nn::sample_options{NAN, 40, 10}.validate()), Contains("temperature must be finite and > 0, got nan"));
  CHECK_THROWS_WITH((nn::sample_options{INFINITY, 40, 10}.validate()), Contains("temperature must be finite and > 0, got inf"));
  CHECK_THROWS_WITH((nn::sample_options{1.0, -1, 10}.validate()), Contains("top_k must be >= 0 (0: no cut), got -1"));
  CHECK_THROWS_WITH((nn::sample_options{1.0, 40, -5}.validate()), Contains("tokens must be >= 0, got -5"));

  dt::rng gen(1, "sample");
  CHECK_THROWS_WITH(nn::sample_next(std::vector<float>{1, 2}, {0.0, 0, 0}, gen), Contains("temperature"));
  CHECK_THROWS_WITH(nn::sample_next(std::vector<float>{}, {}, gen), Contains("no logits"));
  CHECK_THROWS_WITH(nn::sample_next(std::vector<float>{1, NAN, 2}, {}, gen), Contains("logit 1 is nan"));
  CHECK_THROWS_WITH(nn::sample_next(std::vector<float>{1, 2, INFINITY}, {}, gen), Contains("logit 2 is inf"));
  CHECK_THROWS_WITH(nn::sample_next(std::vector<float>{-INFINITY, -INFINITY}, {}, gen), Contains("every logit is -inf"));
  CHECK(nn::sample_next(std::vector<float>{-INFINITY, 0.5f, -INFINITY}, {}, gen) == 1);  // -inf is a masked token

  successor_model model;  // vocabulary 10
  CHECK_THROWS_WITH(nn::generate(model, {}, {}, gen), Contains("the prompt is empty"));
  CHECK_THROWS_WITH(nn::generate(model, {1, 10}, {}, gen),
                    Contains("prompt token 10 at position 1 is outside the vocabulary [0, 10)"));
  CHECK_THROWS_WITH(nn::generate(model, {-1}, {}, gen), Contains("prompt token -1 at position 0 is outside the vocabulary"));
  CHECK_THROWS_WITH(nn::generate(model, {1}, {1.0, -3, 1}, gen), Contains("top_k must be >= 0"));
  CHECK(model.contexts.empty());  // every check comes before the model runs
}
