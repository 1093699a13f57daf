// The run key: what lets a TCP peer prove it belongs to a training run, and every frame prove it
// came, unmodified and in order, from the peer its connection was opened with.
//
// Handshake (the dialer D calls the acceptor A; K is the run key, T the transcript: the bytes of
// D's hello, which carry a fresh nonce of D's, then A's fresh nonce and A's rank):
//   D -> A  hello (nonce_d)              A -> D  challenge: nonce_a, rank_a, HMAC(K, "accept" T)
//   D checks A's proof and rank          D -> A  proof: HMAC(K, "dial" T)
// Each side proves it holds K over nonces the other just chose, so neither a recorded handshake
// nor a peer used as an oracle (the labels differ, and each ends in a zero byte, so none is a
// prefix of another) gets a stranger in; A's rank is in T, so a connection relayed to another
// peer than the one D dialed is found out. Each direction then
// has its own key, HMAC(K, "dialer to acceptor" T) and HMAC(K, "acceptor to dialer" T), and
// every frame carries a tag over its header and body: ChaCha20-Poly1305 (RFC 8439) with the
// frame as associated data and the frame's sequence number on the connection as the nonce. A
// modified frame fails its tag; a replayed, dropped or reordered one fails its sequence number;
// a frame copied from another connection fails its key. Frames are authenticated, not encrypted
// (with TLS, transport/tls.hpp, they are encrypted too, under keys the TLS handshake exported).
// Why Poly1305 rather than HMAC-SHA256 per frame: it is several times faster per byte
// (bench/RESULTS.md, "bench/allreduce with a run key").
//
// OpenSSL (Debian: libssl-dev) provides the primitives; without it, a run key is an error.
#pragma once

#ifndef DECENTRAIN_HAS_OPENSSL
#if __has_include(<openssl/evp.h>)
#define DECENTRAIN_HAS_OPENSSL 1
#else
#define DECENTRAIN_HAS_OPENSSL 0
#endif
#endif

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "decentrain/detail/error.hpp"

#if DECENTRAIN_HAS_OPENSSL
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#endif

namespace decentrain::transport::auth {

inline constexpr std::size_t min_key_bytes = 16;
inline constexpr std::size_t max_key_bytes = 4096;
inline constexpr std::size_t nonce_bytes = 32;
inline constexpr std::size_t proof_bytes = 32;
inline constexpr std::size_t tag_bytes = 16;
inline constexpr const char* key_file_variable = "DECENTRAIN_KEY_FILE";

using tag = std::array<std::byte, tag_bytes>;
using digest = std::array<std::byte, proof_bytes>;

inline constexpr bool available = DECENTRAIN_HAS_OPENSSL != 0;

// Throws unless `key` can serve as a run key (and this build can use one).
inline void check_key(std::string_view key, std::string_view origin) {
  decentrain::detail::check(available, "tcp: a run key (", origin,
                            ") needs OpenSSL, which this build lacks (Debian: libssl-dev)");
  decentrain::detail::check(key.size() >= min_key_bytes && key.size() <= max_key_bytes, "tcp: the run key (", origin,
                            ") has ", key.size(), " bytes; it needs ", min_key_bytes, " to ", max_key_bytes,
                            " (for example: head -c 32 /dev/urandom > run.key)");
}

// A secret's file (a run key, a TLS private key) that other users can read or write is refused:
// anyone who reads it can join the run, anyone who writes it can choose the key.
inline void check_private(const std::filesystem::file_status& status, std::string_view what, const std::string& path) {
  namespace fs = std::filesystem;
  const auto others = fs::perms::group_read | fs::perms::group_write | fs::perms::others_read | fs::perms::others_write;
  decentrain::detail::check((status.permissions() & others) == fs::perms::none, what, " '", path,
                            "' can be read or written by other users; make it private (chmod 600 ", path, ")");
}

// The key in a file, without a final newline (so `echo secret > f` and `head -c 32 /dev/urandom > f`
// both work). A key file others can read is refused (check_private).
inline std::string read_key_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  decentrain::detail::check(!ec && fs::is_regular_file(status), "tcp: key file '", path, "' is not a readable file",
                            ec ? " (" + ec.message() + ")" : std::string());
  check_private(status, "tcp: key file", path);
  const auto size = fs::file_size(path, ec);
  decentrain::detail::check(!ec, "tcp: cannot read the size of key file '", path, "': ", ec.message());
  decentrain::detail::check(size <= max_key_bytes + 2, "tcp: key file '", path, "' is over ", max_key_bytes, " bytes");
  std::ifstream in(path, std::ios::binary);
  std::string key((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  decentrain::detail::check(!in.bad(), "tcp: cannot read key file '", path, "'");
  // A text key loses its line end; random bytes are kept as they are, even a final 0x0a.
  const bool text = std::all_of(key.begin(), key.end(), [](char ch) {
    const auto u = static_cast<unsigned char>(ch);
    return (u >= 0x20 && u < 0x7f) || ch == '\n' || ch == '\r' || ch == '\t';
  });
  if (text && key.ends_with("\r\n")) key.resize(key.size() - 2);
  else if (text && key.ends_with('\n')) key.pop_back();
  check_key(key, "from " + path);
  return key;
}

// The key in the file DECENTRAIN_KEY_FILE names; empty when the variable is unset or empty.
inline std::string key_from_environment() {
  const char* path = std::getenv(key_file_variable);
  return path && *path ? read_key_file(path) : std::string();
}

// What a connection's frames get from their key: a tag over header and body (authenticate), or
// the body encrypted as well (encrypt and decrypt, the two ends of a TLS connection's frames,
// transport/tls.hpp). Either way the tag is ChaCha20-Poly1305's over the header as associated
// data and the body (plaintext, or ciphertext when encrypted).
enum class protection : std::uint8_t { authenticate, encrypt, decrypt };

#if DECENTRAIN_HAS_OPENSSL

inline std::string random_nonce() {
  std::string n(nonce_bytes, '\0');
  decentrain::detail::check(RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) == 1,
                            "tcp: OpenSSL could not produce a random nonce");
  return n;
}

// HMAC-SHA256(key, label || 0 || transcript): the zero byte ends the label, so no label's input
// is another's with some transcript.
inline digest keyed_digest(std::string_view key, std::string_view label, std::span<const std::byte> transcript) {
  std::vector<unsigned char> input(label.size() + 1 + transcript.size(), 0);
  std::memcpy(input.data(), label.data(), label.size());
  if (!transcript.empty()) std::memcpy(input.data() + label.size() + 1, transcript.data(), transcript.size());
  digest out{};
  unsigned int n = 0;
  const auto* ok = HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), input.data(), input.size(),
                        reinterpret_cast<unsigned char*>(out.data()), &n);
  decentrain::detail::check(ok != nullptr && n == out.size(), "tcp: OpenSSL HMAC failed");
  return out;
}

// Constant time: how long a comparison takes says nothing of where a forged proof went wrong.
inline bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// One direction of a connection: seals frames in order (the sender) or opens them in order (the
// receiver). The n-th frame uses nonce n, so each key seals each nonce once.
class frame_mac {
 public:
  explicit frame_mac(const digest& key, protection mode = protection::authenticate) : ctx_(EVP_CIPHER_CTX_new()), mode_(mode) {
    const auto* k = reinterpret_cast<const unsigned char*>(key.data());
    const bool ok = ctx_ && (mode == protection::decrypt ? EVP_DecryptInit_ex(ctx_.get(), EVP_chacha20_poly1305(), nullptr, k, nullptr)
                                                        : EVP_EncryptInit_ex(ctx_.get(), EVP_chacha20_poly1305(), nullptr, k, nullptr)) == 1;
    decentrain::detail::check(ok, "tcp: OpenSSL cannot set up ChaCha20-Poly1305");
  }

  // Whether frames are encrypted: seal then needs `ciphertext`, and only open_in_place opens.
  bool encrypts() const { return mode_ != protection::authenticate; }

  // The tag of the next frame (header's first bytes, then body); advances the sequence number.
  // Encrypting, the body's ciphertext goes to `ciphertext` (body.size() bytes; it may be `body`).
  tag seal(std::span<const std::byte> head, std::span<const std::byte> body, std::span<std::byte> ciphertext = {}) {
    decentrain::detail::check(mode_ != protection::decrypt && (mode_ == protection::authenticate || ciphertext.size() == body.size()),
                              "tcp: frame_mac::seal on a receiving key, or without room for the ciphertext");
    return compute(head, body, ciphertext);
  }
  // Whether `t` is the next frame's tag; advances the sequence number either way (a connection
  // whose frame failed is closed). Authenticated frames only.
  bool open(std::span<const std::byte> head, std::span<const std::byte> body, const tag& t) {
    decentrain::detail::check(mode_ == protection::authenticate, "tcp: frame_mac::open on an encrypted connection");
    const auto expected = compute(head, body, {});
    return same(expected, t);
  }
  // The same for a body that may be encrypted: decrypted in place when it is (a body that fails
  // its tag is left as garbage: the caller drops it).
  bool open_in_place(std::span<const std::byte> head, std::span<std::byte> body, const tag& t) {
    if (mode_ == protection::authenticate) return open(head, body, t);
    decentrain::detail::check(mode_ == protection::decrypt, "tcp: frame_mac::open_in_place on a sending key");
    auto* c = ctx_.get();
    const auto iv = next_iv();
    int n = 0;
    bool ok = EVP_DecryptInit_ex(c, nullptr, nullptr, nullptr, iv.data()) == 1 && update(head, {}) && update(body, body) &&
              EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, static_cast<int>(tag_bytes), const_cast<std::byte*>(t.data())) == 1;
    return ok && EVP_DecryptFinal_ex(c, nullptr, &n) == 1;
  }
  // Takes back the last seal, for a frame of which nothing was written.
  void unseal() { --sequence_; }

 private:
  std::array<unsigned char, 12> next_iv() {
    std::array<unsigned char, 12> iv{};
    for (int i = 0; i < 8; ++i) iv[4 + static_cast<std::size_t>(i)] = static_cast<unsigned char>((sequence_ >> (8 * i)) & 0xff);
    ++sequence_;
    return iv;
  }
  // Feeds `in` as associated data (out empty) or as text whose other form goes to `out`. EVP
  // lengths are int: large bodies go in pieces.
  bool update(std::span<const std::byte> in, std::span<std::byte> out) {
    int n = 0;
    const bool text = !out.empty();
    const bool decrypting = mode_ == protection::decrypt;
    for (std::size_t at = 0; at < in.size(); at += chunk) {
      const auto len = static_cast<int>(std::min(chunk, in.size() - at));
      auto* to = text ? reinterpret_cast<unsigned char*>(out.data() + at) : nullptr;
      const auto* from = reinterpret_cast<const unsigned char*>(in.data() + at);
      if ((decrypting ? EVP_DecryptUpdate(ctx_.get(), to, &n, from, len) : EVP_EncryptUpdate(ctx_.get(), to, &n, from, len)) != 1)
        return false;
    }
    return true;
  }
  tag compute(std::span<const std::byte> head, std::span<const std::byte> body, std::span<std::byte> ciphertext) {
    const auto iv = next_iv();
    int n = 0;
    tag out{};
    auto* c = ctx_.get();
    const bool ok = EVP_EncryptInit_ex(c, nullptr, nullptr, nullptr, iv.data()) == 1 && update(head, {}) &&
                    update(body, mode_ == protection::encrypt ? ciphertext : std::span<std::byte>{}) &&
                    EVP_EncryptFinal_ex(c, nullptr, &n) == 1 &&
                    EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, static_cast<int>(tag_bytes), out.data()) == 1;
    decentrain::detail::check(ok, "tcp: OpenSSL ChaCha20-Poly1305 failed");
    return out;
  }
  static constexpr std::size_t chunk = std::size_t{1} << 30;
  struct free_ctx {
    void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
  };
  std::unique_ptr<EVP_CIPHER_CTX, free_ctx> ctx_;
  protection mode_;
  std::uint64_t sequence_ = 0;
};

// What the handshake computes from the key and its transcript.
inline digest acceptor_proof(std::string_view key, std::span<const std::byte> t) { return keyed_digest(key, "decentrain/5 accept", t); }
inline digest dialer_proof(std::string_view key, std::span<const std::byte> t) { return keyed_digest(key, "decentrain/5 dial", t); }

// Both directions' frame keys of one connection, as seen from one end.
struct session {
  frame_mac send, receive;
  // From the run key and the handshake's transcript: frames authenticated.
  session(std::string_view key, std::span<const std::byte> transcript, bool dialer)
      : send(keyed_digest(key, dialer ? "decentrain/5 dialer to acceptor" : "decentrain/5 acceptor to dialer", transcript)),
        receive(keyed_digest(key, dialer ? "decentrain/5 acceptor to dialer" : "decentrain/5 dialer to acceptor", transcript)) {}
  // From keys a TLS handshake exported (the dialer's direction first, then the acceptor's):
  // frames encrypted.
  session(const digest& dialer_to_acceptor, const digest& acceptor_to_dialer, bool dialer)
      : send(dialer ? dialer_to_acceptor : acceptor_to_dialer, protection::encrypt),
        receive(dialer ? acceptor_to_dialer : dialer_to_acceptor, protection::decrypt) {}
};

#else  // no OpenSSL: check_key refuses every key before any of this is needed

inline std::string random_nonce() { decentrain::detail::fail("tcp: no OpenSSL in this build"); }
inline bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}
struct frame_mac {
  frame_mac() = default;
  explicit frame_mac(const digest&, protection = protection::authenticate) {}
  bool encrypts() const { return false; }
  tag seal(std::span<const std::byte>, std::span<const std::byte>, std::span<std::byte> = {}) { return {}; }
  bool open(std::span<const std::byte>, std::span<const std::byte>, const tag&) { return false; }
  bool open_in_place(std::span<const std::byte>, std::span<std::byte>, const tag&) { return false; }
  void unseal() {}
};
inline digest acceptor_proof(std::string_view, std::span<const std::byte>) { decentrain::detail::fail("tcp: no OpenSSL in this build"); }
inline digest dialer_proof(std::string_view, std::span<const std::byte>) { decentrain::detail::fail("tcp: no OpenSSL in this build"); }
struct session {
  frame_mac send, receive;
  session(std::string_view, std::span<const std::byte>, bool) { decentrain::detail::fail("tcp: no OpenSSL in this build"); }
  session(const digest&, const digest&, bool) { decentrain::detail::fail("tcp: no OpenSSL in this build"); }
};

#endif

}  // namespace decentrain::transport::auth
