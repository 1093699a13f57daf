// Training checkpoints: named tensors (model parameters, optimizer state), integer counters
// (the step, per-parameter optimizer steps), rng states and text (configuration, tokenizer),
// serialized with cereal's portable binary archive behind a magic number, a version and a
// checksum, and written atomically. What goes in is up to the caller (train/checkpoint.hpp
// fills one from a model and its optimizer); each component uses its own name prefix.
#pragma once

#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/map.hpp>

#include <algorithm>
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
  // Set before it is filled: a component may put in views of its live memory instead of copies
  // (host memory; a GPU's tensors are copied either way). For a state that is encoded, or
  // decoded into, at once while nothing else runs (fault::elastic: a donor serves its state from
  // it, a peer behind decodes the donor's over its own), where copies would be gigabytes of
  // fresh memory; a checkpoint written in the background needs copies. Not stored.
  bool views = false;

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
// donor's unsent mass a second time), or what a peer measured of itself (its seconds an inner
// step: comm/round_deadline.hpp). It lives under keys with an "own." segment. A state handed
// to another peer leaves it out and says so; a component loading such a state keeps its own (a
// joiner's own is empty: it has not sent or measured anything yet). A peer that leaves on purpose
// hands its own tensors to another, which adds them to its own (add_own_tensors below): own
// tensors are mass that adds up; own counters and text (measures, counts) are never handed on.
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
// its unsent residual) into the same tensors of `mine`: own tensors are mass that adds up, so
// any a component keeps must be such (a residual, not a measure: those are own counters or text). A tensor `mine` holds
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

// The same of a payload in pieces (as encoded_checkpoint holds it, or a state landed in place):
// XXH3 streamed over them; the older hashes over the pieces joined (an old file is one piece).
inline std::uint64_t checkpoint_checksum(const std::vector<std::string_view>& body, std::uint32_t version = checkpoint_version) {
  if (version >= 3) {
    decentrain::detail::xxh3_stream hash;
    for (const auto p : body) hash.update(p);
    return hash.digest();
  }
  if (body.size() == 1) return checkpoint_checksum(body.front(), version);
  std::string joined;
  for (const auto p : body) joined.append(p);
  return checkpoint_checksum(joined, version);
}

namespace streams {
// `bytes` little-endian bytes of `data` from `at` (a header field).
inline std::uint64_t read_le(std::string_view data, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(data[at + static_cast<std::size_t>(i)])) << (8 * i);
  return v;
}
}  // namespace streams

inline constexpr std::size_t checkpoint_header_bytes = sizeof checkpoint_magic + 4 + 8 + 8;

// A checkpoint encoded without copying its tensors: the header and the short fields in a buffer
// of its own, each tensor's bytes read where they lie. It keeps the checkpoint (so its tensors'
// storage lives as long as it does); of a checkpoint of views (checkpoint::views) it holds true
// until the state viewed changes. A donor serves a heal from it and a file is written from it:
// a state of gigabytes is not copied once more, into memory a fresh process pays for page by
// page (bench/RESULTS.md, bench/faults --only state).
//
// Layout (a file, or the state one peer sends another): magic (8 bytes), version (u32 LE),
// payload length (u64 LE), checksum of the payload (u64 LE; XXH3 from version 3), payload
// (cereal portable binary).
class encoded_checkpoint {
 public:
  explicit encoded_checkpoint(checkpoint state) : kept_(std::move(state)) {
    for (auto& [name, t] : kept_.tensors) {
      decentrain::detail::check(t.defined(), "checkpoint: tensor '", name, "' is undefined");
      if (!t.is_contiguous()) t = t.contiguous();  // its bytes must live in kept_, as one piece
      if (t.nbytes() > 0) names_.emplace(t.raw_data(), &name);
    }
    own_.assign(checkpoint_header_bytes, '\0');
    pieces_.push_back({0, checkpoint_header_bytes, nullptr, 0, nullptr});
    {
      piece_sink sink(*this);
      std::ostream stream(&sink);
      cereal::PortableBinaryOutputArchive ar(stream);
      ar(kept_);
    }
    auto body = pieces();
    body.front().remove_prefix(checkpoint_header_bytes);
    checksum_ = checkpoint_checksum(body);
    std::size_t at = 0;
    auto put = [&](std::uint64_t v, int bytes) {
      for (int i = 0; i < bytes; ++i) own_[at++] = static_cast<char>((v >> (8 * i)) & 0xff);
    };
    for (char c : checkpoint_magic) own_[at++] = c;
    put(checkpoint_version, 4);
    put(size_ - checkpoint_header_bytes, 8);
    put(checksum_, 8);
  }
  // Moved, it still holds: its pieces point into heap memory that kept_ owns (a map's nodes stay
  // where they are) or by offset into own_. A copy would point into the original.
  encoded_checkpoint(encoded_checkpoint&&) = default;
  encoded_checkpoint& operator=(encoded_checkpoint&&) = default;
  encoded_checkpoint(const encoded_checkpoint&) = delete;
  encoded_checkpoint& operator=(const encoded_checkpoint&) = delete;

  std::uint64_t size() const { return size_; }
  // The payload's checksum, as the header holds it: two encodings with the same checksum and
  // size hold the same state (fault::transfer_state matches donors by it).
  std::uint64_t checksum() const { return checksum_; }

  // Bytes [at, at + len): where they lie when one piece holds them (a tensor's), else copied
  // into `scratch`.
  std::string_view bytes(std::uint64_t at, std::size_t len, std::string& scratch) const {
    decentrain::detail::check(at <= size_ && len <= size_ - at, "encoded_checkpoint: bytes [", at, ", ", at + len,
                              ") of ", size_);
    auto p = std::upper_bound(pieces_.begin(), pieces_.end(), at, [](std::uint64_t x, const piece& q) { return x < q.at; }) - 1;
    if (at + len <= p->at + p->size) return view(*p).substr(static_cast<std::size_t>(at - p->at), len);
    scratch.clear();
    for (; scratch.size() < len; ++p) {
      const auto from = static_cast<std::size_t>(at + scratch.size() - p->at);
      scratch.append(view(*p).substr(from, len - scratch.size()));
    }
    return scratch;
  }
  // Where each piece ends, in order: chunks cut at these lie in one piece each.
  std::vector<std::uint64_t> piece_ends() const {
    std::vector<std::uint64_t> out;
    for (const auto& p : pieces_) out.push_back(p.at + p.size);
    return out;
  }
  // Where each tensor's bytes lie in the encoding, when they are read in place (the tensors of
  // borrow_bytes or more): a peer that takes this state lands them in its own tensor of the same
  // name (fault::transfer_state).
  struct placed_tensor {
    std::string name;
    std::uint64_t at = 0, bytes = 0;
  };
  std::vector<placed_tensor> placed_tensors() const {
    std::vector<placed_tensor> out;
    for (const auto& p : pieces_)
      if (p.tensor) out.push_back({*p.tensor, p.at, p.size});
    return out;
  }

  // The whole encoding, in order, as pieces.
  std::vector<std::string_view> pieces() const {
    std::vector<std::string_view> out;
    for (const auto& p : pieces_) out.push_back(view(p));
    return out;
  }
  std::string str() const {
    std::string out;
    out.reserve(static_cast<std::size_t>(size_));
    for (const auto& p : pieces_) out.append(view(p));
    return out;
  }

 private:
  // A run of the encoding: in own_ from `own_at`, or `borrowed` (a tensor's bytes in kept_,
  // `tensor` its name, or a long string's).
  struct piece {
    std::uint64_t at;
    std::size_t size;
    const char* borrowed;
    std::size_t own_at;
    const std::string* tensor = nullptr;
  };
  std::string_view view(const piece& p) const {
    return {p.borrowed ? p.borrowed : own_.data() + p.own_at, p.size};
  }

  // Takes what cereal writes: a write of borrow_bytes or more is a tensor's data or a long
  // string, both held in kept_, and is referenced where it lies; shorter ones are copied.
  class piece_sink : public std::streambuf {
   public:
    explicit piece_sink(encoded_checkpoint& out) : out_(out) {}

   protected:
    std::streamsize xsputn(const char* s, std::streamsize n) override {
      const auto len = static_cast<std::size_t>(n);
      if (len == 0) return 0;  // (no empty pieces)
      auto& pieces = out_.pieces_;
      if (len >= borrow_bytes) {
        const auto named = out_.names_.find(s);
        pieces.push_back({out_.size_, len, s, 0, named == out_.names_.end() ? nullptr : named->second});
      } else {
        if (pieces.back().borrowed) pieces.push_back({out_.size_, 0, nullptr, out_.own_.size(), nullptr});
        out_.own_.append(s, len);
        pieces.back().size += len;
      }
      out_.size_ += len;
      return n;
    }
    int_type overflow(int_type c) override {
      if (!traits_type::eq_int_type(c, traits_type::eof())) {
        const char byte = traits_type::to_char_type(c);
        xsputn(&byte, 1);
      }
      return traits_type::not_eof(c);
    }

   private:
    static constexpr std::size_t borrow_bytes = 4096;
    encoded_checkpoint& out_;
  };

  checkpoint kept_;
  std::map<const void*, const std::string*> names_;  // each tensor's name by where its bytes start
  std::string own_;
  std::vector<piece> pieces_;
  std::uint64_t size_ = checkpoint_header_bytes, checksum_ = 0;
};

inline std::string encode_checkpoint(const checkpoint& ckpt) { return encoded_checkpoint(ckpt).str(); }

// The checksum an encoded checkpoint carries of its payload.
inline std::uint64_t stored_checksum(std::string_view encoded) {
  decentrain::detail::check(encoded.size() >= checkpoint_header_bytes, "checkpoint: ", encoded.size(),
                            " bytes are shorter than a header");
  return streams::read_le(encoded, 20, 8);
}

// Reads what encode_checkpoint wrote, given in pieces, one after the other (one for a file);
// `where` names the source in errors (a file, a peer). A tensor that `into` holds under the same
// name, dtype and shape (contiguous) is decoded into that tensor's memory and returned as that
// handle (a state taken over the one it replaces, which then loads it onto itself:
// fault::elastic's heal), the others into new storage; bytes that lie where they are to go
// already (a state whose tensors landed in `into`'s memory: fault::transfer_state) are not copied.
// The checksum is checked before anything is written; a payload that passes it and is
// malformed still fails, having overwritten the tensors before the fault.
inline checkpoint decode_checkpoint(const std::vector<std::string_view>& pieces, const std::string& where,
                                    const checkpoint& into = {}) {
  constexpr std::size_t header = checkpoint_header_bytes;
  std::size_t total = 0;
  for (const auto p : pieces) total += p.size();
  const std::string_view first = pieces.empty() ? std::string_view() : pieces.front();
  decentrain::detail::check(total >= header, where, " is truncated (", total, " bytes, header needs ", header, ")");
  decentrain::detail::check(first.size() >= header, where, ": its header is split (", first.size(), " bytes in its first piece)");
  decentrain::detail::check(first.compare(0, sizeof checkpoint_magic, std::string_view(checkpoint_magic, sizeof checkpoint_magic)) == 0,
                            where, " has a bad magic number (not a decentrain checkpoint)");
  const auto get = [&](std::size_t at, int bytes) { return streams::read_le(first, at, bytes); };
  const auto version = get(8, 4), length = get(12, 8), checksum = get(20, 8);
  decentrain::detail::check(version >= 1 && version <= checkpoint_version, where, " has version ", version,
                            ", expected 1 to ", checkpoint_version);
  decentrain::detail::check(total - header == length, where, " is truncated or padded: payload of ", total - header,
                            " bytes, header says ", length);
  std::vector<std::string_view> body(pieces.begin(), pieces.end());
  body.front().remove_prefix(header);
  decentrain::detail::check(checkpoint_checksum(body, static_cast<std::uint32_t>(version)) == checksum, where,
                            " is corrupt (checksum mismatch)");
  checkpoint ckpt;
  try {
    decentrain::detail::bounded_input_archive ar(body, where);
    // Whether any piece lies in the memory of a tensor of `into` (a state landed there).
    bool overlap = false;
    for (const auto& [name, t] : into.tensors) {
      if (!t.defined() || t.nbytes() == 0) continue;
      const auto* lo = static_cast<const char*>(t.raw_data());
      for (const auto p : body) overlap = overlap || (!p.empty() && p.data() < lo + t.nbytes() && lo < p.data() + p.size());
    }
    ar.set_sources_may_alias(overlap);
    // checkpoint::serialize, with the tensors' map read as cereal writes a map: its size, then
    // each name and tensor.
    cereal::size_type n = 0;
    ar(cereal::make_size_tag(n));
    for (cereal::size_type i = 0; i < n; ++i) {
      std::string name;
      tensor<cpu> t;
      ar(name);
      const auto reuse = into.tensors.find(name);
      decentrain::detail::check(!ckpt.tensors.contains(name), "tensor '", name, "' is stored twice");
      load_tensor(ar, t, reuse == into.tensors.end() ? nullptr : &reuse->second);
      ckpt.tensors.emplace(std::move(name), std::move(t));
    }
    ar(ckpt.counters, ckpt.rngs, ckpt.text);
  } catch (const std::exception& e) {
    // cereal's own errors, our field checks, and bad_alloc/length_error from a container length
    // that is garbage: all mean the payload is not a checkpoint this code wrote.
    decentrain::detail::fail(where, " cannot be decoded: ", e.what());
  }
  return ckpt;
}

inline checkpoint decode_checkpoint(std::string_view data, const std::string& where, const checkpoint& into = {}) {
  return decode_checkpoint(std::vector{data}, where, into);
}

inline void save_checkpoint(const std::filesystem::path& path, const checkpoint& ckpt) {
  write_file_atomically(path, encoded_checkpoint(ckpt).pieces());
}

inline checkpoint load_checkpoint(const std::filesystem::path& path) {
  return decode_checkpoint(read_file(path), "checkpoint " + path.string());
}

}  // namespace decentrain::io
