// The fixed part of a model whose residual stream is confined to a subspace (Protocol Models,
// arXiv 2506.01260; gpt_config::subspace): an orthonormal basis U (C, k) shared by every layer,
// and a fixed, high-rank token and position embedding. The residual stream at any depth is then
//   x = fixed_token[ids] + fixed_position[t] + U c
// where only the k coefficients c depend on what was learned, so a stage hands the next one c
// (and takes back dL/dc = U^T dL/dx): no more is needed, in either direction, to rebuild x and
// its gradient exactly. Everything here comes from the configuration alone (a fixed seed, not
// the run's), so every stage, a joiner and a resumed run build the same, and none of it is a
// parameter: nothing of it is trained, averaged or saved.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "decentrain/autograd/variable.hpp"
#include "decentrain/core/factory.hpp"
#include "decentrain/core/rng.hpp"
#include "decentrain/nn/config.hpp"

namespace decentrain::nn {

template <class Device>
struct subspace_frame {
  var<Device> basis;           // (C, k), orthonormal columns
  var<Device> fixed_token;     // (V, C), N(0, 0.02) as GPT-2 draws its embeddings
  var<Device> fixed_position;  // (block_size, C), N(0, 0.02)

  explicit subspace_frame(const gpt_config& cfg) {
    const auto C = cfg.n_embd, k = cfg.subspace;
    decentrain::detail::check(k > 0 && k < C, "subspace: k must be in [1, n_embd = ", C, "), got ", k);
    // Drawn whatever skip_init says: these are not initial values about to be overwritten.
    rng gen(0x5375627370616365ull, "gpt.subspace");
    const auto normals = [&](std::int64_t n, double stddev) {
      std::vector<double> v(static_cast<std::size_t>(n));
      for (auto& x : v) x = stddev * gen.normal();
      return v;
    };
    // Gram-Schmidt (twice, for orthogonality to double precision) on a Gaussian C x k matrix:
    // a uniformly random k-dimensional subspace.
    auto u = normals(C * k, 1.0);
    const auto at = [&](std::int64_t row, std::int64_t col) -> double& { return u[static_cast<std::size_t>(row * k + col)]; };
    for (std::int64_t j = 0; j < k; ++j) {
      for (int pass = 0; pass < 2; ++pass)
        for (std::int64_t i = 0; i < j; ++i) {
          double dot = 0;
          for (std::int64_t r = 0; r < C; ++r) dot += at(r, i) * at(r, j);
          for (std::int64_t r = 0; r < C; ++r) at(r, j) -= dot * at(r, i);
        }
      double norm = 0;
      for (std::int64_t r = 0; r < C; ++r) norm += at(r, j) * at(r, j);
      norm = std::sqrt(norm);
      for (std::int64_t r = 0; r < C; ++r) at(r, j) /= norm;
    }
    basis = var<Device>(from_vector<Device>(u, shape{C, k}, dtype::f32));
    fixed_token = var<Device>(from_vector<Device>(normals(cfg.vocab_size * C, 0.02), shape{cfg.vocab_size, C}, dtype::f32));
    fixed_position = var<Device>(from_vector<Device>(normals(cfg.block_size * C, 0.02), shape{cfg.block_size, C}, dtype::f32));
  }
};

}  // namespace decentrain::nn
