// safetensors and GPT-2 weight interchange: Hugging Face's layout (as the PyTorch fixture
// script writes it) loads and reproduces PyTorch's logits; export/import round-trips; every bad
// file fails with a message naming the problem.
#include "support/fixture.hpp"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

namespace io = decentrain::io;
namespace train = decentrain::train;
using Catch::Matchers::Contains;

namespace {
std::filesystem::path weights_file(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("decentrain_st_" + name);
}
void write_raw(const std::filesystem::path& p, const std::string& header, const std::string& data) {
  std::string file;
  for (int i = 0; i < 8; ++i) file += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  std::ofstream(p, std::ios::binary) << file << header << data;
}
}  // namespace

TEST_CASE("Hugging Face GPT-2 weights load and give PyTorch's logits", "[io][safetensors][parity]") {
  const fixture fx(DECENTRAIN_FIXTURE_DIR "/gpt_block.dtfx");
  const auto file = io::load_safetensors(DECENTRAIN_FIXTURE_DIR "/gpt_block.safetensors");
  CHECK(file.count("lm_head.weight") == 1);
  CHECK(file.count("transformer.h.0.attn.bias") == 1);
  const auto c = fx["config"].to_vector<std::int32_t>();
  const auto cfg = train::gpt2_config(file, c[3]);
  CHECK(cfg == dt::nn::gpt_config{c[4], c[3], c[2], c[1], c[0], 0.0});
  dt::rng gen(0, "init");
  dt::nn::gpt<> model(cfg, gen);
  train::import_gpt2_weights(model, file);
  const auto cmp = dt::compare(model.logits(fx["idx"]).value(), fx["logits"], 1e-4, 1e-5);
  INFO(cmp.message);
  CHECK(cmp.close);
}

TEST_CASE("export and import round-trip through a safetensors file", "[io][safetensors]") {
  dt::rng gen(4, "init");
  dt::nn::gpt<> model(dt::nn::gpt_preset("tiny"), gen);
  const auto path = weights_file("roundtrip.safetensors");
  io::save_safetensors(path, train::export_gpt2_weights(model), {{"format", "pt"}});
  std::map<std::string, std::string> meta;
  const auto file = io::load_safetensors(path, &meta);
  CHECK(meta.at("format") == "pt");
  CHECK(std::filesystem::file_size(path) % 4 == 0);
  dt::rng other(5, "init");
  dt::nn::gpt<> copy(train::gpt2_config(file, 2), other);
  train::import_gpt2_weights(copy, file);
  for (const auto& e : model.parameters())
    CHECK(dt::allclose(e.param.value(), copy.parameters().get(e.name).value(), 0.0, 0.0));
  // bf16 and f64 tensors are written and read with their dtypes.
  io::save_safetensors(path, {{"a", dt::ones(dt::shape{3}, dt::dtype::bf16)}, {"b", dt::arange(4, dt::dtype::f64)}});
  const auto mixed = io::load_safetensors(path);
  CHECK(mixed.at("a").dtype() == dt::dtype::bf16);
  CHECK(mixed.at("b").to_vector<double>() == std::vector<double>{0, 1, 2, 3});
  std::filesystem::remove(path);
}

TEST_CASE("mismatched weights are refused, never partially loaded", "[io][safetensors][errors]") {
  dt::rng gen(4, "init");
  dt::nn::gpt<> model(dt::nn::gpt_preset("tiny"), gen);
  auto weights = train::export_gpt2_weights(model);
  auto missing = weights;
  missing.erase("h.1.mlp.c_proj.bias");
  CHECK_THROWS_WITH(train::import_gpt2_weights(model, missing), Contains("missing tensor 'h.1.mlp.c_proj.bias'"));
  auto misshapen = weights;
  misshapen["ln_f.weight"] = dt::ones(dt::shape{63});
  CHECK_THROWS_WITH(train::import_gpt2_weights(model, misshapen), Contains("'ln_f.weight' has shape (63,), the model expects (64,)"));
  auto extra = weights;
  extra["h.2.ln_1.weight"] = dt::ones(dt::shape{64});
  CHECK_THROWS_WITH(train::import_gpt2_weights(model, extra), Contains("unexpected tensor 'h.2.ln_1.weight'"));
  CHECK_THROWS_WITH(train::gpt2_config(weights, 5), Contains("must be a positive multiple of n_head (5)"));
  weights.erase("wpe.weight");
  CHECK_THROWS_WITH(train::gpt2_config(weights, 2), Contains("missing tensor 'wpe.weight'"));
}

TEST_CASE("bad safetensors files give clear errors", "[io][safetensors][errors]") {
  const auto path = weights_file("bad.safetensors");
  std::ofstream(path, std::ios::binary) << "abc";
  CHECK_THROWS_WITH(io::load_safetensors(path), Contains("is truncated (3 bytes)"));
  write_raw(path, "{}", "");
  CHECK(io::load_safetensors(path).empty());
  std::string huge(8, '\xff');
  std::ofstream(path, std::ios::binary) << huge;
  CHECK_THROWS_WITH(io::load_safetensors(path), Contains("-byte header but the file has 0 bytes"));
  write_raw(path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]", "");
  CHECK_THROWS_WITH(io::load_safetensors(path), Contains("bad header: json: unexpected end of input"));
  write_raw(path, "{\"w\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [0, 4]}}", "1234");
  CHECK_THROWS_WITH(io::load_safetensors(path), Contains("tensor 'w' has dtype F16, which decentrain does not read"));
  write_raw(path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", "1234");
  CHECK_THROWS_WITH(io::load_safetensors(path), Contains("tensor 'w': data_offsets [0, 8] fall outside the 4-byte data section"));
  write_raw(path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1000000, 1000000], \"data_offsets\": [0, 4]}}", "1234");
  CHECK_THROWS_WITH(io::load_safetensors(path), Contains("tensor 'w': size 1000000 does not fit the file"));
  write_raw(path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 12]}}", "12345678");
  CHECK_THROWS_WITH(io::load_safetensors(path), Contains("data_offsets [4, 12] fall outside the 8-byte data section"));
  write_raw(path, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 8]}}", "12345678");
  CHECK_THROWS_WITH(io::load_safetensors(path), Contains("data_offsets span 8 bytes but shape and dtype need 4"));
  write_raw(path, "{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", "1234");
  CHECK_THROWS_WITH(io::load_safetensors(path), Contains("tensor 'w': json: missing key 'dtype'"));
  write_raw(path, std::string(100, '[') , "");
  CHECK_THROWS_WITH(io::load_safetensors(path), Contains("nesting too deep"));
  std::filesystem::remove(path);
}

TEST_CASE("a bias-free model round-trips through checkpoints and safetensors", "[io][bias]") {
  auto cfg = dt::nn::gpt_preset("tiny");
  cfg.bias = false;
  dt::rng gen(6, "init");
  dt::nn::gpt<> model(cfg, gen);
  dt::optim::adamw<> opt(model.parameters());
  const auto ckpt = train::capture(model, opt, 3);
  CHECK(train::config_of<decentrain::nn::gpt_config>(ckpt) == cfg);
  const auto weights = train::export_gpt2_weights(model);
  CHECK(train::gpt2_config(weights, cfg.n_head) == cfg);
  dt::rng other(7, "init");
  dt::nn::gpt<> copy(cfg, other);
  train::import_gpt2_weights(copy, weights);
  for (const auto& e : model.parameters())
    CHECK(dt::allclose(e.param.value(), copy.parameters().get(e.name).value(), 0.0, 0.0));
}
