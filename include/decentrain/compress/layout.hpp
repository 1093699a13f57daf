// What a flat payload is made of: the tensors a policy packed into it, in order, each seen as a
// matrix (rows = the product of all but the last dimension, cols = the last; a vector is one
// row). Elementwise codecs ignore it; a codec that works per matrix (powersgd) takes it with
//   void set_layout(const layout&)
// and the communication policies hand it over in start() (comm::prepare_codec). Also here: the
// reference values a payload updates, for codecs that weigh each value against them.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "decentrain/detail/error.hpp"

namespace decentrain::compress {

struct matrix_piece {
  std::size_t offset = 0;  // in values, from the payload's start
  std::size_t rows = 0, cols = 0;
  std::size_t size() const { return rows * cols; }
  bool operator==(const matrix_piece&) const = default;
};
using layout = std::vector<matrix_piece>;

// Hands the layout to a codec that takes one (wrappers pass it on to what they wrap).
template <class Codec>
void set_layout(Codec& codec, const layout& l) {
  if constexpr (requires { codec.set_layout(l); }) codec.set_layout(l);
}

// The values the payload changes (DiLoCo: its global parameters) and the inner learning rate
// over its peak, for a codec that judges each value against them (significance, Gaia's filter)
// with
//   void set_reference(std::span<const float> reference, double lr_scale)
// (wrappers pass them on to what they wrap). The communication policy calls it before each payload.
template <class Codec>
void set_reference(Codec& codec, std::span<const float> reference, double lr_scale) {
  if constexpr (requires { codec.set_reference(reference, lr_scale); }) codec.set_reference(reference, lr_scale);
}

// The pieces must tile a payload of n values, in order, without gaps.
inline void check_layout(const layout& l, std::size_t n, const char* who) {
  std::size_t at = 0;
  for (std::size_t i = 0; i < l.size(); ++i) {
    decentrain::detail::check(l[i].offset == at, who, ": layout piece ", i, " starts at value ", l[i].offset, ", expected ", at,
                              " (pieces must follow each other)");
    at += l[i].size();
  }
  decentrain::detail::check(at == n, who, ": the layout covers ", at, " values, the payload has ", n);
}

}  // namespace decentrain::compress
