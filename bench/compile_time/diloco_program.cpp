// The program bench/compile_time.sh times: four in-process peers train a small GPT with the CPU
// trainer and DiLoCo. Built against the whole library (decentrain.hpp) or, with
// DECENTRAIN_LIGHT, against only the headers it uses (what a program that wants build speed
// includes: each header brings what it needs, nothing more). Linked with decentrain::compiled
// (which defines DECENTRAIN_COMPILED_LIB), it takes the CPU instantiations from that library; the
// consumer tests build it both ways and compare what it prints.
#if defined(DECENTRAIN_LIGHT)
#include <decentrain/comm/diloco.hpp>
#include <decentrain/data/builtin_corpus.hpp>
#include <decentrain/data/tokenizer.hpp>
#include <decentrain/nn/gpt.hpp>
#include <decentrain/train/in_process.hpp>
#include <decentrain/train/trainer.hpp>
#else
#include <decentrain/decentrain.hpp>
#endif

#include <cstdio>

int main() {
  namespace dt = decentrain;
  const auto text = dt::data::builtin_corpus();
  const auto tokenizer = dt::data::char_tokenizer::from_text(text);
  const dt::data::token_dataset data(tokenizer.encode(text), 0.1);
  auto config = dt::nn::gpt_preset("tiny");
  config.vocab_size = tokenizer.vocab_size();
  dt::train::trainer_options options;
  options.steps = 20;
  options.batch_size = 4;
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>>;
  dt::comm::diloco<> diloco;
  diloco.inner_steps = 10;
  const auto results = dt::train::fit_in_process<Trainer>(dt::transport::in_process(4), config, options, data, diloco);
  for (const auto& r : results) std::printf("val loss %.9g\n", r.final_val_loss);
  return 0;
}
