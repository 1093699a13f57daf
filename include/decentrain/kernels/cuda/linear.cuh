// A linear layer's forward pass on the GPU as one cuBLASLt matmul whose epilogue adds the bias
// and, for the MLP's first layer, applies GELU (tanh form) while keeping the pre-activation for
// the backward pass: the output is written once instead of three times (GEMM, bias, GELU).
// Row-major out = x w is the column-major out^T = w^T x^T, so w is cuBLASLt's A and x its B,
// and the bias runs along D's rows, as cuBLASLt's bias epilogues expect. Where cuBLASLt offers
// no algorithm (or f64, which it does not fuse), the same result comes from cuBLAS, a bias
// kernel and the GELU kernel.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <cstddef>
#include <map>
#include <type_traits>

#include "decentrain/kernels/cuda/activation.cuh"
#include "decentrain/kernels/cuda/common.cuh"
#include "decentrain/kernels/cuda/gemm.cuh"

namespace decentrain::kernels {

namespace cuda_detail {

// One cuBLASLt handle per host thread and device, as for cuBLAS.
class cublaslt_handles {
 public:
  static cublasLtHandle_t get() {
    thread_local cublaslt_handles handles;
    const int device = cuda_rt::current_device();
    auto it = handles.by_device_.find(device);
    if (it == handles.by_device_.end()) {
      cublasLtHandle_t h = nullptr;
      cublas_check(cublasLtCreate(&h), "cublasLtCreate");
      it = handles.by_device_.emplace(device, h).first;
    }
    return it->second;
  }
  ~cublaslt_handles() {
    for (auto& [device, h] : by_device_) (void)cublasLtDestroy(h);
  }

 private:
  std::map<int, cublasLtHandle_t> by_device_;
};

// Owners for cuBLASLt's descriptors, so an error thrown midway leaks none.
struct lt_matmul_desc {
  cublasLtMatmulDesc_t desc = nullptr;
  ~lt_matmul_desc() { if (desc) (void)cublasLtMatmulDescDestroy(desc); }
};
struct lt_layout {
  cublasLtMatrixLayout_t layout = nullptr;
  ~lt_layout() { if (layout) (void)cublasLtMatrixLayoutDestroy(layout); }
};
struct lt_preference {
  cublasLtMatmulPreference_t pref = nullptr;
  ~lt_preference() { if (pref) (void)cublasLtMatmulPreferenceDestroy(pref); }
};

// Hopper's cuBLASLt kernels want up to 32 MiB of workspace (as llm.c gives them).
inline constexpr std::size_t lt_workspace_bytes = std::size_t{32} << 20;

template <class T>
__global__ void bias_rows_kernel(T* out, const T* bias, std::int64_t m, std::int64_t n) {
  for (std::int64_t i = thread_index(); i < m * n; i += thread_count()) out[i] = bias[i % n];
}

template <class In>
constexpr cudaDataType_t lt_type() {
  if constexpr (std::is_same_v<In, bf16>) return CUDA_R_16BF;
  else return CUDA_R_32F;
}

// out or pre = x w + bias through cuBLASLt, GELU fused when `pre` is given; false when
// cuBLASLt has no algorithm for this case (nothing has been written then). The bias, out and
// pre share Out's type (cuBLASLt's default for the bias and the auxiliary output).
template <class In, class Out>
bool lt_linear(std::int64_t m, std::int64_t n, std::int64_t k, const In* x, const In* w, const Out* bias, Out* out,
               Out* pre) {
  // The GELU epilogue's auxiliary output wants a leading dimension that is a multiple of 8.
  if (pre && n % 8 != 0) return false;
  const auto M = static_cast<std::uint64_t>(n), N = static_cast<std::uint64_t>(m), K = static_cast<std::uint64_t>(k);
  lt_matmul_desc op;
  cublas_check(cublasLtMatmulDescCreate(&op.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t no_transpose = CUBLAS_OP_N;
  cublas_check(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_TRANSA, &no_transpose, sizeof no_transpose),
               "cublasLtMatmulDescSetAttribute (transa)");
  cublas_check(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_transpose, sizeof no_transpose),
               "cublasLtMatmulDescSetAttribute (transb)");
  cublasLtEpilogue_t epilogue = bias ? (pre ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                     : (pre ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_DEFAULT);
  cublas_check(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
               "cublasLtMatmulDescSetAttribute (epilogue)");
  if (bias)
    cublas_check(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
                 "cublasLtMatmulDescSetAttribute (bias)");
  if (pre) {
    const std::int64_t aux_ld = n;
    cublas_check(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &pre, sizeof pre),
                 "cublasLtMatmulDescSetAttribute (aux pointer)");
    cublas_check(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld),
                 "cublasLtMatmulDescSetAttribute (aux ld)");
  }
  lt_layout a, b, d;  // column-major: A = w^T (n x k), B = x^T (k x m), D = out^T (n x m)
  cublas_check(cublasLtMatrixLayoutCreate(&a.layout, lt_type<In>(), M, K, static_cast<std::int64_t>(M)), "cublasLtMatrixLayoutCreate (A)");
  cublas_check(cublasLtMatrixLayoutCreate(&b.layout, lt_type<In>(), K, N, static_cast<std::int64_t>(K)), "cublasLtMatrixLayoutCreate (B)");
  cublas_check(cublasLtMatrixLayoutCreate(&d.layout, lt_type<Out>(), M, N, static_cast<std::int64_t>(M)), "cublasLtMatrixLayoutCreate (D)");
  lt_preference pref;
  cublas_check(cublasLtMatmulPreferenceCreate(&pref.pref), "cublasLtMatmulPreferenceCreate");
  const std::size_t workspace_bytes = lt_workspace_bytes;
  cublas_check(cublasLtMatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                    sizeof workspace_bytes),
               "cublasLtMatmulPreferenceSetAttribute (workspace)");
  // The heuristic assumes 256-byte aligned matrices unless told otherwise; views can start
  // anywhere, so it is told the alignment each pointer really has (as PyTorch does).
  const auto alignment = [](const void* p) {
    std::uint32_t a = 256;
    while (a > 1 && reinterpret_cast<std::uintptr_t>(p) % a != 0) a /= 2;
    return a;
  };
  const std::uint32_t align_a = alignment(w), align_b = alignment(x), align_d = alignment(out);
  cublas_check(cublasLtMatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a),
               "cublasLtMatmulPreferenceSetAttribute (alignment of A)");
  cublas_check(cublasLtMatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b),
               "cublasLtMatmulPreferenceSetAttribute (alignment of B)");
  cublas_check(cublasLtMatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof align_d),
               "cublasLtMatmulPreferenceSetAttribute (alignment of C)");
  cublas_check(cublasLtMatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof align_d),
               "cublasLtMatmulPreferenceSetAttribute (alignment of D)");
  // The epilogue's own pointers (bias, pre-activation) have no alignment preference to state;
  // below 16 bytes (never the case for tensors of their own) they take the unfused path, to be safe.
  if ((bias && alignment(bias) < 16) || (pre && alignment(pre) < 16)) return false;
  const auto handle = cublaslt_handles::get();
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(handle, op.desc, a.layout, b.layout, d.layout, d.layout, pref.pref, 1, &heuristic,
                                     &found) != CUBLAS_STATUS_SUCCESS ||
      found == 0)
    return false;
  scratch<unsigned char> workspace(static_cast<std::int64_t>(std::max<std::size_t>(heuristic.workspaceSize, 1)));
  const float one = 1.0f, zero = 0.0f;
  // D is the output (gelu(pre) with GELU; the epilogue writes pre itself).
  cublas_check(cublasLtMatmul(handle, op.desc, &one, w, a.layout, x, b.layout, &zero, out, d.layout, out, d.layout,
                              &heuristic.algo, workspace.get(), heuristic.workspaceSize, cuda_rt::current_stream()),
               "cublasLtMatmul");
  return true;
}

}  // namespace cuda_detail

// Row-major, contiguous: x (m, k), w (k, n), bias (n) or null, out (m, n); `pre` (m, n) or null:
// when given, pre = x w + bias and out = gelu(pre). x and w are f32, f64, or bf16 (then the
// bias and results are f32 or bf16: tensor-core products, f32 accumulation, bias and GELU
// applied in f32 before the results are rounded).
template <class In, class T>
void linear_forward(cuda, std::int64_t m, std::int64_t n, std::int64_t k, const In* x, const In* w, const T* bias,
                    T* out, T* pre) {
  static_assert(std::is_same_v<In, T> || (std::is_same_v<In, bf16> && std::is_same_v<T, float>),
                "linear_forward: operands and results of one type, or bf16 operands with f32 results");
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    if (k > 0 && cuda_detail::lt_linear<In, T>(m, n, k, x, w, bias, out, pre)) return;
  }
  T* dst = pre ? pre : out;
  if (bias) {
    cuda_detail::bias_rows_kernel<<<cuda_rt::blocks_for(m * n), cuda_rt::threads_per_block, 0, cuda_rt::current_stream()>>>(
        dst, bias, m, n);
    cuda_rt::check_launch("bias_rows_kernel");
  }
  using Scalar = compute_type_t<T>;
  gemm(cuda{}, false, false, m, n, k, Scalar(1), x, k, w, n, bias ? Scalar(1) : Scalar(0), dst, n);
  if (pre) gelu_forward(cuda{}, out, pre, m * n);
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
