// Reading cereal portable-binary bytes that came from outside (a peer, a file): the same format
// as cereal::PortableBinaryInputArchive, with two checks it lacks, found by fuzzing (fuzz/):
// - a container's length is at most the bytes left to read (every element takes at least one),
//   so a length field cannot make the reader allocate more than a multiple of what was sent
//   (cereal resizes a string or vector to the length it reads before reading the elements);
// - a bool is the byte 0 or 1 (cereal copies the byte into the bool: any other is undefined
//   behaviour).
// Failures are decentrain::error. Writers keep cereal::PortableBinaryOutputArchive.
#pragma once

#include <cereal/cereal.hpp>
#include <cereal/details/helpers.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "decentrain/detail/error.hpp"

namespace decentrain::detail {

class bounded_input_archive : public cereal::InputArchive<bounded_input_archive, cereal::AllowEmptyClassElision> {
 public:
  // `what` names the source in errors ("checkpoint from peer 3").
  bounded_input_archive(std::string_view data, std::string_view what) : bounded_input_archive(std::vector{data}, what) {}
  // The bytes in pieces, read one after the other (a state received partly in place:
  // io::decode_checkpoint).
  bounded_input_archive(std::vector<std::string_view> pieces, std::string_view what)
      : cereal::InputArchive<bounded_input_archive, cereal::AllowEmptyClassElision>(this), pieces_(std::move(pieces)), what_(what) {
    for (const auto p : pieces_) left_ += p.size();
    std::uint8_t little = 0;
    load_bytes(&little, 1, 1);
    check(little <= 1, what_, ": bad byte-order flag ", int(little));
    swap_ = (little == 1) != (std::endian::native == std::endian::little);
  }

  std::size_t remaining() const { return left_; }
  std::string_view what() const { return what_; }
  // Whether the pieces may lie in memory the reader decodes into (a state landed in place over the
  // one it replaces): then a tensor is decoded into such memory only where its bytes are already
  // (io::load_tensor), since elsewhere it could overwrite bytes still to be read.
  bool sources_may_alias() const { return alias_; }
  void set_sources_may_alias(bool alias) { alias_ = alias; }
  // Where the next `size` bytes lie, when one piece holds them all; else null.
  const char* next_bytes(std::size_t size) {
    skip_empty();
    return piece_ < pieces_.size() && pieces_[piece_].size() - at_ >= size ? pieces_[piece_].data() + at_ : nullptr;
  }

  // Bytes already where they are to go (a state landed in place) are not copied onto themselves.
  void load_bytes(void* out, std::size_t size, std::size_t element) {
    check(size <= remaining(), what_, ": truncated (", size, " bytes wanted at offset ", offset(), ", ", remaining(), " left)");
    for (std::size_t done = 0; done < size;) {
      skip_empty();
      const std::size_t n = std::min(size - done, pieces_[piece_].size() - at_);
      auto* to = static_cast<char*>(out) + done;
      if (to != pieces_[piece_].data() + at_) std::memcpy(to, pieces_[piece_].data() + at_, n);
      at_ += n;
      done += n;
    }
    left_ -= size;
    if (swap_ && element > 1)
      for (std::size_t i = 0; i < size; i += element) {
        auto* p = static_cast<unsigned char*>(out) + i;
        for (std::size_t a = 0, b = element - 1; a < b; ++a, --b) std::swap(p[a], p[b]);
      }
  }

 private:
  void skip_empty() {
    while (piece_ < pieces_.size() && at_ == pieces_[piece_].size()) {
      ++piece_;
      at_ = 0;
    }
  }
  std::size_t offset() const {
    std::size_t total = 0;
    for (const auto p : pieces_) total += p.size();
    return total - left_;
  }

  std::vector<std::string_view> pieces_;
  std::size_t piece_ = 0, at_ = 0, left_ = 0;
  std::string_view what_;
  bool swap_ = false, alias_ = false;
};

template <class T>
  requires(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
void CEREAL_LOAD_FUNCTION_NAME(bounded_input_archive& ar, T& t) {
  ar.load_bytes(&t, sizeof t, sizeof t);
}

inline void CEREAL_LOAD_FUNCTION_NAME(bounded_input_archive& ar, bool& b) {
  std::uint8_t byte = 0;
  ar.load_bytes(&byte, 1, 1);
  check(byte <= 1, ar.what(), ": a flag holds ", int(byte), ", not 0 or 1");
  b = byte == 1;
}

template <class T>
void CEREAL_SERIALIZE_FUNCTION_NAME(bounded_input_archive& ar, cereal::NameValuePair<T>& t) {
  ar(t.value);
}

template <class T>
void CEREAL_SERIALIZE_FUNCTION_NAME(bounded_input_archive& ar, cereal::SizeTag<T>& t) {
  ar(t.size);
  check(static_cast<std::uint64_t>(t.size) <= ar.remaining(), ar.what(), ": a length of ", static_cast<std::uint64_t>(t.size),
        " with only ", ar.remaining(), " bytes left");
}

template <class T>
void CEREAL_LOAD_FUNCTION_NAME(bounded_input_archive& ar, cereal::BinaryData<T>& bd) {
  using element = std::remove_cv_t<std::remove_pointer_t<T>>;
  ar.load_bytes(const_cast<void*>(static_cast<const void*>(bd.data)), static_cast<std::size_t>(bd.size), sizeof(element));
}

}  // namespace decentrain::detail

CEREAL_REGISTER_ARCHIVE(decentrain::detail::bounded_input_archive)
