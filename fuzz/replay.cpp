// Runs a fuzz target without libFuzzer: its seeds, then every file in the folders (or the
// files) named on the command line, and with `--saved ROOT` every file in ROOT/<target>/ when
// there is one (fuzz/regressions/<target>/: findings kept as tests). A finding aborts, as it
// would under the fuzzer; CTest reports the test failed.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {
void run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
}
}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::size_t seeds = 0, files = 0;
  for (const auto& s : decentrain_fuzz::seeds()) {
    run(s);
    ++seeds;
  }
  for (int i = 1; i < argc; ++i) {
    std::vector<fs::path> paths;
    if (std::string(argv[i]) == "--saved" && i + 1 < argc) {
      const auto saved = fs::path(argv[++i]) / DECENTRAIN_FUZZ_TARGET;
      if (fs::is_directory(saved))
        for (const auto& e : fs::directory_iterator(saved))
          if (e.is_regular_file()) paths.push_back(e.path());
    } else if (fs::is_directory(argv[i])) {
      for (const auto& e : fs::directory_iterator(argv[i]))
        if (e.is_regular_file() && e.path().filename() != "README.md") paths.push_back(e.path());
    } else if (fs::is_regular_file(argv[i])) {
      paths.emplace_back(argv[i]);
    } else {
      std::cerr << "replay: " << argv[i] << " is neither a file nor a folder\n";
      return 2;
    }
    for (const auto& p : paths) {
      std::ifstream in(p, std::ios::binary);
      run(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
      ++files;
    }
  }
  std::cout << "replay: " << seeds << " seeds and " << files << " saved inputs, no finding\n";
  if (seeds == 0) {
    std::cerr << "replay: the target has no seeds\n";
    return 1;
  }
  return 0;
}
