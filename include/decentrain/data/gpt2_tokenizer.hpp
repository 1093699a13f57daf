// GPT-2's byte-level BPE tokenizer: loads the published vocabulary (OpenAI's encoder.json +
// vocab.bpe, or Hugging Face's vocab.json + merges.txt), splits text with GPT-2's
// pre-tokenisation rule, and merges bytes by rank. Its ids are those of GPT-2, llm.c's shards
// and Hugging Face's GPT-2 weights; exactly gpt-3-encoder's, whose `\s` is JavaScript's (Python's
// differs on a few rare characters: U+0085, U+001C-U+001F, U+FEFF).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "decentrain/data/unicode_classes.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/io/json.hpp"

namespace decentrain::detail {

enum class code_class : std::uint8_t { letter, number, space, other };

template <std::size_t N>
bool in_ranges(const std::array<data::unicode::code_range, N>& ranges, std::uint32_t cp) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                             [](std::uint32_t c, const data::unicode::code_range& r) { return c < r.first; });
  return it != ranges.begin() && cp <= std::prev(it)->last;
}

inline code_class classify(std::uint32_t cp) {
  if (cp < 128) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return code_class::letter;
    if (cp >= '0' && cp <= '9') return code_class::number;
    if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return code_class::space;
    return code_class::other;
  }
  if (in_ranges(data::unicode::letter_ranges, cp)) return code_class::letter;
  if (in_ranges(data::unicode::number_ranges, cp)) return code_class::number;
  if (in_ranges(data::unicode::space_ranges, cp)) return code_class::space;
  return code_class::other;
}

// The code point starting at text[pos] and its length in bytes. A byte that does not start a
// well-formed UTF-8 sequence is one code point of its own, classed as "other" (reported as
// U+FFFD), so any byte string tokenizes and decodes back to itself.
inline std::pair<std::uint32_t, std::size_t> next_code_point(std::string_view text, std::size_t pos) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char b0 = byte(pos);
  if (b0 < 0x80) return {b0, 1};
  std::size_t len = b0 >= 0xf0 && b0 <= 0xf4 ? 4 : b0 >= 0xe0 ? 3 : b0 >= 0xc2 && b0 < 0xe0 ? 2 : 0;
  if (b0 > 0xf4) len = 0;
  if (len == 0 || pos + len > text.size()) return {0xfffd, 1};
  std::uint32_t cp = b0 & (0x7fu >> len);
  for (std::size_t i = 1; i < len; ++i) {
    if ((byte(pos + i) & 0xc0) != 0x80) return {0xfffd, 1};
    cp = (cp << 6) | (byte(pos + i) & 0x3fu);
  }
  const bool overlong = (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
  if (overlong || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return {0xfffd, 1};
  return {cp, len};
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for U+0100 on,
// so every vocabulary entry is printable text.
inline std::array<std::uint32_t, 256> byte_to_code_point() {
  std::array<std::uint32_t, 256> table{};
  std::uint32_t next = 256;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    table[b] = printable ? b : next++;
  }
  return table;
}

}  // namespace decentrain::detail

namespace decentrain::data {

class gpt2_tokenizer {
 public:
  static constexpr std::string_view end_of_text = "<|endoftext|>";

  // From a folder holding encoder.json + vocab.bpe (OpenAI) or vocab.json + merges.txt
  // (Hugging Face).
  static gpt2_tokenizer load(const std::filesystem::path& dir) {
    namespace fs = std::filesystem;
    for (auto [vocab, merges] : {std::pair{"encoder.json", "vocab.bpe"}, std::pair{"vocab.json", "merges.txt"}})
      if (fs::exists(dir / vocab) && fs::exists(dir / merges)) return load(dir / vocab, dir / merges);
    detail::fail("gpt2_tokenizer: ", dir.string(),
                             " holds neither encoder.json + vocab.bpe nor vocab.json + merges.txt");
  }
  static gpt2_tokenizer load(const std::filesystem::path& vocab_json, const std::filesystem::path& merges) {
    return gpt2_tokenizer(read(vocab_json), read(merges), vocab_json.string(), merges.string());
  }

  // From the two files' contents; `vocab_name` and `merges_name` only label error messages.
  gpt2_tokenizer(std::string_view vocab_json, std::string_view merges, const std::string& vocab_name = "vocab",
                 const std::string& merges_name = "merges") {
    load_vocabulary(vocab_json, vocab_name);
    load_merges(merges, merges_name);
    auto eot = ids_.find(std::string(end_of_text));
    detail::check(eot != ids_.end(), "gpt2_tokenizer: ", vocab_name, " has no ", end_of_text, " token");
    end_of_text_id_ = eot->second;
  }

  std::int64_t vocab_size() const { return static_cast<std::int64_t>(tokens_.size()); }
  std::int32_t end_of_text_id() const { return end_of_text_id_; }
  std::size_t merge_count() const { return merges_.size(); }
  const std::string& token_bytes(std::int32_t id) const {
    check_id(id);
    return tokens_[static_cast<std::size_t>(id)];
  }

  // Every byte of `text` is text: "<|endoftext|>" is spelled out, as GPT-2's encoder.py and
  // gpt-3-encoder do.
  std::vector<std::int32_t> encode_ordinary(std::string_view text) const {
    // Offsets below are 32-bit: a larger text goes in parts (as `prepare` does, per document).
    detail::check(text.size() < (std::size_t{1} << 31), "gpt2_tokenizer: ", text.size(),
                  " bytes in one call; encode at most 2 GiB at a time");
    std::vector<std::int32_t> out;
    out.reserve(text.size() / 3 + 1);
    std::unordered_map<std::string_view, std::pair<std::uint32_t, std::uint32_t>> seen;  // piece -> span of out
    for (std::size_t pos = 0; pos < text.size();) {
      const std::size_t end = piece_end(text, pos);
      const std::string_view piece = text.substr(pos, end - pos);
      pos = end;
      if (piece.size() == 1) {
        out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
        continue;
      }
      if (auto it = seen.find(piece); it != seen.end()) {
        const auto [first, count] = it->second;
        for (std::uint32_t k = 0; k < count; ++k) out.push_back(out[first + k]);
        continue;
      }
      const auto first = static_cast<std::uint32_t>(out.size());
      merge_piece(piece, out);
      // A piece's ids are copied from its first occurrence; the table is cleared when it grows
      // large so memory stays bounded on long inputs.
      if (seen.size() >= (std::size_t{1} << 16)) seen.clear();
      seen.emplace(piece, std::pair{first, static_cast<std::uint32_t>(out.size()) - first});
    }
    return out;
  }

  // As encode_ordinary, but each "<|endoftext|>" in the text becomes the special token (as Hugging
  // Face's GPT-2 tokenizer does); the way to join documents.
  std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> out;
    while (true) {
      const auto at = text.find(end_of_text);
      const auto part = encode_ordinary(text.substr(0, at));
      out.insert(out.end(), part.begin(), part.end());
      if (at == std::string_view::npos) return out;
      out.push_back(end_of_text_id_);
      text.remove_prefix(at + end_of_text.size());
    }
  }

  // The bytes the ids stand for (which need not be whole UTF-8 characters at the ends).
  std::string decode(const std::vector<std::int32_t>& ids) const {
    std::string out;
    for (auto id : ids) out += token_bytes(id);
    return out;
  }

  // GPT-2's pre-tokenisation, the regular expression
  //   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  // written out: the end of the piece that starts at `pos`.
  static std::size_t piece_end(std::string_view text, std::size_t pos) {
    using detail::code_class;
    using detail::classify;
    using detail::next_code_point;
    const auto class_at = [&](std::size_t p) { return classify(next_code_point(text, p).first); };
    const auto run_end = [&](std::size_t p, code_class c) {  // past the run of class c from p
      while (p < text.size()) {
        const auto [cp, len] = next_code_point(text, p);
        if (classify(cp) != c) break;
        p += len;
      }
      return p;
    };
    if (text[pos] == '\'') {
      for (std::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"})
        if (text.substr(pos + 1, suffix.size()) == suffix) return pos + 1 + suffix.size();
    }
    const auto [cp, len] = next_code_point(text, pos);
    const code_class first = classify(cp);
    if (cp == ' ' && pos + 1 < text.size()) {
      const code_class second = class_at(pos + 1);
      if (second != code_class::space) return run_end(pos + 1, second);
    }
    if (first != code_class::space) return run_end(pos, first);
    // Whitespace: the run, less its last character when a non-space follows (that character
    // then leads the next piece, as " word"); a single space before a non-space stands alone.
    std::size_t end = pos, last_start = pos;
    while (end < text.size()) {
      const auto [c, l] = next_code_point(text, end);
      if (classify(c) != code_class::space) break;
      last_start = end;
      end += l;
    }
    if (end == text.size() || last_start == pos) return end;
    return last_start;
  }

 private:
  static std::string read(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    detail::check(in.good(), "gpt2_tokenizer: cannot open ", path.string());
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  void check_id(std::int32_t id) const {
    detail::check(id >= 0 && id < vocab_size(), "gpt2_tokenizer: id ", id, " is outside [0, ",
                              vocab_size(), ")");
  }

  // A vocabulary entry's text back to the bytes it stands for.
  static std::string entry_bytes(std::string_view entry, const std::string& where) {
    static const auto to_byte = [] {
      std::array<int, 512> t;
      t.fill(-1);
      const auto forward = detail::byte_to_code_point();
      for (int b = 0; b < 256; ++b) t[forward[static_cast<std::size_t>(b)]] = b;
      return t;
    }();
    std::string out;
    for (std::size_t p = 0; p < entry.size();) {
      const auto [cp, len] = detail::next_code_point(entry, p);
      detail::check(cp < to_byte.size() && to_byte[cp] >= 0, "gpt2_tokenizer: ", where, ": entry '",
                                entry, "' holds U+", std::hex, cp, std::dec,
                                ", which is not one of GPT-2's byte characters");
      out += static_cast<char>(to_byte[cp]);
      p += len;
    }
    return out;
  }

  void load_vocabulary(std::string_view json, const std::string& name) {
    io::json_value doc;
    try {
      doc = io::parse_json(json);
    } catch (const error& e) {
      detail::fail("gpt2_tokenizer: ", name, ": ", e.what());
    }
    detail::check(doc.is(io::json_value::kind::object) && !doc.members.empty(), "gpt2_tokenizer: ", name,
                              " is not a JSON object of token -> id");
    tokens_.assign(doc.members.size(), std::string());
    std::vector<bool> taken(doc.members.size(), false);
    for (const auto& [entry, value] : doc.members) {
      const bool integer = value.is(io::json_value::kind::number) &&
                           value.text.find_first_not_of("0123456789") == std::string::npos && value.text.size() <= 9;
      const std::int64_t id = integer ? std::stoll(value.text) : -1;
      detail::check(id >= 0 && id < static_cast<std::int64_t>(tokens_.size()), "gpt2_tokenizer: ", name,
                                ": entry '", entry, "' has id ", value.describe(), ", expected an integer in [0, ",
                                tokens_.size(), ")");
      const auto i = static_cast<std::size_t>(id);
      detail::check(!taken[i], "gpt2_tokenizer: ", name, ": id ", id, " is given to two entries");
      taken[i] = true;
      tokens_[i] = entry_bytes(entry, name);
      const bool fresh = ids_.emplace(tokens_[i], static_cast<std::int32_t>(id)).second;
      detail::check(fresh, "gpt2_tokenizer: ", name, ": entry '", entry, "' repeats another's bytes");
    }
    for (int b = 0; b < 256; ++b) {
      auto it = ids_.find(std::string(1, static_cast<char>(b)));
      detail::check(it != ids_.end(), "gpt2_tokenizer: ", name, " lacks the token for byte ", b);
      byte_ids_[static_cast<std::size_t>(b)] = it->second;
    }
  }

  void load_merges(std::string_view text, const std::string& name) {
    std::size_t line_no = 0;
    while (!text.empty()) {
      const auto eol = text.find('\n');
      std::string_view line = text.substr(0, eol);
      text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty() || line.substr(0, 8) == "#version") continue;
      const auto space = line.find(' ');
      detail::check(space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
                                    line.find(' ', space + 1) == std::string_view::npos,
                                "gpt2_tokenizer: ", name, " line ", line_no, " is '", line,
                                "', expected two entries separated by one space");
      const auto left = entry_bytes(line.substr(0, space), name);
      const auto right = entry_bytes(line.substr(space + 1), name);
      const auto id_of = [&](const std::string& bytes) {
        auto it = ids_.find(bytes);
        detail::check(it != ids_.end(), "gpt2_tokenizer: ", name, " line ", line_no, " ('", line,
                                  "') uses or makes a token the vocabulary lacks");
        return it->second;
      };
      const std::uint64_t key = pair_key(id_of(left), id_of(right));
      const merge m{static_cast<std::uint32_t>(merges_.size()), id_of(left + right)};
      detail::check(merges_.emplace(key, m).second, "gpt2_tokenizer: ", name, " line ", line_no,
                                " repeats an earlier merge");
    }
    detail::check(!merges_.empty(), "gpt2_tokenizer: ", name, " holds no merges");
  }

  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }

  // Byte-pair merging of one piece: repeatedly the adjacent pair of lowest rank, the leftmost
  // first among equals. That is GPT-2's loop (which merges every occurrence of the best pair per
  // pass): a merge's result only forms pairs of later rank. A heap keeps long pieces (a
  // megabyte of spaces) at n log n.
  void merge_piece(std::string_view piece, std::vector<std::int32_t>& out) const {
    const auto n = piece.size();
    std::vector<std::int32_t> id(n);
    std::vector<std::int32_t> next(n), prev(n);
    for (std::size_t i = 0; i < n; ++i) {
      id[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
      next[i] = i + 1 < n ? static_cast<std::int32_t>(i + 1) : -1;
      prev[i] = static_cast<std::int32_t>(i) - 1;
    }
    struct candidate {
      std::uint32_t rank;
      std::int32_t left;
      std::int32_t left_id, right_id, result;
      bool operator>(const candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::vector<candidate> heap;
    const auto push = [&](std::int32_t left) {
      if (left < 0 || next[static_cast<std::size_t>(left)] < 0) return;
      const auto a = id[static_cast<std::size_t>(left)], b = id[static_cast<std::size_t>(next[static_cast<std::size_t>(left)])];
      if (auto it = merges_.find(pair_key(a, b)); it != merges_.end()) {
        heap.push_back({it->second.rank, left, a, b, it->second.result});
        std::push_heap(heap.begin(), heap.end(), std::greater<>{});
      }
    };
    for (std::size_t i = 0; i + 1 < n; ++i) push(static_cast<std::int32_t>(i));
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
      const candidate c = heap.back();
      heap.pop_back();
      const auto l = static_cast<std::size_t>(c.left);
      const auto r = next[l];
      // Stale when either side has merged since the pair was seen (a dead symbol keeps id -1).
      if (r < 0 || id[l] != c.left_id || id[static_cast<std::size_t>(r)] != c.right_id) continue;
      id[l] = c.result;
      id[static_cast<std::size_t>(r)] = -1;
      next[l] = next[static_cast<std::size_t>(r)];
      if (next[l] >= 0) prev[static_cast<std::size_t>(next[l])] = c.left;
      push(prev[l]);
      push(c.left);
    }
    for (std::int32_t i = 0; i >= 0; i = next[static_cast<std::size_t>(i)]) out.push_back(id[static_cast<std::size_t>(i)]);
  }

  struct merge {
    std::uint32_t rank;
    std::int32_t result;
  };
  std::vector<std::string> tokens_;                     // id -> bytes
  std::unordered_map<std::string, std::int32_t> ids_;   // bytes -> id
  std::unordered_map<std::uint64_t, merge> merges_;     // (left id, right id) -> rank, result
  std::array<std::int32_t, 256> byte_ids_{};
  std::int32_t end_of_text_id_ = -1;
};

}  // namespace decentrain::data
