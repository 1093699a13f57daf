// bench/streaming: how much of the time peers on slow links spend computing, under synchronous
// all-reduce, DiLoCo, DiLoCo with overlap and Streaming DiLoCo, and what it costs in loss.
// In-process peers train bench/diloco_vs_ddp's model on its data over simulated links whose
// bandwidth is set so that one uncompressed ring all-reduce of the whole model takes --ratio (20)
// times one inner step's compute (measured first on this machine); latency --latency-ms (10).
// Each peer's connection (its access link) carries that bandwidth too, shared by all it sends and
// all it receives; --access-links 0 leaves it out (each pair a link of its own, as before 962169c).
//
//   bench_streaming [--data FILE] [--steps 500] [--peers 4] [--inner-steps 50] [--ratio 20]
//                   [--latency-ms 10] [--rows sync,diloco,diloco-overlap,streaming-2-1,...] [--mix 0.5]
//                   [--outer-lr 0.7] [--outer-momentum 0.9] [--access-links 1]
//                   [--codecs identity;fp4] [--seeds 1337,...] [--curve-every N] [--json PATH]
//
// A row is sync, diloco, diloco-overlap (tau = --overlap-steps, 5), diloco-eager (eager updates),
// streaming-P-TAU or streaming-P-eager (the model has 7 layers to deal into fragments: wte, wpe,
// 4 blocks, ln_f, so P <= 7); each runs once per codec (the outer gradients' codec; sync sends
// its gradients through it) and seed (the table shows the mean over seeds and, with several,
// half the range of the validation losses). --curve-every N also evaluates every N steps and
// writes the curves (peer 0's validation loss against step and simulated time) to the JSON. Compute is
// each peer's thread CPU time (trainer_options::compute_on_thread_clock), so peers sharing the
// machine's cores do not count each other's work; utilisation = compute / simulated clock, for
// the whole run and up to the step before the last (every policy ends with a blocking exchange
// of the whole model, which a long run amortises and a short benchmark run does not).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
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
  std::string row, codec;
  std::uint64_t seed = 0;
  std::vector<dt::train::eval_point> curve;  // peer 0's evaluations
  double val_loss = 0, utilisation = 0, clock_s = 0, compute_s = 0, wait_s = 0, wall_s = 0;
  double steady = 0;  // utilisation up to the step before the last (without the final synchronisation)
  double total_mb = 0, peak_mb = 0;  // peer 0: every byte sent; the largest single exchange
  double peak_rate = 0;               // peer 0: MB/s sent over its busiest second (simulated clock)
};

template <class Comm, class Peak>
outcome run(const std::string& row, const std::string& codec, Comm comm, Peak peak_of, const dt::transport::link_matrix& links,
            const dt::nn::gpt_config& cfg, const dt::train::trainer_options& opts, const dt::data::token_dataset& data) {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Comm>;
  std::fprintf(stderr, "running %s, %s, seed %llu ...\n", row.c_str(), codec.c_str(), static_cast<unsigned long long>(opts.seed));
  dt::transport::in_process net(links, {opts.seed, std::chrono::minutes(30)});
  const auto t0 = std::chrono::steady_clock::now();
  double peak = 0, steady = 0;
  const auto results = dt::train::fit_in_process<Trainer>(net, cfg, opts, data, comm, [&](Trainer& t) {
    if (t.rank() != 0) return;
    t.on_eval([&peak, &t, &peak_of](const dt::train::eval_point& e) { peak = peak_of(t.policy(), e); });
    t.on_step([&steady, &opts](const dt::train::step_metrics& m) {
      if (m.step == opts.steps - 1) steady = m.utilisation();
    });
  });
  outcome o{row, codec, opts.seed, results[0].evals};
  o.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& m = results[0].last;
  o.val_loss = results[0].final_val_loss;
  o.utilisation = m.utilisation();
  o.steady = steady;
  o.clock_s = m.clock_s;
  o.compute_s = m.compute_s;
  o.wait_s = m.network_wait_s;
  o.total_mb = static_cast<double>(m.bytes_sent) / 1e6;
  o.peak_mb = peak / 1e6;
  o.peak_rate = m.peak_send_rate / 1e6;
  std::fprintf(stderr, "  val loss %.4f, utilisation %.1f%% (%.1f%% before the last step), %.1f MB sent (peak exchange %.2f MB), %.1f s simulated, %.0f s\n",
               o.val_loss, 100 * o.utilisation, 100 * o.steady, o.total_mb, o.peak_mb, o.clock_s, o.wall_s);
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  bench::args cli(argc, argv, "usage: bench_streaming [--flag value]...");
  auto value = [&](const std::string& key, const std::string& fallback) { return cli.value(key, fallback); };
  const std::string path = value("data", DECENTRAIN_SOURCE_DIR "/../shared/data/tinyshakespeare.txt");
  const int peers = std::stoi(value("peers", "4"));
  const std::string json_path = value("json", "streaming.json");
  const auto rows = bench::split(value("rows", "sync,diloco,diloco-overlap,streaming-2-1,streaming-4-1,streaming-7-1,"
                                        "streaming-2-5,streaming-4-5,streaming-7-5"),
                          ',');
  const auto codecs = bench::split(value("codecs", "identity;fp4"), ';');
  const std::int64_t H = std::stoll(value("inner-steps", "50"));
  const std::int64_t overlap_steps = std::stoll(value("overlap-steps", "5"));
  const double ratio = std::stod(value("ratio", "20"));
  const double latency = std::stod(value("latency-ms", "10")) / 1e3;
  const double mix = std::stod(value("mix", "0.5"));
  // 0: each pair of peers a link of its own and no access links (the model before 962169c)
  const std::string access_links = value("access-links", "1");
  dt::detail::check(access_links == "0" || access_links == "1", "--access-links takes 0 or 1, got '", access_links, "'");
  const bool access = access_links == "1";
  dt::comm::outer::nesterov outer;  // DiLoCo's outer step, for every row but sync
  outer.lr = std::stod(value("outer-lr", std::to_string(outer.lr)));
  outer.momentum = std::stod(value("outer-momentum", std::to_string(outer.momentum)));
  for (const auto& c : codecs) (void)dt::collective::parse_codec(c);
  auto opts = bench::shakespeare_recipe::options(std::stoll(value("steps", "500")));
  opts.eval_every = std::stoll(value("curve-every", std::to_string(opts.steps)));
  dt::detail::check(opts.eval_every >= 1, "--curve-every must be >= 1");
  opts.eval_batches = std::stoll(value("eval-batches", "25"));
  std::vector<std::uint64_t> seeds;
  for (const auto& s : bench::split(value("seeds", std::to_string(opts.seed)), ',')) seeds.push_back(std::stoull(s));
  opts.compute_on_thread_clock = true;
  opts.stop_check_every = opts.steps;  // nothing asks to stop: no check between the start and the end
  cli.finish();
  bench::output_file json(json_path);

  const auto recipe = bench::shakespeare_recipe::load(path);
  const auto& cfg = recipe.model;
  const auto& data = recipe.data;
  const double step_s = bench::shakespeare_recipe::step_seconds(cfg, opts, data);
  const double model_bytes = 4.0 * static_cast<double>(cfg.parameter_count());
  const double ring_bytes = 2.0 * (peers - 1) / peers * model_bytes;  // per peer, one all-reduce
  const double bandwidth = ring_bytes / (ratio * step_s);
  // Each peer's own connection at the same rate, shared by all it sends and all it receives.
  const dt::transport::link_matrix links(peers, dt::transport::simulated_link{latency, bandwidth, 0.0, 0.0, 0.2},
                                         access ? dt::transport::access_link{bandwidth, bandwidth} : dt::transport::access_link{});

  using codec = dt::collective::any_codec;
  using Sync = dt::comm::sync_allreduce<codec>;
  using Diloco = dt::comm::diloco<dt::comm::outer::nesterov, codec>;
  using Streaming = dt::comm::streaming_diloco<dt::comm::outer::nesterov, codec>;
  // The largest exchange: a policy that exchanges the whole buffer each time sent its bytes in
  // equal parts (the start's 16-byte checks are noise at this size).
  auto per_round = [](std::int64_t rounds) {
    return [rounds](const auto&, const dt::train::eval_point& e) {
      return static_cast<double>(e.policy_bytes_sent) / static_cast<double>(rounds);
    };
  };
  std::vector<outcome> outcomes;
  for (const auto& spec : codecs)
    for (const auto& row : rows)
      for (const auto seed : seeds) {
      opts.seed = seed;
      const auto chosen = dt::collective::parse_codec(spec);
      if (row == "sync") {
        Sync p;
        p.codec = chosen;
        outcomes.push_back(run(row, spec, p, per_round(opts.steps), links, cfg, opts, data));
      } else if (row == "diloco") {
        Diloco p;
        p.codec = chosen;
        p.inner_steps = H;
        p.outer_optimizer = outer;
        outcomes.push_back(run(row, spec, p, per_round((opts.steps + H - 1) / H), links, cfg, opts, data));
      } else {
        Streaming p;
        p.codec = chosen;
        p.inner_steps = H;
        p.outer_optimizer = outer;
        p.mix = mix;
        if (row == "diloco-overlap" || row == "diloco-eager") {
          p.fragments = 1;
          p.overlap = overlap_steps;
          p.eager = row == "diloco-eager";
        } else {
          const auto parts = bench::split(row, '-');
          dt::detail::check(parts.size() == 3 && parts[0] == "streaming", "unknown row '", row,
                            "' (sync, diloco, diloco-overlap, diloco-eager, streaming-P-TAU, streaming-P-eager)");
          p.fragments = std::stoll(parts[1]);
          p.eager = parts[2] == "eager";
          if (!p.eager) p.overlap = std::stoll(parts[2]);
        }
        outcomes.push_back(run(row, spec, p,
                               [](const Streaming& s, const dt::train::eval_point&) { return static_cast<double>(s.peak_exchange_bytes()); },
                               links, cfg, opts, data));
      }
    }

  // Rows over seeds: the mean of each figure, and half the range of the validation losses.
  struct summary {
    outcome mean;
    double lo = 0, hi = 0;  // the validation losses' range
  };
  std::vector<summary> table;
  for (const auto& o : outcomes) {
    auto it = std::find_if(table.begin(), table.end(), [&](const summary& s) { return s.mean.row == o.row && s.mean.codec == o.codec; });
    if (it == table.end()) it = table.insert(table.end(), summary{outcome{o.row, o.codec, 0, {}}, o.val_loss, o.val_loss});
    it->lo = std::min(it->lo, o.val_loss);
    it->hi = std::max(it->hi, o.val_loss);
    auto& m = it->mean;
    const double k = 1.0 / static_cast<double>(seeds.size());
    m.val_loss += k * o.val_loss;
    m.utilisation += k * o.utilisation;
    m.steady += k * o.steady;
    m.clock_s += k * o.clock_s;
    m.wall_s += k * o.wall_s;
    m.total_mb += k * o.total_mb;
    m.peak_mb = std::max(m.peak_mb, o.peak_mb);
    m.peak_rate = std::max(m.peak_rate, o.peak_rate);
  }
  double reference = 0;  // DiLoCo H, uncompressed
  for (const auto& s : table)
    if (s.mean.row == "diloco" && s.mean.codec == "identity") reference = s.mean.val_loss;
  std::printf("%d in-process peers, %s, %lld steps x %lld rows x %lld tokens per peer, model %.2fM parameters, H = %lld, "
              "mix %.2g, %zu seed(s)\none inner step computes in %.1f ms (median, thread CPU time); links %.1f ms, %.2f MB/s "
              "(one f32 ring all-reduce of the model: %.2f s = %.0fx a step), %s\n\n",
              peers, path.c_str(), static_cast<long long>(opts.steps), static_cast<long long>(opts.batch_size),
              static_cast<long long>(opts.block_size), static_cast<double>(cfg.parameter_count()) / 1e6,
              static_cast<long long>(H), mix, seeds.size(), 1e3 * step_s, 1e3 * latency, bandwidth / 1e6, ring_bytes / bandwidth, ratio,
              access ? "each peer's connection shared by its transfers" : "no access links (each pair a link of its own)");
  std::printf("%-18s %-10s %10s %8s %10s %8s %8s %10s %10s %10s %12s %8s\n", "row", "codec", "val loss", "+-", "vs diloco",
              "util %", "steady %", "peak MB", "peak MB/s", "total MB", "simulated s", "wall s");
  for (const auto& s : table) {
    const auto& o = s.mean;
    const double rel = reference > 0 ? (o.val_loss - reference) / reference : 0.0;
    std::printf("%-18s %-10s %10.4f %8.4f %+9.2f%% %8.1f %8.1f %10.2f %10.2f %10.1f %12.1f %8.0f\n", o.row.c_str(),
                o.codec.c_str(), o.val_loss, (s.hi - s.lo) / 2, 100 * rel, 100 * o.utilisation, 100 * o.steady, o.peak_mb, o.peak_rate,
                o.total_mb, o.clock_s, o.wall_s);
  }
  json << "[\n";
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    const auto& o = outcomes[i];
    double row_mean = 0;  // the row's mean over seeds, against DiLoCo's
    for (const auto& s : table)
      if (s.mean.row == o.row && s.mean.codec == o.codec) row_mean = s.mean.val_loss;
    const double rel = reference > 0 ? (row_mean - reference) / reference : 0.0;
    json << "  {\"row\": \"" << o.row << "\", \"codec\": \"" << o.codec << "\", \"seed\": " << o.seed << ", \"peers\": " << peers << ", \"steps\": " << opts.steps
         << ", \"inner_steps\": " << H << ", \"val_loss\": " << o.val_loss << ", \"row_vs_diloco\": " << rel
         << ", \"utilisation\": " << o.utilisation << ", \"utilisation_before_last_step\": " << o.steady << ", \"compute_s\": " << o.compute_s << ", \"wait_s\": " << o.wait_s
         << ", \"peak_mb\": " << o.peak_mb << ", \"peak_mb_per_s\": " << o.peak_rate << ", \"total_mb\": " << o.total_mb << ", \"simulated_s\": " << o.clock_s
         << ", \"wall_s\": " << o.wall_s << ", \"step_ms\": " << 1e3 * step_s << ", \"link_mb_per_s\": " << bandwidth / 1e6
         << ", \"latency_ms\": " << 1e3 * latency << ", \"curve\": [";
    for (std::size_t k = 0; k < o.curve.size(); ++k)
      json << (k ? ", " : "") << "[" << o.curve[k].step << ", " << o.curve[k].clock_s << ", " << o.curve[k].val_loss << "]";
    json << "]}" << (i + 1 < outcomes.size() ? ",\n" : "\n");
  }
  json << "]\n";
  json.close();
  std::printf("rows written to %s\n", json_path.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_streaming: %s\n", e.what());
  return 1;
}
