// Which devices' kernels read and write bf16 storage themselves, with f32 arithmetic inside.
// On the GPU a pass that widens a tensor to f32 before a kernel (and one that narrows the
// result after) costs as much memory traffic as the kernel itself, so there the GEMMs take bf16
// operands into a bf16 or f32 result (tensor cores, f32 accumulation) and the kernels of gelu,
// cross_entropy, sums and gradient accumulation (axpy) take bf16 arrays. Elsewhere (the CPU, whose
// kernels are f32/f64 only) ops widen bf16 to f32 for the kernel and narrow the result.
#pragma once

#include "decentrain/config.hpp"
#include "decentrain/core/device.hpp"

namespace decentrain::kernels {

template <class Device>
inline constexpr bool native_bf16 = false;
#if DECENTRAIN_HAS_CUDA
template <>
inline constexpr bool native_bf16<cuda> = true;
#endif

}  // namespace decentrain::kernels
