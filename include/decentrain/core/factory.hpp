// Creating tensors: constants, ranges, random values from a named rng, and host data.
// Values are produced on the host and copied once, so every device gets the same numbers.
#pragma once

#include <cstdint>
#include <vector>

#include "decentrain/core/rng.hpp"
#include "decentrain/core/tensor.hpp"

namespace decentrain {

template <class Device = cpu>
tensor<Device> full(const shape& s, double value, dtype t = dtype::f32) {
  return tensor<Device>::empty(s, t).fill(value);
}
template <class Device = cpu>
tensor<Device> zeros(const shape& s, dtype t = dtype::f32) {
  return full<Device>(s, 0.0, t);
}
template <class Device = cpu>
tensor<Device> ones(const shape& s, dtype t = dtype::f32) {
  return full<Device>(s, 1.0, t);
}
template <class Device>
tensor<Device> zeros_like(const tensor<Device>& x) {
  return zeros<Device>(x.shape(), x.dtype());
}

// A tensor of shape `s` holding `values` (converted to `t`); the counts must agree.
template <class Device = cpu, class T>
tensor<Device> from_vector(const std::vector<T>& values, const shape& s, dtype t = dtype_of<T>) {
  detail::check(static_cast<std::int64_t>(values.size()) == s.numel(), "from_vector: ",
                values.size(), " values do not fill shape ", s, " (", s.numel(), " elements)");
  auto host = tensor<cpu>::empty(s, dtype_of<T>);
  std::copy(values.begin(), values.end(), host.template data<T>());
  auto converted = host.to(t);
  if constexpr (std::is_same_v<Device, cpu>) {
    return converted;
  } else {
    auto out = tensor<Device>::empty(s, t);
    memory<Device>::copy_from_host(out.raw_data(), converted.raw_data(), converted.nbytes());
    return out;
  }
}

// start, start+step, ... below stop (or above it for a negative step).
template <class Device = cpu>
tensor<Device> arange(double start, double stop, double step = 1.0, dtype t = dtype::f32) {
  detail::check(step != 0.0, "arange: step must be non-zero");
  std::vector<double> values;
  for (double v = start; step > 0 ? v < stop : v > stop; v += step) values.push_back(v);
  return from_vector<Device>(values, shape{static_cast<std::int64_t>(values.size())}, t);
}
template <class Device = cpu>
tensor<Device> arange(std::int64_t n, dtype t = dtype::f32) {
  return arange<Device>(0.0, static_cast<double>(n), 1.0, t);
}

// While one lives on this thread, randn and uniform give zeros and draw nothing from their
// stream: a model built only to be loaded at once (a pipeline's part dealt out again, a
// checkpoint) skips initialising what is about to be overwritten, as accelerate's
// init_empty_weights does. Models that draw and drop other parts' values to keep the stream in
// step (nn::gpt) may skip those too (skip_init::active()).
class skip_init {
 public:
  skip_init() { ++depth(); }
  ~skip_init() { --depth(); }
  skip_init(const skip_init&) = delete;
  skip_init& operator=(const skip_init&) = delete;
  static bool active() { return depth() > 0; }

 private:
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
};

// Normal(mean, stddev) values drawn from `gen`.
template <class Device = cpu>
tensor<Device> randn(const shape& s, rng& gen, dtype t = dtype::f32, double mean = 0.0,
                     double stddev = 1.0) {
  detail::check(stddev >= 0.0, "randn: stddev must be >= 0, got ", stddev);
  if (skip_init::active()) return zeros<Device>(s, t);
  std::vector<double> values(static_cast<std::size_t>(s.numel()));
  for (std::size_t i = 0; i < values.size(); i += 2) {
    const auto pair = gen.normal_pair();
    values[i] = mean + stddev * pair[0];
    if (i + 1 < values.size()) values[i + 1] = mean + stddev * pair[1];
  }
  return from_vector<Device>(values, s, t);
}

// Uniform values in [lo, hi) drawn from `gen`.
template <class Device = cpu>
tensor<Device> uniform(const shape& s, rng& gen, double lo = 0.0, double hi = 1.0,
                       dtype t = dtype::f32) {
  detail::check(lo <= hi, "uniform: lo (", lo, ") must not exceed hi (", hi, ")");
  if (skip_init::active()) return zeros<Device>(s, t);
  std::vector<double> values(static_cast<std::size_t>(s.numel()));
  for (auto& v : values) v = gen.uniform(lo, hi);
  return from_vector<Device>(values, s, t);
}

}  // namespace decentrain
