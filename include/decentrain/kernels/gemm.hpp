// The gemm kernels of every device: the CPU ones always, the CUDA ones when nvcc compiles
// (the .cuh is empty otherwise). Ops include this, never a device folder directly.
#pragma once

#include "decentrain/kernels/cpu/gemm.hpp"
#include "decentrain/kernels/cuda/gemm.cuh"

namespace decentrain::kernels {
// Whether gemm(Device{}, ...) multiplies bf16 operands natively into an f32 result (f32
// accumulation). Elsewhere bf16 operands are widened to f32 first.
template <class Device>
inline constexpr bool has_bf16_gemm = false;
#if DECENTRAIN_HAS_CUDA
template <>
inline constexpr bool has_bf16_gemm<cuda> = true;
#endif
}  // namespace decentrain::kernels
