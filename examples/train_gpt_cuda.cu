// Four in-process peers train a small GPT with DiLoCo on one GPU: the decentralized trainer
// with the device tag changed from dt::cpu to dt::cuda. Compiled by nvcc (-std=c++20), linked
// with decentrain::cuda.
//
//   train_gpt_cuda [--steps N]
#include <decentrain/decentrain.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace dt = decentrain;

int main(int argc, char** argv) {
  std::int64_t steps = 500;
  if (argc == 3 && std::string(argv[1]) == "--steps") steps = std::atoll(argv[2]);
  else if (argc != 1) {
    std::fprintf(stderr, "usage: train_gpt_cuda [--steps N]\n");
    return 2;
  }
  if (dt::cuda_rt::device_count() == 0) {
    std::fprintf(stderr, "train_gpt_cuda: no CUDA device\n");
    return 1;
  }
  try {
    const std::string text = dt::data::builtin_corpus();
    const auto tokenizer = dt::data::char_tokenizer::from_text(text);
    const dt::data::token_dataset dataset(tokenizer.encode(text));
    auto config = dt::nn::gpt_preset("tiny");
    config.vocab_size = tokenizer.vocab_size();

    using Trainer = dt::train::trainer<dt::nn::gpt<dt::cuda>, dt::comm::diloco<>>;
    dt::comm::diloco<> diloco;
    diloco.inner_steps = 20;
    dt::train::trainer_options options;
    options.steps = steps;
    options.batch_size = 16;
    const auto results = dt::train::fit_in_process<Trainer>(dt::transport::in_process(4), config, options, dataset, diloco);
    std::printf("4 peers, DiLoCo H=20, %lld steps on the GPU: val loss %.4f, %.2f MB sent per peer\n",
                static_cast<long long>(steps), results[0].final_val_loss,
                static_cast<double>(results[0].last.policy_bytes_sent) / 1e6);
  } catch (const dt::error& e) {
    std::fprintf(stderr, "train_gpt_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
