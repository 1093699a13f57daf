// Gossip (decentralized SGD, D-PSGD: Lian et al. 2017, arXiv 1705.09056): no all-reduce and no
// peer that hears from everyone. Every `inner_steps` steps each replica averages its parameters
// with the few neighbours its Topology (comm/topology.hpp) names for that round, after its own
// optimizer step (the adapt-then-combine order). Replicas hold different parameters between
// rounds; they drift towards their mean at a rate set by the topology's spectral gap, and every
// round moves `degree` models per peer whatever the group's size (an all-reduce moves about two).
// Every topology there is doubly stochastic under equal weights, so a round keeps the replicas'
// mean. Under fault::elastic the topology is laid over the current view's members, so the ring
// closes over a dead peer. Optimizer state stays local; the policy has no state of its own to
// save (the round follows from the step), so a resumed run continues bit for bit. The trainer's
// validation loss is then the replicas' mean, each on its own rows.
// With `weighted`, a round weighs each replica by the weight of its round (the sum of its steps'
// ctx.step_weight, the rows it took, say), sent with its values: replica i takes
// sum_j r_j x_j / sum_j r_j over itself and those it hears from. The mix is then P_ij r_j / D_i
// (D_i = sum_j P_ij r_j) for the topology's doubly stochastic P, so a round keeps
// sum_i D_i x_i = sum_j r_j x_j: the values weighted by this round's weights, each replica's
// steps entering by its rows; at equal weights it is D-PSGD.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decentrain/comm/policy.hpp"
#include "decentrain/comm/topology.hpp"

namespace decentrain::comm {

// One gossip round on `values` (this replica's, replaced by the average of its own and those it
// receives from): sends first, then receives, so every replica may call it at once whatever the
// topology. The neighbour lists must be consistent (j sends to i in round t exactly when i
// receives from j); a peer named twice or out of range is refused, naming the topology. With
// `weight`, every replica must pass one: the average weighs each replica's values by it (a
// message then leads with the sender's weight, an f64), and a weight that is not finite and
// >= 0 is refused, naming the peer; where every weight heard is 0 (no replica took a row), the
// values stay as they are.
template <class Topology, class Comm>
void gossip_round(const Topology& topo, Comm& replicas, std::int64_t round, std::span<float> values,
                  std::vector<float>& scratch, std::vector<double>& sum, std::optional<double> weight = std::nullopt) {
  const int me = replicas.rank(), n = replicas.world();
  const auto to = checked_neighbours(topo.sends_to(me, n, round), topo, me, n, round, "gossip");
  const auto from = checked_neighbours(topo.receives_from(me, n, round), topo, me, n, round, "gossip");
  const std::size_t head = weight ? 2 : 0;  // floats holding the weight
  if (weight)
    decentrain::detail::check(std::isfinite(*weight) && *weight >= 0, "gossip: this replica's round weighs ", *weight,
                              " (a weighted round needs a weight that is finite and >= 0)");
  // Every replica sends before it receives: each says first what it will take, so a transport
  // that bounds what it queues from a peer takes these whole (transport::expect).
  for (int j : from) replicas.expect_from(j, (head + values.size()) * sizeof(float));
  if (!to.empty()) {
    if (weight) {
      scratch.resize(head + values.size());
      std::memcpy(scratch.data(), &*weight, sizeof(double));
      std::copy(values.begin(), values.end(), scratch.begin() + 2);
    }
    const std::span<const float> message = weight ? std::span<const float>(scratch) : std::span<const float>(values);
    for (int j : to) replicas.send_to(j, message);
  }
  if (from.empty()) return;
  // In double, in the order of `from`, so a round's result does not depend on message timing.
  const double own = weight.value_or(1.0);
  sum.resize(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) sum[i] = weight ? own * values[i] : static_cast<double>(values[i]);
  double total = own;
  scratch.resize(head + values.size());
  for (int j : from) {
    replicas.recv_from(j, std::span<float>(scratch));
    if (!weight) {
      for (std::size_t i = 0; i < values.size(); ++i) sum[i] += scratch[i];
      total += 1;
      continue;
    }
    double w = 0;
    std::memcpy(&w, scratch.data(), sizeof w);
    decentrain::detail::check(std::isfinite(w) && w >= 0, "gossip: peer ", j, " sent the round weight ", w,
                              " (a weight must be finite and >= 0)");
    for (std::size_t i = 0; i < values.size(); ++i) sum[i] += w * scratch[head + i];
    total += w;
  }
  decentrain::detail::check(std::isfinite(total), "gossip: the round weights heard add up to ", total,
                            " (a peer sent one too large)");
  if (total == 0) return;
  const double scale = 1.0 / total;
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<float>(sum[i] * scale);
    decentrain::detail::check(!weight || std::isfinite(values[i]), "gossip: value ", i, " is not finite after a weighted ",
                              "round (a peer sent weights or values too large)");
  }
}

template <class Topology = topology::one_peer_exponential>
struct gossip {
  static_assert(check_topology<Topology>());
  using policy_concept = policy_tag;
  static constexpr const char* name = "gossip";
  // The replicas differ between rounds: the trainer measures their consensus distance at each
  // evaluation (eval_point::consensus_distance).
  static constexpr bool replicas_differ = true;

  std::int64_t inner_steps = 1;  // steps between gossip rounds (D-PSGD: 1)
  Topology topology{};
  // Average by the weight of the replicas' rounds (the sum of ctx.step_weight over the round's
  // steps, kept in the checkpoint), sent with the values (see above).
  bool weighted = false;

  template <class Ctx>
  void start(Ctx& ctx) {
    decentrain::detail::check(inner_steps >= 1, "gossip: inner_steps must be >= 1, got ", inner_steps);
    if constexpr (requires { topology.validate(); }) topology.validate();
    check_same_settings(ctx, describe(), "gossip: the peers gossip differently", "the same topology and inner_steps");
    if (!ctx.resumed) broadcast_parameters(ctx, buffer_);
  }
  template <class Ctx>
  void after_backward(Ctx&) {}
  template <class Ctx>
  void after_step(Ctx& ctx) {
    weight_.add(ctx);
    if (!ends_round(ctx, inner_steps)) return;
    gather_values(ctx.parameters, buffer_);
    gossip_round(topology, ctx.replicas, ctx.step / inner_steps, std::span<float>(buffer_), scratch_, sum_,
                 weight_if(weighted, weight_.sum));
    weight_.sum = 0;
    scatter_values(ctx.parameters, buffer_);
  }
  bool ends_round_at(std::int64_t step) const { return ends_round(step, inner_steps); }
  void save(io::checkpoint& c) const {
    if (weighted) weight_.save(c, "comm.gossip.");
  }
  void load(const io::checkpoint& c) { weight_.load(c, "comm.gossip."); }

  std::string describe() const {
    return std::string(name) + ":" + topology_name(topology) + ",inner_steps=" + std::to_string(inner_steps) +
           (weighted ? ",weighted" : "");
  }

 private:
  std::vector<float> buffer_, scratch_;
  std::vector<double> sum_;
  round_weight weight_;
};

}  // namespace decentrain::comm
