// Checkpoints (io/checkpoint.hpp): read from disk, and sent by a donor peer to one that joins
// (fault::elastic), so hostile bytes must end in a decentrain::error, never in an allocation
// sized by a length field. An input is the file's bytes, or (first byte odd) a payload the
// target wraps in a valid header with its checksum, so the fuzzer reaches the cereal payload
// past the checksum. Property: what decodes, encoded, decodes back to the same state.
#include "fuzz.hpp"

#include "decentrain/core/factory.hpp"
#include "decentrain/io/checkpoint.hpp"

namespace io = decentrain::io;

namespace {

std::string with_header(std::string_view payload) {
  std::string out(io::checkpoint_header_bytes, '\0');
  std::size_t at = 0;
  auto put = [&](std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out[at++] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  for (char c : io::checkpoint_magic) out[at++] = c;
  put(io::checkpoint_version, 4);
  put(payload.size(), 8);
  put(io::checkpoint_checksum(payload), 8);
  return out.append(payload);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string file = data[0] % 2 ? with_header(rest) : std::string(rest);
  decentrain_fuzz::rejects_cleanly([&] {
    const auto encoded = io::encode_checkpoint(io::decode_checkpoint(file, "fuzzed checkpoint"));
    decentrain_fuzz::require(io::encode_checkpoint(io::decode_checkpoint(encoded, "re-encoded checkpoint")) == encoded,
                             "a checkpoint that decoded did not decode back to the same state after encoding");
  });
  return 0;
}

std::vector<std::string> decentrain_fuzz::seeds() {
  io::checkpoint ckpt;
  ckpt.tensors.emplace("w", decentrain::zeros<decentrain::cpu>(decentrain::shape({2, 3})));
  ckpt.counters["step"] = 42;
  ckpt.rngs.emplace("data", decentrain::rng(7, "data").state());
  ckpt.text["codec"] = "int8";
  const auto encoded = io::encode_checkpoint(ckpt);
  return {"\x00" + encoded, "\x01" + encoded.substr(io::checkpoint_header_bytes), "\x01" + std::string(1, '\x01')};
}
