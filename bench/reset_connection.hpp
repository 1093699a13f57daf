// Resets one TCP connection of this process abruptly, as a middlebox that resets it would: the
// socket with these ports (tcp::stream_ports_to lists a pair's) is disconnected (connect() to
// AF_UNSPEC), which drops what its buffers hold and sends the other end a reset. The tests and
// bench/streams use it to cut a stream of a striped pair midway.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>

namespace bench {

// The descriptor of this process's TCP socket with these ports (IPv4), or -1.
inline int find_connection(std::uint16_t local, std::uint16_t remote) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::atoi(entry.path().filename().c_str());
    sockaddr_in here{}, there{};
    socklen_t a = sizeof here, b = sizeof there;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&here), &a) != 0 || here.sin_family != AF_INET) continue;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&there), &b) != 0) continue;
    if (ntohs(here.sin_port) == local && ntohs(there.sin_port) == remote) return fd;
  }
  return -1;
}

// False when no socket of this process has these ports.
inline bool reset_connection(std::uint16_t local, std::uint16_t remote) {
  const int fd = find_connection(local, remote);
  if (fd < 0) return false;
  sockaddr none{};
  none.sa_family = AF_UNSPEC;
  return ::connect(fd, &none, sizeof none) == 0;
}

}  // namespace bench
