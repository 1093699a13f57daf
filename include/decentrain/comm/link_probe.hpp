// The start's probe of the replicas' links, the first measures of a policy that picks its own
// settings (comm/auto_tuning.hpp): probe_links, which waits for it, and link_probe, which runs it
// on a lane beside the first steps. On a slow link the probe is a few dozen round trips (a
// second or more on a WAN), time the replicas then compute through instead of waiting.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "decentrain/collective/communicator.hpp"
#include "decentrain/comm/auto_tuning.hpp"
#include "decentrain/detail/error.hpp"

namespace decentrain::comm {

// What the probe measured, the largest of each figure over the replicas: what the slowest saw,
// the same on every replica. A first guess: the rounds' own exchanges correct it (the exchange may
// take another algorithm at the model's size).
struct probed_links {
  tuning_measure link;  // step_s: the slowest replica's compute seconds per inner step, where measured (link_probe)
  double small_s = 0;   // a small collective's latency (work sized to speed adds one a round)
};

namespace probing {

// Whether the probe times recursive doubling too. DiLoCo's picks price every exchange as a ring,
// so it would wait for an all-reduce whose figure it never reads.
enum class time_recursive_doubling : bool { no, yes };

// This replica's figures: three or four all-reduces among `comm`'s replicas, after one that
// waits for them all: 8 bytes (a small collective's latency); where `rd`, recursive doubling of s
// f32 values (s = probe_values, at most `values` / 8, at least 1024), whose time beyond the small
// one's gives its own seconds per byte (each round sends the whole payload to one partner, so
// where links differ every round meets the slowest peer's connection, which a ring's pieces
// pipeline past); then rings of s and 2s values, whose difference gives the seconds per byte and
// whose rest the ring's latency. A communicator's first ring also agrees the ring's sizes (one
// small all-reduce): a probe that runs first counts it in the ring of s, so in the latencies.
// Returns {a ring's latencies and the small all-reduce's, seconds per byte, a small all-reduce's
// seconds, recursive doubling's seconds per byte of a round's payload (0: not timed)}.
template <class Comm>
std::array<double, 4> measure(Comm& comm, std::size_t values, std::size_t probe_values, time_recursive_doubling rd) {
  const auto clock = [&comm] { return comm.endpoint().stats().clock_seconds; };
  const std::size_t s = std::max<std::size_t>(1024, std::min(probe_values, values / 8));
  std::vector<float> buffer(2 * s, 0.0f);
  double one = 0;
  comm.all_reduce(std::span<double>(&one, 1));  // every replica here
  const double t0 = clock();
  comm.all_reduce(std::span<double>(&one, 1));
  const double t1 = clock();
  // (right after the small one, as it leaves the replicas together: after a ring, whose ends
  // come apart by its hops, recursive doubling's time would count the replicas' waits for the last)
  if (rd == time_recursive_doubling::yes)
    comm.all_reduce(std::span<float>(buffer.data(), s), collective::reduce_op::sum, collective::algorithm::recursive_doubling);
  const double t2 = clock();
  comm.all_reduce(std::span<float>(buffer.data(), s), collective::reduce_op::sum, collective::algorithm::ring);
  const double t3 = clock();
  comm.all_reduce(std::span<float>(buffer), collective::reduce_op::sum, collective::algorithm::ring);
  const double t4 = clock();
  const double w = comm.world(), bytes = 2.0 * (w - 1) / w * 4.0 * static_cast<double>(s);  // a ring's, per replica
  const double per_byte = std::max(0.0, (t4 - t3) - (t3 - t2)) / bytes;
  const double rd_bytes = recursive_doubling_rounds(comm.world()) * 4.0 * static_cast<double>(s);
  const double rd_per_byte = rd == time_recursive_doubling::yes ? std::max(0.0, (t2 - t1) - (t1 - t0)) / rd_bytes : 0.0;
  return {std::max(0.0, (t3 - t2) - per_byte * bytes) + (t1 - t0), per_byte, t1 - t0, rd_per_byte};
}

// The step by which this replica's clock will have passed the probe's end, `ahead` seconds of its
// clock away, after `done` steps, at the pace of the steps to come: `per_inner` seconds an inner
// step times `inner_a_step`, the inner steps each takes. Work sized to speed takes several inner
// steps a step once its sizing lands (a 4x replica four), where the steps before took one: priced
// by those, a fast replica would propose about its speed times the steps the others do, and the
// largest proposal, the step every replica takes the figures after, would come that much later.
// At `latest` at the most; `done` where nothing is measured.
inline std::int64_t proposal(std::int64_t done, double ahead, double per_inner, std::int64_t inner_a_step, std::int64_t latest) {
  const double per_step = per_inner * static_cast<double>(std::max<std::int64_t>(1, inner_a_step));
  const double steps = per_step > 0 && std::isfinite(ahead / per_step) ? std::ceil(std::max(0.0, ahead) / per_step) : 0.0;
  return std::max(done, std::min(done + static_cast<std::int64_t>(std::min(steps, 1e9)), latest));
}

// A peer's nonsense measures nothing.
inline void keep_sane(std::span<double> figures) {
  for (double& f : figures)
    if (!std::isfinite(f) || f < 0) f = 0;
}

}  // namespace probing

// The probe, waited for: each replica's figures, then the largest of each (one more small all-reduce).
template <class Comm>
probed_links probe_links(Comm& comm, std::size_t values, std::size_t probe_values, probing::time_recursive_doubling rd) {
  if (comm.world() <= 1) return {};
  auto figures = probing::measure(comm, values, probe_values, rd);
  comm.all_reduce(std::span<double>(figures), collective::reduce_op::max);
  probing::keep_sane(figures);
  return {{0.0, figures[0], figures[1], 0.0, figures[3]}, figures[2]};
}

// The probe beside the first steps. start() runs it on a lane (where the communicator has one;
// else there and then, as probe_links does), and the training thread tells it after each step
// how far it got (after_step). The replicas must take its figures after the same step, which
// none knows in advance: in the probe's last all-reduce each proposes the step by which its own
// clock will have passed the probe's end (the steps it took so far, plus, at the pace of its
// fastest inner step after the first step times the inner steps its steps take from there on,
// the lane's clock ahead of its own and two small all-reduces for that last one to land:
// probing::proposal; sized to speed, once the sizing has landed), and the largest proposal is
// that step. A replica that reaches its own
// proposal before the answer came waits for it there, so none passes the step unawares. The
// slowest replica's compute per inner step (after its first, which warms up) rides in the same
// all-reduce: the pick made from the figures needs no collective of its own. Without a lane the
// figures come after the first step told, with that step's compute agreed then (one 8-byte
// all-reduce), as a probe waited for at the start gives them.
class link_probe {
 public:
  link_probe() = default;
  // A copy probes nothing (a policy is copied before it starts).
  link_probe(const link_probe&) {}
  link_probe& operator=(const link_probe&) { return *this; }
  ~link_probe() { forget(); }

  // Whether a probe runs or waits to be taken.
  bool running() const { return state_ != nullptr; }

  // `latest`: the step after which every replica takes the figures at the latest (a replica
  // whose steps are short against the probe waits for the answer a step before, rather than
  // train on without them).
  template <class Comm>
  void start(Comm& comm, std::size_t values, std::size_t probe_values, std::int64_t latest) {
    forget();
    state_ = std::make_shared<shared>();
    taken_ = false;
    latest_ = latest;
    if (comm.world() <= 1) {  // (nothing to probe, nothing to agree: the step's compute alone)
      state_->without_lane = true;
      return;
    }
    handle_ = comm.start([s = state_, values, probe_values, latest](auto& c) {
      if (!c.in_background()) {
        s->result = probe_links(c, values, probe_values, probing::time_recursive_doubling::yes);
        s->without_lane = true;
        return;
      }
      const auto f = probing::measure(c, values, probe_values, probing::time_recursive_doubling::yes);
      std::array<double, 6> agreed{f[0], f[1], f[2], f[3], 0.0, 0.0};
      {
        std::unique_lock lock(s->mutex);
        s->moved.wait(lock, [&] { return (s->told >= 2 && s->inner_a_step > 0) || s->stop || s->waiting; });
        // (the first step, which warms the caches and allocates, left out where there are others)
        const bool later = s->told >= 2;
        const double compute = later ? s->compute_s - s->first_compute_s : s->compute_s;
        const double inner_timed = static_cast<double>(later ? s->inner - s->first_inner : s->inner);
        // (the fastest inner step after the first step: steps that speed up after it come to the
        // proposal sooner than their mean would say, and the replica would wait there)
        const double per_inner = later && s->fastest_s > 0 ? s->fastest_s : inner_timed > 0 ? compute / inner_timed : 0.0;
        const double ahead = std::max(0.0, c.endpoint().stats().clock_seconds - s->clock_s) + 2 * f[2];
        // (a step after the one it saw)
        s->proposal = probing::proposal(s->done, ahead, per_inner, s->inner_a_step, latest);
        agreed[4] = inner_timed > 0 ? compute / inner_timed : 0.0;
        agreed[5] = static_cast<double>(s->proposal);
      }
      c.all_reduce(std::span<double>(agreed), collective::reduce_op::max);
      probing::keep_sane(std::span<double>(agreed).first(5));
      s->result = {{agreed[4], agreed[0], agreed[1], 0.0, agreed[3]}, agreed[2]};
      s->at = static_cast<std::int64_t>(agreed[5]);
    });
  }

  // On the training thread after each step (`compute_s` its compute over `inner_steps` inner
  // steps; `next_inner` the inner steps each step after it takes, 0 where that is not known yet:
  // sized to speed, before the sizing lands, the proposal waits for it): the figures once this is
  // the step every replica takes them after, else nothing. Rethrows the probe's failure (a peer
  // lost meanwhile) where it waits for it.
  template <class Comm>
  std::optional<probed_links> after_step(Comm& comm, std::int64_t step, double compute_s, std::int64_t inner_steps,
                                         std::int64_t next_inner = 1) {
    decentrain::detail::check(state_ != nullptr, "link_probe: after_step without a probe started");
    if (!std::isfinite(compute_s) || compute_s < 0) compute_s = 0;  // (a clock's nonsense measures nothing)
    const std::int64_t inner = std::max<std::int64_t>(1, inner_steps);
    std::int64_t own = -1;
    {
      std::lock_guard lock(state_->mutex);
      const bool first = state_->told++ == 0;
      state_->done = step + 1;
      state_->clock_s = comm.endpoint().stats().clock_seconds;
      state_->compute_s += compute_s;
      state_->inner += inner;
      state_->inner_a_step = next_inner;
      if (first) {
        state_->first_compute_s = compute_s;
        state_->first_inner = inner;
      } else if (const double each = compute_s / static_cast<double>(inner); each > 0 && (state_->fastest_s == 0 || each < state_->fastest_s)) {
        state_->fastest_s = each;
      }
      own = state_->proposal;
    }
    state_->moved.notify_all();
    if (!taken_) {
      if (state_->without_lane) {
        state_->at = step;  // (measured before the steps: taken after the first one told)
      } else {
        // (an answer that came is read without waiting: on simulated links the wait would move
        // this clock to the lane's end before the steps have covered it; at latest - 1 at the
        // latest a replica waits, proposing latest, the most any can then)
        if (!handle_.ready() && !(own >= 0 && step >= own) && step < latest_ - 1) return std::nullopt;
        if (!handle_.ready()) {
          {
            std::lock_guard lock(state_->mutex);
            state_->waiting = true;
          }
          state_->moved.notify_all();
        }
        if (!handle_.ready() || state_->at < 0) handle_.wait();  // (a probe that failed throws here)
      }
      taken_ = true;
    }
    decentrain::detail::check(step <= state_->at, "link_probe: this replica is after step ", step,
                              ", past the step the replicas agreed to take the probe's figures after (", state_->at, ")");
    if (step < state_->at) return std::nullopt;
    handle_.wait();  // (its traffic and, on simulated links, its time folded in)
    auto out = state_->result;
    if (state_->without_lane) {  // this step's compute, the slowest replica's
      double s = compute_s / static_cast<double>(inner);
      comm.all_reduce(std::span<double>(&s, 1), collective::reduce_op::max);
      out.link.step_s = std::isfinite(s) && s > 0 ? s : 0.0;
    }
    state_.reset();
    return out;
  }

  // Drops a probe in flight or not taken (waits for it; its failure is dropped too).
  void forget() noexcept {
    if (!state_) return;
    {
      std::lock_guard lock(state_->mutex);
      state_->stop = true;
    }
    state_->moved.notify_all();
    try {
      handle_.wait();
    } catch (...) {
    }
    state_.reset();
  }

 private:
  // Shared with the lane: the training thread's progress, and the lane's proposal and answer.
  struct shared {
    std::mutex mutex;
    std::condition_variable moved;
    std::int64_t done = 0;         // (mutex) the step after the last one told
    std::int64_t told = 0;         // (mutex) steps told (a probe started mid-run has told fewer than done)
    double clock_s = 0;            // (mutex) this replica's clock after the last
    double compute_s = 0;          // (mutex) their compute
    std::int64_t inner = 0;        // (mutex) their inner steps
    double first_compute_s = 0;    // (mutex) the first step's compute...
    std::int64_t first_inner = 0;  // (mutex) ...and inner steps
    double fastest_s = 0;          // (mutex) the least compute of an inner step after the first step
    std::int64_t inner_a_step = 0; // (mutex) the inner steps a step takes from the last one told on (0: not known yet)
    bool stop = false;             // (mutex) forgotten: propose at once
    bool waiting = false;          // (mutex) the replica waits for the answer: propose now
    std::int64_t proposal = -1;    // (mutex) this replica's step, once proposed
    // Written by the lane before it ends (read once the handle is ready).
    probed_links result;
    std::int64_t at = -1;          // the step every replica takes the figures after
    bool without_lane = false;
  };
  std::shared_ptr<shared> state_;
  collective::pending handle_;
  bool taken_ = false;     // the answer has come (state_->at holds)
  std::int64_t latest_ = 0;  // start()'s
};

}  // namespace decentrain::comm
