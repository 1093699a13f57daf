// The demo: a one-block GPT trained from scratch on a small generated language, on one
// process, with nothing but the library's tensors and autograd. Later issues make the same
// run decentralized; for now it shows the foundation learning something real.
//
//   train_tiny_gpt [--steps N] [--seed S]
#include <decentrain/decentrain.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace dt = decentrain;

namespace {

// A tiny procedural language: subject-verb-object sentences whose verb agrees with the
// subject's number, so the model must carry information across several characters.
std::string generate_corpus(std::size_t chars, dt::rng& gen) {
  const std::vector<std::string> singular = {"the cat", "a dog", "the bird", "my friend"};
  const std::vector<std::string> plural = {"the cats", "two dogs", "the birds", "our friends"};
  const std::vector<std::pair<std::string, std::string>> verbs = {
      {"sees", "see"}, {"likes", "like"}, {"chases", "chase"}, {"finds", "find"}};
  const std::vector<std::string> objects = {"the ball", "a tree", "the river", "some food"};
  const auto pick = [&](const auto& v) -> const auto& { return v[gen.below(v.size())]; };
  std::string text;
  while (text.size() < chars) {
    const bool many = gen.below(2) == 1;
    const auto& verb = pick(verbs);
    text += (many ? pick(plural) : pick(singular)) + " " + (many ? verb.second : verb.first) + " " +
            pick(objects) + ". ";
  }
  return text;
}

struct model {
  std::int64_t vocab, block, width, heads;
  dt::parameter_list<> params;
  dt::var<> wte, wpe, ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b,
      fc2_w, fc2_b, lnf_w, lnf_b;

  model(std::int64_t v, std::int64_t t, std::int64_t c, std::int64_t h, dt::rng& gen)
      : vocab(v), block(t), width(c), heads(h) {
    auto normal = [&](const char* name, dt::shape s, double std) {
      return params.add(name, dt::parameter(dt::randn(s, gen, dt::dtype::f32, 0.0, std)));
    };
    auto constant = [&](const char* name, dt::shape s, double value) {
      return params.add(name, dt::parameter(dt::full(s, value)));
    };
    wte = normal("wte", {v, c}, 0.02);
    wpe = normal("wpe", {t, c}, 0.02);
    ln1_w = constant("ln_1.weight", {c}, 1.0), ln1_b = constant("ln_1.bias", {c}, 0.0);
    attn_w = normal("attn.c_attn.weight", {c, 3 * c}, 0.02), attn_b = constant("attn.c_attn.bias", {3 * c}, 0.0);
    proj_w = normal("attn.c_proj.weight", {c, c}, 0.02 / std::sqrt(2.0)), proj_b = constant("attn.c_proj.bias", {c}, 0.0);
    ln2_w = constant("ln_2.weight", {c}, 1.0), ln2_b = constant("ln_2.bias", {c}, 0.0);
    fc_w = normal("mlp.c_fc.weight", {c, 4 * c}, 0.02), fc_b = constant("mlp.c_fc.bias", {4 * c}, 0.0);
    fc2_w = normal("mlp.c_proj.weight", {4 * c, c}, 0.02 / std::sqrt(2.0)), fc2_b = constant("mlp.c_proj.bias", {c}, 0.0);
    lnf_w = constant("ln_f.weight", {c}, 1.0), lnf_b = constant("ln_f.bias", {c}, 0.0);
  }

  dt::var<> logits(const dt::tensor<>& idx) {  // idx (B,T) -> (B,T,V)
    const std::int64_t B = idx.size(0), T = idx.size(1);
    const auto pos = dt::arange(T, dt::dtype::i32).reshape({1, T}).expand(dt::shape{B, T}).contiguous();
    auto x = dt::embedding(idx, wte) + dt::embedding(pos, wpe);
    auto qkv = dt::split(dt::linear(dt::layer_norm(x, ln1_w, ln1_b), attn_w, attn_b), {width, width, width}, -1);
    x = x + dt::linear(dt::causal_attention(qkv[0], qkv[1], qkv[2], heads), proj_w, proj_b);
    x = x + dt::linear(dt::gelu(dt::linear(dt::layer_norm(x, ln2_w, ln2_b), fc_w, fc_b)), fc2_w, fc2_b);
    return dt::matmul(dt::layer_norm(x, lnf_w, lnf_b), wte, false, true);
  }
};

// Adam without weight decay: the demo's own few lines until optim/ brings AdamW.
struct adam {
  explicit adam(double learning_rate) : lr(learning_rate) {}
  double lr, b1 = 0.9, b2 = 0.99, eps = 1e-8;
  int t = 0;
  std::vector<std::vector<float>> m, v;
  void step(dt::parameter_list<>& params) {
    ++t;
    if (m.empty())
      for (auto& e : params) {
        m.emplace_back(static_cast<std::size_t>(e.param.value().numel()), 0.f);
        v.emplace_back(m.back().size(), 0.f);
      }
    std::size_t i = 0;
    for (auto& e : params) {
      if (!e.param.grad().defined()) { ++i; continue; }
      float* p = e.param.value().data<float>();
      const float* g = e.param.grad().data<float>();
      const double c1 = 1 - std::pow(b1, t), c2 = 1 - std::pow(b2, t);
      for (std::size_t j = 0; j < m[i].size(); ++j) {
        m[i][j] = static_cast<float>(b1 * m[i][j] + (1 - b1) * g[j]);
        v[i][j] = static_cast<float>(b2 * v[i][j] + (1 - b2) * g[j] * g[j]);
        p[j] -= static_cast<float>(lr * (m[i][j] / c1) / (std::sqrt(v[i][j] / c2) + eps));
      }
      ++i;
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  int steps = 300;
  std::uint64_t seed = 1337;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps") steps = std::atoi(argv[i + 1]);
    else if (flag == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else { std::fprintf(stderr, "unknown option %s (expected --steps N or --seed S)\n", flag.c_str()); return 2; }
  }
  if (steps <= 0) { std::fprintf(stderr, "--steps must be positive\n"); return 2; }

  dt::rng corpus_rng(seed, "corpus"), init_rng(seed, "init"), batch_rng(seed, "batches");
  const std::string text = generate_corpus(100000, corpus_rng);
  std::map<char, std::int32_t> to_id;
  std::string alphabet;
  for (char c : text)
    if (!to_id.count(c)) to_id[c] = 0;
  for (auto& [c, id] : to_id) { id = static_cast<std::int32_t>(alphabet.size()); alphabet += c; }
  std::vector<std::int32_t> tokens;
  for (char c : text) tokens.push_back(to_id[c]);
  const std::size_t split = tokens.size() * 9 / 10;

  const std::int64_t B = 16, T = 32, V = static_cast<std::int64_t>(alphabet.size());
  model net(V, T, 64, 4, init_rng);
  adam opt{3e-3};
  auto batch = [&](bool validation) {
    std::vector<std::int32_t> x, y;
    const std::size_t lo = validation ? split : 0, hi = validation ? tokens.size() : split;
    for (std::int64_t b = 0; b < B; ++b) {
      const std::size_t start = lo + batch_rng.below(hi - lo - static_cast<std::size_t>(T) - 1);
      x.insert(x.end(), tokens.begin() + static_cast<std::ptrdiff_t>(start), tokens.begin() + static_cast<std::ptrdiff_t>(start) + T);
      y.insert(y.end(), tokens.begin() + static_cast<std::ptrdiff_t>(start) + 1, tokens.begin() + static_cast<std::ptrdiff_t>(start) + T + 1);
    }
    return std::pair{dt::from_vector(x, {B, T}), dt::from_vector(y, {B, T})};
  };
  auto val_loss = [&] {
    dt::no_grad guard;
    double sum = 0;
    for (int i = 0; i < 8; ++i) {
      auto [x, y] = batch(true);
      sum += dt::cross_entropy(net.logits(x), y).item();
    }
    return sum / 8;
  };

  std::printf("decentrain demo: 1-block GPT, %lld parameters, vocab %lld, %zu training characters\n",
              static_cast<long long>(net.params.numel()), static_cast<long long>(V), split);
  std::printf("initial val loss %.4f (uniform guess: %.4f)\n", val_loss(), std::log(static_cast<double>(V)));
  const auto t0 = std::chrono::steady_clock::now();
  for (int step = 1; step <= steps; ++step) {
    auto [x, y] = batch(false);
    auto loss = dt::cross_entropy(net.logits(x), y);
    net.params.zero_grad();
    loss.backward();
    opt.step(net.params);
    if (step % 50 == 0 || step == steps) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("step %4d  train loss %.4f  %.0f tokens/s\n", step, loss.item(), step * B * T / secs);
    }
  }
  const double final_val = val_loss();
  std::printf("val loss %.4f\n", final_val);

  // Greedy continuation of a prompt, to show what was learned.
  std::string sample = "the cats ";
  {
    dt::no_grad guard;
    for (int i = 0; i < 40; ++i) {
      std::vector<std::int32_t> ctx;
      const std::size_t from = sample.size() > static_cast<std::size_t>(T) ? sample.size() - T : 0;
      for (std::size_t j = from; j < sample.size(); ++j) ctx.push_back(to_id.at(sample[j]));
      const auto n = static_cast<std::int64_t>(ctx.size());
      const auto logits = net.logits(dt::from_vector(ctx, {1, n})).value().slice(1, n - 1, n).to_vector<float>();
      std::size_t best = 0;
      for (std::size_t c = 1; c < logits.size(); ++c) if (logits[c] > logits[best]) best = c;
      sample += alphabet[best];
    }
  }
  std::printf("sample: \"%s\"\n", sample.c_str());
  return std::isfinite(final_val) ? 0 : 1;
}
