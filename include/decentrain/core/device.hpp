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

// Kernels for this tag arrive with the CUDA backend; the tag exists now so types can name it.
struct cuda {
  static constexpr std::string_view name = "cuda";
};

template <class D>
concept device_tag = detail::is_one_of<D, cpu, cuda>;

}  // namespace decentrain
