// The codecs' device paths: blockwise quantisation and top-k of magnitudes on the GPU when nvcc
// compiles (the .cuh is empty otherwise); on the CPU the codecs in compress/ do this themselves.
#pragma once

#include "decentrain/kernels/cuda/quantize.cuh"
