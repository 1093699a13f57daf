// bench/faults: an elastic DiLoCo group of TCP peers on this machine loses peers to kill -9 and
// SIGSTOP and trains on; what it costs in loss, and how long recovery takes.
//
//   bench_faults [--peers 8] [--kills 3] [--steps 600] [--inner-steps 10] [--batch-size 8]
//                [--n-layer 2] [--n-embd 64] [--block-size 64] [--seed 1] [--only clean,kill,stop,survivors,state]
//                [--silence-ms 3000] [--data tinyshakespeare.txt|builtin] [--json faults.json]
//                [--joiners 16] [--checkpoint-steps 180] [--checkpoint-every 60]   (--only join, checkpoint)
//                [--churn-seconds 600] [--churn-peers 5]                            (--only churn)
//                [--sim-hours 8]                                                    (--only sim-churn)
//
// Exits 1 when a goal about agreement is missed: churn or sim-churn round ends whose peers hold
// different parameters, or sim-churn's two runs not the same.
//
// Every run is `peers` processes of this program (--role peer) joined over 127.0.0.1, training a
// character-level model on tinyshakespeare (or the built-in corpus) with fault::elastic:
//   clean      no faults;
//   kill       `kills` peers, chosen at random (seeded), kill -9'd at random moments: at a
//              random step in [10%, 80%] of the run, then after a random 0-300 ms more;
//   stop       one peer SIGSTOPped (frozen; only its heartbeat deadline can find it);
//   survivors  `peers - kills` peers, no faults: the tokens the survivors alone would train;
//   state      (two peers of this process) a peer behind taking a GPT-2 124M DiLoCo peer's
//              state over loopback, as a heal does: encode, send in chunks, decode;
//   checkpoint (this process) a GPT-2 124M DiLoCo state saved every --checkpoint-every (60) of
//              --checkpoint-steps (180) steps, synchronously and in the background: how long the
//              training thread is held per save (the last step's save waits for its write in both);
//   join       `--joiners` peers (16) start at once once a 4-peer group has run 10% of its steps,
//              and join it: reported per joiner, start -> admitted (its first view), and the
//              state bytes each member served;
//   churn      `--churn-peers` (5) peers train without end while, every 1-3 s (uniform), one of
//              ranks 1.. chosen at random is kill -9'd and started again at once under its rank
//              (it joins the running group afresh), for `--churn-seconds` (600); rank 0 lives
//              throughout, to watch a long-lived peer's memory. Every peer records at each
//              round's end (step, view, a hash of its parameters, resident memory): reported are
//              rounds whose peers disagree (goal: none; a peer's last report of a round end counts:
//              one it redid after a view change is superseded), the longest time between two round ends
//              on rank 0 (no hang), and rank 0's resident memory after warm-up against the end
//              (goal: within 5%).
//   sim-churn  (this process) the deterministic churn simulator: 5 in-process peers and 2
//              joiners on simulated WAN links, 1 simulated second a step, for `--sim-hours` (8)
//              simulated hours; every 60-180 s one running peer is killed wherever it stands and
//              starts again 10-60 s later. Run twice with the same seed: reported are the kills,
//              views, round ends whose processes disagree (goal: none; each process's last report of
//              a round end counts, as in churn), and whether the two runs
//              are the same (a digest of every process's losses, membership history and
//              parameters at each round end: goal: equal).
// Each peer appends (steady-clock time, step, view epoch) per step to a file the harness reads;
// the harness records when it struck. Reported per fault: strike -> every survivor installed the
// view without the victim (detection and agreement), and strike -> every survivor finished its
// next round (the all-reduce after it: the remaining inner steps included); the clean run's
// round time says what a round costs anyway. The survivors' final validation loss is compared
// with the clean run's (more tokens than the survivors saw) and the survivors run's (the same
// peers, no faults).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "decentrain/decentrain.hpp"
#include "args.hpp"
#include "output_file.hpp"
#include "processes.hpp"

namespace dt = decentrain;
namespace fs = std::filesystem;

namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct settings {
  int peers = 8, kills = 3;
  std::int64_t steps = 600, inner = 10, batch = 8, n_layer = 2, n_embd = 64, block = 64;
  std::uint64_t seed = 1;
  std::int64_t silence_ms = 3000;
  std::string data;  // a text file, or "builtin"
  int joiners = 16;
  bool churn = false;  // a peer of the churn run (trains without end, records rounds)
  bool late = false;   // ... started again: joins through every published address
};

// Resident memory of this process, in KiB (/proc/self/statm).
std::int64_t rss_kib() {
  std::ifstream in("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * (::sysconf(_SC_PAGESIZE) / 1024);
}

// Every peer of a run may take joiners' ranks (the join run's joiners count up from the group's).
constexpr int join_max_world = 64;

// The corpus (characters as tokens) and the model every run trains.
struct corpus_and_model {
  dt::data::token_dataset data;
  dt::nn::gpt_config cfg;
};
corpus_and_model corpus_and_model_of(const settings& s) {
  const std::string text = s.data == "builtin" ? dt::data::builtin_corpus() : dt::io::read_file(s.data);
  auto tok = dt::data::char_tokenizer::from_text(text);
  auto cfg = dt::nn::gpt_preset("tiny");
  cfg.vocab_size = tok.vocab_size();
  cfg.n_layer = s.n_layer;
  cfg.n_embd = s.n_embd;
  cfg.n_head = 4;
  cfg.block_size = s.block;
  return {dt::data::token_dataset(tok.encode(text), 0.1), cfg};
}

// ---- one peer (a process of its own) ----
int peer_main(const settings& s, int rank, int world, const std::string& dir) {
#if defined(_OPENMP)
  omp_set_num_threads(1);
#endif
  auto corpus = corpus_and_model_of(s);  // (not a structured binding: clang 14 cannot capture one)
  auto& data = corpus.data;
  auto& cfg = corpus.cfg;
  dt::train::trainer_options o;
  o.steps = s.steps;
  o.batch_size = s.batch;
  o.seed = s.seed;
  o.eval_batches = 16;
  dt::comm::diloco<> comm;
  comm.inner_steps = s.inner;
  dt::fault::elastic fault;
  fault.agreement.timeout = std::chrono::milliseconds(std::max<std::int64_t>(20000, 4 * s.silence_ms));

  const auto started_ns = now_ns();
  std::unique_ptr<dt::transport::tcp> ep;
  if (s.churn) {
    // Every peer publishes its address (again when it starts again); one started again joins
    // through all of them (the seeds: any live one answers).
    o.steps = std::int64_t{1} << 40;
    dt::transport::tcp_options t;
    t.rank = rank;
    t.world = world;
    t.min_silence = std::chrono::milliseconds(s.silence_ms);
    t.max_world = join_max_world;
    for (int r = 0; r < world; ++r) {
      const std::string f = dir + "/address-" + std::to_string(r);
      if (r == rank || (!s.late && r != 0)) continue;
      if (!s.late)
        while (!fs::exists(f)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!fs::exists(f)) continue;
      std::ifstream in(f);
      t.join.emplace_back();
      std::getline(in, t.join.back());
    }
    ep = std::make_unique<dt::transport::tcp>(t);
    const std::string mine = dir + "/address-" + std::to_string(rank);
    std::ofstream(mine + ".tmp") << ep->address() << '\n';
    fs::rename(mine + ".tmp", mine);
    ep->connect();
  } else {
    ep = bench::loopback_peer(rank, world, dir + "/address", [&](dt::transport::tcp_options& t) {
      t.min_silence = std::chrono::milliseconds(s.silence_ms);
      t.max_world = join_max_world;
    });
  }
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>, dt::parallel::data, dt::fault::elastic>;
  Trainer t(cfg, o, *ep, comm, {}, fault);
  std::ofstream steps(dir + "/peer-" + std::to_string(rank) + ".steps", s.late ? std::ios::app : std::ios::out);
  std::ofstream rounds;
  if (s.churn) rounds.open(dir + "/peer-" + std::to_string(rank) + ".rounds", std::ios::app);
  std::vector<float> flat;
  t.on_step([&](const dt::train::step_metrics& m) {
    steps << now_ns() << ' ' << m.step << ' ' << t.fault().current().epoch << '\n' << std::flush;
    if (s.churn && m.step % s.inner == 0) {  // a round's end: every member holds the same parameters
      dt::comm::gather_values(t.model().parameters(), flat);
      rounds << now_ns() << ' ' << m.step << ' ' << t.fault().current().epoch << ' '
             << dt::detail::hash_words(std::as_bytes(std::span<const float>(flat))) << ' ' << rss_kib() << ' '
             << t.fault().current().members.size() << '\n' << std::flush;
    }
  });
  const auto result = t.fit(data);
  std::ofstream out(dir + "/peer-" + std::to_string(rank) + ".result.tmp");
  out << "val_loss " << result.final_val_loss << '\n';
  out << "started " << started_ns << '\n';
  out << "served " << t.fault().state_bytes_served() << '\n';
  for (const auto& c : t.fault().changes()) {
    out << "view " << c.epoch << ' ' << std::chrono::duration_cast<std::chrono::nanoseconds>(c.installed.time_since_epoch()).count();
    for (int r : c.members) out << ' ' << r;
    out << '\n';
  }
  out.close();
  fs::rename(dir + "/peer-" + std::to_string(rank) + ".result.tmp", dir + "/peer-" + std::to_string(rank) + ".result");
  return 0;
}

// ---- the harness ----
struct strike {
  int victim;
  int signal;
  std::int64_t at_step;  // when the watched peer reached this step...
  int delay_ms;          // ...and this much later
  std::int64_t t_ns = 0;
};

struct row {
  std::int64_t t_ns, step;
  std::uint64_t epoch;
};

std::vector<row> read_steps(const std::string& path) {
  std::vector<row> rows;
  std::ifstream in(path);
  row r{};
  while (in >> r.t_ns >> r.step >> r.epoch) rows.push_back(r);
  return rows;
}

struct peer_result {
  double val_loss = 0;
  std::vector<std::pair<std::int64_t, std::vector<int>>> views;  // (installed ns, members)
  std::int64_t started_ns = 0;
  std::uint64_t served = 0;
};

std::optional<peer_result> read_result(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  peer_result p;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string what;
    l >> what;
    if (what == "val_loss") l >> p.val_loss;
    if (what == "started") l >> p.started_ns;
    if (what == "served") l >> p.served;
    if (what == "view") {
      std::uint64_t epoch = 0;
      std::int64_t t = 0;
      l >> epoch >> t;
      std::vector<int> members;
      for (int r; l >> r;) members.push_back(r);
      p.views.emplace_back(t, members);
    }
  }
  return p;
}

struct run_result {
  std::string name;
  int peers = 0, survivors = 0;
  double val_loss = 0, spread = 0, wall_s = 0, round_s = 0;
  std::vector<strike> strikes;
  std::vector<double> to_view_s, to_round_s;  // per strike
};

struct join_result {
  int members = 0, joiners = 0;
  double val_loss = 0, spread = 0, wall_s = 0;
  std::vector<double> admitted_s;          // per joiner: process start -> its first view installed
  std::map<int, std::uint64_t> served;     // per peer that served state: bytes
};

run_result run(const std::string& name, const settings& s, int peers, std::vector<strike> strikes, const std::string& self,
               int joiners = 0, join_result* joined = nullptr) {
  const std::string dir = (fs::temp_directory_path() / ("decentrain_faults_" + std::to_string(::getpid()) + "_" + name)).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::fprintf(stderr, "running %s (%d peers, %zu faults) ...\n", name.c_str(), peers, strikes.size());
  std::vector<pid_t> pids;
  auto launch = [&](int r) {
    const pid_t pid = ::fork();
    dt::detail::check(pid >= 0, "fork failed");
    if (pid == 0) {
      const std::vector<std::string> a{self, "--role", "peer", "--rank", std::to_string(r), "--world", std::to_string(peers),
                                       "--dir", dir, "--steps", std::to_string(s.steps), "--inner-steps", std::to_string(s.inner),
                                       "--batch-size", std::to_string(s.batch), "--n-layer", std::to_string(s.n_layer),
                                       "--n-embd", std::to_string(s.n_embd), "--block-size", std::to_string(s.block),
                                       "--seed", std::to_string(s.seed), "--silence-ms", std::to_string(s.silence_ms), "--data", s.data};
      std::vector<char*> argv;
      for (const auto& x : a) argv.push_back(const_cast<char*>(x.c_str()));
      argv.push_back(nullptr);
      ::execv(self.c_str(), argv.data());
      std::perror("execv");
      ::_exit(127);
    }
    pids.push_back(pid);
  };
  for (int r = 0; r < peers; ++r) launch(r);
  const auto t0 = std::chrono::steady_clock::now();
  const auto limit = std::chrono::minutes(20);
  std::string failure;
  if (joiners > 0) {  // once peer 0 has done 10% of the steps, every joiner at once
    while (failure.empty()) {
      const auto rows = read_steps(dir + "/peer-0.steps");
      if (!rows.empty() && rows.back().step >= s.steps / 10) break;
      if (std::chrono::steady_clock::now() - t0 > limit) failure = "timed out before the joiners";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::fprintf(stderr, "  %d joiners start\n", joiners);
    for (int j = 0; j < joiners; ++j) launch(peers + j);
    peers += joiners;
  }
  std::vector<bool> struck(static_cast<std::size_t>(peers), false), done(static_cast<std::size_t>(peers), false);
  for (auto& k : strikes) {
    // Watch a peer that is not struck at all in this run.
    int watch = 0;
    while (std::any_of(strikes.begin(), strikes.end(), [&](const strike& x) { return x.victim == watch; })) ++watch;
    while (failure.empty()) {
      const auto rows = read_steps(dir + "/peer-" + std::to_string(watch) + ".steps");
      if (!rows.empty() && rows.back().step >= k.at_step) break;
      if (std::chrono::steady_clock::now() - t0 > limit) failure = "timed out before a strike";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(k.delay_ms));
    k.t_ns = now_ns();
    ::kill(pids[static_cast<std::size_t>(k.victim)], k.signal);
    struck[static_cast<std::size_t>(k.victim)] = true;
    std::fprintf(stderr, "  %s peer %d at step %lld + %d ms\n", k.signal == SIGKILL ? "kill -9" : "SIGSTOP", k.victim,
                 static_cast<long long>(k.at_step), k.delay_ms);
  }
  // The survivors must finish on their own.
  for (;;) {
    bool all = true;
    for (int r = 0; r < peers; ++r) {
      auto& p = pids[static_cast<std::size_t>(r)];
      if (struck[static_cast<std::size_t>(r)] || done[static_cast<std::size_t>(r)]) continue;
      int status = 0;
      if (::waitpid(p, &status, WNOHANG) == p) {
        done[static_cast<std::size_t>(r)] = true;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
          failure = "survivor " + std::to_string(r) + " failed (status " + std::to_string(status) + ")";
      } else {
        all = false;
      }
    }
    if (all || !failure.empty()) break;
    if (std::chrono::steady_clock::now() - t0 > limit) {
      failure = "survivors did not finish within 20 minutes";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < peers; ++r) {
    if (done[static_cast<std::size_t>(r)]) continue;
    ::kill(pids[static_cast<std::size_t>(r)], SIGKILL);
    ::waitpid(pids[static_cast<std::size_t>(r)], nullptr, 0);
  }
  dt::detail::check(failure.empty(), name, ": ", failure, " (files in ", dir, ")");

  run_result out;
  out.name = name;
  out.peers = peers;
  out.strikes = strikes;
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<int> survivors;
  for (int r = 0; r < peers; ++r)
    if (!struck[static_cast<std::size_t>(r)]) survivors.push_back(r);
  out.survivors = static_cast<int>(survivors.size());
  std::map<int, peer_result> results;
  std::map<int, std::vector<row>> rows;
  for (int r : survivors) {
    auto p = read_result(dir + "/peer-" + std::to_string(r) + ".result");
    dt::detail::check(p.has_value(), name, ": survivor ", r, " wrote no result");
    results[r] = *p;
    rows[r] = read_steps(dir + "/peer-" + std::to_string(r) + ".steps");
  }
  out.val_loss = results.begin()->second.val_loss;
  for (const auto& [r, p] : results) out.spread = std::max(out.spread, std::abs(p.val_loss - out.val_loss));
  if (joined) {
    joined->members = peers - joiners;
    joined->joiners = joiners;
    joined->val_loss = out.val_loss;
    joined->spread = out.spread;
    joined->wall_s = out.wall_s;
    for (const auto& [r, p] : results) {
      if (p.served > 0) joined->served[r] = p.served;
      if (r < peers - joiners) continue;
      dt::detail::check(!p.views.empty(), name, ": joiner ", r, " recorded no view");
      joined->admitted_s.push_back(static_cast<double>(p.views.front().first - p.started_ns) * 1e-9);
    }
  }
  // A round's time on the first survivor: the median gap between round-ending steps without a fault.
  {
    std::vector<double> gaps;
    std::int64_t last = -1;
    for (const auto& x : rows.begin()->second)
      if (x.step % s.inner == 0) {
        if (last >= 0) gaps.push_back(static_cast<double>(x.t_ns - last) * 1e-9);
        last = x.t_ns;
      }
    if (!gaps.empty()) {
      std::nth_element(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2), gaps.end());
      out.round_s = gaps[gaps.size() / 2];
    }
  }
  for (const auto& k : strikes) {
    double to_view = 0, to_round = 0;
    for (int r : survivors) {
      // The first view this survivor installed without the victim.
      std::int64_t installed = -1;
      for (const auto& [t, members] : results[r].views)
        if (t >= k.t_ns && std::find(members.begin(), members.end(), k.victim) == members.end()) {
          installed = t;
          break;
        }
      dt::detail::check(installed >= 0, name, ": survivor ", r, " never left out peer ", k.victim);
      to_view = std::max(to_view, static_cast<double>(installed - k.t_ns) * 1e-9);
      // Its first round finished after that.
      std::int64_t round_done = -1;
      for (const auto& x : rows[r])
        if (x.t_ns >= installed && x.step % s.inner == 0) {
          round_done = x.t_ns;
          break;
        }
      if (round_done >= 0) to_round = std::max(to_round, static_cast<double>(round_done - k.t_ns) * 1e-9);
    }
    out.to_view_s.push_back(to_view);
    out.to_round_s.push_back(to_round);
  }
  fs::remove_all(dir);
  std::fprintf(stderr, "  %s: val loss %.4f (spread %.1e) on %d survivors, %.1f s\n", name.c_str(), out.val_loss, out.spread,
               out.survivors, out.wall_s);
  return out;
}

// ---- churn ----
// Whether the parameter hashes that peers (or processes) reported for one round end differ.
template <class Key>
bool differ(const std::map<Key, std::uint64_t>& hashes) {
  return std::any_of(hashes.begin(), hashes.end(), [&](const auto& e) { return e.second != hashes.begin()->second; });
}

struct churn_result {
  int peers = 0;
  double seconds = 0;
  int kills = 0, rounds = 0, disagreeing = 0;   // round ends seen by two or more peers, and those that differ
  int redone = 0;                               // round ends a peer reported again (the first did not stand)
  double round_s = 0, longest_gap_s = 0;        // rank 0: median and longest time between round ends
  std::int64_t rss_warm_kib = 0, rss_end_kib = 0, rss_max_kib = 0;  // rank 0, after warm-up and at the end
  std::vector<std::int64_t> rss_tenths_kib;                          // rank 0, the median of each tenth of the run
  std::int64_t last_step = 0;
};

churn_result churn(const settings& s, int peers, double seconds, const std::string& self) {
  const std::string dir = (fs::temp_directory_path() / ("decentrain_faults_" + std::to_string(::getpid()) + "_churn")).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::fprintf(stderr, "running churn (%d peers, %.0f s) ...\n", peers, seconds);
  std::vector<pid_t> pids(static_cast<std::size_t>(peers), 0);
  auto launch = [&](int r, bool late) {
    const pid_t pid = ::fork();
    dt::detail::check(pid >= 0, "fork failed");
    if (pid == 0) {
      const std::vector<std::string> a{self, "--role", "peer", "--churn", "1", "--late", late ? "1" : "0", "--rank",
                                       std::to_string(r), "--world", std::to_string(peers), "--dir", dir, "--inner-steps",
                                       std::to_string(s.inner), "--batch-size", std::to_string(s.batch), "--n-layer",
                                       std::to_string(s.n_layer), "--n-embd", std::to_string(s.n_embd), "--block-size",
                                       std::to_string(s.block), "--seed", std::to_string(s.seed), "--silence-ms",
                                       std::to_string(s.silence_ms), "--data", s.data};
      std::vector<char*> argv;
      for (const auto& x : a) argv.push_back(const_cast<char*>(x.c_str()));
      argv.push_back(nullptr);
      ::execv(self.c_str(), argv.data());
      std::perror("execv");
      ::_exit(127);
    }
    pids[static_cast<std::size_t>(r)] = pid;
  };
  for (int r = 0; r < peers; ++r) launch(r, false);
  std::mt19937_64 rng(s.seed);
  std::uniform_int_distribution<int> pause_ms(1000, 3000), victim(1, peers - 1);
  churn_result out;
  out.peers = peers;
  std::string failure;
  auto exited = [&] {  // a peer that exited by itself failed (they never finish)
    for (int r = 0; r < peers && failure.empty(); ++r) {
      int status = 0;
      if (::waitpid(pids[static_cast<std::size_t>(r)], &status, WNOHANG) == pids[static_cast<std::size_t>(r)])
        failure = "peer " + std::to_string(r) + " exited by itself (status " + std::to_string(status) + ")";
    }
  };
  // Warm-up: every peer through its first round.
  const auto t0 = std::chrono::steady_clock::now();
  while (failure.empty()) {
    bool all = true;
    for (int r = 0; r < peers; ++r) all = all && fs::exists(dir + "/peer-" + std::to_string(r) + ".rounds");
    if (all) break;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::minutes(2)) failure = "the group did not finish a round in 2 minutes";
    exited();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto start = std::chrono::steady_clock::now();
  const std::int64_t start_ns = now_ns();
  while (failure.empty() && std::chrono::steady_clock::now() - start < std::chrono::duration<double>(seconds)) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(pause_ms(rng));
    while (failure.empty() && std::chrono::steady_clock::now() < until) {
      exited();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!failure.empty()) break;
    const int r = victim(rng);
    ::kill(pids[static_cast<std::size_t>(r)], SIGKILL);
    ::waitpid(pids[static_cast<std::size_t>(r)], nullptr, 0);
    ++out.kills;
    launch(r, true);
  }
  const std::int64_t end_ns = now_ns();
  for (auto p : pids) {
    ::kill(p, SIGKILL);
    ::waitpid(p, nullptr, 0);
  }
  dt::detail::check(failure.empty(), "churn: ", failure, " (files in ", dir, ")");
  out.seconds = static_cast<double>(end_ns - start_ns) * 1e-9;

  // Every peer's round ends: (step, epoch) -> the hashes seen.
  struct round_row {
    std::int64_t t_ns, step;
    std::uint64_t epoch, hash;
    std::int64_t rss;
    int members;
  };
  // step -> rank -> the hash of the rank's last report of that step: a round end a peer redid
  // (the group went back to a position more members reached, see fault/elastic.hpp) is
  // superseded by the one that stood.
  std::map<std::int64_t, std::map<int, std::uint64_t>> last;
  std::vector<round_row> rank0;
  for (int r = 0; r < peers; ++r) {
    std::ifstream in(dir + "/peer-" + std::to_string(r) + ".rounds");
    round_row x{};
    while (in >> x.t_ns >> x.step >> x.epoch >> x.hash >> x.rss >> x.members) {
      if (x.t_ns < start_ns || x.t_ns > end_ns) {
        if (r == 0 && x.t_ns < start_ns) rank0.clear();
        if (x.t_ns > end_ns) continue;
      }
      if (!last[x.step].insert_or_assign(r, x.hash).second) ++out.redone;
      if (r == 0) rank0.push_back(x);
    }
  }
  for (const auto& [step, by_rank] : last) {
    if (by_rank.size() < 2) continue;
    ++out.rounds;
    if (differ(by_rank)) ++out.disagreeing;
  }
  std::vector<double> gaps;
  for (std::size_t i = 1; i < rank0.size(); ++i) gaps.push_back(static_cast<double>(rank0[i].t_ns - rank0[i - 1].t_ns) * 1e-9);
  if (!gaps.empty()) {
    out.longest_gap_s = *std::max_element(gaps.begin(), gaps.end());
    std::nth_element(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2), gaps.end());
    out.round_s = gaps[gaps.size() / 2];
  }
  // Rank 0's memory: the median of its first minute after warm-up against its last minute's.
  auto median_rss = [&](std::int64_t from, std::int64_t to) {
    std::vector<std::int64_t> v;
    for (const auto& x : rank0)
      if (x.t_ns >= from && x.t_ns < to) v.push_back(x.rss);
    if (v.empty()) return std::int64_t{0};
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  const std::int64_t minute = std::min<std::int64_t>(60'000'000'000LL, (end_ns - start_ns) / 4);
  out.rss_warm_kib = median_rss(start_ns, start_ns + minute);
  out.rss_end_kib = median_rss(end_ns - minute, end_ns + 1);
  for (const auto& x : rank0) out.rss_max_kib = std::max(out.rss_max_kib, x.rss);
  for (int k = 0; k < 10; ++k)
    out.rss_tenths_kib.push_back(median_rss(start_ns + (end_ns - start_ns) * k / 10, start_ns + (end_ns - start_ns) * (k + 1) / 10));
  out.last_step = rank0.empty() ? 0 : rank0.back().step;
  fs::remove_all(dir);
  return out;
}

// A peer behind taking the state of a GPT-2 124M DiLoCo peer (parameters, AdamW's two moments,
// DiLoCo's global copy and outer momentum: five f32 values per parameter) from a donor over
// loopback, as fault::elastic heals: the donor encodes its state in place (its checksum, its
// tensors' bytes read where they lie), sends it in chunks, and the peer behind decodes it over
// its own state (allocated and written before the clock starts, as a joiner's model is built
// before it joins).
struct state_result {
  double gigabytes = 0, encode_s = 0, transfer_s = 0, decode_s = 0, total_s = 0;
};

state_result measure_state() {
  const auto cfg = dt::nn::gpt_preset("gpt2-124m");
  const std::int64_t n = cfg.parameter_count();
  std::fprintf(stderr, "running state (GPT-2 124M: %lld parameters x 5 tensors) ...\n", static_cast<long long>(n));
  dt::io::checkpoint ck, mine;
  std::uint32_t x = 1;
  for (const char* name : {"model", "adamw.m", "adamw.v", "diloco.global", "diloco.momentum"}) {
    auto t = dt::tensor<dt::cpu>::empty(dt::shape({n}));
    float* p = t.data<float>();
    for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<float>((x = x * 1664525u + 1013904223u) >> 8) * 1e-7f;
    ck.tensors[name] = t;
    mine.tensors[name] = dt::zeros<dt::cpu>(dt::shape({n}));
  }
  dt::transport::tcp_options o0;
  o0.world = 2;
  auto o1 = o0;
  o1.rank = 1;
  dt::transport::tcp peer0(o0);
  o1.join = {peer0.address()};
  dt::fault::decision d;
  d.next = dt::fault::view{1, {0, 1}, {}};
  d.donor = 0;
  d.behind = {1};
  const dt::fault::agreement_settings a;
  state_result r;
  r.gigabytes = 5.0 * static_cast<double>(n) * 4 / 1e9;
  std::thread donor([&] {
    peer0.connect();
    (void)dt::fault::transfer_state(peer0, d, [&] {
      const auto t0 = std::chrono::steady_clock::now();
      dt::io::encoded_checkpoint blob(ck);
      r.encode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return blob;
    }, a);
  });
  auto peer1 = dt::transport::tcp::join(o1);
  const auto t0 = std::chrono::steady_clock::now();
  bool torn = false;
  auto got = dt::fault::transfer_state(
      peer1, d, []() -> dt::io::encoded_checkpoint { dt::detail::fail("state: peer 1 is no donor"); }, a, [&] { return mine; }, &torn);
  const auto t1 = std::chrono::steady_clock::now();
  const auto back = dt::io::decode_checkpoint(got.state->pieces(), "the donor's state", got.state->into());
  const auto t2 = std::chrono::steady_clock::now();
  donor.join();
  dt::detail::check(got.state->in_place() && torn, "state: the state did not land in place");
  dt::detail::check(back.tensors.size() == 5, "state: the decoded state differs");
  for (const auto& [name, t] : ck.tensors)
    dt::detail::check(back.tensor_at(name).shares_storage_with(mine.tensors.at(name)) &&
                          std::memcmp(t.raw_data(), mine.tensors.at(name).raw_data(), t.nbytes()) == 0,
                      "state: ", name, " was not decoded in place, or differs from the donor's");
  r.decode_s = std::chrono::duration<double>(t2 - t1).count();
  r.transfer_s = std::chrono::duration<double>(t1 - t0).count() - r.encode_s;
  r.total_s = std::chrono::duration<double>(t2 - t0).count();
  std::fprintf(stderr, "  state: %.2f GB in %.2f s (encode %.2f, send %.2f, decode %.2f)\n", r.gigabytes, r.total_s, r.encode_s,
               r.transfer_s, r.decode_s);
  return r;
}

// Checkpoints of a GPT-2 124M DiLoCo state (the five tensors above) every `every` of `steps`
// steps, written by fault::checkpoint_every to `dir`: synchronously (the training thread encodes
// and writes, as before background writes; the reference) and in the background. A "step" is the
// training thread's memory-bound work on the state (an AdamW-like pass over its tensors: it
// changes the very values the writer is saving, which is why capture copies them first). Per
// mode: the step time without saves, the time the training thread was held per save, and the
// whole run; the last checkpoint is loaded back and compared with the state it captured.
struct checkpoint_mode {
  std::string name;
  double wall_s = 0, step_s = 0, held_per_save_s = 0, last_save_s = 0;
  int saves = 0;  // before the last step's (which waits for its write in every mode)
};
struct checkpoint_result {
  double gigabytes = 0;
  std::int64_t steps = 0, every = 0;
  std::vector<checkpoint_mode> modes;
};

checkpoint_result measure_checkpoints(std::int64_t steps, std::int64_t every) {
  const std::int64_t n = dt::nn::gpt_preset("gpt2-124m").parameter_count();
  std::fprintf(stderr, "running checkpoint (GPT-2 124M DiLoCo state, %lld steps, a save every %lld) ...\n",
               static_cast<long long>(steps), static_cast<long long>(every));
  std::map<std::string, dt::tensor<dt::cpu>> state;
  for (const char* name : {"model", "adamw.m", "adamw.v", "diloco.global", "diloco.momentum"}) {
    auto t = dt::tensor<dt::cpu>::empty(dt::shape({n}));
    std::fill_n(t.data<float>(), n, 0.5f);
    state[name] = t;
  }
  struct fake_ctx {
    std::map<std::string, dt::tensor<dt::cpu>>* state;
    std::int64_t steps_done = 0;
    bool last_step = false;
    dt::io::checkpoint capture() const {
      dt::io::checkpoint c;
      for (const auto& [k, t] : *state) c.tensors[k] = t.clone();
      c.counters["step"] = steps_done;
      return c;
    }
  };
  auto work = [&] {  // one step's pass over the state
    float* w = state["model"].data<float>();
    float* m = state["adamw.m"].data<float>();
    float* v = state["adamw.v"].data<float>();
    for (std::int64_t i = 0; i < n; ++i) {
      m[i] = 0.9f * m[i] + 0.1f * w[i];
      v[i] = 0.999f * v[i] + 0.001f * w[i] * w[i];
      w[i] -= 1e-4f * m[i] / (std::sqrt(v[i]) + 1e-8f);
    }
  };
  checkpoint_result out;
  out.gigabytes = 5.0 * static_cast<double>(n) * 4 / 1e9;
  out.steps = steps;
  out.every = every;
  const auto dir = fs::temp_directory_path() / "decentrain_bench_checkpoints";
  for (const char* mode : {"none", "synchronous", "background"}) {
    fs::remove_all(dir);
    dt::fault::checkpoint_every ck;
    ck.dir = dir.string();
    ck.every = std::string(mode) == "none" ? 0 : every;
    ck.background = std::string(mode) == "background";
    ck.open(0, 1);
    fake_ctx ctx{&state};
    checkpoint_mode r{mode};
    double work_s = 0, held_s = 0, last_s = 0;
    std::optional<dt::io::checkpoint> last_captured;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < steps; ++i) {
      auto a = std::chrono::steady_clock::now();
      work();
      auto b = std::chrono::steady_clock::now();
      work_s += std::chrono::duration<double>(b - a).count();
      ctx.steps_done = i + 1;
      ctx.last_step = i + 1 == steps;
      if (ck.due(ctx)) {
        if (ctx.last_step) last_captured = ctx.capture();
        ck.save_as(ctx, 0, 1);
        const double held = std::chrono::duration<double>(std::chrono::steady_clock::now() - b).count();
        if (ctx.last_step) last_s = held;
        else held_s += held, ++r.saves;
      }
    }
    ck.wait();
    r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.step_s = work_s / static_cast<double>(steps);
    r.held_per_save_s = r.saves ? held_s / r.saves : 0;
    r.last_save_s = last_s;
    if (last_captured) {  // the file holds what was captured, bit for bit
      const auto back = dt::io::load_checkpoint(ck.file(0, 1, steps));
      for (const auto& [k, t] : last_captured->tensors)
        dt::detail::check(std::memcmp(back.tensor_at(k).data<float>(), t.data<float>(), static_cast<std::size_t>(n) * 4) == 0,
                          "checkpoint: ", k, " differs from the state captured");
    }
    std::fprintf(stderr, "  %s: %.2f s, step %.3f s, held %.3f s per save (%d saves), last save %.3f s\n", mode, r.wall_s,
                 r.step_s, r.held_per_save_s, r.saves, r.last_save_s);
    out.modes.push_back(r);
  }
  fs::remove_all(dir);
  return out;
}

}  // namespace

// ---- the deterministic churn simulator (in_process, simulated time) ----
struct sim_result {
  double hours = 0, wall_s = 0;
  std::size_t kills = 0, starts = 0, processes = 0, finished = 0, views = 0;
  std::size_t round_ends = 0, disagreeing = 0;  // round ends seen by two or more processes; with different parameters
  std::size_t redone = 0;                        // round ends a process reported again (the first did not stand)
  std::uint64_t digest = 0;  // of every process's losses, membership history and final parameters
  double val_loss = 0;
};

sim_result simulate_churn(const settings& s, double hours, int peers, int joiners) {
  const auto t0 = std::chrono::steady_clock::now();
  auto corpus = corpus_and_model_of(s);  // (not a structured binding: clang 14 cannot capture one)
  auto& data = corpus.data;
  auto& cfg = corpus.cfg;
  dt::transport::random_churn churn;
  churn.peers = peers;
  churn.joiners = joiners;
  churn.seconds = hours * 3600 * 0.95;  // the last minutes without churn: the joiners still get in
  churn.every_min_s = 60;
  churn.every_max_s = 180;
  churn.down_min_s = 10;
  churn.down_max_s = 60;
  churn.min_alive = peers / 2 + 1;
  dt::transport::in_process::options o;
  o.seed = s.seed;
  o.peers_fail_alone = true;
  o.initial_peers = peers;
  o.deterministic = dt::transport::in_process::deterministic_run{1.0, churn.make(s.seed)};
  sim_result out;
  out.hours = hours;
  for (const auto& e : o.deterministic->churn) (e.what == dt::transport::churn_event::kind::kill ? out.kills : out.starts)++;
  dt::transport::in_process net(dt::transport::links::wan(peers + joiners), o);
  dt::train::trainer_options opts;
  opts.steps = static_cast<std::int64_t>(hours * 3600);  // a step is 1 simulated second
  opts.batch_size = s.batch;
  opts.seed = s.seed;
  opts.eval_batches = 4;
  dt::comm::diloco<> comm;
  comm.inner_steps = s.inner;
  dt::fault::elastic fault;
  fault.agreement.timeout = std::chrono::milliseconds(20000);
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::diloco<>, dt::parallel::data, dt::fault::elastic>;
  std::mutex m;
  // step -> process -> the parameters' hash at its last report of that step (a round end a
  // process redid is superseded by the one that stood), and what each process reported there
  std::map<std::int64_t, std::map<std::pair<int, std::uint64_t>, std::uint64_t>> rounds;
  std::map<std::int64_t, std::string> who;  // step -> " rank.process:hash@view" per report
  std::map<std::pair<int, std::uint64_t>, std::uint64_t> digests;
  double loss_sum = 0;
  net.run([&](dt::transport::in_process::endpoint& ep) {
    const auto key = std::pair{ep.rank(), net.restarts(ep.rank())};
    std::uint64_t h = dt::detail::xxh3(std::string_view("process"));
    auto mix = [&](const void* p, std::size_t n) {
      h ^= dt::detail::xxh3(std::string_view(static_cast<const char*>(p), n)) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    };
    Trainer t(cfg, opts, ep, comm, {}, fault);
    t.on_step([&](const dt::train::step_metrics& x) {
      mix(&x.step, sizeof x.step);
      mix(&x.loss, sizeof x.loss);
      if (x.step % s.inner != 0) return;
      std::vector<float> flat;
      dt::comm::gather_values(t.model().parameters(), flat);
      const auto ph = dt::detail::xxh3(std::string_view(reinterpret_cast<const char*>(flat.data()), flat.size() * sizeof(float)));
      mix(&ph, sizeof ph);
      std::lock_guard lock(m);
      if (!rounds[x.step].insert_or_assign(key, ph).second) ++out.redone;
      char line[96];
      std::snprintf(line, sizeof line, " %d.%llu:%016llx@%lld", key.first, static_cast<unsigned long long>(key.second),
                    static_cast<unsigned long long>(ph), static_cast<long long>(t.fault().current().epoch));
      who[x.step] += line;
    });
    auto keep = [&](bool finished, double val) {
      for (const auto& c : t.fault().changes()) {
        mix(&c.epoch, sizeof c.epoch);
        mix(c.members.data(), c.members.size() * sizeof(int));
        mix(&c.step, sizeof c.step);
        mix(c.cause.data(), c.cause.size());
      }
      std::lock_guard lock(m);
      digests[key] = h;
      out.views = std::max<std::size_t>(out.views, static_cast<std::size_t>(t.fault().current().epoch));
      if (finished) ++out.finished, loss_sum += val;
    };
    try {
      const auto r = t.fit(data);
      keep(true, r.final_val_loss);
    } catch (...) {
      keep(false, 0);
      throw;
    }
  });
  for (const auto& [k, d] : digests) {
    out.digest ^= dt::detail::xxh3(std::string_view(reinterpret_cast<const char*>(&d), sizeof d)) + static_cast<std::uint64_t>(k.first) * 131 + k.second;
    ++out.processes;
  }
  for (const auto& [step, by_process] : rounds)
    if (by_process.size() >= 2) {
      ++out.round_ends;
      if (differ(by_process) && ++out.disagreeing <= 3)
        std::fprintf(stderr, "sim-churn: step %lld ends with different parameters (rank.process:hash@view):%s\n",
                     static_cast<long long>(step), who[step].c_str());
    }
  out.val_loss = out.finished ? loss_sum / static_cast<double>(out.finished) : 0;
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

int main(int argc, char** argv) try {
  bench::args cli(argc, argv, "usage: bench_faults [--flag value]...");
  settings s;
  const std::string role = cli.value("role", "harness");
  s.peers = std::stoi(cli.value("peers", "8"));
  s.kills = std::stoi(cli.value("kills", "3"));
  s.steps = std::stoll(cli.value("steps", "600"));
  s.inner = std::stoll(cli.value("inner-steps", "10"));
  s.batch = std::stoll(cli.value("batch-size", "8"));
  s.n_layer = std::stoll(cli.value("n-layer", "2"));
  s.n_embd = std::stoll(cli.value("n-embd", "64"));
  s.block = std::stoll(cli.value("block-size", "64"));
  s.seed = std::stoull(cli.value("seed", "1"));
  s.silence_ms = std::stoll(cli.value("silence-ms", "3000"));
  s.data = cli.value("data", DECENTRAIN_SOURCE_DIR "/../shared/data/tinyshakespeare.txt");
  s.joiners = std::stoi(cli.value("joiners", "16"));
  s.churn = cli.value("churn", "0") == "1";
  s.late = cli.value("late", "0") == "1";
  const double churn_seconds = std::stod(cli.value("churn-seconds", "600"));
  const int churn_peers = std::stoi(cli.value("churn-peers", "5"));
  const double sim_hours = std::stod(cli.value("sim-hours", "8"));
  const std::int64_t ck_steps = std::stoll(cli.value("checkpoint-steps", "180"));
  const std::int64_t ck_every = std::stoll(cli.value("checkpoint-every", "60"));
  if (role == "peer") {
    const int rank = std::stoi(cli.value("rank", "0")), world = std::stoi(cli.value("world", "1"));
    const std::string dir = cli.value("dir", "");
    cli.finish();
    return peer_main(s, rank, world, dir);
  }
  const std::string json_path = cli.value("json", "faults.json");
  std::vector<std::string> only;
  {
    std::stringstream in(cli.value("only", "clean,kill,stop,survivors,state"));
    for (std::string item; std::getline(in, item, ',');) only.push_back(item);
  }
  cli.finish();
  dt::detail::check(s.peers >= 3 && s.kills >= 1 && 2 * (s.peers - s.kills) > s.peers, "bench_faults: --kills ", s.kills,
                    " of --peers ", s.peers, " must leave a majority");
  const std::string self = fs::canonical("/proc/self/exe").string();
  auto wanted = [&](const char* n) { return std::find(only.begin(), only.end(), n) != only.end(); };

  std::mt19937_64 rng(s.seed);
  std::vector<strike> kills;
  {
    std::vector<int> ranks(static_cast<std::size_t>(s.peers));
    for (int r = 0; r < s.peers; ++r) ranks[static_cast<std::size_t>(r)] = r;
    std::shuffle(ranks.begin(), ranks.end(), rng);
    std::uniform_int_distribution<std::int64_t> step(s.steps / 10, s.steps * 8 / 10);
    std::uniform_int_distribution<int> delay(0, 300);
    for (int k = 0; k < s.kills; ++k) kills.push_back({ranks[static_cast<std::size_t>(k)], SIGKILL, step(rng), delay(rng)});
    std::sort(kills.begin(), kills.end(), [](const strike& a, const strike& b) { return a.at_step < b.at_step; });
  }
  std::vector<run_result> runs;
  if (wanted("clean")) runs.push_back(run("clean", s, s.peers, {}, self));
  if (wanted("kill")) runs.push_back(run("kill", s, s.peers, kills, self));
  if (wanted("stop")) runs.push_back(run("stop", s, s.peers, {{kills.front().victim, SIGSTOP, s.steps / 2, 100}}, self));
  if (wanted("survivors")) runs.push_back(run("survivors", s, s.peers - s.kills, {}, self));
  std::optional<state_result> state;
  if (wanted("state")) state = measure_state();
  std::optional<checkpoint_result> checkpoints;
  if (wanted("checkpoint")) checkpoints = measure_checkpoints(ck_steps, ck_every);
  std::optional<join_result> join;
  if (wanted("join")) {
    dt::detail::check(s.joiners >= 1 && 4 + s.joiners <= join_max_world, "bench_faults: --joiners must be in [1, ",
                      join_max_world - 4, "]");
    join.emplace();
    (void)run("join", s, 4, {}, self, s.joiners, &*join);
  }
  std::optional<churn_result> churned;
  if (wanted("churn")) {
    dt::detail::check(churn_peers >= 3 && churn_peers <= join_max_world && churn_seconds > 0,
                      "bench_faults: --churn-peers must be in [3, ", join_max_world, "] and --churn-seconds > 0");
    churned = churn(s, churn_peers, churn_seconds, self);
  }

  std::optional<std::pair<sim_result, sim_result>> sim;
  if (wanted("sim-churn")) {
    dt::detail::check(sim_hours > 0, "bench_faults: --sim-hours must be > 0");
    sim.emplace(simulate_churn(s, sim_hours, 5, 2), simulate_churn(s, sim_hours, 5, 2));
  }

  const run_result* clean = nullptr;
  const run_result* alone = nullptr;
  for (const auto& r : runs) {
    if (r.name == "clean") clean = &r;
    if (r.name == "survivors") alone = &r;
  }
  if (!runs.empty()) {
    std::printf("\nbench/faults (seed %llu): %d TCP peers on 127.0.0.1, DiLoCo H = %lld, %lld steps, model %lld layers x %lld, "
                "silence floor %lld ms\n",
                static_cast<unsigned long long>(s.seed), s.peers, static_cast<long long>(s.inner), static_cast<long long>(s.steps),
                static_cast<long long>(s.n_layer), static_cast<long long>(s.n_embd), static_cast<long long>(s.silence_ms));
    std::printf("%-10s %6s %10s %12s %14s %9s %8s  %s\n", "run", "peers", "val loss", "vs clean", "vs survivors", "round s",
                "wall s", "faults: strike -> view / -> next round");
  }
  for (const auto& r : runs) {
    std::string faults;
    for (std::size_t i = 0; i < r.strikes.size(); ++i) {
      char b[160];
      std::snprintf(b, sizeof b, "%s%s %d: %.3f s / %.3f s", faults.empty() ? "" : "; ",
                    r.strikes[i].signal == SIGKILL ? "kill -9" : "SIGSTOP", r.strikes[i].victim, r.to_view_s[i], r.to_round_s[i]);
      faults += b;
    }
    std::printf("%-10s %2d->%-2d %10.4f %12s %14s %9.3f %8.1f  %s\n", r.name.c_str(), r.peers, r.survivors, r.val_loss,
                clean ? (std::to_string(r.val_loss / clean->val_loss)).substr(0, 6).c_str() : "-",
                alone ? (std::to_string(r.val_loss / alone->val_loss)).substr(0, 6).c_str() : "-", r.round_s, r.wall_s,
                faults.empty() ? "none" : faults.c_str());
  }

  if (state)
    std::printf("\nheal, GPT-2 124M DiLoCo state (%.2f GB) over loopback: %.2f s (encode %.2f s, send %.2f s = %.2f GB/s, "
                "decode %.2f s)\n",
                state->gigabytes, state->total_s, state->encode_s, state->transfer_s, state->gigabytes / state->transfer_s,
                state->decode_s);

  if (checkpoints) {
    std::printf("\ncheckpoints, GPT-2 124M DiLoCo state (%.2f GB), a save every %lld of %lld steps:\n", checkpoints->gigabytes,
                static_cast<long long>(checkpoints->every), static_cast<long long>(checkpoints->steps));
    std::printf("%-12s %8s %10s %16s %12s %10s\n", "writes", "wall s", "step s", "held per save s", "last save s", "vs none");
    const double none = checkpoints->modes.front().wall_s;
    for (const auto& m : checkpoints->modes)
      std::printf("%-12s %8.2f %10.3f %16.3f %12.3f %9.2fx\n", m.name.c_str(), m.wall_s, m.step_s, m.held_per_save_s,
                  m.last_save_s, m.wall_s / none);
  }

  if (join) {
    auto sorted = join->admitted_s;
    std::sort(sorted.begin(), sorted.end());
    std::uint64_t total = 0, most = 0;
    for (const auto& [r, b] : join->served) total += b, most = std::max(most, b);
    const double mean = join->served.empty() ? 0 : static_cast<double>(total) / static_cast<double>(join->served.size());
    std::printf("\njoin: %d peers join a running group of %d at once: all admitted; start -> admitted: first %.2f s, median "
                "%.2f s, last %.2f s; val loss %.4f (spread %.1e), %.1f s\n",
                join->joiners, join->members, sorted.front(), sorted[sorted.size() / 2], sorted.back(), join->val_loss,
                join->spread, join->wall_s);
    std::printf("state served by %zu donors: mean %.2f MB, most %.2f MB (%.2fx the mean)\n", join->served.size(), mean / 1e6,
                static_cast<double>(most) / 1e6, mean > 0 ? static_cast<double>(most) / mean : 0.0);
    for (const auto& [r, b] : join->served) std::printf("  peer %d served %.2f MB\n", r, static_cast<double>(b) / 1e6);
  }

  dt::train::json_line root;
  root.add("benchmark", "faults");
  root.add("peers", s.peers);
  root.add("steps", s.steps);
  root.add("inner_steps", s.inner);
  root.add("silence_ms", s.silence_ms);
  root.add("seed", s.seed);
  std::string list = "[";
  for (const auto& r : runs) {
    dt::train::json_line j;
    j.add("run", r.name);
    j.add("peers", r.peers);
    j.add("survivors", r.survivors);
    j.add("val_loss", r.val_loss);
    j.add("val_loss_spread", r.spread);
    j.add("round_s", r.round_s);
    j.add("wall_s", r.wall_s);
    std::string f = "[";
    for (std::size_t i = 0; i < r.strikes.size(); ++i) {
      dt::train::json_line x;
      x.add("signal", r.strikes[i].signal == SIGKILL ? "SIGKILL" : "SIGSTOP");
      x.add("victim", r.strikes[i].victim);
      x.add("at_step", r.strikes[i].at_step);
      x.add("strike_to_view_s", r.to_view_s[i]);
      x.add("strike_to_next_round_s", r.to_round_s[i]);
      f += (i ? "," : "") + x.str();
    }
    j.add_json("faults", f + "]");
    list += (list.size() > 1 ? "," : "") + j.str();
  }
  root.add_json("runs", list + "]");
  if (state) {
    dt::train::json_line j;
    j.add("model", "gpt2-124m");
    j.add("gigabytes", state->gigabytes);
    j.add("encode_s", state->encode_s);
    j.add("send_s", state->transfer_s);
    j.add("decode_s", state->decode_s);
    j.add("total_s", state->total_s);
    root.add_json("heal_124m", j.str());
  }
  if (checkpoints) {
    dt::train::json_line j;
    j.add("model", "gpt2-124m");
    j.add("gigabytes", checkpoints->gigabytes);
    j.add("steps", checkpoints->steps);
    j.add("every", checkpoints->every);
    std::string m = "[";
    for (const auto& x : checkpoints->modes) {
      dt::train::json_line y;
      y.add("writes", x.name);
      y.add("wall_s", x.wall_s);
      y.add("step_s", x.step_s);
      y.add("held_per_save_s", x.held_per_save_s);
      y.add("last_save_s", x.last_save_s);
      y.add("saves", x.saves);
      m += (m.size() > 1 ? "," : "") + y.str();
    }
    j.add_json("modes", m + "]");
    root.add_json("checkpoints_124m", j.str());
  }
  if (churned) {
    const auto& c = *churned;
    std::printf("churn: %d TCP peers, DiLoCo H = %lld, %.0f s, %d kill -9 + restart (every 1-3 s): %d round ends seen by two or "
                "more peers, %d of them with different parameters, %d reported again by a peer that redid the round; rank 0: round "
                "%.3f s median, longest %.2f s between two round ends, at step %lld; resident memory %.1f MB after warm-up, "
                "%.1f MB at the end (%+.1f%%), most %.1f MB\n",
                c.peers, static_cast<long long>(s.inner), c.seconds, c.kills, c.rounds, c.disagreeing, c.redone, c.round_s,
                c.longest_gap_s, static_cast<long long>(c.last_step), c.rss_warm_kib / 1024.0, c.rss_end_kib / 1024.0,
                c.rss_warm_kib ? 100.0 * static_cast<double>(c.rss_end_kib - c.rss_warm_kib) / static_cast<double>(c.rss_warm_kib) : 0.0,
                c.rss_max_kib / 1024.0);
    std::printf("churn: rank 0's resident memory in each tenth of the run (MB):");
    std::string tenths = "[";
    for (auto kib : c.rss_tenths_kib) {
      std::printf(" %.1f", kib / 1024.0);
      tenths += (tenths.size() > 1 ? "," : "") + std::to_string(kib);
    }
    std::printf("\n");
    dt::train::json_line j;
    j.add("peers", c.peers);
    j.add("seconds", c.seconds);
    j.add("kills", c.kills);
    j.add("rounds", c.rounds);
    j.add("disagreeing", c.disagreeing);
    j.add("redone", c.redone);
    j.add("round_s", c.round_s);
    j.add("longest_gap_s", c.longest_gap_s);
    j.add("rss_warm_kib", c.rss_warm_kib);
    j.add("rss_end_kib", c.rss_end_kib);
    j.add("rss_max_kib", c.rss_max_kib);
    j.add_json("rss_tenths_kib", tenths + "]");
    j.add("last_step", c.last_step);
    root.add_json("churn", j.str());
  }
  if (sim) {
    const auto& [a, b] = *sim;
    std::printf("sim-churn: 5 + 2 joining in-process peers, deterministic, wan links, DiLoCo H = %lld, 1 simulated s a step, "
                "%.1f simulated hours, seed %llu: %zu kills, %zu starts, %zu processes, %zu views, %zu finished "
                "(val loss %.4f); %zu round ends seen by two or more processes, %zu with different parameters, %zu reported "
                "again by a process that redid the round; "
                "run twice: digest %016llx and %016llx (%s); %.0f s and %.0f s of wall time\n",
                static_cast<long long>(s.inner), a.hours, static_cast<unsigned long long>(s.seed), a.kills, a.starts,
                a.processes, a.views, a.finished, a.val_loss, a.round_ends, a.disagreeing, a.redone,
                static_cast<unsigned long long>(a.digest), static_cast<unsigned long long>(b.digest),
                a.digest == b.digest ? "the same" : "DIFFERENT", a.wall_s, b.wall_s);
    dt::train::json_line j;
    j.add("hours", a.hours);
    j.add("kills", a.kills);
    j.add("starts", a.starts);
    j.add("processes", a.processes);
    j.add("views", a.views);
    j.add("finished", a.finished);
    j.add("val_loss", a.val_loss);
    j.add("round_ends", a.round_ends);
    j.add("disagreeing", a.disagreeing);
    j.add("redone", a.redone);
    j.add("same_digest", a.digest == b.digest ? 1 : 0);
    j.add("wall_s", a.wall_s);
    root.add_json("sim_churn", j.str());
  }
  if (join) {
    dt::train::json_line j;
    j.add("members", join->members);
    j.add("joiners", join->joiners);
    j.add("val_loss", join->val_loss);
    j.add("wall_s", join->wall_s);
    std::string a = "[", b = "[";
    for (double x : join->admitted_s) a += (a.size() > 1 ? "," : "") + std::to_string(x);
    for (const auto& [r, bytes] : join->served) {
      dt::train::json_line x;
      x.add("peer", r);
      x.add("bytes", bytes);
      b += (b.size() > 1 ? "," : "") + x.str();
    }
    j.add_json("start_to_admitted_s", a + "]");
    j.add_json("served", b + "]");
    root.add_json("join", j.str());
  }
  bench::output_file json(json_path);
  json << root.str() << "\n";
  json.close();
  std::printf("written to %s\n", json_path.c_str());
  // The goals the sections above print are checked too: peers that end a round on different
  // parameters, or a deterministic run that does not repeat itself, fail the program (the JSON
  // is written first, to show what differed).
  std::vector<std::string> broken;
  if (churned && churned->disagreeing > 0)
    broken.push_back("churn: " + std::to_string(churned->disagreeing) + " round ends with different parameters");
  if (sim && sim->first.disagreeing > 0)
    broken.push_back("sim-churn: " + std::to_string(sim->first.disagreeing) + " round ends with different parameters");
  if (sim && sim->first.digest != sim->second.digest) broken.push_back("sim-churn: the two runs' digests differ");
  for (const auto& b : broken) std::fprintf(stderr, "bench_faults: %s\n", b.c_str());
  return broken.empty() ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_faults: %s\n", e.what());
  return 1;
}
