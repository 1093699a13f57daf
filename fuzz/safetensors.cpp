// safetensors files (io/safetensors.hpp) and the JSON reader under them (io/json.hpp): a
// hostile or truncated file ends in a decentrain::error naming it. Property: what parses saves
// and parses again to the same tensors.
#include "fuzz.hpp"

#include <filesystem>

#include "decentrain/core/factory.hpp"
#include "decentrain/io/safetensors.hpp"

namespace io = decentrain::io;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  decentrain_fuzz::rejects_cleanly([&] {
    std::map<std::string, std::string> metadata;
    const auto tensors = io::parse_safetensors(file, "fuzzed safetensors", &metadata);
    for (const auto& [name, t] : tensors) decentrain_fuzz::require(t.defined(), "a parsed tensor is undefined");
  });
  decentrain_fuzz::rejects_cleanly([&] { (void)io::parse_json(file); });
  return 0;
}

std::vector<std::string> decentrain_fuzz::seeds() {
  const auto path = std::filesystem::temp_directory_path() / ("decentrain-fuzz-seed-" + std::to_string(::getpid()) + ".safetensors");
  io::named_tensors tensors;
  tensors.emplace("a", decentrain::zeros<decentrain::cpu>(decentrain::shape({2, 2})));
  tensors.emplace("b.bias", decentrain::zeros<decentrain::cpu>(decentrain::shape({3})));
  io::save_safetensors(path, tensors, {{"format", "pt"}});
  std::ifstream in(path, std::ios::binary);
  std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  return {file, R"({"a": [1, 2.5e-3, "x\u00e9", {"b": null, "c": true}], "d": -0})"};
}
