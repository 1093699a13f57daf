// bench/auto_grid: --auto against a grid search of its settings, by simulated time to synchronous
// training's loss. 4 in-process peers train a small GPT (the `tiny` preset) on the built-in
// corpus over simulated links of each profile (--profiles: 10 Mbit/s 100 ms, 100 Mbit/s 50 ms,
// 1 Gbit/s 10 ms), each step's compute measured on its thread's clock (times --compute-scale:
// a machine that many times slower) with exchanges in the background beside it. Per profile:
//   sync                 an all-reduce every step for --sync-steps steps: its final validation
//                        loss is the target
//   H/codec/P            every point of the grid: H in {10, 50, 200} x codec in {f32, int8, int4,
//                        top-1% with error feedback} x fragments P in {1: DiLoCo, 4: Streaming
//                        DiLoCo with an overlap of 1}
//   auto-streaming       Streaming DiLoCo tuned (comm/auto_tuning.hpp, --comm streaming-diloco --auto)
//   auto-streaming@X     the same with tune.max_overlap X instead of its default (--max-overlap X,...)
//   auto-diloco          DiLoCo tuned (--comm diloco --auto)
// Each run but sync stops at the evaluation (every --eval-every steps) that first reaches the
// target, or after --max-steps. Columns: the simulated time to the target ("-": not reached),
// the loss at the end, the steps run, MB sent per peer, and for the tuned runs the share of
// that time spent measuring (the start's probe and first agreement: the clock after step 0
// beyond a plain DiLoCo run's, and where the probe ran beside the first steps, the wait at the
// step its figures were taken after) and the last pick. The comparison line per profile: the faster of
// auto-streaming and auto-diloco (defaults) over the grid's best (goal <= 1.1x) and its measuring
// share (goal <= 5%).
//
//   bench_auto_grid [--profiles slow,medium,fast] [--sync-steps 300] [--max-steps 600]
//                   [--eval-every 25] [--batch-size 16] [--compute-scale 1] [--only-h 10,50,200]
//                   [--max-overlap X,...] [--json auto_grid.json]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <omp.h>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "decentrain/decentrain.hpp"
#include "args.hpp"
#include "output_file.hpp"

namespace dt = decentrain;

namespace {

using codec = dt::collective::any_codec;
using diloco_policy = dt::comm::diloco<dt::comm::outer::nesterov, codec>;
using streaming_policy = dt::comm::streaming_diloco<dt::comm::outer::nesterov, codec>;

struct profile {
  std::string name;
  double latency_s = 0, bytes_per_s = 0;
};
const std::vector<profile> profiles = {
    {"slow", 0.100, 10e6 / 8},    // 10 Mbit/s, 100 ms
    {"medium", 0.050, 100e6 / 8}, // 100 Mbit/s, 50 ms
    {"fast", 0.010, 1e9 / 8},     // 1 Gbit/s, 10 ms
};

struct setup {
  dt::nn::gpt_config model;
  dt::data::token_dataset data{std::vector<std::int32_t>(64, 0)};  // (the corpus's, set in main)
  dt::train::trainer_options opts;
  double compute_scale = 1;
};

struct row {
  std::string profile, name;
  double to_target_s = std::numeric_limits<double>::infinity();  // simulated
  double final_loss = 0, clock_s = 0, mb_per_peer = 0, first_step_clock_s = 0, wall_s = 0;
  double pick_wait_s = 0;  // a tuned run whose probe ran beside its first steps: the wait at its first pick
  std::int64_t steps = 0;
  std::string pick;  // a tuned run's last
};

template <class Comm>
row run(const profile& link, const std::string& name, const Comm& comm, const setup& s, std::int64_t steps, double target) {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Comm>;
  std::fprintf(stderr, "%s %s ...", link.name.c_str(), name.c_str());
  dt::transport::in_process::options o;
  o.recv_timeout = std::chrono::minutes(30);
  o.speeds.assign(4, 1.0 / s.compute_scale);
  dt::transport::in_process net(dt::transport::link_matrix(4, dt::transport::simulated_link{link.latency_s, link.bytes_per_s}), o);
  auto opts = s.opts;
  opts.steps = steps;  // (the cosine schedule over these: a grid run's over --max-steps)
  opts.warmup_steps = std::min<std::int64_t>(s.opts.warmup_steps, steps / 10);
  opts.stop_check_every = opts.eval_every;  // (the stop asked at an evaluation is agreed right after it)
  opts.stop_check_in_background = false;
  row r;
  r.profile = link.name;
  r.name = name;
  const auto t0 = std::chrono::steady_clock::now();
  const auto hooks = [&r, target](Trainer& t) {
    auto reached = std::make_shared<bool>(false);
    t.stop_when([reached] { return *reached; });
    t.on_eval([&r, &t, reached, target](const dt::train::eval_point& p) {
      if (p.val_loss <= target) *reached = true;
      if (t.rank() == 0) r.final_loss = p.val_loss;
      if (t.rank() == 0 && p.val_loss <= target && !std::isfinite(r.to_target_s)) r.to_target_s = p.clock_s;
    });
    auto waited = std::make_shared<double>(0.0);
    t.on_step([&r, &t, waited](const dt::train::step_metrics& m) {
      if (t.rank() != 0) return;
      if (m.step == 1) r.first_step_clock_s = m.clock_s;  // (steps done: after the first)
      const double before = std::exchange(*waited, m.network_wait_s);
      if constexpr (requires { t.policy().choices(); })
        if (!t.policy().choices().empty()) {
          const auto& first = t.policy().choices().front();
          if constexpr (requires { t.policy().fragments; })  // (Streaming DiLoCo's, whose probe runs beside its first steps)
            if (first.step > 0 && first.step + 1 == m.step) r.pick_wait_s = m.network_wait_s - before;
          const auto& c = t.policy().choices().back();
          r.pick = dt::detail::concat("H ", c.inner_steps, c.overlap > 0 ? dt::detail::concat(" P ", c.fragments, " tau ", c.overlap) : "",
                                      " ", c.codec_name, " (", c.why, ")");
        }
    });
  };
  const auto results = dt::train::fit_in_process<Trainer>(net, s.model, opts, s.data, comm, hooks);
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& last = results[0].last;
  if (!results[0].stopped) r.final_loss = results[0].final_val_loss;  // (stopped: the evaluation that reached the target)
  r.clock_s = last.clock_s;
  r.steps = last.step + 1;
  for (const auto& p : results) r.mb_per_peer += static_cast<double>(p.last.policy_bytes_sent) / 1e6 / 4.0;
  std::fprintf(stderr, " %lld steps, loss %.4f, %s, %.0f s\n", static_cast<long long>(r.steps), r.final_loss,
               std::isfinite(r.to_target_s) ? dt::detail::concat(r.to_target_s, " simulated s to the target").c_str() : "target not reached",
               r.wall_s);
  return r;
}

codec parse(const std::string& spec) { return dt::collective::parse_codec(spec); }

std::vector<codec> auto_codecs() { return {parse("identity"), parse("int8"), parse("int4")}; }

}  // namespace

int main(int argc, char** argv) try {
  bench::args cli(argc, argv, "usage: bench_auto_grid [--flag value]...");
  auto value = [&](const std::string& key, const std::string& fallback) { return cli.value(key, fallback); };
  std::vector<std::string> wanted, hs, overlaps;
  for (auto [list, key, fallback] : {std::tuple{&wanted, "profiles", "slow,medium,fast"}, std::tuple{&hs, "only-h", "10,50,200"},
                                     std::tuple{&overlaps, "max-overlap", ""}}) {
    std::stringstream in(value(key, fallback));
    for (std::string item; std::getline(in, item, ',');) list->push_back(item);
  }
  setup s;
  const auto sync_steps = std::stoll(value("sync-steps", "300"));
  const auto max_steps = std::stoll(value("max-steps", "600"));
  s.compute_scale = std::stod(value("compute-scale", "1"));
  s.opts.eval_every = std::stoll(value("eval-every", "25"));
  s.opts.batch_size = std::stoll(value("batch-size", "16"));
  const std::string json_path = value("json", "auto_grid.json");
  cli.finish();
  omp_set_num_threads(1);  // (4 peers share the machine's cores)
  dt::detail::check(s.compute_scale > 0 && sync_steps >= s.opts.eval_every && max_steps >= sync_steps && s.opts.eval_every >= 1,
                    "bench_auto_grid: needs --compute-scale > 0 and --eval-every <= --sync-steps <= --max-steps");
  bench::output_file json(json_path);
  const auto text = dt::data::builtin_corpus(std::size_t{1} << 20);
  const auto tok = dt::data::char_tokenizer::from_text(text);
  s.data = dt::data::token_dataset(tok.encode(text), 0.1);
  s.model = dt::nn::gpt_preset("tiny");
  s.model.vocab_size = tok.vocab_size();
  s.model.block_size = 32;
  s.opts.block_size = 32;
  s.opts.lr = 3e-3;
  s.opts.min_lr = 3e-4;
  s.opts.warmup_steps = 50;
  s.opts.eval_batches = 8;
  s.opts.compute_on_thread_clock = true;  // (what else this machine runs does not count as compute)

  const std::vector<std::pair<std::string, std::string>> codecs = {
      {"f32", "identity"}, {"int8", "int8"}, {"int4", "int4"}, {"top1%+ef", "topk:0.01,ef"}};
  std::vector<row> rows;
  std::ostringstream table;
  for (const auto& name : wanted) {
    const auto at = std::find_if(profiles.begin(), profiles.end(), [&](const profile& p) { return p.name == name; });
    dt::detail::check(at != profiles.end(), "bench_auto_grid: unknown profile '", name, "' (slow, medium, fast)");
    const auto& link = *at;
    const auto sync = run(link, "sync", dt::comm::sync_allreduce<>{}, s, sync_steps, -1.0);
    const double target = sync.final_loss;
    rows.push_back(sync);
    rows.back().to_target_s = sync.clock_s;
    std::vector<row> grid;
    for (const auto& h : hs)
      for (const auto& [label, spec] : codecs)
        for (const int P : {1, 4}) {
          const auto H = std::stoll(h);
          const auto grid_name = dt::detail::concat("H", H, "/", label, "/P", P);
          if (P == 1) {
            diloco_policy d;
            d.inner_steps = H;
            d.codec = parse(spec);
            grid.push_back(run(link, grid_name, d, s, max_steps, target));
          } else {
            streaming_policy d;
            d.inner_steps = H;
            d.fragments = P;
            d.overlap = 1;
            d.codec = parse(spec);
            grid.push_back(run(link, grid_name, d, s, max_steps, target));
          }
        }
    streaming_policy tuned_streaming;
    tuned_streaming.tune.emplace();
    tuned_streaming.tune->codecs = auto_codecs();
    diloco_policy tuned_diloco;
    tuned_diloco.tune.emplace();
    tuned_diloco.tune->codecs = auto_codecs();
    const auto auto_s = run(link, "auto-streaming", tuned_streaming, s, max_steps, target);
    const auto auto_d = run(link, "auto-diloco", tuned_diloco, s, max_steps, target);
    std::vector<row> variants;
    for (const auto& x : overlaps) {
      auto v = tuned_streaming;
      v.tune->max_overlap = std::stod(x);
      variants.push_back(run(link, "auto-streaming@" + x, v, s, max_steps, target));
    }
    // Measuring: what the tuned run's start and first step cost beyond a plain DiLoCo run's.
    double plain_first = std::numeric_limits<double>::infinity();
    for (const auto& g : grid)
      if (g.name.find("/P1") != std::string::npos) plain_first = std::min(plain_first, g.first_step_clock_s);
    const auto best = std::min_element(grid.begin(), grid.end(), [](const row& a, const row& b) { return a.to_target_s < b.to_target_s; });
    rows.insert(rows.end(), grid.begin(), grid.end());
    rows.push_back(auto_s);
    rows.push_back(auto_d);
    rows.insert(rows.end(), variants.begin(), variants.end());
    const auto& tuned_best = auto_s.to_target_s <= auto_d.to_target_s ? auto_s : auto_d;
    const double measuring = std::isfinite(tuned_best.to_target_s)
                                 ? (tuned_best.first_step_clock_s - plain_first + tuned_best.pick_wait_s) / tuned_best.to_target_s
                                                                     : std::numeric_limits<double>::quiet_NaN();
    table << dt::detail::concat(link.name, ": target ", target, " (sync: ", sync.clock_s, " simulated s); the grid's best ", best->name, " ",
                                best->to_target_s, " s; --auto's best ", tuned_best.name, " ", tuned_best.to_target_s, " s = ",
                                tuned_best.to_target_s / best->to_target_s, "x the grid's (goal <= 1.1x), measuring ",
                                100 * measuring, "% of it (goal <= 5%); ", tuned_best.pick, "\n");
  }

  std::printf("4 in-process peers, the tiny GPT (block 32, batch %lld) on the built-in corpus, compute x %.2f; time to sync's loss\n\n",
              static_cast<long long>(s.opts.batch_size), s.compute_scale);
  std::printf("%-8s %-20s %12s %9s %7s %9s  %s\n", "profile", "run", "to target s", "val loss", "steps", "MB/peer", "pick");
  for (const auto& r : rows)
    std::printf("%-8s %-20s %12s %9.4f %7lld %9.2f  %s\n", r.profile.c_str(), r.name.c_str(),
                std::isfinite(r.to_target_s) ? dt::detail::concat(std::lround(10 * r.to_target_s) / 10.0).c_str() : "-", r.final_loss,
                static_cast<long long>(r.steps), r.mb_per_peer, r.pick.c_str());
  std::printf("\n%s", table.str().c_str());

  std::ostringstream out;
  out << "{\n  \"compute_scale\": " << s.compute_scale << ", \"sync_steps\": " << sync_steps << ", \"max_steps\": " << max_steps
      << ", \"rows\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    out << (i ? ",\n" : "\n") << "    {\"profile\": \"" << r.profile << "\", \"run\": \"" << r.name << "\", \"to_target_s\": "
        << (std::isfinite(r.to_target_s) ? dt::detail::concat(r.to_target_s) : std::string("null")) << ", \"val_loss\": " << r.final_loss
        << ", \"steps\": " << r.steps << ", \"clock_s\": " << r.clock_s << ", \"first_step_clock_s\": " << r.first_step_clock_s << ", \"pick_wait_s\": " << r.pick_wait_s
        << ", \"mb_per_peer\": " << r.mb_per_peer << ", \"wall_s\": " << r.wall_s << ", \"pick\": \"" << r.pick << "\"}";
  }
  out << "\n  ]\n}\n";
  json.stream() << out.str();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_auto_grid: %s\n", e.what());
  return 1;
}
