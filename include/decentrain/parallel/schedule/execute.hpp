// Runs a schedule (action.hpp) on one peer of a pipeline: its stage's forwards and backwards in
// the program's order, the activations sent to the next stage and their gradients to the one
// before, each through a codec with its shape in front (so micro-batches of any size and any
// sequence length travel; the receiver checks the shape against what it expects). Every
// schedule runs through this one function: a new schedule is a new generator, nothing here.
//
// The stage is a model part (nn::part) with
//   var<D> stage_forward(int s, const var<D>& in, const tensor<D>& ids, const tensor<D>& targets, rng*)
//                                        model stage s's forward (one of the part's)
//   std::int64_t stream_width() const    the width C of the (B, T, C) stream between stages
// Where a schedule splits a backward, the input half runs the stage's backward with its linear
// layers' weight gradients put off (autograd/deferred.hpp) and the weight half computes them:
// the same products as a whole backward's, so the gradients are the same.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <tuple>
#include <type_traits>
#include <vector>

#include "decentrain/autograd/autograd.hpp"
#include "decentrain/core/factory.hpp"
#include "decentrain/core/transfer.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/parallel/schedule/action.hpp"
#include "decentrain/transport/endpoint.hpp"

namespace decentrain::parallel::schedule {

// One micro-batch's rows: token ids and targets (rows, T), and its share of the step's loss
// (its rows over the step's rows, so the shares' sum of losses is the whole batch's mean).
struct micro_batch {
  tensor<cpu> ids, targets;
  double share = 1.0;
};

// What a run did on this peer.
struct run_stats {
  double loss = 0;       // the last stage: the step's loss (shares' weighted sum); others 0
  int peak_stashed = 0;  // most micro-batches whose activations this peer held at once
  std::uint64_t bytes_sent = 0;  // activations and gradients sent (headers included)
  int peak_deferred = 0;  // most weight halves owed at once (their inputs and output gradients held)
  double busy_s = 0;   // in the stage's forwards and backwards
  double total_s = 0;  // the whole run, waits on the other stages included
  // The share of the run this peer waited: its bubble (with the transfers' time in it).
  double idle_fraction() const { return total_s > 0 ? 1.0 - busy_s / total_s : 0.0; }
};

namespace detail {

// What goes before every activation or gradient: which, whose, its shape and the encoded size.
struct wire_header {
  std::int32_t kind = 0;  // 0: an activation going forward, 1: its gradient going back
  std::int32_t stage = 0;  // the stage that receives it
  std::int32_t micro = 0;
  std::int32_t rank = 0;  // of the shape (3: rows, T, C)
  std::int64_t dims[4] = {0, 0, 0, 0};
  std::uint64_t bytes = 0;  // the encoded payload that follows
};

}  // namespace detail

// Runs peer `me`'s actions of `p` (train: forwards and backwards, dropout drawn from `dropout`;
// otherwise its forwards only, without dropout, whatever backwards the program lists skipped). `comm_rank[q]` is program peer
// q's rank in `comm` (the pipeline's communicator). The caller zeroes the gradients before and
// sums tied parameters after.
template <class Stage, class Comm, class Codec>
run_stats execute(const program& p, int me, Stage& stage, Comm& comm, const std::vector<int>& comm_rank,
                  const std::vector<micro_batch>& micro, Codec& codec, bool train, rng* dropout = nullptr) {
  using D = typename Stage::device_type;
  using decentrain::detail::check;
  check(static_cast<int>(micro.size()) == p.micro_batches, "pipeline: ", micro.size(), " micro-batches for a schedule of ",
        p.micro_batches);
  check(me >= 0 && me < p.peers() && comm_rank.size() == static_cast<std::size_t>(p.peers()), "pipeline: peer ", me,
        " of a schedule for ", p.peers(), " peers, with ", comm_rank.size(), " ranks given");
  const int last = p.stages() - 1;
  const std::int64_t width = stage.stream_width();
  run_stats stats;
  using clock = std::chrono::steady_clock;
  const auto since = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  const auto run_start = clock::now();

  struct stashed {
    var<D> in, out;  // out: the stream handed on, or on the last stage the loss
  };
  std::map<std::pair<int, int>, stashed> stash;  // (stage, micro)
  std::map<std::pair<int, int>, weight_gradients> owed;  // (stage, micro): input half run, weight half not yet
  std::map<std::tuple<int, int, int>, tensor<cpu>> mailbox;  // (kind, stage, micro): arrived ahead of its turn
  std::vector<std::byte> wire;

  const auto send = [&](int kind, int to_stage, int m, const tensor<D>& value) {
    const auto host = to_device<cpu>(value.contiguous());
    const auto n = static_cast<std::size_t>(host.numel());
    wire.resize(codec.max_encoded_bytes(n));
    const auto used = codec.encode(std::span<const float>(host.template data<float>(), n), std::span<std::byte>(wire));
    detail::wire_header h;
    h.kind = kind;
    h.stage = to_stage;
    h.micro = m;
    h.rank = static_cast<std::int32_t>(host.rank());
    for (std::size_t i = 0; i < host.rank(); ++i) h.dims[i] = host.size(static_cast<std::int64_t>(i));
    h.bytes = used;
    const int to_peer = p.peer_of[static_cast<std::size_t>(to_stage)];
    if (to_peer == me) {  // two chunks of this peer's: no wire
      mailbox.emplace(std::make_tuple(kind, to_stage, m), host.clone());
      return;
    }
    const int to = comm_rank[static_cast<std::size_t>(to_peer)];
    comm.send_to(to, std::span<const detail::wire_header>(&h, 1));
    comm.send_to(to, std::span<const std::byte>(wire.data(), used));
    stats.bytes_sent += sizeof h + used;
  };
  // The activation (kind 0) or gradient (kind 1) for (stage, micro), from the peer of stage
  // `from_stage`; others that peer sent first wait in the mailbox for their turn.
  const auto receive = [&](int kind, int at_stage, int m, int from_stage) -> tensor<D> {
    const int from_peer = p.peer_of[static_cast<std::size_t>(from_stage)];
    const int from = comm_rank[static_cast<std::size_t>(from_peer)];
    for (;;) {
      if (auto it = mailbox.find({kind, at_stage, m}); it != mailbox.end()) {
        auto t = std::move(it->second);
        mailbox.erase(it);
        return to_device<D>(t);
      }
      check(from_peer != me, "pipeline: stage ", at_stage, " waits for stage ", from_stage,
            " of the same peer, which has not run (the schedule's order on peer ", me, ")");
      detail::wire_header h;
      comm.recv_from(from, std::span<detail::wire_header>(&h, 1));
      // What that peer may send this one: activations into a stage after one of its own,
      // gradients into a stage before one of its own, of a micro-batch of this step.
      const bool forward = h.kind == 0, known = h.kind == 0 || h.kind == 1;
      const int source_stage = forward ? h.stage - 1 : h.stage + 1;
      check(known && h.stage >= 0 && h.stage <= last && source_stage >= 0 && source_stage <= last &&
                p.peer_of[static_cast<std::size_t>(source_stage)] == from_peer &&
                p.peer_of[static_cast<std::size_t>(h.stage)] == me && h.micro >= 0 && h.micro < p.micro_batches &&
                !mailbox.count({h.kind, h.stage, h.micro}),
            "pipeline: peer ", from, " sent a message this stage does not expect (kind ", h.kind, ", stage ", h.stage,
            ", micro-batch ", h.micro, ")");
      const auto& mb = micro[static_cast<std::size_t>(h.micro)];
      const shape expected{mb.ids.size(0), mb.ids.size(1), width};
      check(h.rank == 3 && h.dims[0] == expected[0] && h.dims[1] == expected[1] && h.dims[2] == expected[2],
            "pipeline: peer ", from, " sent ", forward ? "an activation" : "a gradient", " of micro-batch ", h.micro,
            " with shape (", h.dims[0], ", ", h.dims[1], ", ", h.dims[2], ") of rank ", h.rank, "; expected ", expected);
      const auto n = static_cast<std::size_t>(expected.numel());
      check(h.bytes <= codec.max_encoded_bytes(n), "pipeline: peer ", from, " announced ", h.bytes, " bytes for ", n,
            " values; the codec encodes them in at most ", codec.max_encoded_bytes(n));
      wire.resize(h.bytes);
      comm.recv_from(from, std::span<std::byte>(wire.data(), wire.size()));
      auto values = zeros<cpu>(expected);
      codec.decode_add(std::span<const std::byte>(wire.data(), wire.size()), std::span<float>(values.template data<float>(), n));
      mailbox.emplace(std::make_tuple(h.kind, h.stage, h.micro), std::move(values));
    }
  };

  for (const auto& a : p.actions[static_cast<std::size_t>(me)]) {
    const auto& mb = micro[static_cast<std::size_t>(a.micro)];
    if (a.what == op::forward) {
      var<D> in;
      if (a.stage > 0) in = var<D>(receive(0, a.stage, a.micro, a.stage - 1), train);
      const auto t0 = clock::now();
      auto out = stage.stage_forward(a.stage, in, to_device<D>(mb.ids), to_device<D>(mb.targets), train ? dropout : nullptr);
      const double loss = a.stage == last ? out.item() : 0.0;
      stats.busy_s += since(t0);
      if (a.stage == last) stats.loss += mb.share * loss;
      else send(0, a.stage + 1, a.micro, out.value());
      if (train) {
        stash[{a.stage, a.micro}] = stashed{std::move(in), std::move(out)};
        stats.peak_stashed = std::max(stats.peak_stashed, static_cast<int>(stash.size()));
      }
      continue;
    }
    if (!train) continue;
    if (a.what == op::backward_weight) {
      auto it = owed.find({a.stage, a.micro});
      check(it != owed.end(), "pipeline: ", to_string(a), " before its input half");
      const auto t0 = clock::now();
      it->second.run();
      stats.busy_s += since(t0);
      owed.erase(it);
      continue;
    }
    auto it = stash.find({a.stage, a.micro});
    check(it != stash.end(), "pipeline: ", to_string(a), " before its forward");
    auto [in, out] = std::move(it->second);
    stash.erase(it);
    auto grad = a.stage == last ? full<D>(out.shape(), mb.share, out.dtype()) : receive(1, a.stage, a.micro, a.stage + 1);
    const auto t0 = clock::now();
    if (a.what == op::backward_input) {
      weight_gradients later;
      {
        defer_weight_gradients scope(later);
        out.backward(grad);
      }
      owed.emplace(std::make_pair(a.stage, a.micro), std::move(later));
      stats.peak_deferred = std::max(stats.peak_deferred, static_cast<int>(owed.size()));
    } else {
      out.backward(grad);
    }
    stats.busy_s += since(t0);
    if (a.stage > 0) send(1, a.stage - 1, a.micro, in.grad());
  }
  check(stash.empty() && mailbox.empty() && owed.empty(), "pipeline: the schedule left ", stash.size(),
        " micro-batches without a backward, ", owed.size(), " without their weight half and ", mailbox.size(),
        " messages unread on peer ", me);
  stats.total_s = since(run_start);
  return stats;
}

}  // namespace decentrain::parallel::schedule
