// Printing and approximate equality, for tests, debugging and users checking their results.
#pragma once

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "decentrain/core/tensor.hpp"

namespace decentrain {

struct comparison {
  bool close = true;
  double max_abs_diff = 0.0;   // largest |a - b|
  double max_rel_diff = 0.0;   // largest |a - b| / |b| over elements with b != 0
  std::int64_t worst_index = -1;  // flat index of the element furthest outside tolerance
  std::string message;         // empty when close
};

// Elementwise |a - b| <= atol + rtol * |b|, as numpy.allclose; shapes must match.
template <class Device>
comparison compare(const tensor<Device>& a, const tensor<Device>& b, double rtol = 1e-5,
                   double atol = 1e-8) {
  detail::check(a.shape() == b.shape(), "compare: shapes differ: ", a.shape(), " vs ", b.shape());
  const auto va = a.template to_vector<double>(), vb = b.template to_vector<double>();
  comparison out;
  double worst_excess = 0.0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    const double diff = std::abs(va[i] - vb[i]);
    const bool nan_mismatch = std::isnan(va[i]) != std::isnan(vb[i]);
    out.max_abs_diff = std::max(out.max_abs_diff, diff);
    if (vb[i] != 0.0) out.max_rel_diff = std::max(out.max_rel_diff, diff / std::abs(vb[i]));
    const double excess = diff - (atol + rtol * std::abs(vb[i]));
    if (nan_mismatch || excess > 0.0) {
      out.close = false;
      if (nan_mismatch || excess > worst_excess) {
        worst_excess = nan_mismatch ? INFINITY : excess;
        out.worst_index = static_cast<std::int64_t>(i);
      }
    }
  }
  if (!out.close) {
    const auto w = static_cast<std::size_t>(out.worst_index);
    out.message = detail::concat("tensors of shape ", a.shape(), " differ: at flat index ", w,
                                 " got ", va[w], " expected ", vb[w], " (max abs diff ",
                                 out.max_abs_diff, ", rtol ", rtol, ", atol ", atol, ")");
  }
  return out;
}

template <class Device>
bool allclose(const tensor<Device>& a, const tensor<Device>& b, double rtol = 1e-5,
              double atol = 1e-8) {
  return compare(a, b, rtol, atol).close;
}

namespace detail {
inline void print_block(std::ostream& os, const std::vector<double>& v, const shape& s,
                        std::size_t dim, std::int64_t base, std::int64_t stride_of_dim,
                        int indent) {
  constexpr std::int64_t edge = 3;  // elements shown at each end of a long dim
  const std::int64_t n = s[dim];
  const std::int64_t inner = stride_of_dim / n;
  os << '[';
  for (std::int64_t i = 0; i < n; ++i) {
    if (n > 2 * edge && i == edge) {
      os << (dim + 1 == s.rank() ? "..., " : "...,\n" + std::string(static_cast<std::size_t>(indent + 1), ' '));
      i = n - edge - 1;
      continue;
    }
    if (dim + 1 == s.rank()) {
      os << std::setprecision(5) << v[static_cast<std::size_t>(base + i)];
    } else {
      print_block(os, v, s, dim + 1, base + i * inner, inner, indent + 1);
    }
    if (i + 1 < n) os << (dim + 1 == s.rank() ? ", " : ",\n" + std::string(static_cast<std::size_t>(indent + 1), ' '));
  }
  os << ']';
}
}  // namespace detail

template <class Device>
std::ostream& operator<<(std::ostream& os, const tensor<Device>& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  os << "tensor(shape=" << t.shape() << ", dtype=" << dtype_name(t.dtype())
     << ", device=" << Device::name << ")\n";
  const auto values = t.template to_vector<double>();
  if (t.rank() == 0) return os << values[0];
  if (t.numel() == 0) return os << "[]";
  detail::print_block(os, values, t.shape(), 0, 0, t.numel(), 0);
  return os;
}

}  // namespace decentrain
