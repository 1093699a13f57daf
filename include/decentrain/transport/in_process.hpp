// N peers as threads of one process, joined by simulated links. Each directed link has a
// latency, a bandwidth, jitter and a drop probability, and each peer an access link (its NIC or
// its home connection) whose uplink all it sends shares and whose downlink all it receives
// shares; nothing sleeps. Instead every endpoint keeps a simulated clock: a message leaves when
// the sender's clock, the link and the sender's uplink are free, occupies each for size /
// its bandwidth, takes the receiver's downlink from when its first bytes can land, arrives
// latency (+ jitter) later (or when the downlink has taken the last byte), and a dropped copy
// costs a retransmission timeout. A recv moves the receiver's clock to the arrival time, and
// `computed(s)` adds the caller's compute time. So one machine can report how long a run on
// real WAN links would have spent waiting on the network, with many more peers than cores.
//
// Deterministic mode (options::deterministic) runs the peers one at a time in the order of their
// simulated clocks (transport/turns.hpp), with every deadline on simulated time and a step's
// compute time given rather than measured, and applies a churn schedule (transport/churn.hpp):
// peers killed, started again and joining at simulated times, and partitions: while one lasts,
// what crosses it is held (as TCP holds what it cannot deliver) and arrives once it heals, and
// no new connection crosses it. The same seed and schedule give the same losses and the same
// membership history, so a failure seen once can be replayed.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "decentrain/core/rng.hpp"
#include "decentrain/detail/activity.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/detail/hash.hpp"
#include "decentrain/transport/churn.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/mailbox.hpp"
#include "decentrain/transport/turns.hpp"

namespace decentrain::transport {

struct simulated_link {
  double latency_s = 0.0;
  double bandwidth_bytes_per_s = 1.25e9;  // 10 Gbit/s
  double jitter_s = 0.0;                   // uniform extra delay in [0, jitter)
  double drop_probability = 0.0;           // per transmission attempt
  double retransmit_timeout_s = 0.2;       // what each dropped attempt costs

  void validate() const {
    decentrain::detail::check(latency_s >= 0 && jitter_s >= 0 && retransmit_timeout_s >= 0,
                              "link: latency, jitter and retransmit timeout must be >= 0");
    decentrain::detail::check(bandwidth_bytes_per_s > 0, "link: bandwidth must be > 0 bytes/s, got ", bandwidth_bytes_per_s);
    decentrain::detail::check(drop_probability >= 0 && drop_probability < 1,
                              "link: drop probability must be in [0, 1), got ", drop_probability);
  }
};

// A peer's own link to the network (its NIC, its home connection): every message it sends
// shares the uplink, every message it receives the downlink, so sending to 7 peers at once costs
// 7 times what sending to one does. Infinite: not modelled (only each pair's link counts).
struct access_link {
  double uplink_bytes_per_s = std::numeric_limits<double>::infinity();
  double downlink_bytes_per_s = std::numeric_limits<double>::infinity();

  void validate() const {
    decentrain::detail::check(uplink_bytes_per_s > 0 && downlink_bytes_per_s > 0, "access link: uplink and downlink must be > 0 bytes/s, got ",
                              uplink_bytes_per_s, " and ", downlink_bytes_per_s);
  }
};

// One link per ordered (source, destination) pair, and one access link per peer.
class link_matrix {
 public:
  link_matrix(int world, simulated_link l, access_link a = {})
      : world_(world),
        links_(static_cast<std::size_t>(std::max(world, 0)) * static_cast<std::size_t>(std::max(world, 0)), l),
        access_(static_cast<std::size_t>(std::max(world, 0)), a) {
    decentrain::detail::check(world >= 1, "link_matrix: world must be >= 1, got ", world);
    l.validate();
    a.validate();
  }
  int world() const { return world_; }
  simulated_link& at(int source, int destination) {
    return links_[index(source, destination)];
  }
  const simulated_link& at(int source, int destination) const { return links_[index(source, destination)]; }
  access_link& access(int rank) { return access_[rank_index(rank)]; }
  const access_link& access(int rank) const { return access_[rank_index(rank)]; }
  // What `source` -> `destination` can carry alone: the slowest of the link and the two ends.
  double bandwidth(int source, int destination) const {
    return std::min({at(source, destination).bandwidth_bytes_per_s, access(source).uplink_bytes_per_s,
                     access(destination).downlink_bytes_per_s});
  }

 private:
  std::size_t rank_index(int r) const {
    decentrain::detail::check(r >= 0 && r < world_, "link_matrix: rank ", r, " is outside a world of ", world_);
    return static_cast<std::size_t>(r);
  }
  std::size_t index(int s, int d) const {
    decentrain::detail::check(s >= 0 && s < world_ && d >= 0 && d < world_, "link_matrix: link ", s, " -> ", d,
                              " is outside a world of ", world_);
    return static_cast<std::size_t>(s) * static_cast<std::size_t>(world_) + static_cast<std::size_t>(d);
  }
  int world_;
  std::vector<simulated_link> links_;
  std::vector<access_link> access_;
};

namespace links {
// A datacenter-ish LAN: 50 us, each peer's NIC 10 Gbit/s each way.
inline link_matrix lan(int world) { return {world, simulated_link{50e-6, 1.25e9, 5e-6, 0.0, 0.2}, access_link{1.25e9, 1.25e9}}; }
// Peers across the internet: 100 ms, 10 ms jitter, 0.1% loss, each peer's connection 100 Mbit/s
// each way.
inline link_matrix wan(int world) { return {world, simulated_link{0.1, 12.5e6, 0.01, 0.001, 0.3}, access_link{12.5e6, 12.5e6}}; }
// Peers of different quality: each peer has its own connection (10 Mbit/s to 1 Gbit/s, the same
// each way) and latency (10-150 ms); a link runs at the slower end's bandwidth, with the two
// latencies added, and each peer's transfers share its connection.
inline link_matrix heterogeneous(int world, std::uint64_t seed = 0) {
  link_matrix m(world, simulated_link{});
  rng gen(seed, "heterogeneous-links");
  std::vector<double> bw(static_cast<std::size_t>(world)), lat(bw.size());
  for (std::size_t i = 0; i < bw.size(); ++i) {
    bw[i] = 1.25e6 * std::pow(100.0, gen.uniform());  // log-uniform 10 Mbit/s .. 1 Gbit/s
    lat[i] = 0.005 + 0.07 * gen.uniform();
  }
  for (int s = 0; s < world; ++s)
    for (int d = 0; d < world; ++d)
      m.at(s, d) = simulated_link{lat[static_cast<std::size_t>(s)] + lat[static_cast<std::size_t>(d)],
                        std::min(bw[static_cast<std::size_t>(s)], bw[static_cast<std::size_t>(d)]), 0.005, 0.001, 0.3};
  for (int r = 0; r < world; ++r) m.access(r) = access_link{bw[static_cast<std::size_t>(r)], bw[static_cast<std::size_t>(r)]};
  return m;
}
// Peers at sites (datacenters, machines): two peers of one site talk over `inside`'s link
// (a LAN), two of different sites over `between`'s, and each peer's access link is `inside`'s
// (its NIC), so traffic inside a site does not queue behind the WAN's. Each pair of sites then
// has a WAN link per pair of peers (the paths of a site's peers to another site are not one
// shared pipe). site_of[r] is rank r's site, any integers.
inline link_matrix by_site(const link_matrix& between, const link_matrix& inside, std::span<const int> site_of) {
  const int n = static_cast<int>(site_of.size());
  decentrain::detail::check(between.world() == n && inside.world() == n, "links::by_site: ", n, " sites given for networks of ",
                            between.world(), " and ", inside.world(), " peers");
  link_matrix m = inside;
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d)
      if (site_of[static_cast<std::size_t>(s)] != site_of[static_cast<std::size_t>(d)]) m.at(s, d) = between.at(s, d);
  return m;
}
// No cost at all: for tests of the algorithms themselves.
inline link_matrix ideal(int world) { return {world, simulated_link{0.0, 1e30, 0.0, 0.0, 0.0}}; }

inline const char* preset_names = "ideal, lan, wan, heterogeneous";
inline link_matrix preset(const std::string& name, int world, std::uint64_t seed = 0) {
  if (name == "ideal") return ideal(world);
  if (name == "lan") return lan(world);
  if (name == "wan") return wan(world);
  if (name == "heterogeneous") return heterogeneous(world, seed);
  decentrain::detail::fail("unknown link preset '", name, "' (expected one of: ", preset_names, ")");
}
}  // namespace links

// Compute speeds of simulated peers (in_process::options::speeds).
namespace speeds {
// `world` speeds from 1x to `fastest`x, spaced evenly on a log scale (1, 1.59, 2.52, 4 for four
// at 4x), dealt to the ranks in an order drawn from `seed`: no rank's place tells its speed.
inline std::vector<double> spread(int world, std::uint64_t seed = 0, double fastest = 4.0) {
  decentrain::detail::check(world >= 1, "speeds::spread: world must be >= 1, got ", world);
  decentrain::detail::check(fastest >= 1 && std::isfinite(fastest), "speeds::spread: fastest must be >= 1, got ", fastest);
  std::vector<double> out(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) out[static_cast<std::size_t>(r)] = world == 1 ? 1.0 : std::pow(fastest, double(r) / (world - 1));
  rng gen(seed, "speeds");
  for (std::size_t i = out.size(); i > 1; --i) std::swap(out[i - 1], out[static_cast<std::size_t>(gen.next_u64() % i)]);
  return out;
}
}  // namespace speeds

// When one directed link is busy, on the simulated clock. A message takes the link's first free
// time from when it is sent, split around what other messages already hold (the packets of two
// streams interleave): transfers in flight at once share the bandwidth, none goes faster than
// the link, and a message sent by one thread at an earlier simulated time than another thread's
// still finds the gap before it. Used by a peer's endpoint and its lanes (background threads).
class link_schedule {
 public:
  // Holds `seconds` of the link from `from` on; returns when the last of them ends.
  double book(double from, double seconds) {
    if (!(seconds > 0)) return from;
    std::lock_guard lock(mutex_);
    // Time long past is forgotten: the threads of one peer are never an hour apart; a sender an
    // hour behind the others that share a downlink would find that hour of it free.
    std::erase_if(busy_, [&](const interval& b) { return b.end < from - 3600.0; });
    double t = from, left = seconds;
    std::vector<interval> taken;
    for (auto it = busy_.begin(); left > 0; ++it) {
      if (it == busy_.end() || it->begin >= t + left) {  // free for the rest of it
        taken.push_back({t, t + left});
        t += left;
        left = 0;
        break;
      }
      if (it->end <= t) continue;
      if (it->begin > t) {  // a gap before this interval: use it
        taken.push_back({t, it->begin});
        left -= it->begin - t;
      }
      t = it->end;
    }
    busy_.insert(busy_.end(), taken.begin(), taken.end());
    std::sort(busy_.begin(), busy_.end(), [](const interval& a, const interval& b) { return a.begin < b.begin; });
    std::vector<interval> merged;
    for (const auto& b : busy_) {
      if (!merged.empty() && b.begin <= merged.back().end) merged.back().end = std::max(merged.back().end, b.end);
      else merged.push_back(b);
    }
    busy_ = std::move(merged);
    return t;
  }

 private:
  struct interval {
    double begin, end;
  };
  std::mutex mutex_;
  std::vector<interval> busy_;  // sorted, disjoint
};

class in_process {
  struct shared;

 public:
  // A deterministic run (see above): every peer's training step computes `step_seconds` of
  // simulated time (transport::step_seconds: the trainer reports it instead of what it measured),
  // and `churn` is applied as the simulated clocks pass its events. Background lanes are not
  // offered (collectives run on the caller's thread), as their threads would race.
  // From `from_s` until `until_s` (simulated; infinity: never heals), the peers of `side` and
  // the others do not reach each other: a message sent across, or on the way when it starts,
  // arrives after it heals (or never), and a joiner cannot connect across it.
  struct partition {
    double from_s = 0.0;
    double until_s = std::numeric_limits<double>::infinity();
    std::vector<int> side;
    bool separates(int a, int b) const {
      const auto in = [&](int r) { return std::find(side.begin(), side.end(), r) != side.end(); };
      return in(a) != in(b);
    }
  };
  struct deterministic_run {
    double step_seconds = 1.0;
    churn_schedule churn{};
    std::vector<partition> partitions{};
  };

  struct options {
    std::uint64_t seed = 0;                           // jitter and drops
    std::chrono::milliseconds recv_timeout{120000};   // how long a recv may wait (real time; simulated when deterministic)
    bool peers_fail_alone = false;                    // run(): a peer that throws is killed, the rest go on
    std::optional<deterministic_run> deterministic{};
    // The ranks that start the run (0: all); the others start when the churn schedule starts them,
    // as joiners of the running group. Needs `deterministic`.
    int initial_peers = 0;
    // run() ends a deadlock at once with an error naming every peer's wait (see deadlock_watch);
    // off: the receive timeout ends it (for a run that counts on timeouts, as when a peer is
    // suspected for its silence, or on a thread outside run() that sends or kills later).
    bool report_deadlocks = true;
    // How fast each rank computes, relative to this machine (2: twice as fast; its compute moves
    // its clock half as far); empty: every rank 1. speeds::spread gives peers of different speeds.
    std::vector<double> speeds{};
    // Links that change mid-run: a message its sender sends at or after `from_s` on its clock
    // takes `factor` times as long on the wire (every link and access link; the entry with the
    // latest from_s not after the send counts). Tests and benchmarks of a policy that re-tunes.
    struct slowdown {
      double from_s = 0, factor = 1;
    };
    std::vector<slowdown> slowdowns{};
    // A straggler tail: each stretch of compute (an inner step's passes) runs `factor` times as
    // long with `probability`, drawn from the seed, the rank and the stretch's number, so a
    // deterministic run repeats it. Tests and benchmarks of rounds with deadlines.
    struct straggling {
      double probability = 0, factor = 10;
    };
    straggling straggle{};
  };

  class endpoint {
   public:
    int rank() const { return rank_; }
    // The peers that start the run (a joiner: at least its rank + 1, as tcp's); capacity() counts
    // the joiners too.
    int world() const { return std::max(net_->initial, rank_ + 1); }

    void send(int peer, tag_type tag, std::span<const std::byte> data) {
      check_peer(peer, "send to");
      check_alive();
      // Across a partition the sender cannot know that the peer died or closed its side: what it
      // sends is held, and lost when it lands on a peer that forgot it or on a later process of
      // its rank. A live peer that forgot this one answers as tcp's goodbye does: excluded (not a
      // certain departure: it is alive, and the agreement must not count it out).
      bool lost = false;
      if (peer != rank_ && (net_->joiners ? !net_->hears(peer, rank_) : net_->dead[static_cast<std::size_t>(peer)].load())) {
        const bool dead = net_->dead[static_cast<std::size_t>(peer)].load();
        if (!net_->cut(rank_, peer, clock_))
          transport::fail_peer_because(dead ? failure_cause::departed : failure_cause::excluded, peer, "send", "in_process: peer ",
                                       peer, dead ? " was killed" : " has not taken this peer in");
        lost = dead || !net_->knows_current(rank_, peer);
      }
      double arrival = clock_;
      if (peer != rank_) {
        const simulated_link& l = net_->links.at(rank_, peer);
        auto& gen = link_rng_[static_cast<std::size_t>(peer)];
        const double size = static_cast<double>(data.size());
        const double slow = net_->slowdown_at(clock_);
        const double on_wire = slow * size / net_->links.bandwidth(rank_, peer);
        double resend = 0.0;
        while (l.drop_probability > 0 && gen.uniform() < l.drop_probability) {
          resend += l.retransmit_timeout_s + on_wire;
          ++stats_.retransmissions;
        }
        // The bytes cross the link and the sender's uplink at once (the slower sets the pace),
        // then the receiver's downlink, which takes them from when the first can land: alone,
        // a message costs size / the slowest of the three + latency; beside others, each
        // shared part is booked around what the others hold (link_schedule).
        const double path_end = (*paths_)[static_cast<std::size_t>(peer)].book(clock_, slow * size / l.bandwidth_bytes_per_s);
        const double up_end = uplink_->book(clock_, slow * size / net_->links.access(rank_).uplink_bytes_per_s);
        const double sent = std::max(path_end, up_end);
        double landed = sent + l.latency_s;
        if (!lost) {
          const double first_lands = std::max(clock_, sent - on_wire) + l.latency_s;
          landed = std::max(landed, net_->downlinks[static_cast<std::size_t>(peer)].book(
                                        first_lands, slow * size / net_->links.access(peer).downlink_bytes_per_s));
        }
        arrival = net_->held(rank_, peer, clock_, landed + (l.jitter_s > 0 ? l.jitter_s * gen.uniform() : 0.0) + resend,
                             l.latency_s);
        // Delivery is in order (as on a TCP stream): nothing overtakes a delayed message.
        auto& last = last_arrival_[static_cast<std::size_t>(peer)];
        arrival = std::max(arrival, last);
        last = arrival;
      }
      auto& to = net_->boxes[static_cast<std::size_t>(peer)];
      if (!lost) {
        detail::message m{bytes(data.begin(), data.end()), arrival};
        if (net_->opts.deterministic && tag == alarm_tag && peer != rank_) to.push_alarm_arriving(rank_, std::move(m));
        else to.push(rank_, tag, std::move(m));
      }
      stats_.bytes_sent += data.size();
      ++stats_.messages_sent;
      net_->link_bytes[static_cast<std::size_t>(rank_) * static_cast<std::size_t>(capacity()) + static_cast<std::size_t>(peer)] +=
          data.size();
      ++net_->progress;
    }

    bytes recv(int peer, tag_type tag) { return receive(peer, tag, net_->opts.recv_timeout, "recv"); }

    // ---- membership (transport/membership.hpp) ----
    // (A wait with a timeout of its own is the caller's to end: the deadlock watch leaves it out.)
    bytes recv_within(int peer, tag_type tag, std::chrono::milliseconds timeout) { return receive(peer, tag, timeout, nullptr); }
    // In a deterministic run, the message due first (simulated arrival); otherwise the one
    // queued first of those that are (real time), the clock moving to its arrival as recv's does.
    received recv_any(std::span<const int> sources, tag_type tag) {
      decentrain::detail::check(!sources.empty(), "in_process: peer ", rank_, " cannot receive from none of the peers");
      for (const int p : sources) check_peer(p, "receive from");
      check_alive();
      if (net_->turns) {
        auto [source, m] = pop_in_turn(sources, tag, net_->opts.recv_timeout);
        const double arrival = m.arrival;
        return {source, take(std::move(m)), arrival};
      }
      shared::wait_scope watched;
      net_->watch_wait(watched, rank_, sources, tag, "recv_any");
      auto [source, m] = box().pop_any(sources, tag, net_->opts.recv_timeout);
      const double arrival = m.arrival;
      return {source, take(std::move(m)), arrival};
    }
    // Whether the message has arrived: in a deterministic run by this peer's clock (a poll loop
    // moves it with transport::pause); otherwise whether it is queued, the clock moving to its
    // arrival as recv's does.
    std::optional<bytes> try_recv(int peer, tag_type tag) {
      check_peer(peer, "receive from");
      check_alive();
      const int sources[1] = {peer};
      std::optional<std::pair<int, detail::message>> m;
      if (net_->turns) {
        net_->turns->yield(rank_, clock_);  // peers whose clocks are behind go first
        check_alive();
        box().arrived(clock_);
        m = box().try_pop_any(sources, tag, clock_);
      } else {
        m = box().try_pop_any(sources, tag);
      }
      if (!m) return std::nullopt;
      return take(std::move(m->second));
    }

    void discard_before(int peer, tag_type tag) { box().discard_before(peer, tag); }
    void set_epoch(std::uint64_t epoch) { box().set_epoch(epoch); }
    // Checked at every step's start: in a deterministic run, peers whose clocks are behind this
    // one's go first, so what this peer finds does not depend on how far it ran ahead.
    std::optional<alarm> alarmed() const {
      if (net_->turns) {
        net_->turns->yield(rank_, clock_);
        check_alive();
        box().arrived(clock_);
      }
      return box().alarmed();
    }
    void forget(int peer) {
      check_peer(peer, "forget");
      box().forget(peer, decentrain::detail::concat("peer ", rank_, " left it out of its view"));
      if (net_->joiners) net_->unhear(rank_, peer);  // as a closed tcp connection: a joiner must ask again
    }
    // Forgets `peer` for good (no joiners here), and its waits on this peer fail at once with
    // `reason`, as when tcp's connection closes with a goodbye saying it was left out (not a
    // departure: a peer that every other excluded has no majority left and stops).
    void bar(int peer, const std::string& reason) {
      check_peer(peer, "bar");
      const auto why = decentrain::detail::concat("peer ", rank_, " excluded it from the run: ", reason);
      box().bar(peer, why);
      if (net_->joiners) net_->unhear(rank_, peer);
      net_->close(rank_, peer, why, failure_cause::excluded, clock_);
    }
    // The others' waits on this peer fail at once, as departed with `reason` (what reaches them
    // after that is never read).
    void leave(const std::string& reason) {
      for (int r = 0; r < capacity(); ++r)
        if (r != rank_) net_->close(rank_, r, reason, failure_cause::departed, clock_, last_arrival_[static_cast<std::size_t>(r)]);
    }

    // Compute takes 1 / speed of what it took here (options::speeds): a peer of speed 2 moves
    // its clock half as far for the same work.
    void computed(double seconds) {
      decentrain::detail::check(seconds >= 0, "in_process: computed() needs seconds >= 0, got ", seconds);
      clock_ += seconds / compute_speed();
      if (seconds > 0) ++stretches_;
    }
    // The speed of the next stretch of compute (the rank's, slowed where the straggler tail
    // draws it).
    double compute_speed() const {
      const double speed = net_->opts.speeds.empty() ? 1.0 : net_->opts.speeds[static_cast<std::size_t>(rank_)];
      const auto& tail = net_->opts.straggle;
      if (tail.probability <= 0) return speed;
      const std::uint64_t draw = decentrain::detail::splitmix64(
          net_->opts.seed ^ decentrain::detail::splitmix64(0x737472616767ull + static_cast<std::uint64_t>(rank_)) ^ (stretches_ * 0x9e3779b97f4a7c15ull));
      const double u = static_cast<double>(draw >> 11) * 0x1.0p-53;
      return u < tail.probability ? speed / tail.factor : speed;
    }

    // ---- joining (transport/endpoint.hpp's joining_endpoint) and simulated time ----
    // Only a deterministic run starts peers once it runs (its churn schedule); otherwise an
    // elastic group spends nothing on looking for joiners.
    bool takes_joiners() const { return net_->joiners; }
    // Started by the churn schedule (a new rank, or a killed one started again).
    bool joined_late() const { return incarnation_ > 0 || rank_ >= net_->initial; }
    // The running peers that this one and it each take in (as a tcp connection both ways).
    std::vector<int> connected() const {
      std::vector<int> out;
      if (!net_->joiners) return out;  // nobody joins: membership asks only about joiners
      for (int r = 0; r < capacity(); ++r)
        if (r != rank_ && net_->hears(r, rank_) && net_->hears(rank_, r)) out.push_back(r);
      return out;
    }
    int capacity() const { return net_->links.world(); }
    // A peer started again or joining asks the running peers to take it in: one that still
    // counts on this rank's previous process refuses for now (as tcp's welcome does).
    void rediscover() {
      for (int r = 0; r < capacity(); ++r)
        if (r != rank_) net_->connect(rank_, r, clock_);
    }
    std::chrono::steady_clock::time_point now() const {
      if (!net_->turns) return std::chrono::steady_clock::now();
      return std::chrono::steady_clock::time_point(
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(clock_)));
    }
    void pause(std::chrono::milliseconds d) {
      if (!net_->turns) return std::this_thread::sleep_for(d);
      const double s = std::chrono::duration<double>(d).count();
      clock_ += s;
      stats_.wait_seconds += s;
      net_->turns->yield(rank_, clock_);
      check_alive();
      box().arrived(clock_);
    }
    std::optional<double> step_seconds() const {
      if (!net_->opts.deterministic) return std::nullopt;
      return net_->opts.deterministic->step_seconds;
    }

    traffic_stats stats() const {
      auto s = stats_;
      s.clock_seconds = clock_;
      return s;
    }

    std::optional<link_estimate> slowest_link() const { return net_->slowest; }

    // A second endpoint of this peer for a collective running on a background thread (see
    // transport::open_lane). Its clock starts at this one's: the transfer begins now, while this
    // peer goes on computing. rejoin() then moves this clock to when the transfer ended, if that
    // is later, and counts only that difference as waiting, so time computed while the
    // transfer proceeded is not waited twice. The lane's messages share this peer's links and
    // uplink with its other messages in flight (see link_schedule); it has its own seeded
    // drop/jitter streams.
    std::optional<endpoint> lane() {
      if (net_->turns) return std::nullopt;  // a second thread would race the turns
      endpoint l = *this;
      l.stats_ = {};
      l.lane_token_ = shared::lane_opened(net_, rank_);
      const auto salt = decentrain::detail::splitmix64(++lanes_opened_ ^ (std::uint64_t{0x1a9e} << 32));
      for (auto& g : l.link_rng_) g = rng(g.next_u64() ^ salt, "lane-link");
      return l;
    }
    void rejoin(const endpoint& l) {
      if (l.clock_ > clock_) {
        stats_.wait_seconds += l.clock_ - clock_;
        clock_ = l.clock_;
      }
      stats_.bytes_sent += l.stats_.bytes_sent;
      stats_.bytes_received += l.stats_.bytes_received;
      stats_.messages_sent += l.stats_.messages_sent;
      stats_.messages_received += l.stats_.messages_received;
      stats_.retransmissions += l.stats_.retransmissions;
    }

    // Marks the whole network failed: every peer blocked in recv gets `reason` as an error
    // naming this peer.
    // Fails every peer's waits, naming `origin` as the failed peer: the root cause when this peer
    // fails only because another did, so that which of the two reaches a third first does not matter.
    void abort(const std::string& reason, int origin) {
      for (auto& b : net_->boxes) b.fail_all(origin, reason);
    }

   private:
    friend class in_process;
    endpoint(std::shared_ptr<shared> net, int rank, double clock = 0.0)
        : net_(std::move(net)), rank_(rank), incarnation_(net_->incarnation[static_cast<std::size_t>(rank)]), clock_(clock) {
      const auto n = static_cast<std::size_t>(capacity());
      paths_ = std::make_shared<std::vector<link_schedule>>(n);
      uplink_ = std::make_shared<link_schedule>();
      last_arrival_.assign(n, 0.0);
      for (std::size_t d = 0; d < n; ++d)
        link_rng_.emplace_back(net_->opts.seed ^ decentrain::detail::splitmix64(static_cast<std::uint64_t>(rank_) * n + d), "link");
    }
    detail::mailbox& box() const { return net_->boxes[static_cast<std::size_t>(rank_)]; }
    bytes receive(int peer, tag_type tag, std::chrono::milliseconds timeout, const char* watched_as) {
      check_peer(peer, "receive from");
      check_alive();
      const int sources[1] = {peer};
      if (net_->turns) return take(pop_in_turn(sources, tag, timeout).second);
      shared::wait_scope watched;
      net_->watch_wait(watched, watched_as ? rank_ : -1, sources, tag, watched_as);
      return take(box().pop(peer, tag, timeout));
    }
    // A message taken: the clock moves to its arrival, the counters count it.
    bytes take(detail::message m) {
      if (m.arrival > clock_) {
        stats_.wait_seconds += m.arrival - clock_;
        clock_ = m.arrival;
      }
      stats_.bytes_received += m.payload.size();
      ++stats_.messages_received;
      return std::move(m.payload);
    }
    // A killed peer's own calls fail (not as a peer error: no fault policy should try to save it).
    void check_alive() const {
      if (net_->dead[static_cast<std::size_t>(rank_)].load() || net_->incarnation[static_cast<std::size_t>(rank_)] != incarnation_)
        decentrain::detail::fail("in_process: peer ", rank_, " was killed");
    }
    void check_peer(int peer, const char* what) const {
      decentrain::detail::check(peer >= 0 && peer < capacity(), "in_process: peer ", rank_, " cannot ", what, " peer ", peer,
                                " (", capacity(), " ranks)");
    }
    // A deterministic run's recv: waits its turn until the message is due or the deadline (on
    // simulated time) passes.
    // (From any of `sources`: the one whose message is due first.)
    std::pair<int, detail::message> pop_in_turn(std::span<const int> sources, tag_type tag, std::chrono::milliseconds timeout) {
      const double deadline = clock_ + std::chrono::duration<double>(timeout).count();
      auto& b = box();
      for (;;) {
        const auto w = net_->turns->wait(rank_, clock_, deadline, [&b, sources, tag] { return b.due_any(sources, tag); });
        check_alive();
        if (w.timed_out) {
          stats_.wait_seconds += deadline - clock_;
          clock_ = deadline;
          detail::mailbox::timed_out_any(sources, tag, timeout);
        }
        // Woken by the message landing, or by an alarm or a closed connection landing first.
        const double woke = std::max(clock_, w.at);
        b.arrived(woke);
        try {
          if (auto m = b.try_pop_any(sources, tag, woke)) return std::move(*m);  // throws when it fails at once
        } catch (const peer_error&) {
          stats_.wait_seconds += woke - clock_;
          clock_ = woke;
          throw;
        }
        // What woke it did not end the wait (an alarm of an older view): wait on from there.
        stats_.wait_seconds += woke - clock_;
        clock_ = woke;
      }
    }

    std::shared_ptr<shared> net_;
    int rank_;
    std::uint64_t incarnation_ = 0;  // which process of this rank (the churn schedule starts it again)
    double clock_ = 0.0;
    std::uint64_t stretches_ = 0;  // stretches of compute so far (the straggler tail's draws)
    std::shared_ptr<std::vector<link_schedule>> paths_;  // to each peer; shared with this peer's lanes
    std::shared_ptr<link_schedule> uplink_;               // its access link's; shared with its lanes
    std::vector<double> last_arrival_;
    std::vector<rng> link_rng_;
    traffic_stats stats_;
    std::uint64_t lanes_opened_ = 0;
    std::shared_ptr<void> lane_token_;  // a lane's: while a copy lives, its thread may still send
  };

  in_process(link_matrix links, options opts) : net_(std::make_shared<shared>(std::move(links), std::move(opts))) {}
  explicit in_process(link_matrix links) : in_process(std::move(links), options{}) {}
  explicit in_process(int world) : in_process(links::ideal(world)) {}

  // The peers that start the run (options::initial_peers); capacity() counts the joiners too.
  int world() const { return net_->initial; }
  int capacity() const { return net_->links.world(); }

  // The endpoint of `rank`; each is meant to be used by one thread.
  endpoint at(int rank) const {
    decentrain::detail::check(rank >= 0 && rank < capacity(), "in_process: rank ", rank, " is outside the ", capacity(), " ranks");
    return endpoint(net_, rank);
  }

  // Kills `rank` as kill -9 kills a process: its calls fail from now on, the others find it
  // gone (their waits on it fail naming it as departed, sends to it fail), and run() does not
  // count its end as a failure. Any thread may call it, the peer's own included (in a
  // deterministic run: a peer's thread, in its turn).
  void kill(int rank) const {
    decentrain::detail::check(rank >= 0 && rank < capacity(), "in_process: cannot kill rank ", rank, " of ", capacity());
    net_->kill(rank);
  }
  bool killed(int rank) const {
    decentrain::detail::check(rank >= 0 && rank < capacity(), "in_process: rank ", rank, " is outside the ", capacity(), " ranks");
    return net_->dead[static_cast<std::size_t>(rank)].load();
  }
  // Why a peer that failed alone (options::peers_fail_alone) ended: its error; empty for a peer
  // killed from outside, or still running. Of a rank started several times: its latest process.
  std::string failure(int rank) const {
    decentrain::detail::check(rank >= 0 && rank < capacity(), "in_process: rank ", rank, " is outside the ", capacity(), " ranks");
    std::lock_guard lock(net_->failures_mutex);
    return net_->failures[static_cast<std::size_t>(rank)];
  }
  // The payload bytes every endpoint of `source` (its lanes included) sent to `destination` so
  // far: the traffic of one directed link (a summary's bytes between sites).
  std::uint64_t bytes_sent(int source, int destination) const {
    decentrain::detail::check(source >= 0 && source < capacity() && destination >= 0 && destination < capacity(), "in_process: link ",
                              source, " -> ", destination, " is outside the ", capacity(), " ranks");
    return net_->link_bytes[static_cast<std::size_t>(source) * static_cast<std::size_t>(capacity()) + static_cast<std::size_t>(destination)]
        .load();
  }
  // How many processes of `rank` the churn schedule started after the first.
  std::uint64_t restarts(int rank) const {
    decentrain::detail::check(rank >= 0 && rank < capacity(), "in_process: rank ", rank, " is outside the ", capacity(), " ranks");
    return net_->incarnation[static_cast<std::size_t>(rank)];
  }

  // Runs fn(endpoint) for every rank on its own thread and waits for all. When one peer throws,
  // the others are woken with an error rather than left waiting, and the first failure (by rank)
  // is rethrown here. Peers that were killed are not failures; with options::peers_fail_alone a
  // peer that throws is killed (the others go on without it, as an elastic group does) and only
  // if every peer ended so is its error rethrown. In a deterministic run the peers take turns,
  // and a peer that the churn schedule starts runs fn on a thread of its own (its endpoint's
  // joined_late() is true).
  void run(const std::function<void(endpoint&)>& fn) const {
    const int n = capacity();
    auto& net = *net_;
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
    std::mutex errors_mutex;
    std::atomic<int> first_failure{-1};  // the root cause: peers failing after it fail because of it
    std::mutex threads_mutex;
    std::vector<std::thread> threads;
    // One process of rank r, from its endpoint's creation to its end.
    auto body = [&](endpoint ep) {
      const int r = ep.rank();
      const auto running = net.running_until_return(r);
      try {
        fn(ep);
      } catch (...) {
        if (net.dead[static_cast<std::size_t>(r)].load() || net.incarnation[static_cast<std::size_t>(r)] != ep.incarnation_) return;
        std::string why;
        try {
          throw;
        } catch (const std::exception& e) {
          why = e.what();
        } catch (...) {
          why = "an exception that is not a std::exception";
        }
        {
          std::lock_guard lock(errors_mutex);
          errors[static_cast<std::size_t>(r)] = std::current_exception();
        }
        if (net.opts.peers_fail_alone) {
          {
            std::lock_guard lock(net.failures_mutex);
            net.failures[static_cast<std::size_t>(r)] = why;
          }
          return net.kill(r, ep.clock_);
        }
        int origin = -1;
        first_failure.compare_exchange_strong(origin, r);
        ep.abort(decentrain::detail::concat("transport: peer ", r, " failed: ", why), origin < 0 ? r : origin);
      }
    };
    if (net.opts.deterministic) {
      net.turns.emplace(n, net.opts.deterministic->churn, [&](const churn_event& e) {
        if (e.what == churn_event::kind::kill) {
          if (net.dead[static_cast<std::size_t>(e.rank)].load()) return false;
          net.kill(e.rank, e.at_s);
          return true;
        }
        if (!net.dead[static_cast<std::size_t>(e.rank)].load()) return false;
        net.start(e.rank, e.at_s);
        {
          std::lock_guard lock(errors_mutex);
          errors[static_cast<std::size_t>(e.rank)] = nullptr;
        }
        {
          std::lock_guard lock(net.failures_mutex);
          net.failures[static_cast<std::size_t>(e.rank)].clear();
        }
        std::lock_guard lock(threads_mutex);
        threads.emplace_back([&, r = e.rank, ep = endpoint(net_, e.rank, e.at_s)]() mutable {
          net.turns->await_turn(r);
          body(std::move(ep));
          net.turns->end(r);
        });
        return true;
      });
      for (int r = 0; r < net.initial; ++r) net.turns->add(r, 0.0);
    }
    {
      std::lock_guard lock(threads_mutex);
      net.set_running(net.initial);  // before any thread starts: one not started yet is not "ended"
      for (int r = 0; r < net.initial; ++r)
        threads.emplace_back([&, r] {
          if (net.turns) net.turns->await_turn(r);
          body(at(r));
          if (net.turns) net.turns->end(r);
        });
    }
    if (net.turns) {
      net.turns->begin();
      net.turns->await_all();
    }
    std::optional<deadlock_watch> watch;
    if (!net.turns && net.opts.report_deadlocks) watch.emplace(net);
    for (;;) {  // the churn schedule may start threads until the last peer ends
      std::vector<std::thread> done;
      {
        std::lock_guard lock(threads_mutex);
        done.swap(threads);
      }
      if (done.empty()) break;
      for (auto& t : done) t.join();
    }
    watch.reset();
    net.turns.reset();
    if (net.opts.peers_fail_alone) {
      int alive = 0;
      for (int r = 0; r < n; ++r) alive += errors[static_cast<std::size_t>(r)] || net.dead[static_cast<std::size_t>(r)].load() ? 0 : 1;
      if (alive > 0) return;
    }
    // Prefer the root cause over the "peer r failed" errors it caused in the others.
    for (const auto& e : errors) {
      if (!e) continue;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        if (std::string(x.what()).find("transport: peer ") != 0) throw;
      }
    }
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

 private:
  struct shared {
    shared(link_matrix matrix, options o)
        : links(std::move(matrix)),
          opts(std::move(o)),
          initial(opts.initial_peers > 0 ? opts.initial_peers : links.world()),
          boxes(static_cast<std::size_t>(links.world())),
          dead(static_cast<std::size_t>(links.world())),
          incarnation(static_cast<std::size_t>(links.world()), 0),
          heard(static_cast<std::size_t>(links.world()), std::vector<std::uint64_t>(static_cast<std::size_t>(links.world()), 0)) {
      using decentrain::detail::check;
      check(opts.initial_peers >= 0 && opts.initial_peers <= links.world(), "in_process: initial_peers must be in [0, ",
            links.world(), "], got ", opts.initial_peers);
      check(initial == links.world() || opts.deterministic, "in_process: initial_peers below the ranks (", initial, " of ",
            links.world(), ") needs a deterministic run, whose churn schedule starts the others");
      check(opts.speeds.empty() || static_cast<int>(opts.speeds.size()) == links.world(), "in_process: speeds names ",
            opts.speeds.size(), " ranks, the network has ", links.world(), " (one speed each, or none)");
      for (std::size_t r = 0; r < opts.speeds.size(); ++r)
        check(opts.speeds[r] > 0 && std::isfinite(opts.speeds[r]), "in_process: the speed of rank ", r,
              " must be a number > 0, got ", opts.speeds[r]);
      check(opts.straggle.probability >= 0 && opts.straggle.probability <= 1 && std::isfinite(opts.straggle.factor) &&
                opts.straggle.factor >= 1,
            "in_process: straggle needs a probability in [0, 1] and a factor >= 1, got ", opts.straggle.probability, " and ",
            opts.straggle.factor);
      if (opts.deterministic) {
        auto& d = *opts.deterministic;
        check(d.step_seconds >= 0 && std::isfinite(d.step_seconds), "in_process: deterministic step_seconds must be >= 0, got ",
              d.step_seconds);
        std::stable_sort(d.churn.begin(), d.churn.end(), [](const churn_event& a, const churn_event& b) { return a.at_s < b.at_s; });
        for (const auto& e : d.churn)
          check(e.rank >= 0 && e.rank < links.world() && e.at_s >= 0 && std::isfinite(e.at_s), "in_process: churn event '",
                describe(e), "' names a rank outside the ", links.world(), " or a time before 0");
        for (const auto& p : d.partitions) {
          check(p.from_s >= 0 && std::isfinite(p.from_s) && !std::isnan(p.until_s) && p.until_s >= p.from_s, "in_process: a partition needs 0 <= from_s "
                "<= until_s, got ", p.from_s, " to ", p.until_s);
          check(!p.side.empty(), "in_process: a partition's side names no peer");
          for (int r : p.side)
            check(r >= 0 && r < links.world(), "in_process: a partition's side names rank ", r, ", outside the ", links.world());
        }
      }
      for (const auto& d : opts.slowdowns)
        check(d.from_s >= 0 && std::isfinite(d.from_s) && d.factor > 0 && std::isfinite(d.factor), "in_process: a slowdown ",
              "needs from_s >= 0 and a factor > 0, got ", d.factor, " from ", d.from_s, " s");
      std::stable_sort(opts.slowdowns.begin(), opts.slowdowns.end(), [](const auto& a, const auto& b) { return a.from_s < b.from_s; });
      for (int r = 0; r < links.world(); ++r) {
        if (r < initial) {
          started[static_cast<std::size_t>(r)] = 1;
        } else {
          dead[static_cast<std::size_t>(r)] = true;  // not started yet: nobody hears it
          for (auto& h : heard) h[static_cast<std::size_t>(r)] = nobody;
        }
      }
      for (int s = 0; s < links.world(); ++s)
        for (int d = 0; d < links.world(); ++d)
          if (s != d) {
            const auto& l = links.at(s, d);
            link_estimate e{l.latency_s + l.jitter_s, links.bandwidth(s, d)};
            if (!slowest) slowest = e;
            slowest->latency_s = std::max(slowest->latency_s, e.latency_s);
            slowest->bytes_per_s = std::min(slowest->bytes_per_s, e.bytes_per_s);
          }
    }

    // How many times as long as its links say a message sent at `clock_s` takes (options::slowdowns).
    double slowdown_at(double clock_s) const {
      double factor = 1;
      for (const auto& d : opts.slowdowns)
        if (d.from_s <= clock_s) factor = d.factor;
      return factor;
    }

    // Whether `listener` takes in what the current process of `speaker` sends (and `speaker` may
    // send to it): both run, and each took the other's current process in.
    bool hears(int listener, int speaker) const {
      std::lock_guard lock(peers_mutex);
      const auto l = static_cast<std::size_t>(listener), sp = static_cast<std::size_t>(speaker);
      return !dead[l].load() && !dead[sp].load() && heard[l][sp] == incarnation[sp];
    }
    // `joiner` asks `member` at simulated time `at` to take it in: refused while `member` still
    // counts on the rank's previous process (tcp's welcome), and impossible across a partition.
    // Both ends take each other in: a peer that the group left out forgot the group too.
    void connect(int joiner, int member, double at) {
      std::lock_guard lock(peers_mutex);
      const auto j = static_cast<std::size_t>(joiner), m = static_cast<std::size_t>(member);
      if (dead[m].load() || dead[j].load() || cut(joiner, member, at)) return;
      if (heard[m][j] != incarnation[j]) {
        if (!boxes[m].welcome(joiner)) return;
        heard[m][j] = incarnation[j];
      }
      if (heard[j][m] != incarnation[m] && boxes[j].welcome(member)) heard[j][m] = incarnation[m];
    }
    // Whether a partition separates `a` and `b` at simulated time `at`.
    bool cut(int a, int b, double at) const {
      if (!opts.deterministic) return false;
      for (const auto& p : opts.deterministic->partitions)
        if (p.from_s <= at && at < p.until_s && p.separates(a, b)) return true;
      return false;
    }
    // When a message from `a` to `b`, sent at `sent` and due at `arrival`, arrives: after every
    // partition between them that it meets on the way heals (as TCP delivers it then), or never.
    double held(int a, int b, double sent, double arrival, double latency) const {
      if (!opts.deterministic) return arrival;
      for (bool moved = true; moved;) {
        moved = false;
        for (const auto& p : opts.deterministic->partitions)
          if (p.separates(a, b) && p.from_s <= arrival && sent < p.until_s && arrival < p.until_s + latency) {
            arrival = p.until_s + latency;  // infinity: never
            moved = true;
          }
      }
      return arrival;
    }
    // Whether the process of `peer` that `from` takes in is the one running now.
    bool knows_current(int from, int peer) const {
      std::lock_guard lock(peers_mutex);
      return heard[static_cast<std::size_t>(from)][static_cast<std::size_t>(peer)] == incarnation[static_cast<std::size_t>(peer)];
    }
    void unhear(int listener, int speaker) {
      std::lock_guard lock(peers_mutex);
      heard[static_cast<std::size_t>(listener)][static_cast<std::size_t>(speaker)] = nobody;
    }
    // `to` finds `from`'s connection closed: at once, or in a deterministic run when the news
    // arrives (a link latency after `at`, held as messages are by a partition, and not before
    // `not_before`: a goodbye arrives after what was sent before it, as on a TCP stream).
    void close(int from, int to, const std::string& reason, failure_cause cause, double at,
               double not_before = -std::numeric_limits<double>::infinity()) {
      auto& box = boxes[static_cast<std::size_t>(to)];
      if (!opts.deterministic || !std::isfinite(at)) return box.close(from, reason, cause);
      const double latency = links.at(from, to).latency_s;
      box.close_arriving(from, reason, cause, std::max(held(from, to, at, at + latency, latency), not_before));
    }
    // Kills `rank` at simulated time `at` (-infinity: the others learn of it at once).
    void kill(int rank, double at = -std::numeric_limits<double>::infinity()) {
      if (dead[static_cast<std::size_t>(rank)].exchange(true)) return;
      for (int r = 0; r < links.world(); ++r)
        if (r != rank) close(rank, r, decentrain::detail::concat("peer ", rank, " was killed"), failure_cause::departed, at);
      boxes[static_cast<std::size_t>(rank)].fail_all(rank, decentrain::detail::concat("in_process: peer ", rank, " was killed"));
    }
    // A new process of `rank` (a killed one started again, or a joiner's first): a fresh mailbox
    // that hears every running peer, and a connection to each that takes it in.
    void start(int rank, double at) {
      const auto r = static_cast<std::size_t>(rank);
      {
        std::lock_guard lock(peers_mutex);
        if (started[r]) ++incarnation[r];
        started[r] = true;
        boxes[r].reset();
        for (std::size_t p = 0; p < heard[r].size(); ++p) heard[r][p] = incarnation[p];
        dead[r] = false;
      }
      for (int p = 0; p < links.world(); ++p)
        if (p != rank) connect(rank, p, at);
    }

    // ---- the deadlock watch (run() without a deterministic schedule) ----
    // Each receive that only the run's receive timeout would end is noted while it waits, with
    // what the thread is doing (detail::activity); a rank's threads are run()'s (until fn
    // returns) and its lanes' (while a copy of the lane lives). When every rank not killed has
    // all its threads in such waits and nothing was sent, begun or ended for a while, no message
    // can come: deadlock_watch ends every wait with an error that names them all.
    struct wait_note {
      std::vector<int> sources;
      tag_type tag;
      const char* op;
      const char* call;
      std::int64_t step;
    };
    // A noted wait, taken off the list when it ends (returned by value: a receive allocates
    // nothing for it unless the watch notes it).
    struct wait_scope {
      shared* net = nullptr;
      int rank = -1;
      std::list<wait_note>::iterator at{};
      wait_scope() = default;
      wait_scope(const wait_scope&) = delete;
      wait_scope& operator=(const wait_scope&) = delete;
      ~wait_scope() {
        if (!net) return;
        std::lock_guard lock(net->watch_mutex);
        net->waits[static_cast<std::size_t>(rank)].erase(at);
        ++net->progress;
      }
    };
    void watch_wait(wait_scope& w, int rank, std::span<const int> sources, tag_type tag, const char* op) {
      if (rank < 0 || opts.deterministic || !opts.report_deadlocks) return;
      const auto& a = decentrain::detail::this_thread_activity();
      std::lock_guard lock(watch_mutex);
      auto& list = waits[static_cast<std::size_t>(rank)];
      w.at = list.insert(list.end(), wait_note{std::vector<int>(sources.begin(), sources.end()), tag, op, a.call, a.step});
      w.net = this;
      w.rank = rank;
      ++progress;
    }
    static std::shared_ptr<void> lane_opened(const std::shared_ptr<shared>& net, int rank) {
      {
        std::lock_guard lock(net->watch_mutex);
        ++net->lanes[static_cast<std::size_t>(rank)];
      }
      return std::shared_ptr<void>(nullptr, [net, rank](void*) {  // (holds the network while the lane lives)
        std::lock_guard lock(net->watch_mutex);
        --net->lanes[static_cast<std::size_t>(rank)];
        ++net->progress;
      });
    }
    void set_running(int ranks) {
      std::lock_guard lock(watch_mutex);
      for (int r = 0; r < ranks; ++r) running[static_cast<std::size_t>(r)] = 1;
    }
    struct running_mark {
      shared* net;
      int rank;
      running_mark(shared* n, int r) : net(n), rank(r) {}
      running_mark(const running_mark&) = delete;
      running_mark& operator=(const running_mark&) = delete;
      ~running_mark() {
        std::lock_guard lock(net->watch_mutex);
        net->running[static_cast<std::size_t>(rank)] = 0;
        ++net->progress;
      }
    };
    running_mark running_until_return(int rank) {
      {
        std::lock_guard lock(watch_mutex);
        running[static_cast<std::size_t>(rank)] = 1;
      }
      return running_mark{this, rank};
    }
    // The report when every rank's threads wait (and the ranks are in a deadlock), else none.
    std::optional<std::string> deadlocked() {
      std::lock_guard lock(watch_mutex);
      bool waiting = false;
      for (std::size_t r = 0; r < waits.size(); ++r) {
        if (dead[r].load()) continue;
        if (static_cast<int>(waits[r].size()) < running[r] + lanes[r]) return std::nullopt;
        for (const auto& w : waits[r])  // its message came: the waiter is about to take it
          if (boxes[r].has_queued(w.sources, w.tag)) return std::nullopt;
        waiting = waiting || !waits[r].empty();
      }
      if (!waiting) return std::nullopt;
      std::string text = decentrain::detail::concat(
          "in_process: deadlock: every running peer waits for a message that no peer will send (the receive timeout, ",
          opts.recv_timeout.count(), " ms, would have ended it):");
      for (std::size_t r = 0; r < waits.size(); ++r) {
        text += decentrain::detail::concat("\n  peer ", r);
        if (dead[r].load()) {
          text += ": killed";
          continue;
        }
        if (waits[r].empty()) {
          text += ": ended";
          continue;
        }
        bool first = true;
        for (const auto& w : waits[r]) {
          if (!std::exchange(first, false)) text += decentrain::detail::concat("\n  peer ", r, " (another thread)");
          std::string from;
          for (const int p : w.sources) from += (from.empty() ? "" : ", ") + std::to_string(p);
          text += decentrain::detail::concat(w.step >= 0 ? decentrain::detail::concat(", step ", w.step) : std::string(),
                                             w.call ? decentrain::detail::concat(", in ", w.call) : std::string(), ": ", w.op,
                                             " from peer", w.sources.size() > 1 ? "s " : " ", from, ", ", describe_tag(w.tag));
        }
        std::string unread;
        for (const auto& [source, tag] : boxes[r].queued_keys(4))
          unread += decentrain::detail::concat(unread.empty() ? "" : "; ", "from peer ", source, ", ", describe_tag(tag));
        if (!unread.empty()) text += "; queued here, not taken: " + unread;
      }
      return text;
    }

    link_matrix links;
    options opts;
    int initial;  // the ranks that start the run
    bool joiners = opts.deterministic.has_value();  // peers may start once it runs (the churn schedule)
    std::vector<detail::mailbox> boxes;
    std::vector<link_schedule> downlinks = std::vector<link_schedule>(boxes.size());  // each rank's access link's
    std::vector<std::atomic<bool>> dead;  // killed peers, and ranks not started yet
    std::vector<std::uint64_t> incarnation;  // per rank: its current process (0: the first)
    std::vector<std::vector<std::uint64_t>> heard;  // [listener][speaker]: the process of speaker the listener takes in
    static constexpr std::uint64_t nobody = ~std::uint64_t{0};  // in heard: no process of it
    std::vector<char> started = std::vector<char>(dead.size(), 0);
    mutable std::mutex peers_mutex;
    std::mutex failures_mutex;
    std::vector<std::string> failures = std::vector<std::string>(dead.size());  // see failure()
    std::optional<link_estimate> slowest;  // none for a world of one
    std::optional<detail::turns> turns;    // a deterministic run's, while run() runs
    // The deadlock watch's (after `dead`, whose size they take).
    std::mutex watch_mutex;  // guards waits, lanes and running
    std::vector<std::list<wait_note>> waits = std::vector<std::list<wait_note>>(dead.size());
    std::vector<int> lanes = std::vector<int>(dead.size(), 0);
    std::vector<int> running = std::vector<int>(dead.size(), 0);
    std::atomic<std::uint64_t> progress{0};  // messages sent, waits begun and ended, threads ended
    // Payload bytes sent over each directed link, lost ones included (bytes_sent(s, d)).
    std::unique_ptr<std::atomic<std::uint64_t>[]> link_bytes =
        std::make_unique<std::atomic<std::uint64_t>[]>(dead.size() * dead.size());
  };
  // Looks every 50 ms whether the peers are in a deadlock (shared::deadlocked) with nothing
  // sent, begun or ended for the last 0.5 s, and then ends every wait with the report.
  class deadlock_watch {
   public:
    explicit deadlock_watch(shared& net) : net_(net), thread_([this] { watch(); }) {}
    ~deadlock_watch() {
      {
        std::lock_guard lock(mutex_);
        over_ = true;
      }
      wake_.notify_all();
      thread_.join();
    }
    deadlock_watch(const deadlock_watch&) = delete;
    deadlock_watch& operator=(const deadlock_watch&) = delete;

   private:
    void watch() {
      std::uint64_t seen = ~std::uint64_t{0};
      int quiet = 0;
      std::unique_lock lock(mutex_);
      while (!wake_.wait_for(lock, std::chrono::milliseconds(50), [&] { return over_; })) {
        const std::uint64_t now = net_.progress.load();
        auto report = net_.deadlocked();
        if (!report || now != seen) {
          seen = now;
          quiet = 0;
          continue;
        }
        if (++quiet < 10) continue;
        for (auto& b : net_.boxes) b.fail_all_as_error(*report);
        return;
      }
    }
    shared& net_;
    std::mutex mutex_;
    std::condition_variable wake_;
    bool over_ = false;
    std::thread thread_;
  };

  std::shared_ptr<shared> net_;
};

static_assert(joining_endpoint<in_process::endpoint>);

}  // namespace decentrain::transport
