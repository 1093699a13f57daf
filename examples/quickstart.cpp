// Four peers, threads of one process on simulated internet links, train a small GPT with DiLoCo:
// every 25 steps each peer's change is sent as int8 and the four are combined by centered
// clipping, which one peer sending garbage cannot drag far. docs/guide.md shows this file as it
// is (CTest: `quickstart` runs it, `quickstart_in_guide` keeps the guide's copy the same).
#include <decentrain/decentrain.hpp>

#include <cmath>
#include <cstdio>

namespace dt = decentrain;

int main() {
  // Text generated in memory (nothing to download), one token per character; the last 10% is
  // held out for validation.
  const auto text = dt::data::builtin_corpus(std::size_t{1} << 16);
  const auto tokenizer = dt::data::char_tokenizer::from_text(text);
  const dt::data::token_dataset data(tokenizer.encode(text), 0.1);

  // GPT-2's architecture, small enough to train in seconds on one CPU core per peer.
  auto config = dt::nn::gpt_preset("tiny");
  config.vocab_size = tokenizer.vocab_size();
  config.n_layer = 1;
  config.block_size = 32;

  dt::train::trainer_options options;  // AdamW, cosine schedule: the library's defaults
  options.steps = 100;                 // per peer
  options.batch_size = 8;              // rows per peer per step
  options.eval_every = 50;

  // DiLoCo: 25 local AdamW steps, then each peer's pseudo-gradient (where it started the round
  // less where it is) goes out as int8 with a scale per 64 values, centered clipping combines
  // them, and an outer Nesterov step moves the shared parameters.
  using Diloco = dt::comm::diloco<dt::comm::outer::nesterov, dt::compress::int8_blockwise, dt::collective::centered_clip>;
  Diloco diloco;
  diloco.inner_steps = 25;
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Diloco>;

  // Four peers on links of 100 ms and 100 Mbit/s with jitter and loss, timed on simulated clocks.
  const dt::transport::in_process network(dt::transport::links::wan(4));
  // `setup` runs on every peer's trainer before it trains: here it attaches a hook to peer 0.
  const auto results = dt::train::fit_in_process<Trainer>(network, config, options, data, diloco, [](Trainer& t) {
    if (t.rank() != 0) return;  // every peer evaluates the same averaged loss: print one
    t.on_eval([](const dt::train::eval_point& p) {
      std::printf("step %lld: val loss %.4f, %.3f MB sent by peer 0\n", static_cast<long long>(p.step), p.val_loss,
                  static_cast<double>(p.bytes_sent) / 1e6);
    });
  });

  const auto& peer0 = results[0];
  const double uniform = std::log(static_cast<double>(tokenizer.vocab_size()));  // a uniform guess's loss
  const bool learned = peer0.final_val_loss < uniform - 0.5;
  std::printf("4 peers, DiLoCo H = 25, int8, centered clipping: val loss %.4f (uniform guess %.4f): %s\n",
              peer0.final_val_loss, uniform, learned ? "learned" : "did not learn");
  std::printf("%lld steps per peer in %.1f s of simulated time\n", static_cast<long long>(peer0.last.step),
              peer0.last.clock_s);
  return learned ? 0 : 1;
}
