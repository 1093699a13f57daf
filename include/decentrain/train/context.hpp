// What a policy sees when the trainer calls it: the model and its parameters, the world's
// communicator and the replicas' (the peers that hold the same parameters), the data and batch
// settings, the step, and a way to capture and restore this peer's whole state.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "decentrain/autograd/parameters.hpp"
#include "decentrain/collective/communicator.hpp"
#include "decentrain/collective/robust_all_reduce.hpp"
#include "decentrain/core/device.hpp"
#include "decentrain/core/rng.hpp"
#include "decentrain/data/dataset.hpp"
#include "decentrain/io/checkpoint.hpp"
#include "decentrain/parallel/policy.hpp"
#include "decentrain/transport/any_endpoint.hpp"

namespace decentrain::train {

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

using communicator = collective::communicator<transport::any_endpoint>;

// Where a peer is in its run, in the order the trainer goes through a step's value of ctx.step:
// the start, an evaluation (after the previous step), a stop check, the step, and the step once
// its inner optimizer has stepped (only the communication policy's after_step is left). A group
// that re-forms compares peers by (step, phase), and those behind take the state of the furthest.
enum class phase : std::int8_t { start = 0, evaluation = 1, stop_check = 2, step = 3, stepped = 4 };

// Checkpoint files a peer can read, by the world rank whose folder holds them, then step
// (fault::elastic's folders: where a pipeline's re-deal finds parts no member holds any more).
using checkpoint_files = std::map<int, std::map<std::int64_t, std::filesystem::path>>;
// Lists them when called: a re-deal needs them only when a stage is lost whole.
using checkpoint_listing = std::function<checkpoint_files()>;

template <class Model>
struct peer_context {
  using model_type = Model;
  using device_type = model_device_t<Model>;

  Model& model;
  parameter_list<device_type>& parameters;
  communicator& comm;       // every peer of the run
  communicator& replicas;   // the peers holding the same parameters (comm itself for data parallelism)
  communicator& pipeline;   // the peers holding the other stages of this peer's copy of the model
                            // (placement.pipeline; comm itself with one stage)
  const parallel::placement& placement;
  const data::token_dataset& dataset;
  rng& dropout;             // this peer's dropout stream (in the checkpoint)
  std::int64_t batch_size = 0, block = 0;  // rows per peer per step, tokens per row
  std::uint64_t seed = 0;                  // data order (the same on every peer)
  std::int64_t step = 0;        // the step being computed, from 0
  double step_weight = 1.0;     // this peer's weight in the step's averages (the parallel policy's
                                // step_result::weight, its rows, say; set before after_backward,
                                // and before after_step the sum over the step's inner steps)
  std::int64_t steps_done = 0;  // steps finished (what a checkpoint taken now resumes after)
  // A policy that sizes work to speed (its local_steps) has the trainer take several inner steps
  // in one step, each on rows of its own: which one is being computed, of how many. And, before
  // after_step, the compute seconds the step took on this peer's clock (all its inner steps).
  std::int64_t sub_step = 0, local_steps = 1;
  double step_compute_s = 0;
  double step_passes_s = 0;  // of step_compute_s, the forward and backward passes (the rest: the
                             // optimizer and the clip, once an inner step or, accumulating, a step)
  // Set where the policy's inner steps are micro-batches of one step (its accumulates(): sync's
  // target batch): the parallel policy then keeps the gradients of the step's earlier inner steps
  // and adds to them, and the trainer exchanges and steps the optimizer once, after the last.
  bool accumulating = false;
  double lr_scale = 1.0;        // the inner learning rate of the step over its peak (set before
                                // after_step): Gaia's significance threshold falls with it
  bool last_step = false;       // policies that communicate periodically also do so on the last step
  std::int64_t run_steps = 0;   // the run's steps (trainer_options::steps): a policy that picks
                                // its own period keeps several rounds in the run
  bool round_start = true;      // the step starts a round of the communication policy (its
                                // ends_round_at(step - 1); the first step): where every replica
                                // stands at the same point, and fault::elastic takes joiners in
  // False where the communication policy lets a replica that came late skip ahead (its
  // catches_up(): diloco's deadline): the replicas then pass a round's start at different times,
  // some not at all, so a fault policy must not meet there.
  bool replicas_meet_at_round_start = true;
  bool resumed = false;         // start() after restore(): the peers' states are already what they should be
  bool joined = false;          // a fault policy's start() sets it when this peer joined a running group:
                                // its state came from the members, who are mid-run, so its
                                // policy's start() exchanges nothing
  std::function<io::checkpoint()> capture;             // this peer's whole state
  // The same as views of this peer's memory where it is on the host (io::checkpoint::views), to
  // read or overwrite at once while the peer waits: fault::elastic's donors serve their state
  // from it, a peer behind decodes the donor's into it.
  std::function<io::checkpoint()> capture_views;
  std::function<void(const io::checkpoint&)> restore;  // and back
  // A parallel policy that computes in pieces between messages (SWARM's stages) charges each
  // piece as it goes, so a simulated network's clock (and the router's measurements on it) sees
  // the compute where it happened: the trainer's compute clock, and the charge (which the trainer
  // then leaves out of the step's own).
  std::function<double()> compute_clock;
  std::function<void(double seconds)> computed;
  // For fault policies that change the group (fault::elastic):
  transport::any_endpoint& network;  // this peer's endpoint in the whole world, beneath any view
  phase at = phase::step;            // on_error: where the failure struck (with step)
  // From now on `comm` (and `replicas`) are the listed world ranks, with a tag space of `epoch`.
  std::function<void(std::uint64_t epoch, const std::vector<int>& members)> set_view;
  // Takes another peer's captured state as this peer's (it keeps its own identity and dropout
  // stream); ctx.step and ctx.at must then say where the donor stood.
  std::function<void(const io::checkpoint&)> adopt;
  // When the group re-formed, deals the model's parts out again over the new view (a job that
  // started as a pipeline of several stages: the parallel policy's morph); every member calls
  // it together, `behind` the world ranks whose state is not at the agreed `step` (they take
  // theirs from those at it). A part no member holds at that step (its stage's every replica
  // lost) is looked for in the checkpoint `files` the members can read: the group then goes back
  // to the newest step they hold whole (the trainer goes on from there). Null where every peer holds
  // the whole model: the fault policy then brings those behind up to date its own way. Between
  // set_view and it, `replicas` and `pipeline` are the old view's.
  std::function<void(const std::vector<int>& behind, std::int64_t step, const checkpoint_listing& files)> redeal;
  // What the communication policy's aggregation saw of each replica's contributions (indexed by
  // rank in `replicas`), when the policy keeps a tally (its aggregation()); else null.
  const collective::peer_tally* contributions = nullptr;
  // Adds another peer's own state (the "own." tensors of what it captured: what its codec had
  // not sent) to this peer's, or throws naming `what` and the problem (io::add_own_tensors);
  // fault::elastic's heir of a peer that left (fault/handoff.hpp).
  std::function<void(const io::checkpoint&, const std::string& what)> absorb;
};

}  // namespace decentrain::train
