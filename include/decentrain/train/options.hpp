// The trainer's settings: the inner optimizer (AdamW, cosine schedule), batches, evaluation,
// precision, and the collectives' message sizes. Defaults are the library's, and the command line
// takes its defaults from here, so the two cannot drift apart.
#pragma once

#include <cstdint>

#include "decentrain/collective/communicator.hpp"
#include "decentrain/core/dtype.hpp"
#include "decentrain/detail/error.hpp"

namespace decentrain::train {

struct trainer_options {
  std::int64_t steps = 1000;         // inner steps per peer
  std::int64_t batch_size = 16;      // rows per peer per step
  std::int64_t block_size = 0;       // 0: the model's block size
  double lr = 3e-3;                  // AdamW peak learning rate (cosine schedule)
  double min_lr = -1;                // the cosine floor; -1: lr / 10
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
  // How often peers agree on whether to stop early (trainer::stop_when): a one-integer
  // all-reduce every this many steps; a lone peer checks every step.
  std::int64_t stop_check_every = 50;
  // The stop check's all-reduce runs in the background and is read at the next check, so on
  // slow links the group does not wait a round trip at every check: a stop asked is acted on at
  // the check after the one that saw it (at most 2 x stop_check_every steps later). false: each
  // check waits for its all-reduce and the group stops there. A fault policy that re-forms the
  // group always waits (a group re-formed in between could not read what the old one posted).
  bool stop_check_in_background = true;
  // A peer asked to stop leaves alone, at its next step, and the others go on without it: for
  // a peer that is a process of its own in an elastic group (Ctrl-C on one machine). Needs a
  // fault policy that re-forms the group.
  bool stop_alone = false;
  // How many times in a row the fault policy may redo a failed step before the error is rethrown.
  int max_redos = 3;
  // A step whose training loss is not finite ends fit() with an error, before the step is taken
  // into a checkpoint: the parameters diverged or took in non-finite values (from a peer, say),
  // and training on would only write NaN. False: train on regardless.
  bool stop_on_non_finite = true;
  // Message sizes of the collectives (the same on every peer); over TCP across the internet set
  // collectives.link_bytes_in_flight (simulated links size them on their own).
  collective::options collectives;

  double floor_lr() const { return min_lr >= 0 ? min_lr : lr / 10; }
  std::int64_t warmup() const { return warmup_steps >= 0 ? warmup_steps : steps / 10; }

  void validate() const {
    using decentrain::detail::check;
    check(steps >= 1, "trainer: steps must be >= 1, got ", steps);
    check(batch_size >= 1, "trainer: batch_size must be >= 1, got ", batch_size);
    check(block_size >= 0, "trainer: block_size must be >= 0 (0: the model's), got ", block_size);
    check(lr > 0 && lr < 1e6, "trainer: lr must be a number in (0, 1e6), got ", lr);
    check(min_lr == -1 || (min_lr >= 0 && min_lr <= lr), "trainer: min_lr must be in [0, lr] (or -1: lr / 10), got ", min_lr);
    check(warmup_steps >= -1, "trainer: warmup_steps must be >= 0 (or -1: steps / 10), got ", warmup_steps);
    check(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, "trainer: beta1 and beta2 must be in [0, 1), got ", beta1,
          " and ", beta2);
    check(weight_decay >= 0, "trainer: weight_decay must be >= 0, got ", weight_decay);
    check(eval_every >= 0 && eval_batches >= 1, "trainer: need eval_every >= 0 and eval_batches >= 1");
    check(grad_clip >= 0, "trainer: grad_clip must be >= 0, got ", grad_clip);
    check(compute_dtype == dtype::f32 || compute_dtype == dtype::bf16, "trainer: compute_dtype must be f32 or bf16, got ",
          dtype_name(compute_dtype));
    check(stop_check_every >= 1, "trainer: stop_check_every must be >= 1, got ", stop_check_every);
    check(max_redos >= 0, "trainer: max_redos must be >= 0, got ", max_redos);
  }
};

}  // namespace decentrain::train
