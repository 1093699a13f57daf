// What users type (--codec, --aggregator) and what aggregators do with what peers send.
// Specs: a bad one is a decentrain::error naming it; an aggregator's describe() parses back to
// the same aggregator. Aggregation of finite contributions (the collective drops non-finite
// ones first): the median and the trimmed mean stay within each coordinate's range, and no
// robust aggregator turns finite contributions into a non-finite aggregate.
#include "fuzz.hpp"

#include <cmath>
#include <cstring>

#include "decentrain/collective/any_aggregator.hpp"
#include "decentrain/collective/any_codec.hpp"

namespace collective = decentrain::collective;
using decentrain_fuzz::require;

namespace {

void parse_specs(std::string_view text) {
  decentrain_fuzz::rejects_cleanly([&] { (void)decentrain::collective::parse_codec(text); });
  decentrain_fuzz::rejects_cleanly([&] {
    const auto a = collective::parse_aggregator(text);
    require(collective::parse_aggregator(a.describe()).describe() == a.describe(),
            "an aggregator's describe() did not parse back to the same aggregator");
  });
}

const char* const robust[] = {"median", "trimmed-mean", "trimmed-mean:trim=0.4", "centered-clip",
                              "centered-clip:iterations=1,radius=0.5", "centered-clip:bucket=2,seed=5", "median:bucket=3"};

void aggregate(decentrain_fuzz::reader& r) {
  const auto which = static_cast<std::size_t>(r.number(1)) % (sizeof robust / sizeof robust[0]);
  const std::size_t peers = 1 + static_cast<std::size_t>(r.number(1)) % 8, dims = 1 + static_cast<std::size_t>(r.number(1)) % 16;
  std::vector<std::vector<float>> values(peers, std::vector<float>(dims));
  for (auto& v : values)
    for (auto& x : v) {
      std::uint32_t bits = static_cast<std::uint32_t>(r.number(4));
      std::memcpy(&x, &bits, 4);
      if (!std::isfinite(x)) x = 0;  // the collective drops these before an aggregator sees them
    }
  std::vector<std::span<const float>> in(values.begin(), values.end());
  std::vector<float> out(dims);
  auto a = collective::parse_aggregator(robust[which]);
  a.combine(in, out);
  const bool stays_in_range = a.describe().starts_with("median") || a.describe().starts_with("trimmed");
  for (std::size_t d = 0; d < dims; ++d) {
    require(std::isfinite(out[d]), "a robust aggregator made a non-finite aggregate of finite contributions");
    if (!stays_in_range) continue;
    float lo = values[0][d], hi = lo;
    for (const auto& v : values) lo = std::min(lo, v[d]), hi = std::max(hi, v[d]);
    require(out[d] >= lo && out[d] <= hi, "a median or trimmed mean left the coordinate's range");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  decentrain_fuzz::reader r{{data, size}};
  if (r.number(1) % 2 == 0) {
    const auto rest = r.rest();
    parse_specs(std::string_view(reinterpret_cast<const char*>(rest.data()), rest.size()));
  } else {
    aggregate(r);
  }
  return 0;
}

std::vector<std::string> decentrain_fuzz::seeds() {
  std::vector<std::string> out;
  for (const char* s : {"int4:block=64,ef", "topk:0.02,int2", "powersgd:rank=4,factors=int8", "dct:0.02,chunk=64,int2,ef",
                        "centered-clip:iterations=3,bucket=2,seed=1,partitioned", "trimmed-mean:trim=0.25",
                        "median:partitioned", "fp16:adaptive", "sign:block=64"})
    out.push_back(std::string(1, '\0') + s);
  for (char which = 0; which < 7; ++which) {
    std::string agg{'\x01', which, '\x07', '\x03'};
    for (int i = 0; i < 8 * 4; ++i) {
      const float v = static_cast<float>(i % 5) - 2.0f + (i % 8 == 7 ? 1e30f : 0.0f);
      agg.append(reinterpret_cast<const char*>(&v), 4);
    }
    out.push_back(agg);
  }
  return out;
}
