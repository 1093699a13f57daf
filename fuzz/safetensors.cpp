// safetensors files (io/safetensors.hpp) and the JSON reader under them (io/json.hpp): a
// hostile or truncated file ends in a decentrain::error naming it. Property: what parses
// encodes, and parses back, to the same tensors and metadata.
#include "fuzz.hpp"

#include "decentrain/core/factory.hpp"
#include "decentrain/io/safetensors.hpp"

namespace io = decentrain::io;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  decentrain_fuzz::rejects_cleanly([&] {
    std::map<std::string, std::string> metadata;
    const auto tensors = io::parse_safetensors(file, "fuzzed safetensors", &metadata);
    // What parsed, encoded again, encodes the same after another parse (the encoding is canonical).
    const auto encoded = io::encode_safetensors(tensors, metadata);
    std::map<std::string, std::string> metadata_again;
    const auto again = io::parse_safetensors(encoded, "re-encoded safetensors", &metadata_again);
    decentrain_fuzz::require(metadata_again == metadata && io::encode_safetensors(again, metadata_again) == encoded,
                             "safetensors that parsed did not parse back to the same tensors after encoding");
  });
  decentrain_fuzz::rejects_cleanly([&] { (void)io::parse_json(file); });
  return 0;
}

std::vector<std::string> decentrain_fuzz::seeds() {
  io::named_tensors tensors;
  tensors.emplace("a", decentrain::zeros<decentrain::cpu>(decentrain::shape({2, 2})));
  tensors.emplace("b.bias", decentrain::zeros<decentrain::cpu>(decentrain::shape({3})));
  return {io::encode_safetensors(tensors, {{"format", "pt"}}),
          R"({"a": [1, 2.5e-3, "x\u00e9", {"b": null, "c": true}], "d": -0})"};
}
