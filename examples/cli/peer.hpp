// One peer of `decentrain-gpt train`: the plan cmd_train makes of the options, and the library's
// trainer on one peer's endpoint with the run's hooks (progress on rank 0, metrics, the status
// page, Ctrl-C, --kill). decentrain_gpt.cpp runs CPU peers; for --device cuda, train_cuda.cu
// (compiled by nvcc, which cannot compile the TCP transport) instantiates the GPU peers, declared
// extern below, and the host program hands them their endpoints.
#pragma once

#include "device.hpp"
#include "parallel_choice.hpp"
#include "run_status.hpp"

#include <decentrain/decentrain.hpp>
#include <decentrain/transport/tcp/options.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <unistd.h>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace cli {

namespace dt = decentrain;
namespace fs = std::filesystem;

// Set by SIGINT; every trainer asks it between steps (trainer::stop_when), and the fault policy
// saves each peer's state before fit returns.
inline std::atomic<bool> interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the SIGINT handler sets it");

inline void set_threads(int n) {
#if defined(_OPENMP)
  omp_set_num_threads(n);
#else
  (void)n;
#endif
}

// The communication policies the program trains with, one type each whatever the codec and the
// aggregator (any_codec and any_aggregator choose them at run time).
using codec = dt::collective::any_codec;
using aggregator = dt::collective::any_aggregator;
using sync_policy = dt::comm::sync_allreduce<codec, aggregator>;
using gossip_policy = dt::comm::gossip<dt::comm::topology::named>;  // (--topology)
using push_sum_policy = dt::comm::push_sum<dt::comm::topology::named>;
using moshpit_policy = dt::comm::moshpit<codec, aggregator>;
using choco_policy = dt::comm::choco<dt::comm::topology::named, codec>;  // (--topology, --codec)
using ad_psgd_policy = dt::comm::ad_psgd<dt::comm::topology::named>;     // (--topology; no --elastic)
using local_sgd_policy = dt::comm::local_sgd<codec, aggregator>;
using diloco_policy = dt::comm::diloco<dt::comm::outer::nesterov, codec, aggregator>;
using streaming_policy = dt::comm::streaming_diloco<dt::comm::outer::nesterov, codec, aggregator>;

// How this process takes part: alone, as --peers threads, as one TCP peer, or as an MPI rank.
enum class launch { single, in_process, tcp, mpi };
inline const char* launch_name(launch l) {
  switch (l) {
    case launch::single: return "single";
    case launch::in_process: return "in-process";
    case launch::tcp: return "tcp";
    case launch::mpi: return "mpi";
  }
  return "?";
}

struct train_plan {
  launch mode = launch::single;
  int world = 1;  // 0 for MPI until it starts
  int threads = 1;  // per peer
  std::string link;  // --peers: the simulated links
  std::vector<double> speeds;  // --peers: each peer's compute speed (empty: all 1)
  dt::transport::in_process::options::straggling straggle{0, 10};  // --peers: a straggler tail (--straggle)
  std::vector<std::string> sites;  // --site: each peer's (--peers), or this one's; empty: none
  bool average_by_sites = false;  // --site with --outer-averaging sites (its default)
  dt::transport::tcp_options tcp;
  dt::nn::gpt_config model;
  dt::train::trainer_options trainer;
  dt::fault::checkpoint_every checkpoints;
  bool elastic = false;
  dt::fault::elastic elastic_policy;
  std::vector<std::pair<int, std::int64_t>> kills;  // --kill: (rank, after steps)
  std::string metrics;  // '' for none
  bool quiet = false;  // warnings, errors and the summary only
  std::int64_t log_every = 50;
  dt::collective::any_aggregator aggregator;
  parallel_choice parallel;  // data (one stage), pipeline or swarm
  dt::train::json_line run;  // the metrics' config line, beyond the trainer's own fields
  std::shared_ptr<const dt::io::named_tensors> init;  // --init-from: every peer starts from these weights
  int status_port = -1;  // --status-port; -1: no status page
  std::string status_host;
  device_choice device;  // --device
  std::string gpus;  // --device cuda: the GPUs this process uses, for the run's description
};

// The peers the plan starts with (MPI: known once it starts; 0 until then).
inline int world_size_of(const train_plan& p) { return p.mode == launch::tcp ? p.tcp.world : p.world; }

// Over TCP or MPI every process writes its own metrics: "{rank}" in the path becomes the rank,
// or, with several peers, ".rank-R" goes before the extension.
inline std::string metrics_path(const std::string& path, int rank, int world) {
  if (path.empty()) return path;  // --metrics '': none, for every rank
  std::string out = path;
  if (const auto at = out.find("{rank}"); at != std::string::npos) return out.replace(at, 6, std::to_string(rank));
  if (world == 1) return out;
  fs::path p(out);
  return p.replace_filename(p.stem().string() + ".rank-" + std::to_string(rank) + p.extension().string()).string();
}


// The fault policy restores inside fit(); a peer's first step says from which step it resumed
// (an elastic peer behind the others, or one that joined a running group, took their state).
template <class Trainer>
void announce_resume(Trainer& t) {
  const int rank = t.rank(), world = t.world();  // before fit: the whole world's, as the folders are named
  t.on_step([&t, rank, world, first = true](const dt::train::step_metrics& m) mutable {
    if (!first) return;
    first = false;
    const auto from = m.step - 1;
    if (from <= 0) return;
    const dt::fault::checkpoint_every* ck = nullptr;
    bool took_state = false;
    if constexpr (requires { t.fault().checkpoints; }) {  // elastic
      ck = &t.fault().checkpoints;
      took_state = !t.fault().changes().empty() && t.fault().changes().front().healed;
    } else {
      ck = &t.fault();
    }
    for (const auto& [step, why] : ck->unreadable())
      std::printf("peer %d passed over %s, which does not read back: %s\n", rank, ck->file(rank, world, step).c_str(), why.c_str());
    if (took_state)
      std::printf("peer %d resumed at step %lld from the others' state\n", rank, static_cast<long long>(from));
    else
      std::printf("peer %d resumed from %s at step %lld\n", rank, ck->file(rank, world, from).c_str(),
                  static_cast<long long>(from));
    std::fflush(stdout);
  });
}


// --parallel pipeline: what each stage did over the run.
struct stage_figures {
  std::int64_t steps = 0;
  int peak_stashed = 0;
  std::uint64_t bytes_sent = 0;
  double busy_s = 0, total_s = 0;
  int stage = 0, stages = 0, copies = 0;  // where the peer stood at its last step (--elastic: the shape may change)
  std::int64_t went_back_to = -1;  // --elastic: the step whose checkpoints the group last went back to (a stage lost)
  void add(const dt::parallel::schedule::run_stats& s, const dt::parallel::placement& at, int world) {
    ++steps;
    stage = at.stage;
    stages = at.stages;
    copies = world / at.stages;
    peak_stashed = std::max(peak_stashed, s.peak_stashed);
    bytes_sent += s.bytes_sent;
    busy_s += s.busy_s;
    total_s += s.total_s;
  }
};

// --parallel swarm: what a peer did over the steps it completed.
struct swarm_figures {
  std::int64_t steps = 0;
  int stage = 0;
  std::int64_t micro_batches = 0, rows = 0;  // processed at its stage
  std::int64_t step_rows = 0;                // the steps' batches: what each stage must process
  std::int64_t retried = 0;
  int moves = 0;
  std::uint64_t bytes_sent = 0;
  double busy_s = 0;
  template <class Checked>
  void add(const Checked& step) {
    ++steps;
    stage = step.stage;
    micro_batches += step.micro_batches;
    rows += step.rows;
    step_rows += step.step_rows;
  }
  void add(const dt::parallel::swarm_stats& s) {
    retried = s.retried;
    moves = s.moves;
    bytes_sent = s.bytes_sent;
    busy_s = s.busy_s;
  }
};

// --deadline, one peer's: the rounds it led that closed without every replica and the
// contributions they dropped, the rounds it came too late to, and the steps it skipped to catch
// up with the group.
struct deadline_figures {
  std::int64_t closed_early = 0, dropped = 0, missed = 0, skipped = 0;
};

// What the hooks of this process's peers share and leave behind, indexed by rank.
struct run_hooks {
  explicit run_hooks(const train_plan& p) : bar(stdout, {.tty = ::isatty(STDOUT_FILENO) != 0, .log_every = p.log_every}) {}
  void open_metrics(const std::string& path, const train_plan& p) {
    if (path.empty()) return;
    metrics_file.open(path, p.checkpoints.resume ? std::ios::app : std::ios::trunc);
    dt::detail::check(metrics_file.good(), "cannot open --metrics file ", path);
    metrics.emplace(metrics_file, p.run);
  }
  void size_for(int world) {
    const auto n = static_cast<std::size_t>(world);
    stopped_at.assign(n, 0);
    tallies.assign(n, {});
    stage_runs.assign(n, {});
    swarm_runs.assign(n, {});
    rows_by_stage.assign(n, {});
    changes.assign(n, {});
    change_counts.assign(n, 0);
    picks.assign(n, {});
    last_exchanges.assign(n, {});
    site_maps.assign(n, {});
    ring_picks.assign(n, {});
    deadline_runs.assign(n, {});
  }

  dt::train::progress bar;
  std::ofstream metrics_file;
  std::optional<dt::train::metrics_log> metrics;
  std::optional<run_status> status;  // --status-port
  dt::transport::in_process* network = nullptr;  // --peers: what --kill kills through
  std::vector<std::int64_t> stopped_at;  // the step at which each peer's fit returned
  std::vector<dt::collective::peer_tally> tallies;  // what each saw of the others' contributions
  std::vector<stage_figures> stage_runs;  // --parallel pipeline: its stage's figures over the run
  std::vector<swarm_figures> swarm_runs;  // --parallel swarm: each peer's
  // --parallel swarm: the rows and micro-batches each peer processed at each stage (a peer that
  // moved processed at several)
  std::vector<std::map<int, std::pair<std::int64_t, std::int64_t>>> rows_by_stage;
  std::vector<std::vector<dt::fault::membership_change>> changes;
  std::vector<std::uint64_t> change_counts;  // how many changes each saw (changes keeps the latest)
  std::vector<std::vector<dt::comm::tuning_choice>> picks;  // --auto: each peer's picks so far
  std::vector<std::optional<dt::comm::tuning_choice>> last_exchanges;  // --auto, streaming: the codec of each peer's last exchange
  std::vector<std::optional<dt::collective::site_map>> site_maps;  // --site: each peer's sites at the end
  std::vector<std::optional<dt::collective::ring_pick>> ring_picks;  // --ring-order: each peer's last order measured
  // --deadline: what each peer's rounds came to (see deadline_figures)
  std::vector<std::optional<deadline_figures>> deadline_runs;
  int final_world = -1;  // an elastic TCP or MPI peer: the world of its last view
};

// --auto's picks: a line on the terminal, and one in the metrics with the measures.
inline std::string describe_pick(const dt::comm::tuning_choice& c) {
  const auto& m = c.measured;
  char streaming[96] = "";  // (Streaming DiLoCo's fragments and overlap)
  if (c.overlap > 0)
    std::snprintf(streaming, sizeof streaming, ", %lld fragment%s, overlap %lld", static_cast<long long>(c.fragments),
                  c.fragments == 1 ? "" : "s", static_cast<long long>(c.overlap));
  // (a rate of 0 s a byte: the probe's ring of 2s values took no longer than its ring of s, their
  // bytes lost in the links' latencies or a drop's retry)
  const auto rate = [](double per_byte_s, const char* of) {
    char text[64];
    if (per_byte_s > 0)
      std::snprintf(text, sizeof text, "%.3g MB/s %s", 1e-6 / per_byte_s, of);
    else
      std::snprintf(text, sizeof text, "bytes too few to time");
    return std::string(text);
  };
  // (what a small f32 exchange by recursive doubling is priced from)
  char small_s[48] = "";
  if (m.small_s > 0) std::snprintf(small_s, sizeof small_s, ", a small all-reduce %.3f s", m.small_s);
  std::string small = small_s;
  if (m.rd_per_byte_s > 0) {  // (appended piece by piece: GCC 12's false -Wrestrict alarm at -O2 on a + b + c)
    small += ", recursive doubling ";
    small += rate(m.rd_per_byte_s, "a round's payload");
  }
  char out[560];
  std::snprintf(out, sizeof out,
                "H = %lld%s, codec %s (exchange %.3f s predicted, %.1f%% busy) from: the slowest inner step %.4f s, a ring "
                "exchange's fixed %.3f s + %s%s",
                static_cast<long long>(c.inner_steps), streaming, c.codec_name.c_str(), c.exchange_s, 100 * c.busy, m.step_s, m.fixed_s,
                rate(m.per_byte_s, "sent a peer").c_str(), small.c_str());
  return out;
}
inline void print_pick(const dt::comm::tuning_choice& c) {
  std::printf("\nauto: after step %lld (%s): %s\n", static_cast<long long>(c.step), c.why.c_str(), describe_pick(c).c_str());
  std::fflush(stdout);
}
inline dt::train::json_line pick_line(int rank, const dt::comm::tuning_choice& c) {
  dt::train::json_line l;
  l.add("event", "auto").add("rank", rank).add("step", c.step).add("why", c.why).add("inner_steps", c.inner_steps)
      .add("codec", c.codec_name).add("exchange_s", c.exchange_s).add("busy", c.busy).add("step_s", c.measured.step_s)
      .add("fixed_s", c.measured.fixed_s).add("per_byte_s", c.measured.per_byte_s);
  if (c.overlap > 0)
    l.add("fragments", c.fragments).add("overlap", c.overlap).add("small_s", c.measured.small_s).add("rd_per_byte_s", c.measured.rd_per_byte_s);
  return l;
}

// What one peer trains with; run_peer's argument (one type per policy pair, so that the GPU
// peers' instantiations below are declared by their policies alone).
template <class Comm, class Fault>
struct peer_job {
  const train_plan& plan;
  run_hooks& hooks;
  const dt::data::token_dataset& data;
  const Comm& comm;
  const Fault& fault;
};

// Defined in train_cuda.cu. check_gpus: --device checked against this machine's GPUs (a clear
// error naming the option where there is none, or no such index), and what they are. use_gpu:
// makes the calling thread's work go to peer `rank`'s GPU.
std::string check_gpus(const device_choice& d);
void use_gpu(const device_choice& d, int rank);

// Builds one peer's trainer on `ep` with the run's hooks and trains it. Not inline: for
// Device = dt::cuda it is instantiated only in train_cuda.cu.
template <class Device, class Comm, class Fault>
dt::train::fit_result run_peer(const peer_job<Comm, Fault>& job, dt::transport::any_endpoint ep) {
  constexpr bool elastic = std::is_same_v<Fault, dt::fault::elastic>;
  constexpr bool gpu = !std::is_same_v<Device, dt::cpu>;
  using Trainer = dt::train::trainer<dt::nn::gpt<Device>, Comm, parallel_choice, Fault>;
  const auto& p = job.plan;
  auto& h = job.hooks;
  const int first_rank = ep.rank();
  if constexpr (gpu) use_gpu(p.device, first_rank);
  auto options = p.trainer;
  // Peers sharing this machine's cores time their compute on their thread's clock; a GPU peer's
  // work is the GPU's, which only the wall clock sees.
  if (!gpu && (p.mode == launch::single || p.mode == launch::in_process) && p.threads == 1) options.compute_on_thread_clock = true;
  auto comm = job.comm;
  if constexpr (requires { comm.site = std::string(); })  // --site: this peer's
    if (p.average_by_sites) comm.site = p.sites[p.sites.size() == 1 ? 0 : static_cast<std::size_t>(first_rank)];
  Trainer t(p.model, options, std::move(ep), comm, p.parallel, job.fault);
  if (h.status) h.status->attach(t);
  if (p.init) dt::train::import_gpt2_weights(t.model(), *p.init);  // before fit: the policies start from them
  if (p.checkpoints.resume && !p.quiet) announce_resume(t);
  if (h.metrics) h.metrics->attach(t);
  if (t.rank() == 0 && !p.quiet) h.bar.attach(t);
  if (p.parallel.swarm)  // (before --kill's hook: the step a peer is killed after counts)
    t.on_step([&t, &h](const dt::train::step_metrics& m) {
      const auto r = static_cast<std::size_t>(t.members()[static_cast<std::size_t>(t.rank())]);
      // Every step this peer's rows went into up to this one (one it took another's state for
      // included), each once.
      for (const auto& [step, c] : t.parallel().take_checked(m.step)) {
        h.swarm_runs[r].add(c);
        auto& [rows, micro] = h.rows_by_stage[r][c.stage];
        rows += c.rows;
        micro += c.micro_batches;
      }
      h.swarm_runs[r].add(t.parallel().swarm_stats());
    });
  if constexpr (elastic) {
    for (const auto& [victim, after] : p.kills)
      if (victim == t.rank())
        t.on_step([&t, &h, after = after](const dt::train::step_metrics& m) {
          if (m.step != after || !h.network) return;
          std::printf("\n--kill: peer %d killed after step %lld\n", t.rank(), static_cast<long long>(m.step));
          std::fflush(stdout);
          h.network->kill(t.members()[static_cast<std::size_t>(t.rank())]);
          dt::detail::fail("peer killed by --kill");
        });
    auto keep_changes = [&t, &h] {
      const auto r = static_cast<std::size_t>(t.members()[static_cast<std::size_t>(t.rank())]);
      if (t.fault().change_count() != h.change_counts[r]) {
        h.changes[r] = t.fault().changes();
        h.change_counts[r] = t.fault().change_count();
      }
    };
    t.on_step([keep_changes](const dt::train::step_metrics&) { keep_changes(); });
    t.on_eval([keep_changes](const dt::train::eval_point&) { keep_changes(); });
  }
  if constexpr (requires { t.policy().aggregation().tally; })  // (gossip aggregates nothing)
    t.on_step([&t, &h](const dt::train::step_metrics& m) { h.tallies[static_cast<std::size_t>(m.rank)] = t.policy().aggregation().tally; });
  if constexpr (requires { t.policy().choices(); t.policy().tune.has_value(); })
    if (t.policy().tune)  // --auto: each new pick printed (by rank 0) and in the metrics
      t.on_step([&t, &h, quiet = p.quiet](const dt::train::step_metrics& m) {
        const auto& all = t.policy().choices();
        auto& seen = h.picks[static_cast<std::size_t>(m.rank)];
        for (auto i = seen.size(); i < all.size(); ++i) {
          if (all[i].step < 0) continue;  // made before a resume (not in the checkpoint)
          if (m.rank == 0 && !quiet) print_pick(all[i]);
          if (h.metrics) h.metrics->event(pick_line(m.rank, all[i]));
        }
        seen = all;
        if constexpr (requires { t.policy().last_exchange(); }) {
          auto& last = h.last_exchanges[static_cast<std::size_t>(m.rank)];
          if (const auto& now = t.policy().last_exchange(); now && !last) {
            last = now;
            if (m.rank == 0 && !quiet) print_pick(*now);
            if (h.metrics) h.metrics->event(pick_line(m.rank, *now));
          }
        }
      });
  if (p.parallel.stages() > 1 && !p.parallel.swarm)
    t.on_step([&t, &h](const dt::train::step_metrics&) {
      auto& f = h.stage_runs[static_cast<std::size_t>(t.members()[static_cast<std::size_t>(t.rank())])];
      f.add(t.parallel().last_run(), t.placement(), t.world());
      if constexpr (requires { t.redeals(); })
        for (const auto& r : t.redeals())
          if (r.from_checkpoints) f.went_back_to = r.step;
    });
  t.stop_when([] { return interrupted.load(); });
  auto result = t.fit(job.data);
  h.stopped_at[static_cast<std::size_t>(first_rank)] = t.step();
  if constexpr (requires { t.policy().deadlines(); })
    if (t.policy().deadline) {
      const auto& d = t.policy().deadlines();
      deadline_figures f{0, d.dropped(), d.missed(), t.skipped_steps()};
      for (const auto& r : d.rounds()) f.closed_early += r.members < r.replicas ? 1 : 0;
      h.deadline_runs[static_cast<std::size_t>(first_rank)] = f;
    }
  if constexpr (requires { t.policy().sites(); }) h.site_maps[static_cast<std::size_t>(first_rank)] = t.policy().sites();
  if constexpr (requires { t.policy().ordering(); }) h.ring_picks[static_cast<std::size_t>(first_rank)] = t.policy().ordering().last();
  if constexpr (elastic) {
    if (p.mode != launch::in_process) {
      h.changes[static_cast<std::size_t>(first_rank)] = t.fault().changes();
      h.change_counts[static_cast<std::size_t>(first_rank)] = t.fault().change_count();
      h.final_world = t.world();
    }
  }
  return result;
}

// The GPU peers, instantiated in train_cuda.cu (a build with CUDA defines DECENTRAIN_CLI_CUDA).
#define DECENTRAIN_CLI_GPU_PEERS(X)                                                                                     \
  X(sync_policy, dt::fault::checkpoint_every) X(sync_policy, dt::fault::elastic)                                      \
  X(gossip_policy, dt::fault::checkpoint_every) X(gossip_policy, dt::fault::elastic)                                  \
  X(push_sum_policy, dt::fault::checkpoint_every) X(push_sum_policy, dt::fault::elastic)                              \
  X(moshpit_policy, dt::fault::checkpoint_every) X(moshpit_policy, dt::fault::elastic)                                \
  X(choco_policy, dt::fault::checkpoint_every) X(choco_policy, dt::fault::elastic)                                    \
  X(ad_psgd_policy, dt::fault::checkpoint_every)                                                                      \
  X(local_sgd_policy, dt::fault::checkpoint_every) X(local_sgd_policy, dt::fault::elastic)                            \
  X(diloco_policy, dt::fault::checkpoint_every) X(diloco_policy, dt::fault::elastic)                                  \
  X(streaming_policy, dt::fault::checkpoint_every) X(streaming_policy, dt::fault::elastic)
#if DECENTRAIN_CLI_CUDA
#define DECENTRAIN_CLI_DECLARE_GPU_PEER(Comm, Fault) \
  extern template dt::train::fit_result run_peer<dt::cuda>(const peer_job<Comm, Fault>&, dt::transport::any_endpoint);
DECENTRAIN_CLI_GPU_PEERS(DECENTRAIN_CLI_DECLARE_GPU_PEER)
#undef DECENTRAIN_CLI_DECLARE_GPU_PEER
#endif

}  // namespace cli
