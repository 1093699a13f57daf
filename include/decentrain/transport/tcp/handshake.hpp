// The handshake of a TCP connection, both sides as one state machine that only moves forward:
// frames in, frames out, and at the end a caller that proved who it is, or a refusal that says
// why. No sockets here (the I/O thread feeds the acceptor's side, tcp/rendezvous.hpp drives the
// dialer's), so every step can be tested and fuzzed alone.
//
//   dialer                                   acceptor
//   hello   --- hello (nonce with a key) -->  hello
//   challenge <-- challenge (with a key) ---  proof      (nonce, rank, proof of the key: auth.hpp)
//   answer  --- proof (with a key) -------->  open       (admitted: welcome, or a directory)
//   open    <-- welcome | directory | bye --  answered   (a directory request, or refused)
//
// With TLS (tls.hpp) its own handshake comes first and every frame here is encrypted.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/auth.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/tcp/options.hpp"

namespace decentrain::transport::tcp_detail {

class handshake {
 public:
  // What comes next on the connection; stages only move forward.
  enum class stage : std::uint8_t {
    hello,      // acceptor: the caller's hello; dialer: its own hello, to send
    challenge,  // dialer: the acceptor's challenge (with a run key)
    proof,      // acceptor: the caller's proof of the key (with a run key)
    answer,     // dialer: the welcome, the directory or a goodbye
    open,       // both: the connection carries data frames
    answered,   // acceptor: it answered a directory request or refused the caller; nothing may follow
  };

  stage next() const { return next_; }

  // ---- the acceptor's side ----

  // What the acceptor does with a handshake frame.
  struct verdict {
    enum class kind : std::uint8_t {
      reply,   // send `type`/`body` and wait for the next frame
      refuse,  // tell the caller `why` (a goodbye) and take nothing more from it
      reject,  // it failed authentication (`why`): close, counted
      proven,  // the caller is who `hello` says (and holds the key): admit it
    };
    kind what = kind::reply;
    wire::frame_type type = wire::frame_type::challenge;
    bytes body;
    std::string why;
    wire::hello hello;
    std::optional<auth::session> keys;  // proven with a run key (not TLS): the connection's frame keys
  };

  // An accepted connection: `certified_rank` is the rank its TLS certificate names (-1: none),
  // `tls_keys` whether TLS gave it frame keys already.
  void accepted(int certified_rank, bool tls_keys) {
    certified_rank_ = certified_rank;
    tls_keys_ = tls_keys;
  }

  // Throws unless a frame of this type and size may come next on an accepted connection: one that
  // has not shown who it is may send only its next handshake frame, and only a small one.
  void check_next(const wire::header& h) const {
    if (next_ == stage::open) {
      decentrain::detail::check(h.type == wire::frame_type::data || h.type == wire::frame_type::bye ||
                                    h.type == wire::frame_type::heartbeat,
                                h.type == wire::frame_type::hello ? "frame: a second hello on a connection"
                                                                  : "frame: unexpected frame type ",
                                h.type == wire::frame_type::hello ? "" : std::to_string(static_cast<int>(h.type)));
      return;
    }
    decentrain::detail::check(h.length <= wire::max_handshake_bytes, "frame: a frame of ", h.length,
                              " bytes from a connection that has not said who it is (the limit is ", wire::max_handshake_bytes, ")");
    decentrain::detail::check(next_ != stage::answered, "frame: more frames after a directory request");
    decentrain::detail::check(next_ != stage::hello || h.type == wire::frame_type::hello,
                              "frame: the first frame on a connection must be a hello");
    decentrain::detail::check(next_ != stage::proof || h.type == wire::frame_type::proof,
                              "frame: expected the run key's proof, got frame type ", static_cast<int>(h.type));
  }

  // The acceptor's step on a whole frame that passed check_next. Throws (a malformed frame)
  // when the body does not decode or names an impossible rank.
  verdict on_frame(const tcp_options& o, wire::frame_type type, const bytes& body) {
    if (type == wire::frame_type::hello) return on_hello(o, body);
    return on_proof(o, body);
  }

  // The acceptor answered (a directory, or a refusal); nothing may follow.
  void answered() { next_ = stage::answered; }
  // Admitted (either side): data frames from here on.
  void opened() { next_ = stage::open; }

  // ---- the dialer's side ----

  // The hello to send (with a fresh nonce when `keyed`); the transcript starts with it.
  bytes start(wire::hello h, bool keyed) {
    if (keyed) h.nonce = auth::random_nonce();
    auto b = wire::encode_body(h);
    transcript_ = b;
    next_ = keyed ? stage::challenge : stage::answer;
    return b;
  }

  // The acceptor's challenge: checks its proof of the key; returns the proof to send, the rank
  // the acceptor proved, and this connection's frame keys. Throws naming `address` otherwise
  // (`unproven` is set when the acceptor does not hold the key: the caller decides how often
  // that is believed).
  struct challenged {
    bytes proof;
    int rank = -1;
    auth::session keys;
  };
  challenged on_challenge(const std::string& key, const bytes& challenge, const std::string& address, bool& unproven) {
    decentrain::detail::check(next_ == stage::challenge, "tcp: a challenge out of turn from the peer at ", address);
    decentrain::detail::check(challenge.size() == wire::challenge_bytes, "tcp: the run key's challenge from the peer at ", address,
                              " has ", challenge.size(), " bytes, not ", wire::challenge_bytes);
    const std::size_t proof_at = wire::challenge_bytes - auth::proof_bytes;
    transcript_.insert(transcript_.end(), challenge.begin(), challenge.begin() + static_cast<std::ptrdiff_t>(proof_at));
    unproven = !auth::same(std::span(challenge).subspan(proof_at), auth::acceptor_proof(key, transcript_));
    decentrain::detail::check(!unproven, "tcp: the peer at ", address, " does not hold this run's key (its proof did not verify)");
    const auto proof = auth::dialer_proof(key, transcript_);
    next_ = stage::answer;
    return challenged{bytes(proof.begin(), proof.end()), wire::challenge_rank(challenge), auth::session(key, transcript_, true)};
  }

 private:
  verdict refuse(std::string why) {
    next_ = stage::answered;
    verdict v;
    v.what = verdict::kind::refuse;
    v.why = std::move(why);
    return v;
  }

  verdict on_hello(const tcp_options& o, const bytes& body) {
    auto hello = wire::decode_body<wire::hello>(body, "hello");
    decentrain::detail::check(hello.rank >= 0 && hello.rank < o.capacity() && hello.rank != o.rank, "frame: hello claims rank ",
                              hello.rank);
    if (hello.world != o.world)
      return refuse(decentrain::detail::concat("peer ", o.rank, " is in a world of ", o.world, ", the caller (rank ", hello.rank,
                                               ") in one of ", hello.world, "; start every peer with the same world size"));
    if (hello.settings != o.settings)
      return refuse(decentrain::detail::concat("peer ", o.rank, " and the caller (rank ", hello.rank,
                                               ") were started with different settings: ",
                                               settings_difference(o.settings, hello.settings)));
    decentrain::detail::check(hello.little_endian == (std::endian::native == std::endian::little), "frame: peer ", hello.rank,
                              " has a different byte order");
    if (tls_keys_ && (o.tls.bind_ranks || certified_rank_ >= 0) && certified_rank_ != hello.rank)
      return refuse(decentrain::detail::concat("the caller claims rank ", hello.rank, ", and its certificate ",
                                               certified_rank_ >= 0 ? "is for rank " + std::to_string(certified_rank_)
                                                                    : std::string("names no rank"),
                                               " (one peer cannot take another's rank)"));
    const bool keyed = !o.key.empty();
    if (keyed != !hello.nonce.empty())
      return refuse(keyed ? decentrain::detail::concat("peer ", o.rank, " admits only peers holding the run's key (",
                                                       "tcp_options::key; decentrain-gpt: --key-file or ", auth::key_file_variable,
                                                       "); the caller has none")
                          : decentrain::detail::concat("the caller holds a run key and peer ", o.rank,
                                                       " has none; give every peer the same key"));
    if (!keyed) {
      verdict v;
      v.what = verdict::kind::proven;
      v.hello = std::move(hello);
      return v;
    }
    decentrain::detail::check(hello.nonce.size() == auth::nonce_bytes, "frame: a hello nonce of ", hello.nonce.size(),
                              " bytes (it has ", auth::nonce_bytes, ")");
    const auto nonce = auth::random_nonce();
    const auto* n = reinterpret_cast<const std::byte*>(nonce.data());
    bytes challenge(n, n + nonce.size());  // nonce, rank, then the proof over the transcript
    wire::put_challenge_rank(challenge, o.rank);
    transcript_.assign(body.begin(), body.end());
    transcript_.insert(transcript_.end(), challenge.begin(), challenge.end());
    const auto proof = auth::acceptor_proof(o.key, transcript_);
    challenge.insert(challenge.end(), proof.begin(), proof.end());
    asked_ = std::move(hello);
    next_ = stage::proof;
    verdict v;
    v.what = verdict::kind::reply;
    v.type = wire::frame_type::challenge;
    v.body = std::move(challenge);
    return v;
  }

  verdict on_proof(const tcp_options& o, const bytes& body) {
    verdict v;
    if (!auth::same(body, auth::dialer_proof(o.key, transcript_))) {
      next_ = stage::answered;
      v.what = verdict::kind::reject;
      v.why = decentrain::detail::concat("the proof of the run key from the caller claiming rank ", asked_.rank,
                                         " did not verify (it does not hold this run's key)");
      return v;
    }
    if (!tls_keys_) v.keys.emplace(o.key, transcript_, false);  // (with TLS, its keys stay)
    transcript_ = {};
    v.what = verdict::kind::proven;
    v.hello = std::exchange(asked_, {});
    return v;
  }

  stage next_ = stage::hello;
  int certified_rank_ = -1;
  bool tls_keys_ = false;
  wire::hello asked_;  // the acceptor's: the hello awaiting its proof
  bytes transcript_;   // the handshake's bytes so far (with a run key)
};

}  // namespace decentrain::transport::tcp_detail
