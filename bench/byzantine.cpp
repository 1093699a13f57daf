// bench/byzantine: what a minority of peers that send poison does to training, per aggregator.
// 8 in-process peers train bench/diloco_vs_ddp's model on its data (nanoGPT's CPU recipe,
// tinyshakespeare) under sync_allreduce and diloco (H = --inner-steps), clean and with 1 and 2
// attackers of each kind in bench/attacks.hpp, and every run's final validation loss (peer 0,
// an honest peer) is compared with the clean run under the mean.
//
//   bench_byzantine [--data FILE] [--steps 200] [--peers 8] [--modes sync,diloco] [--inner-steps 10]
//                   [--aggregators "mean;median;trimmed-mean;centered-clip"]
//                   [--attacks non-finite,scaled,sign-flip,noise,alie] [--attackers 1,2]
//                   [--seed 1337] [--json PATH]
//
// Every run sees the same tokens per peer and the same validation batches (paired). Aggregator
// specs are --aggregator's (decentrain-gpt), ';'-separated.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "decentrain/decentrain.hpp"
#include "args.hpp"
#include "attacks.hpp"
#include "output_file.hpp"
#include "shakespeare_recipe.hpp"

namespace dt = decentrain;

namespace {

struct outcome {
  std::string mode, aggregator, attack;
  int attackers = 0;
  double val_loss = 0, wall_s = 0;
  std::int64_t attackers_flagged = 0, honest_flagged = 0;  // rounds, as peer 0 saw them (max over the ranks of each kind)
  std::int64_t rounds = 0;
};

template <class Policy>
outcome run(const std::string& mode, Policy policy, const std::string& aggregator, bench::attack kind, int attackers, int peers,
            const dt::nn::gpt_config& cfg, const dt::train::trainer_options& opts, const dt::data::token_dataset& data) {
  using Attacked = bench::attacked<Policy>;
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Attacked>;
  Attacked a;
  a.inner = policy;
  a.settings.kind = kind;
  a.settings.attackers = attackers;
  a.settings.board = std::make_shared<bench::attack_board>(peers);
  outcome o{mode, aggregator, bench::attack_name(kind), attackers};
  std::fprintf(stderr, "running %s, %s, %s x%d ...\n", mode.c_str(), aggregator.c_str(), o.attack.c_str(), attackers);
  dt::transport::in_process net(dt::transport::links::ideal(peers), {opts.seed, std::chrono::minutes(30)});
  dt::collective::peer_tally seen;
  const auto t0 = std::chrono::steady_clock::now();
  const auto results = dt::train::fit_in_process<Trainer>(net, cfg, opts, data, a, [&](Trainer& t) {
    if (t.rank() == 0) t.on_step([&t, &seen](const dt::train::step_metrics&) { seen = t.policy().aggregation().tally; });
  });
  o.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  o.val_loss = results[0].final_val_loss;
  o.rounds = seen.calls;
  for (std::size_t r = 0; r < seen.non_finite.size(); ++r) {
    auto& into = static_cast<int>(r) >= peers - attackers ? o.attackers_flagged : o.honest_flagged;
    into = std::max(into, seen.suspicious(r));
  }
  std::fprintf(stderr, "  val loss %.4f, attackers flagged in %lld of %lld rounds, honest peers in at most %lld, %.0f s\n",
               o.val_loss, static_cast<long long>(o.attackers_flagged), static_cast<long long>(o.rounds),
               static_cast<long long>(o.honest_flagged), o.wall_s);
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  bench::args cli(argc, argv, "usage: bench_byzantine [--flag value]...");
  auto value = [&](const std::string& key, const std::string& fallback) { return cli.value(key, fallback); };
  const std::string path = value("data", DECENTRAIN_SOURCE_DIR "/../shared/data/tinyshakespeare.txt");
  const int peers = std::stoi(value("peers", "8"));
  const std::string json_path = value("json", "byzantine.json");
  const auto modes = bench::split(value("modes", "sync,diloco"), ',');
  const auto aggregators = bench::split(value("aggregators", "mean;median;trimmed-mean;centered-clip"), ';');
  std::vector<bench::attack> attacks;
  for (const auto& a : bench::split(value("attacks", "non-finite,scaled,sign-flip,noise,alie"), ',')) attacks.push_back(bench::parse_attack(a));
  std::vector<int> counts;
  for (const auto& c : bench::split(value("attackers", "1,2"), ',')) counts.push_back(std::stoi(c));
  const std::int64_t inner_steps = std::stoll(value("inner-steps", "10"));
  for (const auto& a : aggregators) (void)dt::collective::parse_aggregator(a);  // a bad spec fails before any run
  for (const auto& m : modes) dt::detail::check(m == "sync" || m == "diloco", "unknown mode '", m, "' (sync, diloco)");
  for (int c : counts) dt::detail::check(c >= 0 && 2 * c < peers, "--attackers: ", c, " of ", peers, " is not a minority");

  // bench/diloco_vs_ddp's model, data and settings (bench/shakespeare_recipe.hpp).
  auto opts = bench::shakespeare_recipe::options(std::stoll(value("steps", "200")));
  opts.eval_every = opts.steps;
  opts.eval_batches = std::stoll(value("eval-batches", "25"));
  opts.seed = std::stoull(value("seed", std::to_string(opts.seed)));
  cli.finish();
  bench::output_file json(json_path);

  const auto recipe = bench::shakespeare_recipe::load(path);
  const auto& data = recipe.data;
  const auto& cfg = recipe.model;

  using aggregator = dt::collective::any_aggregator;
  std::vector<outcome> outcomes;
  for (const auto& mode : modes)
    for (const auto& spec : aggregators) {
      auto go = [&](bench::attack kind, int count) {
        if (mode == "sync") {
          dt::comm::sync_allreduce<dt::compress::identity, aggregator> p;
          p.aggregator = dt::collective::parse_aggregator(spec);
          outcomes.push_back(run(mode, p, spec, kind, count, peers, cfg, opts, data));
        } else {
          dt::comm::diloco<dt::comm::outer::nesterov, dt::compress::identity, aggregator> p;
          p.inner_steps = inner_steps;
          p.aggregator = dt::collective::parse_aggregator(spec);
          outcomes.push_back(run(mode, p, spec, kind, count, peers, cfg, opts, data));
        }
      };
      go(bench::attack::none, 0);
      for (auto kind : attacks)
        for (int count : counts) go(kind, count);
    }

  // One table per mode: a row per attack, a column per aggregator, the loss and its change
  // against the clean run under the mean.
  std::printf("%d in-process peers, %s, %lld steps x %lld rows x %lld tokens per peer, model %.2fM parameters, "
              "DiLoCo H = %lld (outer Nesterov lr 0.7, momentum 0.9)\n",
              peers, path.c_str(), static_cast<long long>(opts.steps), static_cast<long long>(opts.batch_size),
              static_cast<long long>(opts.block_size), static_cast<double>(cfg.parameter_count()) / 1e6,
              static_cast<long long>(inner_steps));
  json << "[\n";
  bool first_row = true;
  for (const auto& mode : modes) {
    double clean_mean = 0;
    for (const auto& o : outcomes)
      if (o.mode == mode && o.aggregator == "mean" && o.attackers == 0) clean_mean = o.val_loss;
    std::printf("\n%s: final validation loss (change against the clean run with the mean%s)\n", mode.c_str(),
                clean_mean > 0 ? "" : ": not run");
    std::printf("%-16s", "attack");
    for (const auto& a : aggregators) std::printf(" %24s", a.c_str());
    std::printf("\n");
    std::map<std::string, std::map<std::string, const outcome*>> table;  // row -> aggregator -> outcome
    std::vector<std::string> rows;
    for (const auto& o : outcomes) {
      if (o.mode != mode) continue;
      const std::string row = o.attackers == 0 ? "clean" : o.attack + " x" + std::to_string(o.attackers);
      if (!table.count(row)) rows.push_back(row);
      table[row][o.aggregator] = &o;
      const double rel = clean_mean > 0 ? (o.val_loss - clean_mean) / clean_mean : 0.0;
      json << (first_row ? "" : ",\n") << "  {\"mode\": \"" << o.mode << "\", \"aggregator\": \"" << o.aggregator
           << "\", \"attack\": \"" << o.attack << "\", \"attackers\": " << o.attackers << ", \"peers\": " << peers
           << ", \"steps\": " << opts.steps << ", \"val_loss\": " << (std::isfinite(o.val_loss) ? o.val_loss : -1.0)
           << ", \"vs_clean_mean\": " << (std::isfinite(rel) ? rel : -1.0) << ", \"rounds\": " << o.rounds
           << ", \"attackers_flagged_rounds\": " << o.attackers_flagged << ", \"honest_flagged_rounds\": " << o.honest_flagged
           << ", \"wall_s\": " << o.wall_s << "}";
      first_row = false;
    }
    for (const auto& row : rows) {
      std::printf("%-16s", row.c_str());
      for (const auto& a : aggregators) {
        const auto it = table[row].find(a);
        char cell[64] = "n/a";
        if (it != table[row].end()) {
          const double loss = it->second->val_loss;
          if (clean_mean > 0 && std::isfinite(loss))
            std::snprintf(cell, sizeof cell, "%.4f (%+.1f%%)", loss, 100 * (loss - clean_mean) / clean_mean);
          else
            std::snprintf(cell, sizeof cell, "%.4f", loss);
        }
        std::printf(" %24s", cell);
      }
      std::printf("\n");
    }
  }
  json << "\n]\n";
  json.close();
  std::printf("rows written to %s\n", json_path.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_byzantine: %s\n", e.what());
  return 1;
}
