// The attention kernels of every device: the CPU ones always, the CUDA ones when nvcc compiles
// (the .cuh files are empty otherwise). Ops include this, never a device folder directly.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "decentrain/core/dtype.hpp"
#include "decentrain/kernels/cpu/attention.hpp"
#include "decentrain/kernels/cuda/attention.cuh"
#include "decentrain/kernels/cuda/attention_bf16.cuh"

namespace decentrain::kernels {

// bf16 attention (bf16 in and out, f32 logsumexp) exists only where a device overloads these,
// the GPU with its tensor cores; the op tests for them with a concept, and elsewhere computes
// bf16 attention in f32. Deleted here so the names exist on every build. Their last argument is
// the distance between rows of q, k, v (and dq, dk, dv): C, or 3 C for the column blocks of a
// fused (B, T, 3C) projection.
template <class Device>
void attention_forward_bf16(Device, bf16*, float*, const bf16*, const bf16*, const bf16*, std::int64_t, std::int64_t,
                            std::int64_t, std::int64_t, std::int64_t) = delete;
template <class Device>
void attention_backward_bf16(Device, bf16*, bf16*, bf16*, const bf16*, const bf16*, const float*, const bf16*,
                             const bf16*, const bf16*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                             std::int64_t) = delete;
template <class Device>
bool attention_bf16_supported(Device, std::int64_t, std::int64_t, std::int64_t, std::initializer_list<const void*>) = delete;

}  // namespace decentrain::kernels
