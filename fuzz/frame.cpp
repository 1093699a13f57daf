// The TCP wire format (transport/frame.hpp) as a peer reads it off a connection: headers,
// padding, and the control bodies (hello, directory, goodbye, heartbeat, challenge, a striped
// message's head, a piece's tag, a streams frame's count), with the
// addresses a directory hands out, and a run key's frame tags. Properties: every control body
// that decodes encodes back to bytes that decode to the same message; a forged tag never opens.
#include "fuzz.hpp"

#include "decentrain/transport/frame.hpp"

namespace wire = decentrain::transport::wire;
namespace auth = decentrain::transport::auth;
using decentrain::transport::bytes;

namespace {

constexpr std::uint64_t max_data = std::uint64_t{1} << 20;

bool same_hello(const wire::hello& a, const wire::hello& b) {
  return a.rank == b.rank && a.world == b.world && a.purpose == b.purpose && a.little_endian == b.little_endian &&
         a.address == b.address && a.late == b.late && a.nonce == b.nonce && a.stream == b.stream;
}

template <class T>
T round_trip(const T& m, const char* what) {
  return wire::decode_body<T>(wire::encode_body(m), what);
}

void control_body(wire::frame_type type, const bytes& body) {
  using decentrain_fuzz::rejects_cleanly;
  using decentrain_fuzz::require;
  switch (type) {
    case wire::frame_type::hello:
      rejects_cleanly([&] {
        const auto h = wire::decode_body<wire::hello>(body, "hello");
        require(same_hello(round_trip(h, "hello"), h), "a hello decodes to itself after encoding");
        rejects_cleanly([&] { (void)wire::split_address(h.address); });
      });
      break;
    case wire::frame_type::directory:
      rejects_cleanly([&] {
        const auto d = wire::decode_body<wire::directory>(body, "directory");
        const auto again = round_trip(d, "directory");
        require(again.entries == d.entries && again.formed == d.formed, "a directory decodes to itself after encoding");
        for (const auto& entry : d.entries) rejects_cleanly([&] { (void)wire::split_address(entry.second); });
      });
      break;
    case wire::frame_type::bye:
      if (!body.empty())
        rejects_cleanly([&] {
          const auto f = wire::decode_body<wire::farewell>(body, "goodbye");
          const auto again = round_trip(f, "goodbye");
          require(again.reason == f.reason && again.excluded == f.excluded && again.final == f.final,
                  "a goodbye decodes to itself after encoding");
        });
      break;
    case wire::frame_type::heartbeat:
      rejects_cleanly([&] {
        const auto h = wire::decode_heartbeat(body);
        require(wire::encode_heartbeat(h) == body, "a heartbeat encodes back to its bytes");
      });
      break;
    case wire::frame_type::challenge:
      if (body.size() == wire::challenge_bytes) (void)wire::challenge_rank(body);
      break;
    case wire::frame_type::stripe:
      rejects_cleanly([&] {
        const auto s = wire::decode_stripe_head(body, max_data);
        require(wire::encode_stripe_head(s) == body, "a stripe head encodes back to its bytes");
        // Its pieces tile the message: each within it, the last ending at its end.
        const auto last = s.pieces() - 1;
        require(s.pieces() >= 1 && s.offset(last) < s.total && s.offset(last) + s.length(last) == s.total,
                "a striped message's pieces tile it");
      });
      break;
    case wire::frame_type::landed:
      rejects_cleanly([&] {
        const auto ids = wire::decode_landed(body);
        std::vector<decentrain::transport::tag_type> tags;
        for (const auto& id : ids) tags.push_back(wire::encode_piece_id(id));
        require(wire::encode_landed(tags) == body, "a landed frame's ids encode back to its bytes");
      });
      break;
    default:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // A stream of frames, read as tcp.hpp's read_next does: padding, header, body.
  const auto* p = reinterpret_cast<const std::byte*>(data);
  std::size_t at = 0, pad = 0;
  while (at + pad + wire::header_bytes <= size) {
    wire::header h;
    if (decentrain_fuzz::rejects_cleanly([&] {
          wire::check_zeros(p + at, pad, "padding");
          h = wire::decode_header(p + at + pad, max_data);
        }))
      break;  // the connection is closed at the first bad frame
    at += pad + wire::header_bytes;
    if (h.length > size - at) break;  // truncated body
    const bytes body(p + at, p + at + h.length);
    at += static_cast<std::size_t>(h.length);
    pad = wire::padding(h.length).size();
    const auto head = std::span(p + at - h.length - wire::header_bytes, wire::header_used_bytes);
    if constexpr (auth::available) {
      // Whatever these bytes are, a receiver holding a key they were not sealed with rejects
      // the tag (forging one means breaking Poly1305).
      auth::frame_mac receiver(auth::digest{std::byte{1}});
      decentrain_fuzz::require(!receiver.open(head, body, h.mac), "a frame tag forged without the key opened");
      // The same for an encrypted connection (TLS), which decrypts the body in place.
      auth::frame_mac decrypting(auth::digest{std::byte{1}}, auth::protection::decrypt);
      bytes text = body;
      decentrain_fuzz::require(!decrypting.open_in_place(head, text, h.mac), "an encrypted frame forged without the key opened");
    }
    control_body(h.type, body);
    if (h.type == wire::frame_type::piece) {
      const auto id = wire::decode_piece_id(h.tag);
      decentrain_fuzz::require(wire::encode_piece_id(id) == h.tag, "a piece's tag encodes back to itself");
    }
    if (h.type == wire::frame_type::streams)
      decentrain_fuzz::rejects_cleanly([&] {
        const int n = wire::decode_streams(h.tag, h.length);
        decentrain_fuzz::require(n >= 1 && n <= wire::max_streams, "a streams frame asks for 1 to max_streams connections");
      });
  }
  return 0;
}

std::vector<std::string> decentrain_fuzz::seeds() {
  auto frame = [](wire::frame_type type, const bytes& body) {
    wire::header h{type, 7, body.size(), {}};
    const auto head = wire::encode_header(h);
    std::string out(reinterpret_cast<const char*>(head.data()), head.size());
    out.append(reinterpret_cast<const char*>(body.data()), body.size());
    const auto pad = wire::padding(body.size());
    out.append(pad.size(), '\0');
    return out;
  };
  wire::hello hello;
  hello.rank = 1;
  hello.world = 4;
  hello.address = "127.0.0.1:29500";
  hello.nonce = std::string(auth::nonce_bytes, 'n');
  hello.stream = 2;
  wire::directory dir;
  dir.entries = {{0, "10.0.0.1:1"}, {2, "[::1]:65535"}};
  dir.formed = true;
  bytes challenge(auth::nonce_bytes, std::byte{3});
  wire::put_challenge_rank(challenge, 2);
  challenge.resize(wire::challenge_bytes);
  const std::string stream = frame(wire::frame_type::hello, wire::encode_body(hello)) +
                             frame(wire::frame_type::challenge, challenge) +
                             frame(wire::frame_type::heartbeat, wire::encode_heartbeat({1, 2, 3})) +
                             frame(wire::frame_type::data, bytes(100, std::byte{9})) +
                             frame(wire::frame_type::stripe, wire::encode_stripe_head({1, 10000, 4096})) +
                             frame(wire::frame_type::landed, wire::encode_landed(std::vector<decentrain::transport::tag_type>{
                                                                 wire::encode_piece_id({1, 1}), wire::encode_piece_id({1, 2})})) +
                             frame(wire::frame_type::streams, {}) +
                             frame(wire::frame_type::directory, wire::encode_body(dir)) +
                             frame(wire::frame_type::bye, wire::encode_body(wire::farewell{true, "left out", false}));
  return {stream, frame(wire::frame_type::hello, wire::encode_body(hello)),
          frame(wire::frame_type::directory, wire::encode_body(dir))};
}
