// Tensor shapes: the sizes of each dimension, with the checks and printing every op needs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"

namespace decentrain {

class shape {
 public:
  shape() = default;
  shape(std::initializer_list<std::int64_t> sizes) : sizes_(sizes) { validate(); }
  explicit shape(std::vector<std::int64_t> sizes) : sizes_(std::move(sizes)) { validate(); }

  std::size_t rank() const { return sizes_.size(); }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto s : sizes_) n *= s;
    return n;
  }
  std::int64_t operator[](std::size_t d) const { return sizes_[d]; }
  std::int64_t& operator[](std::size_t d) { return sizes_[d]; }
  // Size of dim `axis`, where a negative axis counts from the end as in Python.
  std::int64_t size(std::int64_t axis) const { return sizes_[normalize_axis(axis)]; }
  std::int64_t back() const { return sizes_.back(); }
  const std::vector<std::int64_t>& sizes() const { return sizes_; }
  auto begin() const { return sizes_.begin(); }
  auto end() const { return sizes_.end(); }

  std::size_t normalize_axis(std::int64_t axis) const {
    const auto r = static_cast<std::int64_t>(rank());
    detail::check(axis >= -r && axis < r, "axis ", axis, " is out of range for shape ",
                  to_string(), " (expected -", r, " <= axis < ", r, ")");
    return static_cast<std::size_t>(axis < 0 ? axis + r : axis);
  }

  std::string to_string() const {
    std::string out = "(";
    for (std::size_t i = 0; i < sizes_.size(); ++i) {
      if (i) out += ", ";
      out += std::to_string(sizes_[i]);
    }
    if (sizes_.size() == 1) out += ",";
    return out + ")";
  }

  friend bool operator==(const shape&, const shape&) = default;
  friend std::ostream& operator<<(std::ostream& os, const shape& s) { return os << s.to_string(); }

 private:
  // Every stride (a product of trailing sizes, zeros counted as ones) must fit an int64: a shape
  // such as [0, 2^40, 2^40] holds nothing, yet its strides would overflow (found by fuzzing a
  // checkpoint reader).
  void validate() const {
    std::int64_t span = 1;
    for (auto s : sizes_) {
      detail::check(s >= 0, "negative dimension ", s, " in shape ", to_string());
      detail::check(!__builtin_mul_overflow(span, std::max<std::int64_t>(s, 1), &span), "shape ", to_string(),
                    " has more elements than an int64 can count");
    }
  }
  std::vector<std::int64_t> sizes_;
};

// Row-major strides for a contiguous tensor of this shape, in elements.
inline std::vector<std::int64_t> contiguous_strides(const shape& s) {
  std::vector<std::int64_t> strides(s.rank());
  std::int64_t step = 1;
  for (std::size_t d = s.rank(); d-- > 0;) {
    strides[d] = step;
    step *= s[d];
  }
  return strides;
}

// The shape two operands broadcast to under NumPy rules, or an error naming both.
inline shape broadcast_shapes(const shape& a, const shape& b) {
  const std::size_t rank = std::max(a.rank(), b.rank());
  std::vector<std::int64_t> out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const std::int64_t da = i < rank - a.rank() ? 1 : a[i - (rank - a.rank())];
    const std::int64_t db = i < rank - b.rank() ? 1 : b[i - (rank - b.rank())];
    detail::check(da == db || da == 1 || db == 1, "shapes ", a.to_string(), " and ",
                  b.to_string(), " cannot be broadcast together (dim ", i, ": ", da, " vs ", db,
                  ")");
    out[i] = da == 1 ? db : da;
  }
  return shape(std::move(out));
}

}  // namespace decentrain
