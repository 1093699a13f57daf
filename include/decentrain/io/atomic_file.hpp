// Writing a file so that readers see either the old contents or the complete new ones: write a
// temporary file beside it, fsync it, rename it over the target, fsync the directory. A crash
// at any point leaves no partial file under the real name.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "decentrain/detail/error.hpp"

namespace decentrain::io {

// The file's bytes are `parts`, one after the other.
inline void write_file_atomically(const std::filesystem::path& path, const std::vector<std::string_view>& parts) {
  const auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const auto temporary = std::filesystem::path(path.string() + ".tmp");
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  decentrain::detail::check(fd >= 0, "cannot create ", temporary.string(), ": ", std::strerror(errno));
  for (const auto bytes : parts) {
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
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced) {
    ::unlink(temporary.c_str());
    decentrain::detail::fail("cannot flush ", temporary.string(), " to disk: ", std::strerror(errno));
  }
  std::error_code renamed;
  std::filesystem::rename(temporary, path, renamed);
  if (renamed) {  // (a folder of that name, say): nothing is left behind
    ::unlink(temporary.c_str());
    std::error_code is_folder;
    decentrain::detail::fail("cannot write ", path.string(), ": ",
                             std::filesystem::is_directory(path, is_folder) ? std::string("it is a folder") : renamed.message());
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // makes the rename itself durable
    ::close(dfd);
  }
}

// Makes a folder and its parents, or fails naming the part of the path in the way.
inline void make_folder(const std::filesystem::path& folder) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (!ec) return;
  std::filesystem::path so_far;
  for (const auto& part : folder) {
    so_far /= part;
    std::error_code e;
    if (std::filesystem::exists(so_far, e) && !std::filesystem::is_directory(so_far, e))
      decentrain::detail::fail("cannot make the folder ", folder.string(), ": ", so_far.string(), " is a file");
  }
  decentrain::detail::fail("cannot make the folder ", folder.string(), ": ", ec.message());
}

inline void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  write_file_atomically(path, std::vector<std::string_view>{bytes});
}

// The whole file, read in large blocks (never a character at a time: checkpoints are
// gigabytes); sized up front for a regular file, grown for anything else.
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  decentrain::detail::check(in.good(), "cannot open ", path.string());
  std::error_code ec;
  const auto size = std::filesystem::is_regular_file(path, ec) ? std::filesystem::file_size(path, ec) : 0;
  std::string out(ec ? 0 : static_cast<std::size_t>(size), '\0');
  std::size_t have = 0;
  for (;;) {
    in.read(out.data() + have, static_cast<std::streamsize>(out.size() - have));
    have += static_cast<std::size_t>(in.gcount());
    if (!in || in.peek() == std::char_traits<char>::eof()) break;
    out.resize(std::max<std::size_t>(out.size() * 2, 1 << 16));  // a file that grew, or a pipe
  }
  decentrain::detail::check(!in.bad(), "cannot read ", path.string());
  out.resize(have);
  return out;
}

}  // namespace decentrain::io
