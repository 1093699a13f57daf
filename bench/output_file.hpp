// Where a benchmark writes its rows. The folder is created first (bench/results/ is not in git,
// so a fresh clone does not have it), and a file that cannot be opened or written is an error:
// a benchmark must not print "rows written" over a file that does not exist.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "decentrain/detail/error.hpp"

namespace bench {

class output_file {
 public:
  explicit output_file(std::string path) : path_(std::move(path)) {
#ifdef DECENTRAIN_BENCH_COMPILE_ONLY
    decentrain::detail::fail("this benchmark was built only to check that it compiles (scripts/test): "
                             "configure with -DDECENTRAIN_BENCH_COMPILE_ONLY=OFF to measure");
#endif
    const auto folder = std::filesystem::path(path_).parent_path();
    std::error_code ec;
    if (!folder.empty()) std::filesystem::create_directories(folder, ec);
    decentrain::detail::check(!ec, "cannot create the folder of ", path_, ": ", ec.message());
    out_.open(path_);
    decentrain::detail::check(out_.is_open(), "cannot open ", path_, " for writing");
  }

  std::ofstream& stream() { return out_; }
  template <class T>
  output_file& operator<<(const T& value) {
    out_ << value;
    return *this;
  }

  // Flushes and checks that every write reached the file (a full disk shows up here).
  void close() {
    out_.close();
    decentrain::detail::check(!out_.fail(), "writing ", path_, " failed");
  }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace bench
