// GPT-2's tokenizer on tinyshakespeare against the reference encoder's ids (their count, hash,
// per-chunk hashes and first ids, in tests/reference/fixtures/gpt2_tokens.json). The text is not
// in the repository: it is looked for in DECENTRAIN_SHARED_DATA, then ../shared/data beside the
// source tree; without it the program says so and exits 77, which CTest reports as skipped.
#include <decentrain/data/gpt2_tokenizer.hpp>
#include <decentrain/detail/hash.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

namespace {
std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
std::string hex(std::uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}
std::string ids_hash(const std::int32_t* ids, std::size_t n) {  // FNV-1a over little-endian uint32
  std::string bytes;
  for (std::size_t i = 0; i < n; ++i)
    for (int k = 0; k < 4; ++k) bytes += static_cast<char>((static_cast<std::uint32_t>(ids[i]) >> (8 * k)) & 0xff);
  return hex(decentrain::detail::fnv1a(bytes));
}
}  // namespace

int main() {
  std::filesystem::path text_path = std::filesystem::path(DECENTRAIN_SOURCE_DIR) / "../shared/data/tinyshakespeare.txt";
  if (const char* dir = std::getenv("DECENTRAIN_SHARED_DATA")) text_path = std::filesystem::path(dir) / "tinyshakespeare.txt";
  if (!std::filesystem::exists(text_path)) {
    std::cout << "skipped: " << text_path.string() << " not found (set DECENTRAIN_SHARED_DATA)\n";
    return 77;
  }
  const auto fixture = decentrain::io::parse_json(slurp(DECENTRAIN_SOURCE_DIR "/tests/reference/fixtures/gpt2_tokens.json"));
  const auto& ref = fixture.at("tinyshakespeare");
  const std::string text = slurp(text_path);
  int failures = 0;
  const auto expect = [&](bool ok, const std::string& what) {
    std::cout << (ok ? "ok:     " : "FAILED: ") << what << "\n";
    failures += ok ? 0 : 1;
  };
  expect(hex(decentrain::detail::fnv1a(text)) == ref.at("text_fnv1a").as_string(),
         "the text is the one the reference encoded (" + std::to_string(text.size()) + " bytes)");
  const auto tokenizer = decentrain::data::gpt2_tokenizer::load(DECENTRAIN_SOURCE_DIR "/data/gpt2");
  const auto ids = tokenizer.encode_ordinary(text);
  expect(static_cast<std::int64_t>(ids.size()) == ref.at("count").as_int(),
         std::to_string(ids.size()) + " ids, reference " + ref.at("count").text);
  const auto& head = ref.at("head").items;
  bool head_ok = ids.size() >= head.size();
  for (std::size_t i = 0; head_ok && i < head.size(); ++i) head_ok = ids[i] == head[i].as_int();
  expect(head_ok, "the first " + std::to_string(head.size()) + " ids");
  const auto chunk = static_cast<std::size_t>(ref.at("chunk").as_int());
  const auto& chunks = ref.at("chunk_fnv1a").items;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const auto begin = c * chunk;
    if (begin >= ids.size()) break;
    const auto n = std::min(chunk, ids.size() - begin);
    if (ids_hash(ids.data() + begin, n) != chunks[c].as_string()) {
      expect(false, "ids " + std::to_string(begin) + " to " + std::to_string(begin + n) + " differ");
      break;
    }
  }
  expect(ids_hash(ids.data(), ids.size()) == ref.at("ids_fnv1a").as_string(), "the hash of all ids");
  expect(tokenizer.decode(ids) == text, "decode(encode(text)) == text");
  return failures == 0 ? 0 : 1;
}
