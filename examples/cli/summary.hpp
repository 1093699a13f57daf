// What `decentrain-gpt train` prints when a run ends: every peer's figures, the pipeline's
// stages, the contributions left out, what the TCP transport turned away and the membership's
// changes.
#pragma once

#include "peer.hpp"

#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace cli {

inline void print_summary(const train_plan& p, const std::vector<dt::train::fit_result>& results, int first_rank, int world,
                   const char* comm, double wall_s) {
  // Compute utilisation: the share of the peer's clock (simulated for --peers) spent computing
  // steps rather than waiting on the network or evaluating. Send rates: the mean over the run and
  // the peak over any second of the clock.
  std::printf("\n%-6s %-10s %-14s %-14s %-12s %-12s %-12s %-8s %-10s %-10s\n", "peer", "val loss", "MB sent", "MB received",
              "net wait s", "compute s", "clock s", "util %", "MB/s mean", "MB/s peak");
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& m = results[i].last;
    std::printf("%-6zu %-10.4f %-14.2f %-14.2f %-12.2f %-12.2f %-12.2f %-8.1f %-10.3f %-10.3f\n", i + static_cast<std::size_t>(first_rank),
                results[i].final_val_loss, static_cast<double>(m.bytes_sent) / 1e6, static_cast<double>(m.bytes_received) / 1e6,
                m.network_wait_s, m.compute_s, m.clock_s, 100.0 * m.utilisation(), m.mean_send_rate() / 1e6,
                m.peak_send_rate / 1e6);
  }
  if (world > 1) {
    // What a synchronous all-reduce of the gradient every step would have put on the wire per
    // peer (ring all-reduce: 2 (N-1)/N times the gradient's bytes), for comparison.
    const double grad_bytes = 4.0 * static_cast<double>(p.model.parameter_count());
    const double sync_bytes = static_cast<double>(p.trainer.steps) * 2.0 * (world - 1) / world * grad_bytes;
    const double sent = static_cast<double>(results[0].last.bytes_sent);
    std::printf("\ncomm %s: %.2f MB sent per peer; synchronous all-reduce every step would send %.2f MB (%.1fx more)\n", comm,
                sent / 1e6, sync_bytes / 1e6, sent > 0 ? sync_bytes / sent : 0.0);
    // The payloads above; what the transport sent beside them (tcp's frame headers, padding and
    // control frames), apart.
    if (const auto framing = static_cast<double>(results[0].last.framing_bytes_sent); framing > 0)
      std::printf("framing: %.3f MB sent beside the payloads (frame headers, padding, handshakes, heartbeats)\n", framing / 1e6);
  }
  // Throughput over the wall clock (evaluations included) of this process's peers; a pipeline's
  // stages share their copy's tokens. A resumed run trained fewer steps than --steps: left out.
  if (wall_s > 0 && !results.empty() && !p.checkpoints.resume && !p.parallel.swarm) {  // (swarm: print_swarm)
    const auto n = results.size();
    const auto stages = static_cast<std::size_t>(p.parallel.stages());
    const auto copies = stages > 1 ? std::max<std::size_t>(1, n / stages) : n;
    const double per_copy = static_cast<double>(p.trainer.steps * p.trainer.batch_size * p.model.block_size) / wall_s;
    if (stages > 1)
      std::printf("throughput: %.0f tokens/s on %s (%zu cop%s of the %zu-stage model, wall clock)\n", per_copy * static_cast<double>(copies),
                  p.device.describe().c_str(), copies, copies == 1 ? "y" : "ies", stages);
    else
      std::printf("throughput: %.0f tokens/s on %s (%zu peer%s, %.0f each, wall clock)\n", per_copy * static_cast<double>(n),
                  p.device.describe().c_str(), n, n == 1 ? "" : "s", per_copy);
  }
  if (!results.empty() && !results[0].evals.empty() && results[0].evals.back().consensus_distance >= 0)
    std::printf("consensus distance %.6g (the replicas' mean L2 distance from their mean, at the last evaluation)\n",
                results[0].evals.back().consensus_distance);
  std::printf("val loss %.4f\n", results[0].final_val_loss);
  std::printf("trained in %s\n", dt::train::format_duration(wall_s).c_str());
}

inline void print_stages(const train_plan& p, const std::vector<dt::train::fit_result>& results, const std::vector<stage_figures>& runs,
                  int first_rank) {
  const auto& pipe = p.parallel.pipe;
  const int world = world_size_of(p) > 0 ? world_size_of(p) : static_cast<int>(runs.size());
  // The shape at the end: another where an elastic group re-formed after peers were lost or joined (the
  // peer that trained longest saw the last one).
  const auto last = std::max_element(runs.begin(), runs.end(), [](const auto& a, const auto& b) { return a.steps < b.steps; });
  const int stages = last != runs.end() && last->stages > 0 ? last->stages : pipe.stages;
  const int copies = last != runs.end() && last->copies > 0 ? last->copies : world / pipe.stages;
  const std::int64_t went_back = last != runs.end() ? last->went_back_to : -1;
  std::printf("\npipeline: %d stages x %d copies, schedule %s%s, %d micro-batches a step, activations %s%s\n", stages, copies,
              pipe.schedule.c_str(), pipe.schedule == "interleaved" ? dt::detail::concat(":v=", pipe.chunks).c_str() : "",
              pipe.micro_batches, pipe.codec.describe().c_str(),
              stages != pipe.stages || copies != world / pipe.stages
                  ? dt::detail::concat(" (re-formed from ", pipe.stages, " x ", world / pipe.stages, " when the group changed",
                                       went_back >= 0 ? dt::detail::concat("; went back to step ", went_back,
                                                                           "'s checkpoints, a stage's every copy lost")
                                                      : std::string(),
                                       ")").c_str()
                  : "");
  std::printf("%-6s %-6s %-10s %-16s %-22s %-14s\n", "peer", "stage", "tokens/s", "idle in steps %", "most micro-batches held",
              "MB sent/step");
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto rank = i + static_cast<std::size_t>(first_rank);
    if (rank >= runs.size()) continue;
    const auto& f = runs[rank];
    const double steps = std::max<double>(1.0, static_cast<double>(f.steps));
    std::printf("%-6zu %-6d %-10.0f %-16.1f %-22d %-14.3f\n", rank, f.stage,
                results[i].last.tokens_per_s, f.total_s > 0 ? 100.0 * (1.0 - f.busy_s / f.total_s) : 0.0, f.peak_stashed,
                static_cast<double>(f.bytes_sent) / steps / 1e6);
  }
}

// --parallel swarm: each stage's pool at the end, what it processed, retried and moved, and the
// tokens trained: the rows each stage processed over the completed steps (each peer's, the
// killed ones' up to their last step), which must be the steps' batches at every stage. Over TCP
// or MPI a process knows its own peer's only, and its table shows that.
inline void print_swarm(const train_plan& p, const std::vector<swarm_figures>& runs,
                        const std::vector<std::map<int, std::pair<std::int64_t, std::int64_t>>>& rows_by_stage, double wall_s) {
  const auto& pools = p.parallel.pools;
  const int stages = pools.stages;
  std::vector<std::int64_t> rows(static_cast<std::size_t>(stages), 0), micro(rows.size(), 0), retried(rows.size(), 0);
  std::vector<int> peers(rows.size(), 0), moves(rows.size(), 0);
  std::vector<double> busy(rows.size(), 0.0);
  std::int64_t batches = 0;  // the steps' rows, from the peer that completed the most steps
  std::int64_t most_steps = -1;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const auto& f = runs[r];
    if (f.steps == 0) continue;
    for (const auto& [stage, n] : rows_by_stage[r]) {
      rows[static_cast<std::size_t>(stage)] += n.first;
      micro[static_cast<std::size_t>(stage)] += n.second;
    }
    const auto s = static_cast<std::size_t>(f.stage);  // (its compute, retries and moves: at the stage it ended at)
    retried[s] += f.retried;
    moves[s] += f.moves;
    busy[s] += f.busy_s;
    if (f.steps > most_steps) {
      most_steps = f.steps;
      batches = f.step_rows;
    }
  }
  // The pools at the end: the peers that completed the run (the last step), by their stage then.
  for (const auto& f : runs)
    if (f.steps > 0 && f.steps == most_steps) ++peers[static_cast<std::size_t>(f.stage)];
  std::printf("\nswarm: %d stages, %d micro-batches a step per %lld rows, activations %s\n", stages, pools.micro_batches,
              static_cast<long long>(p.trainer.batch_size), pools.codec.describe().c_str());
  // tok/s/peer: the tokens the stage processed over the seconds its peers computed, a peer's
  // throughput at that stage were it never kept waiting.
  std::printf("%-6s %-12s %-16s %-14s %-12s %-10s %-8s %-10s\n", "stage", "peers (end)", "micro-batches", "tokens", "tok/s/peer",
              "retried", "moves", "busy s");
  bool exact = true;
  const std::int64_t T = p.model.block_size;
  for (int s = 0; s < stages; ++s) {
    const auto i = static_cast<std::size_t>(s);
    std::printf("%-6d %-12d %-16lld %-14lld %-12.0f %-10lld %-8d %-10.2f\n", s, peers[i], static_cast<long long>(micro[i]),
                static_cast<long long>(rows[i] * T), busy[i] > 0 ? static_cast<double>(rows[i] * T) / busy[i] : 0.0,
                static_cast<long long>(retried[i]), moves[i], busy[i]);
    exact = exact && rows[i] == batches;
  }
  std::uint64_t sent = 0;
  for (const auto& f : runs) sent += f.bytes_sent;
  std::printf("activations and their gradients sent: %.2f MB (%s%s)\n", static_cast<double>(sent) / 1e6,
              p.mode == launch::in_process ? "all peers" : "this peer",
              p.model.subspace > 0 ? ", as subspace coefficients" : "");
  if (p.mode == launch::in_process) {  // (a TCP or MPI process knows its own peer's figures only)
    std::printf("tokens trained: %lld at every stage, the %lld steps' batches hold %lld%s\n", static_cast<long long>(rows[0] * T),
                static_cast<long long>(most_steps), static_cast<long long>(batches * T),
                exact ? " (exact: no micro-batch lost or counted twice)" : " (NOT EXACT: a stage's count differs)");
    if (wall_s > 0 && !p.checkpoints.resume)
      std::printf("throughput: %.0f tokens/s on %s (the %d-stage model's pools, wall clock)\n", static_cast<double>(rows[0] * T) / wall_s,
                  p.device.describe().c_str(), stages);
  }
}

// "1 round", "3 rounds".
inline std::string counted(std::int64_t n, const std::string& what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

// --deadline: the rounds closed without every replica and what they left out, over the peers
// this process ran (every peer with --peers; its own with TCP or MPI).
inline void print_deadlines(const std::vector<std::optional<deadline_figures>>& runs) {
  std::int64_t closed_early = 0, dropped = 0;
  std::string late;
  bool any = false;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    if (!runs[r]) continue;
    any = true;
    closed_early += runs[r]->closed_early;
    dropped += runs[r]->dropped;
    if (runs[r]->missed > 0)
      late += (late.empty() ? "" : ", ") + std::string("peer ") + std::to_string(r) + " missed " + counted(runs[r]->missed, "round") +
              " and skipped " + counted(runs[r]->skipped, "step");
  }
  if (!any) return;
  std::printf("deadline: %s closed without every replica, %s left out (each late replica took the group's average and went "
              "on from the group's step)%s%s\n",
              counted(closed_early, "round").c_str(), counted(dropped, "contribution").c_str(), late.empty() ? "" : "; ", late.c_str());
}

// The peers whose contributions were left out (non-finite, malformed) or lay far from the
// aggregate, as one peer saw them (ranks of its replica group; after a membership change they
// are the current view's).
inline void print_suspects(const dt::collective::peer_tally& t) {
  for (std::size_t r = 0; r < t.non_finite.size(); ++r) {
    if (t.suspicious(r) == 0) continue;
    std::printf("peer %zu's contributions: %lld of %lld left out for NaN or infinite values, %lld malformed, %lld more "
                "than %gx the typical distance from the aggregate\n",
                r, static_cast<long long>(t.non_finite[r]), static_cast<long long>(t.calls),
                static_cast<long long>(t.malformed[r]), static_cast<long long>(t.far[r]), t.far_factor);
  }
}

// --site with --peers: the payload bytes of every link, added up by the sites at its ends, and
// how many links carried any.
inline void print_site_traffic(const std::vector<std::string>& sites, const dt::transport::in_process& network) {
  const auto map = dt::collective::site_map::from_names(sites);
  const int n = map.world();
  std::printf("\nbytes per link, by site (payloads, each direction apart):\n");
  double all = 0, between = 0;
  for (int a = 0; a < map.sites(); ++a)
    for (int b = 0; b < map.sites(); ++b) {
      double sum = 0, largest = 0;
      int used = 0, links = 0;
      for (int s = 0; s < n; ++s)
        for (int d = 0; d < n; ++d)
          if (s != d && map.site_of(s) == a && map.site_of(d) == b) {
            const auto bytes = static_cast<double>(network.bytes_sent(s, d));
            sum += bytes;
            largest = std::max(largest, bytes);
            used += bytes > 0 ? 1 : 0;
            ++links;
          }
      if (links == 0) continue;
      std::printf("  %s -> %s: %10.2f MB over %d of %d links (the busiest %.2f MB)\n", map.name(a).c_str(), map.name(b).c_str(),
                  sum / 1e6, used, links, largest / 1e6);
      all += sum;
      if (a != b) between += sum;
    }
  std::printf("between sites: %.2f MB of %.2f MB sent (%.1f%%)\n", between / 1e6, all / 1e6, all > 0 ? 100.0 * between / all : 0.0);
}

// --site over TCP: what this peer sent over each of its links (the other peers' sites are the
// run's to agree, not this process's to know).
inline void print_link_traffic(const std::string& site, const dt::transport::tcp& t) {
  std::printf("\nbytes per link from this peer (site %s):", site.c_str());
  for (int peer = 0; peer < t.capacity(); ++peer)
    if (const auto bytes = t.bytes_sent_to(peer); bytes > 0) std::printf(" to %d: %.2f MB;", peer, static_cast<double>(bytes) / 1e6);
  std::printf("\n");
}

// What this peer's TCP transport turned away: a peer under attack, or one that others reach
// misconfigured, shows it here.
inline void print_transport(const dt::transport::tcp& t) {
  const auto s = t.stats();
  const auto a = t.admission();
  std::uint64_t over = 0;
  for (const auto& [r, n] : t.over_budget()) over += n;
  std::printf("transport: %llu frames malformed, %llu failed authentication; connections refused %llu, silent through "
              "the handshake %llu, evicted %llu, accept errors %llu; ranks claimed by a second process %llu, joiners "
              "turned away %llu, queues dropped over budget %llu; peers reconnected %llu%s%s\n",
              static_cast<unsigned long long>(s.malformed_frames), static_cast<unsigned long long>(s.rejected_frames),
              static_cast<unsigned long long>(a.refused), static_cast<unsigned long long>(a.timed_out),
              static_cast<unsigned long long>(a.evicted), static_cast<unsigned long long>(a.accept_failures),
              static_cast<unsigned long long>(a.hijacks), static_cast<unsigned long long>(a.joiners_turned_away),
              static_cast<unsigned long long>(over), static_cast<unsigned long long>(a.reconnected),
              a.last_rejected.empty() ? "" : "; the last turned away: ", a.last_rejected.c_str());
  for (const auto& [peer, relay] : t.relayed()) std::printf("relayed: peer %d was reached through the relay peer %d\n", peer, relay);
  for (const int peer : t.punched()) std::printf("punched: peer %d was reached directly, through a hole punched in the NATs\n", peer);
  const auto r = t.relaying();
  if (r.circuits_opened + r.circuits_refused > 0)
    std::printf("relay: carried %llu circuits between peers that accept no connections (%.1f MB), refused %llu%s%s\n",
                static_cast<unsigned long long>(r.circuits_opened), static_cast<double>(r.bytes_forwarded) / 1e6,
                static_cast<unsigned long long>(r.circuits_refused), r.last_refusal.empty() ? "" : ": ", r.last_refusal.c_str());
}

// What an elastic group went through, as one survivor saw it.
inline void print_changes(const std::vector<dt::fault::membership_change>& changes, std::uint64_t count) {
  if (changes.empty()) {
    std::printf("membership: no changes\n");
    return;
  }
  if (count > changes.size())
    std::printf("membership: %llu changes, the last %zu of them:\n", static_cast<unsigned long long>(count), changes.size());
  auto list = [](const std::vector<int>& v) {
    std::string out;
    for (int r : v) {
      if (!out.empty()) out += ',';
      out += std::to_string(r);
    }
    return out.empty() ? std::string("none") : out;
  };
  for (const auto& c : changes) {
    const std::string inherited = c.inherited.empty() ? "" : ", took over the unsent residual of " + list(c.inherited);
    std::printf("membership: view %llu from step %lld: peers %s (left out: %s, joined: %s)%s%s, %.3f s after '%s'\n",
                static_cast<unsigned long long>(c.epoch), static_cast<long long>(c.step), list(c.members).c_str(),
                list(c.removed).c_str(), list(c.joined).c_str(),
                c.healed ? (c.healed_in_place ? ", took a peer's state (landed in place)" : ", took a peer's state") : "",
                inherited.c_str(),
                c.seconds, c.cause.c_str());
    // Members whose messages broke the protocol here (a lying leader, a donor serving other bytes).
    for (const auto& [peer, how] : c.named) std::printf("membership: view %llu names peer %d: %s\n",
                                                        static_cast<unsigned long long>(c.epoch), peer, how.c_str());
  }
}


}  // namespace cli
