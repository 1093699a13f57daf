// Build-wide switches and the library version: the one place that looks at the compiler and
// the build system, so every other header can ask a DECENTRAIN_ macro instead.
#pragma once

#define DECENTRAIN_VERSION_MAJOR 0
#define DECENTRAIN_VERSION_MINOR 2
#define DECENTRAIN_VERSION_PATCH 0
#define DECENTRAIN_STRINGIFY_(x) #x
#define DECENTRAIN_STRINGIFY(x) DECENTRAIN_STRINGIFY_(x)
// "0.2.0": what `decentrain-gpt --version` prints; CHANGELOG.md says what each version holds.
#define DECENTRAIN_VERSION_STRING                                                          \
  DECENTRAIN_STRINGIFY(DECENTRAIN_VERSION_MAJOR) "." DECENTRAIN_STRINGIFY(DECENTRAIN_VERSION_MINOR) "." \
      DECENTRAIN_STRINGIFY(DECENTRAIN_VERSION_PATCH)

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

// Standalone asio (Debian: libasio-dev) gives the TCP transport. nvcc (13.0) cannot compile
// asio 1.22's executor traits, so CUDA translation units see no TCP transport; the TCP peer lives
// in host code (a .cpp) and hands device buffers over as bytes. A program that trains in one
// process can define it 0 to leave the TCP transport (and TLS) out, and with it the instantiations
// of asio each file that includes the umbrella header compiles (the project's tests that use no
// TCP are built so: bench/RESULTS.md, CI, 2e35338).
#ifndef DECENTRAIN_HAS_ASIO
#if __has_include(<asio.hpp>) && !defined(__CUDACC__)
#define DECENTRAIN_HAS_ASIO 1
#else
#define DECENTRAIN_HAS_ASIO 0
#endif
#endif

// The CMake target defines DECENTRAIN_HAS_TLS=1 when it found OpenSSL's libssl (and links it):
// the TCP transport can then run TLS (transport/tls.hpp). Opt-in rather than detected, because
// asio's TLS layer makes every program that includes it link libssl and libcrypto, TLS used or
// not; a user of the single header defines it and links -lssl -lcrypto to get TLS.
#ifndef DECENTRAIN_HAS_TLS
#define DECENTRAIN_HAS_TLS 0
#endif

// DECENTRAIN_COMPILED_LIB (set by the CMake target decentrain::compiled, which links the
// library compiled from src/compiled_cpu.cpp): the CPU instantiations a trainer needs whatever
// its policies (the GPT on the CPU with every op and kernel of its forward and backward passes,
// AdamW, gradient clipping, the communicator's all-reduce over any_endpoint) are declared
// `extern template` next to their templates, so a program
// takes them from that library instead of compiling them again: a build-time switch only, the
// same code runs either way, given the same ABI-affecting flags (the library keeps those it was
// built with: build the program alike, e.g. not one with -D_GLIBCXX_DEBUG and one without).
// Without it the library is header-only.

// OpenMP pragmas go through this macro so that a build without -fopenmp sees no unknown
// pragma (which -Wall -Werror would reject) and simply runs single-threaded.
#if defined(_OPENMP)
#define DECENTRAIN_PRAGMA(x) _Pragma(#x)
#define DECENTRAIN_OMP(x) DECENTRAIN_PRAGMA(omp x)
#else
#define DECENTRAIN_OMP(x)
#endif

// `parallel for simd` for g++, plain `parallel for` for clang, which vectorises what it can by
// itself: asked for a loop it cannot vectorise (tanh has no vector variant there, as glibc's
// libmvec gives g++), clang warns on every instantiation (-Wpass-failed), an error under -Werror.
#if defined(__clang__)
#define DECENTRAIN_OMP_FOR_SIMD(clauses) DECENTRAIN_OMP(parallel for clauses)
#else
#define DECENTRAIN_OMP_FOR_SIMD(clauses) DECENTRAIN_OMP(parallel for simd clauses)
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
namespace detail {
// 128-bit products (Lemire's bounded draws); __extension__ keeps -Wpedantic quiet about the type.
__extension__ using uint128 = unsigned __int128;
}  // namespace detail

struct version_info {
  int major, minor, patch;
  const char* string;
};
inline constexpr version_info version{DECENTRAIN_VERSION_MAJOR, DECENTRAIN_VERSION_MINOR,
                                      DECENTRAIN_VERSION_PATCH, DECENTRAIN_VERSION_STRING};
}  // namespace decentrain
