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
//   subspace     8 peers, 4 stages (pools of 2), sync averaging, ideal links, --subspace-steps
//                steps: the activations exact (f32) and through fp16, against a model whose
//                residual stream learns in a k-dimensional subspace (gpt_config::subspace,
//                Protocol Models) sending k coefficients a token through fp16 or int8: activation
//                bytes against fp16's (goal: >= 10x fewer) and validation loss against the exact
//                run's (goal: within 1%)
// Tokens trained are the steps' rows at every stage (parallel::swarm checks each step).
//
//   bench_swarm_training [--steps 300] [--inner-steps 8] [--subspace-steps 2000] [--part all|pools|subspace]
//                        [--json bench/results/swarm_training.json]
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
  double activation_mb = 0;  // activations and their gradients, all peers
  double tokens_per_s() const { return simulated_s > 0 ? tokens / simulated_s : 0; }
};

template <class Trainer>
row train(const std::string& name, const dt::nn::gpt_config& model, const bench::shakespeare_recipe& recipe,
          const dt::train::trainer_options& opts, dt::transport::in_process net, typename Trainer::comm_policy comm,
          typename Trainer::parallel_policy parallel) {
  row r;
  r.name = name;
  const int world = net.world();
  std::vector<std::uint64_t> activation_bytes(static_cast<std::size_t>(world));  // by rank: each peer writes its own
  const auto t0 = std::chrono::steady_clock::now();
  const auto results = dt::train::fit_in_process<Trainer>(
      net, model, opts, recipe.data, comm,
      [&](Trainer& t) {
        t.on_step([&, &t = t](const dt::train::step_metrics&) {
          auto& sent = activation_bytes[static_cast<std::size_t>(t.rank())];
          if constexpr (requires { t.parallel().stats(); }) sent = t.parallel().stats().bytes_sent;
          else sent += t.parallel().last_run().bytes_sent;  // (the pipeline's figure is the step's)
        });
      },
      1, parallel);
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double sent = 0;
  for (const auto& f : results) {
    r.simulated_s = std::max(r.simulated_s, f.last.clock_s);
    sent += static_cast<double>(f.last.bytes_sent);
  }
  r.val_loss = results[0].final_val_loss;
  r.tokens = static_cast<double>(opts.steps * opts.batch_size * (world / stages) * opts.block_size);
  r.mb_sent_per_peer = sent / world / 1e6;
  for (const auto b : activation_bytes) r.activation_mb += static_cast<double>(b) / 1e6;
  std::printf("%-38s %10.4f %14.1f %14.0f %12.1f %14.1f %10.1f\n", r.name.c_str(), r.val_loss, r.simulated_s, r.tokens_per_s(),
              r.mb_sent_per_peer, r.activation_mb, r.wall_s);
  std::fflush(stdout);
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  bench::args a(argc, argv,
                "usage: bench_swarm_training [--steps 300] [--inner-steps 8] [--subspace-steps 2000] [--part all|pools|subspace] "
                "[--json PATH]");
  const auto steps = std::stoll(a.value("steps", "300"));
  const int inner = std::stoi(a.value("inner-steps", "8"));
  const auto subspace_steps = std::stoll(a.value("subspace-steps", "2000"));
  const std::string part = a.value("part", "all");
  if (part != "all" && part != "pools" && part != "subspace") throw std::invalid_argument("--part must be all, pools or subspace, got " + part);
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

  const auto header = [] {
    std::printf("%-38s %10s %14s %14s %12s %14s %10s\n", "run", "val loss", "simulated s", "tokens/s", "MB sent/peer",
                "activation MB", "wall s");
  };
  std::vector<row> rows, narrow;
  double loss_ratio = 0, speedup = 0, diloco_loss = 0;
  const auto ideal = [](int n) { return dt::transport::in_process(dt::transport::links::ideal(n)); };
  if (part != "subspace") {
  std::printf("16 in-process peers, 4 stages, the shakespeare-char model, %lld steps of 4 x 12 rows x 64 tokens\n\n",
              static_cast<long long>(steps));
  header();
  rows.push_back(train<pipe_trainer>("pipeline 4x4, sync, ideal", recipe.model, recipe, opts, ideal(peers), sync{}, pipe));
  rows.push_back(train<swarm_sync>("swarm 4 pools of 4, sync, ideal", recipe.model, recipe, opts, ideal(peers), weighted, pools));
  const auto slow = [] {
    dt::transport::in_process::options o;
    o.speeds = dt::transport::speeds::spread(peers, 1);
    return dt::transport::in_process(dt::transport::link_matrix(peers, dt::transport::simulated_link{0.01, 12.5e6, 0.0, 0.0, 0.0}), o);
  };
  rows.push_back(train<swarm_sync>("swarm, sync, 100 Mbit/s, 1x-4x", recipe.model, recipe, opts, slow(), weighted, pools));
  rows.push_back(train<swarm_diloco>("swarm, diloco H=" + std::to_string(inner) + ", 100 Mbit/s, 1x-4x", recipe.model, recipe, opts,
                                     slow(), local, pools));

  loss_ratio = rows[1].val_loss / rows[0].val_loss;
  speedup = rows[3].tokens_per_s() / rows[2].tokens_per_s();
  diloco_loss = rows[3].val_loss / rows[2].val_loss;
  std::printf("\nswarm / pipeline loss: %.4f (goal within 1%%: %s)\n", loss_ratio, std::abs(loss_ratio - 1) <= 0.01 ? "met" : "missed");
  std::printf("diloco / sync tokens per simulated second: %.2fx (goal >= 1.5x: %s); loss %.4f (goal within 2%%: %s)\n\n", speedup,
              speedup >= 1.5 ? "met" : "missed", diloco_loss, std::abs(diloco_loss - 1) <= 0.02 ? "met" : "missed");
  }

  // The subspace: 8 peers in pools of 2, the activations' codec chosen at run time.
  struct narrow_case {
    const char* name;
    std::int64_t k;  // 0: the model without a subspace
    const char* codec;
  };
  const std::vector<narrow_case> cases = {
      {"exact (f32)", 0, "identity"}, {"fp16", 0, "fp16"}, {"subspace k=12, fp16", 12, "fp16"}, {"subspace k=24, int8", 24, "int8"},
      {"subspace k=32, fp16", 32, "fp16"}};
  if (part != "pools" && subspace_steps > 0) {
    using coded = dt::train::trainer<dt::nn::gpt<dt::cpu>, sync, dt::parallel::swarm<dt::collective::any_codec>>;
    std::printf("8 in-process peers, 4 stages (pools of 2), the shakespeare-char model, %lld steps of 2 x 12 rows x 64 tokens, "
                "sync, ideal links\n\n", static_cast<long long>(subspace_steps));
    header();
    auto o = bench::shakespeare_recipe::options(subspace_steps);
    o.eval_every = 0;
    o.eval_batches = 8;
    for (const auto& c : cases) {
      auto model = recipe.model;
      model.subspace = c.k;
      dt::parallel::swarm<dt::collective::any_codec> coded_pools;
      coded_pools.stages = stages;
      coded_pools.micro_batches = 4;
      coded_pools.codec = dt::collective::parse_codec(c.codec);
      narrow.push_back(train<coded>(c.name, model, recipe, o, ideal(8), weighted, coded_pools));
    }
    const auto& fp16 = narrow[1];
    std::printf("\n");
    for (std::size_t i = 2; i < narrow.size(); ++i) {
      const double fewer = fp16.activation_mb / narrow[i].activation_mb, loss = narrow[i].val_loss / narrow[0].val_loss;
      std::printf("%s: %.1fx fewer activation bytes than fp16 (goal >= 10x: %s), loss %.4f of the exact run's (goal within 1%%: %s)\n",
                  narrow[i].name.c_str(), fewer, fewer >= 10 ? "met" : "missed", loss, std::abs(loss - 1) <= 0.01 ? "met" : "missed");
    }
  }

  bench::output_file out(json);
  const auto write_rows = [&](const std::vector<row>& list) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      const auto& r = list[i];
      out << (i ? ",\n" : "") << "  {\"run\": \"" << r.name << "\", \"val_loss\": " << r.val_loss << ", \"simulated_s\": " << r.simulated_s
          << ", \"tokens\": " << r.tokens << ", \"tokens_per_simulated_s\": " << r.tokens_per_s() << ", \"mb_sent_per_peer\": "
          << r.mb_sent_per_peer << ", \"activation_mb\": " << r.activation_mb << ", \"wall_s\": " << r.wall_s << "}";
    }
  };
  out << "{\"steps\": " << steps << ", \"inner_steps\": " << inner << ", \"rows\": [\n";
  write_rows(rows);
  out << "\n], \"subspace_steps\": " << subspace_steps << ", \"subspace_rows\": [\n";
  write_rows(narrow);
  out << "\n], \"swarm_over_pipeline_loss\": " << loss_ratio << ", \"diloco_over_sync_tokens_per_s\": " << speedup
      << ", \"diloco_over_sync_loss\": " << diloco_loss << "}\n";
  out.close();
  std::printf("\nrows written to %s\n", json.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_swarm_training: %s\n", e.what());
  return 1;
}
