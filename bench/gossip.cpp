// bench/gossip: averaging without a global all-reduce, against the all-reduce, on the same data,
// model and tokens per peer. 16 in-process peers (--peers) train nanoGPT's CPU-recipe model on
// tinyshakespeare over simulated `wan` links (--link: wan, heterogeneous, lan, ideal), each step's
// compute charged as --step-seconds of simulated time (the deterministic simulator), so the
// simulated clock says what the links cost. Rows (--only, ',' between names):
//   sync                synchronous all-reduce of the gradients every step
//   dpsgd-<graph>       D-PSGD (comm::gossip) on one-peer-exponential, exponential, ring, torus
//   push-sum            SGP (comm::push_sum) on the one-peer exponential graph; osgp: overlapped
//   moshpit-1           comm::moshpit every step, one round (one axis of the grid) a step
//   moshpit             comm::moshpit every step, the grid's every round (the exact mean on 16)
//   choco-sign, choco-topk  CHOCO-SGD on a ring through sign, or top-1% (f32 values), at its default step
//   diloco-H            DiLoCo, H inner steps, all-reduce outer averaging
//   diloco-H-moshpit    DiLoCo, H inner steps, Moshpit outer averaging
//   ad-psgd             AD-PSGD (comm::ad_psgd) on the static exponential graph
//   ROW-slow            ROW (sync or ad-psgd) with the last peer computing 4x slower, evaluated
//                       only at the end (an evaluation is an all-reduce: every peer waits there)
//   ROW-even            ROW evaluated only at the end, every peer at speed 1: ROW-slow's reference
//   ROW:STEPS           ROW trained for STEPS steps instead of --steps (its schedule that long):
//                       how far it gets in the simulated time another row's steps take
// Columns: the mean of the peers' final validation losses, the consensus distance at the end,
// MB the policy sent per peer, the simulated time, and the simulated time at which peer 0 first
// evaluated at or below sync's final loss ("-" where it did not), and the steps per simulated
// second of the peers of speed 1 up to their second-to-last step (the last one waits for every
// peer: the run's end). Peak memory of the process follows each row (what --peers simulated
// peers of this model cost).
// --part moshpit-values: Moshpit on values alone, 1000 simulated peers (--values-peers) in a
// 10 x 10 x 10 grid, each round each peer failing with probability 0, 0.01 and 0.1 (it keeps its
// values and misses that round's group): the largest relative error against the starting mean,
// per round, over all peers and over those that took part in the round, with the grid's places
// fixed and drawn anew every pass over its dimensions.
//
//   bench_gossip [--data FILE] [--steps 600] [--peers 16] [--link wan] [--step-seconds 0.1]
//                [--only sync,dpsgd-one-peer-exponential,...] [--part train|moshpit-values|all]
//                [--eval-every 50] [--json gossip.json]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "decentrain/decentrain.hpp"
#include "args.hpp"
#include "output_file.hpp"
#include "shakespeare_recipe.hpp"

namespace dt = decentrain;

namespace {

struct row {
  std::string name;
  double val_loss = 0, consensus = -1, mb_per_peer = 0, simulated_s = 0, reached_s = -1, wall_s = 0, peak_gb = 0;
  double fast_rate = 0;  // steps per simulated second of the peers of speed 1 (see above)
  std::vector<dt::train::eval_point> curve;  // peer 0's
};

double peak_gb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / (1024.0 * 1024.0);  // (kilobytes on Linux)
}

struct setup {
  int peers = 16;
  std::string link = "wan";
  double step_seconds = 0.1;
  std::uint64_t seed = 1337;
  std::vector<double> speeds{};  // empty: every peer 1
};

template <class Comm>
row run(const std::string& name, Comm comm, const setup& s, const dt::nn::gpt_config& cfg, const dt::train::trainer_options& opts,
        const dt::data::token_dataset& data) {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Comm>;
  std::fprintf(stderr, "running %s ...\n", name.c_str());
  dt::transport::in_process::options o;
  o.seed = s.seed;
  o.recv_timeout = std::chrono::minutes(30);
  o.deterministic = dt::transport::in_process::deterministic_run{.step_seconds = s.step_seconds};
  o.speeds = s.speeds;
  dt::transport::in_process net(dt::transport::links::preset(s.link, s.peers, s.seed), o);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<double> clock_before_last(static_cast<std::size_t>(s.peers), 0.0);
  const auto results = dt::train::fit_in_process<Trainer>(net, cfg, opts, data, comm, [&](Trainer& t) {
    t.on_step([&, &t = t](const dt::train::step_metrics& m) {
      if (m.step == opts.steps - 1) clock_before_last[static_cast<std::size_t>(t.rank())] = m.clock_s;
    });
  });
  row r;
  r.name = name;
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& f : results) {
    r.val_loss += f.final_val_loss / static_cast<double>(results.size());
    r.simulated_s = std::max(r.simulated_s, f.last.clock_s);
  }
  int fast = 0;
  for (int p = 0; p < s.peers; ++p)
    if ((s.speeds.empty() || s.speeds[static_cast<std::size_t>(p)] == 1.0) && clock_before_last[static_cast<std::size_t>(p)] > 0) {
      r.fast_rate += static_cast<double>(opts.steps - 1) / clock_before_last[static_cast<std::size_t>(p)];
      ++fast;
    }
  if (fast > 0) r.fast_rate /= fast;
  r.curve = results[0].evals;
  if (!r.curve.empty()) {
    r.consensus = r.curve.back().consensus_distance;
    r.mb_per_peer = static_cast<double>(r.curve.back().policy_bytes_sent) / 1e6;
  }
  r.peak_gb = peak_gb();
  std::fprintf(stderr, "  %s: val loss %.4f, %.1f MB per peer, %.0f simulated s, %.0f s\n", name.c_str(), r.val_loss, r.mb_per_peer,
               r.simulated_s, r.wall_s);
  return r;
}

// The row named `name`.
row train_row(const std::string& name, setup s, const dt::nn::gpt_config& cfg, const dt::train::trainer_options& opts,
              const dt::data::token_dataset& data) {
  namespace topo = dt::comm::topology;
  for (const std::string suffix : {"-slow", "-even"})
    if (name.size() > suffix.size() && name.ends_with(suffix)) {  // evaluated at the end only
      auto end_only = opts;
      end_only.eval_every = 0;
      if (suffix == "-slow") {  // the last peer 4x slower
        s.speeds.assign(static_cast<std::size_t>(s.peers), 1.0);
        s.speeds.back() = 0.25;
      }
      auto r = train_row(name.substr(0, name.size() - suffix.size()), s, cfg, end_only, data);
      r.name = name;
      return r;
    }
  if (name == "sync") return run(name, dt::comm::sync_allreduce<>{}, s, cfg, opts, data);
  if (name == "ad-psgd") return run(name, dt::comm::ad_psgd<>{}, s, cfg, opts, data);
  if (name.rfind("dpsgd-", 0) == 0) {
    dt::comm::gossip<topo::named> p;
    p.topology = topo::named::parse(name.substr(6));
    return run(name, p, s, cfg, opts, data);
  }
  if (name == "push-sum" || name == "osgp") {
    dt::comm::push_sum<> p;
    p.overlap = name == "osgp";
    return run(name, p, s, cfg, opts, data);
  }
  if (name == "choco-sign") return run(name, dt::comm::choco<topo::ring, dt::compress::sign>{}, s, cfg, opts, data);
  if (name == "choco-topk") {
    dt::comm::choco<topo::ring, dt::compress::top_k> p;
    p.codec.fraction = 0.01;
    return run(name, p, s, cfg, opts, data);
  }
  if (name == "moshpit" || name == "moshpit-1") {
    dt::comm::moshpit<> p;
    p.grid.rounds = name == "moshpit-1" ? 1 : 0;
    return run(name, p, s, cfg, opts, data);
  }
  if (name.rfind("diloco-", 0) == 0) {
    dt::comm::diloco<> p;
    const auto rest = name.substr(7);
    const auto dash = rest.find('-');
    p.inner_steps = std::stoll(rest.substr(0, dash));
    if (dash != std::string::npos) {
      dt::detail::check(rest.substr(dash + 1) == "moshpit", "bench_gossip: unknown row '", name, "'");
      p.moshpit = dt::comm::moshpit_grid{};
    }
    return run(name, p, s, cfg, opts, data);
  }
  dt::detail::fail("bench_gossip: unknown row '", name,
                   "' (sync, dpsgd-GRAPH, push-sum, osgp, ad-psgd, choco-sign, choco-topk, moshpit, moshpit-1, diloco-H, "
                   "diloco-H-moshpit, ROW-slow, ROW-even)");
}

// Moshpit on values: `n` peers in groups of `m`, each failing a round with probability `fail`.
// After each of `rounds` rounds, the largest |v - mean| / |mean| over the peers and values, the
// root mean square of the same, and the largest over the peers that took part in that round (the
// mean of the starting values, which a round keeps: a group's average keeps its sum, a failed
// peer keeps its own values). With `reshuffle`, the peers take new places in the grid, drawn at
// random, at the start of every pass over its dimensions (as the paper's matchmaking regroups
// them; a pass without failures still gives the exact mean). `held` counts, after round 6, the
// peers that failed each of rounds 4, 5 and 6, and `held_largest` is the largest error among them:
// they hold their values of round 3, which can hold at most M^2 of the starting values of peers
// that failed round 1 (M^3 = n), so no protocol that averages in groups of M brings them to the
// mean (see RESULTS).
struct value_errors {
  std::vector<double> largest, rms, largest_took_part;
  int held = 0;
  double held_largest = 0;
};
value_errors moshpit_values(int n, int m, double fail, int rounds, std::uint64_t seed, bool reshuffle = false) {
  const dt::comm::moshpit_grid grid{.group_size = m};
  dt::rng gen(seed, "bench.moshpit_values");
  constexpr std::size_t width = 8;
  std::vector<std::vector<double>> v(static_cast<std::size_t>(n), std::vector<double>(width));
  std::vector<double> mean(width, 0.0);
  for (auto& peer : v)
    for (std::size_t i = 0; i < width; ++i) {
      peer[i] = gen.uniform();
      mean[i] += peer[i] / n;
    }
  value_errors errors;
  const int d = grid.dims(n);
  std::vector<int> at(static_cast<std::size_t>(n));  // the peer at each place of the grid
  for (int r = 0; r < n; ++r) at[static_cast<std::size_t>(r)] = r;
  dt::rng shuffle(seed, "bench.moshpit_values.places");
  std::vector<int> missed_in_a_row(static_cast<std::size_t>(n), 0);
  for (int t = 0; t < rounds; ++t) {
    if (reshuffle && t % d == 0)
      for (int r = n - 1; r > 0; --r)
        std::swap(at[static_cast<std::size_t>(r)], at[static_cast<std::size_t>(shuffle.below(static_cast<std::uint64_t>(r) + 1))]);
    std::vector<bool> failed(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      failed[static_cast<std::size_t>(r)] = gen.uniform() < fail;
      auto& run = missed_in_a_row[static_cast<std::size_t>(r)];
      run = failed[static_cast<std::size_t>(r)] ? run + 1 : 0;
    }
    std::vector<bool> done(static_cast<std::size_t>(n), false);  // by place
    for (int place = 0; place < n; ++place) {
      if (done[static_cast<std::size_t>(place)]) continue;
      std::vector<int> live;
      for (const int q : grid.group_of(place, n, t)) {
        done[static_cast<std::size_t>(q)] = true;
        const int j = at[static_cast<std::size_t>(q)];
        if (!failed[static_cast<std::size_t>(j)]) live.push_back(j);
      }
      if (live.size() < 2) continue;
      for (std::size_t i = 0; i < width; ++i) {
        double sum = 0;
        for (const int j : live) sum += v[static_cast<std::size_t>(j)][i];
        for (const int j : live) v[static_cast<std::size_t>(j)][i] = sum / static_cast<double>(live.size());
      }
    }
    double worst = 0, worst_took_part = 0, worst_held = 0, squares = 0;
    int held = 0;
    for (int r = 0; r < n; ++r) {
      double peer_worst = 0;
      for (std::size_t i = 0; i < width; ++i) {
        const double e = std::abs(v[static_cast<std::size_t>(r)][i] - mean[i]) / std::abs(mean[i]);
        peer_worst = std::max(peer_worst, e);
        squares += e * e;
      }
      worst = std::max(worst, peer_worst);
      if (!failed[static_cast<std::size_t>(r)]) worst_took_part = std::max(worst_took_part, peer_worst);
      if (missed_in_a_row[static_cast<std::size_t>(r)] >= 3) {
        ++held;
        worst_held = std::max(worst_held, peer_worst);
      }
    }
    errors.largest.push_back(worst);
    errors.largest_took_part.push_back(worst_took_part);
    errors.rms.push_back(std::sqrt(squares / static_cast<double>(n * width)));
    if (t == 5) {
      errors.held = held;
      errors.held_largest = worst_held;
    }
  }
  return errors;
}

}  // namespace

int main(int argc, char** argv) try {
  bench::args cli(argc, argv, "usage: bench_gossip [--flag value]...");
  auto value = [&](const std::string& key, const std::string& fallback) { return cli.value(key, fallback); };
  const std::string path = value("data", DECENTRAIN_SOURCE_DIR "/../shared/data/tinyshakespeare.txt");
  setup s;
  s.peers = std::stoi(value("peers", "16"));
  s.link = value("link", "wan");
  s.step_seconds = std::stod(value("step-seconds", "0.1"));
  const std::string part = value("part", "all"), json_path = value("json", "gossip.json");
  dt::detail::check(part == "all" || part == "train" || part == "moshpit-values", "bench_gossip: --part is all, train or moshpit-values");
  std::vector<std::string> only;
  {
    std::stringstream in(value("only",
                               "sync,dpsgd-one-peer-exponential,dpsgd-exponential,dpsgd-ring,push-sum,osgp,moshpit-1,moshpit,"
                               "diloco-50,diloco-50-moshpit"));
    for (std::string item; std::getline(in, item, ',');) only.push_back(item);
  }
  auto opts = bench::shakespeare_recipe::options(std::stoll(value("steps", "600")));
  opts.eval_every = std::stoll(value("eval-every", "50"));
  opts.eval_batches = std::stoll(value("eval-batches", "10"));
  const int values_peers = std::stoi(value("values-peers", "1000"));
  cli.finish();
  bench::output_file json(json_path);

  std::ostringstream out;
  out << "{\n  \"peers\": " << s.peers << ", \"link\": \"" << s.link << "\", \"step_seconds\": " << s.step_seconds
      << ", \"steps\": " << opts.steps;
  if (part != "moshpit-values") {
    const auto recipe = bench::shakespeare_recipe::load(path);
    std::vector<row> rows;
    for (const auto& name : only) {
      auto row_opts = opts;
      const auto colon = name.find(':');
      if (colon != std::string::npos) row_opts.steps = std::stoll(name.substr(colon + 1));
      rows.push_back(train_row(name.substr(0, colon), s, recipe.model, row_opts, recipe.data));
      rows.back().name = name;
    }
    // Time to sync's final loss, where sync ran.
    double target = -1;
    for (const auto& r : rows)
      if (r.name == "sync") target = r.val_loss;
    for (auto& r : rows)
      for (const auto& e : r.curve)
        if (target > 0 && e.val_loss <= target) {
          r.reached_s = e.clock_s;
          break;
        }
    std::printf("%d in-process peers on '%s' links, %.2f simulated s of compute a step, %lld steps of 12 x 64 tokens each\n\n",
                s.peers, s.link.c_str(), s.step_seconds, static_cast<long long>(opts.steps));
    std::printf("%-30s %9s %11s %12s %13s %15s %13s %9s\n", "run", "val loss", "consensus", "MB/peer", "simulated s", "s to sync loss",
                "fast steps/s", "peak GB");
    for (const auto& r : rows) {
      char consensus[32] = "-", reached[32] = "-";
      if (r.consensus >= 0) std::snprintf(consensus, sizeof consensus, "%.4f", r.consensus);
      if (r.reached_s >= 0) std::snprintf(reached, sizeof reached, "%.0f", r.reached_s);
      std::printf("%-30s %9.4f %11s %12.1f %13.0f %15s %13.3f %9.2f\n", r.name.c_str(), r.val_loss, consensus, r.mb_per_peer,
                  r.simulated_s, reached, r.fast_rate, r.peak_gb);
    }
    out << ",\n  \"rows\": [";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      out << (i ? ",\n" : "\n") << "    {\"run\": \"" << r.name << "\", \"val_loss\": " << r.val_loss << ", \"consensus_distance\": "
          << r.consensus << ", \"mb_per_peer\": " << r.mb_per_peer << ", \"simulated_s\": " << r.simulated_s
          << ", \"simulated_s_to_sync_loss\": " << r.reached_s << ", \"fast_steps_per_s\": " << r.fast_rate
          << ", \"peak_gb\": " << r.peak_gb << ", \"wall_s\": " << r.wall_s
          << ", \"curve\": [";
      for (std::size_t k = 0; k < r.curve.size(); ++k)
        out << (k ? ", " : "") << "[" << r.curve[k].step << ", " << r.curve[k].clock_s << ", " << r.curve[k].val_loss << "]";
      out << "]}";
    }
    out << "\n  ]";
  }
  if (part != "train") {
    const int rounds = 24;
    out << ",\n  \"moshpit_values\": [";
    bool first = true;
    for (const bool reshuffle : {false, true})
      for (const double fail : {0.0, 0.01, 0.1}) {
        const auto e = moshpit_values(values_peers, 10, fail, rounds, s.seed, reshuffle);
        std::printf("\nMoshpit on values: %d peers in groups of 10, each failing a round with probability %.2f%s\n", values_peers, fail,
                    reshuffle ? ", places drawn anew every pass over the grid" : "");
        std::printf("%-8s %24s %24s %28s\n", "round", "largest relative error", "rms relative error", "largest, peers that took part");
        int reached = -1, reached_rms = -1, reached_took_part = -1;
        for (int t = 0; t < rounds; ++t) {
          const auto k = static_cast<std::size_t>(t);
          if (t < 8 || t % 4 == 3) std::printf("%-8d %24.3e %24.3e %28.3e\n", t + 1, e.largest[k], e.rms[k], e.largest_took_part[k]);
          if (reached < 0 && e.largest[k] <= 1e-4) reached = t + 1;
          if (reached_rms < 0 && e.rms[k] <= 1e-4) reached_rms = t + 1;
          if (reached_took_part < 0 && e.largest_took_part[k] <= 1e-4) reached_took_part = t + 1;
        }
        std::printf("<= 1e-4 after %d rounds (largest), %d (rms), %d (peers that took part); goal: within 6 at 0.1; -1: not in %d\n",
                    reached, reached_rms, reached_took_part, rounds);
        std::printf("after round 6, %d peer(s) had failed rounds 4, 5 and 6, holding their round-3 values: largest error %.3e\n", e.held,
                    e.held_largest);
        out << (first ? "\n" : ",\n") << "    {\"peers\": " << values_peers << ", \"fail\": " << fail
            << ", \"reshuffle\": " << (reshuffle ? "true" : "false") << ", \"largest\": [";
        first = false;
        for (std::size_t t = 0; t < e.largest.size(); ++t) out << (t ? ", " : "") << e.largest[t];
        out << "], \"rms\": [";
        for (std::size_t t = 0; t < e.rms.size(); ++t) out << (t ? ", " : "") << e.rms[t];
        out << "], \"largest_took_part\": [";
        for (std::size_t t = 0; t < e.largest_took_part.size(); ++t) out << (t ? ", " : "") << e.largest_took_part[t];
        out << "], \"rounds_to_1e-4\": " << reached << ", \"rms_rounds_to_1e-4\": " << reached_rms
            << ", \"took_part_rounds_to_1e-4\": " << reached_took_part << ", \"held_after_6\": " << e.held
            << ", \"held_largest\": " << e.held_largest << "}";
      }
    out << "\n  ]";
  }
  out << "\n}\n";
  json.stream() << out.str();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_gossip: %s\n", e.what());
  return 1;
}
