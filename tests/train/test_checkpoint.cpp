// Checkpoints: every field round-trips, resuming reproduces the uninterrupted run bit for bit,
// and truncated, corrupt or mismatched files fail with a clear error.
#include <decentrain/decentrain.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace dt = decentrain;
using Catch::Matchers::Contains;

namespace {
std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("decentrain_ckpt_" + name);
}

struct run {
  dt::data::token_dataset data;
  dt::nn::gpt_config cfg;
  explicit run(const std::string& text) : data(dt::data::char_tokenizer::from_text(text).encode(text)), cfg(dt::nn::gpt_preset("tiny")) {
    cfg.vocab_size = dt::data::char_tokenizer::from_text(text).vocab_size();
    cfg.block_size = 16;
    cfg.dropout = 0.1;  // makes the dropout rng part of the state to restore
  }
  // Trains steps [from, to) and returns their losses.
  std::vector<double> train(dt::nn::gpt<>& model, dt::optim::adamw<>& opt, dt::rng& drop, std::int64_t from, std::int64_t to) {
    std::vector<double> losses;
    for (std::int64_t s = from; s < to; ++s) {
      auto [x, y] = data.batch(dt::data::split::train, s, 4, 16, 3);
      auto loss = model.loss(x, y, &drop);
      model.parameters().zero_grad();
      loss.backward();
      opt.step();
      losses.push_back(loss.item());
    }
    return losses;
  }
};
}  // namespace

TEST_CASE("a checkpoint round-trips tensors of every dtype, counters, rngs and text", "[io][checkpoint]") {
  dt::io::checkpoint c;
  dt::rng gen(5, "ckpt");
  c.tensors["a"] = dt::randn(dt::shape{3, 4}, gen);
  c.tensors["b"] = dt::randn(dt::shape{5}, gen, dt::dtype::f64);
  c.tensors["c"] = dt::randn(dt::shape{2, 2}, gen, dt::dtype::bf16);
  c.tensors["d"] = dt::arange(7, dt::dtype::i32);
  c.tensors["e"] = dt::full(dt::shape{}, 3.0);
  c.counters["step"] = 123456789012345;
  c.rngs["dropout"] = gen.state();
  c.text["tokenizer"] = std::string("ab\0c", 4);
  const auto path = temp_file("roundtrip.ckpt");
  dt::io::save_checkpoint(path, c);
  CHECK_FALSE(std::filesystem::exists(path.string() + ".tmp"));
  const auto back = dt::io::load_checkpoint(path);
  for (const auto& [name, t] : c.tensors) {
    INFO(name);
    REQUIRE(back.tensors.count(name) == 1);
    CHECK(back.tensors.at(name).dtype() == t.dtype());
    CHECK(back.tensors.at(name).shape() == t.shape());
    CHECK(back.tensors.at(name).to_vector<double>() == t.to_vector<double>());
  }
  CHECK(back.counters == c.counters);
  CHECK(back.rngs == c.rngs);
  CHECK(back.text == c.text);
  std::filesystem::remove(path);
}

TEST_CASE("resuming from a checkpoint reproduces the uninterrupted run bit for bit", "[io][checkpoint][resume]") {
  run r(dt::data::builtin_corpus(20000, 4));
  dt::rng init_a(1, "init"), drop_a(2, "dropout");
  dt::nn::gpt<> straight(r.cfg, init_a);
  dt::optim::adamw<> opt_a(straight.parameters(), {2e-3, 0.9, 0.95, 1e-8, 0.1});
  const auto expected = r.train(straight, opt_a, drop_a, 0, 12);

  dt::rng init_b(1, "init"), drop_b(2, "dropout");
  dt::nn::gpt<> first(r.cfg, init_b);
  dt::optim::adamw<> opt_b(first.parameters(), {2e-3, 0.9, 0.95, 1e-8, 0.1});
  auto losses = r.train(first, opt_b, drop_b, 0, 6);
  auto c = dt::train::capture(first, opt_b, 6);
  c.rngs["dropout"] = drop_b.state();
  const auto path = temp_file("resume.ckpt");
  dt::io::save_checkpoint(path, c);

  const auto loaded = dt::io::load_checkpoint(path);
  dt::rng other_init(99, "init"), drop_c(0, "dropout");  // everything must come from the file
  dt::nn::gpt<> resumed(dt::train::config_of<dt::nn::gpt_config>(loaded), other_init);
  dt::optim::adamw<> opt_c(resumed.parameters(), {2e-3, 0.9, 0.95, 1e-8, 0.1});
  const auto step = dt::train::restore(loaded, resumed, opt_c);
  drop_c.set_state(loaded.rngs.at("dropout"));
  CHECK(step == 6);
  const auto rest = r.train(resumed, opt_c, drop_c, step, 12);
  losses.insert(losses.end(), rest.begin(), rest.end());
  REQUIRE(losses.size() == expected.size());
  for (std::size_t i = 0; i < losses.size(); ++i) {
    INFO("step " << i);
    CHECK(losses[i] == expected[i]);  // exact, not approximate
  }
  std::filesystem::remove(path);
}

TEST_CASE("bad checkpoint files fail with clear errors", "[io][checkpoint][errors]") {
  const auto path = temp_file("bad.ckpt");
  dt::io::checkpoint c;
  c.tensors["w"] = dt::ones(dt::shape{4, 4});
  c.counters["step"] = 3;
  dt::io::save_checkpoint(path, c);
  const std::string good = dt::io::read_file(path);
  auto write = [&](const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; };

  write(good.substr(0, good.size() - 9));
  CHECK_THROWS_WITH(dt::io::load_checkpoint(path), Contains("is truncated or padded"));
  write(good.substr(0, 10));
  CHECK_THROWS_WITH(dt::io::load_checkpoint(path), Contains("is truncated (10 bytes"));
  std::string corrupt = good;
  corrupt[corrupt.size() - 5] ^= 0x40;
  write(corrupt);
  CHECK_THROWS_WITH(dt::io::load_checkpoint(path), Contains("is corrupt (checksum mismatch)"));
  std::string magic = good;
  magic[0] = 'X';
  write(magic);
  CHECK_THROWS_WITH(dt::io::load_checkpoint(path), Contains("bad magic number"));
  std::string version = good;
  version[8] = 7;
  write(version);
  CHECK_THROWS_WITH(dt::io::load_checkpoint(path), Contains("has version 7, expected 1 to 3"));
  CHECK_THROWS_WITH(dt::io::load_checkpoint(temp_file("absent.ckpt")), Contains("cannot open"));

  // A well-formed file whose payload is not a checkpoint: the checksum matches, decoding fails.
  std::string garbage = good.substr(0, 28) + std::string(40, '\x7f');
  const std::string_view body(garbage.data() + 28, 40);
  const auto len = body.size();
  const auto sum = dt::io::checkpoint_checksum(body);
  for (int i = 0; i < 8; ++i) garbage[12 + i] = static_cast<char>((len >> (8 * i)) & 0xff);
  for (int i = 0; i < 8; ++i) garbage[20 + i] = static_cast<char>((sum >> (8 * i)) & 0xff);
  write(garbage);
  CHECK_THROWS_WITH(dt::io::load_checkpoint(path), Contains("cannot be decoded"));
  std::filesystem::remove(path);

  // Payloads with valid headers that a donor peer could send (found by fuzz/checkpoint): a
  // length field is refused before anything is allocated for it, and a shape whose strides
  // overflow is refused though it holds no element.
  auto payload = [](auto&& write_fields) {
    std::ostringstream out(std::ios::binary);
    {
      cereal::PortableBinaryOutputArchive ar(out);
      write_fields(ar);
    }
    const std::string body = out.str();
    std::string file(dt::io::checkpoint_magic, sizeof dt::io::checkpoint_magic);
    auto put = [&](std::uint64_t v, int bytes) {
      for (int i = 0; i < bytes; ++i) file.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    };
    put(dt::io::checkpoint_version, 4);
    put(body.size(), 8);
    put(dt::io::checkpoint_checksum(body), 8);
    return file + body;
  };
  const auto long_name = payload([](auto& ar) { ar(cereal::make_size_tag(std::uint64_t{1}), cereal::make_size_tag(std::uint64_t{1} << 50)); });
  CHECK_THROWS_WITH(dt::io::decode_checkpoint(long_name, "from a donor"), Contains("a length of 1125899906842624 with only"));
  const auto strided = payload([](auto& ar) {
    ar(cereal::make_size_tag(std::uint64_t{1}), std::string("w"), std::uint8_t{0},
       std::vector<std::int64_t>{0, std::int64_t{1} << 40, std::int64_t{1} << 40});
  });
  CHECK_THROWS_WITH(dt::io::decode_checkpoint(strided, "from a donor"), Contains("more elements than an int64 can count"));
}

TEST_CASE("a checkpoint written where a folder is, or into a folder under a file, is refused naming it, nothing left behind",
          "[io][checkpoint][errors]") {
  const auto folder = std::filesystem::path(temp_file("a-folder.ckpt"));
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  dt::io::checkpoint c;
  c.counters["step"] = 1;
  CHECK_THROWS_WITH(dt::io::save_checkpoint(folder, c), Contains("cannot write " + folder.string() + ": it is a folder"));
  CHECK(!std::filesystem::exists(folder.string() + ".tmp"));
  const auto file = folder / "plain";
  std::ofstream(file) << "x";
  CHECK_THROWS_WITH(dt::io::make_folder(file / "sub" / "deeper"),
                    Contains("cannot make the folder " + (file / "sub" / "deeper").string() + ": " + file.string() + " is a file"));
  std::filesystem::remove_all(folder);
}

TEST_CASE("checkpoints are checksummed with XXH3, versions 1 (FNV-1a) and 2 (XXH64) still load", "[io][checkpoint]") {
  // xxHash's published values for XXH3 and XXH64 (seed 0).
  CHECK(dt::detail::xxh3("") == 0x2d06800538d394c2ull);
  CHECK(dt::detail::xxh3("abc") == 0x78af5f94892f3950ull);
  CHECK(dt::detail::xxh64("") == 0xef46db3751d8e999ull);
  CHECK(dt::detail::xxh64("abc") == 0x44bc2cf5ad770999ull);
  std::string ramp;
  for (int i = 0; i < 200; ++i) ramp += static_cast<char>(i);
  CHECK(dt::detail::xxh64(ramp) == 0x50dc1079b99e879cull);
  CHECK(dt::detail::xxh64(std::string_view(ramp).substr(0, 47)) == 0x0d9883a03e7bfbb8ull);

  dt::io::checkpoint c;
  c.tensors["w"] = dt::ones(dt::shape{3, 5});
  c.counters["step"] = 11;
  const std::string v3 = dt::io::encode_checkpoint(c);
  const std::string_view body = std::string_view(v3).substr(dt::io::checkpoint_header_bytes);
  CHECK(static_cast<int>(v3[8]) == 3);
  CHECK(dt::io::stored_checksum(v3) == dt::detail::xxh3(body));
  // The same payload as an older version wrote it: its version and its hash in the header.
  for (const auto& [version, sum] : {std::pair{1, dt::detail::fnv1a(body)}, std::pair{2, dt::detail::xxh64(body)}}) {
    std::string old = v3;
    old[8] = static_cast<char>(version);
    for (int i = 0; i < 8; ++i) old[20 + static_cast<std::size_t>(i)] = static_cast<char>((sum >> (8 * i)) & 0xff);
    const auto back = dt::io::decode_checkpoint(old, "an old checkpoint");
    CHECK(back.counter("step") == 11);
    CHECK(back.tensor_at("w").numel() == 15);
    old[40] ^= 1;
    CHECK_THROWS_WITH(dt::io::decode_checkpoint(old, "an old checkpoint"), Contains("checksum mismatch"));
  }
  std::string v4 = v3;
  v4[8] = 4;
  CHECK_THROWS_WITH(dt::io::decode_checkpoint(v4, "a newer checkpoint"), Contains("has version 4, expected 1 to 3"));
}

namespace {
// A state like a peer's: tensors large enough to be read in place (>= 4096 bytes), one small one,
// a transposed (non-contiguous) one, counters and text.
dt::io::checkpoint peer_state(float value, std::int64_t step) {
  dt::io::checkpoint c;
  c.tensors["big"] = dt::full(dt::shape{64, 40}, value);
  c.tensors["bias"] = dt::full(dt::shape{7}, value + 1);
  c.tensors["wide"] = dt::arange(3000, dt::dtype::f32);
  c.tensors["wide"].data<float>()[5] = value;
  c.tensors["t"] = dt::full(dt::shape{40, 64}, value + 2).transpose(0, 1);
  c.counters["step"] = step;
  c.text["note"] = std::string(5000, 'x');
  return c;
}
}  // namespace

TEST_CASE("an encoded checkpoint reads its tensors where they lie, and its bytes are encode_checkpoint's", "[io][checkpoint]") {
  const auto c = peer_state(1.5f, 7);
  const dt::io::encoded_checkpoint e(c);
  const std::string whole = dt::io::encode_checkpoint(c);
  CHECK(e.str() == whole);
  CHECK(e.size() == whole.size());
  CHECK(e.checksum() == dt::io::stored_checksum(whole));
  // The big contiguous tensor's bytes are read in place, not copied.
  const auto pieces = e.pieces();
  CHECK(std::any_of(pieces.begin(), pieces.end(), [&](std::string_view p) { return p.data() == c.tensors.at("big").raw_data(); }));
  // Any range, within a piece or across several, reads as the whole encoding does.
  std::string scratch;
  dt::rng gen(3, "ranges");
  for (int k = 0; k < 200; ++k) {
    const auto at = static_cast<std::uint64_t>(gen.next_u64() % whole.size());
    const auto len = static_cast<std::size_t>(gen.next_u64() % (whole.size() - at + 1));
    REQUIRE(e.bytes(at, len, scratch) == std::string_view(whole).substr(static_cast<std::size_t>(at), len));
  }
  CHECK_THROWS_WITH(e.bytes(whole.size() - 1, 2, scratch), Contains("encoded_checkpoint: bytes ["));
  // A payload that names a tensor twice (its checksum right) is refused.
  dt::io::checkpoint two;
  two.tensors["a1"] = dt::ones(dt::shape{3});
  two.tensors["a2"] = dt::ones(dt::shape{3});
  std::string twice = dt::io::encode_checkpoint(two);
  twice[twice.find("a2") + 1] = '1';
  const auto sum = dt::detail::xxh3(std::string_view(twice).substr(dt::io::checkpoint_header_bytes));
  for (int i = 0; i < 8; ++i) twice[20 + static_cast<std::size_t>(i)] = static_cast<char>((sum >> (8 * i)) & 0xff);
  CHECK_THROWS_WITH(dt::io::decode_checkpoint(twice, "a donor"), Contains("tensor 'a1' is stored twice"));
  // A file is written from the pieces.
  const auto path = temp_file("pieces.ckpt");
  dt::io::save_checkpoint(path, c);
  CHECK(dt::io::read_file(path) == whole);
  std::filesystem::remove(path);
}

TEST_CASE("a checkpoint decodes into the tensors it replaces, and a state landed in place is not copied", "[io][checkpoint]") {
  const auto theirs = peer_state(2.5f, 40);
  const std::string blob = dt::io::encode_checkpoint(theirs);

  SECTION("decoded from a buffer into matching tensors") {
    auto mine = peer_state(0.5f, 3);
    mine.tensors["bias"] = dt::zeros(dt::shape{8});  // another shape: decoded into new storage
    const auto back = dt::io::decode_checkpoint(blob, "a donor", mine);
    CHECK(back.tensor_at("big").shares_storage_with(mine.tensors.at("big")));
    CHECK(back.tensor_at("wide").shares_storage_with(mine.tensors.at("wide")));
    CHECK_FALSE(back.tensor_at("bias").shares_storage_with(mine.tensors.at("bias")));
    CHECK_FALSE(back.tensor_at("t").shares_storage_with(mine.tensors.at("t")));  // not contiguous
    for (const auto& [name, t] : theirs.tensors) CHECK(back.tensor_at(name).to_vector<float>() == t.to_vector<float>());
    CHECK(mine.tensors.at("big").to_vector<float>() == theirs.tensors.at("big").to_vector<float>());
    CHECK(back.counter("step") == 40);
  }

  // As fault::transfer_state lands a state: each placed tensor's bytes in this peer's tensor of
  // that name, the rest as it came; then decoded into this peer's tensors.
  auto landed = [&](dt::io::checkpoint& mine, std::string& rest) {
    const dt::io::encoded_checkpoint donor(theirs);
    rest = donor.str();
    std::vector<std::string_view> pieces;
    std::uint64_t at = 0;
    for (const auto& p : donor.placed_tensors()) {
      auto& t = mine.tensors.at(p.name);
      REQUIRE(t.nbytes() == p.bytes);
      pieces.push_back(std::string_view(rest).substr(static_cast<std::size_t>(at), static_cast<std::size_t>(p.at - at)));
      std::memcpy(t.raw_data(), rest.data() + p.at, static_cast<std::size_t>(p.bytes));
      pieces.emplace_back(static_cast<const char*>(t.raw_data()), static_cast<std::size_t>(p.bytes));
      at = p.at + p.bytes;
    }
    pieces.push_back(std::string_view(rest).substr(static_cast<std::size_t>(at)));
    return dt::io::decode_checkpoint(pieces, "a donor", mine);
  };

  SECTION("landed in the tensors of the same names: read in place, not copied") {
    auto mine = peer_state(0.5f, 3);
    mine.tensors["t"] = mine.tensors["t"].contiguous();
    const dt::io::encoded_checkpoint donor(theirs);
    std::vector<std::string> placed;
    for (const auto& p : donor.placed_tensors()) placed.push_back(p.name);
    CHECK(placed == std::vector<std::string>{"big", "t", "wide"});  // "bias" is short: copied
    std::string rest;
    const auto back = landed(mine, rest);
    for (const auto& [name, t] : theirs.tensors) {
      INFO(name);
      CHECK(back.tensor_at(name).to_vector<float>() == t.to_vector<float>());
    }
    for (const char* name : {"big", "t", "wide"}) CHECK(back.tensor_at(name).shares_storage_with(mine.tensors.at(name)));
    CHECK(back.counter("step") == 40);
    CHECK(back.text.at("note") == theirs.text.at("note"));
  }

  SECTION("landed in a tensor of another shape: that one is decoded into new storage") {
    auto mine = peer_state(0.5f, 3);
    mine.tensors["big"] = dt::full(dt::shape{40, 64}, 0.5f);  // as many bytes, another shape
    mine.tensors["t"] = mine.tensors["t"].contiguous();
    std::string rest;
    const auto back = landed(mine, rest);
    CHECK_FALSE(back.tensor_at("big").shares_storage_with(mine.tensors.at("big")));
    CHECK(back.tensor_at("big").shape() == dt::shape{64, 40});
    CHECK(back.tensor_at("wide").shares_storage_with(mine.tensors.at("wide")));
    for (const auto& [name, t] : theirs.tensors) {
      INFO(name);
      CHECK(back.tensor_at(name).to_vector<float>() == t.to_vector<float>());
    }
  }
}

TEST_CASE("restoring into a different model is refused", "[io][checkpoint][errors]") {
  auto cfg = dt::nn::gpt_preset("tiny");
  dt::rng gen(1, "init");
  dt::nn::gpt<> model(cfg, gen);
  dt::optim::adamw<> opt(model.parameters());
  auto c = dt::train::capture(model, opt, 0);
  cfg.n_layer = 3;
  dt::nn::gpt<> bigger(cfg, gen);
  dt::optim::adamw<> opt2(bigger.parameters());
  CHECK_THROWS_WITH(dt::train::restore(c, bigger, opt2), Contains("model configuration differs"));
  c.tensors.erase("adamw.h.1.mlp.c_fc.weight.exp_avg");
  CHECK_THROWS_WITH(dt::train::restore(c, model, opt), Contains("missing tensor 'adamw.h.1.mlp.c_fc.weight.exp_avg'"));
}
