// The outer optimizer of DiLoCo and Streaming DiLoCo: SGD with (Nesterov) momentum on the averaged
// pseudo-gradient (global - local), applied to the global parameters. One step for both policies
// (a Streaming DiLoCo fragment steps its ranges of the same flat buffers).
#pragma once

#include <concepts>
#include <cstdint>
#include <span>

#include "decentrain/detail/error.hpp"
#include "decentrain/kernels/optimizer.hpp"

namespace decentrain::comm::outer {

// SGD with Nesterov momentum: DiLoCo's settings (lr 0.7, momentum 0.9).
struct nesterov {
  double lr = 0.7;
  double momentum = 0.9;
  bool use_nesterov = true;
};
// Plain SGD on the pseudo-gradient; with lr 1 this is parameter averaging (local SGD).
struct sgd {
  double lr = 1.0;
  double momentum = 0.0;
  bool use_nesterov = false;
};

template <class Outer>
constexpr bool check_outer() {
  static_assert(requires(const Outer& o) { { o.lr } -> std::convertible_to<double>; },
                "outer optimizer: needs `double lr` (see comm::outer::nesterov)");
  static_assert(requires(const Outer& o) { { o.momentum } -> std::convertible_to<double>; },
                "outer optimizer: needs `double momentum` (see comm::outer::nesterov)");
  static_assert(requires(const Outer& o) { { o.use_nesterov } -> std::convertible_to<bool>; },
                "outer optimizer: needs `bool use_nesterov` (see comm::outer::nesterov)");
  return true;
}

// Fails naming `who` unless lr > 0 and momentum in [0, 1).
template <class Outer>
void validate(const Outer& o, const char* who) {
  decentrain::detail::check(o.lr > 0 && o.momentum >= 0 && o.momentum < 1, who,
                            ": the outer optimizer needs lr > 0 and momentum in [0, 1), got lr ", o.lr, " and momentum ",
                            o.momentum);
}

// global -= lr * (the pseudo-gradient through momentum); `first`: the momentum starts here.
template <class Outer>
void step(const Outer& o, std::span<float> global, std::span<const float> pseudo_gradient, std::span<float> momentum,
          bool first) {
  kernels::sgd_update(cpu{}, global.data(), pseudo_gradient.data(), momentum.data(), static_cast<std::int64_t>(global.size()),
                      o.lr, o.momentum, 0.0, o.use_nesterov, 0.0, first);
}

}  // namespace decentrain::comm::outer
