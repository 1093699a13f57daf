// Tokenizers: bytes (vocabulary 256, takes any input) and characters (the distinct bytes of a
// training text, as nanoGPT's shakespeare-char). Unknown input is an error naming it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "decentrain/detail/error.hpp"

namespace decentrain::data {

struct byte_tokenizer {
  static constexpr std::int64_t vocab_size() { return 256; }
  std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> out;
    out.reserve(text.size());
    for (unsigned char c : text) out.push_back(c);
    return out;
  }
  std::string decode(const std::vector<std::int32_t>& ids) const {
    std::string out;
    out.reserve(ids.size());
    for (auto id : ids) {
      detail::check(id >= 0 && id < 256, "byte_tokenizer: id ", id, " is outside [0, 256)");
      out += static_cast<char>(id);
    }
    return out;
  }
};

class char_tokenizer {
 public:
  // The alphabet is the sorted set of distinct bytes in `text`.
  static char_tokenizer from_text(std::string_view text) {
    std::array<bool, 256> seen{};
    for (unsigned char c : text) seen[c] = true;
    std::string alphabet;
    for (int c = 0; c < 256; ++c)
      if (seen[static_cast<std::size_t>(c)]) alphabet += static_cast<char>(c);
    return char_tokenizer(alphabet);
  }

  // From a saved alphabet (strictly increasing bytes), for checkpoints.
  explicit char_tokenizer(std::string alphabet) : alphabet_(std::move(alphabet)) {
    detail::check(!alphabet_.empty(), "char_tokenizer: the alphabet is empty");
    ids_.fill(-1);
    for (std::size_t i = 0; i < alphabet_.size(); ++i) {
      const auto c = static_cast<unsigned char>(alphabet_[i]);
      detail::check(ids_[c] < 0, "char_tokenizer: byte ", int(c), " appears twice in the alphabet");
      ids_[c] = static_cast<std::int32_t>(i);
    }
  }

  std::int64_t vocab_size() const { return static_cast<std::int64_t>(alphabet_.size()); }
  const std::string& alphabet() const { return alphabet_; }

  std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      detail::check(ids_[c] >= 0, "char_tokenizer: character ", describe(c), " at offset ", i,
                    " is not in the alphabet of ", alphabet_.size(), " characters");
      out.push_back(ids_[c]);
    }
    return out;
  }
  std::string decode(const std::vector<std::int32_t>& ids) const {
    std::string out;
    out.reserve(ids.size());
    for (auto id : ids) {
      detail::check(id >= 0 && id < vocab_size(), "char_tokenizer: id ", id, " is outside [0, ", vocab_size(), ")");
      out += alphabet_[static_cast<std::size_t>(id)];
    }
    return out;
  }

 private:
  static std::string describe(unsigned char c) {
    if (c >= 32 && c < 127) return std::string("'") + static_cast<char>(c) + "'";
    return "byte " + std::to_string(int(c));
  }
  std::string alphabet_;
  std::array<std::int32_t, 256> ids_{};
};

}  // namespace decentrain::data
