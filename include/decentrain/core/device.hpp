// Device tags. Code that differs by device is an overload or specialisation on these tags,
// never a run-time branch, so a CPU-only build carries no GPU code at all.
#pragma once

#include <concepts>
#include <string_view>

#include "decentrain/config.hpp"
#include "decentrain/detail/meta.hpp"

namespace decentrain {

struct cpu {
  static constexpr std::string_view name = "cpu";
};

// The GPU. Its memory and kernels exist only in nvcc-compiled code (DECENTRAIN_HAS_CUDA); a
// g++ build that names it stops at memory<cuda>'s static_assert.
struct cuda {
  static constexpr std::string_view name = "cuda";
};

template <class D>
concept device_tag = detail::is_one_of<D, cpu, cuda>;

}  // namespace decentrain
