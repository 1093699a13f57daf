// Training checkpoints: named tensors (model parameters, optimizer state), integer counters
// (the step, per-parameter optimizer steps), rng states and text (configuration, tokenizer),
// serialized with cereal's portable binary archive behind a magic number, a version and a
// checksum, and written atomically. What goes in is up to the caller (train/checkpoint.hpp
// fills one from a model and its optimizer); each component uses its own name prefix.
#pragma once

#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/map.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <ostream>
#include <streambuf>
#include <string>
#include <string_view>
#include <vector>

#include "decentrain/core/factory.hpp"
#include "decentrain/detail/bounded_archive.hpp"
#include "decentrain/detail/hash.hpp"
#include "decentrain/io/atomic_file.hpp"
#include "decentrain/io/tensor_archive.hpp"

namespace decentrain::io {

inline constexpr char checkpoint_magic[8] = {'D', 'T', 'C', 'K', 'P', 'T', '\0', '\0'};
// The checksum's hash: 1 FNV-1a, 2 XXH64, 3 XXH3 (as fast as reading the memory; see
// bench/checksums). Every earlier version is still read.
inline constexpr std::uint32_t checkpoint_version = 3;

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

// State that belongs to one peer alone, which another peer must not take over: what an
// error-feedback codec has not sent yet (a member that took it from a donor would send the
// donor's unsent mass a second time). It lives under keys with an "own." segment. A state handed
// to another peer leaves it out and says so; a component loading such a state keeps its own (a
// joiner's own is empty: it has not sent anything yet). A peer that leaves on purpose hands its
// own tensors to another, which adds them to its own (add_own_tensors below): own tensors are
// mass that adds up.
inline bool is_own_key(std::string_view key) { return key.starts_with("own.") || key.find(".own.") != std::string_view::npos; }
inline constexpr const char* own_state_left_out = "checkpoint.own_state_left_out";
inline void leave_out_own_state(checkpoint& c) {
  auto drop = [](auto& map) { std::erase_if(map, [](const auto& entry) { return is_own_key(entry.first); }); };
  drop(c.tensors);
  drop(c.counters);
  drop(c.rngs);
  drop(c.text);
  c.counters[own_state_left_out] = 1;
}
inline bool leaves_out_own_state(const checkpoint& c) { return c.counters.contains(own_state_left_out); }

// Adds `theirs` (another peer's own tensors: fault/handoff.hpp, a peer that left handing over
// its unsent residual) into the same tensors of `mine`: own state is mass that adds up, so any
// own state a component keeps must be such (a residual, not a counter). A tensor `mine` holds
// empty (a codec that has not encoded yet) takes theirs as it is. Refused, naming `what` ("the
// handoff from peer 3") and the problem, unless each is an own f32 tensor that `mine` holds (empty
// or with as many values), every value and every sum is finite, and theirs is at most
// `max_ratio` times as large as this peer's own (L2 norm, when that is not 0): a leaver cannot
// make its heir send an outlier that the group's aggregation would hold against the heir.
// `mine` is changed only once all of it is checked.
inline void add_own_tensors(checkpoint& mine, const checkpoint& theirs, const std::string& what, double max_ratio = 16) {
  std::map<std::string, tensor<cpu>> sums;
  for (const auto& [key, t] : theirs.tensors) {
    decentrain::detail::check(is_own_key(key), what, " holds '", key, "', which is not a peer's own state");
    const auto it = mine.tensors.find(key);
    decentrain::detail::check(it != mine.tensors.end(), what, " holds '", key,
                              "', which this peer's state has not (the peers' codecs differ?)");
    const bool empty = it->second.numel() == 0;
    decentrain::detail::check(t.dtype() == dtype::f32 && it->second.dtype() == dtype::f32 && (empty || t.numel() == it->second.numel()),
                              what, " holds ", t.numel(), " values of '", key, "', this peer ", it->second.numel());
    const auto add = t.to_vector<float>();
    auto sum = empty ? std::vector<float>(add.size(), 0.0f) : it->second.to_vector<float>();
    double own_norm = 0, their_norm = 0;
    for (std::size_t i = 0; i < sum.size(); ++i) {
      decentrain::detail::check(std::isfinite(add[i]), what, " holds ", add[i], " at value ", i, " of '", key, "'");
      own_norm += static_cast<double>(sum[i]) * sum[i];
      their_norm += static_cast<double>(add[i]) * add[i];
      sum[i] += add[i];
      decentrain::detail::check(std::isfinite(sum[i]), what, ": value ", i, " of '", key, "' overflows when added");
    }
    decentrain::detail::check(own_norm == 0 || their_norm <= max_ratio * max_ratio * own_norm, what, " holds '", key,
                              "' of norm ", std::sqrt(their_norm), ", more than ", max_ratio, " times this peer's own (",
                              std::sqrt(own_norm), ")");
    sums.emplace(key, from_vector<cpu>(sum, t.shape()));  // new tensors: a copied checkpoint shares its tensors' storage
  }
  for (auto& [key, t] : sums) mine.tensors.at(key) = std::move(t);
}

// A hash of the payload: catches torn or bit-flipped files (not tampering; that is what the
// authenticated transport is for).
inline std::uint64_t checkpoint_checksum(std::string_view bytes, std::uint32_t version = checkpoint_version) {
  switch (version) {
    case 1: return decentrain::detail::fnv1a(bytes);
    case 2: return decentrain::detail::xxh64(bytes);
    default: return decentrain::detail::xxh3(bytes);
  }
}

namespace streams {
// A stream buffer straight into the checkpoint's bytes: a large model's state is gigabytes, and
// string streams would copy it three times over (figures: bench/RESULTS.md, bench/faults).
class string_sink : public std::streambuf {
 public:
  explicit string_sink(std::string& out) : out_(out) {}

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    out_.append(s, static_cast<std::size_t>(n));
    return n;
  }
  int_type overflow(int_type c) override {
    if (!traits_type::eq_int_type(c, traits_type::eof())) out_.push_back(traits_type::to_char_type(c));
    return traits_type::not_eof(c);
  }

 private:
  std::string& out_;
};

// `bytes` little-endian bytes of `data` from `at` (a header field).
inline std::uint64_t read_le(std::string_view data, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(data[at + static_cast<std::size_t>(i)])) << (8 * i);
  return v;
}
}  // namespace streams

inline constexpr std::size_t checkpoint_header_bytes = sizeof checkpoint_magic + 4 + 8 + 8;

// Layout (a file, or the state one peer sends another): magic (8 bytes), version (u32 LE),
// payload length (u64 LE), checksum of the payload (u64 LE; XXH3 from version 3), payload (cereal portable binary).
inline std::string encode_checkpoint(const checkpoint& ckpt) {
  std::size_t estimate = checkpoint_header_bytes + 4096;
  for (const auto& [name, t] : ckpt.tensors) estimate += name.size() + t.nbytes() + 128;
  for (const auto& [name, text] : ckpt.text) estimate += name.size() + text.size() + 16;
  estimate += 64 * (ckpt.counters.size() + ckpt.rngs.size());
  std::string out(checkpoint_header_bytes, '\0');
  out.reserve(estimate);
  {
    streams::string_sink sink(out);
    std::ostream stream(&sink);
    cereal::PortableBinaryOutputArchive ar(stream);
    ar(ckpt);
  }
  const std::string_view body = std::string_view(out).substr(checkpoint_header_bytes);
  std::size_t at = 0;
  auto put = [&](std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out[at++] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  for (char c : checkpoint_magic) out[at++] = c;
  put(checkpoint_version, 4);
  put(body.size(), 8);
  put(checkpoint_checksum(body), 8);
  return out;
}

// The checksum an encoded checkpoint carries of its payload: two encodings with the same
// checksum and size hold the same state (fault::transfer_state matches donors by it).
inline std::uint64_t stored_checksum(std::string_view encoded) {
  decentrain::detail::check(encoded.size() >= checkpoint_header_bytes, "checkpoint: ", encoded.size(),
                            " bytes are shorter than a header");
  return streams::read_le(encoded, 20, 8);
}

// Reads what encode_checkpoint wrote; `where` names the source in errors (a file, a peer).
inline checkpoint decode_checkpoint(std::string_view data, const std::string& where) {
  constexpr std::size_t header = checkpoint_header_bytes;
  decentrain::detail::check(data.size() >= header, where, " is truncated (", data.size(), " bytes, header needs ", header, ")");
  decentrain::detail::check(data.compare(0, sizeof checkpoint_magic, std::string_view(checkpoint_magic, sizeof checkpoint_magic)) == 0,
                            where, " has a bad magic number (not a decentrain checkpoint)");
  const auto get = [&](std::size_t at, int bytes) { return streams::read_le(data, at, bytes); };
  const auto version = get(8, 4), length = get(12, 8), checksum = get(20, 8);
  decentrain::detail::check(version >= 1 && version <= checkpoint_version, where, " has version ", version,
                            ", expected 1 to ", checkpoint_version);
  decentrain::detail::check(data.size() - header == length, where, " is truncated or padded: payload of ",
                            data.size() - header, " bytes, header says ", length);
  const std::string_view body = data.substr(header);
  decentrain::detail::check(checkpoint_checksum(body, static_cast<std::uint32_t>(version)) == checksum, where,
                            " is corrupt (checksum mismatch)");
  checkpoint ckpt;
  try {
    decentrain::detail::bounded_input_archive ar(body, where);
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
