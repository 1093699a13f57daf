// Streaming DiLoCo's fragment (comm/streaming_diloco.hpp): a part of the flat parameter buffer,
// whole layers dealt out by a pattern, that synchronises on its own schedule with its own codec
// state, exchange in flight and outer-momentum start (torchft's _StreamingDiLoCoFragment shape).
// The policy keeps the flat global parameters and momentum; a fragment steps its ranges of them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "decentrain/collective/communicator.hpp"
#include "decentrain/comm/outer.hpp"
#include "decentrain/comm/policy.hpp"
#include "decentrain/compress/layout.hpp"

namespace decentrain::comm {

// How parameters are dealt into fragments. The units are the model's layers: consecutive
// parameters whose names share the part up to the first number ("h.3.attn.c_attn.weight" is
// layer "h.3"), or, for names without a number, the module ("ln_f.weight" is "ln_f").
enum class fragment_pattern : std::int8_t {
  strided,     // unit k goes to fragment k mod P (the paper's choice: each fragment spans the depth)
  sequential,  // consecutive units, P runs of about equal size
};

namespace detail {
// The layer a parameter belongs to (see fragment_pattern).
inline std::string layer_of(const std::string& name) {
  std::size_t at = 0;
  while (at < name.size()) {
    const auto dot = name.find('.', at);
    const auto end = dot == std::string::npos ? name.size() : dot;
    if (end > at && std::all_of(name.begin() + static_cast<std::ptrdiff_t>(at), name.begin() + static_cast<std::ptrdiff_t>(end),
                                [](char c) { return c >= '0' && c <= '9'; }))
      return name.substr(0, end);
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  const auto last = name.rfind('.');
  return last == std::string::npos ? name : name.substr(0, last);
}

// A contiguous run of values in the flat parameter buffer.
struct value_range {
  std::size_t offset = 0, size = 0;
};

// The model's layers (see fragment_pattern) as runs of the flat parameter buffer, in order.
struct layer_unit {
  std::string layer;
  std::size_t offset = 0, size = 0;
};
template <class Device>
std::vector<layer_unit> layer_units(const parameter_list<Device>& params) {
  std::vector<layer_unit> units;
  std::size_t at = 0;
  for (const auto& e : params) {
    const auto n = static_cast<std::size_t>(e.param.value().numel());
    const auto layer = layer_of(e.name);
    if (units.empty() || units.back().layer != layer || units.back().offset + units.back().size != at)
      units.push_back({layer, at, 0});
    units.back().size += n;
    at += n;
  }
  return units;
}

// Which parameters (by index) each of `count` fragments holds, as ranges of the flat buffer
// (adjacent ranges merged). Fails when there are fewer layers than fragments.
template <class Device>
std::vector<std::vector<value_range>> fragment_ranges(const parameter_list<Device>& params, std::int64_t count,
                                                      fragment_pattern pattern) {
  const auto units = layer_units(params);
  const std::size_t at = units.empty() ? 0 : units.back().offset + units.back().size;  // every value
  decentrain::detail::check(count >= 1 && static_cast<std::size_t>(count) <= units.size(), "streaming_diloco: ", count,
                            " fragments asked for, but the model has ", units.size(),
                            " layers to deal out (fragments must be in [1, layers])");
  const auto P = static_cast<std::size_t>(count);
  std::vector<std::size_t> owner(units.size());
  if (pattern == fragment_pattern::strided) {
    for (std::size_t k = 0; k < units.size(); ++k) owner[k] = k % P;
  } else {  // cut where the running total passes each multiple of total / P; at least one unit each
    std::size_t done = 0, f = 0;
    for (std::size_t k = 0; k < units.size(); ++k) {
      if (k > 0 && f + 1 < P && (done * P >= (f + 1) * at || units.size() - k == P - 1 - f)) ++f;
      owner[k] = f;
      done += units[k].size;
    }
  }
  std::vector<std::vector<value_range>> out(P);
  for (std::size_t k = 0; k < units.size(); ++k) {
    auto& r = out[owner[k]];
    if (!r.empty() && r.back().offset + r.back().size == units[k].offset) r.back().size += units[k].size;
    else r.push_back({units[k].offset, units[k].size});
  }
  for (std::size_t f = 0; f < P; ++f)
    decentrain::detail::check(!out[f].empty(), "streaming_diloco: fragment ", f, " got no layer (", units.size(), " layers, ",
                              P, " fragments)");
  return out;
}
}  // namespace detail

template <class Codec, class Aggregator>
struct streaming_fragment {
  std::vector<detail::value_range> ranges;  // of the flat parameter buffer
  std::size_t size = 0;                     // values in all of them
  compress::layout layout;                  // its matrices, as its codec sees them
  std::int64_t phase = 0;                   // synchronises after steps s with (s + 1) mod H == phase
  Codec codec{};                            // its own error feedback and layout
  Aggregator aggregator{};
  collective::aggregation_record record;
  mutable std::vector<float> buffer;        // the pseudo-gradient sent, then the average received (settle() may scale it)
  std::int64_t lands_after = -1;            // the step after which the exchange in flight is merged
  round_weight weight;                      // of the steps since the fragment's last exchange
  round_weight sent;                        // (sum:) of the steps the exchange in flight covers
  bool momentum_started = false;
  // Eager updates: the average and this peer's pseudo-gradient of the round before (empty
  // before the first), and whether the peer's own outer momentum has started.
  std::vector<float> previous_average, previous_own;
  bool eager_started = false;
  std::uint64_t bytes = 0;                  // what the last exchange sent
  double took_s = 0;                        // and how long it took, on the clock of the thread that ran it
  // The exchange runs on a lane thread that owns codec, aggregator, record, buffer and bytes
  // until it is settled; save() settles it, hence mutable. A copy of the policy (the trainer
  // takes its policy by value, before start) has nothing in flight.
  struct in_flight {
    collective::pending handle;
    std::exception_ptr failure;
    in_flight() = default;
    in_flight(const in_flight&) {}
    in_flight(in_flight&&) noexcept = default;
    in_flight& operator=(const in_flight&) { return *this; }
    in_flight& operator=(in_flight&&) noexcept = default;
  };
  mutable in_flight exchange;
  // A weighted exchange that averages on the way sums weight x pseudo-gradient while the
  // weights' sum goes on a lane of its own beside it (one latency, not two after each other):
  // until settled the buffer holds that sum over the world, which settle() scales to the
  // weighted average (world / the weights' sum).
  mutable in_flight weighing;
  mutable double weights_sum = 0;  // this replica's weight, then every replica's sum
  mutable int weighed_world = 0;   // set: the exchange in flight is weighed so, over this many replicas

  // Waits for the exchange (and its weights); a failure is kept in exchange.failure.
  void settle() const {
    for (auto* f : {&weighing, &exchange}) {
      try {
        f->handle.wait();
      } catch (...) {
        if (!exchange.failure) exchange.failure = std::current_exception();
      }
    }
    const int world = std::exchange(weighed_world, 0);
    if (world == 0 || exchange.failure) return;
    if (!(std::isfinite(weights_sum) && weights_sum > 0)) {
      exchange.failure = std::make_exception_ptr(decentrain::error(decentrain::detail::concat(
          "weighted averaging: the peers' weights add up to ", weights_sum, "; it needs a positive sum")));
      return;
    }
    const auto f = static_cast<float>(static_cast<double>(world) / weights_sum);
    for (auto& v : buffer) v *= f;
  }
  void take(streaming_fragment&& restored) {
    codec = std::move(restored.codec);
    buffer = std::move(restored.buffer);
    lands_after = restored.lands_after;
    weight = restored.weight;
    sent = restored.sent;
    momentum_started = restored.momentum_started;
    previous_average = std::move(restored.previous_average);
    previous_own = std::move(restored.previous_own);
    eager_started = restored.eager_started;
    took_s = restored.took_s;
  }

  // out = from - local over the fragment's ranges, packed in their order.
  void pseudo_gradient(std::span<const float> from, std::span<const float> local, std::vector<float>& out) const {
    out.resize(size);
    std::size_t at = 0;
    for (const auto& r : ranges)
      for (std::size_t i = 0; i < r.size; ++i, ++at) out[at] = from[r.offset + i] - local[r.offset + i];
  }
  // The outer step on the fragment's ranges of the flat `global` and `momentum`, from `packed`
  // (a value per place in the fragment, in its order).
  template <class Outer>
  void outer_step(const Outer& o, std::span<float> global, std::span<const float> packed, std::span<float> momentum,
                  bool first) const {
    std::size_t at = 0;
    for (const auto& r : ranges) {
      outer::step(o, global.subspan(r.offset, r.size), packed.subspan(at, r.size), momentum.subspan(r.offset, r.size), first);
      at += r.size;
    }
  }
  // The fragment's ranges of `from` into `to` (flat buffers alike).
  void copy_ranges(std::span<const float> from, std::span<float> to) const {
    for (const auto& r : ranges) std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(r.offset), r.size, to.begin() + static_cast<std::ptrdiff_t>(r.offset));
  }

  // The checkpoint's entries under `prefix` (an exchange in flight is saved with its average,
  // settled by the caller); `eager`: the policy runs eager updates.
  void save(io::checkpoint& c, const std::string& prefix, bool eager) const {
    c.counters[prefix + "momentum_started"] = momentum_started ? 1 : 0;
    c.counters[prefix + "lands_after"] = lands_after;
    weight.save(c, prefix);
    sent.save(c, prefix + "sent_");
    if (lands_after >= 0) {
      c.tensors[prefix + "average"] = flat_tensor(buffer, c);  // (weighed by the caller)
      save_exact(c, prefix + "took_s", took_s);  // (a tuned policy judges the exchange when it lands)
    }
    if (eager) {
      c.counters[prefix + "eager_started"] = eager_started ? 1 : 0;
      c.tensors[prefix + "previous_average"] = flat_tensor(previous_average, c);
      c.tensors[prefix + "previous_own"] = flat_tensor(previous_own, c);
    }
    save_codec(codec, c, prefix + "codec.");
  }
  void load(const io::checkpoint& c, const std::string& prefix, bool eager) {
    momentum_started = c.counter(prefix + "momentum_started") != 0;
    lands_after = c.counter(prefix + "lands_after");
    weight.load(c, prefix);
    sent.load(c, prefix + "sent_");
    if (lands_after >= 0) {
      buffer = c.tensor_at(prefix + "average").template to_vector<float>();
      took_s = load_exact(c, prefix + "took_s", "a number of seconds").value_or(0.0);
    }
    if (eager) {
      eager_started = c.counter(prefix + "eager_started") != 0;
      previous_average = c.tensor_at(prefix + "previous_average").template to_vector<float>();
      previous_own = c.tensor_at(prefix + "previous_own").template to_vector<float>();
    }
    load_codec(codec, c, prefix + "codec.");
  }
};

}  // namespace decentrain::comm
