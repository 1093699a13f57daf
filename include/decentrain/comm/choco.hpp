// CHOCO-SGD (Koloskova et al. 2019, arXiv 1902.00340): gossip through any codec of compress/.
// Averaging compressed parameters loses what the codec drops every round; CHOCO instead keeps a
// public copy x^ of every replica's parameters, which all its neighbours hold alike, and each
// round sends only the compressed difference q = Q(x - x^). Sender and receivers add the same
// decoded q to their copies of x^, so the copies never disagree, and the replica moves towards its
// neighbours' public copies by the consensus step size gamma:
//   x += gamma * sum_j w_ij (x^_j - x^_i),    w_ij = 1 / (d + 1) (equal weights on a regular graph).
// What the codec drops stays in x - x^ and goes out in a later round (error feedback by
// construction), so biased codecs (sign, top-k) converge where plain compressed gossip does not;
// but only for gamma small enough for the codec: at gamma = 1 a biased codec overshoots and
// diverges (tests/comm/test_choco.cpp shows both). Theory sets gamma in proportion to the codec's
// fidelity delta = 1 - |Q(v) - v|^2 / |v|^2 (Koloskova et al.'s Theorem 2); the default
// (consensus_step 0) measures delta on a fixed Gaussian vector and takes gamma = delta / 3: 0.21
// for sign, 0.028 for top-1%. On a ring of 16, top-1% diverged at gamma 0.1 and above and
// converged at 0.03 (measured in that test's setting); sign converged at 1.
// Memory: the replica's own public copy and the sum of its neighbours' (CHOCO's efficient form),
// so the graph must be fixed: a topology whose neighbours change with the round is refused. Under
// fault::elastic a new view starts the copies afresh on every member (they are per neighbour).
// It has no `weighted`: weighing neighbour j by its round's weight needs sum_j r_j x^_j, which the
// sum of the copies cannot give when r_j changes (it would take a copy per neighbour).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "decentrain/comm/policy.hpp"
#include "decentrain/comm/topology.hpp"
#include "decentrain/compress/sign.hpp"
#include "decentrain/core/rng.hpp"

namespace decentrain::comm {

// One replica's public copy and its neighbours' sum; choco (below) drives it from the trainer.
class choco_mixer {
 public:
  // Refused unless the topology names the same neighbours, both ways, in every round (a ring, a
  // torus, the static exponential graph).
  template <class Topology>
  static void check_fixed(const Topology& topo, int n) {
    comm::check_fixed(topo, n, "choco", "CHOCO keeps its neighbours' public copies (ring, torus)", true);
  }

  // A round on `x`: encode x - x^, add the decoded difference to x^, send it to the neighbours,
  // add theirs to the neighbours' sum, and step x by gamma towards them.
  template <class Topology, class Codec, class Comm>
  void round(const Topology& topo, Codec& codec, Comm& replicas, double gamma, std::span<float> x) {
    const int me = replicas.rank(), n = replicas.world();
    const auto neighbours = checked_neighbours(topo.sends_to(me, n, 0), topo, me, n, 0, "choco");
    if (own_.size() != x.size()) {
      own_.assign(x.size(), 0.0f);
      others_.assign(x.size(), 0.0f);
    }
    const std::size_t bound = codec.max_encoded_bytes(x.size());
    for (int j : neighbours) replicas.expect_from(j, 8 + bound);
    diff_.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) diff_[i] = x[i] - own_[i];
    message_.assign(8 + bound, std::byte{0});
    const std::uint64_t size = codec.encode(std::span<const float>(diff_), std::span<std::byte>(message_).subspan(8));
    decentrain::detail::check(size <= bound, "choco: the codec wrote ", size, " bytes, over its own bound of ", bound);
    std::memcpy(message_.data(), &size, 8);
    codec.decode_add(std::span<const std::byte>(message_).subspan(8, size), std::span<float>(own_));
    for (int j : neighbours) replicas.send_to(j, std::span<const std::byte>(message_));
    inbox_.resize(8 + bound);
    for (int j : neighbours) {
      replicas.recv_from(j, std::span<std::byte>(inbox_));
      std::uint64_t got = 0;
      std::memcpy(&got, inbox_.data(), 8);
      decentrain::detail::check(got <= bound, "choco: peer ", j, " announced a payload of ", got, " bytes, over the codec's bound of ",
                                bound);
      try {
        codec.decode_add(std::span<const std::byte>(inbox_).subspan(8, got), std::span<float>(others_));
      } catch (const decentrain::error& e) {
        decentrain::detail::fail("choco: peer ", j, " sent a payload the codec rejects: ", e.what());
      }
    }
    const double w = 1.0 / static_cast<double>(neighbours.size() + 1), d = static_cast<double>(neighbours.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<float>(x[i] + gamma * w * (others_[i] - d * own_[i]));
      decentrain::detail::check(std::isfinite(x[i]), "choco: value ", i, " is not finite after a round (a neighbour's ",
                                "public copy is not, or gamma ", gamma, " diverges with this codec)");
    }
  }
  // The neighbours are other peers: every copy starts afresh (every member does the same).
  void forget_peers() {
    own_.clear();
    others_.clear();
  }
  // Saved by the peer that holds them; `load` holds them until `take_restored` (a peer restored
  // from its own checkpoint), a state adopted from another peer leaves them (its neighbours').
  void save(io::checkpoint& c, const std::string& prefix) const {
    c.tensors[prefix + "public_own"] = flat_tensor(own_, c);
    c.tensors[prefix + "public_neighbours"] = flat_tensor(others_, c);
  }
  void load(const io::checkpoint& c, const std::string& prefix) {
    restored_own_ = c.tensor_at(prefix + "public_own").to_vector<float>();
    restored_others_ = c.tensor_at(prefix + "public_neighbours").to_vector<float>();
    decentrain::detail::check(restored_own_.size() == restored_others_.size(), "checkpoint: '", prefix,
                              "public_own' and 'public_neighbours' differ in size");
  }
  void take_restored() {
    own_ = std::move(restored_own_);
    others_ = std::move(restored_others_);
    drop_restored();
  }
  void drop_restored() {
    restored_own_.clear();
    restored_others_.clear();
  }

 private:
  std::vector<float> own_, others_, diff_, restored_own_, restored_others_;
  std::vector<std::byte> message_, inbox_;
};

template <class Topology = topology::ring, class Codec = compress::sign>
struct choco {
  static_assert(check_topology<Topology>());
  static_assert(compress::check_codec<Codec>());
  using policy_concept = policy_tag;
  static constexpr const char* name = "choco";
  static constexpr bool replicas_differ = true;

  std::int64_t inner_steps = 1;  // steps between rounds (CHOCO-SGD: 1)
  Topology topology{};
  Codec codec{};
  double consensus_step = 0;     // gamma; 0: a third of the codec's measured fidelity (see above)

  template <class Ctx>
  void start(Ctx& ctx) {
    decentrain::detail::check(inner_steps >= 1, "choco: inner_steps must be >= 1, got ", inner_steps);
    decentrain::detail::check(consensus_step >= 0 && consensus_step <= 1,
                              "choco: consensus_step must be in (0, 1] (0: from the codec's fidelity), got ", consensus_step);
    if constexpr (requires { topology.validate(); }) topology.validate();
    const std::string codec_name = compress::describe(codec);
    for (const char* own_round : {"ef(", "adaptive(", "powersgd("})
      decentrain::detail::check(codec_name.find(own_round) == std::string::npos, "choco: codec '", codec_name,
                                "' runs a collective of its own; CHOCO sends one payload to each neighbour and already ",
                                "keeps what the codec drops (use its plain form)");
    choco_mixer::check_fixed(topology, ctx.replicas.world());
    prepare_codec(codec, ctx);
    gamma_ = consensus_step > 0 ? consensus_step : fidelity(codec, flat_size(ctx.parameters)) / 3;
    check_same_settings(ctx, describe(), "choco: the peers mix differently", "the same topology, inner_steps and consensus_step");
    if (ctx.resumed && !ctx.joined && restored_rank_ == ctx.replicas.rank() && restored_world_ == ctx.replicas.world()) {
      mixer_.take_restored();
    } else {
      mixer_.drop_restored();
      if (ctx.joined) mixer_.forget_peers();
    }
    rank_ = ctx.replicas.rank();
    world_ = ctx.replicas.world();
    if (!ctx.resumed) broadcast_parameters(ctx, buffer_);
  }
  template <class Ctx>
  void after_backward(Ctx&) {}
  template <class Ctx>
  void after_step(Ctx& ctx) {
    if (!ends_round(ctx, inner_steps)) return;
    if (ctx.replicas.world() != world_) choco_mixer::check_fixed(topology, ctx.replicas.world());
    rank_ = ctx.replicas.rank();
    world_ = ctx.replicas.world();
    gather_values(ctx.parameters, buffer_);
    mixer_.round(topology, codec, ctx.replicas, gamma_, std::span<float>(buffer_));
    scatter_values(ctx.parameters, buffer_);
  }
  bool ends_round_at(std::int64_t step) const { return ends_round(step, inner_steps); }
  void drop_in_flight() { mixer_.forget_peers(); }
  double gamma() const { return gamma_; }

  // delta = 1 - |Q(g) - g|^2 / |g|^2 for g a fixed N(0, 1) vector of the model's size (at most
  // 2^20 values), through a copy of the codec (its state untouched): the same on every peer.
  static double fidelity(const Codec& codec, std::size_t size) {
    size = std::clamp<std::size_t>(size, 1, std::size_t{1} << 20);
    rng gen(0x63686f636fu, "choco.fidelity");  // "choco"
    std::vector<float> g(size), decoded(size, 0.0f);
    for (auto& v : g) v = static_cast<float>(gen.normal());
    Codec probe = codec;
    std::vector<std::byte> payload(probe.max_encoded_bytes(size));
    const std::size_t bytes = probe.encode(std::span<const float>(g), std::span<std::byte>(payload));
    probe.decode_add(std::span<const std::byte>(payload).subspan(0, bytes), std::span<float>(decoded));
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < size; ++i) {
      err += (static_cast<double>(decoded[i]) - g[i]) * (static_cast<double>(decoded[i]) - g[i]);
      norm += static_cast<double>(g[i]) * g[i];
    }
    return std::clamp(1.0 - err / norm, 1e-6, 1.0);
  }

  void save(io::checkpoint& c) const {
    mixer_.save(c, "comm.choco.");
    save_codec(codec, c, "comm.choco.codec.");
    c.counters["comm.choco.rank"] = rank_;
    c.counters["comm.choco.world"] = world_;
  }
  void load(const io::checkpoint& c) {
    mixer_.load(c, "comm.choco.");
    load_codec(codec, c, "comm.choco.codec.");
    restored_rank_ = static_cast<int>(c.counter("comm.choco.rank"));
    restored_world_ = static_cast<int>(c.counter("comm.choco.world"));
  }

  std::string describe() const {
    char gamma[32];
    std::snprintf(gamma, sizeof gamma, "%.17g", consensus_step);
    return std::string(name) + ":" + topology_name(topology) + ",inner_steps=" + std::to_string(inner_steps) + ",gamma=" + gamma;
  }

 private:
  choco_mixer mixer_;
  std::vector<float> buffer_;
  int rank_ = -1, world_ = -1, restored_rank_ = -2, restored_world_ = -2;
  double gamma_ = 0;
};

}  // namespace decentrain::comm
