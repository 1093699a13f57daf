// bench/diloco_vs_ddp: what each communication policy buys, on the same data, model and number
// of tokens per peer. 4 in-process peers train nanoGPT's CPU-recipe model on tinyshakespeare
// under sync_allreduce (DDP), local_sgd<50> and diloco<H> for H in {10, 50, 100} (and, asked for
// with --only, gossip-H: comm::gossip on the one-peer exponential graph), and the final
// validation loss is compared with the bytes each peer put on the wire. --codecs runs each policy
// once per codec (a ';'-separated list of --codec specs, e.g. "identity;int4;topk:0.02,int2,ef"),
// the payload (gradients, parameters or pseudo-gradients) sent through it.
//
//   bench_diloco_vs_ddp [--data FILE] [--steps 2000] [--peers 4] [--only sync,local-sgd-50,diloco-10,...
//                       or sync;diloco-50/CODEC;...]
//                       [--codecs identity;...] [--outer-lr 0.7] [--outer-momentum 0.9] [--aggregator mean]
//                       [--seed 1337]
//                       [--json PATH] [--curves PATH]
//
// Links are ideal (bytes are what is compared; time on a slow link follows from them). Every run
// evaluates on the same validation batches, so the losses are paired. --curves writes one row per
// evaluation (run, step, val loss, bytes sent) for bench/plot_diloco_vs_ddp.py.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "decentrain/decentrain.hpp"
#include "args.hpp"
#include "output_file.hpp"
#include "shakespeare_recipe.hpp"

namespace dt = decentrain;

namespace {

struct outcome {
  std::string name;
  double val_loss = 0, spread = 0;  // peer 0's final loss; max difference between peers
  std::uint64_t bytes_sent = 0;     // per peer (peer 0)
  double wall_s = 0;
  std::vector<dt::train::eval_point> curve;
};

template <class Comm>
outcome run(const std::string& name, Comm comm, int peers, const dt::nn::gpt_config& cfg, const dt::train::trainer_options& opts,
            const dt::data::token_dataset& data) {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Comm>;
  std::fprintf(stderr, "running %s ...\n", name.c_str());
  dt::transport::in_process net(dt::transport::links::ideal(peers), {opts.seed, std::chrono::minutes(30)});
  const auto t0 = std::chrono::steady_clock::now();
  const auto results = dt::train::fit_in_process<Trainer>(net, cfg, opts, data, comm);
  outcome o;
  o.name = name;
  o.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  o.val_loss = results[0].final_val_loss;
  for (const auto& r : results) o.spread = std::max(o.spread, std::abs(r.final_val_loss - o.val_loss));
  o.bytes_sent = results[0].last.bytes_sent;
  o.curve = results[0].evals;
  std::fprintf(stderr, "  %s: val loss %.4f, %.1f MB sent per peer, %.0f s\n", name.c_str(), o.val_loss,
               static_cast<double>(o.bytes_sent) / 1e6, o.wall_s);
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  bench::args cli(argc, argv, "usage: bench_diloco_vs_ddp [--flag value]...");
  auto value = [&](const std::string& key, const std::string& fallback) { return cli.value(key, fallback); };
  const std::string path = value("data", DECENTRAIN_SOURCE_DIR "/../shared/data/tinyshakespeare.txt");
  const int peers = std::stoi(value("peers", "4"));
  const std::string json_path = value("json", "diloco_vs_ddp.json"), curves_path = value("curves", "diloco_vs_ddp_curves.csv");
  // Runs, ',' or ';' between them; "NAME/CODEC" runs NAME with that codec alone (codec specs hold
  // commas, so such a list takes ';': "sync;diloco-50/topk:0.03,chunk=4096,int2,ef=0.95").
  std::vector<std::string> only;
  {
    const std::string list = value("only", "sync,local-sgd-50,diloco-10,diloco-50,diloco-100");
    std::stringstream in(list);
    for (std::string item; std::getline(in, item, list.find(';') == std::string::npos ? ',' : ';');) only.push_back(item);
  }
  std::vector<std::string> codecs;
  {
    std::stringstream in(value("codecs", "identity"));
    for (std::string item; std::getline(in, item, ';');) codecs.push_back(item);
    for (const auto& c : codecs) (void)dt::collective::parse_codec(c);  // a bad spec fails before any run
    for (const auto& item : only)
      if (const auto slash = item.find('/'); slash != std::string::npos) (void)dt::collective::parse_codec(item.substr(slash + 1));
  }

  auto opts = bench::shakespeare_recipe::options(std::stoll(value("steps", "2000")));
  opts.eval_every = std::stoll(value("eval-every", "100"));
  opts.eval_batches = std::stoll(value("eval-batches", "25"));
  opts.seed = std::stoull(value("seed", std::to_string(opts.seed)));  // model init and data order
  const double outer_lr = std::stod(value("outer-lr", "0.7")), outer_momentum = std::stod(value("outer-momentum", "0.9"));
  const std::string aggregator = value("aggregator", "mean");  // how DiLoCo's rows combine the pseudo-gradients
  (void)dt::collective::parse_aggregator(aggregator);
  cli.finish();
  // Opened first: a bad path fails before the hours of training.
  bench::output_file json(json_path), curves(curves_path);

  const auto recipe = bench::shakespeare_recipe::load(path);
  const auto& data = recipe.data;
  const auto& cfg = recipe.model;

  std::vector<outcome> outcomes;
  using codec = dt::collective::any_codec;
  for (const auto& item : only)
    for (const auto& listed : codecs) {
      const auto slash = item.find('/');
      const std::string name = item.substr(0, slash), spec = slash == std::string::npos ? listed : item.substr(slash + 1);
      if (slash != std::string::npos && &listed != &codecs.front()) continue;  // its own codec, once
      std::string label = spec == "identity" ? name : name + " " + spec;
      if (aggregator != "mean" && name.rfind("diloco-", 0) == 0) label += " " + aggregator;
      if (name == "sync") {
        dt::comm::sync_allreduce<codec> p;
        p.codec = dt::collective::parse_codec(spec);
        outcomes.push_back(run(label, p, peers, cfg, opts, data));
      } else if (name.rfind("local-sgd-", 0) == 0) {
        dt::comm::local_sgd<codec> p;
        p.inner_steps = std::stoll(name.substr(10));
        p.codec = dt::collective::parse_codec(spec);
        outcomes.push_back(run(label, p, peers, cfg, opts, data));
      } else if (name.rfind("diloco-", 0) == 0) {
        dt::comm::diloco<dt::comm::outer::nesterov, codec, dt::collective::any_aggregator> p;
        p.inner_steps = std::stoll(name.substr(7));
        p.aggregator = dt::collective::parse_aggregator(aggregator);
        p.outer_optimizer.lr = outer_lr;
        p.outer_optimizer.momentum = outer_momentum;
        p.codec = dt::collective::parse_codec(spec);
        outcomes.push_back(run(label, p, peers, cfg, opts, data));
      } else if (name.rfind("gossip-", 0) == 0) {  // the one-peer exponential graph, a round every H steps
        dt::detail::check(spec == "identity", "gossip rows take no codec, got '", spec, "'");
        dt::comm::gossip<dt::comm::topology::one_peer_exponential> p;
        p.inner_steps = std::stoll(name.substr(7));
        outcomes.push_back(run(label, p, peers, cfg, opts, data));
      } else {
        dt::detail::fail("unknown run '", name, "' (sync, local-sgd-H, diloco-H, gossip-H)");
      }
    }

  const outcome* sync = nullptr;
  for (const auto& o : outcomes)
    if (o.name == "sync") sync = &o;
  std::printf("%d peers, %s, %lld steps x %lld rows x %lld tokens per peer, model %.2fM parameters, "
              "DiLoCo outer Nesterov lr %g momentum %g\n", peers, path.c_str(), static_cast<long long>(opts.steps),
              static_cast<long long>(opts.batch_size), static_cast<long long>(opts.block_size),
              static_cast<double>(cfg.parameter_count()) / 1e6, outer_lr, outer_momentum);
  std::printf("%-30s %10s %12s %14s %12s %12s %9s\n", "run", "val loss", "vs sync", "MB sent/peer", "fewer bytes", "peer spread",
              "wall s");
  json << "[\n";
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    const auto& o = outcomes[i];
    const double rel = sync ? (o.val_loss - sync->val_loss) / sync->val_loss : 0.0;
    const double fewer = sync && o.bytes_sent > 0 ? static_cast<double>(sync->bytes_sent) / static_cast<double>(o.bytes_sent) : 0.0;
    char vs_sync[16] = "n/a", times_fewer[16] = "n/a";  // without a sync run there is nothing to compare with
    if (sync) {
      std::snprintf(vs_sync, sizeof vs_sync, "%+.2f%%", 100 * rel);
      std::snprintf(times_fewer, sizeof times_fewer, "%.1fx", fewer);
    }
    std::printf("%-30s %10.4f %12s %14.2f %12s %12.2g %9.0f\n", o.name.c_str(), o.val_loss, vs_sync,
                static_cast<double>(o.bytes_sent) / 1e6, times_fewer, o.spread, o.wall_s);
    json << (i ? ",\n" : "") << "  {\"run\": \"" << o.name << "\", \"peers\": " << peers << ", \"steps\": " << opts.steps
         << ", \"val_loss\": " << o.val_loss << ", \"vs_sync\": " << rel << ", \"bytes_sent_per_peer\": " << o.bytes_sent
         << ", \"fewer_bytes_than_sync\": " << fewer << ", \"peer_spread\": " << o.spread << ", \"wall_s\": " << o.wall_s << "}";
  }
  json << "\n]\n";
  json.close();
  curves << "run,step,val_loss,bytes_sent\n";
  for (const auto& o : outcomes)
    for (const auto& p : o.curve) curves << '"' << o.name << '"' << ',' << p.step << ',' << p.val_loss << ',' << p.bytes_sent << '\n';
  curves.close();
  std::printf("rows written to %s, curves to %s\n", json_path.c_str(), curves_path.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_diloco_vs_ddp: %s\n", e.what());
  return 1;
}
