// bench/streams: how much of a long, fat link one TCP stream fills, against several, and the
// library's TCP transport beside them. bench/streams.sh runs the two ends in network namespaces
// joined by a link of bench/tun_delay (1 Gbit/s, 50 ms each way by default).
//
//   bench_streams --role receive --address IP:PORT [--streams 1,4,8] [--library-streams 1,4,auto]
//                 [--library-reset K,...] [--bytes 1073741824]
//                 [--message-bytes 64 MiB, at most --bytes / 16] [--link-mbit 1000] [--json PATH]
//   bench_streams --role send --address IP:PORT [the same --streams, --library-streams,
//                 --library-reset, --bytes, --message-bytes]
//
// Rows, in this order, each moving --bytes from the sender to the receiver:
//   tcp xK    K plain TCP connections (no library code), each carrying 1/K of the bytes: what
//             K streams can take of the link (PCCL stripes over a pool of them)
//   decentrain xK  the library's TCP transport between two peers (the sender accepts no
//             connections and dials), --bytes sent as messages of --message-bytes, each striped
//             over K connections (tcp_options::streams; K = 1: one stream)
//   decentrain auto  the same, the pair starting with one connection and opening more, up to
//             16, while the measured link holds each at its window (--library-streams auto:
//             tcp_options::streams_from_link); its streams column is the count it ended with
//   decentrain xK, one reset  the same, but once half the bytes went out the sender resets its
//             stream 1 (bench/reset_connection.hpp: its buffers dropped, as a middlebox's reset
//             would): what it held goes again over the others (--library-reset; none by default)
// The receiver listens on PORT for the plain rows and PORT+1, PORT+2, ... for the library's (one
// port a row: a sender that dials early never reaches the last row's peer), times each row
// from its first connection (or the group's forming) to its last byte, and prints the table and
// writes the JSON. "steady" leaves out the first quarter of the bytes: TCP's slow start, which
// takes several round trips to open a window of a bandwidth-delay product (about 7 doublings from
// 10 segments of 9000 bytes to 12.5 MB).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "args.hpp"
#include "decentrain/transport/tcp.hpp"
#include "output_file.hpp"
#include "reset_connection.hpp"

namespace dt = decentrain;
using clock_type = std::chrono::steady_clock;

namespace {

struct row {
  std::string name;
  int streams = 1;
  std::size_t bytes = 0;
  double seconds = 0, steady_seconds = 0;
  std::size_t steady_bytes = 0;
};

// --address IPV4:PORT (wire::split_address checks the form) as a socket address.
sockaddr_in parse_address(const std::string& text) {
  const auto [host, port] = dt::transport::wire::split_address(text);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  dt::detail::check(::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1, "--address: '", host, "' is not an IPv4 address");
  dt::detail::check(port > 0 && port < 65535, "--address: port ", port, " is not in 1..65534 (PORT+1 is used too)");
  a.sin_port = htons(port);
  return a;
}

// The same host, the port `add` above (parse_address checked both).
std::string with_port(const std::string& address, int add) {
  const auto [host, port] = dt::transport::wire::split_address(address);
  return host + ":" + std::to_string(port + add);
}

int checked(int rc, const char* what) {
  dt::detail::check(rc >= 0, what, " failed: ", std::strerror(errno));
  return rc;
}

void write_all(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    checked(static_cast<int>(w), "send");
    data += w;
    n -= static_cast<std::size_t>(w);
  }
}

// ---- the receiver ----

row receive_plain(int listener, int k, std::size_t total) {
  std::vector<int> conns;
  clock_type::time_point t0;
  for (int i = 0; i < k; ++i) {
    conns.push_back(checked(::accept(listener, nullptr, nullptr), "accept"));
    if (i == 0) t0 = clock_type::now();
  }
  std::atomic<std::size_t> got{0};
  std::atomic<std::int64_t> quarter_at{0};
  std::atomic<std::size_t> quarter_bytes{0};
  std::vector<std::thread> readers;
  for (int fd : conns)
    readers.emplace_back([&, fd] {
      std::vector<char> buffer(1 << 20);
      for (;;) {
        const ssize_t n = ::recv(fd, buffer.data(), buffer.size(), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        const auto before = got.fetch_add(static_cast<std::size_t>(n));
        if (before < total / 4 && before + static_cast<std::size_t>(n) >= total / 4) {
          quarter_bytes = before + static_cast<std::size_t>(n);
          quarter_at = clock_type::now().time_since_epoch().count();
        }
      }
    });
  for (auto& t : readers) t.join();
  const auto t1 = clock_type::now();
  const bool whole = got == total;
  // The sender waits for this before the next row: 'k' when the row came whole (on every
  // connection: which of its connections was accepted first, the sender does not know).
  for (int fd : conns) write_all(fd, whole ? "k" : "x", 1);
  for (int fd : conns) ::close(fd);
  dt::detail::check(whole, "tcp x", k, ": received ", got.load(), " bytes of ", total);
  row r{"tcp x" + std::to_string(k), k, total, std::chrono::duration<double>(t1 - t0).count(), 0, 0};
  const auto q = clock_type::time_point(clock_type::duration(quarter_at.load()));
  r.steady_seconds = std::chrono::duration<double>(t1 - q).count();
  r.steady_bytes = total - quarter_bytes;
  return r;
}

// A row of the library's: K connections a pair (K = 0: chosen from the measured link, up to 16:
// tcp_options::streams_from_link), one of them reset halfway or not.
struct library_row {
  int streams = 1;
  bool reset = false;
};

void library_streams(dt::transport::tcp_options& o, int streams) {
  o.streams = streams == 0 ? dt::transport::wire::max_streams : streams;
  o.streams_from_link = streams == 0;
}

row receive_library(const std::string& address, int streams, std::size_t total, std::size_t message, bool reset) {
  dt::transport::tcp_options o;
  o.rank = 0;
  o.world = 2;
  o.listen = address;
  library_streams(o, streams);
  dt::transport::tcp peer(o);
  peer.connect();
  const auto t0 = clock_type::now();
  clock_type::time_point q{};
  std::size_t got = 0, quarter_bytes = 0;
  std::string counts;  // (the pair's connections as each message landed)
  while (got < total) {
    const auto data = peer.recv(1, 1);
    dt::detail::check(!data.empty() && data.size() <= message, "decentrain: a message of ", data.size(), " bytes");
    got += data.size();
    counts += (counts.empty() ? "" : ",") + std::to_string(peer.streams_to(1)) + "@" +
              std::to_string(static_cast<int>(std::chrono::duration<double>(clock_type::now() - t0).count() * 10) / 10.0).substr(0, 4);
    if (quarter_bytes == 0 && got >= total / 4) {
      quarter_bytes = got;
      q = clock_type::now();
    }
  }
  const auto t1 = clock_type::now();
  const std::byte ack{1};
  peer.send(1, 2, std::span<const std::byte>(&ack, 1));
  (void)peer.recv(1, 3);  // the sender's goodbye: neither closes while the other still reads
  const int kept = peer.streams_to(1);
  if (streams == 0) std::fprintf(stderr, "decentrain auto: connections as each message landed (at seconds): %s\n", counts.c_str());
  return {streams == 0 ? "decentrain auto" : "decentrain x" + std::to_string(streams) + (reset ? ", one reset" : ""), streams == 0 ? kept : streams,
          got, std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t1 - q).count(), got - quarter_bytes};
}

// ---- the sender ----

// K connections, each opened and written on a thread of its own (opened one after another, the
// handshakes' round trips would count against the rows with more streams).
void send_plain(const sockaddr_in& to, int k, std::size_t total) {
  std::vector<int> conns(static_cast<std::size_t>(k), -1);
  std::vector<std::exception_ptr> failed(static_cast<std::size_t>(k));
  std::vector<std::thread> writers;
  for (int i = 0; i < k; ++i)
    writers.emplace_back([&, i] {
      try {
        const auto at = static_cast<std::size_t>(i);
        conns[at] = checked(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), "socket");
        const auto deadline = clock_type::now() + std::chrono::seconds(30);
        while (::connect(conns[at], reinterpret_cast<const sockaddr*>(&to), sizeof to) < 0) {
          dt::detail::check(clock_type::now() < deadline, "cannot connect to the receiver: ", std::strerror(errno));
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        const std::vector<char> buffer(4 << 20, 0);
        std::size_t left = total / static_cast<std::size_t>(k) + (i == 0 ? total % static_cast<std::size_t>(k) : 0);
        while (left > 0) {
          const auto n = std::min(left, buffer.size());
          write_all(conns[at], buffer.data(), n);
          left -= n;
        }
        ::shutdown(conns[at], SHUT_WR);
      } catch (...) {
        failed[static_cast<std::size_t>(i)] = std::current_exception();
      }
    });
  for (auto& t : writers) t.join();
  const auto close_all = [&] {
    for (int fd : conns)
      if (fd >= 0) ::close(fd);
  };
  for (const auto& e : failed)
    if (e) {
      close_all();
      std::rethrow_exception(e);
    }
  char ack = 0;
  const bool confirmed = ::recv(conns[0], &ack, 1, 0) == 1 && ack == 'k';
  close_all();
  dt::detail::check(confirmed, "tcp x", k, ": the receiver did not confirm the row whole");
}

void send_library(const std::string& address, int streams, std::size_t total, std::size_t message, bool reset) {
  dt::transport::tcp_options o;
  o.rank = 1;
  o.world = 2;
  library_streams(o, streams);
  o.listen.clear();  // dials the receiver, as a peer behind a NAT would
  o.join = {address};
  dt::transport::tcp peer(o);
  peer.connect();
  const std::vector<std::byte> buffer(message);
  // (the reset comes from a thread of its own, so that it lands in the middle of a message)
  std::atomic<std::size_t> sent = 0;
  std::atomic<bool> done = false, reset_done = false;
  std::thread resetter;
  if (reset)
    resetter = std::thread([&] {
      while (!done && sent < total / 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      for (const auto& p : peer.stream_ports_to(0))
        if (p.stream == 1) reset_done = bench::reset_connection(p.local, p.remote);
    });
  try {
    while (sent < total) {
      const auto n = std::min(message, total - sent);
      peer.send(0, 1, std::span<const std::byte>(buffer.data(), n));
      sent += n;
    }
  } catch (...) {
    done = true;
    if (resetter.joinable()) resetter.join();
    throw;
  }
  done = true;
  if (resetter.joinable()) resetter.join();
  const auto s = peer.stats();
  if (reset)
    std::fprintf(stderr, "decentrain x%d: stream 1 %s; %llu streams lost, %llu pieces sent again\n", streams,
                 reset_done ? "reset" : "NOT reset (it was gone, or the last message went out first)",
                 static_cast<unsigned long long>(s.streams_lost), static_cast<unsigned long long>(s.pieces_resent));
  dt::detail::check(!reset || (reset_done && s.pieces_resent > 0), "decentrain x", streams, ": the reset did not take a stream midway");
  (void)peer.recv(0, 2);
  const std::byte bye{1};
  peer.send(0, 3, std::span<const std::byte>(&bye, 1));
}

}  // namespace

int main(int argc, char** argv) try {
  bench::args a(argc, argv,
                "usage: bench_streams --role receive|send --address IP:PORT [--streams 1,4,8] [--library-streams 1,4] "
                "[--library-reset K,...] [--bytes N] [--message-bytes N] [--link-mbit 1000] [--json PATH]");
  const std::string role = a.value("role", "");
  const std::string address = a.value("address", "");
  std::vector<int> streams;
  for (const auto& s : bench::split(a.value("streams", "1,4,8"), ',')) {
    streams.push_back(std::stoi(s));
    dt::detail::check(streams.back() >= 1 && streams.back() <= 256, "--streams: ", s, " is not in 1..256");
  }
  // (auto: 0, chosen from the measured link; rows of the library's with one stream reset halfway: K >= 2)
  std::vector<library_row> library_rows;
  for (const auto& s : bench::split(a.value("library-streams", "1,4"), ',')) {
    library_rows.push_back({s == "auto" ? 0 : std::stoi(s), false});
    dt::detail::check(s == "auto" || (library_rows.back().streams >= 1 && library_rows.back().streams <= 16), "--library-streams: ", s,
                      " is not in 1..16 (tcp_options::streams) or auto");
  }
  if (const auto reset = a.value("library-reset", ""); !reset.empty())
    for (const auto& s : bench::split(reset, ',')) {
      library_rows.push_back({std::stoi(s), true});
      dt::detail::check(library_rows.back().streams >= 2 && library_rows.back().streams <= 16, "--library-reset: ", s,
                        " is not in 2..16 (a row with one stream has none to reset and go on without)");
    }
  const auto total = static_cast<std::size_t>(std::stoull(a.value("bytes", "1073741824")));
  const auto message = static_cast<std::size_t>(
      std::stoull(a.value("message-bytes", std::to_string(std::min<std::size_t>(std::size_t{64} << 20, total / 16)))));
  const double link_mbit = std::stod(a.value("link-mbit", "1000"));
  const std::string json_path = a.value("json", "bench/results/streams.json");
  a.finish();
  dt::detail::check(role == "receive" || role == "send", "--role must be receive or send, got '", role, "'");
  // (the library's steady rate starts at the message that passes the first quarter: a few more
  // must follow it)
  dt::detail::check(total >= 1024 && message >= 1 && message <= total / 8,
                    "--bytes must be at least 1024 and --message-bytes in 1..--bytes / 8");
  const auto plain = parse_address(address);

  if (role == "send") {
    for (int k : streams) send_plain(plain, k, total);
    for (std::size_t i = 0; i < library_rows.size(); ++i)
      send_library(with_port(address, static_cast<int>(i) + 1), library_rows[i].streams, total, message, library_rows[i].reset);
    return 0;
  }
  bench::output_file json(json_path);  // opened first: a bad path fails before the measuring
  const int listener = checked(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), "socket");
  const int one = 1;
  checked(::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one), "setsockopt");
  checked(::bind(listener, reinterpret_cast<const sockaddr*>(&plain), sizeof plain), "bind");
  checked(::listen(listener, 256), "listen");
  std::vector<row> rows;
  for (int k : streams) {
    rows.push_back(receive_plain(listener, k, total));
    std::fprintf(stderr, "%s done\n", rows.back().name.c_str());
  }
  ::close(listener);
  for (std::size_t i = 0; i < library_rows.size(); ++i) {
    rows.push_back(receive_library(with_port(address, static_cast<int>(i) + 1), library_rows[i].streams, total, message,
                                   library_rows[i].reset));
    std::fprintf(stderr, "%s done\n", rows.back().name.c_str());
  }

  std::printf("\n| row | streams | MB | seconds | Mbit/s | steady Mbit/s | steady, of the %.0f Mbit/s link |\n|---|---:|---:|---:|---:|---:|---:|\n",
              link_mbit);
  json << "{\"link_mbit\": " << link_mbit << ", \"rows\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const double mbit = static_cast<double>(r.bytes) * 8 / r.seconds / 1e6;
    const double steady = static_cast<double>(r.steady_bytes) * 8 / r.steady_seconds / 1e6;
    std::printf("| %s | %d | %.0f | %.2f | %.0f | %.0f | %.2f |\n", r.name.c_str(), r.streams, static_cast<double>(r.bytes) / 1e6,
                r.seconds, mbit, steady, steady / link_mbit);
    json << (i ? ", " : "") << "{\"row\": \"" << r.name << "\", \"streams\": " << r.streams << ", \"bytes\": " << r.bytes
         << ", \"seconds\": " << r.seconds << ", \"mbit_s\": " << mbit << ", \"steady_mbit_s\": " << steady << "}";
  }
  json << "]}\n";
  json.close();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_streams: %s\n", e.what());
  return 1;
}
