// The TCP wire format, kept free of sockets so it can be tested and fuzzed on its own.
// A frame is a 64-byte header block (little-endian magic "DTRN", version, type, tag, body
// length in its first 24 bytes, then the frame's 16-byte authentication tag, zeros when the run
// has no key (transport/auth.hpp), zeros after), the body, and zeros up to the next multiple of
// 64 bytes, so every body starts 64-byte aligned in the stream (see frame_alignment). Control
// bodies (hello, directory) are cereal portable-binary archives, read with
// detail::bounded_input_archive and bounded loaders for strings and lists; data bodies are the raw bytes a collective sent. Everything here treats its input as hostile: sizes are checked before
// anything is allocated, and every failure is a decentrain::error naming what was wrong.
#pragma once

#include <cereal/archives/portable_binary.hpp>

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "decentrain/detail/bounded_archive.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/transport/auth.hpp"
#include "decentrain/transport/endpoint.hpp"

namespace decentrain::transport::wire {

inline constexpr std::uint32_t magic = 0x4e525444;  // "DTRN" in little-endian byte order
// 1: 24-byte headers, bodies not aligned; 2: no heartbeats, goodbyes without a reason; 4: no
// run keys, no answer to a hello; 6: fault::elastic's state offers in chunks of one size; 7: no
// per-peer identities, directories that do not tell joiners from members; 8: no relays; 9: no
// hole punching; 10: one connection a pair (no striped messages); 11: a lost stream's pieces not
// sent again (no landed frames); 12: a pair's streams only as many as dialed at the start (no
// streams frames).
inline constexpr std::uint16_t version = 13;
// Why frames keep to 64-byte boundaries: a send is copied into the kernel's socket pages in
// stream order, so a body that starts on a 64-byte boundary of the stream is written there
// aligned, and the kernel's copy into a misaligned destination can cost several times as much
// per byte, a large share of a TCP all-reduce's bandwidth (bench/RESULTS.md).
// The price is at most 40 + 63 bytes of zeros per frame.
inline constexpr std::size_t frame_alignment = 64;
inline constexpr std::size_t header_bytes = frame_alignment;
inline constexpr std::size_t header_used_bytes = 24;  // what the tag covers of the header
inline constexpr std::size_t tag_offset = header_used_bytes;
inline constexpr std::size_t reserved_offset = tag_offset + auth::tag_bytes;
inline constexpr std::size_t max_control_bytes = std::size_t{1} << 20;
// A connection that has not said (and, with a run key, proved) who it is may send no more than
// this in one frame: a stranger cannot make a peer hold memory for it (a hello is ~300 bytes).
inline constexpr std::size_t max_handshake_bytes = 4096;
inline constexpr std::size_t max_nonce_bytes = 64;
// The run key's challenge (without identities, tcp/handshake.hpp): the acceptor's nonce, its
// rank (little-endian int32), its proof.
inline constexpr std::size_t challenge_bytes = auth::nonce_bytes + 4 + auth::proof_bytes;
inline constexpr std::size_t max_exchange_bytes = 64;
inline constexpr std::size_t max_address_chars = 255;
inline constexpr std::size_t max_settings_chars = 4096;  // hello::settings
inline constexpr std::size_t max_directory_entries = 65536;

// challenge, proof: the handshake's proofs (tcp/handshake.hpp); welcome: the answer to a data
// hello that was accepted (a refused one gets a bye saying why); relay: a piece of a connection
// between two other peers that this hop carries (tcp/relay.hpp; its route is in the tag);
// stripe: a message that comes in pieces over several connections (tcp/stripes.hpp: its tag is
// the message's, its body a stripe_head); piece: one of them (its tag a piece_id); landed: the
// pieces that came over a pair's further streams and landed (its body their piece_ids), so that
// their sender keeps no copy of them for a stream lost later; streams: the connections the
// sender, the pair's acceptor, wants the pair to keep (tcp_options::streams_from_link: its tag
// the count, its body empty), which the pair's dialer opens.
enum class frame_type : std::uint16_t {
  hello = 1, directory = 2, data = 3, bye = 4, heartbeat = 5, challenge = 6, proof = 7, welcome = 8, relay = 9,
  stripe = 10, piece = 11, landed = 12, streams = 13
};
inline constexpr std::uint16_t last_frame_type = 13;

// A relay frame's route, in its header's tag: what it does, and the two ends. Bits 63-56 the
// kind, 55-48 zero, 47-24 `from`, 23-0 `to` (ranks are below 65536: tcp_options::max_world).
// open: a circuit from `from` to `to`; bytes: a piece of its stream; close: the end (or the
// relay, refusing it) closed it; ack: how much of the stream `from` has received (a u64), so
// the sender may forget it; resume: the circuit goes on through this relay, `from` having
// received so much (a u64): the other lost it; lost: the relay lost the other end; punch: `from`
// asks the relay to tell it and `to` each other's address as the relay sees it (the relay's
// answers carry that address: tcp/punch.hpp).
enum class relay_kind : std::uint8_t { open = 1, bytes = 2, close = 3, ack = 4, resume = 5, lost = 6, punch = 7 };
inline constexpr std::uint8_t last_relay_kind = 7;
struct relay_route {
  relay_kind kind = relay_kind::bytes;
  int from = 0;
  int to = 0;
  bool operator==(const relay_route&) const = default;
};
inline tag_type encode_route(const relay_route& r) {
  return static_cast<tag_type>(r.kind) << 56 | static_cast<tag_type>(static_cast<std::uint32_t>(r.from) & 0xffffff) << 24 |
         static_cast<tag_type>(static_cast<std::uint32_t>(r.to) & 0xffffff);
}
// Throws on an unknown kind, set bits that must be zero, or a rank not below `capacity`.
inline relay_route decode_route(tag_type t, int capacity) {
  const auto kind = static_cast<std::uint8_t>(t >> 56);
  decentrain::detail::check(kind >= 1 && kind <= last_relay_kind, "frame: a relay frame of unknown kind ", static_cast<int>(kind));
  decentrain::detail::check(((t >> 48) & 0xff) == 0, "frame: a relay frame's route has reserved bits set");
  const int from = static_cast<int>((t >> 24) & 0xffffff), to = static_cast<int>(t & 0xffffff);
  decentrain::detail::check(from < capacity && to < capacity && from != to, "frame: a relay frame routed from peer ", from,
                            " to peer ", to, " (ranks below ", capacity, ", two different ones)");
  return {static_cast<relay_kind>(kind), from, to};
}

// Fixed bodies of little-endian u64s (a stream position, a striped message's head, a heartbeat).
template <std::size_t N>
bytes encode_u64s(const std::array<std::uint64_t, N>& values) {
  bytes out(8 * N);
  for (std::size_t k = 0; k < N; ++k)
    for (std::size_t i = 0; i < 8; ++i) out[8 * k + i] = static_cast<std::byte>((values[k] >> (8 * i)) & 0xff);
  return out;
}
// Throws, naming `what`, unless `body` holds exactly N of them.
template <std::size_t N>
std::array<std::uint64_t, N> decode_u64s(std::span<const std::byte> body, const char* what) {
  decentrain::detail::check(body.size() == 8 * N, "frame: ", what, " of ", body.size(), " bytes (it has ", 8 * N, ")");
  std::array<std::uint64_t, N> out{};
  for (std::size_t k = 0; k < N; ++k)
    for (std::size_t i = 0; i < 8; ++i) out[k] |= static_cast<std::uint64_t>(body[8 * k + i]) << (8 * i);
  return out;
}

// The stream position an ack or a resume carries.
inline bytes encode_position(std::uint64_t v) { return encode_u64s<1>({v}); }
inline std::uint64_t decode_position(std::span<const std::byte> b) { return decode_u64s<1>(b, "a relay frame's stream position")[0]; }

// A striped message (tcp/stripes.hpp): its stripe frame's body says which it is of those the
// pair's first connection announced (1, 2, ...), its size, and the size of its pieces (the last
// may be shorter); each piece frame's tag names the message and the piece. Pieces are 64-byte
// multiples (each lands aligned), at least min_piece_bytes, and a message has at most
// max_pieces of them.
inline constexpr std::size_t stripe_head_bytes = 24;
inline constexpr std::uint64_t min_piece_bytes = 4096;
inline constexpr std::uint64_t max_pieces = std::uint64_t{1} << 24;
struct stripe_head {
  std::uint64_t seq = 0, total = 0, piece = 0;
  std::uint64_t pieces() const { return total / piece + (total % piece != 0); }  // (total + piece - 1 could wrap)
  std::uint64_t offset(std::uint64_t index) const { return index * piece; }
  std::uint64_t length(std::uint64_t index) const { return std::min(piece, total - index * piece); }
};
inline bytes encode_stripe_head(const stripe_head& s) { return encode_u64s<3>({s.seq, s.total, s.piece}); }
// Throws unless the body is one, of at most `max_total` bytes in pieces as above.
inline stripe_head decode_stripe_head(std::span<const std::byte> body, std::uint64_t max_total) {
  const auto v = decode_u64s<3>(body, "a stripe frame");
  const stripe_head s{v[0], v[1], v[2]};
  decentrain::detail::check(s.total >= 1 && s.total <= max_total, "frame: a striped message of ", s.total, " bytes (1 to ",
                            max_total, ")");
  decentrain::detail::check(s.piece >= min_piece_bytes && s.piece % frame_alignment == 0 && s.piece <= max_total,
                            "frame: a striped message in pieces of ", s.piece, " bytes (multiples of ", frame_alignment, " from ",
                            min_piece_bytes, " to ", max_total, ")");
  decentrain::detail::check(s.pieces() <= max_pieces, "frame: a striped message in ", s.pieces(), " pieces (at most ", max_pieces, ")");
  decentrain::detail::check(s.seq >= 1 && s.seq < (std::uint64_t{1} << 40), "frame: a striped message numbered ", s.seq);
  return s;
}
// A piece frame's tag: bits 63-24 its message's number, 23-0 the piece's index.
struct piece_id {
  std::uint64_t seq = 0, index = 0;
  bool operator==(const piece_id&) const = default;
};
inline tag_type encode_piece_id(const piece_id& p) { return (p.seq & ((std::uint64_t{1} << 40) - 1)) << 24 | (p.index & 0xffffff); }
inline piece_id decode_piece_id(tag_type t) { return {t >> 24, t & 0xffffff}; }
// A streams frame: the count of connections wanted (its tag), from 1 to max_streams, and no body.
inline constexpr int max_streams = 16;
inline int decode_streams(tag_type tag, std::uint64_t length) {
  decentrain::detail::check(length == 0 && tag >= 1 && tag <= static_cast<tag_type>(max_streams), "frame: a streams frame asking for ", tag,
                            " connections with a body of ", length, " bytes (from 1 to ", max_streams, ", and no body)");
  return static_cast<int>(tag);
}
// A landed frame's body: piece ids (encode_piece_id), little-endian, at most max_landed_ids.
inline constexpr std::size_t max_landed_ids = max_control_bytes / 8;
inline bytes encode_landed(std::span<const tag_type> ids) {
  bytes b(ids.size() * 8);
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (std::size_t k = 0; k < 8; ++k) b[i * 8 + k] = static_cast<std::byte>(ids[i] >> (8 * k) & 0xff);
  return b;
}
inline std::vector<piece_id> decode_landed(std::span<const std::byte> body) {
  decentrain::detail::check(!body.empty() && body.size() % 8 == 0 && body.size() / 8 <= max_landed_ids, "frame: a landed frame of ",
                            body.size(), " bytes (a multiple of 8, from 8 to ", max_landed_ids * 8, ")");
  std::vector<piece_id> ids(body.size() / 8);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    tag_type t = 0;
    for (std::size_t k = 0; k < 8; ++k) t |= static_cast<tag_type>(std::to_integer<std::uint8_t>(body[i * 8 + k])) << (8 * k);
    ids[i] = decode_piece_id(t);
  }
  return ids;
}

struct header {
  frame_type type = frame_type::data;
  tag_type tag = 0;
  std::uint64_t length = 0;
  auth::tag mac{};  // zeros without a run key
};

inline std::array<std::byte, header_bytes> encode_header(const header& h) {
  std::array<std::byte, header_bytes> out{};
  auto put = [&](std::size_t at, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out[at + static_cast<std::size_t>(i)] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
  };
  put(0, magic, 4);
  put(4, version, 2);
  put(6, static_cast<std::uint16_t>(h.type), 2);
  put(8, h.tag, 8);
  put(16, h.length, 8);
  std::memcpy(out.data() + tag_offset, h.mac.data(), h.mac.size());
  return out;
}

// The zeros that follow a body of `body_length` bytes, up to the next frame boundary.
inline std::span<const std::byte> padding(std::uint64_t body_length) {
  static constexpr std::array<std::byte, frame_alignment> zeros{};
  return {zeros.data(), static_cast<std::size_t>((frame_alignment - body_length % frame_alignment) % frame_alignment)};
}

// Throws unless every byte is zero: header and padding bytes that carry nothing must be zero, so
// a stream that lost its framing is caught at the next frame instead of misread.
inline void check_zeros(const std::byte* p, std::size_t n, const char* what) {
  for (std::size_t i = 0; i < n; ++i)
    decentrain::detail::check(p[i] == std::byte{0}, "frame: ", what, " byte ", i, " is 0x", std::hex,
                              static_cast<int>(p[i]), ", not zero");
}

// Throws on a bad magic, version, type, non-zero reserved bytes or a length over `max_body`
// (data) or the control limit. The tag is returned, not checked (the connection knows its keys).
inline header decode_header(const std::byte* p, std::uint64_t max_body) {
  auto get = [&](std::size_t at, int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[at + static_cast<std::size_t>(i)]) << (8 * i);
    return v;
  };
  // (A caller with TLS where this peer has none is told so by tcp.hpp before any header is decoded.)
  decentrain::detail::check(get(0, 4) == magic, "frame: bad magic 0x", std::hex, get(0, 4), " (not a decentrain peer)");
  decentrain::detail::check(get(4, 2) == version, "frame: protocol version ", std::dec, get(4, 2), ", this peer speaks ", version);
  const auto type = get(6, 2);
  decentrain::detail::check(type >= 1 && type <= last_frame_type, "frame: unknown frame type ", type);
  check_zeros(p + reserved_offset, header_bytes - reserved_offset, "reserved header");
  header h{static_cast<frame_type>(type), get(8, 8), get(16, 8), {}};
  std::memcpy(h.mac.data(), p + tag_offset, h.mac.size());
  const std::uint64_t limit =
      h.type == frame_type::data || h.type == frame_type::relay || h.type == frame_type::piece ? max_body : max_control_bytes;
  decentrain::detail::check(h.length <= limit, "frame: body of ", h.length, " bytes is over the limit of ", limit);
  return h;
}

// The rank in a challenge being built (after the nonce) or received (at the same place).
inline void put_challenge_rank(bytes& challenge, std::int32_t rank) {
  for (int i = 0; i < 4; ++i) challenge.push_back(static_cast<std::byte>((static_cast<std::uint32_t>(rank) >> (8 * i)) & 0xff));
}
inline std::int32_t challenge_rank(std::span<const std::byte> challenge) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(challenge[auth::nonce_bytes + i]) << (8 * i);
  return static_cast<std::int32_t>(v);
}

// Strings on the wire: a size tag, then the characters. A string or list read from the network
// is bounded before anything is allocated for it.
template <class Archive>
void save_string(Archive& ar, const std::string& value) {
  ar(cereal::make_size_tag(static_cast<cereal::size_type>(value.size())));
  ar(cereal::binary_data(value.data(), value.size()));
}

// Reads what save_string wrote, refusing more than `max` characters before allocating.
struct bounded_string {
  std::string& value;
  std::size_t max;
  template <class Archive>
  void load(Archive& ar) {
    cereal::size_type n = 0;
    ar(cereal::make_size_tag(n));
    decentrain::detail::check(n <= max, "frame: a string of ", n, " characters is over the limit of ", max);
    value.resize(static_cast<std::size_t>(n));
    ar(cereal::binary_data(value.data(), value.size()));
  }
};

enum class hello_purpose : std::uint8_t { data = 0, directory = 1 };

// First frame on every connection: who is calling and why.
struct hello {
  std::int32_t rank = 0;
  std::int32_t world = 0;
  hello_purpose purpose = hello_purpose::data;
  bool little_endian = std::endian::native == std::endian::little;  // data bodies are native floats
  std::string address;  // where the sender listens
  bool late = false;     // data: the sender joins a group that is already running
  std::string nonce;     // fresh random bytes when the sender has credentials; empty otherwise
  std::string settings;  // tcp_options::settings: what every peer of the run must agree on
  std::uint8_t credentials = 0;  // what the sender proves itself with: 1 a run key, 2 an identity (both: 3)
  std::string exchange;          // with an identity: the sender's X25519 key for this connection
  // data: 0 for a pair's first connection; 1 and up for the further streams a striped message
  // also goes over (tcp_options::streams), which the dialer opens once the first stands.
  std::uint8_t stream = 0;

  template <class Archive>
  void save(Archive& ar) const {
    ar(rank, world, static_cast<std::uint8_t>(purpose), little_endian);
    save_string(ar, address);
    ar(late);
    save_string(ar, nonce);
    save_string(ar, settings);
    ar(credentials);
    save_string(ar, exchange);
    ar(stream);
  }
  template <class Archive>
  void load(Archive& ar) {
    std::uint8_t p = 0;
    ar(rank, world, p, little_endian, bounded_string{address, max_address_chars}, late, bounded_string{nonce, max_nonce_bytes},
       bounded_string{settings, max_settings_chars}, credentials, bounded_string{exchange, max_exchange_bytes}, stream);
    decentrain::detail::check(p <= 1, "frame: hello has unknown purpose ", static_cast<int>(p));
    decentrain::detail::check(credentials <= 3, "frame: hello has unknown credentials ", static_cast<int>(credentials));
    purpose = static_cast<hello_purpose>(p);
  }
};

// Reply to a directory hello: every (rank, address) the replying peer knows; once its group is
// running (`formed`), only itself and the peers it is connected to (those a joiner must reach),
// and which of those are joiners not admitted yet (a joiner dials only those of lower rank, so
// that two joiners never dial each other at once).
struct directory {
  std::vector<std::pair<std::int32_t, std::string>> entries;
  bool formed = false;
  std::vector<std::int32_t> joining;

  template <class Archive>
  void save(Archive& ar) const {
    ar(formed);
    ar(cereal::make_size_tag(static_cast<cereal::size_type>(entries.size())));
    for (const auto& [r, a] : entries) {
      ar(r);
      save_string(ar, a);
    }
    ar(cereal::make_size_tag(static_cast<cereal::size_type>(joining.size())));
    for (const auto r : joining) ar(r);
  }
  template <class Archive>
  void load(Archive& ar) {
    cereal::size_type n = 0;
    ar(formed);
    ar(cereal::make_size_tag(n));
    decentrain::detail::check(n <= max_directory_entries, "frame: directory of ", n, " entries is over the limit");
    entries.resize(static_cast<std::size_t>(n));
    for (auto& [r, a] : entries) ar(r, bounded_string{a, max_address_chars});
    ar(cereal::make_size_tag(n));
    decentrain::detail::check(n <= max_directory_entries, "frame: directory of ", n, " joiners is over the limit");
    joining.resize(static_cast<std::size_t>(n));
    for (auto& r : joining) ar(r);
  }
};

// Why a connection ends, when the peer ending it says so (the body of a bye frame; an empty body
// is a plain goodbye). `excluded`: the sender stopped listening to the receiver (it heard
// nothing from it in time, or left it out of a view) and is itself alive, so the receiver, if
// it was the frozen or cut-off one, must not count the sender as departed.
// `final`: a refusal that calling again cannot change (a missing or different run key).
struct farewell {
  bool excluded = false;
  std::string reason;
  bool final = false;

  template <class Archive>
  void save(Archive& ar) const {
    ar(excluded);
    save_string(ar, reason);
    ar(final);
  }
  template <class Archive>
  void load(Archive& ar) {
    ar(excluded, bounded_string{reason, 1024}, final);
  }
};

// A heartbeat's body: three little-endian u64, the sender's clock (steady, in ns) when it sent
// this, and the last heartbeat it had from the receiver (that one's `sent_ns`, 0 if none) with
// how long the sender held it. The receiver's round trip is then its clock now, less `echo_ns`,
// less `held_ns`; no clocks need to agree.
struct heartbeat {
  std::uint64_t sent_ns = 0, echo_ns = 0, held_ns = 0;
};
inline constexpr std::size_t heartbeat_bytes = 24;

inline bytes encode_heartbeat(const heartbeat& h) { return encode_u64s<3>({h.sent_ns, h.echo_ns, h.held_ns}); }

inline heartbeat decode_heartbeat(const bytes& body) {
  const auto v = decode_u64s<3>(body, "a heartbeat");
  return heartbeat{v[0], v[1], v[2]};
}

template <class T>
bytes encode_body(const T& message) {
  std::ostringstream out(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive ar(out);
    ar(message);
  }
  const std::string s = out.str();
  bytes b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

// Decodes a control body; anything cereal or the bounds reject becomes one decentrain::error.
template <class T>
T decode_body(const bytes& body, const char* what) {
  T message;
  try {
    decentrain::detail::bounded_input_archive ar(std::string_view(reinterpret_cast<const char*>(body.data()), body.size()), what);
    ar(message);
  } catch (const decentrain::error& e) {
    decentrain::detail::fail("frame: malformed ", what, ": ", e.what());
  } catch (const std::exception& e) {
    decentrain::detail::fail("frame: malformed ", what, " (", body.size(), " bytes): ", e.what());
  }
  return message;
}

// "host:port" or "[v6]:port" -> (host, port); throws naming the address when it is not one.
inline std::pair<std::string, std::uint16_t> split_address(const std::string& address) {
  const auto colon = address.rfind(':');
  decentrain::detail::check(colon != std::string::npos && colon > 0 && colon + 1 < address.size(), "tcp: address '",
                            address, "' is not HOST:PORT");
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port_text = address.substr(colon + 1);
  decentrain::detail::check(port_text.find_first_not_of("0123456789") == std::string::npos && port_text.size() <= 5,
                            "tcp: port '", port_text, "' in '", address, "' is not a number");
  const unsigned long port = std::stoul(port_text);
  decentrain::detail::check(port <= 65535, "tcp: port ", port, " in '", address, "' is over 65535");
  return {host, static_cast<std::uint16_t>(port)};
}

}  // namespace decentrain::transport::wire
