// Every codec's decoder on payloads from a peer (compress/): a payload is either raw bytes or
// (first byte odd) one the codec itself encoded, then corrupted by XOR with the rest of the
// input, so the fuzzer works past the size checks. Properties: a payload the codec encoded and
// nobody touched decodes; a corrupted one decodes or is rejected with a decentrain::error.
#include "fuzz.hpp"

#include <cmath>
#include <cstring>

#include "decentrain/collective/any_codec.hpp"

namespace compress = decentrain::compress;

namespace {

const char* const specs[] = {"identity", "fp16", "bf16", "int8", "int4:block=32", "int8:stochastic,seed=3", "fp4",
                             "sign", "topk:0.1", "topk:count=7,int4", "topk:0.2,int2,block=16", "dct:0.1,chunk=64",
                             "dct:0.05,chunk=16,int2", "powersgd:rank=2", "powersgd:rank=1,factors=int8", "fp16:ef",
                             "int4:ef,adaptive"};
constexpr std::size_t spec_count = sizeof specs / sizeof specs[0];

// powersgd works per matrix: n values as an (n/8) x 8 matrix and a row of the rest.
compress::layout layout_of(std::size_t n) {
  compress::layout l;
  if (n / 8) l.push_back({0, n / 8, 8});
  if (n % 8) l.push_back({n / 8 * 8, 1, n % 8});
  return l;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  decentrain_fuzz::reader r{{data, size}};
  const auto mode = r.number(1);
  const auto which = static_cast<std::size_t>(r.number(1)) % spec_count;
  const std::size_t n = 1 + static_cast<std::size_t>(r.number(2)) % 2048;
  auto codec = decentrain::collective::parse_codec(specs[which]);
  codec.set_layout(layout_of(n));
  std::vector<float> into(n, 0.0f);
  if (mode % 2 == 0) {
    const auto payload = std::as_bytes(r.rest());
    decentrain_fuzz::rejects_cleanly([&] { codec.decode_add(payload, into); });
    return 0;
  }
  // Values from a small generator seeded by the input: finite, of mixed scale.
  std::vector<float> values(n);
  std::uint64_t s = r.number(8) | 1;
  for (auto& v : values) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    v = std::ldexp(static_cast<float>(static_cast<std::int64_t>(s % 2001) - 1000) / 1000.0f, static_cast<int>(s >> 58) - 32);
  }
  std::vector<std::byte> payload(codec.max_encoded_bytes(n));
  payload.resize(codec.encode(values, payload));
  const auto flips = r.rest();
  if (flips.empty()) {
    decentrain_fuzz::require(!decentrain_fuzz::rejects_cleanly([&] { codec.decode_add(payload, into); }),
                             "a codec rejected a payload it encoded itself");
    return 0;
  }
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] ^= std::byte{flips[i % flips.size()]};
  decentrain_fuzz::rejects_cleanly([&] { codec.decode_add(payload, into); });
  return 0;
}

std::vector<std::string> decentrain_fuzz::seeds() {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < spec_count; ++i) {
    // Encoded and left alone, encoded and one bit flipped, and a raw payload of zeros.
    const std::string head{'\x01', static_cast<char>(i), '\x40', '\x01', 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'};
    out.push_back(head);
    out.push_back(head + std::string(40, '\0') + "\x10");
    out.push_back(std::string{'\x00', static_cast<char>(i), '\x40', '\x01'} + std::string(600, '\0'));
  }
  return out;
}
