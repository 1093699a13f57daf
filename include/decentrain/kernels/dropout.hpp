// The dropout kernels of every device: the CPU ones always, the CUDA ones when nvcc compiles
// (the .cuh is empty otherwise). Ops include this, never a device folder directly.
#pragma once

#include "decentrain/kernels/cpu/dropout.hpp"
#include "decentrain/kernels/cuda/dropout.cuh"
