// A linear layer's forward pass on the GPU as one cuBLASLt matmul whose epilogue adds the bias
// and, for the MLP's first layer, applies GELU (tanh form) while keeping the pre-activation for
// the backward pass: the output is written once instead of three times (GEMM, bias, GELU). The
// MLP's backward uses the matching DGELU epilogue: the second layer's input gradient is
// multiplied by gelu' before it is written (linear_backward_through_gelu).
// Row-major out = x w is the column-major out^T = w^T x^T, so w is cuBLASLt's A and x its B,
// and the bias runs along D's rows, as cuBLASLt's bias epilogues expect. Where cuBLASLt offers
// no algorithm (or f64, which it does not fuse), the same result comes from cuBLAS, a bias
// kernel and the GELU kernel.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_CUDA
#include <algorithm>
#include <compare>
#include <cstdint>
#include <cstddef>
#include <map>
#include <optional>
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
      cublas_check(cublas().cublasLtCreate(&h), "cublasLtCreate");
      it = handles.by_device_.emplace(device, h).first;
    }
    return it->second;
  }
  ~cublaslt_handles() {
    for (auto& [device, h] : by_device_) (void)cublas().cublasLtDestroy(h);
  }

 private:
  std::map<int, cublasLtHandle_t> by_device_;
};

// Owners for cuBLASLt's descriptors, so an error thrown midway leaks none.
struct lt_matmul_desc {
  cublasLtMatmulDesc_t desc = nullptr;
  ~lt_matmul_desc() { if (desc) (void)cublas().cublasLtMatmulDescDestroy(desc); }
};
struct lt_layout {
  cublasLtMatrixLayout_t layout = nullptr;
  ~lt_layout() { if (layout) (void)cublas().cublasLtMatrixLayoutDestroy(layout); }
};
struct lt_preference {
  cublasLtMatmulPreference_t pref = nullptr;
  ~lt_preference() { if (pref) (void)cublas().cublasLtMatmulPreferenceDestroy(pref); }
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

// The pointer's alignment in bytes, up to 256 (what cuBLASLt's heuristic assumes unless told).
inline std::uint32_t lt_alignment(const void* p) {
  std::uint32_t a = 256;
  while (a > 1 && reinterpret_cast<std::uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

// What cuBLASLt's heuristic is asked about: the device, the epilogue, types, transposes, sizes
// and the alignment of every pointer it assumes (an epilogue's own pointers included).
struct lt_problem {
  int device, epilogue, in_type, out_type;
  bool trans_a;
  std::uint64_t M, N, K;
  std::uint32_t align_a, align_b, align_d, align_bias, align_aux;
  std::int64_t aux_ld;
  auto operator<=>(const lt_problem&) const = default;
};

// D = op(A) op(B) in cuBLASLt's column-major terms (A is M x K after op, B is K x N, D is M x N,
// leading dimensions as stored), with the epilogue `op` already describes; false when cuBLASLt
// offers no algorithm for it (nothing has been written then).
inline bool lt_matmul(lt_matmul_desc& op, cudaDataType_t in_type, cudaDataType_t out_type, bool trans_a,
                      std::uint64_t M, std::uint64_t N, std::uint64_t K, const void* A, const void* B, void* D) {
  const cublasOperation_t transa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, transb = CUBLAS_OP_N;
  cublas_check(cublas().cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa),
               "cublasLtMatmulDescSetAttribute (transa)");
  cublas_check(cublas().cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb),
               "cublasLtMatmulDescSetAttribute (transb)");
  lt_layout a, b, d;  // layouts of the stored matrices: a transposed A is stored K x M
  const auto lda = static_cast<std::int64_t>(trans_a ? K : M);
  cublas_check(cublas().cublasLtMatrixLayoutCreate(&a.layout, in_type, trans_a ? K : M, trans_a ? M : K, lda), "cublasLtMatrixLayoutCreate (A)");
  cublas_check(cublas().cublasLtMatrixLayoutCreate(&b.layout, in_type, K, N, static_cast<std::int64_t>(K)), "cublasLtMatrixLayoutCreate (B)");
  cublas_check(cublas().cublasLtMatrixLayoutCreate(&d.layout, out_type, M, N, static_cast<std::int64_t>(M)), "cublasLtMatrixLayoutCreate (D)");
  lt_preference pref;
  cublas_check(cublas().cublasLtMatmulPreferenceCreate(&pref.pref), "cublasLtMatmulPreferenceCreate");
  const std::size_t workspace_bytes = lt_workspace_bytes;
  cublas_check(cublas().cublasLtMatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                    sizeof workspace_bytes),
               "cublasLtMatmulPreferenceSetAttribute (workspace)");
  // The heuristic assumes 256-byte aligned matrices unless told otherwise; views can start
  // anywhere, so it is told the alignment each pointer really has (as PyTorch does).
  const std::uint32_t align_a = lt_alignment(A), align_b = lt_alignment(B), align_d = lt_alignment(D);
  cublas_check(cublas().cublasLtMatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a),
               "cublasLtMatmulPreferenceSetAttribute (alignment of A)");
  cublas_check(cublas().cublasLtMatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b),
               "cublasLtMatmulPreferenceSetAttribute (alignment of B)");
  cublas_check(cublas().cublasLtMatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof align_d),
               "cublasLtMatmulPreferenceSetAttribute (alignment of C)");
  cublas_check(cublas().cublasLtMatmulPreferenceSetAttribute(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof align_d),
               "cublasLtMatmulPreferenceSetAttribute (alignment of D)");
  const auto handle = cublaslt_handles::get();
  // The heuristic's answer depends only on the problem, so it is asked once per problem and host
  // thread: a step repeats the same few dozen, and each query costs microseconds of host time.
  cublasLtEpilogue_t epilogue{};
  const void *bias = nullptr, *aux = nullptr;
  std::int64_t aux_ld = 0;
  std::size_t written = 0;
  cublas_check(cublas().cublasLtMatmulDescGetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue, &written),
               "cublasLtMatmulDescGetAttribute (epilogue)");
  cublas_check(cublas().cublasLtMatmulDescGetAttribute(op.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias, &written),
               "cublasLtMatmulDescGetAttribute (bias)");
  cublas_check(cublas().cublasLtMatmulDescGetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux, &written),
               "cublasLtMatmulDescGetAttribute (aux pointer)");
  cublas_check(cublas().cublasLtMatmulDescGetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld, &written),
               "cublasLtMatmulDescGetAttribute (aux ld)");
  const lt_problem problem{cuda_rt::current_device(), static_cast<int>(epilogue), static_cast<int>(in_type),
                           static_cast<int>(out_type), trans_a, M, N, K, align_a, align_b, align_d,
                           bias ? lt_alignment(bias) : 0u, aux ? lt_alignment(aux) : 0u, aux_ld};
  thread_local std::map<lt_problem, std::optional<cublasLtMatmulHeuristicResult_t>> answers;
  auto it = answers.find(problem);
  if (it == answers.end()) {
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const bool ok = cublas().cublasLtMatmulAlgoGetHeuristic(handle, op.desc, a.layout, b.layout, d.layout, d.layout, pref.pref, 1,
                                                   &result, &found) == CUBLAS_STATUS_SUCCESS && found > 0;
    it = answers.emplace(problem, ok ? std::optional(result) : std::nullopt).first;
  }
  if (!it->second) return false;
  const cublasLtMatmulHeuristicResult_t& heuristic = *it->second;
  scratch<unsigned char> workspace(static_cast<std::int64_t>(std::max<std::size_t>(heuristic.workspaceSize, 1)));
  const float one = 1.0f, zero = 0.0f;
  cublas_check(cublas().cublasLtMatmul(handle, op.desc, &one, A, a.layout, B, b.layout, &zero, D, d.layout, D, d.layout,
                              &heuristic.algo, workspace.get(), heuristic.workspaceSize, cuda_rt::current_stream()),
               "cublasLtMatmul");
  return true;
}

// A matmul descriptor (f32 accumulation and scale) with `epilogue`, and, when `aux` is given,
// that matrix as the epilogue's auxiliary input or output with leading dimension `aux_ld`.
inline void lt_describe(lt_matmul_desc& op, cublasLtEpilogue_t epilogue, const void* bias, const void* aux, std::int64_t aux_ld) {
  cublas_check(cublas().cublasLtMatmulDescCreate(&op.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  cublas_check(cublas().cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
               "cublasLtMatmulDescSetAttribute (epilogue)");
  if (bias)
    cublas_check(cublas().cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
                 "cublasLtMatmulDescSetAttribute (bias)");
  if (aux) {
    cublas_check(cublas().cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux),
                 "cublasLtMatmulDescSetAttribute (aux pointer)");
    cublas_check(cublas().cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld),
                 "cublasLtMatmulDescSetAttribute (aux ld)");
  }
}

// out or pre = x w + bias through cuBLASLt, GELU fused when `pre` is given; false when
// cuBLASLt has no algorithm for this case (nothing has been written then). The bias, out and
// pre share Out's type (cuBLASLt's default for the bias and the auxiliary output).
template <class In, class Out>
bool lt_linear(std::int64_t m, std::int64_t n, std::int64_t k, const In* x, const In* w, const Out* bias, Out* out,
               Out* pre) {
  // The GELU epilogue's auxiliary output wants a leading dimension that is a multiple of 8. The
  // epilogue's own pointers have no alignment preference to state; below 16 bytes (never the
  // case for tensors of their own) they take the unfused path, to be safe.
  if (pre && (n % 8 != 0 || lt_alignment(pre) < 16)) return false;
  if (bias && lt_alignment(bias) < 16) return false;
  const cublasLtEpilogue_t epilogue = bias ? (pre ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                           : (pre ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_DEFAULT);
  lt_matmul_desc op;
  lt_describe(op, epilogue, bias, pre, n);
  // column-major: A = w^T (n x k), B = x^T (k x m), D = out^T (n x m); with GELU, D is
  // gelu(pre) and the epilogue writes pre itself.
  return lt_matmul(op, lt_type<In>(), lt_type<Out>(), false, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(m),
                   static_cast<std::uint64_t>(k), w, x, out);
}

// d_pre = (g w^T) * gelu'(pre) through cuBLASLt's DGELU epilogue (see
// linear_backward_through_gelu); false when cuBLASLt has no algorithm for it.
template <class T>
bool lt_linear_backward_through_gelu(std::int64_t m, std::int64_t n, std::int64_t k, const T* g, const T* w,
                                     const T* pre, T* d_pre) {
  if (n % 8 != 0 || lt_alignment(pre) < 16) return false;
  lt_matmul_desc op;
  lt_describe(op, CUBLASLT_EPILOGUE_DGELU, nullptr, pre, n);
  // column-major: d_pre^T (n x m) = w (stored k x n, so transposed) times g^T (k x m); pre^T
  // has d_pre^T's layout.
  return lt_matmul(op, lt_type<T>(), lt_type<T>(), true, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(m),
                   static_cast<std::uint64_t>(k), w, g, d_pre);
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

// The gradient reaching `pre` through gelu(pre) w, given the gradient g of that product:
// d_pre = (g w^T) * gelu'(pre). Row-major, contiguous: g (m, k), w (n, k), pre and d_pre (m, n).
// One cuBLASLt matmul whose DGELU epilogue applies gelu' before the product is written (f32 and
// bf16), so g w^T never reaches memory; otherwise the GEMM into a scratch buffer, then the GELU
// backward kernel.
template <class T>
void linear_backward_through_gelu(cuda, std::int64_t m, std::int64_t n, std::int64_t k, const T* g, const T* w,
                                  const T* pre, T* d_pre) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    if (k > 0 && cuda_detail::lt_linear_backward_through_gelu<T>(m, n, k, g, w, pre, d_pre)) return;
  }
  cuda_detail::scratch<T> product(m * n);
  using Scalar = compute_type_t<T>;
  gemm(cuda{}, false, true, m, n, k, Scalar(1), g, k, w, k, Scalar(0), product.get(), n);
  gelu_backward(cuda{}, d_pre, pre, product.get(), m * n);
}

}  // namespace decentrain::kernels

#endif  // DECENTRAIN_HAS_CUDA
