// This peer's end of the TCP mesh: the I/O thread that accepts connections and reads every one
// of them (a frame's body into memory a receiver posted, or into the mailbox), what each frame
// does (a handshake step, data, a heartbeat, a goodbye), the connections by rank, and the
// training thread's sends and receives over them.
//
// One I/O thread reads every connection; the sending thread writes its frames itself and
// returns once they are written, which bounds memory without deadlock (every peer's I/O thread
// always reads). Relayed connections (tcp/tunnel.hpp) are connections like the others; the
// frames this peer relays for others go out on the relay's threads (tcp/relay.hpp). A frame that fails validation (magic, version, type, length, cereal) is
// counted, its connection closed, and the peer carries on.
#pragma once

#include "decentrain/config.hpp"

#if DECENTRAIN_HAS_ASIO

#include <asio.hpp>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/mailbox.hpp"
#include "decentrain/transport/peer_error.hpp"
#include "decentrain/transport/tcp/admission.hpp"
#include "decentrain/transport/tcp/connection.hpp"
#include "decentrain/transport/tcp/directory.hpp"
#include "decentrain/transport/tcp/handshake.hpp"
#include "decentrain/transport/tcp/heartbeat.hpp"
#include "decentrain/transport/tcp/options.hpp"
#include "decentrain/transport/tcp/punch.hpp"
#include "decentrain/transport/tcp/relay.hpp"
#include "decentrain/transport/tcp/stream_count.hpp"
#include "decentrain/transport/tcp/stripes.hpp"
#include "decentrain/transport/tcp/tunnel.hpp"
#include "decentrain/transport/tls.hpp"

namespace decentrain::transport::tcp_detail {

struct node {
  explicit node(tcp_options o)
      : opts((o.validate(), std::move(o))), creds(opts), acceptor(io),
        started(std::chrono::steady_clock::now()) {
    box.set_budget(detail::budget{opts.max_queued_bytes, opts.budget_grace});
    for (int r = 0; r < opts.world; ++r) members.insert(r);
#if DECENTRAIN_HAS_TLS
    if (opts.tls.enabled()) tls_context = tls::make_context(opts.tls, opts.rank);
#endif
    if (!opts.listen.empty()) {
      const auto [host, port] = wire::split_address(opts.listen);
      try {
        asio::ip::tcp::resolver resolver(io);
        const auto ep = *resolver.resolve(host, std::to_string(port), asio::ip::resolver_base::passive).begin();
        acceptor.open(ep.endpoint().protocol());
        acceptor.set_option(asio::socket_base::reuse_address(true));
        acceptor.bind(ep.endpoint());
        acceptor.listen();
      } catch (const std::exception& e) {
        decentrain::detail::fail("tcp: peer ", opts.rank, " cannot listen on ", opts.listen, ": ", e.what());
      }
      advertised = (opts.advertise.empty() ? host : opts.advertise) + ":" + std::to_string(acceptor.local_endpoint().port());
      accept_next();
    }
    dir.addresses[opts.rank] = advertised;  // (empty: this peer accepts no connections)
    if (opts.listen.empty() && opts.punch_within.count() > 0) {
      try {
        punch_port = std::make_unique<port_reservation>();
      } catch (const std::exception&) {  // (no port to punch from: relays only)
      }
    }
    schedule_sweep();
    if (opts.heartbeat_interval.count() > 0) schedule_beat();
    io_thread = std::thread([this] { io.run(); });
  }

  ~node() {
    stop_dialing();
    {
      std::lock_guard lock(resend_mutex);
      resend_closed = true;
      resender.request_stop();
    }
    if (resender.joinable()) resender.join();
    punch_stop = true;
    std::list<punch_attempt> ending;
    {
      std::lock_guard lock(mutex);
      ending.splice(ending.end(), punches);
    }
    for (auto& p : ending) p.thread.join();  // (it stops within 20 ms; a connection it made is posted)
    end_relayed_first([this](const std::shared_ptr<connection>& c) { close(c, ""); });
    linger();
    asio::post(io, [this] {
      stopping = true;
      beat_timer.cancel();
      sweep_timer.cancel();
      accept_timer.cancel();
      asio::error_code ignored;
      acceptor.close(ignored);
      const auto open = all;  // close() erases from `all`
      for (const auto& c : open) close(c, "");
    });
    work.reset();
    if (io_thread.joinable()) io_thread.join();
    relays.stop();
    std::lock_guard lock(mutex);
    for (const auto& [far, t] : tunnels) t->stop();
    for (const auto& t : retired_tunnels) t->stop();
  }

  // ---- the registry ----

  bool late_group() const {
    std::lock_guard lock(mutex);
    return dir.late;
  }

  // Registers a connection this peer dialed whose handshake ended in a welcome (training thread):
  // from then on the I/O thread reads it. Returns once it is registered.
  void add_dialed(const std::shared_ptr<connection>& c) {
    std::promise<void> registered;
    auto f = registered.get_future();
    asio::post(io, [this, c, &registered] {
      all.insert(c);
      std::shared_ptr<connection> dropped;
      {
        std::lock_guard lock(mutex);
        dropped = keep_one(c);
      }
      if (dropped) close(dropped, "");
      if (dropped != c) {
        // A joiner hears the peer from now on, also one it forgot (it was left out and
        // rejoins), as the peer welcomed it.
        if (!(late_group() && box.welcome(c->rank))) box.reopen(c->rank);
        read_next(c);
      }
      registered.set_value();
    });
    f.get();
    changed.notify_all();
  }

  // A live connection is never replaced by another claiming its rank (a hijack, or a second
  // process of a rank already here): the newcomer is dropped. Two peers never dial each other at
  // once: ranks dial lower ranks while the group forms, joiners dial members and lower-ranked
  // joiners. Registers `c` or not; returns the connection to close quietly, if any (mutex held).
  std::shared_ptr<connection> keep_one(const std::shared_ptr<connection>& c) {
    auto it = peers.find(c->rank);
    if (it != peers.end() && it->second != c) return c;
    c->note_ports();
    if (it == peers.end() && !ever_connected.insert(c->rank).second) adm.reconnected();
    peers[c->rank] = c;
    return nullptr;
  }

  std::vector<int> connected() const {
    std::lock_guard lock(mutex);
    std::vector<int> out;
    for (const auto& [r, c] : peers) out.push_back(r);
    return out;
  }

  // The members of this peer's view (fault::elastic installs each view here): a joiner that is
  // not one of them is held to membership frames (see read_body).
  void set_members(const std::vector<int>& ranks) {
    std::lock_guard lock(mutex);
    members = std::set<int>(ranks.begin(), ranks.end());
  }
  // Whether `c` is a peer outside this peer's view: a joiner not admitted yet (mutex held).
  bool restricted(const connection& c) const { return !members.count(c.rank); }
  int joiners_waiting() const {  // (mutex held)
    int n = 0;
    for (const auto& [r, c] : peers) n += restricted(*c);
    return n;
  }

  // ---- accepting (I/O thread) ----

  // Accepts forever, one connection at a time. A failed accept (out of descriptors: the
  // connection stays in the kernel's queue and accept fails again at once) pauses, doubling up
  // to a second, and makes room by closing the oldest stranger, instead of spinning; once the
  // acceptor is closed (shutdown) it stops.
  void accept_next() {
    auto c = std::make_shared<connection>(io);
    acceptor.async_accept(c->socket, [this, c](const asio::error_code& ec) {
      if (stopping || !acceptor.is_open() || ec == asio::error::operation_aborted) return;
      if (ec && ec != asio::error::connection_aborted) {
        adm.accept_failed();
        if (ec == asio::error::no_descriptors || ec.value() == ENFILE || ec == asio::error::no_buffer_space ||
            ec == asio::error::no_memory)
          evict_oldest_stranger();
        accept_timer.expires_after(accept_pause);
        accept_pause = std::min(accept_pause * 2, std::chrono::milliseconds(1000));
        accept_timer.async_wait([this](const asio::error_code& e) {
          if (!e && !stopping) accept_next();
        });
        return;
      }
      accept_pause = std::chrono::milliseconds(10);
      if (!ec) {
        asio::error_code ignored;
        c->socket.set_option(asio::ip::tcp::no_delay(true), ignored);
        c->accepted_at = clock::now();
        all.insert(c);
        adm.count_pending(all);
        if (adm.pending() > opts.max_pending) evict_oldest_stranger();
#if DECENTRAIN_HAS_TLS
        if (tls_context) start_tls(c);
        else
#endif
          read_next(c);
      }
      accept_next();
    });
  }

#if DECENTRAIN_HAS_TLS
  // The acceptor's half of TLS (transport/tls.hpp): the handshake, `ready`, then frames under
  // the exported keys. A caller that speaks plain frames is told, as a plain goodbye, that
  // this peer needs TLS (its first bytes are a frame's magic, not a TLS record).
  void start_tls(const std::shared_ptr<connection>& c) {
    c->socket.async_wait(asio::socket_base::wait_read, [this, c](const asio::error_code& ec) {
      if (c->closed) return;
      if (ec) return lost(c, ec);
      std::array<unsigned char, 4> first{};
      const auto n = ::recv(c->socket.native_handle(), first.data(), first.size(), MSG_PEEK | MSG_DONTWAIT);
      if (n == 4 && (first[0] | first[1] << 8 | first[2] << 16 | static_cast<std::uint32_t>(first[3]) << 24) == wire::magic) {
        refuse(c, decentrain::detail::concat("peer ", opts.rank, " admits only peers with a certificate of the run's CA (TLS: ",
                                             "tcp_options::tls); the caller has none"));
        return;
      }
      c->tls = std::make_unique<tls::stream>(c->socket, *tls_context);
      c->tls->async_handshake(asio::ssl::stream_base::server, [this, c](const asio::error_code& ec2) {
        if (c->closed) return;
        if (ec2) {
          const auto f = tls::describe(ec2, c->tls->native_handle());
          if (f.kind == tls::failure::went_away) return lost(c, ec2);
          return reject(c, "its TLS handshake failed: " + f.why);
        }
        try {
          const auto e = tls::finish(*c->tls);
          c->keys.emplace(e.dialer_to_acceptor, e.acceptor_to_dialer, false);
          c->handshake_state.accepted(e.certified_rank, true);
        } catch (const std::exception& ex) {
          return reject(c, ex.what());
        }
        // `ready` is the first byte this end sends after its handshake, and nothing follows it
        // until the caller's hello: an unregistered connection gets no heartbeat or other frame
        // (see tls.hpp for why the order matters).
        static constexpr unsigned char ready = tls::ready;
        asio::async_write(*c->tls, asio::buffer(&ready, 1), [this, c](const asio::error_code& ec3, std::size_t) {
          if (c->closed) return;
          if (ec3) return lost(c, ec3);
          c->tls.reset();
          read_next(c);
        });
      });
    });
  }
#endif

  void evict_oldest_stranger() {
    if (const auto oldest = admission::oldest_stranger(all)) {
      adm.evicted();
      close(oldest, "");  // (close recounts the strangers)
    }
  }

  // Closes the strangers past their handshake deadline, a few times per deadline.
  void schedule_sweep() {
    sweep_timer.expires_after(std::clamp(opts.handshake_timeout / 4, std::chrono::milliseconds(20), std::chrono::milliseconds(500)));
    sweep_timer.async_wait([this](const asio::error_code& ec) {
      if (ec || stopping) return;
      const auto late_ones = admission::overdue(all, opts.handshake_timeout);
      if (!late_ones.empty()) adm.timed_out(late_ones.size());
      for (const auto& c : late_ones) close(c, "");
      schedule_sweep();
    });
  }

  // ---- reading (I/O thread) ----

  void read_next(const std::shared_ptr<connection>& c) {
    const std::size_t pad = c->padding;
    c->read_fully(std::span<std::byte>(c->head.data(), pad + wire::header_bytes), 0, [this, c, pad](const asio::error_code& ec, std::size_t) {
      if (ec) return lost(c, ec);
      wire::header h;
      // A TLS ClientHello where a hello should be: a caller with TLS, told in a plain goodbye
      // (its TLS fails on it at once, and says this peer does not speak TLS).
      if (c->rank < 0 && c->handshake_state.next() == handshake::stage::hello && c->head[0] == std::byte{22} &&
          c->head[1] == std::byte{3})
        return refuse(c, decentrain::detail::concat("peer ", opts.rank, " runs without TLS and the caller with it; give every ",
                                                    "peer the same TLS settings"));
      try {
        wire::check_zeros(c->head.data(), pad, "padding");
        h = wire::decode_header(c->head.data() + pad, opts.max_frame_bytes);
        c->padding = wire::padding(h.length).size();
        c->handshake_state.check_next(h);
        c->body_from = clock::now();
      } catch (const std::exception& e) {
        return malformed(c, e.what());
      }
      read_body(c, h);
    });
  }

  // A data body goes into memory a receiver posted for it, or into the mailbox when the sender's
  // budget has room for it; without room, the reading of this connection pauses until a receiver
  // takes some of what the sender queued (mailbox.hpp). A joiner not admitted yet may send only
  // membership frames, small ones, and little of them queued at once: past that it is dropped.
  void read_body(const std::shared_ptr<connection>& c, const wire::header& h) {
    if (h.type == wire::frame_type::relay && !relay_room(c, h)) return;
    if (h.type == wire::frame_type::piece) return read_piece(c, h);
    if (c->stream > 0 && h.type != wire::frame_type::bye)
      return malformed(c, decentrain::detail::concat("frame: peer ", c->rank, " sent a frame of type ", static_cast<int>(h.type),
                                                     " on its stream ", c->stream, ", which carries pieces of striped messages only"));
    // Behind striped messages coming in, a data frame waits until they are whole, a stripe frame
    // while as many are open as may be (tcp/stripes.hpp).
    if (c->inbound.holds(h.type)) {
      c->inbound.held = h;
      c->paused = true;
      return;
    }
    if (h.type == wire::frame_type::data && c->rank >= 0) {
      if (auto into = box.claim(c->rank, h.tag, static_cast<std::size_t>(h.length))) return read_in_place(c, h, *into);
      bool joiner = false;
      {
        std::lock_guard lock(mutex);
        joiner = restricted(*c);
      }
      if (joiner) {
        if (!is_membership_tag(h.tag) || h.length > opts.max_joiner_frame_bytes ||
            box.queued_bytes(c->rank) + h.length > opts.max_joiner_queued_bytes)
          return malformed(c, decentrain::detail::concat(
                                  "frame: peer ", c->rank, " joins and is not admitted yet, and sent ",
                                  !is_membership_tag(h.tag) ? "a data frame (only membership frames are read from a joiner)"
                                  : h.length > opts.max_joiner_frame_bytes
                                      ? decentrain::detail::concat("a frame of ", h.length, " bytes (a joiner's are at most ",
                                                                   opts.max_joiner_frame_bytes, ")")
                                      : decentrain::detail::concat("more than ", opts.max_joiner_queued_bytes,
                                                                   " bytes that nobody took yet")));
      } else {
        const auto as = box.room(c->rank, h.tag, static_cast<std::size_t>(h.length), [this, c, h] {
          asio::post(io, [this, c, h] {
            if (c->closed || !c->paused) return;
            c->paused = false;
            read_body(c, h);
          });
        });
        if (!as) {
          c->paused = true;
          return;
        }
        c->accepted = *as;
      }
    }
    c->body = box.spare(static_cast<std::size_t>(h.length));
    c->read_fully(std::span<std::byte>(c->body), 0, [this, c, h](const asio::error_code& ec2, std::size_t got) {
        if (ec2 == asio::error::eof)
          return malformed(c, decentrain::detail::concat("frame: truncated body (", got, " of ", h.length, " bytes)"));
        if (ec2) return lost(c, ec2);
        if (!authentic(*c, h, c->body)) return reject_frame(c, h);
        try {
          if (!dispatch(c, h)) return;
        } catch (const std::exception& e) {
          return malformed(c, e.what());
        }
        read_next_later(c);
      });
  }

  // The next frame, from the event loop (see connection::turn_bytes).
  void read_next_later(const std::shared_ptr<connection>& c) {
    asio::post(io, [this, c] {
      if (!c->closed) read_next(c);
    });
  }

  // A data body whose receiver posted its memory (exchange): read straight into it. The
  // posting is settled before anything else happens to the connection, so the receiver never
  // returns while this still writes into its memory.
  void read_in_place(const std::shared_ptr<connection>& c, const wire::header& h, std::span<std::byte> into) {
    ++bodies_into_posted;
    c->read_fully(into, 0, [this, c, h, into](const asio::error_code& ec, std::size_t got) {
      if (ec) {
        // Closed (and counted) before the posting is settled: the receiver wakes to a peer
        // already marked unreachable, so its error and the stats say why.
        if (ec == asio::error::eof)
          malformed(c, decentrain::detail::concat("frame: truncated body (", got, " of ", h.length, " bytes)"));
        else
          lost(c, ec);
        return box.abandoned(c->rank, h.tag);
      }
      if (!authentic(*c, h, into)) {
        reject_frame(c, h);
        return box.abandoned(c->rank, h.tag);
      }
      box.landed(c->rank, h.tag);
      measured(c, h.length, c->body_from, 1);
      read_next_later(c);
    });
  }

  // ---- striped messages coming in (tcp/stripes.hpp; I/O thread) ----

  // A striped message announced on its pair's first connection `c`: its pieces land in memory a
  // receiver posted for it, or in one buffer when the sender's budget has room (else the first
  // connection pauses, as for a data frame); streams that read a piece of it early go on.
  void open_stripe(const std::shared_ptr<connection>& c, const wire::header& h, const wire::stripe_head& head) {
    connection::inbound_stripe e;
    auto& in = c->inbound;
    // (memory posted for this tag is the message's only when no open one of the tag lands
    // elsewhere: that one comes first, and would be queued after this)
    const bool behind_unposted =
        std::any_of(in.open.begin(), in.open.end(), [&](const auto& o) { return o.tag == h.tag && !o.posted; });
    std::optional<std::span<std::byte>> posted;
    if (!behind_unposted) posted = box.claim(c->rank, h.tag, static_cast<std::size_t>(head.total));
    if (posted) {
      e.into = *posted;
      e.posted = true;
      ++bodies_into_posted;
    } else {
      const auto as = box.room(c->rank, h.tag, static_cast<std::size_t>(head.total), [this, c, h, head] {
        asio::post(io, [this, c, h, head] {
          if (c->closed || !c->paused) return;
          c->paused = false;
          open_stripe(c, h, head);
        });
      });
      if (!as) {
        c->paused = true;
        return;
      }
      e.accepted = *as;
      e.own = box.spare(static_cast<std::size_t>(head.total));
      e.into = e.own;
    }
    e.head = head;
    e.tag = h.tag;
    // (from its stripe frame's header, or a piece of it that came first and waited for it)
    e.opened_at = c->body_from;
    for (const auto& [s, sh] : in.waiting)
      if (wire::decode_piece_id(sh.tag).seq == head.seq) e.opened_at = std::min(e.opened_at, s->body_from);
    e.pieces.assign(static_cast<std::size_t>(head.pieces()), connection::inbound_stripe::piece_state::expected);
    in.open.push_back(std::move(e));
    in.opened_seq = head.seq;
    for (auto& [s, sh] : std::exchange(in.waiting, {}))
      asio::post(io, [this, s = s, sh = sh] {
        if (s->closed || !s->paused) return;
        s->paused = false;
        read_piece(s, sh);
      });
    read_next_later(c);
  }

  // A piece of a striped message its pair's first connection announced: read into its place. A
  // further stream whose piece is of the next message, not announced yet, waits for it (its
  // earlier pieces all came before: the sender finishes a message before it starts the next).
  // A piece sent again after a stream was lost may come twice (its landed frame was on its way):
  // one that landed is read and dropped; one that a further stream is reading takes that
  // stream for lost (its sender gave it up).
  void read_piece(const std::shared_ptr<connection>& c, const wire::header& h) {
    const auto f = c->stream == 0 ? c : c->first.lock();
    if (!f || f->closed) return close(c, "");  // (its pair's first connection closed: so does it)
    auto& in = f->inbound;
    const auto id = wire::decode_piece_id(h.tag);
    using state = connection::inbound_stripe::piece_state;
    // (announced and waiting for room to land in, or not announced yet: the next one)
    if (c->stream > 0 && id.seq > in.opened_seq && id.seq <= in.last_seq + 1) {
      c->paused = true;
      in.waiting.emplace_back(c, h);
      return;
    }
    auto* e = in.find(id.seq);
    const bool valid = e && id.index < e->head.pieces() && h.length == e->head.length(id.index);
    // (a message that landed whole: its pieces may still come again)
    const bool landed_before = !e && id.seq <= in.opened_seq && h.length <= in.landed_piece;
    if (landed_before || (valid && e->pieces[static_cast<std::size_t>(id.index)] != state::expected)) return read_twice(c, h);
    if (!valid)
      return malformed(c, decentrain::detail::concat("frame: peer ", c->rank, " sent piece ", id.index, " (", h.length,
                                                     " bytes) of striped message ", id.seq, ", which is not one it is sending",
                                                     e ? decentrain::detail::concat(" (message ", e->head.seq, ": ", e->head.pieces(),
                                                                                    " pieces of ", e->head.piece, " bytes)")
                                                       : decentrain::detail::concat(" (", in.open.size(), " open, the last announced ",
                                                                                    in.last_seq, ")")));
    const auto into = e->into.subspan(static_cast<std::size_t>(e->head.offset(id.index)), static_cast<std::size_t>(h.length));
    e->pieces[static_cast<std::size_t>(id.index)] = state::reading;
    c->reading = id;
    c->read_fully(into, 0, [this, c, f, h, id, into](const asio::error_code& ec, std::size_t got) {
      if (c->closed) return;  // (lost meanwhile: its piece is expected again)
      if (ec) {
        if (ec == asio::error::eof && c->stream == 0)
          return malformed(c, decentrain::detail::concat("frame: truncated piece (", got, " of ", h.length, " bytes)"));
        return lost(c, ec);  // (a stream's piece is expected again: close() finds it in `reading`)
      }
      c->reading.reset();
      if (!authentic(*c, h, into)) return reject_frame(c, h);
      auto* done = f->closed ? nullptr : f->inbound.find(id.seq);
      if (!done) return;  // (abandoned meanwhile: its streams closed with it)
      land_piece(f, *done, id, c->stream);
      read_next_later(c);
    }, true);
  }

  // A piece that came again: read (its tag checked), then dropped if it landed meanwhile, landed
  // from here if the read that had it failed meanwhile, or kept until that read ends.
  void read_twice(const std::shared_ptr<connection>& c, const wire::header& h) {
    c->body.resize(static_cast<std::size_t>(h.length));
    c->read_fully(std::span<std::byte>(c->body), 0, [this, c, h](const asio::error_code& ec, std::size_t got) {
      if (c->closed) return;
      if (ec) {
        if (ec == asio::error::eof && c->stream == 0)
          return malformed(c, decentrain::detail::concat("frame: truncated piece (", got, " of ", h.length, " bytes)"));
        return lost(c, ec);
      }
      if (!authentic(*c, h, c->body)) return reject_frame(c, h);
      const auto f = c->stream == 0 ? c : c->first.lock();
      const auto id = wire::decode_piece_id(h.tag);
      auto* e = !f || f->closed ? nullptr : f->inbound.find(id.seq);
      using state = connection::inbound_stripe::piece_state;
      const auto at = static_cast<std::size_t>(id.index);
      if (e && at < e->pieces.size() && e->pieces[at] != state::landed) {
        if (e->pieces[at] == state::reading) {
          e->spares[id.index] = std::exchange(c->body, {});
        } else {
          std::memcpy(e->into.data() + e->head.offset(id.index), c->body.data(), c->body.size());
          land_piece(f, *e, id, c->stream);
        }
      } else {
        ++pieces_twice;
      }
      c->body = {};
      read_next_later(c);
    });
  }

  // A piece in its place: said landed to its sender if it came over a further stream, and its
  // message lands once whole (in order).
  void land_piece(const std::shared_ptr<connection>& f, connection::inbound_stripe& e, wire::piece_id id, int stream) {
    const bool over_stream = stream > 0;
    e.pieces[static_cast<std::size_t>(id.index)] = connection::inbound_stripe::piece_state::landed;
    e.carried_by |= std::uint32_t{1} << (stream & 31);
    ++e.pieces_landed;
    e.spares.erase(id.index);
    f->heard = clock::now();  // (its peer is heard through any of the pair's connections)
    if (over_stream) say_landed(f, wire::encode_piece_id(id));
    land_stripes(f);
  }

  // Tells the sender of a pair that a piece of its further streams landed: a landed frame on the
  // first connection now if no writer holds it, else the writer sends it with its next frame or
  // while it waits, or a retry a moment later.
  void say_landed(const std::shared_ptr<connection>& f, tag_type id) {
    {
      std::lock_guard lock(f->acks_mutex);
      if (f->acks.size() >= wire::max_landed_ids) return;  // (see connection::acks)
      f->acks.push_back(id);
    }
    flush_control(f);
  }
  void flush_control(const std::shared_ptr<connection>& f) {
    {
      std::unique_lock lock(f->write_mutex, std::try_to_lock);
      if (lock.owns_lock()) {
        if (f->closed_for_writes.load()) return;
        // (nothing more is queued while what was is not out: a peer that does not read makes
        // the ids wait in their bounded list, not this buffer grow)
        if (f->flush_unsent()) {
          framing_sent += f->queue_control();
          if (f->flush_unsent()) return;
        }
      } else if (!f->control_waits()) {
        return;  // (the writer sends what it took, with its next frame)
      }
    }
    if (std::exchange(f->ack_retry, true)) return;
    auto timer = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(2));
    timer->async_wait([this, f, timer](const asio::error_code&) {
      f->ack_retry = false;
      if (!f->closed) flush_control(f);
    });
  }

  // The striped messages that are whole, oldest first, land while the oldest open is; a frame
  // the first connection held for them goes on once it may.
  void land_stripes(const std::shared_ptr<connection>& f) {
    auto& in = f->inbound;
    while (!in.open.empty() && in.open.front().pieces_landed == in.open.front().head.pieces()) {
      auto& e = in.open.front();
      ++striped_received;
      // (over the connections its pieces came by)
      measured(f, e.head.total, e.opened_at, std::popcount(e.carried_by));
      in.landed_piece = std::max(in.landed_piece, e.head.piece);
      if (e.posted) box.landed(f->rank, e.tag);
      else box.push(f->rank, e.tag, detail::message{std::move(e.own), 0.0, 0, e.accepted});
      in.open.pop_front();
    }
    if (in.held && !in.holds(in.held->type))
      asio::post(io, [this, f, h = *std::exchange(in.held, std::nullopt)] {
        if (f->closed || !f->paused) return;
        f->paused = false;
        read_body(f, h);
      });
  }

  // A first connection that closes with striped messages coming in: its streams close first
  // (none writes into the messages' memory after that: they are read on this thread only), then
  // memory receivers posted is settled, oldest first.
  void abandon_stripes(const std::shared_ptr<connection>& f) {
    std::vector<std::shared_ptr<connection>> streams;
    {
      std::lock_guard lock(mutex);
      streams = std::exchange(f->streams, {});
    }
    for (const auto& s : streams) close(s, "");
    for (const auto& e : f->inbound.open)
      if (e.posted) box.abandoned(f->rank, e.tag);
    f->inbound = {};
  }

  // Whether a frame's tag is the one its connection's key gives its place in the stream (no key:
  // no tag). Checked before anything is done with the frame. With TLS the body is decrypted in
  // place.
  static bool authentic(connection& c, const wire::header& h, std::span<std::byte> body) {
    if (!c.keys) return h.mac == auth::tag{};
    const auto head = wire::encode_header(h);  // its covered bytes are those received
    return c.keys->receive.open_in_place(std::span<const std::byte>(head).first(wire::header_used_bytes), body, h.mac);
  }

  void reject_frame(const std::shared_ptr<connection>& c, const wire::header& h) {
    const auto from = c->rank >= 0 ? "peer " + std::to_string(c->rank) : std::string("a connection");
    reject(c, c->keys || !opts.key.empty()
                  ? decentrain::detail::concat("a frame (type ", static_cast<int>(h.type), ") from ", from,
                                               c->keys ? " failed its authentication tag: modified, replayed or forged"
                                                       : " carries an authentication tag before the run key's handshake ended")
                  : decentrain::detail::concat("a frame (type ", static_cast<int>(h.type), ") from ", from,
                                               " carries an authentication tag, but this peer has no run key"),
           true);
  }

  // Drops a connection that failed the run key's checks, counted and named.
  void reject(const std::shared_ptr<connection>& c, const std::string& why, bool bad_tag = false) {
    adm.rejected(why, bad_tag);
    close(c, "it failed authentication: " + why);
  }

  // Handles one complete frame; false when the connection is done.
  bool dispatch(const std::shared_ptr<connection>& c, const wire::header& h) {
    switch (h.type) {
      case wire::frame_type::data: {
        bool joiner = false;
        {
          std::lock_guard lock(mutex);
          joiner = restricted(*c);
        }
        // A joiner is not of the view: it has no failure to report (an alarm would stop every
        // member's collectives).
        if (!(joiner && h.tag == alarm_tag)) box.push(c->rank, h.tag, detail::message{std::move(c->body), 0.0, 0, c->accepted});
        c->accepted = detail::accepted_as::budget;
        c->body = {};
        if (!joiner) measured(c, h.length, c->body_from, 1);
        return true;
      }
      case wire::frame_type::bye: {
        if (c->body.empty()) {
          close(c, "it said goodbye");
          return false;
        }
        const auto f = wire::decode_body<wire::farewell>(c->body, "goodbye");
        if (f.excluded) close(c, "it stopped listening to this peer: " + f.reason, failure_cause::excluded);
        else close(c, "it left: " + f.reason);
        return false;
      }
      case wire::frame_type::stripe: {
        const auto head = wire::decode_stripe_head(c->body, opts.max_frame_bytes);
        {
          std::lock_guard lock(mutex);
          decentrain::detail::check(!restricted(*c), "frame: peer ", c->rank,
                                    " joins and is not admitted yet, and sent a striped message (only membership frames are read from a joiner)");
        }
        decentrain::detail::check(head.seq == c->inbound.last_seq + 1, "frame: peer ", c->rank, " sent striped message ", head.seq,
                                  " after message ", c->inbound.last_seq);
        c->inbound.last_seq = head.seq;
        c->body = {};
        open_stripe(c, h, head);
        return false;  // (open_stripe reads on, once the message has a place to land)
      }
      case wire::frame_type::heartbeat:
        heartbeat::heard(*c, c->body, mutex);
        return true;
      case wire::frame_type::landed: {
        const auto ids = wire::decode_landed(c->body);
        bool owed = false;
        {
          std::lock_guard lock(c->sent_mutex);
          c->outbound.landed(ids);
          owed = !c->outbound.again.empty();
        }
        c->sent_landed.notify_all();
        c->body = {};
        if (owed) resend_later(c);  // (a message said opened may let pieces owed reach the receiver)
        return true;
      }
      case wire::frame_type::streams: {
        const int n = wire::decode_streams(h.tag, h.length);
        decentrain::detail::check(c->dialed, "frame: peer ", c->rank, " asked for ", n, " connections a pair in a streams frame, but ",
                                  "it dialed the pair (a pair's dialer opens its streams)");
        if (opts.streams_from_link) keep_streams(c, std::min(n, opts.streams));
        return true;
      }
      case wire::frame_type::relay:
        on_relay(c, h, std::exchange(c->body, {}));
        return true;
      case wire::frame_type::hello:
      case wire::frame_type::proof:
        return handshake_step(c, h.type);
      default:
        decentrain::detail::fail("frame: unexpected frame type ", static_cast<int>(h.type));
    }
  }

  // A handshake frame from a caller: the acceptor's side of the handshake answers it.
  bool handshake_step(const std::shared_ptr<connection>& c, wire::frame_type type) {
    auto v = c->handshake_state.on_frame(opts, creds, type, c->body);
    if (v.keys) c->keys = std::move(v.keys);  // (a refusal after the proof goes out sealed)
    using kind = handshake::verdict::kind;
    switch (v.what) {
      case kind::reply:
        reply(c, v.type, std::move(v.body));
        return true;
      case kind::refuse:
        refuse(c, v.why);
        return true;  // the caller closes (or the handshake deadline does)
      case kind::reject:
        reject(c, v.why);
        return false;
      case kind::proven:
        return admit(c, v.hello);
    }
    return false;
  }

  // A caller that said (and proved) who it is: a directory request is answered; a peer is taken
  // into the mesh and welcomed, or refused with a goodbye saying why. False when `c` is dropped.
  bool admit(const std::shared_ptr<connection>& c, const wire::hello& hello) {
    std::lock_guard lock(mutex);
    auto answer = [&](wire::frame_type type, bytes body) {
      c->handshake_state.answered();
      reply(c, type, std::move(body));
      return true;  // the caller closes when it has read the answer
    };
    if (hello.purpose == wire::hello_purpose::directory) {
      // (a caller that accepts no connections is listed without an address: nobody dials it, and
      // an empty address never hides one known)
      if (!dir.formed && !hello.address.empty()) dir.addresses[hello.rank] = hello.address;
      else if (!dir.formed) dir.addresses.try_emplace(hello.rank, "");
      return answer(wire::frame_type::directory,
                    wire::encode_body(dir.answer(
                        opts.rank, [&](int r) { return peers.count(r) > 0; },
                        [&](int r) { return peers.count(r) > 0 && restricted(*peers.at(r)); })));
    }
    if (const auto why = box.barred(hello.rank))  // final: trying again cannot help
      return answer(wire::frame_type::bye, wire::encode_body(wire::farewell{false, *why, true}));
    if (hello.stream > 0) return admit_stream(c, hello);
    if (hello.late) {
      if (peers.count(hello.rank)) {
        adm.hijack_refused(decentrain::detail::concat("a caller claimed rank ", hello.rank, ", which is connected here and alive"));
        return answer(wire::frame_type::bye,
                      wire::encode_body(wire::farewell{false, decentrain::detail::concat(
                                                                  "peer ", opts.rank, " is connected to a live peer of rank ",
                                                                  hello.rank, "; another process cannot take its rank")}));
      }
      if (joiners_waiting() >= opts.max_joiners) {
        adm.joiner_refused();
        return answer(wire::frame_type::bye,
                      wire::encode_body(wire::farewell{false, decentrain::detail::concat(
                                                                  "peer ", opts.rank, " has ", opts.max_joiners,
                                                                  " joiners waiting to be admitted (max_joiners); join again later")}));
      }
      if (!box.welcome(hello.rank))  // a rank this peer forgot may come back as a new peer
        return answer(wire::frame_type::bye,
                      wire::encode_body(wire::farewell{false, decentrain::detail::concat(
                                                                  "peer ", opts.rank, " has not left the previous peer of rank ",
                                                                  hello.rank, " out of its view yet; join again later")}));
    } else if ((hello.rank < opts.rank && !(hello.address.empty() && !dir.formed)) || peers.count(hello.rank)) {
      // (told why: the caller waits for an answer; a lower rank that accepts no connections
      // dials every peer while the group forms)
      return answer(wire::frame_type::bye,
                    wire::encode_body(wire::farewell{
                        false, hello.rank < opts.rank
                                   ? decentrain::detail::concat("peer ", hello.rank, " dialed peer ", opts.rank,
                                                                " (lower ranks are dialed, not dialing: are two peers started as rank ",
                                                                hello.rank, "?)")
                                   : decentrain::detail::concat("peer ", opts.rank, " is already connected to a peer of rank ",
                                                                hello.rank, " (are two peers started as rank ", hello.rank, "?)")}));
    }
    if (!hello.address.empty()) dir.addresses[hello.rank] = hello.address;
    else dir.addresses.try_emplace(hello.rank, "");
    // The welcome goes out before the connection is registered, so it is the first frame the
    // caller reads from it (the training thread may write to it as soon as it is registered).
    {
      std::lock_guard write_lock(c->write_mutex);
      framing_sent += c->append_frame(wire::frame_type::welcome, {});
      c->flush_unsent();
    }
    c->rank = hello.rank;
    c->handshake_state.opened();
    adm.admitted_one();  // no longer a stranger
    const auto dropped = keep_one(c);
    if (dropped != c) box.reopen(c->rank);
    changed.notify_all();
    if (dropped) asio::post(io, [this, dropped] { close(dropped, ""); });  // not under the mutex
    return dropped != c;  // false: this connection is the one dropped
  }

  // A further stream of a pair whose first connection stands (tcp/stripes.hpp): at most
  // `streams` - 1 of them, one of each number, for a direct connection of a member (mutex held).
  bool admit_stream(const std::shared_ptr<connection>& c, const wire::hello& hello) {
    const auto it = peers.find(hello.rank);
    std::string why;
    if (hello.stream >= opts.streams)
      why = decentrain::detail::concat("peer ", opts.rank, " takes at most ", opts.streams, " connection", opts.streams == 1 ? "" : "s",
                                       " a pair (tcp_options::streams), and peer ", hello.rank, " opened its stream ", int{hello.stream});
    else if (it == peers.end() || it->second->through || restricted(*it->second))
      why = decentrain::detail::concat("peer ", opts.rank, " has no direct connection from a member of rank ", hello.rank,
                                       " to add a stream to");
    else if (std::any_of(it->second->streams.begin(), it->second->streams.end(),
                         [&](const auto& s) { return s->stream == hello.stream; }))
      why = decentrain::detail::concat("peer ", opts.rank, " has a stream ", int{hello.stream}, " from peer ", hello.rank, " already");
    else if (!proven_callers() && !same_host(*c, *it->second))
      // (without credentials nothing proves the caller is that peer: a stranger could attach a
      // stream to another pair and close it with one bad frame)
      why = decentrain::detail::concat("peer ", opts.rank, " takes a stream of peer ", hello.rank,
                                       " from the host of its first connection only, without a run key, identities or TLS");
    if (!why.empty()) {
      c->handshake_state.answered();
      reply(c, wire::frame_type::bye, wire::encode_body(wire::farewell{false, why}));
      return true;  // the caller closes when it has read the answer
    }
    {
      std::lock_guard write_lock(c->write_mutex);
      framing_sent += c->append_frame(wire::frame_type::welcome, {});
      c->flush_unsent();
    }
    c->rank = hello.rank;
    c->stream = hello.stream;
    c->first = it->second;
    c->note_ports();
    c->handshake_state.opened();
    adm.admitted_one();
    it->second->streams.push_back(c);
    return true;
  }

  // Whether callers prove their rank (a run key, identities or a certificate).
  bool proven_callers() const {
#if DECENTRAIN_HAS_TLS
    if (tls_context) return true;
#endif
    return creds.keyed() || creds.identities();
  }
  static bool same_host(connection& a, connection& b) {
    asio::error_code e1, e2;
    const auto x = a.socket.remote_endpoint(e1), y = b.socket.remote_endpoint(e2);
    return !e1 && !e2 && x.address() == y.address();
  }

  // Registers a further stream this peer dialed to `peer` (training thread), for the pair's
  // first connection if it is still `first`; closed otherwise.
  void add_stream(const std::shared_ptr<connection>& c, const std::shared_ptr<connection>& f) {
    std::promise<void> registered;
    auto done = registered.get_future();
    asio::post(io, [this, c, f, &registered] {
      all.insert(c);
      bool kept = false;
      {
        std::lock_guard lock(mutex);
        const auto it = peers.find(c->rank);
        if (!f->closed && it != peers.end() && it->second == f) {
          c->first = f;
          c->note_ports();
          f->streams.push_back(c);
          ++streams_opened;
          kept = true;
        }
      }
      if (kept) read_next(c);
      else close(c, "");
      registered.set_value();
    });
    done.get();
  }

  // The pair's first connection to `peer` (training thread), if it is a direct one.
  std::shared_ptr<connection> direct_connection(int peer) const {
    std::lock_guard lock(mutex);
    return direct_connection_locked(peer);
  }

  // A caller refused before its key was checked: told why (best effort), counted.
  void refuse(const std::shared_ptr<connection>& c, const std::string& why) {
    adm.rejected(why);
    c->handshake_state.answered();
    reply(c, wire::frame_type::bye, wire::encode_body(wire::farewell{false, why, true}));
  }

  void malformed(const std::shared_ptr<connection>& c, const std::string& why) {
    {
      std::lock_guard lock(mutex);
      ++malformed_frames;
      last_malformed = why;
    }
    close(c, "it sent a malformed frame: " + why);
  }

  void lost(const std::shared_ptr<connection>& c, const asio::error_code& ec) {
    if (c->stream > 0) return lose_stream(c);
    if (!c->closed && c->rank < 0 && c->handshake_state.next() == handshake::stage::proof)  // a caller whose key differs stops here
      adm.rejected("a caller closed the connection after the run key's challenge (another key, or none)");
    std::string why = ec == asio::error::eof ? std::string("connection closed") : "connection lost: " + ec.message();
    if (c->through) why += decentrain::detail::concat(" (relayed by peer ", c->through->relay(), ": ", c->through->why_ended(), ")");
    close(c, why);
  }

  // A further stream lost to an error or closed by its peer: the pair goes on over the others.
  void lose_stream(const std::shared_ptr<connection>& c) {
    if (c->closed) return;
    {
      std::lock_guard lock(mutex);
      ++streams_lost;
    }
    close(c, "");
  }

  // Pieces of a lost stream go again from a thread of their own when no writer is sending to
  // that peer now (one that is sends them itself; this one then waits for it and finds none).
  void resend_later(const std::shared_ptr<connection>& f) {
    std::lock_guard lock(resend_mutex);
    if (resend_closed || std::exchange(f->resend_queued, true)) return;
    resend_queue.push_back(f);
    if (!resender.joinable()) resender = std::jthread([this](std::stop_token stop) { resend_loop(stop); });
    resend_wake.notify_one();
  }
  void resend_loop(std::stop_token stop) {
    for (;;) {
      std::shared_ptr<connection> f;
      {
        std::unique_lock lock(resend_mutex);
        if (!resend_wake.wait(lock, stop, [&] { return !resend_queue.empty(); })) return;
        f = resend_queue.front().lock();
        resend_queue.pop_front();
        if (f) f->resend_queued = false;
      }
      if (!f || f->closed_for_writes.load()) continue;
      // (a failure gives the pair up: its receiver waits for pieces that will not come)
      resend_now(f, clock::now() + opts.recv_timeout, [&] { return stop.stop_requested(); });
    }
  }
  // ---- how many streams a pair keeps (tcp/stream_count.hpp) ----

  // A message of `size` bytes from `f`'s peer landed over `k` connections, `from` when its first
  // header came (I/O thread; a message that waited for room, or behind others, counts the wait).
  // Under streams_from_link, a rate that shows them held at their window asks for twice as many:
  // the pair's dialer opens them, its acceptor asks the dialer in a streams frame (once for each
  // count, and again after a while if the dialer did not open them).
  void measured(const std::shared_ptr<connection>& f, std::uint64_t size, clock::time_point from, int k) {
    if (!opts.streams_from_link || size < opts.stripe_min_bytes || f->closed || f->through || f->punched) return;
    const auto now = clock::now();
    const double seconds = std::chrono::duration<double>(now - from).count();
    const int want = streams_wanted(k, opts.streams, static_cast<double>(size), seconds, least_round_trip(f->socket.native_handle()),
                                    static_cast<double>(stream_window));
    if (want <= k) return;
    if (f->dialed) return keep_streams(f, want);
    if (want <= f->streams_asked && now - f->asked_at < ask_again_after) return;
    f->streams_asked = want;
    f->asked_at = now;
    f->ask_streams = want;
    flush_control(f);
  }
  static constexpr std::chrono::seconds ask_again_after{30};

  // The pair's dialer keeps at least `want` connections from now on (and dials those it lacks).
  void keep_streams(const std::shared_ptr<connection>& f, int want) {
    {
      std::lock_guard lock(mutex);
      f->streams_target = std::max(f->streams_target, want);
    }
    want_streams(f);
  }

  // The further streams of the pair with `peer` it should have and lacks (this peer dialed it
  // directly to its address: not relayed, not punched): one lost, or more that the link needs.
  std::vector<int> missing_streams(int peer) const {
    std::lock_guard lock(mutex);
    const auto it = peers.find(peer);
    if (it == peers.end() || !it->second->dialed || it->second->through || it->second->punched) return {};
    const auto& f = *it->second;
    std::vector<int> out;
    for (int i = 1; i < (opts.streams_from_link ? f.streams_target : opts.streams); ++i)
      if (std::none_of(f.streams.begin(), f.streams.end(), [&](const auto& s) { return s->stream == i; })) out.push_back(i);
    return out;
  }

  // Streams a pair lacks are dialed from a thread of their own (a dial takes round trips, and
  // the I/O thread that finds them lacking must not wait), by the function the facade gives
  // set_stream_dialer (tcp/rendezvous.hpp dials; it returns the numbers it dialed). A pair's
  // rounds of dials come ever further apart while they come close together (first_backoff,
  // doubled each round up to max_backoff), so a peer that refuses or resets every stream it
  // takes is dialed ever less often; after max_stream_retries rounds whose dials failed, the pair
  // waits give_up_for before the next loss or measure dials it again. Pairs wait their turn in a
  // queue, not behind one another's backoff.
  static constexpr int max_stream_retries = 5;
  static constexpr std::chrono::seconds give_up_for{30};
  void set_stream_dialer(std::function<std::vector<int>(int)> dial) {
    std::lock_guard lock(dial_mutex);
    dial_streams = std::move(dial);
  }
  // The pair with `peer` dials the streams it lacks from the dialer's thread (some of its first
  // dials failed: say its acceptor had not registered the first connection yet).
  void want_streams(int peer) {
    std::shared_ptr<connection> f;
    {
      std::lock_guard lock(mutex);
      if (const auto it = peers.find(peer); it != peers.end()) f = it->second;
    }
    if (f) want_streams(f);
  }
  void want_streams(const std::shared_ptr<connection>& f) {
    std::lock_guard lock(dial_mutex);
    if (dial_closed || !dial_streams || std::exchange(f->dial_queued, true)) return;
    dial_queue.push_back(f);
    ++dial_queued_count;
    if (!stream_dialer.joinable()) stream_dialer = std::jthread([this](std::stop_token stop) { dial_loop(stop); });
    dial_wake.notify_one();
  }
  void dial_loop(std::stop_token stop) {
    std::unique_lock lock(dial_mutex);
    while (!stop.stop_requested()) {
      for (const auto& c : dial_queue)
        if (c->closed_for_writes.load()) c->dial_queued = false;
      std::erase_if(dial_queue, [](const auto& c) { return c->closed_for_writes.load(); });
      if (dial_queue.empty()) {
        dial_wake.wait(lock, stop, [&] { return !dial_queue.empty(); });
        continue;
      }
      const auto next = std::min_element(dial_queue.begin(), dial_queue.end(), [](const auto& a, const auto& b) { return a->dial_at < b->dial_at; });
      const auto f = *next;
      if (const auto at = f->dial_at; at > clock::now()) {
        const auto seen = dial_queued_count;  // (a pair queued meanwhile may be due sooner)
        dial_wake.wait_until(lock, stop, at, [&] { return dial_queued_count != seen; });
        continue;
      }
      dial_queue.erase(next);
      f->dial_queued = false;
      if (clock::now() > f->dial_at + give_up_for) f->dial_rounds = 0;  // (the last round was long ago)
      const auto dial = dial_streams;
      lock.unlock();
      const auto tried = dial(f->rank);
      const auto lacking = missing_streams(f->rank);
      lock.lock();
      const bool failed = std::any_of(tried.begin(), tried.end(), [&](int i) { return std::find(lacking.begin(), lacking.end(), i) != lacking.end(); });
      const int rounds = ++f->dial_rounds;
      if (failed && rounds > max_stream_retries) {
        f->dial_rounds = 0;
        f->dial_at = clock::now() + give_up_for;
        continue;
      }
      f->dial_at = clock::now() + std::min<clock::duration>(opts.first_backoff * (1 << std::min(rounds, 10)), opts.max_backoff);
      if ((failed || !lacking.empty()) && !std::exchange(f->dial_queued, true)) {
        dial_queue.push_back(f);
        ++dial_queued_count;
      }
    }
  }
  // Stops the stream dialer (before the facade's rendezvous, which it dials through, goes): a
  // dial under way ends at its deadline, and those after it are not started.
  void stop_dialing() {
    {
      std::lock_guard lock(dial_mutex);
      dial_closed = true;
      dial_stopping = true;
      stream_dialer.request_stop();
    }
    if (stream_dialer.joinable()) stream_dialer.join();
  }

  // Sends the pieces owed to `f`'s peer that reach it now, over the pair's connections.
  template <class Stop>
  void resend_now(const std::shared_ptr<connection>& f, clock::time_point deadline, Stop&& stop) {
    std::vector<std::shared_ptr<connection>> streams;
    {
      std::lock_guard lock(mutex);
      streams = f->streams;
    }
    striped_writer w(*f, streams, deadline, {pieces_resent, framing_sent});
    (void)w.resend(stop);
  }

  void close(const std::shared_ptr<connection>& c, const std::string& why, failure_cause cause = failure_cause::departed) {
    if (c->closed) return;
    c->closed = true;
    c->closed_for_writes = true;
    asio::error_code ignored;
    c->socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);  // wakes a writer in poll()
    if (c->stream == 0) {
      // A writer of a striped message holds the streams' write locks too: they fail it at once.
      std::vector<std::shared_ptr<connection>> streams;
      {
        std::lock_guard lock(mutex);
        streams = c->streams;
      }
      for (const auto& s : streams) {
        s->closed_for_writes = true;
        s->socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
      }
    }
    {
      std::lock_guard write_lock(c->write_mutex);
      c->socket.close(ignored);
    }
    all.erase(c);
    if (c->rank < 0 && !stopping) adm.count_pending(all);
    bool was_peer = false;
    if (c->rank >= 0) {
      std::lock_guard lock(mutex);
      auto it = peers.find(c->rank);
      if (it != peers.end() && it->second == c) {
        peers.erase(it);
        was_peer = true;
        if (c->through) relayed_before[c->rank] = c->through->relay();
        if (!why.empty()) box.close(c->rank, why, cause);
      }
    }
    if (c->stream > 0) {
      // A stream that closes leaves the pair with the others: the piece it was reading is
      // expected again, and what this peer sent over it and was not said landed goes again over
      // the others (tcp/stripes.hpp). One closed for what it sent (a bad frame, a bad tag) takes
      // the pair's first connection with it.
      const auto f = c->first.lock();
      if (f) {
        std::lock_guard lock(mutex);
        std::erase(f->streams, c);
      }
      if (f && !f->closed) {
        // (a second copy of it that came meanwhile lands in its place)
        if (c->reading)
          if (auto* e = f->inbound.find(c->reading->seq); e && c->reading->index < e->pieces.size())
            if (auto& p = e->pieces[static_cast<std::size_t>(c->reading->index)]; p == connection::inbound_stripe::piece_state::reading) {
              p = connection::inbound_stripe::piece_state::expected;
              if (const auto spare = e->spares.find(c->reading->index); spare != e->spares.end()) {
                std::memcpy(e->into.data() + e->head.offset(c->reading->index), spare->second.data(), spare->second.size());
                land_piece(f, *e, *c->reading, c->stream);
              }
            }
        std::erase_if(f->inbound.waiting, [&](const auto& w) { return w.first == c; });
        bool again = false;
        {
          std::lock_guard lock(f->sent_mutex);
          again = f->outbound.lost(c->stream);
        }
        if (!why.empty()) {
          close(f, decentrain::detail::concat("its stream ", c->stream, " closed: ", why), cause);
        } else if (!stopping) {
          if (again) resend_later(f);
          if (f->dialed) want_streams(f);  // (its dialer dials it again)
        }
      }
    } else if (!c->inbound.open.empty() || !c->streams.empty()) {
      abandon_stripes(c);
    }
    if (c->through) {
      std::lock_guard lock(mutex);
      if (auto it = tunnels.find(c->through->far()); it != tunnels.end() && it->second == c->through) tunnels.erase(it);
      retire(c->through);
    }
    if (was_peer && !c->through) {
      // The circuits it was an end of close, and the connections it relayed for this peer.
      // (a joiner at the other end of a circuit it opened is told too)
      relays.lost(c->rank, c, [this](int r) {
        std::lock_guard lock(mutex);
        return direct_connection_locked(r);
      });
      std::lock_guard lock(mutex);
      for (const auto& [far, t] : tunnels)
        t->relay_lost(c, decentrain::detail::concat("the relay, peer ", c->rank, ", is gone", why.empty() ? "" : " (" + why + ")"));
    }
  }

  // ---- relays (tcp/relay.hpp, tcp/tunnel.hpp) ----

  // The most a relay frame of a stream carries (a relay's queues overshoot by at most one).
  static constexpr std::size_t relay_chunk = std::size_t{256} << 10;

  // Relayed connections end first (`end_one`, on the I/O thread), and their tunnels carry what
  // is left in them to the relays (for up to a second) before the connections to the relays
  // close: what this peer sent last before it left reaches the other end, as over TCP.
  template <class End>
  void end_relayed_first(End end_one) {
    struct ended {
      std::promise<void> done;
      std::vector<std::shared_ptr<tunnel>> tunnels;
    };
    auto e = std::make_shared<ended>();
    auto posted = e->done.get_future();
    asio::post(io, [this, e, end_one] {
      const auto open = all;
      for (const auto& c : open)
        if (c->through && !c->closed) {
          e->tunnels.push_back(c->through);
          end_one(c);
        }
      e->done.set_value();
    });
    const auto until = clock::now() + std::chrono::seconds(1);
    if (posted.wait_until(until) != std::future_status::ready) return;
    for (const auto& t : e->tunnels)
      while (!t->finished() && clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }

  // A relay that leaves lets the circuits it carries close first (relay.linger).
  void linger() {
    const auto until = clock::now() + opts.relay.linger;
    while (!relays.idle() && clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  // Peer r's connection if it is a member's (mutex held); null otherwise.
  std::shared_ptr<connection> connection_of(int r) const {
    const auto it = peers.find(r);
    return it == peers.end() || restricted(*it->second) ? nullptr : it->second;
  }
  // Where a relay frame goes (mutex held; I/O thread): a member's connection; or a joiner's,
  // for what travels on a circuit the joiner opened and that is open here (a member's resume
  // of it included), never a circuit opened or punched towards a joiner.
  std::shared_ptr<connection> relay_destination(const wire::relay_route& r) const {
    if (auto c = connection_of(r.to)) return c;
    return r.kind != wire::relay_kind::open && r.kind != wire::relay_kind::punch && relays.is_open(r.from, r.to) ? direct_connection_locked(r.to)
                                                                                                                 : nullptr;
  }
  // Peer r's own connection (not relayed), member or joiner (mutex held); null otherwise.
  std::shared_ptr<connection> direct_connection_locked(int r) const {
    const auto it = peers.find(r);
    return it == peers.end() || it->second->through ? nullptr : it->second;
  }

  // A tunnel whose connection closed or that was replaced: it ends once it has carried what is
  // left in it (its near end is closed), and is joined once it has (mutex held).
  void retire(const std::shared_ptr<tunnel>& t) {
    std::erase_if(retired_tunnels, [](const auto& old) { return old->finished(); });
    retired_tunnels.push_back(t);
  }

  // The peers that may relay a circuit to `far` from here: connected directly, members, and
  // listening (so `far`, which dials every such peer, is connected to them too), by rank.
  // (A joiner not admitted yet knows no view: any listening peer its directory does not list as
  // joining may relay for it, admitted after the group formed or not.)
  std::vector<std::shared_ptr<connection>> relays_for(int far) const {
    std::lock_guard lock(mutex);
    std::vector<std::shared_ptr<connection>> out;
    for (const auto& [r, c] : peers)
      if (r != far && !c->through && (!restricted(*c) || (dir.late && !dir.joining.count(r))) && dir.addresses.count(r) &&
          !dir.addresses.at(r).empty())
        out.push_back(c);
    return out;
  }

  std::shared_ptr<tunnel> make_tunnel(int far, const std::shared_ptr<connection>& via, bool dialer) {
    tunnel::settings s;
    s.chunk = std::min<std::size_t>(relay_chunk, opts.max_frame_bytes);
    s.window = static_cast<std::size_t>(opts.relay.max_queued_bytes);
    s.timeout = opts.recv_timeout;
    s.resume_within = opts.relay.resume_within;
    return std::make_shared<tunnel>(opts.rank, far, via, dialer, s, framing_sent,
                                    [this](int to, const std::set<const connection*>& tried) -> std::shared_ptr<connection> {
                                      for (const auto& c : relays_for(to))
                                        if (!tried.count(c.get())) return c;
                                      return nullptr;
                                    });
  }

  // Training thread: a tunnel to `far` relayed by `via`, the circuit asked for. Its near end is
  // the caller's to dial over.
  std::shared_ptr<tunnel> open_tunnel(int far, const std::shared_ptr<connection>& via) {
    auto t = make_tunnel(far, via, true);
    {
      std::lock_guard lock(mutex);
      if (auto it = tunnels.find(far); it != tunnels.end()) retire(it->second);
      tunnels[far] = t;
    }
    t->start();
    return t;
  }

  // The peers this one reached through a relay, and the relay that carried each last (those
  // connected now, and those whose relayed connection closed).
  std::map<int, int> relayed() const {
    std::lock_guard lock(mutex);
    std::map<int, int> out = relayed_before;
    for (const auto& [r, c] : peers)
      if (c->through) out[r] = c->through->relay();
    return out;
  }

  int streams_to(int peer) const {
    std::lock_guard lock(mutex);
    const auto it = peers.find(peer);
    return it == peers.end() ? 0 : 1 + static_cast<int>(it->second->streams.size());
  }

  std::vector<transport::stream_ports> stream_ports(int peer) const {
    std::lock_guard lock(mutex);
    std::vector<transport::stream_ports> out;
    const auto it = peers.find(peer);
    if (it == peers.end()) return out;
    out.push_back({0, it->second->local_port, it->second->remote_port});
    for (const auto& s : it->second->streams) out.push_back({s->stream, s->local_port, s->remote_port});
    return out;
  }

  // The peers this one reached directly although neither accepts connections (a hole punched
  // through their NATs), connected now.
  std::vector<int> punched() const {
    std::lock_guard lock(mutex);
    std::vector<int> out;
    for (const auto& [r, c] : peers)
      if (c->punched) out.push_back(r);
    return out;
  }

  // A relay's answer to a punch (tcp/punch.hpp; I/O thread): peer `far`'s address as the relay
  // sees it. The peer that asked, the higher rank, hears it in its rendezvous; the other
  // connects to it at once and reads a connection that stands as an accepted one (the asker
  // dials over it). Not for a peer the directory lists as accepting connections (it may not
  // list the asker yet), three times each at most, and one at a time (the attempt listens on the port meanwhile, and two listeners on one port
  // would take each other's connections): a relay that names another address makes this peer
  // try to connect there for punch_within at most, and a hostile one cannot make it start more.
  void on_punch(int far, std::span<const std::byte> body) {
    const auto at = decode_punch_address(body);
    std::lock_guard lock(mutex);
    if (!punch_port || punch_stop || peers.count(far)) return;
    if (far < opts.rank) {
      punch_answers[far] = at;
      changed.notify_all();
      return;
    }
    const auto listed = dir.addresses.find(far);
    if ((listed != dir.addresses.end() && !listed->second.empty()) || punch_answered[far] >= 3) return;
    std::erase_if(punches, [](punch_attempt& p) {
      if (!p.done) return false;
      p.thread.join();
      return true;
    });
    if (!punches.empty()) return;  // (the higher rank goes through a relay instead)
    auto& p = punches.emplace_back();
    try {
      p.thread = std::thread([this, at, done = &p.done] {
        const int fd = punch_port->connect(at, clock::now() + opts.punch_within, true, [this] { return punch_stop.load(); });
        if (fd >= 0) asio::post(io, [this, fd] { adopt_accepted(fd, nullptr, true); });
        *done = true;
      });
    } catch (const std::system_error&) {  // (no thread to be had: no punch)
      punches.pop_back();
      return;
    }
    ++punch_answered[far];
  }

  // A relay frame's route, checked before its body is read, and room for the body where it
  // goes. False when the connection was closed (a route this connection may not send) or waits
  // for room (read again once there is).
  bool relay_room(const std::shared_ptr<connection>& c, const wire::header& h) {
    wire::relay_route r;
    std::shared_ptr<connection> dest;
    std::shared_ptr<tunnel> t;
    try {
      r = wire::decode_route(h.tag, opts.capacity());
      std::lock_guard lock(mutex);
      // A joiner not admitted yet may have its own circuits relayed to members that accept no
      // connections (it reaches them only so), within the relay's budgets and at most half its
      // circuits; it may not ask for punches (a relay would make the member dial where the
      // joiner says).
      const bool joiner = restricted(*c);
      if (joiner) {
        decentrain::detail::check(r.to != opts.rank && r.kind != wire::relay_kind::punch && r.kind != wire::relay_kind::lost,
                                  "frame: peer ", c->rank, " joins and is not admitted yet, and sent a relay frame ",
                                  r.to == opts.rank ? "for this peer" : "that only members send");
        const auto listed = dir.addresses.find(r.to);
        const bool opens = r.kind == wire::relay_kind::open || r.kind == wire::relay_kind::resume;
        decentrain::detail::check(!opens || (listed != dir.addresses.end() && listed->second.empty()),
                                  "frame: peer ", c->rank, " joins and is not admitted yet, and asked for a circuit to peer ", r.to,
                                  listed == dir.addresses.end() ? ", which this peer does not know"
                                                                : ", which accepts connections (a joiner dials it directly)");
      }
      decentrain::detail::check(!c->through, "frame: peer ", c->rank, " sent a relay frame over a relayed connection");
      decentrain::detail::check(r.from != opts.rank, "frame: peer ", c->rank, " sent this peer a relay frame from itself");
      decentrain::detail::check(r.to == opts.rank || r.from == c->rank, "frame: peer ", c->rank, " asked to relay a frame from peer ",
                                r.from, " (a peer has its own frames relayed only)");
      decentrain::detail::check(r.to != opts.rank || r.from != c->rank, "frame: peer ", c->rank,
                                " sent this peer a relay frame from itself (it is connected: nothing to relay)");
      const bool positioned = r.kind == wire::relay_kind::ack || r.kind == wire::relay_kind::resume;
      decentrain::detail::check(r.kind != wire::relay_kind::punch || h.length <= (r.to == opts.rank ? 64 : 0), "frame: a punch frame of ",
                                h.length, " bytes (", r.to == opts.rank ? "an address is at most 64" : "one asking a relay carries none", ")");
      decentrain::detail::check(r.kind != wire::relay_kind::bytes || h.length <= relay_chunk, "frame: a relay frame of ", h.length,
                                " bytes (a relayed stream's pieces are at most ", relay_chunk, ")");
      decentrain::detail::check(r.kind == wire::relay_kind::bytes || h.length <= (positioned ? 8 : 1024), "frame: a relay frame that ",
                                r.kind == wire::relay_kind::open ? "opens a circuit" : positioned ? "gives a stream position" : "closes a circuit",
                                " carries ", h.length, " bytes (at most ", positioned ? 8 : 1024, ")");
      if (r.to != opts.rank) dest = relay_destination(r);
      else if (auto it = tunnels.find(r.from); it != tunnels.end() && it->second->via() == c) t = it->second;
    } catch (const std::exception& e) {
      malformed(c, e.what());
      return false;
    }
    // (a frame for this peer's own tunnel that carries no stream bytes is taken at once: it
    // queues nothing; one to relay is queued, and counted against its sender, like the bytes)
    if (r.to == opts.rank && r.kind != wire::relay_kind::bytes) return true;
    auto resume = [this, c, h] {
      asio::post(io, [this, c, h] {
        if (c->closed || !c->paused) return;
        c->paused = false;
        read_body(c, h);
      });
    };
    const auto n = static_cast<std::size_t>(h.length);
    const bool room = r.to != opts.rank ? relays.has_room(dest, r, n, resume) : !t || t->has_room(n, resume);
    if (!room) c->paused = true;
    return room;
  }

  // A relay frame whose tag passed (relay_room checked its route): carried on for others, or
  // for one of this peer's tunnels; an `open` from a relay starts a relayed connection that is
  // accepted as a dialed-in one would be.
  void on_relay(const std::shared_ptr<connection>& c, const wire::header& h, bytes body) {
    const auto r = wire::decode_route(h.tag, opts.capacity());
    std::shared_ptr<connection> dest;
    std::shared_ptr<tunnel> t;
    bool by_joiner = false;
    {
      std::lock_guard lock(mutex);
      if (r.to != opts.rank) dest = relay_destination(r);
      else if (auto it = tunnels.find(r.from); it != tunnels.end()) t = it->second;
      by_joiner = restricted(*c);
    }
    if (r.to != opts.rank) return relays.carry(r, std::move(body), c, dest, by_joiner);
    if (r.kind == wire::relay_kind::open) return accept_relayed(c, r.from);
    if (r.kind == wire::relay_kind::punch) return on_punch(r.from, body);
    if (!t) return;  // (a circuit closed here meanwhile)
    if (r.kind == wire::relay_kind::resume) {
      (void)t->resume(c, wire::decode_position(body));  // (out of turn: ignored)
      return;
    }
    if (t->via() != c) return;  // from a relay that no longer carries it
    switch (r.kind) {
      case wire::relay_kind::bytes:
        return t->deliver(std::move(body));
      case wire::relay_kind::ack:
        return t->acknowledged(wire::decode_position(body));
      case wire::relay_kind::close:
        return t->closed(body.empty() ? decentrain::detail::concat("peer ", r.from, " closed it")
                                      : std::string(reinterpret_cast<const char*>(body.data()), body.size()));
      case wire::relay_kind::lost:
        return t->relay_lost(c, decentrain::detail::concat("the relay, peer ", c->rank, ", lost its connection to peer ", r.from));
      default:
        return;
    }
  }

  // A relay asks for a connection from `far`: its near end is read as an accepted connection
  // (a stranger until its handshake ends, bounded like any). A tunnel from `far` that is still
  // open stays: another relay cannot cut a live relayed connection by opening a second one.
  void accept_relayed(const std::shared_ptr<connection>& via, int far) {
    std::shared_ptr<tunnel> t;
    {
      std::lock_guard lock(mutex);
      if (auto it = tunnels.find(far); it != tunnels.end()) {
        if (!it->second->finished()) return;
        retire(it->second);
        tunnels.erase(it);
      }
      t = make_tunnel(far, via, false);
      tunnels[far] = t;
    }
    const int fd = t->take_near();
    t->start();
    adopt_accepted(fd, t, false);
  }

  // A socket this peer did not accept but reads as if it had (a relayed connection's near end,
  // a punched connection; I/O thread): a stranger until its handshake ends, bounded like any.
  void adopt_accepted(int fd, std::shared_ptr<tunnel> through, bool punched) {
    auto c = std::make_shared<connection>(io);
    asio::error_code ec;
    c->socket.assign(asio::ip::tcp::v4(), fd, ec);
    if (ec) ::close(fd);
    c->through = std::move(through);
    c->punched = punched;
    if (ec) return close(c, "");
    if (punched) c->socket.set_option(asio::ip::tcp::no_delay(true), ec);
    c->accepted_at = clock::now();
    all.insert(c);
    adm.count_pending(all);
    if (adm.pending() > opts.max_pending) evict_oldest_stranger();
#if DECENTRAIN_HAS_TLS
    if (tls_context) return start_tls(c);
#endif
    read_next(c);
  }

  // Closes a connection with a goodbye, written without blocking (best effort: a socket whose
  // buffer is full loses it, and the peer finds only the closed connection).
  void part(const std::shared_ptr<connection>& c, const std::string& why, failure_cause cause, const wire::farewell& f) {
    if (c->closed) return;
    // The mailbox closes in close(), after the peer left `peers`: a wait woken by the closure
    // and a send that follows it then agree that the peer is gone.
    {
      std::unique_lock lock(c->write_mutex, std::try_to_lock);
      if (lock.owns_lock() && !c->closed_for_writes.load() && c->flush_unsent()) {
        framing_sent += c->append_frame(wire::frame_type::bye, wire::encode_body(f));
        c->flush_unsent();
      }
    }
    // Unread bytes at close() would make the kernel reset the connection and drop the goodbye.
    std::array<std::byte, 4096> sink;
    for (int i = 0; i < 1024 && ::recv(c->socket.native_handle(), sink.data(), sink.size(), MSG_DONTWAIT) > 0; ++i) {
    }
    close(c, why, cause);
  }

  // Stops listening to a peer: its waits fail as silent, it is told why (best effort, without
  // blocking: so that, if it was the frozen one, it does not take this peer for departed when it
  // wakes), and the connection closes.
  void exclude(const std::shared_ptr<connection>& c, const std::string& why, const wire::farewell& f) {
    part(c, why, failure_cause::silent, f);
  }

  // On the I/O thread: a frame to a caller that is not (yet) a peer of the mesh: the run key's
  // challenge, a directory, a refusal.
  void reply(const std::shared_ptr<connection>& c, wire::frame_type type, bytes body) {
    struct frame {
      std::array<std::byte, wire::header_bytes> head;
      bytes body;
    };
    auto f = std::make_shared<frame>(frame{{}, std::move(body)});
    framing_sent += wire::header_bytes + f->body.size() + wire::padding(f->body.size()).size();
    {
      std::lock_guard write_lock(c->write_mutex);
      f->head = c->sealed_header(type, 0, f->body, c->encrypted() ? std::span<std::byte>(f->body) : std::span<std::byte>());
    }
    asio::async_write(c->socket, frame_buffers(f->head, f->body), [this, c, f](const asio::error_code& ec, std::size_t) {
      if (ec) lost(c, ec);
    });
  }

  // ---- liveness (I/O thread) ----
  void schedule_beat() {
    beat_timer.expires_after(opts.heartbeat_interval);
    beat_timer.async_wait([this](const asio::error_code& ec) {
      if (ec || stopping) return;
      std::vector<std::shared_ptr<connection>> connections;
      {
        std::lock_guard lock(mutex);
        for (const auto& [r, c] : peers) connections.push_back(c);
      }
      for (const auto& s : beats.beat(opts.rank, connections, opts.min_silence, mutex, framing_sent)) {
        if (s.hung_up) close(s.c, s.why);
        else exclude(s.c, s.why, s.told);
      }
      schedule_beat();
    });
  }

  std::optional<std::tuple<double, double, std::chrono::milliseconds, std::uint64_t>> liveness_of(int peer) const {
    std::lock_guard lock(mutex);
    auto it = peers.find(peer);
    if (it == peers.end()) return std::nullopt;
    const auto& b = it->second->beats;
    return std::tuple{b.round_trip_seconds(), b.gap_seconds(), b.deadline(opts.min_silence), b.heartbeats()};
  }

  // ---- the training thread ----
  void send(int peer, tag_type tag, std::span<const std::byte> data) {
    decentrain::detail::check(peer >= 0 && peer < opts.capacity(), "tcp: peer ", opts.rank, " cannot send to peer ", peer,
                              " (ranks below ", opts.capacity(), ")");
    decentrain::detail::check(data.size() <= opts.max_frame_bytes, "tcp: a message of ", data.size(),
                              " bytes is over max_frame_bytes = ", opts.max_frame_bytes);
    if (peer == opts.rank) {  // to itself: straight into its own mailbox
      box.push(peer, tag, detail::message{bytes(data.begin(), data.end()), 0.0});
      bytes_sent += data.size();
      sent_to[static_cast<std::size_t>(peer)] += data.size();
      ++messages_sent;
      return;
    }
    std::shared_ptr<connection> c;
    {
      std::lock_guard lock(mutex);
      auto it = peers.find(peer);
      if (it == peers.end()) {
        if (const auto closed = box.closure_of(peer))
          transport::fail_peer_because(closed->second, peer, "send", "tcp: peer ", peer, " is gone (", closed->first, ")");
        transport::fail_peer(peer, "send", "tcp: peer ", opts.rank, " is not connected to peer ", peer);
      }
      c = it->second;
    }
    // An alarm (transport/membership.hpp) stops a send that has written nothing of its frame
    // yet: its receiver may be the frozen peer.
    std::optional<alarm> stopped_by;
    auto interrupt = [&] {
      if (is_membership_tag(tag)) return false;
      stopped_by = box.alarmed();
      return stopped_by.has_value();
    };
    const auto deadline = clock::now() + opts.recv_timeout;
    std::vector<std::shared_ptr<connection>> streams;
    if (opts.streams > 1 && data.size() >= opts.stripe_min_bytes) {
      std::lock_guard lock(mutex);
      streams = c->streams;
    }
    // (pieces owed go first, while the first connection still reaches them: the receiver holds
    // this frame until the messages before it landed)
    if (streams.empty() && opts.streams > 1 && c->owes_pieces()) resend_now(c, deadline, striped_writer::never);
    const auto r = streams.empty() ? c->write_data(tag, data, deadline, interrupt) : send_striped(c, streams, tag, data, deadline, interrupt);
    switch (r.status) {
      case write_status::done:
        break;
      case write_status::interrupted:
        transport::fail_peer_because(cause_of(*stopped_by), stopped_by->failed, "send", "tcp: ", describe(*stopped_by));
      case write_status::closed:
        if (const auto closed = box.closure_of(peer))
          transport::fail_peer_because(closed->second, peer, "send", "tcp: peer ", peer, " is gone (", closed->first, ")");
        broken_send(peer, "tcp: connection to peer ", peer, " is closed");
      case write_status::broken:
        broken_send(peer, "tcp: sending to peer ", peer, " failed: ", std::generic_category().message(r.error));
      case write_status::timed_out:
        transport::fail_peer_because(failure_cause::silent, peer, "send", "tcp: sending to peer ", peer, " did not finish within ",
                                     opts.recv_timeout.count(), " ms");
    }
    bytes_sent += data.size();
    sent_to[static_cast<std::size_t>(peer)] += data.size();
    framing_sent += r.control_bytes;
    framing_sent += streams.empty() ? wire::header_bytes + wire::padding(data.size()).size()
                                    : striped_framing_bytes(data.size(), opts.stripe_piece_bytes);
    ++messages_sent;
    if (!streams.empty()) ++striped_sent;
  }

  // A message over the pair's first connection and its further streams at once (tcp/stripes.hpp).
  template <class Interrupt>
  write_result send_striped(const std::shared_ptr<connection>& c, const std::vector<std::shared_ptr<connection>>& streams, tag_type tag,
                            std::span<const std::byte> data, clock::time_point deadline, Interrupt& interrupt) {
    striped_writer w(*c, streams, deadline, {pieces_resent, framing_sent});
    const auto r = w.send(tag, data, opts.stripe_piece_bytes, 2 * opts.max_queued_bytes, interrupt);
    if (r.status == write_status::done && c->owes_pieces()) resend_later(c);  // (some reach the receiver only later)
    return r;
  }

  // A send that finds the connection closed or broken can run ahead of the reader, while the
  // peer's goodbye (which says why: "left it out of its view") still waits in the socket; a
  // broken pipe would tell the caller nothing of it (a peer woken from SIGSTOP). The reader
  // records why within moments (up to 250 ms), once the write lock is free.
  template <class... Parts>
  [[noreturn]] void broken_send(int peer, Parts&&... parts) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(250);
    for (;;) {
      if (const auto closed = box.closure_of(peer))
        transport::fail_peer_because(closed->second, peer, "send", "tcp: peer ", peer, " is gone (", closed->first, ")");
      if (std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    transport::fail_peer_because(failure_cause::other, peer, "send", std::forward<Parts>(parts)...);
  }

  bytes recv(int peer, tag_type tag, bool count_wait = true, std::optional<std::chrono::milliseconds> timeout = {}) {
    decentrain::detail::check(peer >= 0 && peer < opts.capacity(), "tcp: peer ", opts.rank, " cannot receive from peer ", peer,
                              " (ranks below ", opts.capacity(), ")");
    const auto t0 = std::chrono::steady_clock::now();
    auto m = box.pop(peer, tag, timeout.value_or(opts.recv_timeout));
    if (count_wait) wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bytes_received += m.payload.size();
    ++messages_received;
    return std::move(m.payload);
  }

  received recv_any(std::span<const int> sources, tag_type tag, bool count_wait = true) {
    decentrain::detail::check(!sources.empty(), "tcp: peer ", opts.rank, " cannot receive from none of the peers");
    for (const int peer : sources)
      decentrain::detail::check(peer >= 0 && peer < opts.capacity(), "tcp: peer ", opts.rank, " cannot receive from peer ", peer,
                                " (ranks below ", opts.capacity(), ")");
    const auto t0 = std::chrono::steady_clock::now();
    auto [source, m] = box.pop_any(sources, tag, opts.recv_timeout);
    if (count_wait) wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bytes_received += m.payload.size();
    ++messages_received;
    return {source, std::move(m.payload)};
  }
  std::optional<bytes> try_recv(int peer, tag_type tag) {
    decentrain::detail::check(peer >= 0 && peer < opts.capacity(), "tcp: peer ", opts.rank, " cannot receive from peer ", peer,
                              " (ranks below ", opts.capacity(), ")");
    const int sources[1] = {peer};
    auto m = box.try_pop_any(sources, tag);
    if (!m) return std::nullopt;
    bytes_received += m->second.payload.size();
    ++messages_received;
    return std::move(m->second.payload);
  }

  // Posts `ins` for the messages from `from` before sending `outs`: the I/O thread then reads
  // those bodies straight into `ins` (see mailbox::receive_into).
  void exchange(int to, std::span<const std::span<const std::byte>> outs, int from, std::span<const std::span<std::byte>> ins,
                tag_type tag, const landed_fn& landed, bool count_wait = true) {
    decentrain::detail::check(from >= 0 && from < opts.capacity(), "tcp: peer ", opts.rank, " cannot receive from peer ", from,
                              " (ranks below ", opts.capacity(), ")");
    auto t0 = std::chrono::steady_clock::now();
    box.receive_into(
        from, tag, ins, opts.recv_timeout,
        [&] {
          if (to >= 0)
            for (const auto& out : outs) send(to, tag, out);
          t0 = std::chrono::steady_clock::now();
        },
        [&] { give_up_on(from, "its message did not finish within the receive timeout"); },
        [&](std::size_t i, std::size_t size) {
          if (count_wait) wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          bytes_received += size;
          ++messages_received;
          landed(i, size);
          t0 = std::chrono::steady_clock::now();
        });
  }

  // From the training thread: closes the connection to `peer` on the I/O thread, which ends a
  // read that is stuck in the middle of that peer's message; with a farewell, tells it why. The
  // future is ready once the I/O thread has done so (connected() no longer lists the peer).
  std::future<void> give_up_on(int peer, std::string why, std::optional<wire::farewell> f = std::nullopt) {
    auto done = std::make_shared<std::promise<void>>();
    auto closed = done->get_future();
    asio::post(io, [this, peer, why = std::move(why), f = std::move(f), done] {
      std::shared_ptr<connection> c;
      {
        std::lock_guard lock(mutex);
        if (auto it = peers.find(peer); it != peers.end()) c = it->second;
      }
      if (c && f) exclude(c, why, *f);
      else if (c) close(c, why);
      done->set_value();
    });
    return closed;
  }

  // From the training thread: every connection closes with a goodbye saying `reason`; returns
  // once they are written (or after a second, should the I/O thread be stuck).
  void leave(const std::string& reason) {
    end_relayed_first([this, reason](const std::shared_ptr<connection>& c) {
      part(c, "this peer left the group", failure_cause::departed, wire::farewell{false, reason});
    });
    linger();
    auto done = std::make_shared<std::promise<void>>();
    auto written = done->get_future();
    asio::post(io, [this, reason, done] {
      std::vector<std::shared_ptr<connection>> open;
      {
        std::lock_guard lock(mutex);
        for (const auto& [r, c] : peers) open.push_back(c);
      }
      for (const auto& c : open) part(c, "this peer left the group", failure_cause::departed, wire::farewell{false, reason});
      done->set_value();
    });
    written.wait_for(std::chrono::seconds(1));
  }

  transport::relay_stats relay_stats() const { return relays.stats(); }

  traffic_stats stats() const {
    traffic_stats s;
    s.bytes_sent = bytes_sent;
    s.framing_bytes_sent = framing_sent;
    s.messages_sent = messages_sent;
    s.bytes_received = bytes_received;
    s.messages_received = messages_received;
    s.bodies_into_posted = bodies_into_posted;
    s.striped_sent = striped_sent;
    s.striped_received = striped_received;
    s.pieces_resent = pieces_resent;
    s.pieces_twice = pieces_twice;
    s.wait_seconds = wait_seconds;
    {
      std::lock_guard lock(mutex);
      s.clock_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      s.malformed_frames = malformed_frames;
      s.streams_lost = streams_lost;
      s.streams_opened = streams_opened;
    }
    const auto a = adm.stats();
    s.rejected_frames = a.refused + a.bad_tags;
    return s;
  }

  tcp_options opts;
  credentials creds;  // what this peer proves itself with (tcp/handshake.hpp)
#if DECENTRAIN_HAS_TLS
  std::shared_ptr<asio::ssl::context> tls_context;  // null without TLS
#endif
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work{asio::make_work_guard(io)};
  asio::ip::tcp::acceptor acceptor;
  // (mutex) The clock's zero (stats().clock_seconds): when the group formed (tcp::connect), and
  // until then when this node was made.
  std::chrono::steady_clock::time_point started;
  std::string advertised;
  std::thread io_thread;
  asio::steady_timer beat_timer{io};
  asio::steady_timer sweep_timer{io};   // closes strangers past their handshake deadline
  asio::steady_timer accept_timer{io};  // the pause after a failed accept
  std::chrono::milliseconds accept_pause{10};
  bool stopping = false;  // I/O thread only
  heartbeat beats;        // I/O thread only
  admission adm;          // its own lock

  mutable std::mutex mutex;         // guards dir, peers, members, ever_connected, the malformed counters, each connection's beats
  std::condition_variable changed;  // a peer connected
  directory dir;
  std::map<int, std::shared_ptr<connection>> peers;
  std::set<int> members;  // the view's (set_members); at first the group's first world
  std::set<int> ever_connected;  // ranks that have had a connection here (for admission's `reconnected`)
  std::set<std::shared_ptr<connection>> all;  // I/O thread only
  std::uint64_t malformed_frames = 0;
  std::string last_malformed;
  detail::mailbox box;

  // Payload bytes, as for every transport (framing adds 64 bytes a message and its padding).
  // Atomic: the training thread and a lane's background collective (see tcp::lane) both count here.
  std::atomic<std::uint64_t> bytes_sent = 0, messages_sent = 0, bytes_received = 0, messages_received = 0;
  std::atomic<std::uint64_t> framing_sent = 0;  // headers, padding and control frames (traffic_stats)
  // The payload bytes sent to each rank (tcp::bytes_sent_to: a summary's bytes per link).
  std::unique_ptr<std::atomic<std::uint64_t>[]> sent_to = std::make_unique<std::atomic<std::uint64_t>[]>(
      static_cast<std::size_t>(opts.capacity()));
  std::atomic<std::uint64_t> bodies_into_posted = 0;  // (traffic_stats)
  std::atomic<std::uint64_t> striped_sent = 0, striped_received = 0;
  std::atomic<std::uint64_t> pieces_resent = 0, pieces_twice = 0;  // (traffic_stats)
  std::uint64_t streams_lost = 0, streams_opened = 0;              // (the mutex; traffic_stats)
  // Pieces of lost streams to send again when no writer does (resend_later).
  std::mutex resend_mutex;
  std::condition_variable_any resend_wake;
  std::deque<std::weak_ptr<connection>> resend_queue;
  bool resend_closed = false;
  std::jthread resender;
  // Pairs whose further streams to dial (want_streams), the dialer's thread, and what one
  // connection keeps in flight at most (tcp_options::stream_window_bytes, else the kernel's).
  std::mutex dial_mutex;
  std::function<std::vector<int>(int)> dial_streams;  // (set_stream_dialer)
  std::atomic<bool> dial_stopping{false};
  std::condition_variable_any dial_wake;
  std::deque<std::shared_ptr<connection>> dial_queue;  // (closed ones dropped as the dialer finds them)
  std::uint64_t dial_queued_count = 0;
  bool dial_closed = false;
  std::jthread stream_dialer;
  const std::uint64_t stream_window = opts.stream_window_bytes != 0 ? opts.stream_window_bytes : kernel_stream_window();
  std::atomic<double> wait_seconds = 0;

  // Relays: the circuits this peer carries for others (their threads stop before the I/O
  // context goes), and this peer's own relayed connections by the far end's rank (mutex).
  relay_service relays{opts.rank, opts.relay, opts.recv_timeout, framing_sent};
  std::map<int, std::shared_ptr<tunnel>> tunnels;
  std::vector<std::shared_ptr<tunnel>> retired_tunnels;  // stopped, joined once finished (mutex)
  std::map<int, int> relayed_before;  // peers whose relayed connection closed, and their last relay (mutex)
  // Hole punching (tcp/punch.hpp): the port this peer dials from (null: it listens, or does not
  // punch), the relays' answers to its own punches (mutex), the attempt it answers (mutex).
  std::unique_ptr<port_reservation> punch_port;
  std::map<int, asio::ip::tcp::endpoint> punch_answers;
  struct punch_attempt {
    std::atomic<bool> done{false};
    std::thread thread;
  };
  std::list<punch_attempt> punches;  // (one at a time: see on_punch)
  std::map<int, int> punch_answered;  // how many attempts were made for each peer
  std::atomic<bool> punch_stop{false};
};

}  // namespace decentrain::transport::tcp_detail

#endif  // DECENTRAIN_HAS_ASIO
