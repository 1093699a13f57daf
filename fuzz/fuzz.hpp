// What every fuzz target shares. A target is one .cpp defining
//   extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
//   std::vector<std::string> decentrain_fuzz::seeds()     valid inputs built by the library's own
//                                                         encoders, so the fuzzer starts inside
//                                                         the format (and they never go stale)
// It is built twice: with clang's libFuzzer (scripts/fuzz, -fsanitize=fuzzer,address,undefined)
// and, with any compiler, against replay.cpp, which runs the seeds and every saved crash in
// fuzz/regressions/<target>/ as a CTest test.
//
// The contract a target checks: hostile bytes end in a decentrain::error (a clear message) or
// are accepted; anything else (another exception, a crash, a sanitizer report, an allocation
// over libFuzzer's -malloc_limit_mb, a hang past -timeout) is a finding.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "decentrain/detail/error.hpp"

namespace decentrain_fuzz {

std::vector<std::string> seeds();

// Runs `f`, letting only decentrain::error through (the expected answer to bad input).
template <class F>
bool rejects_cleanly(F&& f) {
  try {
    f();
    return false;
  } catch (const decentrain::error&) {
    return true;
  }
}

// A property a target asserts: breaks the run with a message when it does not hold.
inline void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz: property violated: %s\n", what);
  std::abort();
}

// Reads an input front to back: what a target takes from it to shape what it does.
struct reader {
  std::span<const std::uint8_t> data;
  std::size_t at = 0;
  bool empty() const { return at >= data.size(); }
  std::uint64_t number(int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes && at < data.size(); ++i) v |= static_cast<std::uint64_t>(data[at++]) << (8 * i);
    return v;
  }
  std::span<const std::uint8_t> take(std::size_t n) {
    n = std::min(n, data.size() - std::min(at, data.size()));
    auto out = data.subspan(at, n);
    at += n;
    return out;
  }
  std::span<const std::uint8_t> rest() { return take(data.size()); }
};

}  // namespace decentrain_fuzz

#ifdef DECENTRAIN_LIBFUZZER
#include <filesystem>
#include <fstream>
// With DECENTRAIN_FUZZ_SEEDS=DIR, writes the seeds into DIR before libFuzzer reads its corpus
// (scripts/fuzz passes DIR as the corpus too).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("DECENTRAIN_FUZZ_SEEDS"); dir && *dir) {
    std::filesystem::create_directories(dir);
    int i = 0;
    for (const auto& s : decentrain_fuzz::seeds())
      std::ofstream(std::filesystem::path(dir) / ("seed-" + std::to_string(i++)), std::ios::binary) << s;
  }
  return 0;
}
#endif
