// The handshake of a TCP connection, both sides as one state machine that only moves forward:
// frames in, frames out, and at the end a caller that proved who it is, or a refusal that says
// why. No sockets here (the I/O thread feeds the acceptor's side, tcp/rendezvous.hpp drives the
// dialer's), so every step can be tested and fuzzed alone.
//
//   dialer                                    acceptor
//   hello     --- hello -------------------->  hello
//   challenge <-- challenge (with credentials)  proof
//   answer    --- proof (with credentials) -->  open       (admitted: welcome, or a directory)
//   open      <-- welcome | directory | bye --  answered   (a directory request, or refused)
//
// Credentials (any of, or none: an open group):
// - a run key (auth.hpp): each side proves it holds it, HMAC over the transcript;
// - per-peer identities (identity.hpp): each side signs the transcript with its own key, which
//   the run's roster lists for the rank it claims, and the frame keys come from an X25519
//   exchange of fresh keys in the hello and the challenge;
// - TLS (tls.hpp): its own handshake comes first, and every frame here is encrypted.
// The transcript T is the hello's bytes, then the acceptor's nonce, rank and exchange key. The
// challenge carries the acceptor's proofs of T, the proof frame the dialer's.
//
// What a caller is told before it proved its credentials: only which credentials this peer
// needs. Its world size and settings are compared, and a difference named, after the proof:
// a stranger learns nothing of the run.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/auth.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/identity.hpp"
#include "decentrain/transport/tcp/options.hpp"

namespace decentrain::transport::tcp_detail {

// What this peer proves itself with, loaded once from tcp_options.
struct credentials {
  std::string key;                              // the run key (empty: none)
  std::optional<identity::key_pair> self;       // this peer's identity (none: no identities)
  identity::roster roster;                      // every rank's public key (with identities)

  explicit credentials(const tcp_options& o) : key(o.key) {
    if (!o.identity.enabled()) return;
    self.emplace(identity::key_pair::read(o.identity.identity));
    roster = identity::roster::read(o.identity.roster);
    const auto* mine = roster.find(o.rank);
    decentrain::detail::check(mine != nullptr, "identity: rank ", o.rank, " is not in the roster ", o.identity.roster);
    decentrain::detail::check(*mine == self->public_part(), "identity: the roster ", o.identity.roster, " lists another key for rank ",
                              o.rank, " than ", o.identity.identity, "'s (", identity::to_hex(self->public_part()), ")");
  }
  credentials() = default;

  bool keyed() const { return !key.empty(); }
  bool identities() const { return self.has_value(); }
  std::uint8_t flags() const { return static_cast<std::uint8_t>((keyed() ? 1 : 0) | (identities() ? 2 : 0)); }
};

namespace handshake_labels {
inline constexpr const char* accept = "decentrain/8 accept";
inline constexpr const char* dial = "decentrain/8 dial";
}  // namespace handshake_labels

class handshake {
 public:
  // What comes next on the connection; stages only move forward.
  enum class stage : std::uint8_t {
    hello,      // acceptor: the caller's hello; dialer: its own hello, to send
    challenge,  // dialer: the acceptor's challenge (with credentials)
    proof,      // acceptor: the caller's proof (with credentials)
    answer,     // dialer: the welcome, the directory or a goodbye
    open,       // both: the connection carries data frames
    answered,   // acceptor: it answered a directory request or refused the caller; nothing may follow
  };

  stage next() const { return next_; }

  // The bytes of a challenge and of a proof, for these credentials.
  static std::size_t challenge_bytes(const credentials& c) {
    return auth::nonce_bytes + 4 + (c.identities() ? identity::exchange_key_bytes + identity::signature_bytes : 0) +
           (c.keyed() ? auth::proof_bytes : 0);
  }
  static std::size_t proof_bytes(const credentials& c) {
    return (c.identities() ? identity::signature_bytes : 0) + (c.keyed() ? auth::proof_bytes : 0);
  }

  // ---- the acceptor's side ----

  // What the acceptor does with a handshake frame.
  struct verdict {
    enum class kind : std::uint8_t {
      reply,   // send `type`/`body` and wait for the next frame
      refuse,  // tell the caller `why` (a goodbye) and take nothing more from it
      reject,  // it failed authentication (`why`): close, counted
      proven,  // the caller is who `hello` says (and holds the credentials): admit it
    };
    kind what = kind::reply;
    wire::frame_type type = wire::frame_type::challenge;
    bytes body;
    std::string why;
    wire::hello hello;
    // The connection's frame keys, when this step made them (before a refusal after the proof
    // too: the refusal then goes out sealed, and the caller can believe it).
    std::optional<auth::session> keys;
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
                                    h.type == wire::frame_type::heartbeat || h.type == wire::frame_type::relay ||
                                    h.type == wire::frame_type::stripe || h.type == wire::frame_type::piece ||
                                    h.type == wire::frame_type::landed || h.type == wire::frame_type::streams,
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
                              "frame: expected the proof of the caller's credentials, got frame type ", static_cast<int>(h.type));
  }

  // The acceptor's step on a whole frame that passed check_next. Throws (a malformed frame)
  // when the body does not decode or names an impossible rank.
  verdict on_frame(const tcp_options& o, const credentials& c, wire::frame_type type, const bytes& body) {
    if (type == wire::frame_type::hello) return on_hello(o, c, body);
    return on_proof(o, c, body);
  }

  // The acceptor answered (a directory, or a refusal); nothing may follow.
  void answered() { next_ = stage::answered; }
  // Admitted (either side): data frames from here on.
  void opened() { next_ = stage::open; }

  // ---- the dialer's side ----

  // The hello to send; the transcript starts with it.
  bytes start(wire::hello h, const credentials& c) {
    h.credentials = c.flags();
    if (c.keyed() || c.identities()) h.nonce = auth::random_nonce();
    if (c.identities()) {
      exchange_.emplace();
      const auto e = exchange_->public_part();
      h.exchange.assign(reinterpret_cast<const char*>(e.data()), e.size());
    }
    auto b = wire::encode_body(h);
    transcript_ = b;
    next_ = c.keyed() || c.identities() ? stage::challenge : stage::answer;
    return b;
  }

  // The acceptor's challenge: checks its proofs; returns the proof to send, the rank the acceptor
  // proved, and this connection's frame keys. Throws naming `address` otherwise; `unproven` is
  // set when the acceptor's proofs did not verify (the caller decides how often that is believed).
  struct challenged {
    bytes proof;
    int rank = -1;
    auth::session keys;
  };
  challenged on_challenge(const credentials& c, const bytes& challenge, const std::string& address, bool& unproven) {
    decentrain::detail::check(next_ == stage::challenge, "tcp: a challenge out of turn from the peer at ", address);
    decentrain::detail::check(challenge.size() == challenge_bytes(c), "tcp: the challenge from the peer at ", address, " has ",
                              challenge.size(), " bytes, not ", challenge_bytes(c), " (does it run with other credentials?)");
    std::size_t at = auth::nonce_bytes + 4;
    const int rank = wire::challenge_rank(challenge);
    std::span<const std::byte> exchange_key;
    if (c.identities()) exchange_key = std::span(challenge).subspan(at, identity::exchange_key_bytes), at += exchange_key.size();
    transcript_.insert(transcript_.end(), challenge.begin(), challenge.begin() + static_cast<std::ptrdiff_t>(at));
    unproven = true;
    if (c.identities()) {
      const auto* theirs = c.roster.find(rank);
      decentrain::detail::check(theirs != nullptr, "tcp: the peer at ", address, " claims rank ", rank,
                                ", which the roster does not list");
      decentrain::detail::check(identity::verify(*theirs, handshake_labels::accept, transcript_,
                                                 std::span(challenge).subspan(at, identity::signature_bytes)),
                                "tcp: the peer at ", address, " is not rank ", rank, " of the roster (its signature did not verify)");
      at += identity::signature_bytes;
    }
    if (c.keyed())
      decentrain::detail::check(auth::same(std::span(challenge).subspan(at, auth::proof_bytes), auth::acceptor_proof(c.key, transcript_)),
                                "tcp: the peer at ", address, " does not hold this run's key (its proof did not verify)");
    unproven = false;
    bytes proof;
    if (c.identities()) {
      const auto s = c.self->sign(handshake_labels::dial, transcript_);
      proof.insert(proof.end(), s.begin(), s.end());
    }
    if (c.keyed()) {
      const auto p = auth::dialer_proof(c.key, transcript_);
      proof.insert(proof.end(), p.begin(), p.end());
    }
    next_ = stage::answer;
    return challenged{std::move(proof), rank, session(c, exchange_key, true)};
  }

 private:
  // The frame keys: from the run key alone, or from the X25519 secret (and the run key with it).
  auth::session session(const credentials& c, std::span<const std::byte> their_exchange, bool dialer) const {
    if (!c.identities()) return auth::session(c.key, transcript_, dialer);
    const auto secret = exchange_->secret(their_exchange);
    std::string material(reinterpret_cast<const char*>(secret.data()), secret.size());
    material += c.key;
    return auth::session(material, transcript_, dialer);
  }

  verdict refuse(std::string why) {
    next_ = stage::answered;
    verdict v;
    v.what = verdict::kind::refuse;
    v.why = std::move(why);
    return v;
  }

  // World size, settings and byte order: compared once the caller proved its credentials.
  std::optional<std::string> differs(const tcp_options& o, const wire::hello& hello) const {
    if (hello.world != o.world)
      return decentrain::detail::concat("peer ", o.rank, " is in a world of ", o.world, ", the caller (rank ", hello.rank,
                                        ") in one of ", hello.world, "; start every peer with the same world size");
    if (hello.settings != o.settings)
      return decentrain::detail::concat("peer ", o.rank, " and the caller (rank ", hello.rank, ") were started with different settings: ",
                                        settings_difference(o.settings, hello.settings));
    if (hello.little_endian != (std::endian::native == std::endian::little))
      return decentrain::detail::concat("peer ", hello.rank, " has a different byte order");
    return std::nullopt;
  }

  verdict proven(const tcp_options& o, wire::hello hello, std::optional<auth::session> keys) {
    auto why = differs(o, hello);
    verdict v = why ? refuse(std::move(*why)) : verdict{};
    if (!why) {
      v.what = verdict::kind::proven;
      v.hello = std::move(hello);
    }
    v.keys = std::move(keys);
    return v;
  }

  // Why a caller with other credentials is refused: the first that differs, named.
  static std::string needs(const credentials& c, std::uint8_t theirs, int self) {
    if (c.keyed() != ((theirs & 1) != 0))
      return c.keyed() ? decentrain::detail::concat("peer ", self, " admits only peers holding the run's key (tcp_options::key); ",
                                                    "the caller has none")
                       : decentrain::detail::concat("the caller holds a run key and peer ", self,
                                                    " has none; give every peer the same key");
    return c.identities() ? decentrain::detail::concat("peer ", self, " admits only peers with an identity of the run's roster ",
                                                       "(tcp_options::identity); the caller has none")
                          : decentrain::detail::concat("the caller proves its rank with an identity and peer ", self,
                                                       " runs without identities; give every peer the same credentials");
  }

  verdict on_hello(const tcp_options& o, const credentials& c, const bytes& body) {
    auto hello = wire::decode_body<wire::hello>(body, "hello");
    decentrain::detail::check(hello.rank >= 0 && hello.rank < o.capacity() && hello.rank != o.rank, "frame: hello claims rank ",
                              hello.rank);
    if (tls_keys_ && (o.tls.bind_ranks || certified_rank_ >= 0) && certified_rank_ != hello.rank)
      return refuse(decentrain::detail::concat("the caller claims rank ", hello.rank, ", and its certificate ",
                                               certified_rank_ >= 0 ? "is for rank " + std::to_string(certified_rank_)
                                                                    : std::string("names no rank"),
                                               " (one peer cannot take another's rank)"));
    if (hello.credentials != c.flags()) return refuse(needs(c, hello.credentials, o.rank));
    if (!c.keyed() && !c.identities()) return proven(o, std::move(hello), std::nullopt);
    decentrain::detail::check(hello.nonce.size() == auth::nonce_bytes, "frame: a hello nonce of ", hello.nonce.size(),
                              " bytes (it has ", auth::nonce_bytes, ")");
    const auto nonce = auth::random_nonce();
    const auto* n = reinterpret_cast<const std::byte*>(nonce.data());
    bytes challenge(n, n + nonce.size());  // nonce, rank, exchange key, then the proofs of the transcript
    wire::put_challenge_rank(challenge, o.rank);
    if (c.identities()) {
      decentrain::detail::check(hello.exchange.size() == identity::exchange_key_bytes, "frame: a hello exchange key of ",
                                hello.exchange.size(), " bytes (it has ", identity::exchange_key_bytes, ")");
      if (c.roster.find(hello.rank) == nullptr)
        return refuse(decentrain::detail::concat("rank ", hello.rank, " is not in the run's roster"));
      exchange_.emplace();
      const auto e = exchange_->public_part();
      challenge.insert(challenge.end(), e.begin(), e.end());
    }
    transcript_.assign(body.begin(), body.end());
    transcript_.insert(transcript_.end(), challenge.begin(), challenge.end());
    if (c.identities()) {
      const auto s = c.self->sign(handshake_labels::accept, transcript_);
      challenge.insert(challenge.end(), s.begin(), s.end());
    }
    if (c.keyed()) {
      const auto proof = auth::acceptor_proof(c.key, transcript_);
      challenge.insert(challenge.end(), proof.begin(), proof.end());
    }
    asked_ = std::move(hello);
    next_ = stage::proof;
    verdict v;
    v.what = verdict::kind::reply;
    v.type = wire::frame_type::challenge;
    v.body = std::move(challenge);
    return v;
  }

  verdict on_proof(const tcp_options& o, const credentials& c, const bytes& body) {
    auto reject = [&](std::string why) {
      next_ = stage::answered;
      verdict v;
      v.what = verdict::kind::reject;
      v.why = std::move(why);
      return v;
    };
    if (body.size() != proof_bytes(c))
      return reject(decentrain::detail::concat("the proof from the caller claiming rank ", asked_.rank, " has ", body.size(),
                                               " bytes, not ", proof_bytes(c)));
    std::size_t at = 0;
    if (c.identities()) {
      if (!identity::verify(*c.roster.find(asked_.rank), handshake_labels::dial, transcript_,
                            std::span(body).first(identity::signature_bytes)))
        return reject(decentrain::detail::concat("the caller claiming rank ", asked_.rank,
                                                 " is not that rank of the roster (its signature did not verify)"));
      at += identity::signature_bytes;
    }
    if (c.keyed() && !auth::same(std::span(body).subspan(at, auth::proof_bytes), auth::dialer_proof(c.key, transcript_)))
      return reject(decentrain::detail::concat("the proof of the run key from the caller claiming rank ", asked_.rank,
                                               " did not verify (it does not hold this run's key)"));
    std::optional<auth::session> keys;
    if (!tls_keys_) {  // (with TLS, its keys stay)
      std::span<const std::byte> theirs;
      if (c.identities()) theirs = std::as_bytes(std::span(asked_.exchange));
      keys.emplace(session(c, theirs, false));
    }
    transcript_ = {};
    return proven(o, std::exchange(asked_, {}), std::move(keys));
  }

  stage next_ = stage::hello;
  int certified_rank_ = -1;
  bool tls_keys_ = false;
  wire::hello asked_;  // the acceptor's: the hello awaiting its proof
  bytes transcript_;   // the handshake's bytes so far (with credentials)
  std::optional<identity::exchange> exchange_;  // this side's X25519 key (with identities)
};

}  // namespace decentrain::transport::tcp_detail
