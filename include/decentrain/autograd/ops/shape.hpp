// Differentiable shape ops: reshape, transpose, slice, split and concat. Forward passes are
// views where the layout allows; backward passes route gradients to the right elements.
#pragma once

#include <initializer_list>
#include <numeric>
#include <vector>

#include "decentrain/autograd/math.hpp"
#include "decentrain/autograd/variable.hpp"

namespace decentrain {

template <class Device>
var<Device> reshape(const var<Device>& x, std::vector<std::int64_t> sizes) {
  return record<Device>("reshape", x.value().reshape(std::move(sizes)), {x},
                        [](const tensor<Device>& g, node<Device>& n) {
                          n.accumulate(0, g.reshape(n.input(0).shape()));
                        });
}

template <class Device>
var<Device> transpose(const var<Device>& x, std::int64_t dim0, std::int64_t dim1) {
  return record<Device>("transpose", x.value().transpose(dim0, dim1), {x},
                        [dim0, dim1](const tensor<Device>& g, node<Device>& n) {
                          n.accumulate(0, g.transpose(dim0, dim1));
                        });
}

// Elements [start, stop) along `axis`.
template <class Device>
var<Device> slice(const var<Device>& x, std::int64_t axis, std::int64_t start, std::int64_t stop) {
  return record<Device>("slice", x.value().slice(axis, start, stop), {x},
                        [axis, start, stop](const tensor<Device>& g, node<Device>& n) {
                          auto full = zeros<Device>(n.input(0).shape(), g.dtype());
                          full.slice(axis, start, stop).copy_from(g);
                          n.accumulate(0, std::move(full));
                        });
}

// Consecutive pieces along `axis` with the given sizes (which must add up to the dim).
template <class Device>
std::vector<var<Device>> split(const var<Device>& x, const std::vector<std::int64_t>& sizes,
                               std::int64_t axis) {
  x.value().split(sizes, axis);  // validates sizes with a clear message
  std::vector<var<Device>> parts;
  std::int64_t start = 0;
  for (auto s : sizes) {
    parts.push_back(slice(x, axis, start, start + s));
    start += s;
  }
  return parts;
}

// Joins tensors of equal shape except along `axis`.
template <class Device>
var<Device> concat(const std::vector<var<Device>>& xs, std::int64_t axis) {
  detail::check(!xs.empty(), "concat: needs at least one input");
  const auto& first = xs.front().shape();
  const auto d = first.normalize_axis(axis);
  std::vector<std::int64_t> sizes;
  auto out_sizes = first.sizes();
  out_sizes[d] = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const auto& s = xs[i].shape();
    detail::check_same_dtype("concat", xs[0].value(), xs[i].value());
    bool ok = s.rank() == first.rank();
    for (std::size_t k = 0; ok && k < s.rank(); ++k) ok = k == d || s[k] == first[k];
    detail::check(ok, "concat: input ", i, " has shape ", s, " but input 0 has shape ", first,
                  "; all dims except ", axis, " must match");
    sizes.push_back(s[d]);
    out_sizes[d] += s[d];
  }
  auto out = tensor<Device>::empty(shape(out_sizes), xs[0].dtype());
  std::int64_t start = 0;
  for (const auto& x : xs) {
    out.slice(static_cast<std::int64_t>(d), start, start + x.shape()[d]).copy_from(x.value());
    start += x.shape()[d];
  }
  const auto ax = static_cast<std::int64_t>(d);
  return record<Device>("concat", out, xs, [sizes, ax](const tensor<Device>& g, node<Device>& n) {
    std::int64_t begin = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      n.accumulate(i, g.slice(ax, begin, begin + sizes[i]));
      begin += sizes[i];
    }
  });
}

template <class Device>
var<Device> concat(std::initializer_list<var<Device>> xs, std::int64_t axis) {
  return concat(std::vector<var<Device>>(xs), axis);
}

}  // namespace decentrain
