// trainer<Model, CommPolicy, ParallelPolicy, FaultPolicy>: the training loop of one peer. Per
// step: the parallel policy runs forward and backward, the communication policy acts after the
// backward and after the inner AdamW step, and the fault policy after the step; a peer error
// inside a step, or in a collective between steps (the start, stop checks, evaluations), goes to
// the fault policy, which says rethrow, redo or re-form (errors in the fault policy's own start
// and checkpoints are not routed: they end the run). When a pipeline's group re-forms, the
// trainer deals the model's parts out again over it (redeal). The slots are defined
// on one page, train/concepts.hpp; options, metrics and the context a policy sees have headers
// of their own.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "decentrain/collective/communicator.hpp"
#include "decentrain/comm/sync_allreduce.hpp"
#include "decentrain/data/dataset.hpp"
#include "decentrain/detail/activity.hpp"
#include "decentrain/fault/none.hpp"
#include "decentrain/nn/part.hpp"
#include "decentrain/optim/adamw.hpp"
#include "decentrain/optim/clip.hpp"
#include "decentrain/optim/schedule.hpp"
#include "decentrain/parallel/data.hpp"
#include "decentrain/train/checkpoint.hpp"
#include "decentrain/train/concepts.hpp"
#include "decentrain/train/context.hpp"
#include "decentrain/train/metrics.hpp"
#include "decentrain/train/options.hpp"
#include "decentrain/train/redeal.hpp"
#include "decentrain/transport/any_endpoint.hpp"
#include "decentrain/transport/peer_error.hpp"

namespace decentrain::train {

template <class Model, class CommPolicy = comm::sync_allreduce<>, class ParallelPolicy = parallel::data,
          class FaultPolicy = fault::none>
class trainer {
  static_assert(check_slots<Model, CommPolicy, ParallelPolicy, FaultPolicy, peer_context<Model>>());

 public:
  using model_type = Model;
  using device_type = model_device_t<Model>;
  using model_config = typename Model::config_type;
  using comm_policy = CommPolicy;
  using parallel_policy = ParallelPolicy;
  using fault_policy = FaultPolicy;
  using context = peer_context<Model>;

  trainer(const model_config& config, trainer_options options, transport::any_endpoint endpoint, CommPolicy comm = {},
          ParallelPolicy parallel = {}, FaultPolicy fault = {})
      : options_(validated(options)),
        endpoint_(std::move(endpoint)),
        view_endpoint_(endpoint_),
        comm_(view_endpoint_, options_.collectives),
        parallel_(std::move(parallel)),
        placement_(first_placement(parallel_, config, endpoint_)),
        model_(make_model(config, options.seed, placement_)),
        optimizer_(make_optimizer()),
        schedule_{options.lr, options.floor_lr(), options.warmup(), options.steps},
        policy_(std::move(comm)),
        fault_(std::move(fault)),
        dropout_(options.seed ^ decentrain::detail::splitmix64(static_cast<std::uint64_t>(endpoint_.rank()) + 1), "dropout") {
    schedule_.validate();
    if constexpr (requires { requires ParallelPolicy::weights_vary; }) {
      static_assert(requires { { policy_.weighted } -> std::convertible_to<bool>; },
                    "trainer: this parallel policy (parallel::swarm) gives each peer a step weight of the rows it "
                    "processed, which differ from peer to peer: the communication policy must average by them (a "
                    "`bool weighted` member, as comm/policy.hpp's round_weight serves it)");
      decentrain::detail::check(policy_.weighted, "trainer: parallel::", ParallelPolicy::name, " gives each peer a step weight of the "
                                "rows it processed, which differ from peer to peer; set the communication policy's `weighted` "
                                "(", CommPolicy::name, ") so that its averages use them");
    }
    for (int r = 0; r < endpoint_.world(); ++r) members_.push_back(r);
    pipelined_ = placement_.stages > 1 || parallel_morphed_;
    note_placed();
    if (endpoint_.joined_late()) {  // its shape is a guess until the group deals it a part: no stage of it was lost
      placed_members_.clear();
      placed_stages_.clear();
    }
    make_groups();
    set_compute_dtype();
  }
  // The optimizer and the communicators point into the trainer: it stays where it was made.
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  Model& model() { return model_; }
  const Model& model() const { return model_; }
  CommPolicy& policy() { return policy_; }
  ParallelPolicy& parallel() { return parallel_; }
  FaultPolicy& fault() { return fault_; }
  const parallel::placement& placement() const { return placement_; }
  const trainer_options& options() const { return options_; }
  // This peer's rank and the group's size: in the current view when the group changed
  // (fault::elastic), else in the whole world.
  int rank() const { return comm_.rank(); }
  int world() const { return comm_.world(); }
  // The world ranks of the current view (every rank before any change).
  const std::vector<int>& members() const { return members_; }
  std::int64_t step() const { return step_; }
  // Steps this peer skipped to catch up with a group that closed rounds without it.
  std::int64_t skipped_steps() const { return skipped_steps_; }
  transport::traffic_stats traffic() const { return endpoint_.stats(); }
  // Bytes the communication policy's collectives sent, cumulative over the run and across a
  // restore (payload, without framing). The trainer counts them around every policy call, so a
  // policy needs no bookkeeping of its own.
  std::uint64_t policy_bytes_sent() const { return policy_bytes_; }

  // Each time a pipeline's parts were dealt out again after the group re-formed (redeal, below).
  using redeal_record = train::redeal_record;
  const std::vector<redeal_record>& redeals() const { return redeals_; }

  void on_step(std::function<void(const step_metrics&)> hook) { step_hooks_.push_back(std::move(hook)); }
  void on_eval(std::function<void(const eval_point&)> hook) { eval_hooks_.push_back(std::move(hook)); }
  // Asked between steps whether to stop early (Ctrl-C, say). With several peers they agree every
  // options().stop_check_every steps (any peer asking stops them all at the same step), so every
  // peer must be given one; with options().stop_check_in_background (the default) a check's
  // answer is read at the next check, where they stop. With options().stop_alone a peer asked
  // leaves at its next step and the others go on (fault::elastic). The fault policy's on_stop,
  // where it has one, then saves what must not be lost (and elastic says goodbye), and fit
  // returns.
  void stop_when(std::function<bool()> asked) { stop_asked_ = std::move(asked); }

  // Trains from the current step to options().steps and returns the metrics; every peer of the
  // world must call it (they meet in the policies' collectives).
  fit_result fit(const data::token_dataset& dataset) {
    struct no_step_after {  // what this thread does after fit is no step of it
      ~no_step_after() { decentrain::detail::this_thread_activity().step = -1; }
    } after;
    auto ctx = make_context(dataset);
    if constexpr (!requires { fault_.leave(ctx); })
      decentrain::detail::check(!options_.stop_alone, "trainer: stop_alone needs a fault policy with leave(ctx) that "
                                                      "lets the others go on without this peer (fault::elastic)");
    if constexpr (requires { fault_.reform(ctx); })
      if (pipelined_) check_redealable();
    if constexpr (requires { fault_.reform(ctx); })
      decentrain::detail::check(!pipelined_ || !catches_up(), "trainer: the communication policy lets a late replica skip ",
                                "steps (diloco's deadline), which a pipeline under ", FaultPolicy::name, " does not allow: ",
                                "its re-deal needs every stage at one step");
    adopted_ = false;
    if constexpr (requires { policy_.size_state(ctx); }) policy_.size_state(ctx);
    std::uint64_t dealt = redealt_;  // the parts ctx was made for
    fault_.start(ctx);
    went_back_ = false;       // (where a restarted group went back, it starts there)
    if (redealt_ != dealt) {  // a restarted group re-formed in its start
      refresh(ctx);
      dealt = redealt_;
    }
    ctx.step = ctx.steps_done = step_;  // the fault policy may have restored a later step
    // Restored, or given the state of a peer further on (a restarted elastic group's): the state
    // is what it should be, so the policy starts as resumed.
    ctx.resumed = resumed_ || adopted_;
    if (ctx.joined) {
      // A peer that joined a running group took a member's state: the policy's state came with
      // it (start as resumed: nothing to exchange), and it goes on from that member's phase.
      resume_at_ = resume_point{step_, ctx.at};
      ctx.resumed = true;
      counted([&] { policy_.start(ctx); });
      ctx.joined = false;
    } else {
      between_steps(ctx, phase::start, [&] {
        check_same_step();
        if constexpr (can_redeal())
          if (pipelined_) {
            settle_held();
            if (redealt_ != dealt) {
              refresh(ctx);
              dealt = redealt_;
            }
          }
        counted([&] { policy_.start(ctx); });
      });
    }
    resumed_ = ctx.resumed = false;
    fit_result result;
    send_rate_ = send_rate{};
    const auto wall0 = std::chrono::steady_clock::now();
    std::int64_t tokens = 0, stepped_to = -1;
    // The parts may be dealt out again in a call with a context of its own (an evaluation).
    const auto current = [&] {
      if (redealt_ == dealt) return;
      refresh(ctx);
      dealt = redealt_;
    };
    while (step_ < options_.steps) {
      const bool eval_due = step_ == stepped_to && options_.eval_every > 0 && step_ % options_.eval_every == 0;
      if ((eval_due || (resume_at_ && resume_at_->at == phase::evaluation)) && runs(phase::evaluation)) {
        const auto p = record_eval(dataset, step_);
        if (!std::isnan(p.val_loss)) result.evals.push_back(p);
      }
      current();
      bool stop = false;
      if (stop_asked_ && runs(phase::stop_check)) between_steps(ctx, phase::stop_check, [&] { stop = stop_requested(); });
      if (stop) {
        ctx.steps_done = step_;
        if constexpr (requires { fault_.leave(ctx); })
          if (options_.stop_alone) fault_.leave(ctx);  // first: the others need not wait for this peer's disk
        if constexpr (requires { fault_.on_stop(ctx); }) fault_.on_stop(ctx);
        result.stopped = true;
        break;
      }
      if (step_ >= options_.steps) break;  // the group handed this peer a state that had finished
      ctx.step = ctx.steps_done = step_;
      ctx.last_step = step_ + 1 == options_.steps;
      ctx.round_start = starts_round(step_);
      decentrain::detail::this_thread_activity().step = step_;  // named by in_process's deadlock report
      current();
      const auto s = run_step(ctx);
      if (s.adopted) continue;  // took the state of a peer that got further: go on from where it stood
      if (options_.stop_on_non_finite && s.computed && !std::isfinite(static_cast<double>(s.result.loss)))
        decentrain::detail::fail("trainer: peer ", rank(), " at step ", step_, ": the training loss is ", s.result.loss,
                                 " (the parameters diverged, or took in non-finite values from a peer); stopping before "
                                 "anything of this step is saved. Lower the learning rate, or set "
                                 "trainer_options::stop_on_non_finite = false to train on");
      ++step_;  // before the fault policy and the hooks, so a checkpoint taken in one resumes after this step
      if constexpr (requires { { policy_.catch_up() } -> std::convertible_to<std::int64_t>; }) catch_up_to(policy_.catch_up());
      spare_.reset();
      stepped_to = step_;
      ctx.steps_done = step_;
      fault_.after_step(ctx);
      tokens += s.result.tokens;

      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
      const auto traffic = endpoint_.stats();
      result.last = step_metrics{endpoint_.rank(), step_, s.result.loss, s.lr, s.grad_norm, static_cast<double>(tokens) / wall,
                                 traffic.bytes_sent, traffic.bytes_received, traffic.wait_seconds, traffic.clock_seconds,
                                 wall, unix_now(), policy_bytes_, redos_, compute_s_};
      send_rate_.add(traffic.clock_seconds, traffic.bytes_sent);
      result.last.peak_send_rate = send_rate_.peak();
      result.last.framing_bytes_sent = traffic.framing_bytes_sent;
      result.last.tokens = tokens;
      for (auto& h : step_hooks_) h(result.last);
    }
    finish_stop_check();
    if (result.stopped) return result;
    result.evals.push_back(record_eval(dataset, step_));
    result.final_val_loss = result.evals.back().val_loss;
    return result;
  }

  // Mean validation loss over this peer's rows of `batches` batches, averaged across peers, so
  // every peer reports the same number.
  double evaluate(const data::token_dataset& dataset, std::int64_t batches = 0) {
    if (batches <= 0) batches = options_.eval_batches;
    auto ctx = make_context(dataset);
    double mean = std::numeric_limits<double>::quiet_NaN();  // when the group moved on past it
    between_steps(ctx, phase::evaluation, [&] {
      no_grad guard;
      double sum = 0;
      for (std::int64_t i = 0; i < batches; ++i) sum += static_cast<double>(parallel_.evaluate(ctx, i));
      mean = sum / static_cast<double>(batches);
      comm_.all_reduce(std::span<double>(&mean, 1), collective::reduce_op::average);
      if constexpr (requires { requires CommPolicy::replicas_differ; }) consensus_ = consensus_distance(ctx);
    });
    return mean;
  }

  // This peer's whole state: model, AdamW, step, dropout stream and the policy's state; with
  // `views`, views of its host memory rather than copies (io::checkpoint::views).
  io::checkpoint capture(bool views = false) const {
    auto c = train::capture(model_, optimizer_, step_, views);
    c.rngs["dropout"] = dropout_.state();
    c.counters["trainer.rank"] = rank();
    c.counters["trainer.world"] = world();
    // A pipeline's stage holds a part of the model: its place, to join the stages' files again.
    c.counters["trainer.stage"] = placement_.stage;
    c.counters["trainer.stages"] = placement_.stages;
    c.counters["trainer.policy_bytes_sent"] = static_cast<std::int64_t>(policy_bytes_);
    policy_.save(c);
    if (pipelined_) split_policy_state(c);
    if constexpr (requires { parallel_.save(c); }) parallel_.save(c);  // (SWARM's routers)
    return c;
  }

  void restore(const io::checkpoint& c) {
    decentrain::detail::check(c.counter("trainer.world") == world() && c.counter("trainer.rank") == rank(),
                              "trainer: the checkpoint is peer ", c.counter("trainer.rank"), " of ",
                              c.counter("trainer.world"), ", this trainer is peer ", rank(), " of ", world());
    spare_.reset();
    if (holds_another_part(c)) {
      // Written by another shape of this job (its group re-formed before it stopped): held until
      // the group deals the parts out (settle_held, or a re-deal when the group re-forms).
      if constexpr (storable_config<model_config>)
        decentrain::detail::check(config_of<model_config>(c) == model_.config(), "checkpoint: its model configuration differs from the model's");
      held_ = c;
      held_->views = false;
      step_ = c.counter("step");
    } else {
      held_.reset();
      step_ = train::restore(c, model_, optimizer_);
    }
    auto it = c.rngs.find("dropout");
    decentrain::detail::check(it != c.rngs.end(), "checkpoint: missing rng 'dropout'");
    dropout_.set_state(it->second);
    policy_bytes_ = static_cast<std::uint64_t>(c.counter("trainer.policy_bytes_sent"));
    if (!held_) load_policy(c);  // (a held part's policy state is dealt out with it)
    if constexpr (requires { parallel_.load(c); }) parallel_.load(c);
    resumed_ = true;
  }

  // Whether `c` holds a pipeline's part other than this peer's (a checkpoint written after the
  // job re-formed), where the parts can be dealt out again; else restore refuses what it lacks.
  bool holds_another_part(const io::checkpoint& c) const {
    if (!can_redeal() || !pipelined_) return false;
    std::set<std::string> mine;
    for (const auto& e : model_.parameters()) mine.insert(e.name);
    // (a checkpoint that keeps the policy's state flat, written before it was kept by parameter,
    // is looked at without it: of this peer's part, it restores as it was written)
    return redeal_exchange::names_in(c, holds_policy_slices(c) ? policy_fields() : std::vector<std::string>{}) != mine;
  }

  // Another peer's state as this peer's: model, optimizer, step and the policy's state; this
  // peer keeps its rank, dropout stream and byte count (an elastic group's member that was
  // behind, or a peer that joins).
  void adopt(const io::checkpoint& c) {
    spare_.reset();
    step_ = train::restore(c, model_, optimizer_);
    load_policy(c);
    adopted_ = true;
  }

  // Adds another peer's own state (its codec's unsent residual: fault/handoff.hpp) to this
  // peer's: the policy's state saved, those tensors added, loaded back.
  void absorb(const io::checkpoint& theirs, const std::string& what) {
    io::checkpoint mine;
    policy_.save(mine);
    io::add_own_tensors(mine, theirs, what);
    policy_.load(mine);
  }

 private:
  struct step_outcome {
    parallel::step_result result;
    double lr = 0, grad_norm = 0;
    bool adopted = false;  // the fault policy gave this peer another's state (see resume_at_)
    bool computed = false;  // this call ran the forward and backward (not so when a state taken
                            // from a peer that had stepped left only the exchange): `result` is real
  };

  // One step, with a peer error routed to the fault policy: redo runs again what failed (the
  // whole step, dropout draws included, when the failure came before the inner optimizer, else
  // the after_step exchange). A redo assumes every peer saw the failure at the same point (as
  // when a peer is lost mid-collective and the group goes on without it); a codec's encode must
  // tolerate being called again for the same payload.
  step_outcome run_step(context& ctx) {
    step_outcome out;
    // A state taken from a peer that had stepped already: only its after_step is left.
    const bool stepped_before = resume_at_ && resume_at_->at == phase::stepped;
    if (stepped_before) resume_at_.reset();
    else (void)runs(phase::step);
    bool stepped = stepped_before;
    const auto dropout_before = dropout_.state();
    for (int redos = 0;;) {
      try {
        if constexpr (requires { fault_.before_step(ctx); })
          if (!stepped) fault_.before_step(ctx);
        if (!stepped) {
          // A parallel policy whose placement changes between steps (SWARM's rebalancing: a
          // re-deal) does so here, once the group stands where the step starts.
          if constexpr (requires { parallel_.between_steps(ctx); }) {
            const auto dealt = redealt_;
            parallel_.between_steps(ctx);
            if (redealt_ != dealt) refresh(ctx);
          }
          dropout_.set_state(dropout_before);
          const double compute_before = compute_s_;
          double passes_s = 0;  // of that, the forward and backward passes
          ctx.local_steps = local_steps();
          ctx.accumulating = accumulates();
          parallel::step_result total{0.0, 0, 0, 0.0};
          out.lr = schedule_(step_);  // (every inner step of a step at the step's rate)
          ctx.lr_scale = options_.lr > 0 ? out.lr / options_.lr : 1.0;
          optimizer_.set_lr(out.lr);
          for (ctx.sub_step = 0; ctx.sub_step < ctx.local_steps; ++ctx.sub_step) {
            auto t = compute_clock();
            charged_ = 0;
            const auto r = parallel_.forward_backward(ctx);
            out.computed = true;
            decentrain::detail::check(std::isfinite(r.weight) && r.weight >= 0, "trainer: the parallel policy gave step ",
                                      step_, " the weight ", r.weight, " (a step's weight must be finite and >= 0)");
            total = {total.loss + r.loss, total.rows + r.rows, total.tokens + r.tokens, total.weight + r.weight};
            ctx.step_weight = r.weight;
            // Before the exchange, so simulated links see it start after the compute; a network that
            // models a step's compute (deterministic in_process) takes its own figure.
            // (a policy that charged its compute as it went waited in between: the rest is not compute)
            const double passes_before = compute_s_;
            computed(transport::step_seconds(endpoint_).value_or(charged_ > 0 ? 0.0 : lap(t)));
            passes_s += compute_s_ - passes_before;
            if (ctx.accumulating) {
              // Micro-batches of one step: the gradients add up until the last, which then holds
              // their mean and weighs as all of them.
              if (ctx.sub_step + 1 < ctx.local_steps) continue;
              if (ctx.local_steps > 1) optim::scale_grads(ctx.parameters, 1.0 / static_cast<double>(ctx.local_steps));
              ctx.step_weight = total.weight;
            }
            counted([&] { policy_.after_backward(ctx); });
            // A parallel policy that finishes the gradients once the replicas' exchange is done
            // (SWARM's tied parameters, summed between the end stages' pools).
            if constexpr (requires { parallel_.after_averaging(ctx); }) parallel_.after_averaging(ctx);
            t = compute_clock();
            out.grad_norm = clip(ctx);
            optimizer_.step();
            computed(transport::step_seconds(endpoint_) ? 0.0 : lap(t));
          }
          ctx.sub_step = 0;
          // The step as a whole: its mean loss, and the weight of all its inner steps.
          out.result = total;
          out.result.loss = total.loss / static_cast<double>(ctx.local_steps);
          ctx.step_weight = total.weight;
          ctx.step_compute_s = compute_s_ - compute_before;
          ctx.step_passes_s = passes_s;
          stepped = true;
        }
        counted([&] { policy_.after_step(ctx); });
        return out;
      } catch (const transport::peer_error& e) {
        ctx.step = step_;
        ctx.at = stepped ? phase::stepped : phase::step;
        if (recover(ctx, e, redos)) {
          resume_at_ = resume_point{ctx.step, ctx.at};
          out.adopted = true;
          return out;
        }
      }
    }
  }

  // Hands a peer error to the fault policy, and returns once the failed part may run again:
  // rethrows when the policy says so (or has said redo max_redos times in a row), re-forms the
  // group when it says reform. ctx.step and ctx.at say where the failure struck; true when the
  // group gave this peer the state of one that stood further on, and they then say where.
  // `redos` counts the failures in a row; a view change that takes in a joiner is none.
  bool recover(context& ctx, const transport::peer_error& e, int& redos) {
    const fault::action a = fault_.on_error(ctx, e);
    if (a == fault::action::rethrow) throw e;
    if (e.cause() != transport::failure_cause::joining) {
      if (redos >= options_.max_redos)
        throw transport::peer_error(e.peer(), e.operation(),
                                    decentrain::detail::concat(e.what(), " (the fault policy asked to ", fault::action_name(a), " ",
                                                               redos, " times in a row; max_redos = ", options_.max_redos, ")"),
                                    e.cause());
      ++redos;
    }
    ++redos_;
    if (a != fault::action::reform) return false;
    if constexpr (requires { fault_.reform(ctx); }) {
      const auto step_before = ctx.step;
      const auto at_before = ctx.at;
      const auto dealt = redealt_;
      fault_.reform(ctx);
      if (redealt_ != dealt) refresh(ctx);
      // The group went back to a checkpoint's step (a stage's every replica lost): from its start.
      if (std::exchange(went_back_, false)) ctx.at = phase::step;
      if (step_ == step_before && ctx.at == at_before) return false;
      ctx.step = ctx.steps_done = step_;
      ctx.last_step = step_ + 1 == options_.steps;
      return true;
    } else {
      throw transport::peer_error(e.peer(), e.operation(),
                                  decentrain::detail::concat(e.what(), " (the fault policy said reform but has no reform(ctx))"),
                                  e.cause());
    }
  }

  // A collective between steps (the start, a stop check, an evaluation), with a peer error
  // routed to the fault policy as inside a step; `call` then runs again in the new group, unless
  // the group gave this peer a state from further on (false: resume_at_ says where).
  template <class Call>
  bool between_steps(context& ctx, phase at, Call&& call) {
    for (int redos = 0;;) {
      try {
        call();
        return true;
      } catch (const transport::peer_error& e) {
        ctx.step = ctx.steps_done = step_;
        ctx.at = at;
        if (recover(ctx, e, redos)) {
          resume_at_ = resume_point{ctx.step, ctx.at};
          return false;
        }
      }
    }
  }

  // Global-norm clipping (no limit when grad_clip is 0: the norm is still reported); over the
  // peers the parallel policy names, where it spreads the model over several (a pipeline).
  double clip(context& ctx) {
    const double limit = options_.grad_clip > 0 ? options_.grad_clip : std::numeric_limits<double>::infinity();
    if constexpr (requires { { parallel_.grad_norm_share(ctx) } -> std::same_as<optim::norm_share>; })
      return optim::clip_grad_norm(model_.parameters(), limit, parallel_.grad_norm_share(ctx));
    else
      return optim::clip_grad_norm(model_.parameters(), limit);
  }

  // Whether `step` starts a round of the communication policy (see comm/policy.hpp: a policy
  // without rounds ends one at every step).
  // Whether the policy lets a replica that came late to a round skip ahead (diloco's deadline).
  bool catches_up() const {
    if constexpr (requires { { policy_.catches_up() } -> std::convertible_to<bool>; })
      return policy_.catches_up();
    else
      return false;
  }
  bool starts_round(std::int64_t step) const {
    if constexpr (requires { { policy_.ends_round_at(step) } -> std::convertible_to<bool>; })
      return step == 0 || policy_.ends_round_at(step - 1);
    else
      return true;
  }
  // Whether the step after `steps_done` steps ends a round (its after_step exchanges; the run's
  // last step ends one).
  bool ends_round_between(std::int64_t steps_done) const {
    return starts_round(steps_done + 1) || steps_done + 1 >= options_.steps;
  }

  // Whether this peer runs phase `p` of the current step: not when it took the state of a peer
  // that stood further on (it skips to that peer's phase, and from there goes on as usual).
  bool runs(phase p) {
    if (!resume_at_) return true;
    if (p < resume_at_->at) return false;
    resume_at_.reset();
    return true;
  }

  context make_context(const data::token_dataset& dataset) {
    return context{.model = model_,
                   .parameters = model_.parameters(),
                   .comm = comm_,
                   .replicas = replicas_ ? *replicas_ : comm_,
                   .pipeline = pipeline_ ? *pipeline_ : comm_,
                   .placement = placement_,
                   .dataset = dataset,
                   .dropout = dropout_,
                   .batch_size = options_.batch_size,
                   .block = block(),
                   .seed = options_.seed,
                   .step = step_,
                   .steps_done = step_,
                   .last_step = false,
                   .run_steps = options_.steps,
                   .round_start = starts_round(step_),
                   .replicas_meet_at_round_start = !catches_up(),
                   .resumed = resumed_,
                   .joined = false,
                   .capture = [this] { return capture(); },
                   .capture_views = [this] { return capture(true); },
                   .restore = [this](const io::checkpoint& c) { restore(c); },
                   .compute_clock = [this] { return compute_clock(); },
                   // (a network that models a step's compute, deterministic in_process, charges its own figure)
                   .computed = [this](double s) {
                     if (transport::step_seconds(endpoint_)) return;
                     computed(s);
                     charged_ += s;
                   },
                   .network = endpoint_,
                   .at = phase::step,
                   .set_view = [this](std::uint64_t epoch, const std::vector<int>& members) { set_view(epoch, members); },
                   .adopt = [this](const io::checkpoint& c) { adopt(c); },
                   .redeal = redeal_hook(),
                   // A pipeline's aggregation counts a stage's replicas, not the view's members.
                   .contributions = pipelined_ ? nullptr : contributions(),
                   .absorb = [this](const io::checkpoint& c, const std::string& what) { absorb(c, what); }};
  }
  const collective::peer_tally* contributions() const {
    if constexpr (requires { policy_.aggregation().tally; }) return &policy_.aggregation().tally;
    else return nullptr;
  }

  // The world communicator becomes the listed world ranks, in a tag space of their own.
  void set_view(std::uint64_t epoch, const std::vector<int>& members) {
    decentrain::detail::check(!replicas_ || can_morph(), "trainer: a group change needs every peer to hold the whole "
                              "model, or a parallel policy that deals the parts out again (morph); this one places "
                              "replicas of a part");
    decentrain::detail::check(std::is_sorted(members.begin(), members.end()) &&
                                  std::binary_search(members.begin(), members.end(), endpoint_.rank()),
                              "trainer: a view must list world ranks in ascending order, this peer among them");
    const auto channel = collective::group_channel(0x76696577u ^ static_cast<std::uint32_t>(decentrain::detail::splitmix64(epoch)),
                                                   members);  // "view"
    std::shared_ptr<transport::any_endpoint> parent(std::shared_ptr<transport::any_endpoint>{}, &endpoint_);  // not owned
    view_endpoint_ = transport::any_endpoint(collective::group_view<transport::any_endpoint>(parent, members, channel));
    // Nothing may be in flight on the communicator that is replaced (a policy's background exchanges).
    if constexpr (requires { policy_.drop_in_flight(); }) policy_.drop_in_flight();
    const auto traffic = comm_.traffic();
    comm_ = communicator(view_endpoint_, options_.collectives);
    comm_.adopt_traffic(traffic);
    members_ = members;
  }

  optim::adamw<device_type> make_optimizer() {
    return optim::adamw<device_type>(model_.parameters(), {options_.lr, options_.beta1, options_.beta2, 1e-8, options_.weight_decay});
  }
  void set_compute_dtype() {
    if constexpr (requires(Model& m) { m.set_compute_dtype(dtype::f32); })
      model_.set_compute_dtype(options_.compute_dtype);
    else
      decentrain::detail::check(options_.compute_dtype == dtype::f32, "trainer: compute_dtype ",
                                dtype_name(options_.compute_dtype), " needs a model with set_compute_dtype(dtype)");
  }
  // The replicas' and the pipeline's communicators of the placement, in the current view.
  void make_groups() {
    replicas_.reset();
    pipeline_.reset();
    if (placement_.replicas.size() != static_cast<std::size_t>(world())) replicas_.emplace(comm_.group(placement_.replicas));
    if (placement_.stages > 1 && !placement_.pipeline.empty()) pipeline_.emplace(comm_.group(placement_.pipeline));
  }

  // The view the placement was made for and the stage of each of its members (to name the
  // stages of peers lost when the parts are dealt out again).
  void note_placed() {
    placed_members_ = members_;
    placed_stages_.clear();
    for (std::size_t i = 0; i < members_.size(); ++i)
      placed_stages_.push_back(placement_.stages == 1 ? 0
                                                      : parallel_.place(static_cast<int>(i), static_cast<int>(members_.size())).stage);
  }

  // Whether the parallel policy can deal a model's parts out again over another number of peers.
  static constexpr bool can_morph() {
    return requires(ParallelPolicy& p, const Model& m) {
      { p.morph(1, std::int64_t{1}) } -> std::convertible_to<int>;
      { m.config().n_layer } -> std::convertible_to<std::int64_t>;
    };
  }
  // Set for a job that started as a pipeline, for the whole run (every member takes the same
  // path when the group re-forms, whatever shape it has come to).
  std::function<void(const std::vector<int>&, std::int64_t, const checkpoint_listing&)> redeal_hook() {
    if constexpr (can_redeal())
      if (pipelined_)
        return [this](const std::vector<int>& behind, std::int64_t step, const checkpoint_listing& files) {
          redeal(behind, step, files);
        };
    return {};
  }
  static constexpr bool can_redeal() { return can_morph() && requires(FaultPolicy& f, context& c) { f.reform(c); }; }
  // A pipeline under a fault policy that re-forms the group: what re-dealing the parts needs.
  void check_redealable() {
    using decentrain::detail::check;
    check(can_morph(), "trainer: the fault policy re-forms the group when peers are lost, and this peer holds stage ",
          placement_.stage, " of ", placement_.stages, ", but the parallel policy cannot deal the model's parts out "
          "again (it needs int morph(int world, std::int64_t n_blocks), and the model config().n_layer)");
    io::checkpoint kept;
    kept.views = true;
    policy_.save(kept);
    const auto fields = policy_fields();
    std::erase_if(kept.tensors, [&](const auto& kv) { return std::find(fields.begin(), fields.end(), kv.first) != fields.end(); });
    check(kept.tensors.empty(), "trainer: when a pipeline's group re-forms, the model's parts are dealt out again, but ",
          "the communication policy keeps state of this peer's part ('", kept.tensors.empty() ? "" : kept.tensors.begin()->first,
          "') that it does not lay out over the parameters (per_parameter_state), so it cannot be dealt out with them; use ",
          "sync averaging, local SGD, DiLoCo or gossip, with a codec that keeps no state");
  }

  // The communication policy's state laid out over the parameters (its per_parameter_state: flat
  // tensors of its checkpoint, in parameter order), which a pipeline's re-deal moves with them.
  static std::vector<std::string> policy_fields() {
    if constexpr (requires { CommPolicy::per_parameter_state; })
      return {std::begin(CommPolicy::per_parameter_state), std::end(CommPolicy::per_parameter_state)};
    return {};
  }
  // A pipeline's checkpoint keeps that state by parameter ("comm.diloco.global/h.0.attn.c_attn.weight",
  // beside "model.h.0.attn.c_attn.weight"), so that a part of another shape can be dealt out
  // from it; views of the flat tensors where they are views.
  void split_policy_state(io::checkpoint& c) const {
    for (const auto& field : policy_fields()) {
      const auto it = c.tensors.find(field);
      if (it == c.tensors.end()) continue;
      const auto flat = it->second.contiguous().reshape({it->second.numel()});
      decentrain::detail::check(flat.numel() == model_.parameters().numel(), "trainer: the communication policy's '", field,
                                "' has ", flat.numel(), " values, the parameters ", model_.parameters().numel());
      std::int64_t at = 0;
      for (const auto& e : model_.parameters()) {
        const auto n = e.param.value().numel();
        c.tensors[field + "/" + e.name] = flat.slice(0, at, at + n).reshape(e.param.value().shape());
        at += n;
      }
      c.tensors.erase(field);
    }
  }
  // `c` with the policy's state by parameter joined back into its flat tensors, in this peer's
  // parameter order (a checkpoint without it as it is: written before, or not by a pipeline).
  io::checkpoint joined_policy_state(const io::checkpoint& c) const {
    io::checkpoint out = c;  // (the tensors' storage shared, not copied)
    for (const auto& field : policy_fields()) {
      if (std::none_of(c.tensors.begin(), c.tensors.end(), [&](const auto& kv) { return kv.first.starts_with(field + "/"); }))
        continue;
      auto flat = tensor<cpu>::empty(shape{model_.parameters().numel()}, dtype::f32);
      std::int64_t at = 0;
      for (const auto& e : model_.parameters()) {
        const auto key = field + "/" + e.name;
        const auto& t = c.tensor_at(key);
        decentrain::detail::check(t.numel() == e.param.value().numel() && t.dtype() == dtype::f32, "checkpoint: '", key,
                                  "' has ", t.numel(), " values, the parameter ", e.param.value().numel());
        flat.slice(0, at, at + t.numel()).copy_from(t.contiguous().reshape({t.numel()}));
        at += t.numel();
      }
      std::erase_if(out.tensors, [&](const auto& kv) { return kv.first.starts_with(field + "/"); });
      out.tensors[field] = std::move(flat);
    }
    return out;
  }
  void load_policy(const io::checkpoint& c) {
    if (policy_fields().empty())
      policy_.load(c);
    else
      policy_.load(joined_policy_state(c));
  }
  // The policy's state that is not per parameter (counters and texts), as a re-deal announces it:
  // from `source` (a checkpoint's, under the keys the policy saves), or from the policy (null).
  std::optional<io::checkpoint> policy_counters(const io::checkpoint* source) const {
    io::checkpoint live;
    live.views = true;
    policy_.save(live);
    const auto& from = source ? *source : live;
    io::checkpoint out;
    for (const auto& [key, v] : live.counters)
      if (const auto it = from.counters.find(key); it != from.counters.end()) out.counters[key] = it->second;
    for (const auto& [key, v] : live.text)
      if (const auto it = from.text.find(key); it != from.text.end()) out.text[key] = it->second;
    if (source && out.counters.empty() && out.text.empty() && !holds_policy_slices(*source))
      return std::nullopt;  // (a member that read no checkpoint file)
    return out;
  }
  // Whether `c` keeps the policy's state by parameter (split_policy_state).
  bool holds_policy_slices(const io::checkpoint& c) const {
    const auto fields = policy_fields();
    return std::any_of(c.tensors.begin(), c.tensors.end(), [&](const auto& kv) {
      return std::any_of(fields.begin(), fields.end(), [&](const std::string& f) { return kv.first.starts_with(f + "/"); });
    });
  }
  static const io::checkpoint* ptr(const std::optional<io::checkpoint>& c) { return c ? &*c : nullptr; }

  // The group re-formed (fault::elastic) under a pipeline: the parallel policy takes a shape for
  // the new view (morph), and each member builds its new part and takes every parameter and its
  // AdamW state from a member at the agreed step that holds it (itself where it can, else the
  // holders in turn, so a morph's bytes spread over them). One general exchange serves a lost
  // replica (most parts stay where they are), a new shape (the layers dealt out again) and a
  // restarted group whose checkpoints another shape wrote (held_: each member serves the part
  // it restored). The members first say what they hold (a parameter's name, held where the peer
  // is at the step) and what they need. A parameter that no member at the step holds (its
  // stage's every replica lost) is looked for in the checkpoint files the members can read
  // (fault::elastic's folders, the lost peers' among them where the directory is shared, as
  // Varuna's storage is): the group goes back to the newest step whose files hold every part,
  // each file read by one member (its owner where it is a member) and served like a held part;
  // with none, the run stops with an error naming the lost peers' stages. This peer's model,
  // optimizer and placement are not replaced before every part has arrived, so a failure in the
  // middle leaves them whole (the group agrees again and re-deals from there; the shape is
  // picked again from the stages first asked for). Own state (a dropout stream) stays. Also for
  // a job that came to one stage: every member takes this path (redeal_hook and settle_held,
  // the only callers: a trainer whose policies cannot morph never instantiates this).
  void redeal(const std::vector<int>& behind, std::int64_t step, const checkpoint_listing& list_files) {
    using decentrain::detail::check;
    using decentrain::detail::concat;
    const auto t0 = std::chrono::steady_clock::now();
    const auto traffic0 = endpoint_.stats();
    // (a joiner's first: no shape before)
    const int stages_before = placed_members_.empty() ? 0 : placement_.stages;
    redeal_record record{step, stages_before, static_cast<int>(placed_members_.size()) / placement_.stages, 0, 0, 0, 0, 0, false};
    const int n = world(), me = rank();
    // Near the step: a step before or after it (in the same round, where the replicas differ
    // between rounds; redeal_exchange::plan says when that serves). Not a joiner's first part,
    // nor a part held from a checkpoint.
    constexpr bool spread = requires { requires CommPolicy::replicas_equal_after_step; };
    const bool placed = !placed_members_.empty() && !held_;
    const bool current = std::find(behind.begin(), behind.end(), endpoint_.rank()) == behind.end();
    const bool near = !current && placed &&
                      ((step_ + 1 == step && (spread || !ends_round_between(step_))) ||
                       (step_ == step + 1 && (spread || !ends_round_between(step))));
    std::string lost;
    for (std::size_t i = 0; i < placed_members_.size(); ++i)
      if (!std::binary_search(members_.begin(), members_.end(), placed_members_[i]))
        lost += concat(lost.empty() ? "" : ", ", "peer ", placed_members_[i], " at stage ", placed_stages_[i], " of ",
                       placement_.stages);
    // A policy whose peers keep their places as the group changes (SWARM's pools) is told the
    // views; one that reshapes the job for the new number of peers (a pipeline) morphs.
    if constexpr (requires { parallel_.regroup(placed_members_, placed_stages_, members_, std::int64_t{1}); }) {
      // Where each member stood, agreed (a joiner knows none of it): the stage every member
      // that was placed knows of it, -1 for one that was not.
      std::vector<std::int32_t> was(members_.size(), -1);
      for (std::size_t i = 0; i < members_.size(); ++i)
        for (std::size_t j = 0; j < placed_members_.size(); ++j)
          if (placed_members_[j] == members_[i]) was[i] = placed_stages_[j];
      comm_.all_reduce(std::span<std::int32_t>(was), collective::reduce_op::max);
      std::vector<int> before, before_stages;
      for (std::size_t i = 0; i < members_.size(); ++i)
        if (was[i] >= 0) {
          before.push_back(members_[i]);
          before_stages.push_back(was[i]);
        }
      for (std::size_t j = 0; j < placed_members_.size(); ++j)  // (those who left, as this peer knows them)
        if (!std::binary_search(members_.begin(), members_.end(), placed_members_[j])) {
          before.push_back(placed_members_[j]);
          before_stages.push_back(placed_stages_[j]);
        }
      parallel_.regroup(before, before_stages, members_, static_cast<std::int64_t>(model_.config().n_layer));
    } else {
      parallel_.morph(n, static_cast<std::int64_t>(model_.config().n_layer));
    }
    auto next = checked_placement(parallel_.place(me, n), me, n);
    Model fresh = [&] {
      skip_init loaded_below;  // every value is taken from the holders: none drawn
      return make_model(model_.config(), options_.seed, next);
    }();
    std::vector<std::string> needs;
    for (const auto& e : fresh.parameters()) needs.push_back(e.name);

    // Where this peer serves parameters from: its model (null), the part it restored from a
    // checkpoint of another shape, or the files it read for a step the group went back to.
    const io::checkpoint* source = held_ ? &*held_ : nullptr;
    // With its model, the part it held before the last re-deal where no step was done since.
    const io::checkpoint* spare = !source && current && spare_ && spare_->counter("step") == step ? &*spare_ : nullptr;
    redeal_exchange exchange(comm_, members_, distrusted_, policy_fields());
    // The policy's state by parameter as this peer holds it (views: nothing changes it before
    // the parts are installed).
    io::checkpoint live;
    live.views = true;
    if (!source && !policy_fields().empty()) {
      policy_.save(live);
      split_policy_state(live);
    }
    std::string missing;
    auto said = exchange.announce_parts(current, near, digests_of(exchange, source, spare, live), needs,
                                        current ? ptr(policy_counters(source)) : nullptr);
    auto from = exchange.plan(said, spread, missing);
    checkpoint_files files;  // listed only when some part is held by no member
    std::int64_t at = step;  // the step the group goes on from
    io::checkpoint read;     // the files this peer read for it
    if (!from) {
      std::string tried;
      if (list_files) files = list_files();
      std::int64_t any = files.empty() ? 0 : 1;  // whether any member sees checkpoint files
      comm_.all_reduce(std::span<std::int64_t>(&any, 1), collective::reduce_op::max);
      if (any != 0) {
        const auto seen = exchange.announce_files(files);
        std::set<std::int64_t, std::greater<>> steps;
        for (const auto& m : seen)
          for (const auto& [folder, s] : m) steps.insert(s);
        for (const auto s : steps) {
          if (s > step) continue;  // (files of an abandoned later run)
          read = exchange.read_files_at(s, seen, files, [&](const io::checkpoint& c) {
            if constexpr (storable_config<model_config>)
              return config_of<model_config>(c) == model_.config();
            return true;
          });
          source = &read;
          spare = nullptr;
          said = exchange.announce_parts(true, false, digests_of(exchange, source, nullptr, live), needs, ptr(policy_counters(source)));
          from = exchange.plan(said, spread, missing);
          tried += concat(tried.empty() ? "" : ", ", s);
          if (from) {
            at = s;
            break;
          }
        }
      }
      check(from.has_value(), "trainer: the group re-formed with ", n, " peer(s) at step ", step, ", but no member at ",
            "that step holds parameter '", missing, "': every replica of its stage is lost (",
            lost.empty() ? "lost: none named" : "lost: " + lost, "), ",
            any == 0 ? std::string("and no member has checkpoints to take it from (fault::elastic's checkpoints.dir, on "
                                   "storage the members share)")
                     : concat("and no step of the checkpoints the members can read holds every part (steps tried: ",
                              tried.empty() ? std::string("none at or before ") + std::to_string(step) : tried, ")"),
            ", so the model cannot be dealt out again");
    }
    // Each parameter travels as its values and AdamW's two moments (floats), and its step count.
    const auto counts_of = [&](const std::vector<std::string>& names) {
      std::vector<std::size_t> counts;
      for (const auto& name : names) counts.push_back(static_cast<std::size_t>(fresh.parameters().get(name).value().numel()));
      return counts;
    };
    const auto floats_of = [&](const std::vector<std::string>& names) {
      std::size_t floats = 0;
      for (const auto count : counts_of(names)) floats += exchange.parts() * count;
      return floats;
    };
    auto state_of = [&] {
      std::map<std::string, typename optim::adamw<device_type>::state_entry> by_name;
      if (!source)
        for (auto& e : optimizer_.state()) by_name.emplace(e.name, std::move(e));
      return by_name;
    }();
    auto pack = [&](const std::vector<std::string>& names, std::vector<float>& values, std::vector<std::int64_t>& steps) {
      for (const auto& name : names) {
        if (const auto* from_saved = source ? source : state_of.contains(name) ? nullptr : spare) {
          exchange.pack_saved(*from_saved, name, values, steps);
          continue;
        }
        const auto& moments = state_of.at(name);
        const std::array<const tensor<device_type>*, 3> parts = {&model_.parameters().get(name).value(), &moments.exp_avg,
                                                                 &moments.exp_avg_sq};
        for (const auto* t : parts) {
          const auto v = train::detail::host_view_or_copy(*t, true).contiguous();  // (host memory: read in place)
          values.insert(values.end(), v.template data<float>(), v.template data<float>() + v.numel());
        }
        for (const auto& field : policy_fields()) {
          const auto v = live.tensor_at(field + "/" + name).contiguous();
          values.insert(values.end(), v.template data<float>(), v.template data<float>() + v.numel());
        }
        steps.push_back(moments.step);
      }
    };
    auto c = train::capture(model_, optimizer_, step_, true);  // the configuration's counters
    c.tensors.clear();
    std::erase_if(c.counters, [](const auto& kv) { return kv.first.starts_with("adamw."); });
    c.views = false;
    c.counters["step"] = at;
    const auto unpack = [&](const std::vector<std::string>& names, std::span<const float> values, std::span<const std::int64_t> steps) {
      exchange.unpack(names, values, steps, [&](const std::string& name) { return fresh.parameters().get(name).value().shape(); }, c);
    };
    const auto& mine_from = (*from)[static_cast<std::size_t>(me)];
    for (int s = 0; s < n; ++s) {
      if (s == me || mine_from[static_cast<std::size_t>(s)].empty()) continue;
      const std::size_t sizes[2] = {floats_of(mine_from[static_cast<std::size_t>(s)]) * sizeof(float),
                                    mine_from[static_cast<std::size_t>(s)].size() * sizeof(std::int64_t)};
      comm_.expect_from(s, sizes);
    }
    std::int32_t ready = 1;  // every member expects what it will take before any sends
    comm_.all_reduce(std::span<std::int32_t>(&ready, 1), collective::reduce_op::sum);
    // Member by member, each taking from its sources in rank order: no two wait on each other,
    // and what is in flight is one member's new part at most (sending everything at once would
    // queue every part together, on top of each peer's old and new ones).
    for (int d = 0; d < n; ++d) {
      const auto& to_d = (*from)[static_cast<std::size_t>(d)];
      if (d == me) {
        for (int s = 0; s < n; ++s) {
          const auto& names = to_d[static_cast<std::size_t>(s)];
          if (names.empty()) continue;
          std::vector<float> values;
          std::vector<std::int64_t> steps;
          if (s == me) {
            pack(names, values, steps);
            check(values.size() == floats_of(names), "trainer: a checkpoint this peer read at step ", at,
                  " holds parameters of other shapes than the model's");
          } else {
            values.resize(floats_of(names));
            steps.resize(names.size());
            comm_.recv_from(s, std::span<float>(values));
            comm_.recv_from(s, std::span<std::int64_t>(steps));
            exchange.check_served(said[static_cast<std::size_t>(s)], s, names, counts_of(names), values, steps, at);
          }
          unpack(names, values, steps);
        }
      } else if (!to_d[static_cast<std::size_t>(me)].empty()) {
        std::vector<float> values;
        std::vector<std::int64_t> steps;
        pack(to_d[static_cast<std::size_t>(me)], values, steps);
        comm_.send_to(d, std::span<const float>(values));
        comm_.send_to(d, std::span<const std::int64_t>(steps));
      }
    }
    // No member installs its new part before every member has its own: one that stops earlier (a
    // failed receive, a refused holder) leaves every member's state as it was. One that fails
    // inside this all-reduce can leave some members installed and others not: the installed keep
    // the part they held (spare_, views of its memory) until every member says it installed
    // (below) or a step is done, so that the next re-deal still finds every parameter.
    std::int32_t arrived = 1;
    comm_.all_reduce(std::span<std::int32_t>(&arrived, 1), collective::reduce_op::sum);
    if (current && at == step && !held_) {  // (only what the new part drops: it holds the rest)
      spare_ = train::capture(model_, optimizer_, step_, true);
      spare_->counters["step"] = step;
      // The policy's state over the names dropped, from `live` (copies: the policy's memory takes
      // the new part's state).
      for (const auto& field : policy_fields())
        for (const auto& e : model_.parameters())
          if (!fresh.parameters().contains(e.name)) spare_->tensors[field + "/" + e.name] = live.tensor_at(field + "/" + e.name).clone();
      for (const auto& e : fresh.parameters())
        for (const auto& key : exchange.keys_of(e.name)) spare_->tensors.erase(key);
    } else {
      spare_.reset();
    }
    // Every part has arrived: this peer's state becomes its new part's.
    model_ = std::move(fresh);
    optimizer_ = make_optimizer();
    set_compute_dtype();
    step_ = train::restore(c, model_, optimizer_);
    // The policy's state: by parameter as it arrived; its counters and texts this peer's own
    // where its whole new part is its own, else what most members at the step announced (those
    // this peer distrusts not counted, the lowest rank among equals), so that no one member sets
    // them alone. A state that does not load convicts the member it came from.
    {
      bool all_own = current;
      for (int s = 0; s < n; ++s) all_own = all_own && (s == me || mine_from[static_cast<std::size_t>(s)].empty());
      const auto own = all_own ? policy_counters(source) : std::nullopt;
      int donor = own ? me : -1;
      if (!own) {
        std::map<std::string, std::pair<int, int>> votes;  // the state as text: (members, the first)
        for (int r = 0; r < n; ++r) {
          const auto& m = said[static_cast<std::size_t>(r)];
          if (m.current && m.policy_state && !distrusted_.count(members_[static_cast<std::size_t>(r)]))
            ++votes.try_emplace(redeal_exchange::describe_state(*m.policy_state), 0, r).first->second.first;
        }
        int most = 0;
        for (const auto& [text, v] : votes)
          if (v.first > most || (v.first == most && v.second < donor)) {
            most = v.first;
            donor = v.second;
          }
      }
      check(donor >= 0 || policy_fields().empty(), "trainer: no member at step ", at, " of the re-formed group announced ",
            "the communication policy's state, which its new part needs");
      if (donor >= 0) {
        auto p = own ? *own : *said[static_cast<std::size_t>(donor)].policy_state;
        for (const auto& e : model_.parameters())
          for (const auto& field : policy_fields()) p.tensors[field + "/" + e.name] = c.tensor_at(field + "/" + e.name);
        try {
          load_policy(p);
        } catch (const decentrain::error& e) {
          if (donor == me) throw;
          const int peer = members_[static_cast<std::size_t>(donor)];
          distrusted_.insert(peer);
          transport::fail_peer_because(transport::failure_cause::convicted, peer, "redeal", "trainer: the communication ",
                                       "policy's state peer ", peer, " announced for the re-deal at step ", at,
                                       " does not load (", e.what(), "); this peer takes nothing from it again");
        }
      }
    }
    if (!current || at != step) adopted_ = true;  // (in a restarted group's start: the policy starts as resumed)
    held_.reset();
    if (at != step) {
      went_back_ = true;
      // This peer's newer files are of the run the group abandoned: they must not pass for the
      // newest state when the group restarts.
      if (const auto own = files.find(endpoint_.rank()); own != files.end())
        for (const auto& [s, path] : own->second)
          if (s > at) {
            std::error_code ec;
            std::filesystem::remove(path, ec);
          }
    }
    placement_ = std::move(next);
    note_placed();
    make_groups();
    ++redealt_;
    const auto traffic = endpoint_.stats();
    record.step = at;
    record.from_checkpoints = at != step;
    record.at_step = current;
    record.stages_after = placement_.stages;
    record.copies_after = n / placement_.stages;
    record.bytes_received = traffic.bytes_received - traffic0.bytes_received;
    record.bytes_sent = traffic.bytes_sent - traffic0.bytes_sent;
    record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    redeals_.push_back(record);
    std::int32_t installed = 1;  // once every member has: the parts held before are not needed
    comm_.all_reduce(std::span<std::int32_t>(&installed, 1), collective::reduce_op::sum);
    spare_.reset();
  }

  // What this member holds for a re-deal, by name with its digest: from `source` (a checkpoint's
  // parts), or the model and optimizer (null) and what `spare` holds beside them.
  std::map<std::string, std::uint64_t> digests_of(const redeal_exchange& exchange, const io::checkpoint* source,
                                                  const io::checkpoint* spare, const io::checkpoint& live) {
    std::map<std::string, std::uint64_t> out;
    if (source) {
      exchange.add_digests(*source, out);
      return out;
    }
    const auto floats = [](const tensor<cpu>& t) { return std::span<const float>(t.template data<float>(), static_cast<std::size_t>(t.numel())); };
    for (auto& e : optimizer_.state()) {
      std::vector<tensor<cpu>> held = {train::detail::host_view_or_copy(model_.parameters().get(e.name).value(), true).contiguous(),
                                       train::detail::host_view_or_copy(e.exp_avg, true).contiguous(),
                                       train::detail::host_view_or_copy(e.exp_avg_sq, true).contiguous()};
      for (const auto& field : policy_fields()) held.push_back(live.tensor_at(field + "/" + e.name).contiguous());
      std::vector<std::span<const float>> spans;
      for (const auto& t : held) spans.push_back(floats(t));
      out[e.name] = redeal_exchange::digest(spans, e.step);
    }
    if (spare) exchange.add_digests(*spare, out);
    return out;
  }

  // A restarted group whose checkpoints another shape wrote (the job re-formed before it
  // stopped): each member restored its file's part as held_; the parts are dealt out over the
  // group's shape before the first step (when the restarted group re-formed in its start, the
  // re-deal there did this already).
  void settle_held() {
    std::int32_t held = held_ ? 1 : 0;
    comm_.all_reduce(std::span<std::int32_t>(&held, 1), collective::reduce_op::max);
    if (held != 0) redeal({}, step_, {});
  }

  // A context after the parts were dealt out again: the same step and phase, the new
  // placement's communicators (rebuilt in place: the callers hold it by reference).
  void refresh(context& ctx) {
    auto fresh = make_context(ctx.dataset);
    fresh.step = ctx.step;
    fresh.steps_done = ctx.steps_done;
    fresh.step_weight = ctx.step_weight;
    fresh.last_step = ctx.last_step;
    fresh.round_start = ctx.round_start;
    fresh.resumed = ctx.resumed;
    fresh.joined = ctx.joined;
    fresh.at = ctx.at;
    std::destroy_at(&ctx);
    std::construct_at(&ctx, std::move(fresh));
    if constexpr (requires { policy_.size_state(ctx); }) policy_.size_state(ctx);
  }

  static const trainer_options& validated(const trainer_options& o) {
    o.validate();
    return o;
  }
  // The whole model, or the part of it at this peer's stage: drawn from the same stream, so the
  // stages start where one peer with the whole model does.
  static Model make_model(const model_config& config, std::uint64_t seed, const parallel::placement& at) {
    rng init(seed, "init");
    if (at.stages == 1 && at.chunks == 1) return Model(config, init);
    if constexpr (std::constructible_from<Model, const model_config&, rng&, const nn::part&>)
      return Model(config, init, at.part());
    else
      decentrain::detail::fail("trainer: the parallel policy places this peer at stage ", at.stage, " of ", at.stages,
                               ", but the model cannot be cut into stages (it needs a constructor "
                               "Model(const config_type&, rng& init, const nn::part&) that builds one stage's part)");
  }
  // A peer that joined a running pipeline may see a world its stages do not divide: it takes a
  // shape for it (its part is dealt out again once the group takes it in, redeal).
  parallel::placement first_placement(ParallelPolicy& parallel, const model_config& config, const transport::any_endpoint& ep) {
    const int r = ep.rank(), w = ep.world();
    if constexpr (can_morph())
      if (ep.joined_late() && stages_of(parallel) > 1) try {  // (one stage places any world: no shape to guess)
          return checked_placement(parallel.place(r, w), r, w);
        } catch (const decentrain::error&) {
          parallel.morph(w, static_cast<std::int64_t>(config.n_layer));
          parallel_morphed_ = true;
        }
    return checked_placement(parallel.place(r, w), r, w);
  }
  static int stages_of(const ParallelPolicy& p) {
    if constexpr (requires { { p.stages() } -> std::convertible_to<int>; }) return p.stages();
    else if constexpr (requires { { p.stages } -> std::convertible_to<int>; }) return p.stages;
    else return 1;
  }
  static parallel::placement checked_placement(parallel::placement p, int rank, int world) {
    using decentrain::detail::check;
    check(p.stages >= 1 && p.stage >= 0 && p.stage < p.stages, "trainer: the parallel policy placed peer ", rank,
          " at stage ", p.stage, " of ", p.stages);
    check(std::is_sorted(p.replicas.begin(), p.replicas.end()) &&
              std::adjacent_find(p.replicas.begin(), p.replicas.end()) == p.replicas.end(),
          "trainer: the parallel policy's replicas of peer ", rank, " must be ascending, each rank once");
    check(std::binary_search(p.replicas.begin(), p.replicas.end(), rank), "trainer: the parallel policy's replicas of peer ",
          rank, " do not include itself");
    check(p.replicas.front() >= 0 && p.replicas.back() < world, "trainer: the parallel policy's replicas of peer ", rank,
          " go beyond a world of ", world);
    if (p.stages == 1 || p.pipeline.empty()) return p;  // (SWARM's pools: no fixed copy of the model)
    check(p.pipeline.size() == static_cast<std::size_t>(p.stages) && p.pipeline[static_cast<std::size_t>(p.stage)] == rank,
          "trainer: the parallel policy's pipeline of peer ", rank, " must list one world rank per stage (", p.stages,
          "), this peer at its stage ", p.stage);
    auto sorted = p.pipeline;
    std::sort(sorted.begin(), sorted.end());
    check(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end() && sorted.front() >= 0 && sorted.back() < world,
          "trainer: the parallel policy's pipeline of peer ", rank, " must name distinct ranks of a world of ", world);
    return p;
  }

  std::int64_t block() const {
    if (options_.block_size > 0) return options_.block_size;
    if constexpr (requires { model_.config().block_size; })
      return static_cast<std::int64_t>(model_.config().block_size);
    else
      decentrain::detail::fail("trainer: set trainer_options::block_size (the model has no config().block_size)");
  }

  // The mean over the replicas of ||x_i - mean||: one all-reduce of the parameters among them
  // (at evaluations only: it moves a model, as an all-reduce of the gradient would).
  template <class Ctx>
  static double consensus_distance(Ctx& ctx) {
    std::vector<float> mine, mean;
    comm::gather_values(ctx.parameters, mine);
    mean = mine;
    ctx.replicas.all_reduce(std::span<float>(mean), collective::reduce_op::average);
    double squares = 0;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const double d = static_cast<double>(mine[i]) - static_cast<double>(mean[i]);
      squares += d * d;
    }
    double distance = std::sqrt(squares);
    ctx.replicas.all_reduce(std::span<double>(&distance, 1), collective::reduce_op::average);
    return distance;
  }

  eval_point record_eval(const data::token_dataset& dataset, std::int64_t at) {
    const double v = evaluate(dataset);
    const auto traffic = endpoint_.stats();
    eval_point p{endpoint_.rank(), at, v, traffic.bytes_sent, traffic.clock_seconds, policy_bytes_, consensus_};
    for (auto& h : eval_hooks_) h(p);
    return p;
  }

  bool stop_requested() {
    if (!stop_asked_) return false;
    if (world() == 1 || options_.stop_alone) return stop_asked_();
    if (step_ % options_.stop_check_every != 0) return false;
    if (!checks_stop_in_background()) {
      std::int32_t stop = stop_asked_() ? 1 : 0;
      comm_.all_reduce(std::span<std::int32_t>(&stop, 1), collective::reduce_op::max);
      return stop != 0;
    }
    // Read what the last check posted (every peer posted it at the same step), then post this
    // one's: its round trip runs beside the steps up to the next check.
    if (stop_posted_) {
      stop_posted_ = false;
      stop_check_.wait();
      if (stop_flag_ != 0) return true;
    }
    stop_flag_ = stop_asked_() ? 1 : 0;
    stop_check_ = comm_.all_reduce_async(std::span<std::int32_t>(&stop_flag_, 1), collective::reduce_op::max);
    stop_posted_ = true;
    return false;
  }
  // trainer_options::stop_check_in_background, where the group keeps its members: a group that
  // re-forms between two checks could not read what the old one posted, so its checks wait.
  bool checks_stop_in_background() const {
    return options_.stop_check_in_background && !requires(FaultPolicy& f, context& c) { f.reform(c); };
  }
  // A stop check still in flight at the end of fit is finished there (its answer no longer
  // matters: the run ended), so the next fit posts afresh.
  void finish_stop_check() {
    if (!stop_posted_) return;
    stop_posted_ = false;
    stop_check_.wait();
  }

  static double unix_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  // Whether the policy's inner steps are micro-batches of one step (its accumulates(): gradients
  // add up over them, one exchange and one optimizer step), which the parallel policy must do.
  bool accumulates() const {
    if constexpr (requires { { policy_.accumulates() } -> std::convertible_to<bool>; }) {
      if (!policy_.accumulates()) return false;
      if constexpr (requires(const ParallelPolicy& p) { { p.accumulates_gradients() } -> std::convertible_to<bool>; })
        if (parallel_.accumulates_gradients()) return true;
      decentrain::detail::fail("trainer: the communication policy adds a step's micro-batches up (sync_allreduce's "
                               "target_batch), which this parallel policy does not do (parallel::data and the pipeline do)");
    } else {
      return false;
    }
  }

  // A replica that came too late to a round its group closed without it goes on from the step
  // the group is at (the policy's catch_up: comm::round_deadline; the run's end where the group
  // finished), never past a step where every peer meets (an evaluation, a stop check: the group
  // waits there for it). A checkpoint step it skips it does not write (the others' checkpoint
  // of that step then has no match, and a resume takes a step every peer holds).
  void catch_up_to(std::int64_t target) {
    if (target <= step_) return;
    std::int64_t to = std::min(target, options_.steps);
    const auto not_past = [&](std::int64_t every) {
      if (every > 0) to = std::min(to, (step_ + every - 1) / every * every);
    };
    not_past(options_.eval_every);
    if (stop_asked_ && !options_.stop_alone) not_past(options_.stop_check_every);
    skipped_steps_ += to - step_;
    step_ = to;
  }

  // Inner steps this peer takes in the current step: the policy's (work sized to speed), else 1.
  std::int64_t local_steps() const {
    if constexpr (requires { policy_.local_steps(step_); }) {
      const std::int64_t k = policy_.local_steps(step_);
      decentrain::detail::check(k >= 1, "trainer: the communication policy asked for ", k, " inner steps at step ", step_,
                                " (at least 1)");
      decentrain::detail::check(k == 1 || !pipelined_, "trainer: the communication policy asked for ", k,
                                " inner steps at step ", step_, ", which a peer holding part of the model cannot take");
      return k;
    } else {
      return 1;
    }
  }

  double compute_clock() const {
    if (options_.compute_on_thread_clock) return decentrain::detail::thread_cpu_seconds();
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  double lap(double since) const { return compute_clock() - since; }
  // Compute time of the steps: on the transport's clock (simulated links advance by it) and in
  // the metrics, where compute_s / clock_s is the peer's compute utilisation.
  void computed(double seconds) {
    compute_s_ += seconds / transport::compute_speed(endpoint_);  // what the peer's clock was charged
    endpoint_.computed(seconds);
  }

  // Peers restored from checkpoints of different steps would pair up the wrong collectives and
  // train on garbage; one small all-reduce at the start turns that into an error on every peer.
  void check_same_step() {
    if (world() == 1) return;
    std::int64_t range[2] = {step_, -step_};
    comm_.all_reduce(std::span<std::int64_t>(range, 2), collective::reduce_op::max);
    decentrain::detail::check(range[0] == -range[1], "trainer: peers start at different steps (from ", -range[1], " to ",
                              range[0], "); resume every peer from checkpoints of the same step");
  }

  // Bytes of the policy's collectives: the world communicator's traffic includes its groups'
  // (the replicas' and any the policy forms), and a failed attempt's bytes count too.
  template <class Call>
  void counted(Call&& call) {
    const auto before = comm_.traffic().bytes_sent;
    try {
      call();
    } catch (...) {
      policy_bytes_ += comm_.traffic().bytes_sent - before;
      throw;
    }
    policy_bytes_ += comm_.traffic().bytes_sent - before;
  }

  trainer_options options_;
  transport::any_endpoint endpoint_;       // the whole world
  transport::any_endpoint view_endpoint_;  // the current view: endpoint_ itself until the group changes
  communicator comm_;
  std::vector<int> members_;
  std::vector<int> placed_members_;  // the view the placement was made for (members_ until the parts are dealt out again)
  std::vector<int> placed_stages_;   // and the stage of each of its members
  bool pipelined_ = false;           // the job started with several stages: its group re-forms by dealing the parts out
  bool parallel_morphed_ = false;    // a joiner's first shape is not the job's (first_placement)
  std::uint64_t redealt_ = 0;        // how many times the parts were dealt out again (a context made before is stale)
  std::vector<redeal_record> redeals_;
  std::optional<io::checkpoint> held_;  // a restored part of another shape, until it is dealt out (redeal)
  std::optional<io::checkpoint> spare_;  // the part held before the last re-deal, until a step is done (redeal)
  std::set<int> distrusted_;             // world ranks caught serving a re-deal what they did not announce
  bool went_back_ = false;              // the last re-deal went back to a checkpoint's step
  ParallelPolicy parallel_;
  parallel::placement placement_;  // before the model: it says which part of the model this peer builds
  Model model_;
  optim::adamw<device_type> optimizer_;
  optim::cosine_schedule schedule_;
  CommPolicy policy_;
  std::uint64_t policy_bytes_ = 0;
  FaultPolicy fault_;
  std::optional<communicator> replicas_;  // when they are not the whole world
  std::optional<communicator> pipeline_;  // this peer's copy of the model, one peer per stage (several stages)
  rng dropout_;
  std::int64_t step_ = 0;
  std::int64_t skipped_steps_ = 0;  // steps skipped to catch up with the group (skip_steps)
  std::int64_t redos_ = 0;
  double compute_s_ = 0;  // seconds of forward, backward and optimizer steps in this fit
  double charged_ = 0;    // of the current forward and backward, what the parallel policy charged as it went (ctx.computed)
  send_rate send_rate_;
  bool resumed_ = false;
  bool adopted_ = false;  // adopt() was called since the fault policy's start began
  struct resume_point {
    std::int64_t step = 0;
    phase at = phase::step;
  };
  std::optional<resume_point> resume_at_;
  std::vector<std::function<void(const step_metrics&)>> step_hooks_;
  std::vector<std::function<void(const eval_point&)>> eval_hooks_;
  double consensus_ = -1;  // the last evaluation's (eval_point::consensus_distance)
  std::function<bool()> stop_asked_;
  // The stop check in flight (checks_stop_in_background): its all-reduce of stop_flag_, posted
  // at one check and read at the next. (Posted is kept apart from the handle: a check whose wait
  // threw is not read again when the stop check is redone.)
  collective::pending stop_check_;
  std::int32_t stop_flag_ = 0;
  bool stop_posted_ = false;
};

}  // namespace decentrain::train
