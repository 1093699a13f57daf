// Push-sum gossip (Stochastic Gradient Push: Assran et al. 2019, arXiv 1811.10792; push-sum:
// Kempe et al. 2003). Each replica holds its parameters z and a push-sum weight w (1 at the
// start); a round splits the numerator x = w z and the weight into d + 1 equal shares, keeps one
// and pushes one to each of the d peers its Topology sends to, then adds what it receives and
// de-biases: z = x / w. Only column sums matter, so the graph may be directed, irregular and
// different every round (a peer need not receive from those it sends to): the replicas' weighted
// mean sum(x) / sum(w) is kept whatever the graph, where D-PSGD's equal weights keep the mean only
// on graphs whose in-degree equals out-degree everywhere.
//   overlap       (OSGP) a round adds the messages of the round before: they travelled while this
//                 peer computed a step, so sending overlaps compute; one round stale. The last
//                 step takes both, leaving nothing in flight.
//   running_sums  each message carries everything ever sent along its edge (in f64), and the
//                 receiver adds the difference from the last one it got (Hadjicostis et al. 2016,
//                 arXiv 1412.8014): a lost message's mass arrives with the next one on that edge
//                 instead of being lost (BlueFog and SGP assume no loss). It doubles the bytes
//                 and keeps 2 x (model + 1) f64 per edge used.
//   drop_fraction fault injection for tests and benchmarks: that fraction of messages (drawn from
//                 drop_seed, the round and the edge) arrives as "lost", the receiver learning
//                 nothing from it.
//   weighted      a round weighs each replica by the weight of its round r (the sum of its steps'
//                 ctx.step_weight, the rows it took, say) as well as by its push-sum weight: the
//                 shares carry r w z and r w beside w, and z = sum(r w z) / sum(r w) over what
//                 the replica keeps and receives, while w mixes as before (so it still de-biases
//                 the graph, and r does not compound from round to round). A round then keeps
//                 sum_i D_i z_i = sum_j r_j w_j z_j (D_i: the replica's sum(r w)); at equal r it is
//                 plain push-sum.
// Under fault::elastic a re-formed view starts the edges afresh (drop_in_flight): mass in flight
// to the old view is lost, which push-sum's de-biasing tolerates (the weights lose it too). A
// resumed run continues bit for bit: the weight, the running sums and the messages in flight are
// in the checkpoint, and a peer restored from its own state sends its in-flight messages again.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decentrain/comm/policy.hpp"
#include "decentrain/comm/topology.hpp"
#include "decentrain/detail/hash.hpp"

namespace decentrain::comm {

// One replica's push-sum state and its messages; push_sum (below) drives it from the trainer,
// and it works on any flat values (tests and benchmarks mix plain vectors).
class push_sum_mixer {
 public:
  struct settings {
    bool running_sums = false;
    bool weighted = false;  // messages carry r w beside w (see above); send then takes r
    double drop_fraction = 0;
    std::uint64_t drop_seed = 0;
  };
  push_sum_mixer() = default;
  explicit push_sum_mixer(settings s) : s_(s) {}

  double weight() const { return weight_; }
  void set_weight(double w) { weight_ = w; }
  void configure(settings s) { s_ = s; }

  // Round `round`'s messages to this replica will come: said before this peer sends its own
  // (transport::expect), so a transport that bounds what it queues from a peer takes them whole.
  template <class Topology, class Comm>
  void expect(const Topology& topo, Comm& replicas, std::int64_t round, std::size_t size) {
    const int me = replicas.rank(), n = replicas.world();
    for (int j : checked_neighbours(topo.receives_from(me, n, round), topo, me, n, round, "push-sum"))
      replicas.expect_from(j, message_floats(size) * sizeof(float));
  }

  // Round `round`'s shares of (w z, w), or under `weighted` of (r w z, r w, w) with r this
  // replica's round weight: one kept, one sent to each peer the topology names. Messages of this
  // round are expected from the peers that send to this one (said before sending, as
  // gossip_round does).
  template <class Topology, class Comm>
  void send(const Topology& topo, Comm& replicas, std::int64_t round, std::span<const float> z, double r = 1) {
    const int me = replicas.rank(), n = replicas.world();
    const auto to = checked_neighbours(topo.sends_to(me, n, round), topo, me, n, round, "push-sum");
    decentrain::detail::check(std::isfinite(r) && r >= 0, "push-sum: this replica's round weighs ", r,
                              " (a weighted round needs a weight that is finite and >= 0)");
    if (!s_.weighted) r = 1;
    expect(topo, replicas, round, z.size());
    // The weight splits exactly: each peer gets s = w / (d + 1) rounded, and w - d s (a multiple
    // of s's unit in the last place, near s) is exact, so the total weight drifts by rounding
    // alone, not by w (1/3) rounding the same way every round.
    const auto d = static_cast<double>(to.size());
    const double sent_w = weight_ / (d + 1);
    kept_w_ = std::fma(-d, sent_w, weight_);
    // The values' shares: of w z, or of r w z (then with r w's share beside w's).
    const double sent_v = s_.weighted ? sent_w * r : sent_w, kept_v = s_.weighted ? kept_w_ * r : kept_w_;
    kept_rw_ = kept_v;
    kept_x_.resize(z.size());
    for (std::size_t i = 0; i < z.size(); ++i) kept_x_[i] = kept_v * static_cast<double>(z[i]);
    const std::size_t head = header_floats(), masses = s_.weighted ? 2 : 1;
    outbox_.clear();
    for (int j : to) {
      auto& m = outbox_[j];
      m.assign(message_floats(z.size()), 0.0f);
      if (s_.running_sums) {
        auto& sum = sent_[j];  // [w, (r w,) values]
        sum.resize(z.size() + masses, 0.0);
        sum[0] += sent_w;
        if (s_.weighted) sum[1] += sent_v;
        for (std::size_t i = 0; i < z.size(); ++i) sum[i + masses] += sent_v * static_cast<double>(z[i]);
        for (std::size_t k = 0; k < masses; ++k) put_double(m, 2 + 2 * k, sum[k]);
        std::memcpy(m.data() + head, sum.data() + masses, z.size() * sizeof(double));
      } else {
        put_double(m, 2, sent_w);
        if (s_.weighted) put_double(m, 4, sent_v);
        for (std::size_t i = 0; i < z.size(); ++i) m[head + i] = static_cast<float>(sent_v * static_cast<double>(z[i]));
      }
      if (dropped(round, me, j)) put_double(m, 0, 1.0);  // arrives as "lost"
      replicas.send_to(j, std::span<const float>(m));
    }
  }

  // Adds round `round`'s messages from the peers that send to this one (their send of that
  // round), in the order of the topology's list: a round's result does not depend on timing.
  template <class Topology, class Comm>
  void receive(const Topology& topo, Comm& replicas, std::int64_t round, std::size_t size) {
    const int me = replicas.rank(), n = replicas.world();
    inbox_.resize(message_floats(size));
    const std::size_t head = header_floats(), masses = s_.weighted ? 2 : 1;
    for (int j : checked_neighbours(topo.receives_from(me, n, round), topo, me, n, round, "push-sum")) {
      replicas.recv_from(j, std::span<float>(inbox_));
      if (get_double(inbox_, 0) != 0.0) continue;  // lost: nothing learned (a running sum brings it later)
      const double w = get_double(inbox_, 2), rw = s_.weighted ? get_double(inbox_, 4) : w;
      decentrain::detail::check(std::isfinite(w) && w > 0, "push-sum: peer ", j, " sent the weight ", w,
                                " (a weight must be finite and > 0)");
      decentrain::detail::check(std::isfinite(rw) && rw >= 0, "push-sum: peer ", j, " sent the weighted mass ", rw,
                                " (it must be finite and >= 0)");
      if (s_.running_sums) {
        auto& seen = seen_[j];
        seen.resize(size + masses, 0.0);
        kept_w_ += w - seen[0];
        seen[0] = w;
        if (s_.weighted) {
          kept_rw_ += rw - seen[1];
          seen[1] = rw;
        }
        for (std::size_t i = 0; i < size; ++i) {
          double v;
          std::memcpy(&v, inbox_.data() + head + 2 * i, sizeof v);
          kept_x_[i] += v - seen[i + masses];
          seen[i + masses] = v;
        }
      } else {
        kept_w_ += w;
        kept_rw_ += rw;
        for (std::size_t i = 0; i < size; ++i) kept_x_[i] += static_cast<double>(inbox_[head + i]);
      }
    }
  }

  // The new weight, and z = x / w (weighted: sum(r w z) / sum(r w), z kept where that is 0:
  // no replica it heard from took a row).
  void finish(std::span<float> z) {
    decentrain::detail::check(std::isfinite(kept_w_) && kept_w_ > 0, "push-sum: this replica's weight became ", kept_w_);
    weight_ = kept_w_;
    const double mass = s_.weighted ? kept_rw_ : weight_;
    decentrain::detail::check(std::isfinite(mass) && mass >= 0, "push-sum: this replica's weighted mass became ", mass,
                              " (its peers sent masses that are too large, or running sums that went down)");
    if (mass == 0) return;
    for (std::size_t i = 0; i < z.size(); ++i) {
      z[i] = static_cast<float>(kept_x_[i] / mass);
      decentrain::detail::check(std::isfinite(z[i]), "push-sum: value ", i, " is not finite after a round (a peer sent ",
                                "values that are not)");
    }
  }

  // The edges start afresh: a view of other peers (running sums and messages kept per peer).
  void forget_peers() {
    sent_.clear();
    seen_.clear();
    outbox_.clear();
  }

  // Messages sent but perhaps not received (an overlapped round's), the running sums and the
  // weight. `load` takes the weight, and holds the rest until `resend_after_restore` takes it
  // back and sends those messages again (a whole group resumed from its checkpoints stands where
  // it saved, every message it had sent still to be received); a state adopted from another peer
  // is left there (its edges are that peer's).
  void save(io::checkpoint& c, const std::string& prefix, bool in_flight) const {
    c.tensors[prefix + "weight"] = from_vector<cpu>(std::vector<double>{weight_}, shape{1});
    for (const auto& [j, v] : sent_) c.tensors[prefix + "sent." + std::to_string(j)] = from_vector<cpu>(v, shape{static_cast<std::int64_t>(v.size())});
    for (const auto& [j, v] : seen_) c.tensors[prefix + "seen." + std::to_string(j)] = from_vector<cpu>(v, shape{static_cast<std::int64_t>(v.size())});
    if (in_flight)
      for (const auto& [j, m] : outbox_)
        c.tensors[prefix + "outbox." + std::to_string(j)] = from_vector<cpu>(m, shape{static_cast<std::int64_t>(m.size())});
  }
  void load(const io::checkpoint& c, const std::string& prefix) {
    const auto w = c.tensor_at(prefix + "weight");
    decentrain::detail::check(w.dtype() == dtype::f64 && w.numel() == 1, "checkpoint: '", prefix, "weight' is not one f64");
    weight_ = w.to_vector<double>()[0];
    decentrain::detail::check(std::isfinite(weight_) && weight_ > 0, "checkpoint: '", prefix, "weight' is ", weight_);
    restored_sent_.clear();
    restored_seen_.clear();
    restored_outbox_.clear();
    for (const auto& [key, t] : c.tensors) {
      if (!key.starts_with(prefix)) continue;
      const std::string rest = key.substr(prefix.size());
      for (const char* kind : {"sent.", "seen.", "outbox."}) {
        if (!rest.starts_with(kind)) continue;
        const int j = std::stoi(rest.substr(std::strlen(kind)));
        if (std::strcmp(kind, "outbox.") == 0) restored_outbox_[j] = t.to_vector<float>();
        else (std::strcmp(kind, "sent.") == 0 ? restored_sent_ : restored_seen_)[j] = t.to_vector<double>();
      }
    }
  }
  template <class Comm>
  void resend_after_restore(Comm& replicas) {
    for (const auto& [j, m] : restored_outbox_) {
      decentrain::detail::check(j >= 0 && j < replicas.world() && j != replicas.rank(), "push-sum: a restored message is for peer ", j,
                                ", not a peer of this group of ", replicas.world());
      replicas.send_to(j, std::span<const float>(m));
    }
    outbox_ = std::move(restored_outbox_);
    sent_ = std::move(restored_sent_);
    seen_ = std::move(restored_seen_);
    drop_restored();
  }
  // A state taken from another peer (a joiner's, an adopted one) keeps the weight only.
  void drop_restored() {
    restored_outbox_.clear();
    restored_sent_.clear();
    restored_seen_.clear();
  }

 private:
  // A message: [lost flag (f64), weight (f64), (weighted: r w (f64),) values]: f32 values, or f64
  // running sums.
  std::size_t header_floats() const { return s_.weighted ? 6 : 4; }
  std::size_t message_floats(std::size_t size) const { return header_floats() + size * (s_.running_sums ? 2 : 1); }
  static void put_double(std::vector<float>& m, std::size_t at, double v) { std::memcpy(m.data() + at, &v, sizeof v); }
  static double get_double(const std::vector<float>& m, std::size_t at) {
    double v;
    std::memcpy(&v, m.data() + at, sizeof v);
    return v;
  }
  bool dropped(std::int64_t round, int from, int to) const {
    if (s_.drop_fraction <= 0) return false;
    std::uint64_t h = decentrain::detail::splitmix64(s_.drop_seed ^ 0x64726f70ull);
    for (const std::uint64_t v : {static_cast<std::uint64_t>(round), static_cast<std::uint64_t>(from), static_cast<std::uint64_t>(to)})
      h = decentrain::detail::splitmix64(h ^ v);
    return static_cast<double>(h >> 11) * 0x1.0p-53 < s_.drop_fraction;
  }

  settings s_{};
  double weight_ = 1, kept_w_ = 1, kept_rw_ = 1;
  std::vector<double> kept_x_;
  std::vector<float> inbox_;
  std::map<int, std::vector<double>> sent_, seen_, restored_sent_, restored_seen_;
  std::map<int, std::vector<float>> outbox_, restored_outbox_;
};

template <class Topology = topology::one_peer_exponential>
struct push_sum {
  static_assert(check_topology<Topology>());
  using policy_concept = policy_tag;
  static constexpr const char* name = "push-sum";
  static constexpr bool replicas_differ = true;

  std::int64_t inner_steps = 1;  // steps between rounds (SGP: 1)
  Topology topology{};
  bool overlap = false;          // OSGP: a round takes the previous round's messages
  bool running_sums = false;     // robust to lost messages
  double drop_fraction = 0;      // fault injection: messages that arrive as lost
  std::uint64_t drop_seed = 0;
  // Average by the weight of the replicas' rounds (the sum of ctx.step_weight over the round's
  // steps, kept in the checkpoint) as well as by the push-sum weight (see above).
  bool weighted = false;

  template <class Ctx>
  void start(Ctx& ctx) {
    decentrain::detail::check(inner_steps >= 1, "push-sum: inner_steps must be >= 1, got ", inner_steps);
    decentrain::detail::check(drop_fraction >= 0 && drop_fraction < 1, "push-sum: drop_fraction must be in [0, 1), got ",
                              drop_fraction);
    if constexpr (requires { topology.validate(); }) topology.validate();
    check_same_settings(ctx, describe(), "push-sum: the peers mix differently",
                        "the same topology, inner_steps, overlap, running sums and weighted");
    mixer_.configure({running_sums, weighted, drop_fraction, drop_seed});
    rank_ = ctx.replicas.rank();
    world_ = ctx.replicas.world();
    if (ctx.resumed && !ctx.joined && restored_rank_ == rank_ && restored_world_ == world_) {
      // Every peer restored from its own checkpoint of the same step: the messages it had sent
      // and the others had not received go out again.
      if (restored_awaiting_) mixer_.expect(topology, ctx.replicas, *restored_awaiting_, flat_size(ctx.parameters));
      mixer_.resend_after_restore(ctx.replicas);
      awaiting_ = restored_awaiting_;
    } else {
      mixer_.drop_restored();
      if (ctx.joined) mixer_.forget_peers();
      awaiting_.reset();
    }
    if (!ctx.resumed) {
      broadcast_parameters(ctx, buffer_);
      mixer_.set_weight(1.0);
    }
  }
  template <class Ctx>
  void after_backward(Ctx&) {}
  template <class Ctx>
  void after_step(Ctx& ctx) {
    weight_.add(ctx);
    if (!ends_round(ctx, inner_steps)) return;
    const std::int64_t round = ctx.step / inner_steps;
    rank_ = ctx.replicas.rank();
    world_ = ctx.replicas.world();
    gather_values(ctx.parameters, buffer_);
    mixer_.send(topology, ctx.replicas, round, std::span<const float>(buffer_), weight_.sum);
    if (!overlap) {
      mixer_.receive(topology, ctx.replicas, round, buffer_.size());
    } else {
      if (awaiting_) mixer_.receive(topology, ctx.replicas, *awaiting_, buffer_.size());
      awaiting_ = round;
      if (ctx.last_step) {  // nothing left in flight
        mixer_.receive(topology, ctx.replicas, round, buffer_.size());
        awaiting_.reset();
      }
    }
    mixer_.finish(std::span<float>(buffer_));
    scatter_values(ctx.parameters, buffer_);
    weight_.sum = 0;  // (only now: an exchange that failed is redone with the round's weight)
  }
  bool ends_round_at(std::int64_t step) const { return ends_round(step, inner_steps); }
  // A re-formed view: other peers at these ranks, nothing in flight (the trainer's set_view).
  void drop_in_flight() {
    mixer_.forget_peers();
    awaiting_.reset();
  }
  double weight() const { return mixer_.weight(); }

  void save(io::checkpoint& c) const {
    mixer_.save(c, "comm.push_sum.", awaiting_.has_value());
    c.counters["comm.push_sum.awaiting"] = awaiting_ ? *awaiting_ : -1;
    c.counters["comm.push_sum.rank"] = rank_;
    c.counters["comm.push_sum.world"] = world_;
    c.counters["comm.push_sum.weighted"] = weighted;  // (its messages and running sums carry r w)
    if (weighted) weight_.save(c, "comm.push_sum.");
  }
  void load(const io::checkpoint& c) {
    // A checkpoint without the key was written before push-sum weighed: unweighted.
    const auto saved_weighted = c.counters.find("comm.push_sum.weighted");
    decentrain::detail::check((saved_weighted != c.counters.end() && saved_weighted->second != 0) == weighted,
                              "checkpoint: push-sum was saved with weighted ", weighted ? "off" : "on", ", and this policy has it ",
                              weighted ? "on" : "off", " (its messages and running sums are laid out differently)");
    mixer_.load(c, "comm.push_sum.");
    const auto a = c.counter("comm.push_sum.awaiting");
    restored_awaiting_ = a >= 0 ? std::optional<std::int64_t>(a) : std::nullopt;
    restored_rank_ = static_cast<int>(c.counter("comm.push_sum.rank"));
    restored_world_ = static_cast<int>(c.counter("comm.push_sum.world"));
    awaiting_.reset();
    weight_.load(c, "comm.push_sum.");
  }

  std::string describe() const {
    return std::string(name) + ":" + topology_name(topology) + ",inner_steps=" + std::to_string(inner_steps) +
           (overlap ? ",overlap" : "") + (running_sums ? ",running_sums" : "") + (weighted ? ",weighted" : "");
  }

 private:
  push_sum_mixer mixer_;
  round_weight weight_;
  std::vector<float> buffer_;
  std::optional<std::int64_t> awaiting_, restored_awaiting_;
  int rank_ = -1, world_ = -1, restored_rank_ = -2, restored_world_ = -2;
};

}  // namespace decentrain::comm
