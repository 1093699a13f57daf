// SWARM parallelism (Ryabinin et al. 2023, yandex-research/swarm): the model cut into `stages`
// parts as a pipeline's, but each stage held by a pool of peers instead of one, and no fixed
// copies: every micro-batch of a step goes to a peer of the next stage chosen by that stage's
// router (swarm/router.hpp: interleaved weighted round-robin over measured throughput, the
// links included), so a faster peer takes more of them and a slow one does not hold its stage
// back. Its gradient comes back to the peer that sent it, the one that holds the forward's
// activations and the parameters they were computed with (the anchor re-sends a backward's
// inputs, which may reach another peer of the stage, holding other parameters).
//
// A step: the rows of world / stages copies of `batch_size` (what a pipeline of that shape
// trains) cut into `micro_batches` each, dealt out among the first stage's peers; every stage
// takes what comes from any peer of the stage before (receive-from-any), forwards it, and answers
// with the gradient of its input once the stage after answered; a peer that has sent its last
// activation says so to every peer of the next stage, so a stage knows when the step is over.
// Each peer then holds the mean gradient over the rows it processed, and its step weight is those
// rows: the communication policy averages each stage's pool by them (sync, local SGD, DiLoCo,
// Streaming DiLoCo: a policy with `weighted`, over placement::replicas), which gives the whole
// step's gradient. Every step checks that each stage processed every micro-batch exactly once (a
// world all-reduce of a count per stage and micro-batch), so none is lost or counted twice; a
// failed peer fails the step, and under fault::elastic the survivors re-form (regroup: each keeps
// its stage; a stage left empty takes a peer from the largest pool, which takes the stage's
// parameters from a peer there) and redo it. A message that breaks the protocol stops the peer
// that received it with an error naming the sender (as the pipeline's executor does).
//
// What it needs of the model: what parallel::pipeline needs (parallel/stage_model.hpp, and a
// constructor that builds one part).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "decentrain/autograd/math.hpp"
#include "decentrain/autograd/variable.hpp"
#include "decentrain/collective/communicator.hpp"
#include "decentrain/compress/identity.hpp"
#include "decentrain/core/factory.hpp"
#include "decentrain/core/transfer.hpp"
#include "decentrain/data/dataset.hpp"
#include "decentrain/nn/part.hpp"
#include "decentrain/optim/clip.hpp"
#include "decentrain/parallel/policy.hpp"
#include "decentrain/parallel/stage_model.hpp"
#include "decentrain/parallel/swarm/rebalance.hpp"
#include "decentrain/parallel/swarm/router.hpp"
#include "decentrain/transport/endpoint.hpp"

namespace decentrain::parallel {

namespace swarm_detail {

// What goes before every message between stages: which, of which step and micro-batch, the
// payload's size; the receiver checks each field against what it expects of that sender.
struct header {
  std::uint32_t kind = 0;  // 0: an activation going forward, 1: its gradient going back, 2: no more activations this step
  std::uint32_t step = 0;  // the step (or evaluation batch) it belongs to, low 32 bits
  std::int32_t micro = -1;
  std::int32_t rows = 0;
  std::int64_t width = 0;
  std::uint64_t bytes = 0;  // the encoded payload that follows
};
inline constexpr std::uint32_t activation = 0, gradient = 1, finished = 2;

}  // namespace swarm_detail

// What a SWARM peer did: in the last step, and over the run.
struct swarm_stats {
  int stage = 0;
  std::int64_t micro_batches = 0;   // the last step's, at this peer's stage
  std::int64_t rows = 0;            // the last step's
  std::int64_t step_rows = 0;       // the last step's whole batch (each stage processes every row once)
  std::int64_t total_micro_batches = 0;  // over the run's forward passes (a step redone after them counts again; take_checked counts each step once)
  std::int64_t retried = 0;         // micro-batches this peer had begun in steps that failed and were redone
  std::uint64_t bytes_sent = 0;     // activations and gradients, over the run
  int moves = 0;                    // times this peer's stage changed when the group re-formed
  double busy_s = 0;                // forwards and backwards, over the run
};

template <class Codec = compress::identity>
struct swarm {
  using policy_concept = policy_tag;
  static constexpr const char* name = "swarm";
  // A peer's step weight is the rows it processed, which differ from peer to peer: the
  // communication policy must average by them (the trainer refuses one that is not weighted).
  static constexpr bool weights_vary = true;

  int stages = 2;
  int micro_batches = 1;  // per step and copy's batch_size rows (world / stages copies a step)
  std::vector<std::int64_t> blocks;  // blocks per stage (empty: an even cut)
  Codec codec{};                     // the activations and their gradients between stages
  pools::router_settings routing{};
  // Rebalancing: every `rebalance_every` steps (0: never) the peers share their measured speeds and
  // each runs the same check (swarm/rebalance.hpp: Petals' rule with confirmation and a
  // cooldown); a move is made as a re-deal (the mover takes its new stage's parameters and AdamW
  // state from a peer there), so it needs a fault policy that re-deals parts (fault::elastic).
  int rebalance_every = 0;
  pools::rebalance_settings rebalancing{};
  // The stage of each rank of the view (empty: rank % stages); regroup keeps it as the group
  // changes.
  std::vector<int> assignment;

  void validate(int world) const {
    using decentrain::detail::check;
    check(stages >= 1, "swarm: stages must be >= 1, got ", stages);
    check(micro_batches >= 1, "swarm: micro-batches must be >= 1, got ", micro_batches);
    check(world >= stages, "swarm: ", world, " peer(s) cannot hold ", stages, " stages (every stage needs a peer)");
    routing.validate();
    rebalancing.validate();
    check(rebalance_every >= 0, "swarm: rebalance_every must be >= 0, got ", rebalance_every);
    if (!assignment.empty()) {
      check(assignment.size() == static_cast<std::size_t>(world), "swarm: the assignment places ", assignment.size(),
            " peers, the group has ", world);
      for (int s = 0; s < stages; ++s)
        check(std::count(assignment.begin(), assignment.end(), s) > 0, "swarm: the assignment leaves stage ", s, " without a peer");
      for (const int s : assignment) check(s >= 0 && s < stages, "swarm: the assignment names stage ", s, " of ", stages);
    }
  }

  // The stage of each rank of a view of `world`.
  std::vector<int> stage_of(int world) const {
    if (assignment.size() == static_cast<std::size_t>(world)) return assignment;
    std::vector<int> out;
    for (int r = 0; r < world; ++r) out.push_back(r % stages);
    return out;
  }
  // The ranks of each stage's pool, ascending.
  std::vector<std::vector<int>> pools(int world) const {
    std::vector<std::vector<int>> out(static_cast<std::size_t>(stages));
    const auto a = stage_of(world);
    for (int r = 0; r < world; ++r) out[static_cast<std::size_t>(a[static_cast<std::size_t>(r)])].push_back(r);
    return out;
  }

  placement place(int rank, int world) const {
    validate(world);
    const auto pool = pools(world);
    placement p;
    p.stage = stage_of(world)[static_cast<std::size_t>(rank)];
    p.stages = stages;
    p.blocks = blocks;
    p.replicas = pool[static_cast<std::size_t>(p.stage)];
    p.copy = static_cast<int>(std::find(p.replicas.begin(), p.replicas.end(), rank) - p.replicas.begin());
    return p;  // (no `pipeline`: no fixed copy of the model; the stages' messages go through the view)
  }

  // A view of `world` peers with no placement to keep (a joiner's first guess): rank % stages.
  int morph(int world, std::int64_t n_blocks) {
    decentrain::detail::check(world >= stages, "swarm: ", world, " peer(s) cannot hold ", stages, " stages");
    decentrain::detail::check(stages <= n_blocks, "swarm: a model of ", n_blocks, " blocks cannot be cut into ", stages, " stages");
    assignment.clear();
    return stages;
  }

  // The group changed from `before` (world ranks, with their stages) to `after` (world ranks,
  // ascending): every peer that stays keeps its stage; a new one goes to the smallest pool; a
  // stage left without peers takes one from the largest pool (its highest rank), which then takes
  // the stage's parameters from the re-deal. Every member computes the same from the same views.
  void regroup(const std::vector<int>& before, const std::vector<int>& before_stages, const std::vector<int>& after,
               std::int64_t n_blocks) {
    using decentrain::detail::check;
    check(stages <= n_blocks, "swarm: a model of ", n_blocks, " blocks cannot be cut into ", stages, " stages");
    check(after.size() >= static_cast<std::size_t>(stages), "swarm: ", after.size(), " peer(s) are left to hold ", stages,
          " stages (every stage needs a peer)");
    std::vector<int> a(after.size(), -1);
    std::vector<int> count(static_cast<std::size_t>(stages), 0);
    for (std::size_t i = 0; i < after.size(); ++i)
      for (std::size_t j = 0; j < before.size() && j < before_stages.size(); ++j)
        if (before[j] == after[i] && before_stages[j] >= 0 && before_stages[j] < stages) {
          a[i] = before_stages[j];
          ++count[static_cast<std::size_t>(a[i])];
        }
    const auto smallest = [&] { return static_cast<int>(std::min_element(count.begin(), count.end()) - count.begin()); };
    for (auto& s : a)
      if (s < 0) {
        s = smallest();
        ++count[static_cast<std::size_t>(s)];
      }
    for (int empty = smallest(); count[static_cast<std::size_t>(empty)] == 0; empty = smallest()) {
      const int largest = static_cast<int>(std::max_element(count.begin(), count.end()) - count.begin());
      for (std::size_t i = a.size(); i-- > 0;)
        if (a[i] == largest) {
          a[i] = empty;
          break;
        }
      --count[static_cast<std::size_t>(largest)];
      ++count[static_cast<std::size_t>(empty)];
    }
    // A rebalancing move agreed in the view it was decided in (between_steps): its peers go where
    // it says, on every member, only if the group is still that view (else it is dropped on
    // every member, a joiner's included, which never had it).
    if (pending_ && after == members_)
      for (const auto& [peer, to] : *pending_)
        for (std::size_t i = 0; i < after.size(); ++i)
          if (static_cast<std::size_t>(peer) < members_.size() && after[i] == members_[static_cast<std::size_t>(peer)]) a[i] = to;
    pending_.reset();
    // Another group: the checks start again on every member alike (a joiner has no history; the
    // ranks of a view name other peers than the last view's).
    if (after != members_) {
      rebalancer_.reset();
      checked_step_ = -1;
      rows_since_ = 0;
      busy_since_ = 0;
    }
    members_ = after;
    assignment = std::move(a);
  }

  // Between steps (the trainer calls it before each step's forward): the rebalancing check.
  template <class Ctx>
  void between_steps(Ctx& ctx) {
    if (rebalance_every <= 0 || !ctx.redeal || ctx.step == 0 || ctx.step % rebalance_every != 0 || checked_step_ == ctx.step) return;
    checked_step_ = ctx.step;
    const int n = ctx.comm.world(), me = ctx.comm.rank();
    if (members_.empty())  // (the first view: the world's ranks)
      for (int r = 0; r < n; ++r) members_.push_back(r);
    // Each peer's rows and compute seconds since the last check, shared.
    std::vector<double> figures(2 * static_cast<std::size_t>(n), 0.0);
    figures[2 * static_cast<std::size_t>(me)] = static_cast<double>(rows_since_);
    figures[2 * static_cast<std::size_t>(me) + 1] = busy_since_;
    rows_since_ = 0;
    busy_since_ = 0;
    ctx.comm.all_reduce(std::span<double>(figures), collective::reduce_op::sum);
    if (!rebalancer_) rebalancer_.emplace(rebalancing);
    // A stage's cost: its blocks (the embedding and the head are small beside them).
    std::vector<double> cost;
    for (const auto b : ctx.placement.part().blocks_per_stage(static_cast<std::int64_t>(ctx.model.config().n_layer)))
      cost.push_back(static_cast<double>(b));
    const auto stage_of_rank = stage_of(n);
    std::vector<pools::pool_peer> peers;
    double measured = 0;
    int counted = 0;
    for (int r = 0; r < n; ++r) {
      const double rows = figures[2 * static_cast<std::size_t>(r)], busy = figures[2 * static_cast<std::size_t>(r) + 1];
      const int st = stage_of_rank[static_cast<std::size_t>(r)];
      const double speed = rows > 0 && busy > 0 ? rows / busy * cost[static_cast<std::size_t>(st)] : -1;
      if (speed > 0) {
        measured += speed;
        ++counted;
      }
      peers.push_back({r, st, speed});
    }
    if (counted == 0) return;
    for (auto& p : peers)  // (one that processed nothing since, as the others' mean)
      if (p.speed < 0) p.speed = measured / counted;
    const auto move = rebalancer_->check(peers, cost);
    if (!move) return;
    pending_.emplace();  // (view ranks of members_, the view it was decided in)
    pending_->push_back({move->peer, move->to});
    if (move->partner >= 0) pending_->push_back({move->partner, move->from});
    ctx.redeal({}, ctx.step, {});  // every member at once: the view is the same, the pools change
  }

  // The router's and the rebalancer's state (exact: a deterministic run resumes with the same
  // picks).
  void save(io::checkpoint& c) const {
    if (router_) router_->save(c, "parallel.swarm.");
    if (rebalancer_) rebalancer_->save(c, "parallel.swarm.");
  }
  // (a checkpoint written without them, or by a peer of the last stage, which routes nothing,
  // leaves them as they are)
  void load(const io::checkpoint& c) {
    if (c.text.count("parallel.swarm.router")) {
      router_.emplace(routing);
      router_->load(c, "parallel.swarm.");
    }
    if (c.text.count("parallel.swarm.rebalance")) {
      rebalancer_.emplace(rebalancing);
      rebalancer_->load(c, "parallel.swarm.");
    }
  }

  template <class Ctx>
  static constexpr bool check_model() {
    return check_stage_model<Ctx>();
  }

  template <class Ctx>
  step_result forward_backward(Ctx& ctx) {
    ctx.parameters.zero_grad();
    if (placed_stage_ >= 0 && placed_stage_ != ctx.placement.stage) ++stats_.moves;
    placed_stage_ = ctx.placement.stage;
    // A step that failed on some peer and is run again: what this peer had begun of it is retried.
    if (begun_step_ == ctx.step) stats_.retried += begun_;
    begun_step_ = ctx.step;
    begun_ = 0;
    const auto done = run(ctx, decentrain::data::split::train, ctx.step, true);
    // Each peer's gradient is the mean over the rows it processed (the shares below are of the
    // step's rows): its pool's average weighted by rows is then the step's gradient.
    if (done.rows > 0) {
      const double scale = static_cast<double>(done.step_rows) / static_cast<double>(done.rows);
      for (auto& e : ctx.parameters)
        if (e.param.grad().defined()) e.param.grad() = math::affine(e.param.grad(), scale);
    }
    begun_step_ = -1;
    stats_.stage = ctx.placement.stage;
    stats_.micro_batches = done.micro;
    stats_.rows = done.rows;
    rows_since_ += done.rows;
    stats_.step_rows = done.step_rows;
    stats_.total_micro_batches += done.micro;
    checked_[ctx.step] = checked_step{stats_.stage, done.micro, done.rows, done.step_rows};  // (a later attempt replaces it)
    if (checked_.size() > 4096) checked_.erase(checked_.begin());  // (bounded where no one takes them)
    const std::int64_t T = ctx.block;
    return {done.loss, done.rows, done.rows * T, static_cast<double>(done.rows)};
  }

  // After the communication policy's exchange (the trainer calls it before the clipping): the
  // tied parameters' two uses (the first stage's embedding, the last stage's head) summed on the
  // peers of both end stages. The lowest rank of each end's pool gives its gradient (averaged
  // over its pool by then, under sync), the others add nothing, and each end peer adds the other
  // end's to its own: a sum of two in either order, so that under sync both ends' copies stay the
  // same bit for bit (a peer that moves between them takes the other's with nothing to mend).
  // Under a policy that steps each peer on its own gradient (DiLoCo) the other end's is that
  // peer's: an estimate of its pool's.
  template <class Ctx>
  void after_averaging(Ctx& ctx) {
    const auto& at = ctx.placement;
    if (at.stages == 1 || ctx.model.tied_parameters().empty()) return;
    const bool first = at.stage == 0, last_stage = at.stage == at.stages - 1;
    if (!first && !last_stage) return;
    const auto pool = pools(ctx.comm.world());
    std::vector<int> ends = pool.front();
    ends.insert(ends.end(), pool.back().begin(), pool.back().end());
    std::sort(ends.begin(), ends.end());
    auto group = ctx.comm.group(ends);
    const bool gives = ctx.comm.rank() == pool[static_cast<std::size_t>(at.stage)].front();
    for (const auto& tied : ctx.model.tied_parameters()) {
      auto& param = ctx.parameters.get(tied);
      auto& g = param.grad();
      if (!g.defined()) g = zeros_like(param.value());
      const auto mine = host_copy(g);
      const auto nv = static_cast<std::size_t>(mine.numel());
      std::vector<float> both(2 * nv, 0.0f);  // [the first stage's, the last stage's]
      if (gives) std::memcpy(both.data() + (first ? 0 : nv), mine.template data<float>(), nv * sizeof(float));
      group.all_reduce(std::span<float>(both), collective::reduce_op::sum);
      auto other = tensor<cpu>::empty(mine.shape(), mine.dtype());
      std::memcpy(other.template data<float>(), both.data() + (first ? nv : 0), nv * sizeof(float));
      g = math::add(g, to_device<typename Ctx::device_type>(other));
    }
  }

  template <class Ctx>
  double evaluate(Ctx& ctx, std::int64_t batch) {
    return run(ctx, decentrain::data::split::validation, batch, false).loss;
  }

  // The clipping norm over the whole model: each stage's sum of squares counted once (a pool's
  // peers each add a share of theirs), the tied parameters on the first stage only.
  template <class Ctx>
  optim::norm_share grad_norm_share(Ctx& ctx) {
    optim::norm_share share;
    if (ctx.placement.stages == 1) return share;
    if (!ctx.placement.part().first()) share.counted_elsewhere = ctx.model.tied_parameters();
    const double pool = static_cast<double>(ctx.placement.replicas.size());
    share.total = [&ctx, pool](double mine) {
      mine /= pool;
      ctx.comm.all_reduce(std::span<double>(&mine, 1), collective::reduce_op::sum);
      return mine;
    };
    return share;
  }

  const swarm_stats& stats() const { return stats_; }

  // What this peer processed in each step whose rows were checked, until taken: a step that
  // failed after its check and was redone keeps the redo's; one this peer left for the state of
  // a peer that completed it (fault::elastic: its own attempt passed the check, then a later
  // collective failed here only) keeps this peer's, which that step trained. A caller that
  // counts tokens per completed step takes those before `step` (ctx.steps_done) each time.
  struct checked_step {
    int stage = 0;
    std::int64_t micro_batches = 0, rows = 0, step_rows = 0;
  };
  std::map<std::int64_t, checked_step> take_checked(std::int64_t before_step) {
    std::map<std::int64_t, checked_step> out;
    for (auto it = checked_.begin(); it != checked_.end() && it->first < before_step;) {
      out.insert(*it);
      it = checked_.erase(it);
    }
    return out;
  }

 private:
  struct outcome {
    double loss = 0;
    std::int64_t rows = 0, micro = 0, step_rows = 0;
  };

  // One step's (or evaluation batch's) micro-batches through the stages, this peer's part of it.
  template <class Ctx>
  outcome run(Ctx& ctx, decentrain::data::split split, std::int64_t index, bool train) {
    using D = typename Ctx::device_type;
    using decentrain::detail::check;
    namespace wire = swarm_detail;
    auto& ep = ctx.comm.endpoint();
    const int n = ctx.comm.world(), me = ctx.comm.rank();
    const int s = ctx.placement.stage, last = stages - 1;
    const auto pool = pools(n);
    const auto& up = s > 0 ? pool[static_cast<std::size_t>(s - 1)] : std::vector<int>{};
    const auto& down = s < last ? pool[static_cast<std::size_t>(s + 1)] : std::vector<int>{};
    std::vector<int> sources = up;
    sources.insert(sources.end(), down.begin(), down.end());
    auto& route = router_for(down);

    const std::int64_t B = ctx.batch_size, T = ctx.block, C = ctx.model.stream_width();
    check(micro_batches <= B, "swarm: ", micro_batches, " micro-batches of ", B, " rows (micro-batches must be at most the batch size)");
    const int copies = std::max(1, n / stages);
    const int count = copies * micro_batches;
    const std::int64_t step_rows = B * copies;
    const auto rows_of = [&](int m) { const int j = m % micro_batches; return B / micro_batches + (j < B % micro_batches ? 1 : 0); };
    std::map<int, std::pair<tensor<cpu>, tensor<cpu>>> batches;  // by copy, as they are needed
    const auto rows_for = [&](int m) {
      const int c = m / micro_batches, j = m % micro_batches;
      auto it = batches.find(c);
      if (it == batches.end())
        it = batches.emplace(c, ctx.dataset.template batch<cpu>(split, index, B, T, ctx.seed, c, copies)).first;
      std::int64_t from = 0;
      for (int k = 0; k < j; ++k) from += rows_of(c * micro_batches + k);
      return std::make_pair(to_device<D>(it->second.first.slice(0, from, from + rows_of(m)).contiguous()),
                            to_device<D>(it->second.second.slice(0, from, from + rows_of(m)).contiguous()));
    };
    const auto share_of = [&](int m) { return static_cast<double>(rows_of(m)) / static_cast<double>(step_rows); };
    // One tag for every step (the header names the step): a standing allowance, set once per
    // size, not one per step. A failed step's messages stay behind in the old view's tag space.
    const transport::tag_type tag = transport::tag_type{0x73776d00u | (train ? 0u : 1u)} << 32;
    const auto message_bytes = [&](int m) {
      return sizeof(wire::header) + codec.max_encoded_bytes(static_cast<std::size_t>(rows_of(m) * T * C));
    };
    // Whatever peers of the stages beside this one send it this step, however far ahead.
    transport::allow(ep, tag, static_cast<std::uint64_t>(count + 1) * message_bytes(0));

    outcome out;
    out.step_rows = step_rows;
    std::vector<std::byte> encoded;
    const auto send = [&](int to, std::uint32_t kind, int m, const tensor<D>* value) {
      wire::header h;
      h.kind = kind;
      h.step = static_cast<std::uint32_t>(index);
      h.micro = m;
      transport::bytes msg;
      if (value) {
        const auto host = to_device<cpu>(value->contiguous());
        const auto nv = static_cast<std::size_t>(host.numel());
        encoded.resize(codec.max_encoded_bytes(nv));
        h.bytes = codec.encode(std::span<const float>(host.template data<float>(), nv), std::span<std::byte>(encoded));
        h.rows = static_cast<std::int32_t>(host.size(0));
        h.width = host.size(2);
      }
      msg.resize(sizeof h + h.bytes);
      std::memcpy(msg.data(), &h, sizeof h);
      if (h.bytes > 0) std::memcpy(msg.data() + sizeof h, encoded.data(), h.bytes);
      ep.send(to, tag, std::span<const std::byte>(msg.data(), msg.size()));
      stats_.bytes_sent += msg.size();
    };
    // The values of an activation or gradient of micro-batch m from `from`, checked.
    const auto values_of = [&](const transport::received& r, const wire::header& h) {
      const auto m = h.micro;
      check(h.rows == rows_of(m) && h.width == C, "swarm: peer ", r.source, " sent micro-batch ", m, " with ", h.rows,
            " rows of width ", h.width, "; expected ", rows_of(m), " of width ", C);
      const auto nv = static_cast<std::size_t>(rows_of(m) * T * C);
      check(h.bytes <= codec.max_encoded_bytes(nv) && r.data.size() == sizeof h + h.bytes, "swarm: peer ", r.source,
            " sent a payload of ", r.data.size() - sizeof h, " bytes announcing ", h.bytes, " for ", nv, " values");
      auto v = zeros<cpu>(shape{rows_of(m), T, C});
      codec.decode_add(std::span<const std::byte>(r.data.data() + sizeof h, h.bytes), std::span<float>(v.template data<float>(), nv));
      return to_device<D>(v);
    };
    // The round trip on the endpoint's clock: simulated links and compute in simulation, the wall
    // on a real network (the same figure drives the router in both).
    const auto clock = [&] { return ep.stats().clock_seconds; };

    struct stashed {
      var<D> in, out;
      int from = -1, to = -1;  // the peers it came from (-1: this peer's own rows) and went to
      double sent = 0;
    };
    std::map<int, stashed> stash;
    std::vector<int> processed;  // the micro-batches this peer forwarded at its stage
    std::set<int> seen, finished_from;
    bool said_finished = false;
    const auto compute = [&](auto&& f) {
      const double t0 = ctx.compute_clock ? ctx.compute_clock() : 0.0;
      f();
      if (ctx.compute_clock) {
        const double took = ctx.compute_clock() - t0;
        stats_.busy_s += took;
        busy_since_ += took / transport::compute_speed(ctx.network);
        if (ctx.computed) ctx.computed(took);
      }
    };
    // A micro-batch's forward on this peer: on the last stage its loss and backward, the input's
    // gradient back to where it came from; else on to the next stage's peer the router picks.
    const auto forward = [&](int m, var<D> in, int from) {
      ++out.micro;
      processed.push_back(m);
      out.rows += rows_of(m);
      if (train) ++begun_;
      const auto rows = rows_for(m);
      var<D> y;
      compute([&] { y = ctx.model.stage_forward(s, in, rows.first, rows.second, train ? &ctx.dropout : nullptr); });
      if (s == last) {
        out.loss += share_of(m) * static_cast<double>(y.item());
        if (!train) return;
        compute([&] { y.backward(full<D>(y.shape(), static_cast<float>(share_of(m)), y.dtype())); });
        if (from >= 0) {
          const auto g = in.grad();
          send(from, wire::gradient, m, &g);
        }
        return;
      }
      const auto to = route.next();
      check(to.has_value(), "swarm: stage ", s + 1, " has no peer to send micro-batch ", m, " to");
      const auto value = y.value();
      send(*to, wire::activation, m, &value);
      if (train) stash[m] = stashed{std::move(in), std::move(y), from, *to, clock()};
    };
    const auto say_finished = [&] {
      if (said_finished || s == last) return;
      for (const int d : down) send(d, wire::finished, -1, nullptr);
      said_finished = true;
    };

    if (s == 0) {
      const int mine = static_cast<int>(std::find(pool[0].begin(), pool[0].end(), me) - pool[0].begin());
      const int first_pool = static_cast<int>(pool[0].size());
      for (int m = mine; m < count; m += first_pool) forward(m, var<D>{}, -1);
      say_finished();
    }
    const auto done = [&] { return stash.empty() && finished_from.size() == up.size(); };
    while (!done()) {
      const auto r = ep.recv_any(std::span<const int>(sources), tag);
      wire::header h;
      check(r.data.size() >= sizeof h, "swarm: peer ", r.source, " sent a message of ", r.data.size(),
            " bytes, shorter than its header");
      std::memcpy(&h, r.data.data(), sizeof h);
      const bool from_up = std::binary_search(up.begin(), up.end(), r.source);
      const bool from_down = std::binary_search(down.begin(), down.end(), r.source);
      check(h.step == static_cast<std::uint32_t>(index), "swarm: peer ", r.source, " sent a message of step ", h.step,
            " during step ", index);
      if (h.kind == wire::finished) {
        check(from_up && finished_from.insert(r.source).second, "swarm: peer ", r.source,
              " said it finished the step, and is not a peer of the stage before that had not");
        if (finished_from.size() == up.size()) say_finished();
        continue;
      }
      check(h.micro >= 0 && h.micro < count, "swarm: peer ", r.source, " sent micro-batch ", h.micro, " of a step of ", count);
      if (h.kind == wire::activation) {
        check(from_up && !finished_from.count(r.source) && seen.insert(h.micro).second, "swarm: peer ", r.source,
              " sent an activation of micro-batch ", h.micro, " this stage does not expect (a second time, after it "
              "finished, or from a peer not of the stage before)");
        forward(h.micro, var<D>(values_of(r, h), train), r.source);
        continue;
      }
      auto it = stash.find(h.micro);
      check(h.kind == wire::gradient && from_down && it != stash.end() && it->second.to == r.source, "swarm: peer ",
            r.source, " sent a message (kind ", h.kind, ") for micro-batch ", h.micro, " that this stage did not send it");
      const auto g = values_of(r, h);
      auto st = std::move(it->second);
      stash.erase(it);
      // (on a simulated network, when the answer arrived: this peer may have been busy since)
      const double answered = std::isnan(r.arrival_s) ? clock() : r.arrival_s;
      route.measured(st.to, std::max(1e-9, answered - st.sent),
                     static_cast<double>(rows_of(h.micro)));
      compute([&] { st.out.backward(g); });
      if (st.from >= 0) {
        const auto gi = st.in.grad();
        send(st.from, wire::gradient, h.micro, &gi);
      }
    }
    // The loss, known on every peer, and how many times each stage processed each micro-batch:
    // once, every one.
    std::vector<double> totals(1 + static_cast<std::size_t>(stages) * static_cast<std::size_t>(count), 0.0);
    totals[0] = out.loss;
    for (const int m : processed) totals[1 + static_cast<std::size_t>(s) * static_cast<std::size_t>(count) + static_cast<std::size_t>(m)] += 1;
    ctx.comm.all_reduce(std::span<double>(totals), collective::reduce_op::sum);
    for (int k = 0; k < stages; ++k)
      for (int m = 0; m < count; ++m) {
        const double times = totals[1 + static_cast<std::size_t>(k) * static_cast<std::size_t>(count) + static_cast<std::size_t>(m)];
        check(times == 1, "swarm: ", train ? "step " : "evaluation batch ", index, ": stage ", k, " processed micro-batch ", m,
              " ", times, " times (each must be processed once: a micro-batch lost or processed twice)");
      }
    out.loss = totals[0];
    return out;
  }

  // The router of the stage after this peer's; measured afresh when that pool changes (its
  // ranks are the view's, which a re-formed group numbers anew).
  pools::router& router_for(const std::vector<int>& down) {
    const bool same = router_ && router_->size() == down.size() &&
                      std::all_of(down.begin(), down.end(), [&](int p) { return router_->contains(p); });
    if (!same) {
      router_.emplace(routing);
      for (const int p : down) router_->add(p);
    }
    return *router_;
  }

  std::optional<pools::router> router_;
  std::map<std::int64_t, checked_step> checked_;
  std::optional<pools::rebalancer> rebalancer_;
  std::optional<std::vector<std::pair<int, int>>> pending_;  // a rebalancing move: (view rank, stage)
  std::int64_t checked_step_ = -1;
  std::vector<int> members_;  // the world ranks of the view, as the last regroup gave them (empty: the first view)
  std::int64_t rows_since_ = 0;  // since the last rebalancing check
  double busy_since_ = 0;        // compute seconds at this peer's speed (a simulated peer's own)
  swarm_stats stats_;
  std::int64_t begun_step_ = -1, begun_ = 0;
  int placed_stage_ = -1;
};

}  // namespace decentrain::parallel
