// kernels/cuda/cublas_library.hpp: cuBLAS is opened at the first GEMM, not when a program linked
// with decentrain::cuda starts. Compiled by g++ against the toolkit's headers: no GPU needed.
#include <decentrain/kernels/cuda/cublas_library.hpp>

#include <catch2/catch.hpp>

#include <fstream>
#include <string>

namespace dt = decentrain;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;

namespace {

// Whether a file whose name holds `name` is mapped into this process.
bool cublas_test_mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(name) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("cuBLAS is opened on first use: a program linked with decentrain::cuda starts without it", "[cuda]") {
  // Linked, the dynamic loader would have mapped both (and run cuBLASLt's initialisers) before main.
  const bool before_lt = cublas_test_mapped("libcublasLt.so"), before_blas = cublas_test_mapped("libcublas.so");
  const auto& lib = dt::kernels::cuda_detail::cublas();
  CHECK_FALSE(before_lt);
  CHECK_FALSE(before_blas);
  CHECK(cublas_test_mapped("libcublasLt.so"));
  CHECK(cublas_test_mapped("libcublas.so"));
  const std::string major = ".so." + std::to_string(CUBLAS_VER_MAJOR);
  CHECK_THAT(lib.cublas_file, EndsWith(major));
  CHECK_THAT(lib.cublaslt_file, EndsWith(major));
  int missing = 0;
#define DECENTRAIN_TEST_PRESENT(name) missing += lib.name == nullptr;
  DECENTRAIN_CUBLAS_FUNCTIONS(DECENTRAIN_TEST_PRESENT)
  DECENTRAIN_CUBLASLT_FUNCTIONS(DECENTRAIN_TEST_PRESENT)
  DECENTRAIN_TEST_PRESENT(cublasGemmEx)
#undef DECENTRAIN_TEST_PRESENT
  CHECK(missing == 0);
  // A call through the table (a layout is host memory: no GPU needed).
  cublasLtMatrixLayout_t layout = nullptr;
  REQUIRE(lib.cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 4, 3, 4) == CUBLAS_STATUS_SUCCESS);
  CHECK(layout != nullptr);
  CHECK(lib.cublasLtMatrixLayoutDestroy(layout) == CUBLAS_STATUS_SUCCESS);
  CHECK(&dt::kernels::cuda_detail::cublas() == &lib);  // opened once
}

TEST_CASE("cuBLAS that cannot be found is named, with what to do", "[cuda]") {
  std::string opened;
  CHECK_THROWS_WITH(dt::kernels::cuda_detail::cublas_library::open_file("libdecentrain_no_such_blas", opened),
                    Contains("cannot open libdecentrain_no_such_blas.so." + std::to_string(CUBLAS_VER_MAJOR)) &&
                        Contains("LD_LIBRARY_PATH"));
  CHECK(opened.empty());
}
