// A live TCP peer forming a group, and a stranger (this input) who connects to it, writes the
// input's bytes and hangs up. The peer holds a run key, or (bit 1 of the first byte set) an
// identity of its own and the run's roster instead (transport/identity.hpp), where the stranger
// would need another rank's private key. Properties, checked after every input:
// - the stranger is never admitted (the peer connects to nobody: forging the proof of the key,
//   or a signature of a roster's key, is out of reach of any input);
// - the peer answers a stranger with nothing but the handshake's own frames (a challenge, a
//   goodbye): no directory of the group's addresses, no welcome;
// - the peer closes the connection once the stranger hangs up (no connection is held);
// and, as always, no crash, no sanitizer report, no allocation past libFuzzer's limit.
//
// An input is either raw bytes (for the keyed peer) or (first byte odd) chunks the target frames
// properly, so the fuzzer spends its time past the header checks: [type][length: 2 bytes][body].
#include "fuzz.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "decentrain/transport/tcp.hpp"

namespace tr = decentrain::transport;
namespace wire = tr::wire;
using decentrain_fuzz::require;

namespace {

const std::string run_key = "decentrain fuzzing run key, not a secret";

tr::tcp& live_peer() {
  static tr::tcp peer = [] {
    tr::tcp_options o;
    o.rank = 0;
    o.world = 2;
    o.key = run_key;
    o.handshake_timeout = std::chrono::milliseconds(2000);
    return tr::tcp(o);
  }();
  return peer;
}

// Rank 0 of 2 with an Ed25519 key of its own; the roster lists rank 1 with a key no input holds.
// (The key files lie in a folder of this process's, removed at exit.)
tr::tcp& identity_peer() {
  namespace fs = std::filesystem;
  static const struct folder {
    fs::path path = fs::temp_directory_path() / ("decentrain-fuzz-identity-" + std::to_string(::getpid()));
    folder() {
      fs::create_directories(path);
      const auto self = tr::identity::key_pair::generate(), other = tr::identity::key_pair::generate();
      self.write((path / "peer.key").string());
      tr::identity::roster roster;
      roster.add(0, self.public_part());
      roster.add(1, other.public_part());
      std::ofstream(path / "roster") << roster.text();
    }
    ~folder() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } files;
  static tr::tcp peer = [] {
    tr::tcp_options o;
    o.rank = 0;
    o.world = 2;
    o.identity.identity = (files.path / "peer.key").string();
    o.identity.roster = (files.path / "roster").string();
    o.handshake_timeout = std::chrono::milliseconds(2000);
    return tr::tcp(o);
  }();
  return peer;
}

std::string frame(wire::frame_type type, std::span<const std::byte> body) {
  const auto head = wire::encode_header(wire::header{type, 0, body.size(), {}});
  std::string out(reinterpret_cast<const char*>(head.data()), head.size());
  out.append(reinterpret_cast<const char*>(body.data()), body.size());
  out.append(wire::padding(body.size()).size(), '\0');
  return out;
}

std::string stream_of(std::span<const std::uint8_t> input) {
  if (input.empty() || input[0] % 2 == 0) return std::string(reinterpret_cast<const char*>(input.data()), input.size());
  decentrain_fuzz::reader r{input.subspan(1)};
  std::string out;
  while (!r.empty()) {
    const auto type = static_cast<wire::frame_type>(r.number(1) % (wire::last_frame_type + 2));  // 0 and last + 1: unknown
    const auto body = r.take(static_cast<std::size_t>(r.number(2)));
    out += frame(type, std::as_bytes(body));
  }
  return out;
}

// Everything the peer sent back, as frames: only the handshake's may be there.
void check_answer(const std::string& answer) {
  std::size_t at = 0, pad = 0;
  while (at + pad + wire::header_bytes <= answer.size()) {
    const auto h = wire::decode_header(reinterpret_cast<const std::byte*>(answer.data() + at + pad), 1 << 20);
    require(h.type == wire::frame_type::challenge || h.type == wire::frame_type::bye,
            "the peer sent a stranger a frame other than a challenge or a goodbye");
    at += pad + wire::header_bytes + h.length;
    pad = wire::padding(h.length).size();
  }
}

// One stranger's visit: connects, writes `stream`, hangs up, reads what the peer answered.
void visit(tr::tcp& peer, const std::string& stream) {
  static const auto port = wire::split_address(peer.address()).second;

  // (libFuzzer's timer signal can interrupt a call: EINTR is retried throughout)
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    require(fd >= 0, "socket() failed");
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0) break;
    const int e = errno;
    ::close(fd);
    fd = -1;
    if (e != EINTR || attempt == 10) {
      std::fprintf(stderr, "fuzz: connect: %s\n", std::strerror(e));
      require(false, "cannot connect to the live peer");
    }
  }
  // Closing with a reset once the peer has closed leaves no TIME_WAIT behind: a connection per
  // input would otherwise use up the loopback's ephemeral ports within a minute.
  const linger abort_on_close{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof abort_on_close);
  timeval limit{5, 0};  // the peer must close well within this after the stranger hangs up
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  for (std::size_t at = 0; at < stream.size();) {
    const auto n = ::send(fd, stream.data() + at, stream.size() - at, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the peer closed first (a bad frame): fine
    at += static_cast<std::size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string answer;
  char buffer[4096];
  for (;;) {
    const auto n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n > 0) {
      answer.append(buffer, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != ECONNRESET) {
      const auto a = peer.admission();
      std::fprintf(stderr, "fuzz: after %zu bytes in, %zu out: errno %d; peer: %d pending, %llu timed out, %llu evicted, %llu refused, last: %s\n",
                   stream.size(), answer.size(), errno, a.pending, static_cast<unsigned long long>(a.timed_out),
                   static_cast<unsigned long long>(a.evicted), static_cast<unsigned long long>(a.refused), a.last_rejected.c_str());
      require(false, "the peer kept the connection of a stranger who hung up");
    }
    break;
  }
  ::close(fd);
  check_answer(answer);
  require(peer.connected().empty(), "a caller without the run key was admitted");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // OpenSSL sets up its random generator and digests on first use, on the peer's I/O thread, and
  // keeps them: one visit to each peer before the first input keeps that out of the leak checks of inputs.
  static const bool warm = (visit(live_peer(), decentrain_fuzz::seeds().front()), visit(identity_peer(), decentrain_fuzz::seeds().back()), true);
  (void)warm;
  visit(size > 0 && data[0] % 2 == 1 && (data[0] & 2) ? identity_peer() : live_peer(), stream_of({data, size}));
  return 0;
}

std::vector<std::string> decentrain_fuzz::seeds() {
  wire::hello hello;
  hello.rank = 1;
  hello.world = 2;
  hello.address = "127.0.0.1:1";
  hello.nonce = std::string(tr::auth::nonce_bytes, 'n');
  const auto body = wire::encode_body(hello);
  const std::string hello_frame = frame(wire::frame_type::hello, body);
  const tr::bytes forged_proof(tr::auth::proof_bytes, std::byte{0x5a});
  auto directory_hello = hello;
  directory_hello.purpose = wire::hello_purpose::directory;
  auto keyless = hello;
  keyless.nonce.clear();
  // To the identity peer (first byte 3), framed by the target: a hello with an exchange key, then
  // a signature no roster key made.
  auto signed_hello = hello;
  signed_hello.credentials = 2;
  signed_hello.exchange = std::string(tr::identity::exchange_key_bytes, 'x');
  auto chunk = [](wire::frame_type type, std::span<const std::byte> b) {
    std::string out{static_cast<char>(type), static_cast<char>(b.size() & 0xff), static_cast<char>(b.size() >> 8)};
    return out.append(reinterpret_cast<const char*>(b.data()), b.size());
  };
  const tr::bytes forged_signature(tr::identity::signature_bytes, std::byte{0x33});
  const std::string to_identity_peer =
      "\x03" + chunk(wire::frame_type::hello, wire::encode_body(signed_hello)) + chunk(wire::frame_type::proof, forged_signature);
  return {hello_frame + frame(wire::frame_type::proof, forged_proof),
          frame(wire::frame_type::hello, wire::encode_body(directory_hello)) + frame(wire::frame_type::proof, forged_proof),
          frame(wire::frame_type::hello, wire::encode_body(keyless)),
          hello_frame + frame(wire::frame_type::data, forged_proof),
          hello_frame.substr(0, 80),
          std::string(1, '\x01') + std::string("\x01\x10\x00", 3) + std::string(16, 'x'),
          to_identity_peer};
}
