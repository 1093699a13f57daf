// cuBLAS and cuBLASLt, opened (dlopen) the first time a GEMM needs them rather than linked.
// Linked, cuBLASLt's static initialisers and relocations run at every start of the program,
// whether or not it ever touches a GPU (`decentrain-gpt --help`, a CPU run, each process the
// tests start; bench/RESULTS.md, CI, has what it cost). Opened here, a program pays it once, at
// its first GEMM on a GPU; decentrain::cuda links the CUDA runtime only. The library of the
// toolkit the program was compiled against (its major version, as the headers say) is looked for
// as the dynamic loader does (LD_LIBRARY_PATH, the program's RUNPATH, ld.so.cache), then beside
// the CUDA runtime the program runs with.
#pragma once

#include "decentrain/config.hpp"

// Compiled wherever the toolkit's headers are (g++ too: tests/cuda/test_cublas_library.cpp).
#if DECENTRAIN_HAS_CUDA || __has_include(<cublasLt.h>)
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <string>

#include "decentrain/detail/error.hpp"

namespace decentrain::kernels::cuda_detail {

// The functions the kernels call, each by the name its header gives it (cublas_v2.h maps some to
// a _v2 symbol: the member and the symbol looked up are that one). cublasGemmEx is apart: its
// header overloads it in C++.
#define DECENTRAIN_CUBLAS_FUNCTIONS(X) \
  X(cublasCreate) X(cublasDestroy) X(cublasSetStream) X(cublasSgemm) X(cublasDgemm)
#define DECENTRAIN_CUBLASLT_FUNCTIONS(X)                                                                    \
  X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtMatmul) X(cublasLtMatmulAlgoGetHeuristic)                  \
  X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)                \
  X(cublasLtMatmulDescGetAttribute) X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)            \
  X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute)
#define DECENTRAIN_CUBLAS_STRING(name) DECENTRAIN_CUBLAS_STRING_(name)
#define DECENTRAIN_CUBLAS_STRING_(name) #name

struct cublas_library {
#define DECENTRAIN_CUBLAS_MEMBER(name) decltype(&::name) name = nullptr;
  DECENTRAIN_CUBLAS_FUNCTIONS(DECENTRAIN_CUBLAS_MEMBER)
  DECENTRAIN_CUBLASLT_FUNCTIONS(DECENTRAIN_CUBLAS_MEMBER)
#undef DECENTRAIN_CUBLAS_MEMBER
  cublasStatus_t (*cublasGemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                 const void*, cudaDataType_t, int, const void*, cudaDataType_t, int, const void*, void*,
                                 cudaDataType_t, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;

  // The file names opened, for messages and the tests.
  std::string cublas_file, cublaslt_file;

  static std::string file_name(const char* stem) {
    return std::string(stem) + ".so." + std::to_string(CUBLAS_VER_MAJOR);
  }

  // `stem` (libcublas, libcublasLt) of the compiled-against major version: as the loader finds
  // it, else in the directory of the CUDA runtime this program uses. Fails naming both places.
  static void* open_file(const char* stem, std::string& opened) {
    const std::string name = file_name(stem);
    if (void* h = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      opened = name;
      return h;
    }
    const std::string first_error = ::dlerror();
    // (A program linked with the shared runtime: dladdr names its file. With the static one it
    // names the program, and its own directory is tried.)
    std::string beside, beside_error;
    Dl_info info{};
    if (::dladdr(reinterpret_cast<const void*>(&::cudaGetDeviceCount), &info) != 0 && info.dli_fname) {
      beside = info.dli_fname;
      beside = beside.substr(0, beside.find_last_of('/') + 1) + name;
      if (void* h = ::dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL)) {
        opened = beside;
        return h;
      }
      beside_error = ::dlerror();
    }
    decentrain::detail::fail("cannot open ", name, " (cuBLAS of CUDA ", CUBLAS_VER_MAJOR, ", which this program was "
                             "compiled against): ", first_error, beside.empty() ? "" : "; nor beside the CUDA runtime: " + beside_error,
                             ". Put the CUDA toolkit's library directory on LD_LIBRARY_PATH");
  }

  static void* symbol(void* file, const char* name, const std::string& file_name) {
    void* f = ::dlsym(file, name);
    decentrain::detail::check(f != nullptr, "cuBLAS: ", file_name, " has no ", name,
                              " (a library of another version than the headers this program was compiled with?)");
    return f;
  }

  static cublas_library open() {
    cublas_library lib;
    void* blas = open_file("libcublas", lib.cublas_file);
    void* lt = open_file("libcublasLt", lib.cublaslt_file);  // (cuBLAS loaded its own: this is that one)
#define DECENTRAIN_CUBLAS_LOOKUP(name) \
  lib.name = reinterpret_cast<decltype(lib.name)>(symbol(blas, DECENTRAIN_CUBLAS_STRING(name), lib.cublas_file));
#define DECENTRAIN_CUBLASLT_LOOKUP(name) \
  lib.name = reinterpret_cast<decltype(lib.name)>(symbol(lt, DECENTRAIN_CUBLAS_STRING(name), lib.cublaslt_file));
    DECENTRAIN_CUBLAS_FUNCTIONS(DECENTRAIN_CUBLAS_LOOKUP)
    DECENTRAIN_CUBLASLT_FUNCTIONS(DECENTRAIN_CUBLASLT_LOOKUP)
    DECENTRAIN_CUBLAS_LOOKUP(cublasGemmEx)
#undef DECENTRAIN_CUBLAS_LOOKUP
#undef DECENTRAIN_CUBLASLT_LOOKUP
    return lib;  // (never closed: handles are destroyed at thread exit, after main)
  }
};

// Opened once per program, on first use (a failure is thrown to each caller). Never destroyed: a
// thread's handles are destroyed when it exits, which may be after static destruction.
inline const cublas_library& cublas() {
  static const cublas_library& lib = *new cublas_library(cublas_library::open());
  return lib;
}

}  // namespace decentrain::kernels::cuda_detail

#endif
