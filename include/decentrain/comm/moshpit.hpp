// Moshpit averaging (Ryabinin et al. 2021, arXiv 2103.03239): the replicas stand in a virtual
// grid of side M (group_size) and d = ceil(log_M n) dimensions, replica r at the base-M digits of
// r. Round k averages within the groups that share every coordinate but dimension k mod d: an
// all-reduce among at most M peers, never among all. For n = M^d, d rounds give every replica the
// exact mean (each round averages out one digit); for other n the grid has holes, its groups are
// smaller, and the replicas converge to the mean over more rounds. A lost peer fails only its
// group's all-reduce; under fault::elastic the grid is laid over the members that remain, so its
// groups shrink instead of stalling.
//   moshpit_grid       the grid: groups per round, and how many rounds make one average;
//   moshpit_averager   averages a flat buffer through the grid's rounds, each group's all-reduce
//                      through a codec and an aggregator (the policies' slot), weighted where
//                      asked (a group's weight is then its members' sum, carried to the next round,
//                      so the rounds keep a weighted mean);
//   moshpit            the communication policy: local SGD whose periodic average is Moshpit's
//                      (the replicas differ where the rounds leave them unequal).
// DiLoCo takes the averager for its outer averaging (diloco::averaging), so an outer step needs
// no global all-reduce.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decentrain/collective/communicator.hpp"
#include "decentrain/comm/policy.hpp"

namespace decentrain::comm {

struct moshpit_grid {
  int group_size = 4;  // M: the grid's side
  int rounds = 0;      // rounds per average; 0: the grid's dimensions (the exact mean for n = M^d)

  void validate(const char* who) const {
    decentrain::detail::check(group_size >= 2, who, ": Moshpit's group_size must be >= 2, got ", group_size);
    decentrain::detail::check(rounds >= 0, who, ": Moshpit's rounds must be >= 0 (0: the grid's dimensions), got ", rounds);
  }
  // d: the fewest dimensions whose grid holds n replicas (1 for n <= M).
  int dims(int n) const {
    int d = 1;
    for (std::int64_t cells = group_size; cells < n; cells *= group_size) ++d;
    return d;
  }
  int rounds_per_average(int n) const { return rounds > 0 ? rounds : dims(n); }
  // The replicas that average with `rank` in round `round` (ascending, `rank` among them): those
  // whose coordinates equal its own except along dimension round mod d.
  std::vector<int> group_of(int rank, int n, std::int64_t round) const {
    const int d = dims(n);
    std::int64_t stride = 1;
    for (int k = 0; k < static_cast<int>(round % d); ++k) stride *= group_size;
    const std::int64_t digit = (rank / stride) % group_size, base = rank - digit * stride;
    std::vector<int> out;
    for (std::int64_t m = 0; m < group_size; ++m)
      if (const std::int64_t r = base + m * stride; r < n) out.push_back(static_cast<int>(r));
    return out;
  }
  std::string describe() const {
    return "moshpit(group_size=" + std::to_string(group_size) + ",rounds=" + (rounds ? std::to_string(rounds) : "dims") + ")";
  }
};

// The groups' communicators of the current view, made once each (a group's first collective
// agrees its members' settings: on a slow link, a round trip not paid every round).
class moshpit_averager {
 public:
  moshpit_averager() = default;
  // A copy (a policy handed to a trainer) makes its own groups when it first averages.
  moshpit_averager(const moshpit_averager&) {}
  moshpit_averager& operator=(const moshpit_averager& other) {
    if (this != &other) forget();
    return *this;
  }
  // `average` with Moshpit rounds first_round .. first_round + rounds - 1 over `replicas`; with
  // `weight`, every group's mean weighs its members by it, and `weight` becomes their sum.
  template <class Codec, class Aggregator, class Comm>
  void average(const moshpit_grid& grid, Codec& codec, Aggregator& aggregator, Comm& replicas, std::span<float> values,
               std::int64_t first_round, std::optional<double>& weight) {
    const int n = replicas.world(), me = replicas.rank();
    if (n != world_ || me != rank_) forget();
    world_ = n;
    rank_ = me;
    for (int k = 0; k < grid.rounds_per_average(n); ++k) {
      const auto members = grid.group_of(me, n, first_round + k);
      if (members.size() < 2) continue;
      auto it = groups_.find(members);
      if (it == groups_.end()) it = groups_.emplace(members, replicas.group(members)).first;
      auto& group = it->second;
      collective::encoded_all_reduce(codec, group, values, true, aggregator, record_, weight);
      if (weight.has_value()) {
        double sum = weight.value();
        group.all_reduce(std::span<double>(&sum, 1), collective::reduce_op::sum);
        weight = sum;
      }
    }
  }
  // A re-formed view: its groups are other peers.
  void forget() {
    groups_.clear();
    world_ = rank_ = -1;
  }

 private:
  std::map<std::vector<int>, collective::communicator<transport::any_endpoint>> groups_;
  collective::aggregation_record record_;  // (a group's ranks are not the replicas': no tally kept)
  int world_ = -1, rank_ = -1;
};

template <class Codec = compress::identity, class Aggregator = collective::mean>
struct moshpit {
  static_assert(compress::check_codec<Codec>());
  static_assert(collective::check_aggregator<Aggregator>());
  using policy_concept = policy_tag;
  static constexpr const char* name = "moshpit";
  static constexpr bool replicas_differ = true;

  std::int64_t inner_steps = 1;  // steps between averages
  moshpit_grid grid{};
  Codec codec{};
  Aggregator aggregator{};
  // Average by the weight of the replicas' rounds (the sum of ctx.step_weight over the round's
  // steps), carried through the grid's rounds; every replica the same.
  bool weighted = false;

  template <class Ctx>
  void start(Ctx& ctx) {
    decentrain::detail::check(inner_steps >= 1, "moshpit: inner_steps must be >= 1, got ", inner_steps);
    grid.validate("moshpit");
    prepare_codec(codec, aggregator, ctx);
    check_weighs(aggregator, weighted, "moshpit");
    check_same_settings(ctx, grid.describe() + ", inner_steps " + std::to_string(inner_steps),
                        "moshpit: the peers average differently", "the same grid and inner_steps");
    if (!ctx.resumed) broadcast_parameters(ctx, buffer_);
  }
  template <class Ctx>
  void after_backward(Ctx&) {}
  template <class Ctx>
  void after_step(Ctx& ctx) {
    weight_.add(ctx);
    if (!ends_round(ctx, inner_steps)) return;
    gather_values(ctx.parameters, buffer_);
    std::optional<double> w = weight_if(weighted, weight_.sum);
    // Each average goes on where the last one's rounds stopped (with fewer rounds than
    // dimensions, the next average takes the next dimensions).
    const std::int64_t average = ctx.step / inner_steps;
    averager_.average(grid, codec, aggregator, ctx.replicas, std::span<float>(buffer_),
                      average * grid.rounds_per_average(ctx.replicas.world()), w);
    scatter_values(ctx.parameters, buffer_);
    weight_.sum = 0;
  }
  bool ends_round_at(std::int64_t step) const { return ends_round(step, inner_steps); }
  void drop_in_flight() { averager_.forget(); }
  void save(io::checkpoint& c) const {
    save_codec(codec, c, "comm.moshpit.codec.");
    weight_.save(c, "comm.moshpit.");
  }
  void load(const io::checkpoint& c) {
    load_codec(codec, c, "comm.moshpit.codec.");
    weight_.load(c, "comm.moshpit.");
  }

 private:
  std::vector<float> buffer_;
  round_weight weight_;
  moshpit_averager averager_;
};

}  // namespace decentrain::comm
