// nanoGPT's CPU recipe for tinyshakespeare (4 layers, 4 heads, 128 wide, block 64, batch 12,
// lr 1e-3 cosine to 1e-4, beta2 0.99, weight decay 0.1, clip 1.0, no dropout), per peer: the
// model, data and options bench/diloco_vs_ddp and bench/byzantine train with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "decentrain/decentrain.hpp"

namespace bench {

struct shakespeare_recipe {
  decentrain::data::token_dataset data;
  decentrain::nn::gpt_config model;

  // The text's last 10% held out for validation.
  static shakespeare_recipe load(const std::string& path) {
    const std::string text = decentrain::io::read_file(path);
    auto tok = decentrain::data::char_tokenizer::from_text(text);
    shakespeare_recipe r{decentrain::data::token_dataset(tok.encode(text), 0.1), {}};
    r.model.n_layer = 4;
    r.model.n_head = 4;
    r.model.n_embd = 128;
    r.model.block_size = 64;
    r.model.vocab_size = tok.vocab_size();
    r.model.dropout = 0.0;
    return r;
  }

  static decentrain::train::trainer_options options(std::int64_t steps) {
    decentrain::train::trainer_options opts;
    opts.steps = steps;
    opts.batch_size = 12;
    opts.block_size = 64;
    opts.lr = 1e-3;
    opts.min_lr = 1e-4;
    opts.warmup_steps = std::min<std::int64_t>(100, opts.steps / 10);
    opts.beta2 = 0.99;
    opts.weight_decay = 0.1;
    opts.grad_clip = 1.0;
    return opts;
  }

  // One inner step's compute of `cfg` on this machine (thread CPU time): the median of a few
  // steps of one peer alone.
  static double step_seconds(const decentrain::nn::gpt_config& cfg, decentrain::train::trainer_options opts,
                             const decentrain::data::token_dataset& data) {
    namespace dt = decentrain;
    opts.steps = 12;
    opts.warmup_steps = 2;
    opts.compute_on_thread_clock = true;
    using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>>;
    dt::transport::in_process net(1);
    std::vector<double> laps;
    double last = 0;
    dt::train::fit_in_process<Trainer>(net, cfg, opts, data, {}, [&](Trainer& t) {
      t.on_step([&](const dt::train::step_metrics& m) {
        laps.push_back(m.compute_s - last);
        last = m.compute_s;
      });
    });
    laps.erase(laps.begin(), laps.begin() + 2);  // warm-up
    std::sort(laps.begin(), laps.end());
    return laps[laps.size() / 2];
  }
};

}  // namespace bench
