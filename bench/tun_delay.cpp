// bench/tun_delay: a link of a given rate, latency and queue, for a kernel without netem.
//
//   tun_delay --dev NAME [--rate-mbit 1000] [--delay-ms 25] [--queue-ms 25]
//
// Creates the TUN device NAME (IPv4 packets, no packet information header) and sends every
// packet the kernel routes into it back into the kernel once the link it models would have
// carried it: each destination address is one direction of a link, which serialises its packets
// at --rate-mbit one after another, holds each --delay-ms after its last bit left, and drops a
// packet that would wait longer than --queue-ms for the packets ahead of it (a router's buffer
// of that many milliseconds at the rate; the drops are what TCP's congestion control reads).
// TCP stays end to end: a sender sees the whole round trip and its window limits, unlike
// bench/delay_relay.py, which terminates TCP on either side. bench/streams.sh says how packets
// are routed through the device (policy routing in a namespace between the two peers).
//
// Runs until SIGINT or SIGTERM, then prints each direction's packets, bytes and drops.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
using ns = std::chrono::nanoseconds;

volatile sig_atomic_t stopping = 0;
void on_signal(int) { stopping = 1; }

struct packet {
  clock_type::time_point due;
  std::vector<unsigned char> bytes;
};

// One direction: packets in the order they left, and when the link is free again.
struct direction {
  clock_type::time_point free_at{};
  std::deque<packet> in_flight;
  std::uint64_t packets = 0, bytes = 0, dropped = 0, refused = 0;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "tun_delay: %s\nusage: tun_delay --dev NAME [--rate-mbit 1000] [--delay-ms 25] [--queue-ms 25]\n",
               why.c_str());
  std::exit(2);
}

double number(const std::string& name, const char* text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !(v >= 0) || v > 1e9) usage(name + " takes a number from 0, got '" + text + "'");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dev;
  double rate_mbit = 1000, delay_ms = 25, queue_ms = 25;
  for (int i = 1; i < argc; i += 2) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage(arg + " needs a value");
    if (arg == "--dev") dev = argv[i + 1];
    else if (arg == "--rate-mbit") rate_mbit = number(arg, argv[i + 1]);
    else if (arg == "--delay-ms") delay_ms = number(arg, argv[i + 1]);
    else if (arg == "--queue-ms") queue_ms = number(arg, argv[i + 1]);
    else usage("unknown option '" + arg + "'");
  }
  if (dev.empty() || dev.size() >= IFNAMSIZ) usage("--dev needs a device name of 1 to " + std::to_string(IFNAMSIZ - 1) + " characters");
  if (rate_mbit < 0.001) usage("--rate-mbit must be at least 0.001");

  const int fd = ::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    std::fprintf(stderr, "tun_delay: cannot open /dev/net/tun: %s\n", std::strerror(errno));
    return 1;
  }
  ifreq request{};
  request.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::memcpy(request.ifr_name, dev.data(), dev.size());
  if (::ioctl(fd, TUNSETIFF, &request) < 0) {
    std::fprintf(stderr, "tun_delay: cannot create TUN device '%s': %s\n", dev.c_str(), std::strerror(errno));
    return 1;
  }
  struct sigaction action{};
  action.sa_handler = on_signal;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  // The timer's default slack (50 us) is most of a 9000-byte packet's time at 1 Gbit/s (72 us).
  (void)::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  std::fprintf(stderr, "tun_delay: %s: %.0f Mbit/s, %.1f ms each way, queue %.1f ms\n", dev.c_str(), rate_mbit, delay_ms, queue_ms);

  const double ns_per_byte = 8e3 / rate_mbit;  // 8 bits / (rate_mbit * 1e6 bit/s), in ns
  const auto delay = std::chrono::duration_cast<ns>(std::chrono::duration<double, std::milli>(delay_ms));
  const auto queue = std::chrono::duration_cast<ns>(std::chrono::duration<double, std::milli>(queue_ms));
  std::map<std::uint32_t, direction> directions;  // by destination address
  std::uint64_t not_ipv4 = 0;
  std::vector<unsigned char> buffer(65536);
  while (!stopping) {
    // Sleep until a packet is due or one comes in.
    auto now = clock_type::now();
    auto next = now + std::chrono::milliseconds(100);
    for (const auto& [address, d] : directions)
      if (!d.in_flight.empty()) next = std::min(next, d.in_flight.front().due);
    const auto wait = std::max(ns(0), std::chrono::duration_cast<ns>(next - now));
    const timespec timeout{static_cast<time_t>(wait.count() / 1000000000), static_cast<long>(wait.count() % 1000000000)};
    pollfd p{fd, POLLIN, 0};
    if (::ppoll(&p, 1, &timeout, nullptr) < 0 && errno != EINTR) {
      std::fprintf(stderr, "tun_delay: poll failed: %s\n", std::strerror(errno));
      return 1;
    }
    now = clock_type::now();
    for (;;) {  // every packet waiting
      const ssize_t n = ::read(fd, buffer.data(), buffer.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) break;
        std::fprintf(stderr, "tun_delay: read failed: %s\n", std::strerror(errno));
        return 1;
      }
      if (n < 20 || (buffer[0] >> 4) != 4) {  // IPv6 router solicitations and the like: not carried
        ++not_ipv4;
        continue;
      }
      std::uint32_t to = 0;
      std::memcpy(&to, buffer.data() + 16, 4);
      auto& d = directions[to];
      const auto start = std::max(now, d.free_at);
      if (start - now > queue) {
        ++d.dropped;
        continue;
      }
      d.free_at = start + ns(static_cast<std::int64_t>(static_cast<double>(n) * ns_per_byte));
      d.in_flight.push_back({d.free_at + delay, std::vector<unsigned char>(buffer.begin(), buffer.begin() + n)});
      ++d.packets;
      d.bytes += static_cast<std::uint64_t>(n);
    }
    for (auto& [address, d] : directions)
      while (!d.in_flight.empty() && d.in_flight.front().due <= now) {
        const auto& bytes = d.in_flight.front().bytes;
        // A write the kernel refuses (no buffer) is a packet lost on the link, counted apart.
        if (::write(fd, bytes.data(), bytes.size()) < 0) {
          if (errno != EAGAIN && errno != ENOBUFS && errno != EINTR) {
            std::fprintf(stderr, "tun_delay: write failed: %s\n", std::strerror(errno));
            return 1;
          }
          ++d.refused;
        }
        d.in_flight.pop_front();
      }
  }
  for (const auto& [address, d] : directions) {
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &address, text, sizeof text);
    std::fprintf(stderr, "tun_delay: to %s: %llu packets, %.1f MB, %llu dropped at the queue, %llu refused by the kernel\n", text,
                 static_cast<unsigned long long>(d.packets), static_cast<double>(d.bytes) / 1e6,
                 static_cast<unsigned long long>(d.dropped), static_cast<unsigned long long>(d.refused));
  }
  if (not_ipv4) std::fprintf(stderr, "tun_delay: %llu packets not IPv4, not carried\n", static_cast<unsigned long long>(not_ipv4));
  return 0;
}
