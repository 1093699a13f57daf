// Differentiable inverted dropout: each element is kept with probability 1 - p and scaled by
// 1 / (1 - p), so evaluation needs no rescaling. The mask comes from a caller-owned, seeded rng.
#pragma once

#include "decentrain/autograd/math.hpp"
#include "decentrain/autograd/variable.hpp"
#include "decentrain/core/rng.hpp"

namespace decentrain {

template <class Device>
var<Device> dropout(const var<Device>& x, double p, rng& gen, bool training = true) {
  detail::check(p >= 0.0 && p <= 1.0, "dropout: probability must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  const double keep_scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
  std::vector<double> mask_values(static_cast<std::size_t>(x.value().numel()));
  for (auto& m : mask_values) m = gen.uniform() >= p ? keep_scale : 0.0;
  const auto mask = from_vector<Device>(mask_values, x.shape(), x.dtype());
  return record<Device>("dropout", math::mul(x.value(), mask), {x},
                        [mask](const tensor<Device>& g, node<Device>& n) {
                          n.accumulate(0, math::mul(g, mask));
                        });
}

}  // namespace decentrain
