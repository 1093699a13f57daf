// GEMM on the GPU through cuBLAS (opened at the first call: cublas_library.hpp). decentrain is
// row-major and cuBLAS column-major: a row-major C = op(A) op(B) is the column-major
// C^T = op(B)^T op(A)^T, so the operands are passed swapped and nothing is transposed in memory.
// Pure f32 math (no TF32), so results match the CPU to float rounding.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <algorithm>
#include <cstdint>
#include <map>
#include <type_traits>

#include "decentrain/core/cuda_runtime.cuh"
#include "decentrain/core/device.hpp"
#include "decentrain/core/dtype.hpp"
#include "decentrain/kernels/cpu/gemm.hpp"
#include "decentrain/kernels/cuda/cublas_library.hpp"

namespace decentrain::kernels {

namespace cuda_detail {

inline const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "unknown cuBLAS status";
  }
}

inline void cublas_check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    decentrain::detail::fail("cuBLAS error in ", what, ": ", cublas_status_name(status));
}

// One handle per host thread and device (a handle is not safe to share between threads),
// bound to the thread's current stream before each call.
class cublas_handles {
 public:
  static cublasHandle_t get() {
    thread_local cublas_handles handles;
    const int device = cuda_rt::current_device();
    auto it = handles.by_device_.find(device);
    if (it == handles.by_device_.end()) {
      cublasHandle_t h = nullptr;
      cublas_check(cublas().cublasCreate(&h), "cublasCreate");
      it = handles.by_device_.emplace(device, h).first;
    }
    cublas_check(cublas().cublasSetStream(it->second, cuda_rt::current_stream()), "cublasSetStream");
    return it->second;
  }
  ~cublas_handles() {
    for (auto& [device, h] : by_device_) (void)cublas().cublasDestroy(h);
  }

 private:
  std::map<int, cublasHandle_t> by_device_;
};

inline cublasStatus_t gemm_call(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                int k, const float* alpha, const float* a, int lda, const float* b, int ldb,
                                const float* beta, float* c, int ldc) {
  return cublas().cublasSgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline cublasStatus_t gemm_call(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                int k, const double* alpha, const double* a, int lda, const double* b, int ldb,
                                const double* beta, double* c, int ldc) {
  return cublas().cublasDgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline int as_int(std::int64_t v, const char* what) {
  decentrain::detail::check(v <= std::int64_t{2147483647}, "cuda gemm: ", what, " = ", v,
                            " is above cuBLAS's 32-bit limit");
  return static_cast<int>(v);
}

}  // namespace cuda_detail

// Row-major c = alpha * op(a) op(b) + beta * c with leading dimensions in elements, as the CPU
// gemm. The backend argument exists for the CPU's choices and must be `automatic` here.
template <class T>
void gemm(cuda, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc,
          gemm_backend backend = gemm_backend::automatic) {
  decentrain::detail::check(backend == gemm_backend::automatic,
                            "gemm: on dt::cuda only the automatic backend (cuBLAS) exists");
  decentrain::detail::check(m >= 0 && n >= 0 && k >= 0, "gemm: negative size m=", m, " n=", n, " k=", k);
  decentrain::detail::check(lda >= std::max<std::int64_t>(1, trans_a ? m : k) &&
                                ldb >= std::max<std::int64_t>(1, trans_b ? k : n) &&
                                ldc >= std::max<std::int64_t>(1, n),
                            "gemm: leading dimension too small (lda=", lda, ", ldb=", ldb, ", ldc=", ldc,
                            " for m=", m, " n=", n, " k=", k, ")");
  if (m == 0 || n == 0) return;
  using cuda_detail::as_int;
  // Column-major view: C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m).
  cuda_detail::cublas_check(
      cuda_detail::gemm_call(cuda_detail::cublas_handles::get(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                             trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(n, "n"), as_int(m, "m"),
                             as_int(k, "k"), &alpha, b, as_int(ldb, "ldb"), a, as_int(lda, "lda"), &beta, c,
                             as_int(ldc, "ldc")),
      "cublas gemm");
}

// Mixed precision: bf16 operands, f32 accumulation (tensor cores), the result stored as f32 or
// rounded once to bf16 (Out).
template <class Out>
  requires(std::is_same_v<Out, float> || std::is_same_v<Out, bf16>)
void gemm(cuda, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const bf16* a, std::int64_t lda, const bf16* b, std::int64_t ldb, float beta, Out* c, std::int64_t ldc,
          gemm_backend backend = gemm_backend::automatic) {
  decentrain::detail::check(backend == gemm_backend::automatic,
                            "gemm: on dt::cuda only the automatic backend (cuBLAS) exists");
  decentrain::detail::check(m >= 0 && n >= 0 && k >= 0, "gemm: negative size m=", m, " n=", n, " k=", k);
  decentrain::detail::check(lda >= std::max<std::int64_t>(1, trans_a ? m : k) &&
                                ldb >= std::max<std::int64_t>(1, trans_b ? k : n) &&
                                ldc >= std::max<std::int64_t>(1, n),
                            "gemm: leading dimension too small (lda=", lda, ", ldb=", ldb, ", ldc=", ldc,
                            " for m=", m, " n=", n, " k=", k, ")");
  if (m == 0 || n == 0) return;
  static_assert(sizeof(bf16) == 2, "dt::bf16 must have __nv_bfloat16's layout");
  using cuda_detail::as_int;
  constexpr cudaDataType_t out_type = std::is_same_v<Out, bf16> ? CUDA_R_16BF : CUDA_R_32F;
  cuda_detail::cublas_check(
      cuda_detail::cublas().cublasGemmEx(cuda_detail::cublas_handles::get(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                   trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(n, "n"), as_int(m, "m"), as_int(k, "k"), &alpha, b,
                   CUDA_R_16BF, as_int(ldb, "ldb"), a, CUDA_R_16BF, as_int(lda, "lda"), &beta, c, out_type,
                   as_int(ldc, "ldc"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      std::is_same_v<Out, bf16> ? "cublasGemmEx (bf16 x bf16 -> bf16)" : "cublasGemmEx (bf16 x bf16 -> f32)");
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
