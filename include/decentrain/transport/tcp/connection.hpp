// One TCP connection to a peer: its socket, its frame keys, the writer that seals frames in order
// and writes them whole, and the reader's state with the primitive that fills a buffer from the
// socket (read_fully).
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_ASIO

#include <asio.hpp>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "decentrain/transport/auth.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/liveness.hpp"
#include "decentrain/transport/mailbox.hpp"
#include "decentrain/transport/tcp/handshake.hpp"
#include "decentrain/transport/tls.hpp"

namespace decentrain::transport::tcp_detail {

using clock = std::chrono::steady_clock;

inline std::uint64_t nanoseconds(clock::time_point t) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

// A frame as asio buffers: header, body, padding (head and body must outlive the write).
inline std::array<asio::const_buffer, 3> frame_buffers(const std::array<std::byte, wire::header_bytes>& head,
                                                       std::span<const std::byte> body) {
  const auto pad = wire::padding(body.size());
  return {asio::buffer(head), asio::buffer(body.data(), body.size()), asio::buffer(pad.data(), pad.size())};
}

// How a blocking write of a data frame ended (connection::write_data).
enum class write_status : std::uint8_t {
  done,
  closed,       // the connection was closed (by the I/O thread) before the frame went out whole
  broken,       // the socket failed (errno in `error`)
  timed_out,    // the deadline passed first
  interrupted,  // `interrupt` asked to stop before any byte of the frame was written
};
struct write_result {
  write_status status = write_status::done;
  int error = 0;
  bool started = false;  // some of the frame was written (a stream it did not finish is unreadable past it)
  std::uint64_t control_bytes = 0;  // control frames that waited for the write lock, sent first (queue_control)
};

class tunnel;  // tcp/tunnel.hpp

struct connection : std::enable_shared_from_this<connection> {
  explicit connection(asio::io_context& io) : socket(io), heard(clock::now()), accepted_at(heard) {}

  asio::ip::tcp::socket socket;
  int rank = -1;  // -1 until its hello arrives (and, with credentials, its proof)
  // A connection relayed by a third peer: `socket` is this end of a local socket pair whose
  // other end `through` carries over the relay (tcp/tunnel.hpp); null for a direct connection.
  std::shared_ptr<tunnel> through;
  bool punched = false;  // a direct connection between two peers that accept none (tcp/punch.hpp)
  // Its TCP ports as registered (0 where it has none: a relayed one), for tcp::stream_ports.
  std::uint16_t local_port = 0, remote_port = 0;
  void note_ports() {
    asio::error_code e1, e2;
    const auto local = socket.local_endpoint(e1);
    const auto remote = socket.remote_endpoint(e2);
    if (!e1 && !e2 && !through) {
      local_port = local.port();
      remote_port = remote.port();
    }
  }

  // ---- streams (tcp/stripes.hpp) ----
  // 0: a pair's first connection, which carries every frame; 1 and up: a further stream of the
  // pair, which carries pieces of striped messages only, and `first` is the pair's first.
  int stream = 0;
  std::weak_ptr<connection> first;
  // The first connection's further streams, open now (the node's mutex).
  std::vector<std::shared_ptr<connection>> streams;
  // A pair's first connection this peer dialed: its dialer opens the pair's further streams.
  bool dialed = false;
  // The connections the pair keeps (its dialer's; the node's mutex): tcp_options::streams, or
  // under streams_from_link as many as the link was measured to need (tcp/stream_count.hpp).
  int streams_target = 1;
  // The pair's acceptor: the most connections it asked its dialer for (I/O thread), and a count
  // to ask for in a streams frame with the next control frames (0: none).
  int streams_asked = 1;
  std::atomic<int> ask_streams{0};
  // The dialer's (the node's dial_mutex): waiting for the node's stream dialer, not before
  // `dial_at`, and its rounds of dials close together (each waits longer: a peer that resets
  // every stream it takes, or refuses it, is dialed ever less often).
  bool dial_queued = false;
  clock::time_point dial_at{};
  int dial_rounds = 0;
  // The acceptor's (I/O thread): when it last asked its dialer for streams.
  clock::time_point asked_at{};
  // When the header of the frame being read came (I/O thread): a large message's rate measures
  // the link.
  clock::time_point body_from;
  std::uint64_t stripes_sent = 0;  // the striped messages sent so far (write_mutex of the first)
  // The striped messages coming in (the first connection's; I/O thread only): up to
  // max_open_stripes at once, in the order announced, each with where its pieces land (memory a
  // receiver posted, or `own`) and which landed; and the frames that wait: the first
  // connection's next data frame while any is open, or its next stripe frame while
  // max_open_stripes are (so messages land in the order they were sent), and further streams
  // whose next piece is of a message not announced yet.
  static constexpr std::size_t max_open_stripes = 2;
  struct inbound_stripe {
    wire::stripe_head head;
    tag_type tag = 0;
    std::span<std::byte> into;
    bytes own;
    bool posted = false;
    clock::time_point opened_at;  // when its stripe frame's header came, or a piece of it first
    std::uint32_t carried_by = 0;  // the connections (1 << stream) its pieces landed from
    detail::accepted_as accepted = detail::accepted_as::budget;
    enum class piece_state : std::uint8_t { expected, reading, landed };
    std::vector<piece_state> pieces;
    std::uint64_t pieces_landed = 0;
    // Second copies of pieces that another connection was reading when they came (a sender sends
    // a piece again once it gave up the stream it went over, which this end may not know yet):
    // one lands from here if that read fails. At most one a piece being read.
    std::map<std::uint64_t, bytes> spares;
  };
  struct inbound_stripes {
    std::deque<inbound_stripe> open;
    std::uint64_t last_seq = 0;    // the last announced
    std::uint64_t opened_seq = 0;  // the last given memory to land in (its stripe frame may wait for room)
    std::uint64_t landed_piece = 0;  // the largest piece of a message landed (bounds a piece that comes twice)
    std::optional<wire::header> held;
    std::vector<std::pair<std::shared_ptr<connection>, wire::header>> waiting;
    inbound_stripe* find(std::uint64_t seq) {
      for (auto& e : open)
        if (e.head.seq == seq) return &e;
      return nullptr;
    }
    // Whether the first connection's next frame of this type waits.
    bool holds(wire::frame_type type) const {
      return type == wire::frame_type::data ? !open.empty() : type == wire::frame_type::stripe && open.size() >= max_open_stripes;
    }
  } inbound;
  // (a further stream: the piece it is reading, so that one lost midway is expected again)
  std::optional<wire::piece_id> reading;
  // The pieces that came over further streams and landed, to say so in the next landed frame
  // (any thread that holds write_mutex sends them: acks_mutex alone guards this list).
  // (at most wire::max_landed_ids wait: past that one is dropped, which costs its sender a copy
  // kept longer, or the piece sent twice if its stream is lost)
  std::mutex acks_mutex;
  std::vector<tag_type> acks;
  bool ack_retry = false;     // (I/O thread) a retry is set for when write_mutex is free
  bool resend_queued = false;  // (the node's resend_mutex) waiting for its resender

  // The striped messages going out whose pieces over further streams are not all said landed
  // (the first connection's; sent_mutex). A stream lost takes what was in its socket and on the
  // wire with it, so each piece keeps the stream it went over until the receiver says it landed:
  // the write's own memory while it runs, then a copy. Pieces of a lost stream go again over the
  // others (tcp/stripes.hpp), but only over a connection the receiver reads on to them: not the
  // first once a data frame or a later stripe frame went out on it (the receiver holds those
  // until the messages before them landed), nor a stream that carried pieces of a later message
  // the receiver may not have opened yet (no piece of it said landed: it may wait for room).
  struct outbound_stripe {
    static constexpr std::uint8_t unsent = 0xff, landed = 0xfe;  // else the stream it went over
    wire::stripe_head head;
    std::span<const std::byte> data;                 // the message, while its write runs
    std::vector<std::uint8_t> via;                   // each piece's state
    std::vector<std::shared_ptr<const bytes>> kept;  // once the write returned: what is not landed
    std::uint64_t open = 0;                          // pieces not landed
    bool opened = false;      // a piece said landed: the receiver opened it
    bool behind_first = false;  // a frame the receiver may hold went out on the first connection after it
    std::span<const std::byte> piece(std::uint64_t i) const {
      if (!data.empty()) return data.subspan(static_cast<std::size_t>(head.offset(i)), static_cast<std::size_t>(head.length(i)));
      return kept[static_cast<std::size_t>(i)] ? std::span<const std::byte>(*kept[static_cast<std::size_t>(i)]) : std::span<const std::byte>();
    }
  };
  struct outbound_stripes {
    std::deque<outbound_stripe> unconfirmed;
    std::deque<wire::piece_id> again;  // pieces of lost streams, to send again
    std::uint64_t held_bytes = 0;      // of the pieces not said landed, those out over further streams
    outbound_stripe* find(std::uint64_t seq) {
      for (auto& e : unconfirmed)
        if (e.head.seq == seq) return &e;
      return nullptr;
    }
    void settle(outbound_stripe& e, std::uint64_t i) {
      auto& v = e.via[static_cast<std::size_t>(i)];
      if (v != 0 && v != outbound_stripe::unsent) held_bytes -= e.head.length(i);  // (out over a further stream)
      v = outbound_stripe::landed;
      e.kept[static_cast<std::size_t>(i)].reset();
      if (--e.open == 0) std::erase_if(unconfirmed, [&](const auto& x) { return x.open == 0; });
    }
    // A piece written whole over stream `over`: over the first connection it goes or fails with the
    // pair, and needs no landed frame.
    void written(wire::piece_id id, int over) {
      auto* e = find(id.seq);
      if (!e || e->via[static_cast<std::size_t>(id.index)] == outbound_stripe::landed) return;
      if (over == 0) {
        e->via[static_cast<std::size_t>(id.index)] = 0;
        settle(*e, id.index);
        return;
      }
      held_bytes += e->head.length(id.index);
      e->via[static_cast<std::size_t>(id.index)] = static_cast<std::uint8_t>(over);
    }
    // The receiver says these landed. Only a piece it was sent over a further stream is settled
    // (an id of one not sent yet, or twice, changes nothing: a peer cannot end a message's
    // record while its write still runs).
    void landed(std::span<const wire::piece_id> ids) {
      for (const auto& id : ids)
        if (auto* e = find(id.seq); e && id.index < e->head.pieces()) {
          const auto v = e->via[static_cast<std::size_t>(id.index)];
          if (v == 0 || v == outbound_stripe::unsent || v == outbound_stripe::landed) continue;
          e->opened = true;
          settle(*e, id.index);
        }
    }
    // Stream `gone` is lost: what it carried and is not said landed goes again. True if anything does.
    bool lost(int gone) {
      bool any = false;
      for (auto& e : unconfirmed)
        for (std::uint64_t i = 0; i < e.via.size(); ++i)
          if (e.via[static_cast<std::size_t>(i)] == gone) {
            e.via[static_cast<std::size_t>(i)] = outbound_stripe::unsent;
            held_bytes -= e.head.length(i);
            again.push_back({e.head.seq, i});
            any = true;
          }
      return any;
    }
    // A data frame or a stripe frame goes out on the first connection: the receiver may hold it
    // until every message before it landed.
    void first_carries_more() {
      for (auto& e : unconfirmed) e.behind_first = true;
    }
    // Whether a piece of `seq` sent again over stream `over` reaches the receiver (see above).
    bool reaches(std::uint64_t seq, int over) const {
      for (const auto& e : unconfirmed) {
        if (over == 0 && e.head.seq == seq) return !e.behind_first;
        if (over != 0 && e.head.seq > seq && !e.opened && std::ranges::find(e.via, static_cast<std::uint8_t>(over)) != e.via.end())
          return false;
      }
      return true;
    }
  };
  std::mutex sent_mutex;
  std::condition_variable sent_landed;
  outbound_stripes outbound;
  // Whether pieces of lost streams wait to go again (some may not reach the receiver yet).
  bool owes_pieces() {
    std::lock_guard lock(sent_mutex);
    return !outbound.again.empty();
  }

  // ---- the reader (I/O thread only) ----
  // The previous body's padding, then the next header: one read.
  std::array<std::byte, wire::frame_alignment + wire::header_bytes> head{};
  std::size_t padding = 0;  // bytes of padding still to read before the next header
  int low_water = 1;        // the socket's SO_RCVLOWAT as last set
  bytes body;
  bool closed = false;
  bool paused = false;  // a body waits for room in the mailbox (its budget): nothing is read meanwhile
  detail::accepted_as accepted = detail::accepted_as::budget;  // what the body being read is queued against

  // ---- the writer ----
  // Data frames are written by the sending thread; closing takes this lock, so the descriptor
  // is never closed (and its number reused) under a writer.
  std::mutex write_mutex;
  std::atomic<bool> closed_for_writes{false};
  // Guarded by write_mutex: what of a heartbeat or goodbye the socket did not take at once
  // (they are written without blocking); the next write sends it first, so frames never mix.
  bytes unsent;

  // ---- keys ----
  // Both directions' frame keys (a run key or TLS): `send` under write_mutex, `receive` on the I/O
  // thread; set before the connection carries any tagged frame.
  std::optional<auth::session> keys;

  // ---- liveness (I/O thread; `beats` also read under the node's mutex) ----
  // When anything last came from the peer, the bytes that sat in the socket at the last check
  // (bytes waiting under SO_RCVLOWAT count as heard), the last heartbeat to echo back and when it
  // came, and the estimates.
  clock::time_point heard;
  int queued = 0;
  wire::heartbeat last_in;
  clock::time_point last_in_at;
  liveness beats;

  // ---- the handshake (an accepted connection; a dialed one is open from the start) ----
  handshake handshake_state;
  clock::time_point accepted_at;
#if DECENTRAIN_HAS_TLS
  std::unique_ptr<tls::stream> tls;  // during the TLS handshake only
#endif

  bool encrypted() const { return keys && keys->send.encrypts(); }

  // A frame's header, with its tag when the connection has keys (write_mutex held: tags must go
  // out in the order they were made). Encrypting, the body goes to `ciphertext` (may be `body`).
  std::array<std::byte, wire::header_bytes> sealed_header(wire::frame_type type, tag_type tag, std::span<const std::byte> text,
                                                         std::span<std::byte> ciphertext) {
    auto h = wire::encode_header({type, tag, text.size(), {}});
    if (keys) {
      const auto mac = keys->send.seal(std::span<const std::byte>(h).first(wire::header_used_bytes), text, ciphertext);
      std::memcpy(h.data() + wire::tag_offset, mac.data(), mac.size());
    }
    return h;
  }

  // Queues a small control frame on `unsent` (write_mutex held); returns the bytes it adds.
  std::size_t append_frame(wire::frame_type type, const bytes& frame_body, tag_type tag = 0) {
    auto& out = unsent;
    const std::size_t at = out.size();
    out.resize(at + wire::header_bytes);
    out.insert(out.end(), frame_body.begin(), frame_body.end());
    const auto text = std::span<std::byte>(out).subspan(at + wire::header_bytes, frame_body.size());
    const auto h = sealed_header(type, tag, text, encrypted() ? text : std::span<std::byte>());
    std::memcpy(out.data() + at, h.data(), h.size());
    const auto pad = wire::padding(frame_body.size());
    out.insert(out.end(), pad.begin(), pad.end());
    return out.size() - at;
  }

  // Whether control frames wait for the write lock: landed ids, or a streams frame.
  bool control_waits() {
    if (ask_streams.load() != 0) return true;
    std::lock_guard lock(acks_mutex);
    return !acks.empty();
  }
  // Moves the control frames that wait into `unsent` (write_mutex held): the pieces said landed
  // as landed frames, and a streams frame; returns the bytes it adds.
  std::size_t queue_control() {
    std::vector<tag_type> ids;
    {
      std::lock_guard lock(acks_mutex);
      ids.swap(acks);
    }
    std::size_t added = 0;
    for (std::size_t at = 0; at < ids.size(); at += wire::max_landed_ids) {
      const auto n = std::min(wire::max_landed_ids, ids.size() - at);
      added += append_frame(wire::frame_type::landed, wire::encode_landed(std::span<const tag_type>(ids).subspan(at, n)));
    }
    if (const int n = ask_streams.exchange(0); n > 0) added += append_frame(wire::frame_type::streams, {}, static_cast<tag_type>(n));
    return added;
  }

  // Writes what of `unsent` the socket takes now (write_mutex held); true once all of it went.
  bool flush_unsent() {
    std::size_t done = 0;
    while (done < unsent.size()) {
      const ssize_t n = ::send(socket.native_handle(), unsent.data() + done, unsent.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // full, or broken (the reader finds out)
      done += static_cast<std::size_t>(n);
    }
    unsent.erase(unsent.begin(), unsent.begin() + static_cast<std::ptrdiff_t>(done));
    return unsent.empty();
  }

  // Shuts the socket down from a thread other than the I/O thread (a frame was left half
  // written: nothing can follow it); the I/O thread then reads the end and closes it.
  void abandon() {
    std::lock_guard lock(write_mutex);
    abandon_locked();
  }
  void abandon_locked() {  // (write_mutex held)
    if (!closed_for_writes.exchange(true)) ::shutdown(socket.native_handle(), SHUT_RDWR);
  }

  // The sending thread writes a data frame itself (the I/O thread only reads data connections):
  // handing each message to the I/O thread and waiting for it cost two thread switches per
  // message, which on a machine with fewer cores than peers was most of a small all-reduce.
  // Non-blocking writes with poll() keep the deadline; the I/O thread reads meanwhile, so peers
  // that all send at once still drain each other. `interrupt()` is asked while the socket is full
  // and nothing of this frame is written yet: true stops the write (a frame half written must
  // finish, or the stream would lose its framing). Takes write_mutex.
  template <class Interrupt>
  write_result write_data(tag_type tag, std::span<const std::byte> data, clock::time_point deadline, Interrupt&& interrupt,
                          wire::frame_type type = wire::frame_type::data) {
    std::lock_guard lock(write_mutex);
    // (control frames that wait go first: a sender that keeps the lock busy would hold them up)
    const auto control = control_waits() ? queue_control() : 0;
    // (Encrypting, the caller's buffer is not ours to overwrite: the frame is encrypted into one
    // buffer per sending thread, not per connection: a peer with many connections holds one copy
    // of its largest frame, not one per peer. The tag goes in the header, so all of it first.)
    auto r = write_locked(type, tag, data, deadline, interrupt);
    r.control_bytes = control;
    return r;
  }

  // write_data with write_mutex already held (a striped message holds it for all its frames).
  template <class Interrupt>
  write_result write_locked(wire::frame_type type, tag_type tag, std::span<const std::byte> data, clock::time_point deadline,
                            Interrupt&& interrupt) {
    if (type == wire::frame_type::data || type == wire::frame_type::stripe) {
      std::lock_guard lock(sent_mutex);
      outbound.first_carries_more();
    }
    if (encrypted()) {
      static thread_local bytes ciphertext;
      if (ciphertext.size() < data.size()) ciphertext.resize(data.size());
      const auto into = std::span<std::byte>(ciphertext).first(data.size());
      return write_sealed(sealed_header(type, tag, data, into), into, deadline, interrupt);
    }
    return write_sealed(sealed_header(type, tag, data, {}), data, deadline, interrupt);
  }

  // One sealed frame on its way into the socket without blocking (write_mutex held from start
  // to finish): what is left of `unsent` first, then the header, body and padding. `h` and
  // `data` must outlive it.
  class outgoing {
   public:
    outgoing(connection& c, const std::array<std::byte, wire::header_bytes>& h, std::span<const std::byte> data)
        : c_(c), before_(c.unsent.size()) {
      const auto pad = wire::padding(data.size());
      parts_ = {iovec{c.unsent.data(), c.unsent.size()}, iovec{const_cast<std::byte*>(h.data()), h.size()},
                iovec{const_cast<std::byte*>(data.data()), data.size()}, iovec{const_cast<std::byte*>(pad.data()), pad.size()}};
    }
    enum class step { done, full, failed };
    // Writes what the socket takes now: done once the frame went out whole, full when the
    // socket takes no more for now, failed when it broke (error()).
    step write() {
      while (first_ < parts_.size()) {
        msghdr msg{};
        msg.msg_iov = parts_.data() + first_;
        msg.msg_iovlen = parts_.size() - first_;
        const ssize_t n = ::sendmsg(c_.socket.native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
          error_ = errno;
          if (error_ == EINTR) continue;
          return error_ == EAGAIN || error_ == EWOULDBLOCK ? step::full : step::failed;
        }
        auto done = static_cast<std::size_t>(n);
        written_ += done;
        while (first_ < parts_.size() && done >= parts_[first_].iov_len) done -= parts_[first_++].iov_len;
        if (first_ < parts_.size()) {
          parts_[first_].iov_base = static_cast<std::byte*>(parts_[first_].iov_base) + done;
          parts_[first_].iov_len -= done;
        }
      }
      return step::done;
    }
    bool started() const { return written_ > before_; }
    int error() const { return error_; }
    // Ends the write: what of `unsent` went out is dropped, and a frame that never started gives
    // its authentication tag back (the next frame takes its place in the sequence).
    write_result finish(write_status s, int error = 0) {
      if (s == write_status::done) {
        c_.unsent.clear();
        return {};
      }
      c_.unsent.erase(c_.unsent.begin(), c_.unsent.begin() + static_cast<std::ptrdiff_t>(std::min(written_, before_)));
      if (written_ <= before_ && c_.keys) c_.keys->send.unseal();
      return write_result{s, error, written_ > before_};
    }

   private:
    connection& c_;
    std::size_t before_;
    std::array<iovec, 4> parts_{};
    std::size_t first_ = 0, written_ = 0;
    int error_ = 0;
  };

  // Reads exactly `into` (from byte `got` on), then calls done(error, bytes read). It reads
  // until the socket is empty before it waits, and while it waits the socket's receive
  // low-water mark (SO_RCVLOWAT) is what is still missing, up to low_water_cap, so the kernel
  // wakes this thread once per large piece of a body rather than once per packet (asio's
  // async_read goes back through epoll_wait after every read: bench/RESULTS.md). Never more
  // than is missing: a mark above the rest of a frame would wait for bytes that may never come.
  // `within_buffer` (a striped message's pieces): nor over a quarter of the socket's receive
  // buffer as it stands. A mark the buffer cannot hold twice makes Linux grow the buffer to it
  // and clamp the window to the mark (tcp_set_rcvlowat), which at a piece's size holds each
  // stream of a long fat link back. Whole frames keep the larger mark: at 4 MiB its clamp is what
  // the sender's default buffer sends a round trip anyway, autotuning lifts it, and the buffer it
  // grows at once opens a lone stream's window sooner (bench/RESULTS.md, bench/streams, has both).
  //
  // After `turn_bytes` in one go it hands the rest back to the event loop: a peer streaming
  // gigabytes (a state transfer) would otherwise keep the I/O thread reading for as long as the
  // stream lasts: its heartbeats, timers and other connections would wait that long (its peer
  // then takes it for silent), and the stack would grow by a few calls per message.
  static constexpr std::size_t low_water_cap = std::size_t{4} << 20;
  static constexpr std::size_t turn_bytes = std::size_t{4} << 20;

  template <class Done>
  void read_fully(std::span<std::byte> into, std::size_t got, Done done, bool within_buffer = false) {
    const int fd = socket.native_handle();
    std::size_t this_turn = 0;
    while (got < into.size()) {
      if (this_turn >= turn_bytes) {
        asio::post(socket.get_executor(), [self = shared_from_this(), into, got, done = std::move(done), within_buffer]() mutable {
          if (self->closed) return done(asio::error_code(asio::error::operation_aborted), got);  // settles a posting
          self->read_fully(into, got, std::move(done), within_buffer);
        });
        return;
      }
      const ssize_t n = ::recv(fd, into.data() + got, into.size() - got, MSG_DONTWAIT);
      if (n > 0) {
        got += static_cast<std::size_t>(n);
        this_turn += static_cast<std::size_t>(n);
        heard = clock::now();
        continue;
      }
      if (n == 0) return done(asio::error_code(asio::error::eof), got);
      const int err = errno;
      if (err == EINTR) continue;
      if (err != EAGAIN && err != EWOULDBLOCK) return done(asio::error_code(err, asio::error::get_system_category()), got);
      std::size_t mark = std::min(into.size() - got, low_water_cap);
      if (within_buffer) {
        int rcvbuf = 0;
        socklen_t length = sizeof rcvbuf;
        if (::getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &length) != 0) rcvbuf = 0;
        mark = std::max<std::size_t>(1, std::min(mark, static_cast<std::size_t>(rcvbuf / 4)));
      }
      const int want = static_cast<int>(mark);
      if (want != low_water && ::setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0) low_water = want;
      socket.async_wait(asio::socket_base::wait_read,
                        [self = shared_from_this(), into, got, done = std::move(done), within_buffer](const asio::error_code& ec) mutable {
                          if (ec) return done(ec, got);
                          self->read_fully(into, got, std::move(done), within_buffer);
                        });
      return;
    }
    done(asio::error_code(), got);
  }

 private:
  // write_data's frame once sealed (write_mutex held).
  template <class Interrupt>
  write_result write_sealed(const std::array<std::byte, wire::header_bytes>& h, std::span<const std::byte> data,
                            clock::time_point deadline, Interrupt& interrupt) {
    outgoing out(*this, h, data);
    for (;;) {
      if (closed_for_writes.load()) return out.finish(write_status::closed);
      const auto r = out.write();
      if (r == outgoing::step::done) return out.finish(write_status::done);
      if (r == outgoing::step::failed) return out.finish(write_status::broken, out.error());
      if (!out.started() && interrupt()) return out.finish(write_status::interrupted);
      const auto left = deadline - clock::now();
      if (left <= clock::duration::zero()) return out.finish(write_status::timed_out);
      pollfd p{socket.native_handle(), POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(100, std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1)));
    }
  }
};

}  // namespace decentrain::transport::tcp_detail

#endif  // DECENTRAIN_HAS_ASIO
