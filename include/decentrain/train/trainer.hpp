// trainer<Model, CommPolicy, ParallelPolicy, FaultPolicy>: the training loop of one peer. It
// draws this rank's batches (ParallelPolicy), runs forward, backward and the inner AdamW step,
// and hands control to the communication policy at the points its concept names; the fault
// policy sees every finished step. It keeps the metrics a decentralized run needs: loss,
// tokens/s, bytes on the wire, time spent waiting on the network.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <ctime>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "decentrain/collective/communicator.hpp"
#include "decentrain/comm/sync_allreduce.hpp"
#include "decentrain/data/dataset.hpp"
#include "decentrain/fault/none.hpp"
#include "decentrain/optim/adamw.hpp"
#include "decentrain/optim/clip.hpp"
#include "decentrain/optim/schedule.hpp"
#include "decentrain/parallel/data.hpp"
#include "decentrain/train/checkpoint.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/in_process.hpp"

namespace decentrain::train {

struct trainer_options {
  std::int64_t steps = 1000;         // inner steps per peer
  std::int64_t batch_size = 16;      // rows per peer per step
  std::int64_t block_size = 0;       // 0: the model's block size
  double lr = 3e-3;                  // AdamW peak learning rate (cosine schedule)
  double min_lr = 3e-4;
  std::int64_t warmup_steps = -1;    // -1: steps / 10
  double beta1 = 0.9, beta2 = 0.99, weight_decay = 0.1;
  double grad_clip = 1.0;            // 0: no clipping
  std::uint64_t seed = 1337;         // model init and data order (the same on every peer)
  std::int64_t eval_every = 0;       // 0: only at the end
  std::int64_t eval_batches = 8;     // validation batches per peer per evaluation
  // Mixed precision: bf16 runs the model's activations and products in bf16 with f32 master
  // weights, optimizer state and gradients (the model must have set_compute_dtype).
  dtype compute_dtype = dtype::f32;
  // Time compute with this thread's CPU clock instead of the wall clock: right for simulated
  // peers sharing a machine's cores, where wall time would count the other peers' work too.
  bool compute_on_thread_clock = false;
  // Message sizes of the collectives (the same on every peer); over TCP across the internet set
  // collectives.link_bytes_in_flight (simulated links size them on their own).
  collective::options collectives;

  void validate() const {
    decentrain::detail::check(steps >= 1, "trainer: steps must be >= 1, got ", steps);
    decentrain::detail::check(batch_size >= 1, "trainer: batch_size must be >= 1, got ", batch_size);
    decentrain::detail::check(block_size >= 0, "trainer: block_size must be >= 0 (0: the model's), got ", block_size);
    decentrain::detail::check(eval_every >= 0 && eval_batches >= 1, "trainer: need eval_every >= 0 and eval_batches >= 1");
    decentrain::detail::check(grad_clip >= 0, "trainer: grad_clip must be >= 0, got ", grad_clip);
    decentrain::detail::check(compute_dtype == dtype::f32 || compute_dtype == dtype::bf16,
                              "trainer: compute_dtype must be f32 or bf16, got ", dtype_name(compute_dtype));
  }
};

struct step_metrics {
  std::int64_t step = 0;  // steps done so far
  double loss = 0, lr = 0, tokens_per_s = 0;
  std::uint64_t bytes_sent = 0, bytes_received = 0;  // by this peer's transport, cumulative
  double network_wait_s = 0;  // cumulative time blocked on the network (simulated for in_process)
  double clock_s = 0;         // the transport's clock: simulated time for in_process, wall otherwise
  double wall_s = 0;
  // Of bytes_sent, what the communication policy's own collectives sent (evaluation excluded).
  std::uint64_t policy_bytes_sent = 0;
};

struct eval_point {
  std::int64_t step = 0;
  double val_loss = 0;
  std::uint64_t bytes_sent = 0;         // everything this peer's transport sent so far
  double clock_s = 0;
  std::uint64_t policy_bytes_sent = 0;  // of which the communication policy's
};

struct fit_result {
  double final_val_loss = 0;
  step_metrics last;
  std::vector<eval_point> evals;
};

// The device a model computes on: Model::device_type, or the CPU for models that do not say.
template <class M>
struct model_device {
  using type = cpu;
};
template <class M>
  requires requires { typename M::device_type; }
struct model_device<M> {
  using type = typename M::device_type;
};
template <class M>
using model_device_t = typename model_device<M>::type;

// What a policy sees when the trainer calls it.
template <class Model>
struct peer_context {
  Model& model;
  parameter_list<model_device_t<Model>>& parameters;
  collective::communicator<transport::any_endpoint>& comm;
  std::int64_t step = 0;   // the step just computed, from 0
  bool last_step = false;  // policies that communicate periodically also do so on the last step
  bool resumed = false;    // start() after restore(): the peers' states are already what they should be
};

template <class M, class D = model_device_t<M>>
concept trainable_model = requires { typename M::config_type; } &&
                          std::constructible_from<M, const typename M::config_type&, rng&> &&
                          requires(M& m, const tensor<D>& ids, rng* dropout) {
                            { m.parameters() } -> std::same_as<parameter_list<D>&>;
                            { m.loss(ids, ids, dropout) } -> std::same_as<var<D>>;
                          };

template <class Model, class CommPolicy = comm::sync_allreduce, class ParallelPolicy = parallel::data,
          class FaultPolicy = fault::none>
class trainer {
  static_assert(trainable_model<Model>,
                "trainer<Model, ...>: Model needs `using config_type = ...;`, a constructor "
                "Model(const config_type&, rng& init), `parameter_list<D>& parameters()` and "
                "`var<D> loss(const tensor<D>& ids, const tensor<D>& targets, rng* dropout)`, where D is "
                "Model::device_type or dt::cpu when Model has none (nn::gpt<D> has them)");
  static_assert(comm::declares_comm_policy<CommPolicy>,
                "trainer<Model, CommPolicy, ...>: CommPolicy must declare `using policy_concept = decentrain::comm::policy_tag;` "
                "(is a parallel or fault policy in the communication slot? the order is <Model, Comm, Parallel, Fault>)");
  static_assert(requires(CommPolicy& p, peer_context<Model>& c) { p.start(c); p.after_backward(c); p.after_step(c); },
                "trainer: CommPolicy needs `template <class Ctx> void start(Ctx&)`, `void after_backward(Ctx&)` and "
                "`void after_step(Ctx&)` (Ctx is train::peer_context<Model>; see comm/policy.hpp)");
  static_assert(requires(const CommPolicy& p, io::checkpoint& out) { p.save(out); } &&
                    requires(CommPolicy& p, const io::checkpoint& in) { p.load(in); },
                "trainer: CommPolicy needs `void save(io::checkpoint&) const` and `void load(const io::checkpoint&)` "
                "for its state (empty bodies when it has none)");
  static_assert(parallel::declares_parallel_policy<ParallelPolicy>,
                "trainer<Model, Comm, ParallelPolicy, ...>: ParallelPolicy must declare "
                "`using policy_concept = decentrain::parallel::policy_tag;` (for example parallel::data)");
  static_assert(parallel::parallel_policy<ParallelPolicy>,
                "trainer: ParallelPolicy needs `std::pair<tensor<cpu>, tensor<cpu>> batch(const data::token_dataset&, "
                "int64_t step, int64_t batch_size, int64_t block, uint64_t seed, int rank, int world) const`");
  static_assert(fault::declares_fault_policy<FaultPolicy>,
                "trainer<Model, Comm, Parallel, FaultPolicy>: FaultPolicy must declare "
                "`using policy_concept = decentrain::fault::policy_tag;` (for example fault::none)");
  static_assert(fault::fault_policy<FaultPolicy, peer_context<Model>>,
                "trainer: FaultPolicy needs `template <class Ctx> void after_step(Ctx&)`");

 public:
  using model_type = Model;
  using device_type = model_device_t<Model>;
  using model_config = typename Model::config_type;
  using comm_policy = CommPolicy;

  trainer(const model_config& config, trainer_options options, transport::any_endpoint endpoint, CommPolicy comm = {},
          ParallelPolicy parallel = {}, FaultPolicy fault = {})
      : options_(validated(options)),
        endpoint_(std::move(endpoint)),
        comm_(endpoint_, options_.collectives),
        model_(make_model(config, options.seed)),
        optimizer_(model_.parameters(), {options.lr, options.beta1, options.beta2, 1e-8, options.weight_decay}),
        schedule_{options.lr, options.min_lr,
                  options.warmup_steps >= 0 ? options.warmup_steps : options.steps / 10, options.steps},
        policy_(std::move(comm)),
        parallel_(std::move(parallel)),
        fault_(std::move(fault)),
        dropout_(options.seed ^ decentrain::detail::splitmix64(static_cast<std::uint64_t>(endpoint_.rank()) + 1), "dropout") {
    schedule_.validate();
    if constexpr (requires(Model& m) { m.set_compute_dtype(dtype::f32); })
      model_.set_compute_dtype(options_.compute_dtype);
    else
      decentrain::detail::check(options_.compute_dtype == dtype::f32, "trainer: compute_dtype ",
                                dtype_name(options_.compute_dtype), " needs a model with set_compute_dtype(dtype)");
  }
  // The optimizer and the communicator point into the trainer: it stays where it was made.
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  Model& model() { return model_; }
  const Model& model() const { return model_; }
  CommPolicy& policy() { return policy_; }
  const trainer_options& options() const { return options_; }
  int rank() const { return endpoint_.rank(); }
  int world() const { return endpoint_.world(); }
  std::int64_t step() const { return step_; }
  transport::traffic_stats traffic() const { return endpoint_.stats(); }
  // Bytes the communication policy's collectives sent, cumulative over the run and across a
  // restore (payload, without framing). The trainer counts them around every policy call, so a
  // policy needs no bookkeeping of its own.
  std::uint64_t policy_bytes_sent() const { return policy_bytes_; }

  void on_step(std::function<void(const step_metrics&)> hook) { step_hooks_.push_back(std::move(hook)); }
  void on_eval(std::function<void(const eval_point&)> hook) { eval_hooks_.push_back(std::move(hook)); }

  // Trains from the current step to options().steps and returns the metrics; every peer of the
  // world must call it (they meet in the policy's collectives).
  fit_result fit(const data::token_dataset& dataset) {
    const std::int64_t B = options_.batch_size, T = block();
    peer_context<Model> ctx{model_, model_.parameters(), comm_, step_, false, resumed_};
    check_same_step();
    counted([&] { policy_.start(ctx); });
    resumed_ = false;
    fit_result result;
    const auto wall0 = std::chrono::steady_clock::now();
    const std::int64_t first = step_;
    while (step_ < options_.steps) {
      double compute = 0;
      auto t = compute_clock();
      auto [x, y] = parallel_.batch(dataset, step_, B, T, options_.seed, rank(), world());
      auto loss = model_.loss(to_device<device_type>(x), to_device<device_type>(y), &dropout_);
      model_.parameters().zero_grad();
      loss.backward();
      compute += lap(t);

      ctx.step = step_;
      ctx.last_step = step_ + 1 == options_.steps;
      counted([&] { policy_.after_backward(ctx); });

      t = compute_clock();
      if (options_.grad_clip > 0) optim::clip_grad_norm(model_.parameters(), options_.grad_clip);
      const double lr = schedule_(step_);
      optimizer_.set_lr(lr);
      optimizer_.step();
      compute += lap(t);

      counted([&] { policy_.after_step(ctx); });
      fault_.after_step(ctx);
      endpoint_.computed(compute);
      ++step_;  // before the hooks, so a checkpoint taken in one resumes after this step

      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
      const auto traffic = endpoint_.stats();
      result.last = step_metrics{step_, loss.item(), lr, static_cast<double>((step_ - first) * B * T) / wall,
                                 traffic.bytes_sent, traffic.bytes_received, traffic.wait_seconds, traffic.clock_seconds,
                                 wall, policy_bytes_};
      for (auto& h : step_hooks_) h(result.last);
      if (options_.eval_every > 0 && step_ % options_.eval_every == 0 && step_ < options_.steps)
        result.evals.push_back(record_eval(dataset, step_));
    }
    result.evals.push_back(record_eval(dataset, step_));
    result.final_val_loss = result.evals.back().val_loss;
    return result;
  }

  // Mean validation loss over this peer's rows of `batches` batches, averaged across peers, so
  // every peer reports the same number.
  double evaluate(const data::token_dataset& dataset, std::int64_t batches = 0) {
    if (batches <= 0) batches = options_.eval_batches;
    no_grad guard;
    double sum = 0;
    for (std::int64_t i = 0; i < batches; ++i) {
      auto [x, y] = dataset.batch<cpu>(data::split::validation, i, options_.batch_size, block(), options_.seed, rank(),
                                       world());
      sum += model_.loss(to_device<device_type>(x), to_device<device_type>(y)).item();
    }
    double mean = sum / static_cast<double>(batches);
    comm_.all_reduce(std::span<double>(&mean, 1), collective::reduce_op::average);
    return mean;
  }

  // This peer's whole state: model, AdamW, step, dropout stream and the policy's state.
  io::checkpoint capture() const
    requires requires(const Model& m, const optim::adamw<device_type>& o) { train::capture(m, o, std::int64_t{}); }
  {
    auto c = train::capture(model_, optimizer_, step_);
    c.rngs["dropout"] = dropout_.state();
    c.counters["trainer.rank"] = rank();
    c.counters["trainer.world"] = world();
    c.counters["trainer.policy_bytes_sent"] = static_cast<std::int64_t>(policy_bytes_);
    policy_.save(c);
    return c;
  }

  void restore(const io::checkpoint& c)
    requires requires(Model& m, optim::adamw<device_type>& o) { train::restore(c, m, o); }
  {
    decentrain::detail::check(c.counter("trainer.world") == world() && c.counter("trainer.rank") == rank(),
                              "trainer: the checkpoint is peer ", c.counter("trainer.rank"), " of ",
                              c.counter("trainer.world"), ", this trainer is peer ", rank(), " of ", world());
    step_ = train::restore(c, model_, optimizer_);
    auto it = c.rngs.find("dropout");
    decentrain::detail::check(it != c.rngs.end(), "checkpoint: missing rng 'dropout'");
    dropout_.set_state(it->second);
    policy_bytes_ = static_cast<std::uint64_t>(c.counter("trainer.policy_bytes_sent"));
    policy_.load(c);
    resumed_ = true;
  }

 private:
  static const trainer_options& validated(const trainer_options& o) {
    o.validate();
    return o;
  }
  static Model make_model(const model_config& config, std::uint64_t seed) {
    rng init(seed, "init");
    return Model(config, init);
  }

  std::int64_t block() const {
    return options_.block_size > 0 ? options_.block_size : static_cast<std::int64_t>(model_.config().block_size);
  }

  eval_point record_eval(const data::token_dataset& dataset, std::int64_t at) {
    const double v = evaluate(dataset);
    const auto traffic = endpoint_.stats();
    eval_point p{at, v, traffic.bytes_sent, traffic.clock_seconds, policy_bytes_};
    for (auto& h : eval_hooks_) h(p);
    return p;
  }

  double compute_clock() const {
#if defined(CLOCK_THREAD_CPUTIME_ID)
    if (options_.compute_on_thread_clock) {
      timespec ts{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
      return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
    }
#endif
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  double lap(double since) const { return compute_clock() - since; }

  // Peers restored from checkpoints of different steps would pair up the wrong collectives and
  // train on garbage; one small all-reduce at the start turns that into an error on every peer.
  void check_same_step() {
    if (world() == 1) return;
    std::int64_t range[2] = {step_, -step_};
    comm_.all_reduce(std::span<std::int64_t>(range, 2), collective::reduce_op::max);
    decentrain::detail::check(range[0] == -range[1], "trainer: peers start at different steps (from ", -range[1], " to ",
                              range[0], "); resume every peer from checkpoints of the same step");
  }

  template <class Call>
  void counted(Call&& call) {
    const auto before = comm_.traffic().bytes_sent;
    call();
    policy_bytes_ += comm_.traffic().bytes_sent - before;
  }

  trainer_options options_;
  transport::any_endpoint endpoint_;
  collective::communicator<transport::any_endpoint> comm_;
  Model model_;
  optim::adamw<device_type> optimizer_;
  optim::cosine_schedule schedule_;
  CommPolicy policy_;
  std::uint64_t policy_bytes_ = 0;
  ParallelPolicy parallel_;
  FaultPolicy fault_;
  rng dropout_;
  std::int64_t step_ = 0;
  bool resumed_ = false;
  std::vector<std::function<void(const step_metrics&)>> step_hooks_;
  std::vector<std::function<void(const eval_point&)>> eval_hooks_;
};

// Runs one trainer per rank of an in-process network, each on its own thread with
// `threads_per_peer` OpenMP threads, and returns every peer's result (index = rank).
// `setup` runs on each trainer before fit (hooks, restore); it may be empty.
template <class Trainer>
std::vector<fit_result> fit_in_process(const transport::in_process& network, const typename Trainer::model_config& config,
                                       trainer_options options, const data::token_dataset& dataset,
                                       typename Trainer::comm_policy comm = {},
                                       const std::function<void(Trainer&)>& setup = {}, int threads_per_peer = 1) {
  decentrain::detail::check(threads_per_peer >= 1, "fit_in_process: threads_per_peer must be >= 1");
  options.compute_on_thread_clock = options.compute_on_thread_clock || threads_per_peer == 1;
  std::vector<fit_result> results(static_cast<std::size_t>(network.world()));
  network.run([&](transport::in_process::endpoint& ep) {
#if defined(_OPENMP)
    omp_set_num_threads(threads_per_peer);
#endif
    const int r = ep.rank();
    Trainer t(config, options, ep, comm);
    if (setup) setup(t);
    results[static_cast<std::size_t>(r)] = t.fit(dataset);
  });
  return results;
}

}  // namespace decentrain::train
