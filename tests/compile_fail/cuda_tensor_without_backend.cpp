// Must NOT compile: a dt::cuda tensor in a build without the CUDA backend. CTest expects the
// compiler to stop with the library's static_assert message, not a page of template errors.
#include <decentrain/core/tensor.hpp>

int main() {
  auto t = decentrain::tensor<decentrain::cuda>::empty(decentrain::shape{2});
  return static_cast<int>(t.numel());
}
