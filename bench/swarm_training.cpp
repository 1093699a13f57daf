// bench/swarm_training: parallel::swarm training the shakespeare-char model (bench/
// shakespeare_recipe.hpp: 4 layers, so 4 stages of one block) on in-process peers, side by side
// with the pipeline of the same shape, in one run:
//   loss         16 peers, 4 stages (SWARM: pools of 4; the pipeline: 4 copies of 4 stages), sync
//                averaging, the same rows every step, ideal links: SWARM's validation loss over
//                the pipeline's (goal: within 1%)
//   diloco       the same 16 peers with compute speeds spread 1x-4x (transport::speeds::spread)
//                on 100 Mbit/s links (10 ms): SWARM with DiLoCo inside each stage's pool (H
//                inner steps) against SWARM with sync averaging: tokens per simulated second
//                (goal: >= 1.5x) and validation loss (goal: within 2%)
// Tokens trained are the steps' rows at every stage (parallel::swarm checks each step).
//
//   bench_swarm_training [--steps 300] [--inner-steps 8] [--json bench/results/swarm_training.json]
#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "args.hpp"
#include "output_file.hpp"
#include "shakespeare_recipe.hpp"

namespace dt = decentrain;

namespace {

constexpr int peers = 16, stages = 4;

struct row {
  std::string name;
  double val_loss = 0;
  double simulated_s = 0;  // the slowest peer's clock at the end
  double tokens = 0;       // the steps' rows x block (each stage's)
  double wall_s = 0;
  double mb_sent_per_peer = 0;
  double tokens_per_s() const { return simulated_s > 0 ? tokens / simulated_s : 0; }
};

template <class Trainer>
row train(const std::string& name, const bench::shakespeare_recipe& recipe, const dt::train::trainer_options& opts,
          dt::transport::in_process net, typename Trainer::comm_policy comm, typename Trainer::parallel_policy parallel) {
  row r;
  r.name = name;
  const auto t0 = std::chrono::steady_clock::now();
  const auto results = dt::train::fit_in_process<Trainer>(net, recipe.model, opts, recipe.data, comm, {}, 1, parallel);
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double sent = 0;
  for (const auto& f : results) {
    r.simulated_s = std::max(r.simulated_s, f.last.clock_s);
    sent += static_cast<double>(f.last.bytes_sent);
  }
  r.val_loss = results[0].final_val_loss;
  r.tokens = static_cast<double>(opts.steps * opts.batch_size * (peers / stages) * opts.block_size);
  r.mb_sent_per_peer = sent / peers / 1e6;
  std::printf("%-34s %10.4f %14.1f %14.0f %12.1f %10.1f\n", r.name.c_str(), r.val_loss, r.simulated_s, r.tokens_per_s(),
              r.mb_sent_per_peer, r.wall_s);
  std::fflush(stdout);
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  bench::args a(argc, argv, "usage: bench_swarm_training [--steps 300] [--inner-steps 8] [--json PATH]");
  const auto steps = std::stoll(a.value("steps", "300"));
  const int inner = std::stoi(a.value("inner-steps", "8"));
  const std::string json = a.value("json", "bench/results/swarm_training.json");
  const std::string path = a.value("data", DECENTRAIN_SOURCE_DIR "/../shared/data/tinyshakespeare.txt");
  a.finish();
  const auto recipe = bench::shakespeare_recipe::load(path);
  auto opts = bench::shakespeare_recipe::options(steps);
  opts.eval_every = 0;
  opts.eval_batches = 8;

  using sync = dt::comm::sync_allreduce<>;
  using diloco = dt::comm::diloco<>;
  using pipe_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, sync, dt::parallel::pipeline<>>;
  using swarm_sync = dt::train::trainer<dt::nn::gpt<dt::cpu>, sync, dt::parallel::swarm<>>;
  using swarm_diloco = dt::train::trainer<dt::nn::gpt<dt::cpu>, diloco, dt::parallel::swarm<>>;
  dt::parallel::pipeline<> pipe;
  pipe.stages = stages;
  pipe.micro_batches = 4;
  dt::parallel::swarm<> pools;
  pools.stages = stages;
  pools.micro_batches = 4;
  sync weighted;
  weighted.weighted = true;
  diloco local;
  local.weighted = true;
  local.inner_steps = inner;

  std::printf("16 in-process peers, 4 stages, the shakespeare-char model, %lld steps of 4 x 12 rows x 64 tokens\n\n",
              static_cast<long long>(steps));
  std::printf("%-34s %10s %14s %14s %12s %10s\n", "run", "val loss", "simulated s", "tokens/s", "MB sent/peer", "wall s");
  std::vector<row> rows;
  const auto ideal = [] { return dt::transport::in_process(dt::transport::links::ideal(peers)); };
  rows.push_back(train<pipe_trainer>("pipeline 4x4, sync, ideal", recipe, opts, ideal(), sync{}, pipe));
  rows.push_back(train<swarm_sync>("swarm 4 pools of 4, sync, ideal", recipe, opts, ideal(), weighted, pools));
  const auto slow = [] {
    dt::transport::in_process::options o;
    o.speeds = dt::transport::speeds::spread(peers, 1);
    return dt::transport::in_process(dt::transport::link_matrix(peers, dt::transport::simulated_link{0.01, 12.5e6, 0.0, 0.0, 0.0}), o);
  };
  rows.push_back(train<swarm_sync>("swarm, sync, 100 Mbit/s, 1x-4x", recipe, opts, slow(), weighted, pools));
  rows.push_back(train<swarm_diloco>("swarm, diloco H=" + std::to_string(inner) + ", 100 Mbit/s, 1x-4x", recipe, opts, slow(), local, pools));

  const double loss_ratio = rows[1].val_loss / rows[0].val_loss;
  const double speedup = rows[3].tokens_per_s() / rows[2].tokens_per_s();
  const double diloco_loss = rows[3].val_loss / rows[2].val_loss;
  std::printf("\nswarm / pipeline loss: %.4f (goal within 1%%: %s)\n", loss_ratio, std::abs(loss_ratio - 1) <= 0.01 ? "met" : "missed");
  std::printf("diloco / sync tokens per simulated second: %.2fx (goal >= 1.5x: %s); loss %.4f (goal within 2%%: %s)\n", speedup,
              speedup >= 1.5 ? "met" : "missed", diloco_loss, std::abs(diloco_loss - 1) <= 0.02 ? "met" : "missed");

  bench::output_file out(json);
  out << "{\"steps\": " << steps << ", \"inner_steps\": " << inner << ", \"rows\": [\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    out << (i ? ",\n" : "") << "  {\"run\": \"" << r.name << "\", \"val_loss\": " << r.val_loss << ", \"simulated_s\": " << r.simulated_s
        << ", \"tokens\": " << r.tokens << ", \"tokens_per_simulated_s\": " << r.tokens_per_s() << ", \"mb_sent_per_peer\": "
        << r.mb_sent_per_peer << ", \"wall_s\": " << r.wall_s << "}";
  }
  out << "\n], \"swarm_over_pipeline_loss\": " << loss_ratio << ", \"diloco_over_sync_tokens_per_s\": " << speedup
      << ", \"diloco_over_sync_loss\": " << diloco_loss << "}\n";
  out.close();
  std::printf("\nrows written to %s\n", json.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_swarm_training: %s\n", e.what());
  return 1;
}
