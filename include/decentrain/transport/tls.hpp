// TLS for the TCP transport: who may join is decided by certificates signed by the run's CA, and
// every frame is encrypted, not only authenticated.
//
// How TLS is used: the shape QUIC gives TLS 1.3 (RFC 9001) and Linux's kernel TLS takes from it.
// TLS 1.3 runs the handshake on a fresh connection, both ends present a certificate and verify
// the other's against the run's CA (and nothing else: the system's trusted roots are not used),
// then the acceptor sends one TLS record (a byte, `ready`) and both ends take the frame keys the
// session exports (RFC 8446, 7.5: one per direction) and leave TLS. Every frame after that,
// the hello included, is encrypted and tagged by the transport's ChaCha20-Poly1305
// (transport/auth.hpp) with its sequence number on the connection as nonce.
// Why not TLS's record layer for the frames too: the transport writes a connection from the
// sending thread while its I/O thread reads it, and reads a data body straight into the memory
// its receiver posted; an OpenSSL SSL object may not be read and written by two threads at once,
// and its records (16 KiB each) would add a copy of every byte received.
// The `ready` record ends the handshake in a known place: the dialer sends nothing after its
// Finished until it has read it, so neither end's TLS reads past the handshake into the frames.
//
// Per-peer identity (bind_ranks): a certificate whose common name is "rank N" admits only rank
// N, so a peer cannot claim another's rank; the acceptor checks the hello's rank, the dialer
// that it reached the rank it dialed. scripts/tls_certs makes a run CA and such certificates.
//
// Session tickets are off (a ticket would be a TLS record after the handshake), so every
// connection runs a full handshake: one more round trip than a plain one.
#pragma once

#include "decentrain/config.hpp"
#include "decentrain/transport/auth.hpp"

// DECENTRAIN_HAS_TLS: see config.hpp. Never under nvcc (asio does not compile there), without
// OpenSSL, or without the TCP transport it serves (DECENTRAIN_HAS_ASIO=0: asio absent, or left
// out); OpenSSL 3 (Debian 12's) for SSL_get1_peer_certificate.
#if DECENTRAIN_HAS_TLS && (defined(__CUDACC__) || !DECENTRAIN_HAS_OPENSSL || !DECENTRAIN_HAS_ASIO)
#undef DECENTRAIN_HAS_TLS
#define DECENTRAIN_HAS_TLS 0
#endif
#if DECENTRAIN_HAS_TLS
#include <openssl/opensslv.h>
#if OPENSSL_VERSION_NUMBER < 0x30000000L
#error "decentrain: TLS (DECENTRAIN_HAS_TLS=1) needs OpenSSL 3 or later"
#endif
#endif

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "decentrain/detail/error.hpp"

#if DECENTRAIN_HAS_TLS
#include <asio.hpp>
#include <asio/ssl.hpp>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#endif

namespace decentrain::transport::tls {

// PEM files; all three or none. The private key must not be readable by other users.
struct options {
  std::string certificate;  // this peer's certificate (and any intermediates), signed by the run's CA
  std::string private_key;  // its private key
  std::string ca;           // the run's CA certificate(s): the only ones a peer's certificate may chain to
  // A certificate named "rank N" (its common name) admits only rank N; others admit any rank.
  // With bind_ranks, a certificate must name one.
  bool bind_ranks = false;

  bool enabled() const { return !certificate.empty() || !private_key.empty() || !ca.empty(); }

  void validate() const {
    if (!enabled()) {
      decentrain::detail::check(!bind_ranks, "tls: bind_ranks needs TLS (a certificate, its key and the run's CA)");
      return;
    }
    decentrain::detail::check(!certificate.empty() && !private_key.empty() && !ca.empty(),
                              "tls: needs all three of a certificate, its private key and the run's CA (tls::options "
                              "certificate, private_key, ca); missing: ",
                              certificate.empty() ? "the certificate " : "", private_key.empty() ? "the private key " : "",
                              ca.empty() ? "the CA" : "");
    decentrain::detail::check(DECENTRAIN_HAS_TLS, "tls: this build has no TLS (it needs OpenSSL 3's libssl and asio, Debian: libssl-dev; "
                              "the CMake target turns it on when it finds them, a single-header build with "
                              "-DDECENTRAIN_HAS_TLS=1 -lssl -lcrypto)");
    namespace fs = std::filesystem;
    for (const auto* f : {&certificate, &private_key, &ca}) {
      std::error_code ec;
      decentrain::detail::check(fs::is_regular_file(*f, ec), "tls: '", *f, "' is not a file");
    }
    std::error_code ec;
    auth::check_private(fs::status(private_key, ec), "tls: private key", private_key);
  }
};

// The rank a certificate's common name gives ("rank N"), -1 when it names none.
inline int rank_named(const std::string& common_name) {
  const std::string prefix = "rank ";
  if (common_name.size() <= prefix.size() || common_name.size() > prefix.size() + 9 || !common_name.starts_with(prefix)) return -1;
  int r = 0;
  for (std::size_t i = prefix.size(); i < common_name.size(); ++i) {
    if (common_name[i] < '0' || common_name[i] > '9') return -1;
    r = r * 10 + (common_name[i] - '0');
  }
  return r;
}

#if DECENTRAIN_HAS_TLS

inline std::string openssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    out += (out.empty() ? "" : "; ") + std::string(buf);
  }
  return out.empty() ? "no detail from OpenSSL" : out;
}

using stream = asio::ssl::stream<asio::ip::tcp::socket&>;

// A certificate's common name ("" when it has none).
inline std::string common_name(X509* certificate) {
  char name[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(certificate), NID_commonName, name, sizeof name);
  return name;
}
inline constexpr unsigned char ready = 'R';
// RFC 5705 keeps labels starting "EXPORTER" for registered uses.
inline constexpr const char* exporter_label = "EXPERIMENTAL-decentrain frames";

// The TLS 1.3 context of peer `rank`: its certificate and key, the run's CA, both ends verified.
inline std::shared_ptr<asio::ssl::context> make_context(const options& o, int rank) {
  o.validate();
  auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls);
  auto* native = ctx->native_handle();
  ERR_clear_error();
  decentrain::detail::check(SSL_CTX_set_min_proto_version(native, TLS1_3_VERSION) == 1, "tls: OpenSSL cannot require TLS 1.3: ",
                            openssl_errors());
  decentrain::detail::check(SSL_CTX_use_certificate_chain_file(native, o.certificate.c_str()) == 1, "tls: cannot use certificate '",
                            o.certificate, "': ", openssl_errors());
  {
    // Read apart first, so a key of another certificate is told from a file that holds no key.
    std::unique_ptr<BIO, decltype(&BIO_free)> in(BIO_new_file(o.private_key.c_str(), "r"), &BIO_free);
    std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(in ? PEM_read_bio_PrivateKey(in.get(), nullptr, nullptr, nullptr) : nullptr,
                                                            &EVP_PKEY_free);
    decentrain::detail::check(key != nullptr, "tls: '", o.private_key, "' holds no PEM private key: ", openssl_errors());
    decentrain::detail::check(X509_check_private_key(SSL_CTX_get0_certificate(native), key.get()) == 1, "tls: private key '",
                              o.private_key, "' does not belong to certificate '", o.certificate, "'");
    ERR_clear_error();
    decentrain::detail::check(SSL_CTX_use_PrivateKey(native, key.get()) == 1, "tls: cannot use private key '", o.private_key,
                              "': ", openssl_errors());
  }
  decentrain::detail::check(SSL_CTX_load_verify_locations(native, o.ca.c_str(), nullptr) == 1, "tls: cannot load the run's CA from '",
                            o.ca, "': ", openssl_errors());
  // This peer's own certificate must chain to the CA, or every other peer would refuse it: said
  // here, at start, rather than as each connection's handshake failure.
  {
    std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> check(X509_STORE_CTX_new(), &X509_STORE_CTX_free);
    X509* own = SSL_CTX_get0_certificate(native);
    STACK_OF(X509)* chain = nullptr;
    SSL_CTX_get0_chain_certs(native, &chain);
    decentrain::detail::check(check && own && X509_STORE_CTX_init(check.get(), SSL_CTX_get_cert_store(native), own, chain) == 1,
                              "tls: cannot check certificate '", o.certificate, "': ", openssl_errors());
    decentrain::detail::check(X509_verify_cert(check.get()) == 1, "tls: certificate '", o.certificate,
                              "' does not verify against the run's CA in '", o.ca,
                              "': ", X509_verify_cert_error_string(X509_STORE_CTX_get_error(check.get())));
    if (o.bind_ranks) {
      const auto name = common_name(own);
      decentrain::detail::check(rank_named(name) >= 0, "tls: bind_ranks needs certificates named \"rank N\"; '", o.certificate,
                                "' is named \"", name, "\"");
      decentrain::detail::check(rank_named(name) == rank, "tls: certificate '", o.certificate, "' is for ", name,
                                ", and this peer is rank ", rank, " (with bind_ranks a certificate admits only its rank)");
    }
  }
  SSL_CTX_set_verify(native, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_num_tickets(native, 0);
  SSL_CTX_set_options(native, SSL_OP_NO_TICKET);
  return ctx;
}

// After the handshake: the connection's frame keys, and the rank the peer's certificate names
// (-1: none).
struct established {
  auth::digest dialer_to_acceptor{}, acceptor_to_dialer{};
  int certified_rank = -1;
  std::string common_name;
};

inline established finish(stream& s) {
  established e;
  std::array<unsigned char, 2 * auth::proof_bytes> keys{};
  decentrain::detail::check(SSL_export_keying_material(s.native_handle(), keys.data(), keys.size(), exporter_label,
                                                       std::strlen(exporter_label), nullptr, 0, 0) == 1,
                            "tls: OpenSSL cannot export the frame keys: ", openssl_errors());
  std::memcpy(e.dialer_to_acceptor.data(), keys.data(), auth::proof_bytes);
  std::memcpy(e.acceptor_to_dialer.data(), keys.data() + auth::proof_bytes, auth::proof_bytes);
  OPENSSL_cleanse(keys.data(), keys.size());
  if (X509* peer = SSL_get1_peer_certificate(s.native_handle())) {
    e.common_name = common_name(peer);
    e.certified_rank = rank_named(e.common_name);
    X509_free(peer);
  }
  return e;
}

// Why a handshake failed, and whose doing it was: the other end's certificate did not verify
// here (verified_here), the other end refused this one's (an alert came), the other end does not
// speak TLS, or it went away (eof, reset: not a verdict on anything; retried).
enum class failure : std::uint8_t { went_away, not_verified_here, refused_there, not_tls, other };
struct handshake_failure {
  failure kind = failure::other;
  std::string why;
};

inline handshake_failure describe(const asio::error_code& ec, SSL* ssl) {
  if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated || ec == asio::error::connection_reset ||
      ec == asio::error::broken_pipe)
    return {failure::went_away, "the other end closed the connection during the TLS handshake"};
  if (ec.category() != asio::error::get_ssl_category()) return {failure::other, ec.message()};
  char buf[256];
  ERR_error_string_n(static_cast<unsigned long>(ec.value()), buf, sizeof buf);
  const int reason = ERR_GET_REASON(static_cast<unsigned long>(ec.value()));
  if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED) {
    const long verdict = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
    return {failure::not_verified_here, std::string("the other end's certificate does not verify against this run's CA: ") +
                                            (verdict != X509_V_OK ? X509_verify_cert_error_string(verdict) : buf)};
  }
  if (reason >= SSL_AD_REASON_OFFSET)  // an alert the other end sent
    return {failure::refused_there, std::string("the other end refused this peer's certificate or settings (") + buf + ")"};
  if (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_PACKET_LENGTH_TOO_LONG || reason == SSL_R_RECORD_LENGTH_MISMATCH)
    return {failure::not_tls, std::string("the other end does not speak TLS: does it run without it? (") + buf + ")"};
  return {failure::other, buf};
}

// A handshake that failed on a verdict (a certificate refused, a peer without TLS), as against
// one that did not finish in time or whose other end went away: retrying cannot help it.
class refused : public decentrain::error {
 public:
  using decentrain::error::error;
};

// The dialer's half, on a connected socket whose io_context nothing else runs: the handshake and
// the acceptor's `ready`, within `limit`. Throws naming why it failed (`refused` when it failed).
inline established dial(asio::ssl::context& ctx, asio::ip::tcp::socket& socket, std::chrono::milliseconds limit,
                        const std::string& address) {
  auto& io = static_cast<asio::io_context&>(socket.get_executor().context());
  stream s(socket, ctx);
  asio::error_code result = asio::error::would_block;
  unsigned char got = 0;
  s.async_handshake(asio::ssl::stream_base::client, [&](const asio::error_code& ec) {
    if (ec) {
      result = ec;
      return;
    }
    // The acceptor refuses this peer's certificate after this end's handshake is done: its
    // verdict comes as the answer to this read (a TLS alert, or `ready`).
    asio::async_read(s, asio::buffer(&got, 1), [&](const asio::error_code& ec2, std::size_t) { result = ec2; });
  });
  io.restart();
  io.run_for(limit);
  if (result == asio::error::would_block) {
    asio::error_code ignored;
    socket.close(ignored);
    decentrain::detail::fail("tls: the TLS handshake with the peer at ", address, " did not finish within ", limit.count(), " ms");
  }
  if (result) {
    const auto f = describe(result, s.native_handle());
    const auto why = decentrain::detail::concat("tls: the TLS handshake with the peer at ", address, " failed: ", f.why);
    if (f.kind == failure::went_away) decentrain::detail::fail(why);
    throw refused(why);
  }
  if (got != ready)
    throw refused(decentrain::detail::concat("tls: the peer at ", address, " ended its TLS handshake with ", static_cast<int>(got),
                                             ", not the transport's ready byte"));
  return finish(s);
}

#endif

}  // namespace decentrain::transport::tls
