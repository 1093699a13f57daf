// llm.c token shards: a header of 256 little-endian int32 (magic 20240520, version 1, token
// count, rest zero) followed by the tokens as uint16. Writes go through write_file_atomically,
// so a crash never leaves a half-written shard under the real name.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/io/atomic_file.hpp"

namespace decentrain::io {

inline constexpr std::int32_t token_shard_magic = 20240520;
inline constexpr std::int32_t token_shard_version = 1;
inline constexpr std::size_t token_shard_header_ints = 256;

inline void write_token_shard(const std::filesystem::path& path, const std::vector<std::int32_t>& tokens) {
  std::vector<std::uint16_t> packed(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    decentrain::detail::check(tokens[i] >= 0 && tokens[i] <= 65535, "write_token_shard: token ", tokens[i],
                  " at index ", i, " does not fit the format's uint16");
    packed[i] = static_cast<std::uint16_t>(tokens[i]);
  }
  decentrain::detail::check(tokens.size() <= 0x7fffffffu, "write_token_shard: ", tokens.size(), " tokens exceed the int32 count field");
  std::vector<std::int32_t> header(token_shard_header_ints, 0);
  header[0] = token_shard_magic;
  header[1] = token_shard_version;
  header[2] = static_cast<std::int32_t>(tokens.size());
  std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  bytes.append(reinterpret_cast<const char*>(packed.data()), packed.size() * 2);
  write_file_atomically(path, bytes);
}

inline std::vector<std::int32_t> read_token_shard(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  decentrain::detail::check(in.good(), "read_token_shard: cannot open ", path.string());
  std::vector<std::int32_t> header(token_shard_header_ints);
  in.read(reinterpret_cast<char*>(header.data()), static_cast<std::streamsize>(header.size() * 4));
  decentrain::detail::check(in.gcount() == static_cast<std::streamsize>(header.size() * 4), "read_token_shard: ",
                path.string(), " is shorter than the 1024-byte header");
  decentrain::detail::check(header[0] == token_shard_magic, "read_token_shard: ", path.string(), " has magic ",
                header[0], ", expected ", token_shard_magic, " (not an llm.c token shard)");
  decentrain::detail::check(header[1] == token_shard_version, "read_token_shard: ", path.string(), " has version ",
                header[1], ", expected ", token_shard_version);
  decentrain::detail::check(header[2] >= 0, "read_token_shard: ", path.string(), " declares a negative token count");
  const auto count = static_cast<std::size_t>(header[2]);
  const auto size = std::filesystem::file_size(path);
  decentrain::detail::check(size == token_shard_header_ints * 4 + count * 2, "read_token_shard: ", path.string(),
                " declares ", count, " tokens but holds ", (size - token_shard_header_ints * 4) / 2,
                (size < token_shard_header_ints * 4 + count * 2 ? " (truncated)" : " (trailing bytes)"));
  std::vector<std::uint16_t> packed(count);
  in.read(reinterpret_cast<char*>(packed.data()), static_cast<std::streamsize>(count * 2));
  decentrain::detail::check(static_cast<std::size_t>(in.gcount()) == count * 2, "read_token_shard: ", path.string(), " is truncated");
  return std::vector<std::int32_t>(packed.begin(), packed.end());
}

// True when the file starts with the shard magic (how the CLI tells a shard from text).
inline bool is_token_shard(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::int32_t magic = 0;
  in.read(reinterpret_cast<char*>(&magic), 4);
  return in.gcount() == 4 && magic == token_shard_magic;
}

}  // namespace decentrain::io
