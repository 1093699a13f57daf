// The gemm kernels of every device: the CPU ones always, the CUDA ones when nvcc compiles
// (the .cuh is empty otherwise). Ops include this, never a device folder directly.
#pragma once

#include "decentrain/kernels/cpu/gemm.hpp"
#include "decentrain/kernels/cuda/gemm.cuh"
#include "decentrain/kernels/native_bf16.hpp"
