// Training checkpoints: named tensors (model parameters, optimizer state), integer counters
// (the step, per-parameter optimizer steps), rng states and text (configuration, tokenizer),
// serialized with cereal's portable binary archive behind a magic number, a version and a
// checksum, and written atomically. What goes in is up to the caller (train/checkpoint.hpp
// fills one from a model and its optimizer); each component uses its own name prefix.
#pragma once

#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/map.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "decentrain/detail/hash.hpp"
#include "decentrain/io/atomic_file.hpp"
#include "decentrain/io/tensor_archive.hpp"

namespace decentrain::io {

inline constexpr char checkpoint_magic[8] = {'D', 'T', 'C', 'K', 'P', 'T', '\0', '\0'};
inline constexpr std::uint32_t checkpoint_version = 1;

struct checkpoint {
  std::map<std::string, tensor<cpu>> tensors;
  std::map<std::string, std::int64_t> counters;
  std::map<std::string, rng::state_type> rngs;
  std::map<std::string, std::string> text;

  template <class Archive>
  void serialize(Archive& ar) {
    ar(tensors, counters, rngs, text);
  }

  const tensor<cpu>& tensor_at(const std::string& name) const {
    auto it = tensors.find(name);
    decentrain::detail::check(it != tensors.end(), "checkpoint: missing tensor '", name, "'");
    return it->second;
  }
  std::int64_t counter(const std::string& name) const {
    auto it = counters.find(name);
    decentrain::detail::check(it != counters.end(), "checkpoint: missing counter '", name, "'");
    return it->second;
  }
};

// FNV-1a over the payload: catches torn or bit-flipped files (not tampering; that is what the
// authenticated transport is for).
inline std::uint64_t checkpoint_checksum(std::string_view bytes) { return decentrain::detail::fnv1a(bytes); }

// Layout (a file, or the state one peer sends another): magic (8 bytes), version (u32 LE),
// payload length (u64 LE), FNV-1a of the payload (u64 LE), payload (cereal portable binary).
inline std::string encode_checkpoint(const checkpoint& ckpt) {
  std::ostringstream payload(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive ar(payload);
    ar(ckpt);
  }
  const std::string body = payload.str();
  std::string out(checkpoint_magic, sizeof checkpoint_magic);
  auto put = [&](std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
  };
  put(checkpoint_version, 4);
  put(body.size(), 8);
  put(checkpoint_checksum(body), 8);
  return out + body;
}

// Reads what encode_checkpoint wrote; `where` names the source in errors (a file, a peer).
inline checkpoint decode_checkpoint(std::string_view data, const std::string& where) {
  constexpr std::size_t header = sizeof checkpoint_magic + 4 + 8 + 8;
  decentrain::detail::check(data.size() >= header, where, " is truncated (", data.size(), " bytes, header needs ", header, ")");
  decentrain::detail::check(data.compare(0, sizeof checkpoint_magic, std::string_view(checkpoint_magic, sizeof checkpoint_magic)) == 0,
                            where, " has a bad magic number (not a decentrain checkpoint)");
  auto get = [&](std::size_t at, int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(data[at + static_cast<std::size_t>(i)])) << (8 * i);
    return v;
  };
  const auto version = get(8, 4), length = get(12, 8), checksum = get(20, 8);
  decentrain::detail::check(version == checkpoint_version, where, " has version ", version, ", expected ", checkpoint_version);
  decentrain::detail::check(data.size() - header == length, where, " is truncated or padded: payload of ",
                            data.size() - header, " bytes, header says ", length);
  const std::string_view body = data.substr(header);
  decentrain::detail::check(checkpoint_checksum(body) == checksum, where, " is corrupt (checksum mismatch)");
  checkpoint ckpt;
  try {
    std::istringstream in(std::string(body), std::ios::binary);
    cereal::PortableBinaryInputArchive ar(in);
    ar(ckpt);
  } catch (const std::exception& e) {
    // cereal's own errors, our field checks, and bad_alloc/length_error from a container length
    // that is garbage: all mean the payload is not a checkpoint this code wrote.
    decentrain::detail::fail(where, " cannot be decoded: ", e.what());
  }
  return ckpt;
}

inline void save_checkpoint(const std::filesystem::path& path, const checkpoint& ckpt) {
  write_file_atomically(path, encode_checkpoint(ckpt));
}

inline checkpoint load_checkpoint(const std::filesystem::path& path) {
  return decode_checkpoint(read_file(path), "checkpoint " + path.string());
}

}  // namespace decentrain::io
