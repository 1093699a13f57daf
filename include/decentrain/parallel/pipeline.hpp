// Pipeline parallelism: the model cut into `stages` parts (nn::part), one per peer (with
// `chunks` v, into v x stages, v per peer: interleaved schedules and ZB-V, each laying the
// chunks out its own way, nn::chunk_layout), each step's rows split into
// `micro_batches` that go through the stages by a schedule (schedule/), and
// world / stages copies of the pipeline (replicas) that each take their own rows, as data
// parallelism does. Peer r holds stage r % stages of copy r / stages, or where `ranks` puts it
// (parallel::place_by_links finds a placement from the links between peers); the communication policy
// averages a stage's parameters among its copies (placement::replicas), and the clipping norm is
// taken over the whole pipeline (the tied embedding, held by the peers of the first and the last
// model stage, counted once). With one stage and one micro-batch it is data parallelism.
//
// What it needs of the model, beside a constructor that builds one part (nn::gpt has them):
//   var<D> stage_forward(int s, const var<D>& in, const tensor<D>& ids, const tensor<D>& targets, rng*)
//   std::int64_t stream_width() const; std::vector<std::string> tied_parameters() const
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decentrain/autograd/math.hpp"
#include "decentrain/autograd/variable.hpp"
#include "decentrain/collective/communicator.hpp"
#include "decentrain/compress/identity.hpp"
#include "decentrain/data/dataset.hpp"
#include "decentrain/nn/part.hpp"
#include "decentrain/optim/clip.hpp"
#include "decentrain/parallel/link_placement.hpp"
#include "decentrain/parallel/policy.hpp"
#include "decentrain/parallel/stage_model.hpp"
#include "decentrain/parallel/schedule/schedule.hpp"

namespace decentrain::parallel {

template <class Codec = compress::identity>
struct pipeline {
  using policy_concept = policy_tag;
  static constexpr const char* name = "pipeline";
  // Adds a step's inner steps' gradients up where the trainer asks (ctx.accumulating); a peer
  // holding one stage of several takes one inner step a step (the trainer refuses more).
  bool accumulates_gradients() const { return true; }

  int stages = 2;
  int micro_batches = 1;         // per step and copy of the pipeline; at most the rows per step
  std::string schedule = "1f1b";  // schedule::names
  int chunks = 0;  // model stages per peer (interleaved's v; the model is cut into stages x chunks); 0: the schedule's
  std::vector<std::int64_t> blocks;  // blocks per model stage (empty: an even cut)
  std::vector<std::vector<int>> ranks;  // ranks[s][c]: the world rank at stage s of copy c (empty: rank order)
  Codec codec{};                 // the activations and their gradients between stages
  // When the group re-forms (fault::elastic: peers lost), the job takes another stages x copies
  // shape (morph); never fewer stages than this (a model that fits no peer whole: its stages).
  int min_stages = 1;

  // Throws naming the setting that is out of range (the schedule's name included).
  void validate(int world) const {
    using decentrain::detail::check;
    check(stages >= 1, "pipeline: stages must be >= 1, got ", stages);
    check(micro_batches >= 1, "pipeline: micro-batches must be >= 1, got ", micro_batches);
    check(world % stages == 0, "pipeline: ", world, " peers do not divide into copies of ", stages,
          " stages (peers must be a multiple of stages)");
    (void)schedule::by_name(schedule, stages, micro_batches, chunks_per_peer());
    if (!ranks.empty()) check_grid(ranks, stages, world);
  }

  int chunks_per_peer() const { return chunks > 0 ? chunks : schedule::default_chunks(schedule); }
  // How the schedule lays a peer's chunks out: ZB-V's in a V, the others' looped.
  nn::chunk_layout layout() const { return schedule == "zb-v" ? nn::chunk_layout::v : nn::chunk_layout::looped; }

  placement place(int rank, int world) const {
    validate(world);
    if (stages == 1 && chunks_per_peer() == 1 && ranks.empty()) {
      auto p = everyone(world);
      p.copy = rank;
      return p;
    }
    const auto grid = ranks.empty() ? rank_order(stages, world / stages) : ranks;
    placement p;
    for (std::size_t s = 0; s < grid.size(); ++s)
      for (std::size_t c = 0; c < grid[s].size(); ++c)
        if (grid[s][c] == rank) {
          p.stage = static_cast<int>(s);
          p.copy = static_cast<int>(c);
        }
    p.stages = stages;
    p.chunks = chunks_per_peer();
    p.layout = layout();
    p.blocks = blocks;
    p.replicas = grid[static_cast<std::size_t>(p.stage)];
    std::sort(p.replicas.begin(), p.replicas.end());
    for (int s = 0; s < stages; ++s) p.pipeline.push_back(grid[static_cast<std::size_t>(s)][static_cast<std::size_t>(p.copy)]);
    return p;
  }

  // Varuna's morphing: a new shape for `world` peers and a model of `n_blocks` blocks, chosen
  // from the stages first asked for, so every peer (and a later morph) picks the same: the fewest
  // stages >= those that divide the peers and that the model, the schedule and min_stages
  // allow, else the most below them. The peers go in rank order (a placement's `ranks` was made
  // for other peers), and a cost partitioner's `blocks` stay only where the stages are those it
  // cut for (else an even cut). Throws naming the shape when none fits. Returns the stages.
  int morph(int world, std::int64_t n_blocks) {
    if (asked_stages_ == 0) {
      asked_stages_ = stages;
      asked_blocks_ = blocks;
    }
    decentrain::detail::check(world >= 1, "pipeline: cannot re-form a pipeline of ", world, " peers");
    const auto fits = [&](int s) {
      if (world % s != 0 || s < min_stages || static_cast<std::int64_t>(s) * chunks_per_peer() > n_blocks) return false;
      try {
        (void)schedule::by_name(schedule, s, micro_batches, chunks_per_peer());
        return true;
      } catch (const decentrain::error&) {
        return false;
      }
    };
    int chosen = 0;
    for (int s = asked_stages_; s <= world && chosen == 0; ++s)
      if (fits(s)) chosen = s;
    for (int s = asked_stages_ - 1; s >= 1 && chosen == 0; --s)
      if (fits(s)) chosen = s;
    decentrain::detail::check(chosen > 0, "pipeline: ", world, " peer(s) cannot re-form the pipeline: no number of stages "
                              ">= min_stages (", min_stages, ") divides them and cuts a model of ", n_blocks, " blocks",
                              chunks_per_peer() > 1 ? " into chunks" : "", " under schedule ", schedule, " with ",
                              micro_batches, " micro-batches");
    stages = chosen;
    blocks = chosen == asked_stages_ ? asked_blocks_ : std::vector<std::int64_t>{};
    ranks.clear();
    program_.reset();
    return chosen;
  }

  template <class Ctx>
  static constexpr bool check_model() {
    return check_stage_model<Ctx>();
  }

  template <class Ctx>
  step_result forward_backward(Ctx& ctx) {
    const auto micro = micro_batches_of(ctx, decentrain::data::split::train, ctx.step, micro_batches);
    if (!ctx.accumulating || ctx.sub_step == 0) ctx.parameters.zero_grad();  // (else added to: ctx.accumulating)
    const auto stats = run(ctx, program_for(ctx, micro_batches), micro, true);
    sum_tied(ctx);
    last_ = stats;
    const std::int64_t B = ctx.batch_size, T = ctx.block;
    return {shared_loss(ctx, stats.loss), B, B * T, static_cast<double>(B)};
  }

  template <class Ctx>
  double evaluate(Ctx& ctx, std::int64_t batch) {
    const auto micro = micro_batches_of(ctx, decentrain::data::split::validation, batch, 1);
    // One micro-batch forward through the model's stages, each peer taking its own in order.
    const auto part = ctx.placement.part();
    schedule::program forward;
    forward.micro_batches = 1;
    forward.actions.resize(static_cast<std::size_t>(stages));
    for (int s = 0; s < part.model_stages(); ++s) {
      forward.peer_of.push_back(part.peer_of(s));
      forward.actions[static_cast<std::size_t>(part.peer_of(s))].push_back({schedule::op::forward, 0, s});
    }
    const auto stats = run(ctx, forward, micro, false);
    return shared_loss(ctx, stats.loss);
  }

  // The clipping norm over the whole pipeline: each stage's sum of squares added up, the tied
  // parameters counted on the peer of the first model stage only.
  template <class Ctx>
  optim::norm_share grad_norm_share(Ctx& ctx) {
    optim::norm_share share;
    if (ctx.placement.stages == 1) return share;
    if (!ctx.placement.part().first()) share.counted_elsewhere = ctx.model.tied_parameters();
    share.total = [&ctx](double mine) {
      ctx.pipeline.all_reduce(std::span<double>(&mine, 1), collective::reduce_op::sum);
      return mine;
    };
    return share;
  }

  // The last step's figures on this peer (peak stashed micro-batches, bytes sent).
  const schedule::run_stats& last_run() const { return last_; }

 private:
  // This copy's rows of the step (as data parallelism gives them to rank `copy` of `copies`, and
  // to each of a step's inner steps rows of its own: ctx.sub_step, where work is sized to speed),
  // cut into `count` micro-batches as even as they go.
  template <class Ctx>
  std::vector<schedule::micro_batch> micro_batches_of(Ctx& ctx, decentrain::data::split split, std::int64_t index,
                                                      int count) const {
    const std::int64_t B = ctx.batch_size, T = ctx.block;
    decentrain::detail::check(count <= B, "pipeline: ", count, " micro-batches of ", B,
                              " rows per step (micro-batches must be at most the batch size)");
    // One stage: every peer is a copy, of the group as it stands (fault::elastic re-forms it).
    const int copies = ctx.comm.world() / ctx.placement.stages;
    const int copy = ctx.placement.stages == 1 ? ctx.comm.rank() : ctx.placement.copy;
    const std::int64_t sub = split == decentrain::data::split::train ? ctx.sub_step : 0;
    auto [x, y] = ctx.dataset.template batch<cpu>(split, index, B, T, ctx.seed, sub * copies + copy, (sub + 1) * copies);
    std::vector<schedule::micro_batch> out;
    for (std::int64_t m = 0, row = 0; m < count; ++m) {
      const std::int64_t rows = B / count + (m < B % count ? 1 : 0);
      out.push_back({x.slice(0, row, row + rows).contiguous(), y.slice(0, row, row + rows).contiguous(),
                     static_cast<double>(rows) / static_cast<double>(B)});
      row += rows;
    }
    return out;
  }

  // The schedule's program, checked, and checked against the model part's layout: each model
  // stage run by the peer that holds it.
  template <class Ctx>
  const schedule::program& program_for(const Ctx& ctx, int micro) {
    if (!program_ || program_->micro_batches != micro) {
      program_ = schedule::by_name(schedule, stages, micro, chunks_per_peer());
      schedule::check(*program_);
      const auto part = ctx.placement.part();
      decentrain::detail::check(program_->stages() == part.model_stages(), "pipeline: schedule ", schedule, " runs ",
                                program_->stages(), " model stages, the model is cut into ", part.model_stages());
      for (int s = 0; s < part.model_stages(); ++s)
        decentrain::detail::check(program_->peer_of[static_cast<std::size_t>(s)] == part.peer_of(s), "pipeline: schedule ",
                                  schedule, " runs model stage ", s, " on peer ", program_->peer_of[static_cast<std::size_t>(s)],
                                  ", the model part's layout puts it on peer ", part.peer_of(s));
    }
    return *program_;
  }


  template <class Ctx>
  schedule::run_stats run(Ctx& ctx, const schedule::program& p, const std::vector<schedule::micro_batch>& micro, bool train) {
    std::vector<int> comm_rank;  // program peer s holds stage s
    for (int s = 0; s < ctx.placement.stages; ++s) comm_rank.push_back(rank_of_stage(ctx.placement, s));
    return schedule::execute(p, ctx.placement.stage, ctx.model, ctx.pipeline, comm_rank, micro, codec, train, &ctx.dropout);
  }

  // The tied parameters' gradients summed between the peers of the first and the last model
  // stage (a float sum of two is the same either way round, so both hold the same sum bit for
  // bit); nothing to do where one peer holds both (ZB-V's first: the autograd summed them).
  template <class Ctx>
  void sum_tied(Ctx& ctx) {
    const auto& at = ctx.placement;
    const auto part = at.part();
    const int first = part.peer_of(0), last = part.peer_of(part.model_stages() - 1);
    if (at.stages == 1 || first == last || (at.stage != first && at.stage != last)) return;
    const int peer = rank_of_stage(at, at.stage == first ? last : first);
    for (const auto& tied : ctx.model.tied_parameters()) {
      auto& param = ctx.parameters.get(tied);
      auto& g = param.grad();
      if (!g.defined()) g = zeros_like(param.value());
      const auto mine = host_copy(g);
      auto theirs = tensor<cpu>::empty(mine.shape(), mine.dtype());
      const auto n = static_cast<std::size_t>(mine.numel());
      ctx.pipeline.exchange_with(peer, std::span<const float>(mine.template data<float>(), n),
                                 std::span<float>(theirs.template data<float>(), n));
      g = math::add(g, to_device<typename Ctx::device_type>(theirs));
    }
  }

  // The step's loss, computed on the last model stage, known to every stage of the pipeline.
  template <class Ctx>
  static double shared_loss(Ctx& ctx, double loss) {
    if (ctx.placement.stages == 1) return loss;
    const auto part = ctx.placement.part();
    ctx.pipeline.broadcast(std::span<double>(&loss, 1), rank_of_stage(ctx.placement, part.peer_of(part.model_stages() - 1)));
    return loss;
  }

  // The rank in the pipeline's communicator (its world ranks in ascending order) of the peer
  // at index `s` of the pipeline (the one that holds stage s, and with chunks its other ones).
  static int rank_of_stage(const placement& at, int s) {
    if (at.stages == 1) return 0;
    const int world_rank = at.pipeline[static_cast<std::size_t>(s)];
    return static_cast<int>(std::count_if(at.pipeline.begin(), at.pipeline.end(), [&](int r) { return r < world_rank; }));
  }

  std::optional<schedule::program> program_;
  schedule::run_stats last_;
  int asked_stages_ = 0;  // the stages and blocks first asked for (0: not morphed yet)
  std::vector<std::int64_t> asked_blocks_;
};

}  // namespace decentrain::parallel
