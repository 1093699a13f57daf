// Pipeline parallelism: the model cut into `stages` parts (nn::part), one per peer (with
// `chunks` v, into v x stages, v per peer: interleaved schedules), each step's rows split into
// `micro_batches` that go through the stages by a schedule (schedule/), and
// world / stages copies of the pipeline (replicas) that each take their own rows, as data
// parallelism does. Peer r holds stage r % stages of copy r / stages; the communication policy
// averages a stage's parameters among its copies (placement::replicas), and the clipping norm is
// taken over the whole pipeline (the tied embedding, held by the first and the last stage,
// counted once). With one stage and one micro-batch it is data parallelism.
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
#include "decentrain/compress/identity.hpp"
#include "decentrain/data/dataset.hpp"
#include "decentrain/optim/clip.hpp"
#include "decentrain/parallel/policy.hpp"
#include "decentrain/parallel/schedule/schedule.hpp"

namespace decentrain::parallel {

template <class Codec = compress::identity>
struct pipeline {
  using policy_concept = policy_tag;
  static constexpr const char* name = "pipeline";

  int stages = 2;
  int micro_batches = 1;         // per step and copy of the pipeline; at most the rows per step
  std::string schedule = "1f1b";  // schedule::names
  int chunks = 1;                  // model stages per peer (interleaved's v; the model is cut into stages x chunks)
  std::vector<std::int64_t> blocks;  // blocks per model stage (empty: an even cut)
  Codec codec{};                 // the activations and their gradients between stages

  // Throws naming the setting that is out of range (the schedule's name included).
  void validate(int world) const {
    using decentrain::detail::check;
    check(stages >= 1, "pipeline: stages must be >= 1, got ", stages);
    check(micro_batches >= 1, "pipeline: micro-batches must be >= 1, got ", micro_batches);
    check(world % stages == 0, "pipeline: ", world, " peers do not divide into copies of ", stages,
          " stages (peers must be a multiple of stages)");
    (void)schedule::by_name(schedule, stages, micro_batches, chunks);
  }

  placement place(int rank, int world) const {
    validate(world);
    if (stages == 1 && chunks == 1) return everyone(world);
    placement p;
    p.stage = rank % stages;
    p.stages = stages;
    p.chunks = chunks;
    p.blocks = blocks;
    for (int r = p.stage; r < world; r += stages) p.replicas.push_back(r);
    for (int s = 0; s < stages; ++s) p.pipeline.push_back(rank - p.stage + s);
    return p;
  }

  template <class Ctx>
  static constexpr bool check_model() {
    using D = typename Ctx::device_type;
    using M = typename Ctx::model_type;
    static_assert(requires(const M& m, int s, const var<D>& in, const tensor<D>& ids, rng* r) {
                    { m.stage_forward(s, in, ids, ids, r) } -> std::same_as<var<D>>;
                  },
                  "parallel::pipeline: the model needs `var<D> stage_forward(int stage, const var<D>& in, const tensor<D>& ids, "
                  "const tensor<D>& targets, rng* dropout) const` (a model stage's forward; the last returns the loss)");
    static_assert(requires(const M& m) { { m.stream_width() } -> std::convertible_to<std::int64_t>; },
                  "parallel::pipeline: the model needs `std::int64_t stream_width() const` (C of the (B, T, C) stream "
                  "between stages)");
    static_assert(requires(const M& m) { { m.tied_parameters() } -> std::same_as<std::vector<std::string>>; },
                  "parallel::pipeline: the model needs `std::vector<std::string> tied_parameters() const` (parameters "
                  "held by the first and the last stage, whose gradients are summed; empty when none)");
    return true;
  }

  template <class Ctx>
  step_result forward_backward(Ctx& ctx) {
    const auto micro = micro_batches_of(ctx, decentrain::data::split::train, ctx.step, micro_batches);
    ctx.parameters.zero_grad();
    const auto stats = run(ctx, program_for(micro_batches), micro, true);
    sum_tied(ctx);
    last_ = stats;
    const std::int64_t B = ctx.batch_size, T = ctx.block;
    return {shared_loss(ctx, stats.loss), B, B * T, static_cast<double>(B)};
  }

  template <class Ctx>
  double evaluate(Ctx& ctx, std::int64_t batch) {
    const auto micro = micro_batches_of(ctx, decentrain::data::split::validation, batch, 1);
    // One micro-batch forward through the model's stages, each peer taking its own in order.
    schedule::program forward;
    forward.micro_batches = 1;
    forward.actions.resize(static_cast<std::size_t>(stages));
    for (int s = 0; s < stages * chunks; ++s) {
      forward.peer_of.push_back(s % stages);
      forward.actions[static_cast<std::size_t>(s % stages)].push_back({schedule::op::forward, 0, s});
    }
    const auto stats = run(ctx, forward, micro, false);
    return shared_loss(ctx, stats.loss);
  }

  // The clipping norm over the whole pipeline: each stage's sum of squares added up, the tied
  // parameters counted on the first stage only.
  template <class Ctx>
  optim::norm_share grad_norm_share(Ctx& ctx) {
    optim::norm_share share;
    if (ctx.placement.stages == 1) return share;
    if (ctx.placement.stage != 0) share.counted_elsewhere = ctx.model.tied_parameters();
    share.total = [&ctx](double mine) {
      ctx.pipeline.all_reduce(std::span<double>(&mine, 1), collective::reduce_op::sum);
      return mine;
    };
    return share;
  }

  // The last step's figures on this peer (peak stashed micro-batches, bytes sent).
  const schedule::run_stats& last_run() const { return last_; }

 private:
  // This copy's rows of the step (as data parallelism gives them to rank `copy` of `copies`),
  // cut into `count` micro-batches as even as they go.
  template <class Ctx>
  std::vector<schedule::micro_batch> micro_batches_of(Ctx& ctx, decentrain::data::split split, std::int64_t index,
                                                      int count) const {
    const std::int64_t B = ctx.batch_size, T = ctx.block;
    decentrain::detail::check(count <= B, "pipeline: ", count, " micro-batches of ", B,
                              " rows per step (micro-batches must be at most the batch size)");
    const int copies = ctx.comm.world() / ctx.placement.stages, copy = ctx.comm.rank() / ctx.placement.stages;
    auto [x, y] = ctx.dataset.template batch<cpu>(split, index, B, T, ctx.seed, copy, copies);
    std::vector<schedule::micro_batch> out;
    for (std::int64_t m = 0, row = 0; m < count; ++m) {
      const std::int64_t rows = B / count + (m < B % count ? 1 : 0);
      out.push_back({x.slice(0, row, row + rows).contiguous(), y.slice(0, row, row + rows).contiguous(),
                     static_cast<double>(rows) / static_cast<double>(B)});
      row += rows;
    }
    return out;
  }

  const schedule::program& program_for(int micro) {
    if (!program_ || program_->micro_batches != micro) {
      program_ = schedule::by_name(schedule, stages, micro, chunks);
      schedule::check(*program_);
    }
    return *program_;
  }

  template <class Ctx>
  schedule::run_stats run(Ctx& ctx, const schedule::program& p, const std::vector<schedule::micro_batch>& micro, bool train) {
    std::vector<int> comm_rank;  // program peer s holds stage s
    for (int s = 0; s < ctx.placement.stages; ++s) comm_rank.push_back(rank_of_stage(ctx.placement, s));
    return schedule::execute(p, ctx.placement.stage, ctx.model, ctx.pipeline, comm_rank, micro, codec, train, &ctx.dropout);
  }

  // The tied parameters' gradients summed between the first and the last stage (a float sum of
  // two is the same either way round, so both hold the same sum bit for bit).
  template <class Ctx>
  void sum_tied(Ctx& ctx) {
    const auto& at = ctx.placement;
    if (at.stages == 1 || (at.stage != 0 && at.stage != at.stages - 1)) return;
    const int peer = rank_of_stage(at, at.stage == 0 ? at.stages - 1 : 0);
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

  // The step's loss, computed on the last stage, known to every stage of the pipeline.
  template <class Ctx>
  static double shared_loss(Ctx& ctx, double loss) {
    if (ctx.placement.stages == 1) return loss;
    ctx.pipeline.broadcast(std::span<double>(&loss, 1), rank_of_stage(ctx.placement, ctx.placement.stages - 1));
    return loss;
  }

  // The rank in the pipeline's communicator (its world ranks in ascending order) of the peer
  // that holds stage `s`.
  static int rank_of_stage(const placement& at, int s) {
    if (at.stages == 1) return 0;
    const int world_rank = at.pipeline[static_cast<std::size_t>(s)];
    return static_cast<int>(std::count_if(at.pipeline.begin(), at.pipeline.end(), [&](int r) { return r < world_rank; }));
  }

  std::optional<schedule::program> program_;
  schedule::run_stats last_;
};

}  // namespace decentrain::parallel
