// Differentiable inverted dropout: each element is kept with probability 1 - p and scaled by
// 1 / (1 - p), so evaluation needs no rescaling. Each call takes one number from a caller-owned,
// seeded rng as its key; the mask is a function of the key and each element's index
// (kernels/dropout.hpp), made by the device as the values pass (a GPU copies no mask from the
// host) and made again by the backward, so no mask is stored. CPU and GPU make the same mask.
#pragma once

#include <cstdint>

#include "decentrain/autograd/dispatch.hpp"
#include "decentrain/autograd/variable.hpp"
#include "decentrain/core/rng.hpp"
#include "decentrain/kernels/dropout.hpp"

namespace decentrain {

namespace detail {
// x through key's mask, stored in x's dtype.
template <class Device>
tensor<Device> dropout_masked(const tensor<Device>& x, float p, std::uint64_t key) {
  const auto cx = kernel_tensor(x);
  auto out = tensor<Device>::empty(cx.shape(), cx.dtype());
  with_kernel_type<Device>(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    kernels::dropout_apply(Device{}, out.template data<T>(), cx.template data<T>(), cx.numel(), p, key);
  });
  return stored_as(out, x.dtype());
}
}  // namespace detail

template <class Device>
var<Device> dropout(const var<Device>& x, double p, rng& gen, bool training = true) {
  detail::check(p >= 0.0 && p <= 1.0, "dropout: probability must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  const auto key = gen.next_u64();
  const auto q = static_cast<float>(p);
  return record<Device>("dropout", detail::dropout_masked(x.value(), q, key), {x},
                        [q, key](const tensor<Device>& g, node<Device>& n) {
                          n.accumulate(0, detail::dropout_masked(g, q, key));
                        });
}

}  // namespace decentrain
