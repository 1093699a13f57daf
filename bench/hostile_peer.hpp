// A peer that holds what a member holds (the run key, or its own identity) and lies: it connects
// to a live TCP peer with the library's own handshake (transport/tcp/handshake.hpp), then sends
// whatever frames it is told to, sealed with the connection's keys so they pass authentication.
// For bench/attacks and the hostile tests; every socket read and write gives up after a bound.
#pragma once

#include <asio.hpp>
#include <sys/socket.h>
#include <sys/time.h>

#include <array>
#include <chrono>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bounded_read.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/tcp/handshake.hpp"
#include "decentrain/transport/tcp/options.hpp"

namespace bench {

namespace tr = decentrain::transport;
namespace wire = decentrain::transport::wire;

// Rank `rank` of a group of `world` holding the run key `key`, with 10 s bounds on joining and
// receiving: the members and the attackers of bench/attacks and the hostile tests.
inline tr::tcp_options keyed_options(const std::string& key, int rank, int world) {
  tr::tcp_options o;
  o.rank = rank;
  o.world = world;
  o.key = key;
  o.join_timeout = std::chrono::seconds(10);
  o.recv_timeout = std::chrono::seconds(10);
  return o;
}

class hostile_peer {
 public:
  struct frame_in {
    wire::header head;
    tr::bytes body;
  };

  // Connects to `address` as `self` claims (its rank, world, settings, key) and runs the dialer's
  // handshake. The answer (welcome, directory or goodbye) is left for answer().
  hostile_peer(asio::io_context& io, const std::string& address, const tr::tcp_options& self, wire::hello_purpose purpose,
               bool late, std::chrono::milliseconds limit = std::chrono::milliseconds(2000))
      : socket_(io), limit_(limit) {
    const auto [host, port] = wire::split_address(address);
    socket_.connect({asio::ip::make_address(host), port});
    const timeval t{static_cast<time_t>(limit.count() / 1000), static_cast<suseconds_t>((limit.count() % 1000) * 1000)};
    ::setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
    ::setsockopt(socket_.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &t, sizeof t);
    socket_.set_option(asio::ip::tcp::no_delay(true));
    wire::hello h;
    h.rank = self.rank;
    h.world = self.world;
    h.purpose = purpose;
    h.late = late;
    h.settings = self.settings;
    h.address = self.advertise;
    // Its credentials as given, unchecked: a liar may claim a rank with another rank's identity.
    creds_.key = self.key;
    if (self.identity.enabled()) {
      creds_.self.emplace(tr::identity::key_pair::read(self.identity.identity));
      creds_.roster = tr::identity::roster::read(self.identity.roster);
    }
    write(wire::frame_type::hello, 0, machine_.start(h, creds_));
    if (creds_.keyed() || creds_.identities()) {
      auto c = read();
      if (!c || c->head.type != wire::frame_type::challenge) {
        refused_ = c && c->head.type == wire::frame_type::bye ? farewell_of(*c) : "no challenge";
        return;
      }
      bool unproven = false;
      auto got = machine_.on_challenge(creds_, c->body, address, unproven);
      write(wire::frame_type::proof, 0, got.proof);
      keys_.emplace(std::move(got.keys));
    }
  }

  // The answer to the handshake: a welcome or a directory; nothing when it was refused (the
  // reason in refusal()) or no answer came.
  std::optional<frame_in> answer() {
    if (!refused_.empty()) return std::nullopt;
    auto a = read();
    if (!a) refused_ = "no answer";
    else if (a->head.type == wire::frame_type::bye) refused_ = farewell_of(*a);
    if (!refused_.empty()) return std::nullopt;
    return a;
  }
  const std::string& refusal() const { return refused_; }

  // A frame, sealed with the connection's keys (when it has any).
  void write(wire::frame_type type, tr::tag_type tag, tr::bytes body) {
    auto head = wire::encode_header({type, tag, body.size(), {}});
    if (keys_) {
      const auto mac = keys_->send.seal(std::span<const std::byte>(head).first(wire::header_used_bytes), body);
      std::memcpy(head.data() + wire::tag_offset, mac.data(), mac.size());
    }
    const auto pad = wire::padding(body.size());
    std::array<asio::const_buffer, 3> parts{asio::buffer(head), asio::buffer(body.data(), body.size()),
                                            asio::buffer(pad.data(), pad.size())};
    asio::error_code ec;
    asio::write(socket_, parts, ec);
    if (ec) broken_ = true;
  }
  void send(tr::tag_type tag, std::span<const std::byte> data) { write(wire::frame_type::data, tag, tr::bytes(data.begin(), data.end())); }

  // The next frame (its tag checked when the connection has keys), or nothing (closed, or the
  // limit passed).
  std::optional<frame_in> read() {
    std::array<std::byte, wire::header_bytes> raw{};
    if (bench::read_within(socket_, asio::buffer(raw), limit_)) return std::nullopt;
    frame_in f;
    try {
      f.head = wire::decode_header(raw.data(), std::uint64_t{1} << 32);
    } catch (const std::exception&) {
      return std::nullopt;
    }
    f.body.resize(static_cast<std::size_t>(f.head.length + wire::padding(f.head.length).size()));
    if (bench::read_within(socket_, asio::buffer(f.body), limit_)) return std::nullopt;
    f.body.resize(static_cast<std::size_t>(f.head.length));
    if (keys_ && !keys_->receive.open_in_place(std::span<const std::byte>(raw).first(wire::header_used_bytes), f.body, f.head.mac))
      return std::nullopt;
    return f;
  }

  // True once the other end has closed the connection within `reads` times the limit
  // (everything it sends meanwhile is read).
  bool closed_by_peer(int reads = 1) { return bench::closed_within(socket_, reads * limit_); }
  bool broken() const { return broken_; }
  asio::ip::tcp::socket& socket() { return socket_; }

 private:
  static std::string farewell_of(const frame_in& f) {
    try {
      return wire::decode_body<wire::farewell>(f.body, "goodbye").reason;
    } catch (const std::exception& e) {
      return e.what();
    }
  }

  asio::ip::tcp::socket socket_;
  std::chrono::milliseconds limit_;  // each read waits at most this long
  tr::tcp_detail::credentials creds_;
  tr::tcp_detail::handshake machine_;
  std::optional<tr::auth::session> keys_;
  std::string refused_;
  bool broken_ = false;
};

}  // namespace bench
