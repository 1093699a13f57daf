// Per-peer identities: each peer holds an Ed25519 key pair of its own, and the run's roster
// lists the public key of every rank. A shared run key (auth.hpp) keeps strangers out but cannot
// tell members apart: anyone holding it can derive any rank's frame keys and claim any rank.
// With identities, a peer proves its rank by signing the handshake with its own private key, and
// each connection's frame keys come from a fresh X25519 exchange that only its two ends took
// part in, so no member, key holder or not, can make frames that another peer accepts as a third
// rank's (hivemind gives each peer an RSA key for the same reason).
//
// Files:
//   identity  a PEM private key (Ed25519), private to its owner (chmod 600), as
//             `openssl genpkey -algorithm ed25519 -out peer.key` or identity::generate writes;
//   roster    one line per rank: "rank N ed25519 <64 hex digits of the public key>", '#' starts a
//             comment; scripts/identities writes both for a run.
//
// OpenSSL 3 (Debian: libssl-dev) provides the primitives; without it, identities are an error.
#pragma once

#include <algorithm>
#include <array>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/auth.hpp"

#if DECENTRAIN_HAS_OPENSSL
#include <openssl/evp.h>
#include <openssl/pem.h>
#endif

namespace decentrain::transport::identity {

inline constexpr std::size_t public_key_bytes = 32;
inline constexpr std::size_t signature_bytes = 64;
inline constexpr std::size_t exchange_key_bytes = 32;  // an X25519 public key
inline constexpr int max_roster_ranks = 1 << 16;

using public_key = std::array<std::byte, public_key_bytes>;
using signature = std::array<std::byte, signature_bytes>;

inline std::string to_hex(std::span<const std::byte> b) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (const auto x : b) {
    out += digits[static_cast<unsigned>(x) >> 4];
    out += digits[static_cast<unsigned>(x) & 15];
  }
  return out;
}

// The roster: each rank's public key.
class roster {
 public:
  roster() = default;

  // Parses a roster's text; `origin` names it in errors (a file's path).
  static roster parse(std::string_view text, const std::string& origin) {
    roster r;
    std::istringstream in{std::string(text)};
    std::string line;
    int number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
      std::istringstream words(line);
      std::string what, kind, hex;
      long long rank = -1;
      if (!(words >> what)) continue;  // blank
      const auto where = decentrain::detail::concat("identity: roster ", origin, " line ", number);
      decentrain::detail::check(what == "rank" && (words >> rank) && (words >> kind) && (words >> hex), where,
                                " is not \"rank N ed25519 <public key in hex>\"");
      std::string extra;
      decentrain::detail::check(!(words >> extra), where, " has more than \"rank N ed25519 <public key>\" (\"", extra, "\")");
      decentrain::detail::check(rank >= 0 && rank < max_roster_ranks, where, ": rank ", rank, " is outside [0, ", max_roster_ranks, ")");
      decentrain::detail::check(kind == "ed25519", where, ": key type \"", kind, "\" (only ed25519 is known)");
      decentrain::detail::check(hex.size() == 2 * public_key_bytes, where, ": a public key of ", hex.size(), " hex digits (it has ",
                                2 * public_key_bytes, ")");
      public_key k{};
      for (std::size_t i = 0; i < public_key_bytes; ++i) {
        const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
        decentrain::detail::check(hi >= 0 && lo >= 0, where, ": \"", hex, "\" is not hexadecimal");
        k[i] = static_cast<std::byte>(hi * 16 + lo);
      }
      decentrain::detail::check(!r.keys_.count(static_cast<int>(rank)), where, ": rank ", rank, " is listed twice");
      for (const auto& [other, key] : r.keys_)
        decentrain::detail::check(key != k, where, ": rank ", rank, " has the same key as rank ", other,
                                  " (one identity cannot hold two ranks)");
      r.keys_.emplace(static_cast<int>(rank), k);
    }
    decentrain::detail::check(!r.keys_.empty(), "identity: roster ", origin, " lists no rank");
    return r;
  }

  static roster read(const std::string& path) {
    std::error_code ec;
    decentrain::detail::check(std::filesystem::is_regular_file(path, ec), "identity: roster '", path, "' is not a readable file");
    decentrain::detail::check(std::filesystem::file_size(path, ec) <= (std::uintmax_t{16} << 20), "identity: roster '", path,
                              "' is over 16 MiB");
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return parse(text.str(), "'" + path + "'");
  }

  bool empty() const { return keys_.empty(); }
  const public_key* find(int rank) const {
    const auto it = keys_.find(rank);
    return it == keys_.end() ? nullptr : &it->second;
  }
  const std::map<int, public_key>& keys() const { return keys_; }

  // The roster's text (parse reads it back).
  std::string text() const {
    std::string out = "# decentrain roster: rank, key type, public key\n";
    for (const auto& [r, k] : keys_) out += "rank " + std::to_string(r) + " ed25519 " + to_hex(k) + "\n";
    return out;
  }
  void add(int rank, const public_key& k) { keys_[rank] = k; }

 private:
  static int digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  std::map<int, public_key> keys_;
};

#if DECENTRAIN_HAS_OPENSSL

namespace detail {
struct free_pkey {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using pkey = std::unique_ptr<EVP_PKEY, free_pkey>;
struct free_md {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
struct free_pctx {
  void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
};

inline pkey generate(const char* type) {
  pkey k(EVP_PKEY_Q_keygen(nullptr, nullptr, type));
  decentrain::detail::check(k != nullptr, "identity: OpenSSL cannot make an ", type, " key");
  return k;
}

inline std::array<std::byte, 32> raw_public(EVP_PKEY* k) {
  std::array<std::byte, 32> out{};
  std::size_t n = out.size();
  decentrain::detail::check(EVP_PKEY_get_raw_public_key(k, reinterpret_cast<unsigned char*>(out.data()), &n) == 1 && n == out.size(),
                            "identity: OpenSSL cannot read a public key");
  return out;
}

// label || 0 || message: the zero byte ends the label, so no label's input is another's.
inline std::vector<unsigned char> labelled(std::string_view label, std::span<const std::byte> message) {
  std::vector<unsigned char> in(label.size() + 1 + message.size(), 0);
  std::memcpy(in.data(), label.data(), label.size());
  if (!message.empty()) std::memcpy(in.data() + label.size() + 1, message.data(), message.size());
  return in;
}
}  // namespace detail

// This peer's identity: its Ed25519 private key.
class key_pair {
 public:
  // A fresh identity.
  static key_pair generate() {
    key_pair k;
    k.key_ = detail::generate("ED25519");
    return k;
  }

  // Reads a PEM private key, refusing a file others can read (auth::check_private).
  static key_pair read(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto status = fs::status(path, ec);
    decentrain::detail::check(!ec && fs::is_regular_file(status), "identity: '", path, "' is not a readable file");
    auth::check_private(status, "identity: private key", path);
    std::unique_ptr<FILE, decltype(&std::fclose)> f(std::fopen(path.c_str(), "r"), &std::fclose);
    decentrain::detail::check(f != nullptr, "identity: cannot open '", path, "'");
    key_pair k;
    k.key_.reset(PEM_read_PrivateKey(f.get(), nullptr, nullptr, nullptr));
    decentrain::detail::check(k.key_ != nullptr, "identity: '", path, "' holds no PEM private key");
    decentrain::detail::check(EVP_PKEY_get_id(k.key_.get()) == EVP_PKEY_ED25519, "identity: '", path,
                              "' holds a private key that is not Ed25519");
    return k;
  }

  // Writes the private key (PEM, mode 600).
  void write(const std::string& path) const {
    namespace fs = std::filesystem;
    {
      std::ofstream touch(path, std::ios::trunc);
      decentrain::detail::check(touch.good(), "identity: cannot write '", path, "'");
    }
    fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
    std::unique_ptr<FILE, decltype(&std::fclose)> f(std::fopen(path.c_str(), "w"), &std::fclose);
    decentrain::detail::check(f && PEM_write_PrivateKey(f.get(), key_.get(), nullptr, nullptr, 0, nullptr, nullptr) == 1,
                              "identity: cannot write '", path, "'");
  }

  public_key public_part() const { return detail::raw_public(key_.get()); }

  // Ed25519 over label || 0 || message.
  signature sign(std::string_view label, std::span<const std::byte> message) const {
    const auto in = detail::labelled(label, message);
    std::unique_ptr<EVP_MD_CTX, detail::free_md> ctx(EVP_MD_CTX_new());
    signature out{};
    std::size_t n = out.size();
    decentrain::detail::check(ctx && EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key_.get()) == 1 &&
                                  EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &n, in.data(), in.size()) == 1 &&
                                  n == out.size(),
                              "identity: OpenSSL cannot sign");
    return out;
  }

 private:
  detail::pkey key_;
};

// Whether `s` is `key`'s signature of label || 0 || message.
inline bool verify(const public_key& key, std::string_view label, std::span<const std::byte> message, std::span<const std::byte> s) {
  if (s.size() != signature_bytes) return false;
  detail::pkey k(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(key.data()), key.size()));
  if (!k) return false;
  const auto in = detail::labelled(label, message);
  std::unique_ptr<EVP_MD_CTX, detail::free_md> ctx(EVP_MD_CTX_new());
  return ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, k.get()) == 1 &&
         EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(s.data()), s.size(), in.data(), in.size()) == 1;
}

// One side of a connection's X25519 exchange: a fresh key pair whose public half goes in the
// handshake; with the other side's public half, the secret only the two ends know.
class exchange {
 public:
  exchange() : key_(detail::generate("X25519")) {}
  std::array<std::byte, exchange_key_bytes> public_part() const { return detail::raw_public(key_.get()); }
  // The shared secret with the holder of `theirs`; throws on a public key that is not one (or
  // one of the small-order points, which OpenSSL refuses).
  auth::digest secret(std::span<const std::byte> theirs) const {
    decentrain::detail::check(theirs.size() == exchange_key_bytes, "identity: an exchange key of ", theirs.size(), " bytes (it has ",
                              exchange_key_bytes, ")");
    detail::pkey peer(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, reinterpret_cast<const unsigned char*>(theirs.data()),
                                                  theirs.size()));
    std::unique_ptr<EVP_PKEY_CTX, detail::free_pctx> ctx(EVP_PKEY_CTX_new(key_.get(), nullptr));
    auth::digest out{};
    std::size_t n = out.size();
    const bool ok = peer && ctx && EVP_PKEY_derive_init(ctx.get()) == 1 && EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) == 1 &&
                    EVP_PKEY_derive(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &n) == 1 && n == out.size();
    decentrain::detail::check(ok, "identity: the other side's exchange key is not a usable X25519 key");
    return out;
  }

 private:
  detail::pkey key_;
};

#else  // no OpenSSL

class key_pair {
 public:
  static key_pair generate() { decentrain::detail::fail("identity: per-peer identities need OpenSSL, which this build lacks"); }
  static key_pair read(const std::string&) {
    decentrain::detail::fail("identity: per-peer identities need OpenSSL, which this build lacks (Debian: libssl-dev)");
  }
  void write(const std::string&) const {}
  public_key public_part() const { return {}; }
  signature sign(std::string_view, std::span<const std::byte>) const { return {}; }
};
inline bool verify(const public_key&, std::string_view, std::span<const std::byte>, std::span<const std::byte>) { return false; }
class exchange {
 public:
  exchange() { decentrain::detail::fail("identity: per-peer identities need OpenSSL, which this build lacks"); }
  std::array<std::byte, exchange_key_bytes> public_part() const { return {}; }
  auth::digest secret(std::span<const std::byte>) const { return {}; }
};

#endif

// What a peer runs with: its own key pair and the roster; both or neither.
struct options {
  std::string identity;  // this peer's private key file
  std::string roster;    // the run's roster file
  bool enabled() const { return !identity.empty() || !roster.empty(); }
  void validate() const {
    if (!enabled()) return;
    decentrain::detail::check(!identity.empty() && !roster.empty(), "identity: needs both this peer's private key (identity::options::identity) ",
                              "and the run's roster (identity::options::roster); missing: ", identity.empty() ? "the private key" : "the roster");
    decentrain::detail::check(auth::available, "identity: per-peer identities need OpenSSL, which this build lacks (Debian: libssl-dev)");
  }
};

}  // namespace decentrain::transport::identity
