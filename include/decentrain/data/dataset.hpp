// A token sequence split into training and validation parts, and deterministic batches drawn
// from it. A batch is a pure function of (seed, split, step, rank): row i of rank r is row
// r*B + i of the global batch of B*world rows, so N peers with batch B see exactly the rows one
// peer with batch N*B would, and any step can be reproduced without replaying earlier ones.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "decentrain/core/factory.hpp"
#include "decentrain/detail/hash.hpp"

namespace decentrain::data {

enum class split { train, validation };

class token_dataset {
 public:
  // The last `val_fraction` of the tokens is the validation split.
  explicit token_dataset(std::vector<std::int32_t> tokens, double val_fraction = 0.1) {
    decentrain::detail::check(val_fraction >= 0.0 && val_fraction < 1.0,
                              "token_dataset: val_fraction must be in [0, 1), got ", val_fraction);
    const auto n_val = static_cast<std::size_t>(static_cast<double>(tokens.size()) * val_fraction);
    val_.assign(tokens.end() - static_cast<std::ptrdiff_t>(n_val), tokens.end());
    tokens.resize(tokens.size() - n_val);
    train_ = std::move(tokens);
  }

  // Separate training and validation tokens (llm.c's train_*.bin and val_*.bin shards).
  token_dataset(std::vector<std::int32_t> train, std::vector<std::int32_t> validation)
      : train_(std::move(train)), val_(std::move(validation)) {}

  const std::vector<std::int32_t>& tokens(split s) const { return s == split::train ? train_ : val_; }

  // Inputs and next-token targets, each (batch, block) i32, for this rank's share of the
  // global batch at `step`.
  template <class Device = cpu>
  std::pair<tensor<Device>, tensor<Device>> batch(split s, std::int64_t step, std::int64_t batch_size,
                                                  std::int64_t block, std::uint64_t seed, std::int64_t rank = 0,
                                                  std::int64_t world = 1) const {
    const auto& t = tokens(s);
    decentrain::detail::check(batch_size > 0 && block > 0, "token_dataset: batch size and block must be positive, got ",
                              batch_size, " and ", block);
    decentrain::detail::check(world > 0 && rank >= 0 && rank < world, "token_dataset: rank ", rank,
                              " is outside [0, world = ", world, ")");
    decentrain::detail::check(static_cast<std::int64_t>(t.size()) > block, "token_dataset: the ",
                              s == split::train ? "training" : "validation", " split has ", t.size(),
                              " tokens, fewer than block + 1 = ", block + 1);
    const auto starts = static_cast<std::uint64_t>(static_cast<std::int64_t>(t.size()) - block);
    std::vector<std::int32_t> x(static_cast<std::size_t>(batch_size * block)), y(x.size());
    for (std::int64_t i = 0; i < batch_size; ++i) {
      const auto row = static_cast<std::uint64_t>(rank * batch_size + i);
      using decentrain::detail::splitmix64;
      const std::uint64_t h = splitmix64(seed ^ splitmix64((s == split::train ? 0x7261696eull : 0x76616cull) ^
                                                           splitmix64(static_cast<std::uint64_t>(step) ^ splitmix64(row))));
      const auto start = static_cast<std::size_t>((static_cast<decentrain::detail::uint128>(h) * starts) >> 64);
      std::copy_n(t.begin() + static_cast<std::ptrdiff_t>(start), block, x.begin() + i * block);
      std::copy_n(t.begin() + static_cast<std::ptrdiff_t>(start) + 1, block, y.begin() + i * block);
    }
    return {from_vector<Device>(x, shape{batch_size, block}), from_vector<Device>(y, shape{batch_size, block})};
  }

 private:
  std::vector<std::int32_t> train_, val_;
};

}  // namespace decentrain::data
