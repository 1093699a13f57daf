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

// File layout: magic (8 bytes), version (u32 LE), payload length (u64 LE), FNV-1a of the
// payload (u64 LE), payload (cereal portable binary).
inline void save_checkpoint(const std::filesystem::path& path, const checkpoint& ckpt) {
  std::ostringstream payload(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive ar(payload);
    ar(ckpt);
  }
  const std::string body = payload.str();
  std::string file(checkpoint_magic, sizeof checkpoint_magic);
  auto put = [&](std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) file += static_cast<char>((v >> (8 * i)) & 0xff);
  };
  put(checkpoint_version, 4);
  put(body.size(), 8);
  put(checkpoint_checksum(body), 8);
  write_file_atomically(path, file + body);
}

inline checkpoint load_checkpoint(const std::filesystem::path& path) {
  const std::string file = read_file(path);
  const std::string where = "checkpoint " + path.string();
  constexpr std::size_t header = sizeof checkpoint_magic + 4 + 8 + 8;
  decentrain::detail::check(file.size() >= header, where, " is truncated (", file.size(), " bytes, header needs ", header, ")");
  decentrain::detail::check(file.compare(0, sizeof checkpoint_magic, std::string(checkpoint_magic, sizeof checkpoint_magic)) == 0,
                            where, " has a bad magic number (not a decentrain checkpoint)");
  auto get = [&](std::size_t at, int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(file[at + static_cast<std::size_t>(i)])) << (8 * i);
    return v;
  };
  const auto version = get(8, 4), length = get(12, 8), checksum = get(20, 8);
  decentrain::detail::check(version == checkpoint_version, where, " has version ", version, ", expected ", checkpoint_version);
  decentrain::detail::check(file.size() - header == length, where, " is truncated or padded: payload of ",
                            file.size() - header, " bytes, header says ", length);
  const std::string_view body(file.data() + header, length);
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

}  // namespace decentrain::io
