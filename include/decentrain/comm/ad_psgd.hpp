// Asynchronous decentralized SGD (AD-PSGD: Lian et al. 2018, arXiv 1710.06952): no round that
// every peer waits for. After every `inner_steps` steps a replica with no request open asks one
// neighbour (drawn at random) to average with it, and goes on computing;
// after every step it polls its neighbours (the transport's try-receive) and answers whatever
// has come. A request carries the asker's parameters x_i as they were when it asked; the
// neighbour j, when it finds the request, moves half-way towards them (x_j -= d with
// d = (x_j - x_i) / 2) and answers d, which the asker adds when the answer comes. Each pair's
// sum is kept, as AD-PSGD's atomic average keeps it; the asker's half lands on its parameters as
// they stand when the answer comes (the steps it took meanwhile kept), where AD-PSGD averages
// under a lock. Nobody waits on a peer: a slow one delays only the answers it owes (a neighbour
// waiting for one asks nobody else meanwhile, but computes on).
// With `weighted`, each side weighs by the weight of its latest step (ctx.step_weight: the rows it
// took, say), the request carrying the asker's a: the neighbour, of weight b, moves by
// a (x_j - x_i) / (a + b) and answers b (x_j - x_i) / (a + b), so an exchange keeps the pair's
// weighted sum a x_i + b x_j and both land on its weighted mean (a peer's speed is in how often
// it asks and answers, not in its weight).
//
// A drain settles every exchange: each replica tells its neighbours it asks no more, answers
// what they still send until they have said the same, then waits for its own open answers. It
// comes at the last step (nothing is left in flight when the run ends) and every `drain_every`
// steps (0: only at the end). Drains, and the trainer's evaluations (an all-reduce of the loss),
// are the only points where peers wait for one another: checkpoints taken at a drain resume bit
// for bit in a deterministic simulation on ideal links (where a drain leaves every clock at one
// time); one taken elsewhere resumes with its open requests forgotten, so the halves of those
// exchanges that landed are not matched.
//
// The graph must be fixed; a replica exchanges with those it sends to and those it receives from.
// fault::elastic re-forms the group at a step every member shares, which asynchronous peers do
// not have: the trainer refuses the pair (train/concepts.hpp's `asynchronous`).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "decentrain/comm/policy.hpp"
#include "decentrain/comm/topology.hpp"
#include "decentrain/detail/hash.hpp"

namespace decentrain::comm {

// One replica's side of the pairwise exchanges with its neighbours; ad_psgd (below) drives it
// from the trainer, and it works on any flat values (tests mix plain vectors).
class pairwise_averager {
 public:
  // Ranks of `replicas` this replica exchanges with, and the values' count: every exchange
  // starts afresh (a new run, a resumed one, another communicator).
  // With `weighted`, every replica's calls say its weight (see above; a message then carries it).
  template <class Comm>
  void begin(Comm& replicas, std::vector<int> neighbours, std::size_t size, bool weighted = false) {
    neighbours_ = std::move(neighbours);
    size_ = size;
    head_ = weighted ? 3 : 1;
    const std::size_t d = neighbours_.size();
    open_.assign(d, false);
    done_.assign(d, false);
    taken_.assign(d, 0);
    expected_.assign(d, 0);
    inbox_.assign(head_ + size, 0.0f);
    outbox_.assign(head_ + size, 0.0f);
    for (std::size_t k = 0; k < d; ++k) expect_ahead(replicas, k);
  }

  // Answers the requests that have arrived and adds the answers; never waits. Whether `x` changed.
  // `weight`: this replica's, where it weighs (begin's `weighted`).
  template <class Comm>
  bool poll(Comm& replicas, std::span<float> x, double weight = 1) {
    weight_ = checked_weight(weight);
    bool changed = false;
    for (std::size_t k = 0; k < neighbours_.size(); ++k)
      while (replicas.try_recv_from(neighbours_[k], std::span<float>(inbox_))) {
        took(replicas, k);
        changed |= handle(replicas, k, x);
      }
    return changed;
  }

  // Asks a neighbour (the `draw`-th of those that have not said they ask no more, modulo their
  // count) to average with `x`, unless a request of this replica is still open: each answer
  // moves it half-way from the values it asked with, so two answers on the same values would
  // move it twice as far (answers to requests open at once add up, and overshoot).
  template <class Comm>
  void ask(Comm& replicas, std::span<const float> x, std::uint64_t draw, double weight = 1) {
    weight_ = checked_weight(weight);
    if (std::find(open_.begin(), open_.end(), true) != open_.end()) return;
    std::vector<std::size_t> free;
    for (std::size_t k = 0; k < neighbours_.size(); ++k)
      if (!done_[k]) free.push_back(k);
    if (free.empty()) return;
    const std::size_t k = free[draw % free.size()];
    send(replicas, k, kind::request, x);
    open_[k] = true;
    ++asked_;
  }

  // Settles every exchange with the neighbours (they call it at the same step): says it asks no
  // more, takes what each still sends until it has said the same (answering), then waits for its
  // own open answers. Whether `x` changed.
  template <class Comm>
  bool drain(Comm& replicas, std::span<float> x, double weight = 1) {
    weight_ = checked_weight(weight);
    bool changed = false;
    for (std::size_t k = 0; k < neighbours_.size(); ++k) send(replicas, k, kind::done, std::span<const float>());
    for (std::size_t k = 0; k < neighbours_.size(); ++k)
      while (!done_[k]) changed |= take(replicas, k, x);
    for (std::size_t k = 0; k < neighbours_.size(); ++k)
      while (open_[k]) changed |= take(replicas, k, x);
    done_.assign(done_.size(), false);
    return changed;
  }

  std::int64_t asked() const { return asked_; }        // requests sent
  std::int64_t answered() const { return answered_; }  // requests answered
  std::int64_t open() const { return std::count(open_.begin(), open_.end(), true); }

 private:
  enum class kind : int { request = 1, answer = 2, done = 3 };
  // A neighbour sends at most a request, an answer and its "done" before it hears from this
  // replica again: the transport is told of that many messages ahead (transport::expect).
  static constexpr std::size_t ahead = 3;

  template <class Comm>
  bool take(Comm& replicas, std::size_t k, std::span<float> x) {
    replicas.recv_from(neighbours_[k], std::span<float>(inbox_));
    took(replicas, k);
    return handle(replicas, k, x);
  }
  template <class Comm>
  void took(Comm& replicas, std::size_t k) {
    ++taken_[k];
    expect_ahead(replicas, k);
  }
  template <class Comm>
  void expect_ahead(Comm& replicas, std::size_t k) {
    // Sizes of the next `ahead` messages, 0 for those already expected (expectations add up).
    std::vector<std::size_t> sizes(ahead, 0);
    for (std::size_t i = 0; i < ahead; ++i)
      if (taken_[k] + i + 1 > expected_[k]) sizes[i] = inbox_.size() * sizeof(float);
    replicas.expect_from(neighbours_[k], std::span<const std::size_t>(sizes));
    expected_[k] = taken_[k] + ahead;
  }

  double checked_weight(double w) const {
    decentrain::detail::check(head_ == 1 || (std::isfinite(w) && w >= 0), "ad-psgd: this replica weighs ", w,
                              " (a weighted exchange needs a weight that is finite and >= 0)");
    return w;
  }
  // [kind, (weighted: the sender's weight, f64,) values]
  template <class Comm>
  void send(Comm& replicas, std::size_t k, kind what, std::span<const float> values) {
    outbox_[0] = static_cast<float>(static_cast<int>(what));
    if (head_ > 1) std::memcpy(outbox_.data() + 1, &weight_, sizeof weight_);
    std::fill(outbox_.begin() + static_cast<std::ptrdiff_t>(head_), outbox_.end(), 0.0f);
    std::copy(values.begin(), values.end(), outbox_.begin() + static_cast<std::ptrdiff_t>(head_));
    replicas.send_to(neighbours_[k], std::span<const float>(outbox_));
  }

  template <class Comm>
  bool handle(Comm& replicas, std::size_t k, std::span<float> x) {
    const int j = neighbours_[k];
    const std::span<const float> values(inbox_.data() + head_, size_);
    const float what = inbox_[0];
    if (what == static_cast<float>(static_cast<int>(kind::request))) {
      decentrain::detail::check(!done_[k], "ad-psgd: peer ", j, " asked to average after it said it asks no more before the drain");
      std::span<float> d(outbox_.data() + head_, size_);
      if (head_ == 1) {
        // Half-way towards the asker's values; the answer carries the same half back.
        for (std::size_t i = 0; i < size_; ++i) {
          d[i] = (x[i] - values[i]) * 0.5f;
          x[i] -= d[i];
        }
      } else {
        // To the pair's weighted mean: this side moves a / (a + b) of the way, the asker b / (a + b).
        double a = 0;
        std::memcpy(&a, inbox_.data() + 1, sizeof a);
        decentrain::detail::check(std::isfinite(a) && a >= 0, "ad-psgd: peer ", j, " asked with the weight ", a,
                                  " (a weight must be finite and >= 0)");
        const double b = weight_, sum = a + b;
        const double mine = sum > 0 ? a / sum : 0.5, theirs = sum > 0 ? b / sum : 0.5;
        for (std::size_t i = 0; i < size_; ++i) {
          const double diff = static_cast<double>(x[i]) - values[i];
          x[i] = static_cast<float>(x[i] - mine * diff);
          d[i] = static_cast<float>(theirs * diff);
        }
        std::memcpy(outbox_.data() + 1, &weight_, sizeof weight_);
      }
      check_finite(x, j);
      outbox_[0] = static_cast<float>(static_cast<int>(kind::answer));
      replicas.send_to(j, std::span<const float>(outbox_));
      ++answered_;
      return true;
    }
    if (what == static_cast<float>(static_cast<int>(kind::answer))) {
      decentrain::detail::check(open_[k], "ad-psgd: peer ", j, " answered a request this replica did not send");
      for (std::size_t i = 0; i < size_; ++i) x[i] += values[i];
      check_finite(x, j);
      open_[k] = false;
      return true;
    }
    decentrain::detail::check(what == static_cast<float>(static_cast<int>(kind::done)), "ad-psgd: peer ", j,
                              " sent a message of kind ", what, " (1 asks, 2 answers, 3 ends the exchanges before a drain)");
    decentrain::detail::check(!done_[k], "ad-psgd: peer ", j, " said twice that it asks no more before one drain");
    done_[k] = true;
    return false;
  }
  void check_finite(std::span<const float> x, int j) const {
    for (std::size_t i = 0; i < size_; ++i)
      decentrain::detail::check(std::isfinite(x[i]), "ad-psgd: value ", i, " is not finite after an exchange with peer ", j,
                                " (it sent values that are not)");
  }

  std::vector<int> neighbours_;
  std::size_t size_ = 0, head_ = 1;  // floats before the values: the kind, and the weight where weighted
  double weight_ = 1;                // this replica's, as its latest call said
  std::vector<bool> open_, done_;  // per neighbour: a request of this replica unanswered; it said "done"
  std::vector<std::uint64_t> taken_, expected_;  // messages taken from it; told the transport of
  std::vector<float> inbox_, outbox_;            // [kind, (weight,) values]
  std::int64_t asked_ = 0, answered_ = 0;
};

template <class Topology = topology::exponential>
struct ad_psgd {
  static_assert(check_topology<Topology>());
  using policy_concept = policy_tag;
  static constexpr const char* name = "ad-psgd";
  static constexpr bool replicas_differ = true;
  // Peers stand at different steps (train/concepts.hpp): no fault policy that re-forms the group.
  static constexpr bool asynchronous = true;

  std::int64_t inner_steps = 1;  // steps between requests (AD-PSGD: 1)
  std::int64_t drain_every = 0;  // steps between drains; 0: the last step only
  Topology topology{};
  std::uint64_t seed = 0;        // the neighbours drawn (with the rank and the step)
  bool weighted = false;         // exchanges weigh each side by its latest step's weight (see above)

  template <class Ctx>
  void start(Ctx& ctx) {
    decentrain::detail::check(inner_steps >= 1, "ad-psgd: inner_steps must be >= 1, got ", inner_steps);
    decentrain::detail::check(drain_every >= 0, "ad-psgd: drain_every must be >= 0 (0: only at the end), got ", drain_every);
    if constexpr (requires { topology.validate(); }) topology.validate();
    const int me = ctx.replicas.rank(), n = ctx.replicas.world();
    check_fixed(topology, n, "ad-psgd", "AD-PSGD keeps its open requests by neighbour (ring, torus, exponential)", false);
    check_same_settings(ctx, describe(), "ad-psgd: the peers exchange differently",
                        "the same topology, inner_steps, drain_every and seed");
    if (!ctx.resumed) broadcast_parameters(ctx, buffer_);
    averager_.begin(ctx.replicas, neighbours(topology, me, n), flat_size(ctx.parameters), weighted);
  }
  template <class Ctx>
  void after_backward(Ctx&) {}
  template <class Ctx>
  void after_step(Ctx& ctx) {
    gather_values(ctx.parameters, buffer_);
    const double w = weighted ? ctx.step_weight : 1.0;
    bool changed = averager_.poll(ctx.replicas, std::span<float>(buffer_), w);
    if (ctx.last_step || ends_round_at(ctx.step)) {
      changed |= averager_.drain(ctx.replicas, std::span<float>(buffer_), w);
    } else if (ends_round(ctx.step, inner_steps)) {
      std::uint64_t draw = decentrain::detail::splitmix64(seed ^ 0x61647073ull);  // "adps"
      for (const auto v : {static_cast<std::uint64_t>(ctx.replicas.rank()), static_cast<std::uint64_t>(ctx.step)})
        draw = decentrain::detail::splitmix64(draw ^ v);
      averager_.ask(ctx.replicas, std::span<const float>(buffer_), draw, w);
    }
    if (changed) scatter_values(ctx.parameters, buffer_);
  }
  // Drains are where the replicas wait for one another (and where joiners would be taken in).
  bool ends_round_at(std::int64_t step) const { return drain_every > 0 && (step + 1) % drain_every == 0; }
  // Nothing: a run resumes from a drain, where nothing is open (see above).
  void save(io::checkpoint&) const {}
  void load(const io::checkpoint&) {}

  const pairwise_averager& averager() const { return averager_; }
  // Whom replica `me` of `n` exchanges with: those it sends to and those it receives from (the
  // static exponential graph's 2^k ahead and behind).
  static std::vector<int> neighbours(const Topology& topo, int me, int n) {
    auto out = checked_neighbours(topo.sends_to(me, n, 0), topo, me, n, 0, "ad-psgd");
    for (const int j : checked_neighbours(topo.receives_from(me, n, 0), topo, me, n, 0, "ad-psgd"))
      if (std::find(out.begin(), out.end(), j) == out.end()) out.push_back(j);
    return out;
  }
  std::string describe() const {
    return std::string(name) + ":" + topology_name(topology) + ",inner_steps=" + std::to_string(inner_steps) +
           ",drain_every=" + std::to_string(drain_every) + ",seed=" + std::to_string(seed) + (weighted ? ",weighted" : "");
  }

 private:
  pairwise_averager averager_;
  std::vector<float> buffer_;
};

}  // namespace decentrain::comm
