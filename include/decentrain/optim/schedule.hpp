// Learning-rate schedules. cosine_schedule is nanoGPT's: linear warmup to max_lr, cosine decay
// to min_lr at decay_steps, then flat.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

#include "decentrain/detail/error.hpp"

namespace decentrain::optim {

struct cosine_schedule {
  double max_lr = 1e-3;
  double min_lr = 1e-4;
  std::int64_t warmup_steps = 100;
  std::int64_t decay_steps = 5000;

  void validate() const {
    decentrain::detail::check(max_lr >= min_lr && min_lr >= 0.0, "cosine_schedule: need max_lr >= min_lr >= 0, got ",
                              max_lr, " and ", min_lr);
    decentrain::detail::check(warmup_steps >= 0 && decay_steps > warmup_steps,
                              "cosine_schedule: need 0 <= warmup_steps < decay_steps, got ", warmup_steps,
                              " and ", decay_steps);
  }

  // The learning rate for step `step` (counting from 0).
  double operator()(std::int64_t step) const {
    if (step < warmup_steps) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
    if (step > decay_steps) return min_lr;
    const double ratio = static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps - warmup_steps);
    return min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * ratio)) * (max_lr - min_lr);
  }
};

}  // namespace decentrain::optim
