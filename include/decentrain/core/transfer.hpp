// Moving tensors between devices. A copy to the same device is no copy at all (the handle is
// returned, as torch's .to() does); between host and GPU the values are copied once, dense.
#pragma once

#include <type_traits>

#include "decentrain/core/device.hpp"
#include "decentrain/core/memory.hpp"
#include "decentrain/core/tensor.hpp"

namespace decentrain {

template <class To, class From>
tensor<To> to_device(const tensor<From>& x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else {
    static_assert(std::is_same_v<To, cpu> || std::is_same_v<From, cpu>,
                  "to_device: copies go between the host (dt::cpu) and one device");
    detail::check(x.defined(), "to_device: the tensor is undefined");
    const auto src = x.contiguous();
    auto out = tensor<To>::empty(x.shape(), x.dtype());
    if constexpr (std::is_same_v<From, cpu>)
      memory<To>::copy_from_host(out.raw_data(), src.raw_data(), src.nbytes());
    else
      memory<From>::copy_to_host(out.raw_data(), src.raw_data(), src.nbytes());
    return out;
  }
}

// A copy on the host that owns its storage, whichever device `x` is on (for snapshots:
// checkpoints, exported weights).
template <class From>
tensor<cpu> host_copy(const tensor<From>& x) {
  if constexpr (std::is_same_v<From, cpu>) return x.clone();
  else return to_device<cpu>(x);
}

}  // namespace decentrain
