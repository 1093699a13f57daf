// Build-wide switches and the library version: the one place that looks at the compiler and
// the build system, so every other header can ask a DECENTRAIN_ macro instead.
#pragma once

#define DECENTRAIN_VERSION_MAJOR 0
#define DECENTRAIN_VERSION_MINOR 1
#define DECENTRAIN_VERSION_PATCH 0

// CUDA code is compiled only by nvcc; a g++ build sees none of it.
#if defined(__CUDACC__)
#define DECENTRAIN_HAS_CUDA 1
#define DECENTRAIN_HOST_DEVICE __host__ __device__
#else
#define DECENTRAIN_HAS_CUDA 0
#define DECENTRAIN_HOST_DEVICE
#endif

// The CMake target defines DECENTRAIN_HAS_CBLAS=1 when it found a CBLAS; a user of the
// single header can define it too and link a CBLAS. Without it the portable GEMM is used.
#ifndef DECENTRAIN_HAS_CBLAS
#define DECENTRAIN_HAS_CBLAS 0
#endif

// OpenMP pragmas go through this macro so that a build without -fopenmp sees no unknown
// pragma (which -Wall -Werror would reject) and simply runs single-threaded.
#if defined(_OPENMP)
#define DECENTRAIN_PRAGMA(x) _Pragma(#x)
#define DECENTRAIN_OMP(x) DECENTRAIN_PRAGMA(omp x)
#else
#define DECENTRAIN_OMP(x)
#endif

// For elementwise kernels whose clamps must vectorise: under GCC's default -ftrapping-math a
// float compare-and-select is not if-converted ("control flow in loop"), and these kernels
// never rely on floating-point traps. Other compilers if-convert without being asked.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define DECENTRAIN_VECTORIZE_SELECTS [[gnu::optimize("no-trapping-math")]]
#else
#define DECENTRAIN_VECTORIZE_SELECTS
#endif

namespace decentrain {
struct version_info {
  int major, minor, patch;
};
inline constexpr version_info version{DECENTRAIN_VERSION_MAJOR, DECENTRAIN_VERSION_MINOR,
                                      DECENTRAIN_VERSION_PATCH};
}  // namespace decentrain
