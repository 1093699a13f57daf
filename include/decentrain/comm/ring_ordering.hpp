// The ring's order for a policy's exchange (diloco's and sync_allreduce's `ring`; the command
// line's --ring-order, and --auto): before the first exchange over a communicator in rank order
// (the run's first, or the first of a new view, whose communicator starts in rank order; or, for
// a tuned DiLoCo, the first after its links drifted), the replicas measure their links and lay
// the ring along the near pairs
// (collective/ring_order.hpp), so that an exchange crosses a slow link no more often than it
// must. Every replica measures at the same exchange and picks the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "decentrain/collective/ring_order.hpp"
#include "decentrain/compress/codec.hpp"
#include "decentrain/detail/error.hpp"

namespace decentrain::comm {

// What a policy measures its ring's order from.
struct measured_ring {
  // Each pair's bandwidth probe, in bytes (a round-robin of n - 1 rounds of one transfer each);
  // 0: the round trips alone (one ping each way and one all-gather: cheap where latencies
  // differ and bandwidths do not).
  std::size_t probe_bytes = 0;

  void validate(const char* who) const {
    decentrain::detail::check(probe_bytes <= (std::size_t{1} << 30), who, ": ring.probe_bytes must be at most 1 GiB, got ", probe_bytes);
  }
  std::string describe() const {
    return probe_bytes > 0 ? "ring(measured: round trips, bandwidth probe " + std::to_string(probe_bytes) + " B)"
                           : "ring(measured: round trips)";
  }
};

class ring_ordering {
 public:
  // Before an exchange through `codec` of `values` values over ctx.replicas: measures and sets
  // the order where the communicator has none, and where the exchange goes around a ring: an
  // exchange without a codec under the communicator's recursive_doubling_below_bytes takes
  // recursive doubling, which keeps rank order (nothing is measured for it). (PowerSGD's
  // all-reduces of its factors and the per-partition aggregators' partitioned all-reduce go
  // around no ring either; they are measured for all the same.) Every replica calls it before
  // the same exchange.
  template <class Ctx, class Codec>
  void order(Ctx& ctx, const measured_ring& ring, const Codec& codec, std::size_t values) {
    auto& comm = ctx.replicas;
    if (comm.world() < 4 || !comm.ring_order().empty()) return;  // (three or fewer: every ring is the same)
    const double bytes = static_cast<double>(codec.max_encoded_bytes(values));
    if (compress::describe(codec) == "identity" && bytes < static_cast<double>(comm.settings().recursive_doubling_below_bytes)) return;
    // A probe number of its own, the same on every replica (the tags are the view's: another
    // view's messages never meet these).
    constexpr std::uint32_t probe = 0x726e6700u;  // "rng"
    last_ = collective::order_ring(comm, bytes / comm.world(), ring.probe_bytes, probe);
    ++picks_;
  }
  // Measures again before the next exchange (a tuned policy whose links drifted): every replica
  // calls it at the same point.
  template <class Ctx>
  void again(Ctx& ctx) {
    ctx.replicas.set_ring_order({});
  }
  // The last order picked and the measures it came from; none before the first.
  const std::optional<collective::ring_pick>& last() const { return last_; }
  // How many orders were picked so far (one per view, and one per drift of a tuned policy's links).
  std::size_t picks() const { return picks_; }

 private:
  std::optional<collective::ring_pick> last_;
  std::size_t picks_ = 0;
};

}  // namespace decentrain::comm
