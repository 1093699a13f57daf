// GPT-2's BPE tokenizer against ids from the reference encoder (tests/reference/gpt2_tokens.js),
// its vocabulary files' errors, and the JSON reader's \u surrogates and number grammar.
#include <decentrain/data/gpt2_tokenizer.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>

namespace data = decentrain::data;
namespace io = decentrain::io;
using Catch::Matchers::Contains;

namespace {
const data::gpt2_tokenizer& gpt2() {
  static const auto tokenizer = data::gpt2_tokenizer::load(DECENTRAIN_GPT2_VOCAB_DIR);
  return tokenizer;
}
std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
std::vector<std::int32_t> ints(const io::json_value& array) {
  std::vector<std::int32_t> out;
  for (const auto& v : array.items) out.push_back(static_cast<std::int32_t>(v.as_int()));
  return out;
}
std::filesystem::path fresh_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("decentrain_test_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}
}  // namespace

TEST_CASE("gpt2_tokenizer loads GPT-2's vocabulary", "[data][gpt2]") {
  CHECK(gpt2().vocab_size() == 50257);
  CHECK(gpt2().merge_count() == 50000);
  CHECK(gpt2().end_of_text_id() == 50256);
  CHECK(gpt2().token_bytes(50256) == "<|endoftext|>");
  CHECK(gpt2().token_bytes(220) == " ");
  CHECK(gpt2().token_bytes(198) == "\n");
  CHECK_THROWS_WITH(gpt2().token_bytes(50257), Contains("id 50257 is outside [0, 50257)"));
}

TEST_CASE("gpt2_tokenizer gives the reference encoder's ids on tricky and random strings", "[data][gpt2]") {
  const auto fixture = io::parse_json(slurp(DECENTRAIN_FIXTURE_DIR "/gpt2_tokens.json"));
  const auto& cases = fixture.at("cases").items;
  REQUIRE(cases.size() > 300);
  std::size_t tokens = 0;
  for (const auto& c : cases) {
    const std::string& text = c.at("text").as_string();
    const auto expected = ints(c.at("ids"));
    INFO("text: '" << text << "'");
    CHECK(gpt2().encode_ordinary(text) == expected);
    CHECK(gpt2().decode(expected) == text);
    tokens += expected.size();
  }
  CHECK(tokens > 3000);
}

TEST_CASE("gpt2_tokenizer: encode reads <|endoftext|> as the special token, encode_ordinary as text", "[data][gpt2]") {
  const auto& t = gpt2();
  auto joined = t.encode_ordinary("one");
  joined.push_back(50256);
  for (auto id : t.encode_ordinary(" two")) joined.push_back(id);
  joined.push_back(50256);
  CHECK(t.encode("one<|endoftext|> two<|endoftext|>") == joined);
  CHECK(t.encode_ordinary("<|endoftext|>").size() > 1);
  CHECK(t.decode(t.encode("a<|endoftext|>b")) == "a<|endoftext|>b");
}

TEST_CASE("gpt2_tokenizer round-trips any bytes, invalid UTF-8 and long runs included", "[data][gpt2]") {
  const auto& t = gpt2();
  std::mt19937 gen(7);
  for (int i = 0; i < 200; ++i) {
    std::string bytes(static_cast<std::size_t>(gen() % 64), '\0');
    for (auto& b : bytes) b = static_cast<char>(gen() % 256);
    CHECK(t.decode(t.encode_ordinary(bytes)) == bytes);
  }
  // A megabyte of letters or of newlines is one piece: merged in n log n, into ids that decode
  // back (GPT-2 has no merges of spaces, so a run of spaces stays one id per space).
  std::string letters;
  for (int i = 0; i < (1 << 19); ++i) letters += "ab";
  for (const std::string& run : {letters, std::string(std::size_t{1} << 20, '\n') + "x"}) {
    const auto ids = t.encode_ordinary(run);
    CHECK(ids.size() <= run.size() / 2 + 2);
    CHECK(t.decode(ids) == run);
  }
  // Truncated and overlong sequences stand as single bytes.
  for (std::string bad : {"\xe6\x97", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "a\xff" "b"})
    CHECK(t.decode(t.encode_ordinary(bad)) == bad);
}

TEST_CASE("gpt2_tokenizer reads Hugging Face's file names and names what is wrong with bad files", "[data][gpt2]") {
  const auto hf = fresh_dir("gpt2_hf");
  std::filesystem::copy_file(DECENTRAIN_GPT2_VOCAB_DIR "/encoder.json", hf / "vocab.json");
  std::filesystem::copy_file(DECENTRAIN_GPT2_VOCAB_DIR "/vocab.bpe", hf / "merges.txt");
  CHECK(data::gpt2_tokenizer::load(hf).encode_ordinary("Hello world") == std::vector<std::int32_t>{15496, 995});
  CHECK_THROWS_WITH(data::gpt2_tokenizer::load(fresh_dir("gpt2_empty")),
                    Contains("holds neither encoder.json + vocab.bpe nor vocab.json + merges.txt"));

  // A small vocabulary: the 256 byte tokens, "ab", and <|endoftext|>.
  std::string vocab = "{";
  const auto forward = decentrain::detail::byte_to_code_point();
  for (int b = 0; b < 256; ++b) {
    std::string key;
    io::json_value v;
    const auto cp = forward[static_cast<std::size_t>(b)];
    if (cp < 0x80) key = std::string(1, static_cast<char>(cp));
    else key = {static_cast<char>(0xc0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3f))};
    vocab += io::json_quote(key) + ":" + std::to_string(b) + ",";
  }
  const std::string good = vocab + "\"ab\":256,\"<|endoftext|>\":257}";
  const data::gpt2_tokenizer small(good, "#version: 0.2\na b\n");
  CHECK(small.encode_ordinary("abab ab") == std::vector<std::int32_t>{256, 256, 32, 256});
  CHECK_THROWS_WITH(data::gpt2_tokenizer(good, "#version: 0.2\na c\n"),
                    Contains("line 2 ('a c') uses or makes a token the vocabulary lacks"));
  CHECK_THROWS_WITH(data::gpt2_tokenizer(good, "a b\na  b\n"), Contains("line 2 is 'a  b', expected two entries"));
  CHECK_THROWS_WITH(data::gpt2_tokenizer(good, "a b\na b\n"), Contains("line 2 repeats an earlier merge"));
  CHECK_THROWS_WITH(data::gpt2_tokenizer(good, "#version: 0.2\n"), Contains("holds no merges"));
  CHECK_THROWS_WITH(data::gpt2_tokenizer(vocab + "\"ab\":258,\"<|endoftext|>\":257}", "a b\n"),
                    Contains("entry 'ab' has id the number 258, expected an integer in [0, 258)"));
  CHECK_THROWS_WITH(data::gpt2_tokenizer(vocab + "\"ab\":-1,\"<|endoftext|>\":257}", "a b\n"), Contains("entry 'ab' has id"));
  CHECK_THROWS_WITH(data::gpt2_tokenizer(vocab + "\"ab\":257,\"<|endoftext|>\":257}", "a b\n"),
                    Contains("id 257 is given to two entries"));
  CHECK_THROWS_WITH(data::gpt2_tokenizer(vocab + "\"ab\":256,\"zz\":257}", "a b\n"), Contains("has no <|endoftext|> token"));
  CHECK_THROWS_WITH(data::gpt2_tokenizer(vocab + "\"ab\":256,\"\u20ac\":257}", "a b\n"),
                    Contains("holds U+20ac, which is not one of GPT-2's byte characters"));
  CHECK_THROWS_WITH(data::gpt2_tokenizer("{\"a\":0}", "a b\n", "v.json"), Contains("v.json lacks the token for byte 0"));
  CHECK_THROWS_WITH(data::gpt2_tokenizer("[1,2]", "a b\n", "v.json"), Contains("v.json is not a JSON object"));
  CHECK_THROWS_WITH(data::gpt2_tokenizer("{\"a\":", "a b\n", "v.json"), Contains("v.json: json: unexpected end of input"));
}

TEST_CASE("json reader: surrogate pairs in escapes and the number grammar of JSON", "[io][json]") {
  CHECK(io::parse_json(R"("\ud83d\ude00 \u00e9\u4e2d")").as_string() == "\xf0\x9f\x98\x80 \xc3\xa9\xe4\xb8\xad");
  CHECK_THROWS_WITH(io::parse_json(R"("\ud83d")"), Contains("high surrogate without a low one"));
  CHECK_THROWS_WITH(io::parse_json(R"("\ud83d\u0041")"), Contains("high surrogate without a low one"));
  CHECK_THROWS_WITH(io::parse_json(R"("\ude00")"), Contains("low surrogate without a high one"));
  for (const char* ok : {"0", "-0", "12", "-3.25", "1e5", "1E-5", "2.5e+10"})
    CHECK(io::parse_json(ok).text == ok);
  for (const char* bad : {"01", "1.", ".5", "-", "+1", "1e", "1e+", "--1", "1.2.3", "0x10", "1-2"})
    CHECK_THROWS_AS(io::parse_json(bad), decentrain::error);
}
