// bench/deadlines: DiLoCo rounds under a straggler tail, closed when every replica is in, at a
// fixed timeout, or at a deadline from observation (comm/round_deadline.hpp: median + k MAD of
// recent arrival offsets, once a quorum is in). 8 in-process peers (--peers) of speeds 1x to 4x
// (transport::speeds::spread) train nanoGPT's CPU-recipe model on tinyshakespeare, DiLoCo sized
// to speed with H = --inner-steps, over simulated links (--link), each inner step charged
// --step-seconds / speed of simulated time, and with probability --straggle 10x that
// (in_process's straggler tail; the deterministic simulator). Rows (--only, ',' between names):
//   fault-free            no straggler tail, every replica waited for: the arrival times the
//                         others' "within the fault-free p95" counts against
//   wait-all              the tail, every replica waited for (what a round does without a deadline:
//                         a receive timeout longer than any straggle)
//   fixed                 the tail, each round closed --fixed-s after its first arrival (a fixed timeout)
//   observed              the tail, each round closed at median + --k MAD after its first arrival
//                         (at least --min-wait of the round's planned compute), once half the
//                         replicas are in
//   churn-wait-all        wait-all under churn: fault::elastic, and every --churn-every (a range
//                         of simulated seconds, drawn) one running peer killed wherever it stands,
//                         started again --churn-down later as a joiner that takes the group's state
//   churn                 observed under the same churn
// --headroom: the sizing's margin past the slowest replica's time (diloco::headroom).
// Columns: the simulated time to finish; each round's length (the leader's close, from the
// round's start) over the fastest quorum's time (the arrival of half the replicas, each replica
// at the time it came, late or not), mean and 95th percentile; the contributions dropped, of all
// and of those that came within the fault-free run's 95th-percentile arrival; the steps the late
// replicas skipped; the least busy peer; the validation loss. Under churn a round counts the
// replicas of its view, a contribution that never came (its peer killed) is in no count, and the
// least busy peer is of those that ran the whole run in one process.
//
//   bench_deadlines [--data FILE] [--steps 400] [--peers 8] [--inner-steps 20] [--fastest 4]
//                   [--link lan] [--step-seconds 0.1] [--straggle 0.02] [--fixed-s 0.1] [--k 2]
//                   [--min-wait 0.1] [--n-layer 4] [--n-embd 128] [--batch 12]
//                   [--churn-every 4,8] [--churn-down 1,4] [--churn-seed 1] [--headroom 0.05] [--seed 1337]
//                   [--only fault-free,wait-all,fixed,observed,churn-wait-all,churn] [--json deadlines.json]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "decentrain/decentrain.hpp"
#include "args.hpp"
#include "output_file.hpp"
#include "shakespeare_recipe.hpp"

namespace dt = decentrain;

namespace {

using policy_type = dt::comm::diloco<>;
using trainer_type = dt::train::trainer<dt::nn::gpt<dt::cpu>, policy_type>;
using elastic_trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, policy_type, dt::parallel::data, dt::fault::elastic>;

struct row {
  std::string name;
  double simulated_s = 0, ratio_mean = 0, ratio_p95 = 0, util_lowest = 1, val_loss = 0;
  std::int64_t contributions = 0, dropped = 0, within_p95 = 0, dropped_within_p95 = 0, skipped = 0, rounds = 0;
  std::int64_t kills = 0, views = 0;  // under churn
  std::vector<double> arrivals;  // every contribution's arrival after its round's start
};

// What each process recorded: every round it led, every arrival it took, the steps it skipped.
struct process_records {
  std::vector<dt::comm::deadline_round_record> rounds;
  std::vector<dt::comm::deadline_arrival> arrivals;
  std::int64_t skipped = 0;
};

struct churn_setting {
  bool on = false;
  double every_min_s = 4, every_max_s = 8, down_min_s = 1, down_max_s = 4;
  std::uint64_t seed = 1;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size()))) - 1)];
}

row run(const std::string& name, const dt::comm::round_deadline& deadline, double straggle, double p95_fault_free,
        const std::vector<double>& speeds, const std::string& link, double step_seconds, std::int64_t h, const dt::nn::gpt_config& cfg,
        const dt::train::trainer_options& opts, const dt::data::token_dataset& data, double headroom, std::uint64_t seed,
        const churn_setting& churn = {}) {
  std::fprintf(stderr, "running %s (%lld steps) ...\n", name.c_str(), static_cast<long long>(opts.steps));
  const int n = static_cast<int>(speeds.size());
  dt::transport::in_process::options o;
  o.seed = seed;
  o.recv_timeout = std::chrono::minutes(30);
  o.deterministic = dt::transport::in_process::deterministic_run{.step_seconds = step_seconds};
  o.speeds = speeds;
  o.straggle = {straggle, 10};
  row out;
  out.name = name;
  if (churn.on) {
    // (kills until 90% of the steps' compute at speed 1, about the fault-free run's length: none
    // in the last rounds)
    dt::transport::random_churn c;
    c.peers = n;
    c.seconds = 0.9 * static_cast<double>(opts.steps) * step_seconds;
    c.every_min_s = churn.every_min_s;
    c.every_max_s = churn.every_max_s;
    c.down_min_s = churn.down_min_s;
    c.down_max_s = churn.down_max_s;
    c.min_alive = n / 2 + 1;
    o.deterministic->churn = c.make(churn.seed);
    o.peers_fail_alone = true;
    for (const auto& e : o.deterministic->churn) out.kills += e.what == dt::transport::churn_event::kind::kill;
  }
  dt::transport::in_process net(dt::transport::links::preset(link, n, 1337), o);
  policy_type policy;
  policy.inner_steps = h;
  policy.sized_to_speed = true;
  policy.deadline = deadline;
  policy.headroom = headroom;
  std::vector<process_records> records;  // every process's
  std::vector<dt::train::fit_result> finished;  // of the processes that trained to the end
  std::vector<bool> whole;                       // ... in one process, from the first step
  if (!churn.on) {
    records.resize(static_cast<std::size_t>(n));
    const auto keep = [&](trainer_type& t) {
      t.on_step([&, steps = opts.steps](const dt::train::step_metrics& m) {  // (each peer its own slot)
        if (m.step != steps) return;
        auto& r = records[static_cast<std::size_t>(t.rank())];
        r = {t.policy().deadlines().rounds(), t.policy().deadlines().arrivals(), t.skipped_steps()};
      });
    };
    finished = dt::train::fit_in_process<trainer_type>(net, cfg, opts, data, policy, keep);
    whole.assign(finished.size(), true);
  } else {
    dt::fault::elastic fault;
    // (a joiner is taken in at a round's start: rounds of a few simulated seconds)
    fault.admission_timeout = std::chrono::seconds(30);
    std::mutex m;
    std::set<std::uint64_t> epochs;
    net.run([&](dt::transport::in_process::endpoint& ep) {
      const bool first = net.restarts(ep.rank()) == 0 && !ep.joined_late();
      elastic_trainer t(cfg, opts, ep, policy, {}, fault);
      const auto keep = [&](const dt::train::fit_result* result) {
        std::lock_guard lock(m);
        records.push_back({t.policy().deadlines().rounds(), t.policy().deadlines().arrivals(), t.skipped_steps()});
        for (const auto& c : t.fault().changes()) epochs.insert(c.epoch);
        if (result) {
          finished.push_back(*result);
          whole.push_back(first);
        }
      };
      try {
        const auto result = t.fit(data);
        keep(&result);
      } catch (...) {
        keep(nullptr);  // (killed)
        throw;
      }
    });
    out.views = static_cast<std::int64_t>(epochs.size());
  }
  for (std::size_t i = 0; i < finished.size(); ++i) {
    const auto& res = finished[i];
    out.simulated_s = std::max(out.simulated_s, res.last.clock_s);
    if (whole[i]) out.util_lowest = std::min(out.util_lowest, res.last.utilisation());
    out.val_loss += res.final_val_loss;
  }
  out.val_loss /= static_cast<double>(std::max<std::size_t>(1, finished.size()));
  for (const auto& r : records) out.skipped += r.skipped;
  // Each round's arrivals (its leader's records, and a late one's by the next round's leader).
  std::map<std::int64_t, std::vector<double>> by_round;
  for (const auto& per : records)
    for (const auto& a : per.arrivals) {
      by_round[a.round].push_back(a.after_start_s);
      out.arrivals.push_back(a.after_start_s);
      if (a.after_start_s <= p95_fault_free) {
        ++out.within_p95;
        if (!a.in) ++out.dropped_within_p95;
      }
    }
  std::vector<double> ratios;
  for (const auto& per : records)
    for (const auto& rr : per.rounds) {
      const int quorum = dt::comm::round_deadline{}.quorum_of(rr.replicas);  // (half, whatever the row closes with)
      ++out.rounds;
      out.contributions += rr.replicas;
      out.dropped += rr.replicas - rr.members;
      auto times = by_round[rr.round];
      // (replicas more than a round late are in no record: they came after the quorum anyway)
      std::sort(times.begin(), times.end());
      if (static_cast<int>(times.size()) < quorum) continue;
      const double fastest_quorum = times[static_cast<std::size_t>(quorum - 1)];
      if (fastest_quorum > 0) ratios.push_back(rr.close_s / fastest_quorum);
    }
  for (double r : ratios) out.ratio_mean += r / static_cast<double>(ratios.size());
  out.ratio_p95 = percentile(ratios, 0.95);
  std::fprintf(stderr, "  %s: %.1f simulated s, round / fastest quorum %.3f (p95 %.3f), dropped %lld of %lld, %lld kills, %lld views, "
               "%zu finished\n", name.c_str(), out.simulated_s, out.ratio_mean, out.ratio_p95, static_cast<long long>(out.dropped),
               static_cast<long long>(out.contributions), static_cast<long long>(out.kills), static_cast<long long>(out.views),
               finished.size());
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  bench::args cli(argc, argv, "usage: bench_deadlines [--flag value]...");
  auto value = [&](const std::string& key, const std::string& fallback) { return cli.value(key, fallback); };
  const std::string path = value("data", DECENTRAIN_SOURCE_DIR "/../shared/data/tinyshakespeare.txt");
  const int peers = std::stoi(value("peers", "8"));
  const std::string link = value("link", "lan");
  const double step_seconds = std::stod(value("step-seconds", "0.1"));
  const std::int64_t h = std::stoll(value("inner-steps", "20"));
  const double fastest = std::stod(value("fastest", "4"));
  const double straggle = std::stod(value("straggle", "0.02"));
  const double fixed_s = std::stod(value("fixed-s", "0.1"));
  const double k = std::stod(value("k", "2"));
  const double min_wait = std::stod(value("min-wait", "0.1"));
  const auto range = [&](const std::string& key, const std::string& fallback) {
    const std::string text = value(key, fallback);
    const auto comma = text.find(',');
    dt::detail::check(comma != std::string::npos, "bench_deadlines: --", key, " takes MIN,MAX seconds, got '", text, "'");
    return std::pair{std::stod(text.substr(0, comma)), std::stod(text.substr(comma + 1))};
  };
  churn_setting churn;
  std::tie(churn.every_min_s, churn.every_max_s) = range("churn-every", "4,8");
  std::tie(churn.down_min_s, churn.down_max_s) = range("churn-down", "1,4");
  churn.seed = std::stoull(value("churn-seed", "1"));
  const double headroom = std::stod(value("headroom", std::to_string(policy_type{}.headroom)));
  const std::uint64_t seed = std::stoull(value("seed", "1337"));  // (the in-process network's: the straggler tail's draws)
  const std::string json_path = value("json", "deadlines.json");
  std::vector<std::string> only;
  {
    std::stringstream in(value("only", "fault-free,wait-all,fixed,observed"));
    for (std::string item; std::getline(in, item, ',');) only.push_back(item);
  }
  auto opts = bench::shakespeare_recipe::options(std::stoll(value("steps", "400")));
  // (a smaller model for a quick look: the rounds' timing is simulated, whatever the model)
  const auto n_layer = std::stoll(value("n-layer", "4")), n_embd = std::stoll(value("n-embd", "128"));
  opts.batch_size = std::stoll(value("batch", std::to_string(opts.batch_size)));
  opts.eval_every = 0;
  opts.eval_batches = std::stoll(value("eval-batches", "10"));
  cli.finish();
  bench::output_file json(json_path);
  const auto speeds = dt::transport::speeds::spread(peers, 1337, fastest);
  auto recipe = bench::shakespeare_recipe::load(path);
  recipe.model.n_layer = n_layer;
  recipe.model.n_embd = n_embd;

  dt::comm::round_deadline all;  // every replica waited for
  all.quorum = 1;
  dt::comm::round_deadline fixed;
  fixed.fixed_s = fixed_s;
  dt::comm::round_deadline observed;
  observed.k = k;
  observed.min_wait = min_wait;
  std::vector<row> rows;
  double p95 = -1;  // the fault-free run's arrival, after its round's start
  for (const auto& name : only) {
    const auto go = [&](const dt::comm::round_deadline& d, double tail, bool churning = false) {
      auto c = churn;
      c.on = churning;
      rows.push_back(run(name, d, tail, p95 < 0 ? 1e300 : p95, speeds, link, step_seconds, h, recipe.model, opts, recipe.data, headroom, seed, c));
    };
    if (name == "fault-free") {
      go(all, 0.0);
      p95 = percentile(rows.back().arrivals, 0.95);
    } else if (name == "wait-all") go(all, straggle);
    else if (name == "fixed") go(fixed, straggle);
    else if (name == "observed") go(observed, straggle);
    else if (name == "churn-wait-all") go(all, straggle, true);
    else if (name == "churn") go(observed, straggle, true);
    else dt::detail::fail("bench_deadlines: unknown row '", name, "' (fault-free, wait-all, fixed, observed, churn-wait-all, churn)");
  }

  std::printf("%d in-process peers of speeds", peers);
  for (const double v : speeds) std::printf(" %.2f", v);
  std::printf(" on '%s' links, DiLoCo sized to speed (headroom %g), H = %lld, %lld steps; an inner step %.2f simulated s at speed 1, 10x with "
              "probability %.3f; fixed timeout %.3f s, observed deadline median + %.1f MAD (at least %.0f%% of the round), quorum half\n",
              link.c_str(), headroom, static_cast<long long>(h), static_cast<long long>(opts.steps), step_seconds, straggle, fixed_s, k, 100 * min_wait);
  if (p95 >= 0) std::printf("fault-free 95th-percentile arrival: %.3f s after the round's start\n", p95);
  std::printf("churn rows: a peer killed every %g-%g simulated s, started again %g-%g s later (seed %llu)\n", churn.every_min_s,
              churn.every_max_s, churn.down_min_s, churn.down_max_s, static_cast<unsigned long long>(churn.seed));
  std::printf("\n%-14s %11s %14s %13s %9s %16s %8s %11s %9s %6s %6s\n", "run", "simulated s", "round/quorum", "p95", "dropped",
              "dropped <= p95", "skipped", "least busy", "val loss", "kills", "views");
  for (const auto& r : rows)
    std::printf("%-14s %11.1f %13.3fx %12.3fx %4lld/%-4lld %9lld/%-6lld %8lld %10.1f%% %9.4f %6lld %6lld\n", r.name.c_str(), r.simulated_s,
                r.ratio_mean, r.ratio_p95, static_cast<long long>(r.dropped), static_cast<long long>(r.contributions),
                static_cast<long long>(r.dropped_within_p95), static_cast<long long>(r.within_p95), static_cast<long long>(r.skipped),
                100 * r.util_lowest, r.val_loss, static_cast<long long>(r.kills), static_cast<long long>(r.views));

  auto& out = json.stream();
  out << "{\n  \"peers\": " << peers << ", \"link\": \"" << link << "\", \"inner_steps\": " << h << ", \"steps\": " << opts.steps
      << ", \"straggle\": " << straggle << ", \"fixed_s\": " << fixed_s << ", \"k\": " << k << ", \"min_wait\": " << min_wait << ", \"fault_free_p95_s\": " << p95
      << ",\n  \"rows\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    out << (i ? "," : "") << "\n    {\"name\": \"" << r.name << "\", \"simulated_s\": " << r.simulated_s
        << ", \"round_over_quorum_mean\": " << r.ratio_mean << ", \"round_over_quorum_p95\": " << r.ratio_p95
        << ", \"contributions\": " << r.contributions << ", \"dropped\": " << r.dropped << ", \"within_p95\": " << r.within_p95
        << ", \"dropped_within_p95\": " << r.dropped_within_p95 << ", \"skipped_steps\": " << r.skipped
        << ", \"util_lowest\": " << r.util_lowest << ", \"val_loss\": " << r.val_loss << ", \"kills\": " << r.kills
        << ", \"views\": " << r.views << "}";
  }
  out << "\n  ]\n}\n";
  json.close();
  std::printf("\nrows written to %s\n", json_path.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_deadlines: %s\n", e.what());
  return 1;
}
