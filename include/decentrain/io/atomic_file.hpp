// Writing a file so that readers see either the old contents or the complete new ones: write a
// temporary file beside it, fsync it, rename it over the target, fsync the directory. A crash
// at any point leaves no partial file under the real name.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

#include "decentrain/detail/error.hpp"

namespace decentrain::io {

inline void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  const auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const auto temporary = std::filesystem::path(path.string() + ".tmp");
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  decentrain::detail::check(fd >= 0, "cannot create ", temporary.string(), ": ", std::strerror(errno));
  std::size_t written = 0;
  while (written < bytes.size()) {
    const auto n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      decentrain::detail::fail("cannot write ", temporary.string(), ": ", std::strerror(err));
    }
    written += static_cast<std::size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced) {
    ::unlink(temporary.c_str());
    decentrain::detail::fail("cannot flush ", temporary.string(), " to disk: ", std::strerror(errno));
  }
  std::filesystem::rename(temporary, path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // makes the rename itself durable
    ::close(dfd);
  }
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  decentrain::detail::check(in.good(), "cannot open ", path.string());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace decentrain::io
