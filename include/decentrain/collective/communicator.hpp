// Collectives over any transport endpoint: all-reduce (a chunked, pipelined ring for large
// buffers; recursive doubling for small ones), broadcast, all-gather (+ combine) and barrier,
// blocking or started in the background with a handle to wait on; sub-groups with their own tag
// space; pairwise messages. Every peer must call the same collectives in the same order with the
// same sizes; a size that disagrees is reported as an error naming the peer, never trusted. A
// peer that fails a collective surfaces as a transport::peer_error naming it and the collective.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "decentrain/collective/group.hpp"
#include "decentrain/detail/activity.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/detail/hash.hpp"
#include "decentrain/transport/any_endpoint.hpp"
#include "decentrain/transport/peer_error.hpp"

namespace decentrain::collective {

enum class reduce_op { sum, average, max, min };
enum class algorithm { automatic, ring, recursive_doubling, halving_doubling };

// Message sizes. Over a link that holds B bytes in flight (bandwidth x latency), a ring step
// should move several B per window, or it spends its time waiting for the first bytes; and below
// a few B, recursive doubling's log2(N) latencies beat the ring's 2(N - 1). So both sizes below
// are raised to at least in_flight_multiple x B, where B is what the transport knows of its
// slowest link (transport::slowest_link: in_process) or, where it cannot tell (tcp, mpi),
// link_bytes_in_flight as the user gives it (over the internet, 100 ms x 100 Mbit/s = 1.25 MB).
// Every peer must be given the same options (the first ring all-reduce checks the ring's sizes).
struct options {
  // The ring's messages: each chunk is added in as soon as it lands, while the next arrives.
  std::size_t chunk_bytes = std::size_t{1} << 20;
  // How much of a segment a ring step moves before the next step starts. One chunk keeps what a
  // step reduces in cache for the next step's send (a larger window lets it leave the cache
  // first, which a fast link feels); more hides latency: a step costs one latency per window,
  // not one per chunk.
  std::size_t window_bytes = std::size_t{1} << 20;
  // automatic: recursive doubling under this size, the ring from it on. 512 KiB lies between
  // the sizes where recursive doubling's fewer latencies win over a fast link and those where
  // the ring's bandwidth does (bench/RESULTS.md).
  std::size_t recursive_doubling_below_bytes = std::size_t{512} << 10;
  // Set: in a world of 2^k >= 4 peers, automatic takes recursive halving then doubling where it
  // would take the ring (the ring's bytes in 2 log2(N) latencies instead of 2 (N - 1)), and so
  // does a dense codec's exchange. Faster on links alike; where each peer's links differ the
  // ring, pipelined, is, hence off by default (bench/RESULTS.md, bench_allreduce_simulated
  // --algorithms). Every peer the same.
  bool halving_doubling = false;
  // The slowest link's bandwidth x latency in bytes, for transports that cannot tell; 0: unknown.
  double link_bytes_in_flight = 0.0;
  double in_flight_multiple = 8.0;
};

// "0 2 1 3": a ring's order, for messages and summaries.
inline std::string describe_order(std::span<const int> order) {
  std::string out;
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(order[i]);
  }
  return out;
}

// Bytes this communicator's collectives put on the wire (payload only).
struct counters {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t calls = 0;
};

template <transport::endpoint Endpoint>
class communicator;

// A collective started in the background (communicator::start and the *_async calls). The
// buffers it was given belong to it until wait() returns, and the communicator that started it
// must outlive it. wait() rethrows what the collective threw; a handle destroyed unwaited still
// waits for its thread (and drops the error), which can take as long as the transport's receive
// timeout when a peer never joins the collective.
class pending {
 public:
  pending() = default;
  pending(pending&&) noexcept = default;
  pending& operator=(pending&& other) noexcept {
    if (this != &other) {
      join();
      s_ = std::move(other.s_);
    }
    return *this;
  }
  ~pending() { join(); }

  // Whether the collective has finished (wait() then does not block).
  bool ready() const { return !s_ || s_->done.load(); }
  // Whether it has finished by this peer's clock as well: on simulated links a lane that ended
  // (in real time) at a later simulated time than the caller's clock has not landed yet, and
  // wait() would move the clock to its end, waiting. Elsewhere: ready().
  bool landed() const { return ready() && (!s_ || !s_->landed || s_->landed()); }
  // Blocks until the collective has finished; accounts its traffic and time to the caller.
  void wait() {
    if (!s_) return;
    auto s = std::move(s_);
    if (s->worker.joinable()) s->worker.join();
    if (s->finish) s->finish();
    if (s->error) std::rethrow_exception(s->error);
  }

 private:
  template <transport::endpoint>
  friend class communicator;
  struct state {
    std::thread worker;
    std::atomic<bool> done{false};
    std::exception_ptr error;
    std::function<void()> finish;  // on the waiting thread: fold the lane back in
    std::function<bool()> landed;  // once done, on the owner's thread: whether its clock has passed the lane's
  };
  // An unwaited handle still folds the lane back in (its bytes and, on simulated links, its
  // time), dropping only the error.
  void join() noexcept {
    if (!s_) return;
    if (s_->worker.joinable()) s_->worker.join();
    try {
      if (s_->finish) s_->finish();
    } catch (...) {
    }
    s_.reset();
  }
  std::unique_ptr<state> s_;
};

template <transport::endpoint Endpoint>
class communicator {
 public:
  // `channel` goes into the high 32 bits of every tag, so communicators over the same endpoint
  // with different channels never pair each other's messages (0: the world's).
  explicit communicator(Endpoint& ep, options opts = {}, std::uint32_t channel = 0)
      : ep_(&ep), opts_(opts), channel_(channel) {
    decentrain::detail::check(opts.chunk_bytes > 0, "communicator: chunk_bytes must be > 0");
    decentrain::detail::check(opts.window_bytes > 0, "communicator: window_bytes must be > 0");
    decentrain::detail::check(opts.link_bytes_in_flight >= 0 && opts.in_flight_multiple >= 0,
                              "communicator: link_bytes_in_flight and in_flight_multiple must be >= 0");
    double in_flight = opts.link_bytes_in_flight;
    if (const auto link = transport::slowest_link(ep)) in_flight = std::max(in_flight, link->bandwidth_delay_bytes());
    // Capped so that a huge estimate cannot overflow; 1 GiB is far beyond any message size.
    const auto at_least = static_cast<std::size_t>(std::min(opts.in_flight_multiple * in_flight, double(std::size_t{1} << 30)));
    opts_.window_bytes = std::max(opts_.window_bytes, at_least);
    opts_.recursive_doubling_below_bytes = std::max(opts_.recursive_doubling_below_bytes, at_least);
  }

  // Not copyable (tags are numbered per communicator); movable while nothing started with
  // start() is pending on it.
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&&) noexcept = default;

  // The sizes in use: the options given, raised to the links where the transport knows them.
  const options& settings() const { return opts_; }

  int rank() const { return ep_->rank(); }
  // Whether this is start()'s communicator on a lane, running beside its caller (false where the
  // transport has no lanes and start() runs its op before returning).
  bool in_background() const { return background_; }
  int world() const { return ep_->world(); }
  Endpoint& endpoint() { return *ep_; }
  const counters& traffic() const { return counters_; }
  // Starts from another communicator's counts (one that this one replaces: a new view).
  void adopt_traffic(const counters& c) { counters_ = c; }

  template <class T>
  void all_reduce(std::span<T> data, reduce_op op = reduce_op::sum, algorithm algo = algorithm::automatic) {
    static_assert(std::is_arithmetic_v<T>, "all_reduce: elements must be arithmetic");
    const auto tag = next_tag();
    if (world() == 1) return finish(data, op);
    if (algo == algorithm::automatic) {
      const bool halving = opts_.halving_doubling && world() >= 4 && std::has_single_bit(static_cast<unsigned>(world()));
      algo = data.size_bytes() < opts_.recursive_doubling_below_bytes || data.size() < static_cast<std::size_t>(world())
                 ? algorithm::recursive_doubling
                 : (halving ? algorithm::halving_doubling : algorithm::ring);
    }
    naming_the_peer("all_reduce", [&] {
      if (algo == algorithm::ring)
        ring_all_reduce(data, op, tag);
      else if (algo == algorithm::halving_doubling)
        halving_doubling_all_reduce(data, op, tag);
      else
        recursive_doubling_all_reduce(data, op, tag);
    });
    finish(data, op);
  }

  // A partitioned ("butterfly") all-reduce: peer i reduces counts[i] consecutive values, which
  // every peer sends it directly, then sends the reduced values to every peer. A peer's traffic
  // is (1 + (world - 2) share) of the buffer each way, so shares sized by bandwidth
  // (collective/balanced_all_reduce.hpp) let a slow peer reduce less instead of pacing a ring,
  // and a peer given 0 reduces nothing (client mode: it only sends its values and receives the
  // result). Every peer gives the same counts, summing to data.size(): the first call with new
  // counts compares them, and fails on every peer if they differ. Each range is reduced on one
  // peer only, in a fixed order, so every peer ends with the same bits. A peer's values all leave
  // before it waits for any message, and each range is reduced and sent back a chunk at a time,
  // so results flow in while values flow out.
  template <class T>
  void partitioned_all_reduce(std::span<T> data, std::span<const std::size_t> counts, reduce_op op = reduce_op::sum);

  // Every peer ends with root's values.
  template <class T>
  void broadcast(std::span<T> data, int root = 0) {
    static_assert(std::is_trivially_copyable_v<T>, "broadcast: elements must be trivially copyable");
    check_rank(root, "broadcast root");
    const auto tag = next_tag();
    naming_the_peer("broadcast", [&] { broadcast_tree(data, root, tag); });
  }

  // Concatenation of every peer's `mine` in rank order; all peers give the same size.
  template <class T>
  std::vector<T> all_gather(std::span<const T> mine) {
    static_assert(std::is_trivially_copyable_v<T>, "all_gather: elements must be trivially copyable");
    const auto tag = next_tag();
    std::vector<T> out;
    naming_the_peer("all_gather", [&] {
      if (!ring_.empty()) agree_on_ring_sizes();
      out = ring_all_gather(mine, tag);
    });
    return out;
  }

  // Every peer's `data` gathered, then combine(contributions, data) with the contributions as
  // spans in rank order (this peer's own among them): where a plain sum will not do, as in
  // robust aggregation (median, trimmed mean) or decoding compressed payloads. Every peer gets
  // the same contributions, so a deterministic combine leaves every peer with the same bits.
  template <class T, class Combine>
    requires std::invocable<Combine&, std::span<const std::span<const T>>, std::span<T>>
  void all_gather_combine(std::span<T> data, Combine&& combine) {
    const auto all = all_gather(std::span<const T>(data));
    std::vector<std::span<const T>> parts;
    for (int r = 0; r < world(); ++r)
      parts.push_back(std::span<const T>(all).subspan(static_cast<std::size_t>(r) * data.size(), data.size()));
    combine(std::span<const std::span<const T>>(parts), data);
  }

  // Every peer sends out[p] to peer p and receives in[p] from peer p, straight from the sender
  // (no peer relays another's data, which robust aggregation needs: a relay could rewrite what
  // it forwards). out[rank()] is copied into in[rank()]. in[p] must be exactly the size peer p
  // sends here; a size that differs is an error naming p. Round k sends to rank + k and
  // receives from rank - k, so every peer sends and receives once per round.
  template <class T>
  void all_to_all(std::span<const std::span<const T>> out, std::span<const std::span<T>> in) {
    static_assert(std::is_trivially_copyable_v<T>, "all_to_all: elements must be trivially copyable");
    const int n = world(), r = rank();
    decentrain::detail::check(out.size() == static_cast<std::size_t>(n) && in.size() == static_cast<std::size_t>(n),
                              "all_to_all: needs one buffer per peer (", n, "), got ", out.size(), " to send and ", in.size(),
                              " to receive");
    decentrain::detail::check(out[static_cast<std::size_t>(r)].size() == in[static_cast<std::size_t>(r)].size(),
                              "all_to_all: this peer's own part is ", out[static_cast<std::size_t>(r)].size(), " values sent and ",
                              in[static_cast<std::size_t>(r)].size(), " received");
    const auto tag = next_tag();
    std::copy(out[static_cast<std::size_t>(r)].begin(), out[static_cast<std::size_t>(r)].end(), in[static_cast<std::size_t>(r)].begin());
    naming_the_peer("all_to_all", [&] {
      for (int k = 1; k < n; ++k) {
        const int to = (r + k) % n, from = (r - k + n) % n;
        exchange(to, out[static_cast<std::size_t>(to)], from, in[static_cast<std::size_t>(from)], tag, "all_to_all");
      }
    });
  }

  void barrier() {
    std::int32_t token = 0;
    all_reduce(std::span<std::int32_t>(&token, 1), reduce_op::sum, algorithm::recursive_doubling);
  }

  // Whether every peer passed the same value (a hash of settings or parameters): one 16-byte
  // all-reduce of the value and its complement under max.
  bool all_same(std::uint64_t value) {
    if (world() == 1) return true;
    std::uint64_t extremes[2] = {value, ~value};
    all_reduce(std::span<std::uint64_t>(extremes, 2), reduce_op::max);
    return extremes[0] == value && ~extremes[1] == value;
  }

  // ---- the ring's order ----

  // The ring's order: ring all-reduces and all-gathers pass from order[i] to order[i + 1] (and
  // from the last back to the first) instead of from rank r to r + 1, so a ring laid out along
  // the network's near pairs never crosses a slow link more than it must (collective/ring_order.hpp
  // measures the links and picks one). `order` lists every rank once; every peer must set the
  // same order at the same point, before the same collective (the next ring all-reduce compares
  // them, and fails on every peer where they differ; a peer that sets none where the others set
  // one is not caught: it runs another collective, and waits). The results stay the same on
  // every peer; they may differ in the last bits from the rank-ordered ring's (the segments are
  // summed in another order).
  // Recursive doubling (small buffers) and the other collectives keep their rank order. Empty:
  // rank order. Groups and communicators that replace this one (a new view) start in rank order.
  void set_ring_order(std::vector<int> order) {
    if (!order.empty()) {
      decentrain::detail::check(order.size() == static_cast<std::size_t>(world()), "communicator: a ring order lists ",
                                order.size(), " ranks for a world of ", world());
      std::vector<int> seen(order.size(), 0);
      for (const int r : order) {
        decentrain::detail::check(r >= 0 && r < world() && !seen[static_cast<std::size_t>(r)]++, "communicator: a ring order ",
                                  "must list every rank from 0 to ", world() - 1, " once, got rank ", r,
                                  r >= 0 && r < world() ? " twice" : "");
      }
    }
    ring_ = std::move(order);
    ring_sizes_agreed_ = false;  // (the order is compared with the sizes)
  }
  const std::vector<int>& ring_order() const { return ring_; }
  // This peer's place in the ring, and the rank at place `p` (any integer, taken modulo world):
  // for rings of its own a collective runs over this communicator (a codec's).
  int ring_position() const {
    if (ring_.empty()) return rank();
    decentrain::detail::check(ring_.size() == static_cast<std::size_t>(world()), "communicator: a ring order of ", ring_.size(),
                              " ranks on a world of ", world());
    return static_cast<int>(std::find(ring_.begin(), ring_.end(), rank()) - ring_.begin());
  }
  int ring_at(int p) const {
    const int n = world(), k = (p % n + n) % n;
    return ring_.empty() ? k : ring_[static_cast<std::size_t>(k)];
  }

  // ---- sub-groups ----

  // A communicator over the listed ranks of this one (each listed once; this peer among them),
  // with a tag space of its own (a 32-bit channel hashed from this communicator's, the members
  // and how many groups of these members this peer made before), so a stage's replicas or a
  // Moshpit group can all-reduce while others do too. Every member calls group() with the same
  // ranks, the same number of times; ranks index the group in ascending order. Its bytes also
  // count in this communicator's traffic(). This communicator must outlive the group's and must
  // not move while it exists.
  communicator<transport::any_endpoint> group(std::vector<int> ranks);

  // ---- pairwise messages ----

  // Point to point, for gossip and pipeline stages: messages between two peers keep their order,
  // apart from the collectives' (a tag space of their own, numbered per pair, so they need not
  // be called in the same order on every peer, only matched: the k-th send_to(p) of this peer
  // meets the k-th recv_from(me) of peer p). The receive must be given the exact size.
  template <class T>
  void send_to(int peer, std::span<const T> values) {
    static_assert(std::is_trivially_copyable_v<T>, "send_to: elements must be trivially copyable");
    check_rank(peer, "send_to peer");
    const auto tag = pair_tag(sent_to_, peer);
    naming_the_peer("send_to", [&] { send(peer, tag, values); });
  }
  template <class T>
  void recv_from(int peer, std::span<T> values) {
    static_assert(std::is_trivially_copyable_v<T>, "recv_from: elements must be trivially copyable");
    check_rank(peer, "recv_from peer");
    const auto tag = pair_tag(received_from_, peer);
    naming_the_peer("recv_from", [&] { receive(peer, values, tag, "recv_from"); });
  }
  // The next recv_from(peer) message if it has arrived (true, `values` filled), else false at
  // once: a peer that never waits for another polls its neighbours between steps (AD-PSGD).
  template <class T>
  bool try_recv_from(int peer, std::span<T> values) {
    static_assert(std::is_trivially_copyable_v<T>, "try_recv_from: elements must be trivially copyable");
    check_rank(peer, "try_recv_from peer");
    constexpr std::uint32_t pairwise = 0x70327000u;  // (pair_tag's numbering)
    const auto tag = (static_cast<transport::tag_type>(pairwise ^ channel_) << 32) | (received_from_[peer] + 1);
    std::optional<transport::bytes> m;
    naming_the_peer("try_recv_from", [&] { m = ep_->try_recv(peer, tag); });
    if (!m) return false;
    ++received_from_[peer];
    count_received(m->size());
    check_size(m->size(), values.size_bytes(), peer, "try_recv_from");
    if (!m->empty()) std::memcpy(values.data(), m->data(), m->size());
    return true;
  }
  // The next recv_from(peer) calls will take messages of these sizes in bytes: said before this
  // peer sends its own part of a step (a ring or gossip step), so that a transport that bounds
  // what it queues takes them however far ahead they come (transport::expect).
  void expect_from(int peer, std::span<const std::size_t> sizes) {
    check_rank(peer, "expect_from peer");
    const std::uint32_t next = received_from_[peer];
    constexpr std::uint32_t pairwise = 0x70327000u;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      transport::expect(*ep_, peer,
                        (static_cast<transport::tag_type>(pairwise ^ channel_) << 32) | (next + 1 + static_cast<std::uint32_t>(i)),
                        sizes[i]);
  }
  void expect_from(int peer, std::size_t bytes) { expect_from(peer, std::span<const std::size_t>(&bytes, 1)); }

  // Sends `out` to `peer` and receives the same number of values from it into `in` (a gossip
  // step with one neighbour); both peers call it naming each other.
  template <class T>
  void exchange_with(int peer, std::span<const T> out, std::span<T> in) {
    decentrain::detail::check(out.size() == in.size(), "exchange_with: sends ", out.size(), " values but receives ",
                              in.size());
    check_rank(peer, "exchange_with peer");
    const auto out_tag = pair_tag(sent_to_, peer), in_tag = pair_tag(received_from_, peer);
    naming_the_peer("exchange_with", [&] {
      if (peer == rank()) {
        std::copy(out.begin(), out.end(), in.begin());
        return;
      }
      transport::expect(*ep_, peer, in_tag, in.size_bytes());
      send(peer, out_tag, out);
      receive(peer, in, in_tag, "exchange_with");
    });
  }

  // ---- in the background ----

  // Runs op(c) on a background thread, where c is a communicator of this peer with a tag space
  // of its own, and returns at once; the caller goes on computing (and calling this
  // communicator's collectives) while the transfer proceeds. Every peer starts the same
  // operations in the same order. On simulated links the time it takes overlaps the caller's
  // compute: wait() moves the caller's clock only to when it ended (see in_process::lane). A
  // transport that cannot run a second thread of messages (mpi below MPI_THREAD_MULTIPLE) runs
  // op here, before start returns.
  template <class Op>
    requires std::invocable<Op&, communicator&>
  pending start(Op op) {
    const auto channel = transport::usable_channel(static_cast<std::uint32_t>(decentrain::detail::splitmix64(next_tag()) >> 32) | 1u);
    pending h;
    h.s_ = std::make_unique<pending::state>();
    auto lane = transport::open_lane(*ep_);
    if (!lane) {
      communicator sub(*ep_, opts_, channel ^ channel_);
      sub.ring_ = ring_;
      sub.ring_sizes_agreed_ = ring_sizes_agreed_;
      try {
        op(sub);
      } catch (...) {
        h.s_->error = std::current_exception();
      }
      add(sub.counters_);
      h.s_->done = true;
      return h;
    }
    auto lane_ep = std::make_shared<Endpoint>(std::move(*lane));
    auto lane_counters = std::make_shared<counters>();
    auto* st = h.s_.get();
    st->worker = std::thread([st, lane_ep, lane_counters, opts = opts_, channel = channel ^ channel_,
                              agreed = ring_sizes_agreed_, ring = ring_, op = std::move(op),
                              step = decentrain::detail::this_thread_activity().step]() mutable {
      decentrain::detail::this_thread_activity().step = step;  // the step that started it
      try {
        communicator sub(*lane_ep, opts, channel);
        sub.background_ = true;
        sub.ring_ = std::move(ring);
        sub.ring_sizes_agreed_ = agreed;
        try {
          op(sub);
        } catch (...) {
          *lane_counters = sub.counters_;
          throw;
        }
        *lane_counters = sub.counters_;
      } catch (...) {
        st->error = std::current_exception();
      }
      st->done = true;
    });
    st->finish = [this, lane_ep, lane_counters] {
      transport::rejoin_lane(*ep_, *lane_ep);
      add(*lane_counters);
    };
    st->landed = [this, lane_ep] { return transport::lane_landed(*ep_, *lane_ep); };
    return h;
  }

  // Peers that disagree on the ring's chunk or window sizes would pair the wrong messages (of
  // the same size, from other chunks or steps) and add them up without noticing: before the
  // first ring (or halving and doubling) all-reduce the peers compare the sizes they use, and
  // whether automatic takes halving and doubling for the ring; a codec's all-reduce
  // (encoded_all_reduce) before it takes either. Once, and every peer alike (a collective).
  void agree_on_ring_sizes();

  template <class T>
  pending all_reduce_async(std::span<T> data, reduce_op op = reduce_op::sum) {
    return start([data, op](communicator& c) { c.all_reduce(data, op); });
  }
  template <class T>
  pending broadcast_async(std::span<T> data, int root = 0) {
    return start([data, root](communicator& c) { c.broadcast(data, root); });
  }

 private:
  template <transport::endpoint>
  friend class communicator;

  // A communicator that owns its endpoint (a group's view).
  communicator(Endpoint&& owned, options opts) : owned_(std::make_unique<Endpoint>(std::move(owned))), ep_(owned_.get()), opts_(opts) {
    ring_sizes_agreed_ = false;
  }

  // Bytes go into this communicator's counters and those of the communicators it is a group
  // of, so a world communicator's traffic() includes its groups' (the trainer counts a
  // policy's bytes there, whatever groups the policy forms).
  void count_sent(std::uint64_t n) {
    counters_.bytes_sent += n;
    for (auto* c : rollup_) c->bytes_sent += n;
  }
  void count_received(std::uint64_t n) {
    counters_.bytes_received += n;
    for (auto* c : rollup_) c->bytes_received += n;
  }
  void add(const counters& c) {
    count_sent(c.bytes_sent);
    count_received(c.bytes_received);
  }

  // A peer_error from inside a collective names the collective as its operation (the peer is
  // the world rank the transport saw fail).
  template <class F>
  static void naming_the_peer(const char* operation, F&& f) {
    const decentrain::detail::doing_call doing(operation);  // named by in_process's deadlock report
    try {
      f();
    } catch (const transport::peer_error& e) {
      throw transport::peer_error(e.peer(), operation, e.what(), e.cause());
    }
  }

  // Pairwise messages: their own channel, numbered per peer and direction.
  transport::tag_type pair_tag(std::map<int, std::uint32_t>& numbers, int peer) {
    constexpr std::uint32_t pairwise = 0x70327000u;  // "p2p" (expect_from numbers the same)
    return (static_cast<transport::tag_type>(pairwise ^ channel_) << 32) | ++numbers[peer];
  }

  template <class T>
  void broadcast_tree(std::span<T> data, int root, transport::tag_type tag) {
    const int n = world(), me = (rank() - root + n) % n;  // rank relative to root
    // Binomial tree per chunk (so no message exceeds chunk_bytes): receive from the parent, then
    // forward to children, largest subtree first.
    const std::size_t chunk = std::max<std::size_t>(1, opts_.chunk_bytes / sizeof(T));
    for (std::size_t at = 0; at < data.size() || (at == 0 && data.empty()); at += chunk) {
      auto piece = data.subspan(at, std::min(chunk, data.size() - at));
      int mask = 1;
      while (mask < n) {
        if (me & mask) {
          receive(((me - mask) + root) % n, piece, tag, "broadcast");
          break;
        }
        mask <<= 1;
      }
      for (mask >>= 1; mask > 0; mask >>= 1)
        if (me + mask < n) send((me + mask + root) % n, tag, std::span<const T>(piece));
      if (data.empty()) break;
    }
  }

  template <class T>
  std::vector<T> ring_all_gather(std::span<const T> mine, transport::tag_type tag) {
    const int n = world(), p = ring_position();
    const std::size_t m = mine.size();
    std::vector<T> out(m * static_cast<std::size_t>(n));
    std::copy(mine.begin(), mine.end(), out.begin() + static_cast<std::ptrdiff_t>(m * static_cast<std::size_t>(rank())));
    // (the block of the rank at ring position b: blocks stay in rank order whatever the ring's)
    auto block = [&](int b) { return std::span<T>(out).subspan(m * static_cast<std::size_t>(ring_at(b)), m); };
    for (int s = 0; s < n - 1; ++s) {
      exchange(right(), std::span<const T>(block(p - s)), left(), block(p - s - 1), tag, "all_gather");
    }
    return out;
  }

  int left() const { return ring_at(ring_position() - 1); }
  int right() const { return ring_at(ring_position() + 1); }

  // A collective's tag: the channel in the high 32 bits, the call's number in the low ones.
  transport::tag_type next_tag() {
    ++counters_.calls;
    return fresh_tag();
  }
  transport::tag_type fresh_tag() {
    return (static_cast<transport::tag_type>(channel_) << 32) | static_cast<std::uint32_t>(++sequence_);
  }

  void check_rank(int r, const char* what) const {
    decentrain::detail::check(r >= 0 && r < world(), "communicator: ", what, " ", r, " is outside a world of ", world());
  }

  template <class T>
  void send(int peer, transport::tag_type tag, std::span<const T> values) {
    const auto b = std::as_bytes(values);
    ep_->send(peer, tag, b);
    count_sent(b.size());
  }

  // Sends `out` to `to` (none when `to` < 0) and receives the next message from `from` into
  // `in`, which must be exactly its size. Going through transport::exchange lets a transport
  // that can post `in` before sending land the message there without a copy.
  template <class T>
  void exchange(int to, std::span<const T> out, int from, std::span<T> in, transport::tag_type tag, const char* what) {
    const std::size_t got = transport::exchange(*ep_, to, std::as_bytes(out), from, std::as_writable_bytes(in), tag);
    if (to >= 0) count_sent(out.size_bytes());
    count_received(got);
    check_size(got, in.size_bytes(), from, what);
  }

  static void check_size(std::size_t got, std::size_t expected, int from, const char* what) {
    if (got != expected)
      transport::fail_peer(from, what, what, ": peer ", from, " sent ", got, " bytes where ", expected,
                           " were expected (the peers disagree on the buffer size or call order)");
  }

  template <class T>
  void receive(int from, std::span<T> in, transport::tag_type tag, const char* what) {
    exchange(-1, std::span<const T>(), from, in, tag, what);
  }

  // Where a message to be combined lands: reused across calls, so a ring all-reduce allocates
  // nothing per chunk. Bytes from the network are valid values of any arithmetic T.
  template <class T>
  std::span<T> scratch(std::size_t count) {
    const std::size_t blocks = (count * sizeof(T) + sizeof(scratch_block) - 1) / sizeof(scratch_block);
    if (scratch_.size() < blocks) scratch_.resize(blocks);
    return {reinterpret_cast<T*>(scratch_.data()), count};
  }

  // into = into op from, or from op into when `from_first`: recursive doubling fixes the order
  // so that both partners compute bit for bit the same (max(-0, +0) and NaN payloads depend on
  // the order of the operands).
  template <class T>
  static void combine(std::span<T> into, std::span<const T> from, reduce_op op, bool from_first = false) {
    T* dst = into.data();
    const T* src = from.data();
    const std::size_t n = into.size();
    auto apply = [&](auto f) {
      if (from_first)
        for (std::size_t i = 0; i < n; ++i) dst[i] = f(src[i], dst[i]);
      else
        for (std::size_t i = 0; i < n; ++i) dst[i] = f(dst[i], src[i]);
    };
    switch (op) {
      case reduce_op::sum:
      case reduce_op::average:
        apply([](T a, T b) { return static_cast<T>(a + b); });
        break;
      case reduce_op::max:
        apply([](T a, T b) { return std::max(a, b); });
        break;
      case reduce_op::min:
        apply([](T a, T b) { return std::min(a, b); });
        break;
    }
  }

  template <class T>
  void finish(std::span<T> data, reduce_op op) const {
    if (op != reduce_op::average) return;
    if constexpr (std::is_floating_point_v<T>) {
      const T scale = T(1) / static_cast<T>(world());
      for (auto& v : data) v *= scale;
    } else {
      for (auto& v : data) v /= static_cast<T>(world());
    }
  }

  // Reduce-scatter then all-gather around the ring. The buffer is cut into `world` segments and
  // each segment into chunks. In each of the 2(world - 1) steps every peer sends one segment to
  // its right neighbour and receives one from its left, all its chunks in one exchange: they
  // follow each other on the wire without waiting for replies, so a step costs one latency
  // however many chunks it has (chunk by chunk, a 100 MB all-reduce of 4 peers over 100 ms links
  // would wait 25 x 6 latencies), and each chunk is added in as soon as it lands while the next
  // ones are still arriving. Segments move window_bytes at a time, which bounds the scratch memory.
  // Uneven sizes are fine: segments differ by at most one element, a missing chunk is empty.
  template <class T>
  void ring_all_reduce(std::span<T> data, reduce_op op, transport::tag_type tag);

  // Peers given different counts for a partitioned all-reduce would each reduce a range the
  // others do not send them: before the first one with these counts the peers compare them (a
  // hash, in one small all-reduce), and every peer fails alike when they differ.
  void agree_on_counts(std::span<const std::size_t> counts);

  // Recursive doubling: in round k every peer swaps its partial result with the peer whose rank
  // differs in bit k, and both combine the two, so after log2(P) rounds the P = 2^floor(log2 N)
  // lowest peers all hold the total: log2(P) latencies, where reducing to one peer and
  // broadcasting back takes 2 log2(N) (on a WAN link of 100 ms, 200 ms instead of 400 for 4
  // peers). The N - P peers above P first hand their buffer to peer rank - P and get the total
  // back from it at the end. The lower ranks' part is always the left operand, so every peer
  // ends with the same bits. Each round sends the whole buffer, hence only for small buffers.
  template <class T>
  void recursive_doubling_all_reduce(std::span<T> data, reduce_op op, transport::tag_type tag);
  // Where part k of `total` values cut into n begins (0 <= k <= n): the first total % n parts
  // one value longer (the ring's segments, halving's parts).
  static std::size_t part_begin(std::size_t total, int n, int k) {
    const auto parts = static_cast<std::size_t>(n), at = static_cast<std::size_t>(k);
    return at * (total / parts) + std::min(at, total % parts);
  }
  // Recursive doubling's and halving's worlds of P = 2^floor(log2 N): each of the N - P peers
  // above P hands its buffer to peer rank - P, which combines it in, and takes the result back
  // from it (fold_out). Returns P, or 0 on a peer above it (which holds the result then).
  template <class T>
  int fold_in(std::span<T> data, reduce_op op, transport::tag_type tag) {
    const int n = world(), r = rank(), p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
    if (r >= p) {
      send(r - p, tag, std::span<const T>(data));
      receive(r - p, data, tag, "all_reduce");
      return 0;
    }
    if (r + p < n) {
      const auto in = scratch<T>(data.size());
      receive(r + p, in, tag, "all_reduce");
      combine(data, std::span<const T>(in), op);
    }
    return p;
  }
  template <class T>
  void fold_out(std::span<T> data, transport::tag_type tag, int p) {
    if (rank() + p < world()) send(rank() + p, tag, std::span<const T>(data));
  }
  // Recursive halving, then doubling (Rabenseifner's): a reduce-scatter in log2(P) rounds, in
  // round k every peer sending the half of its range that the peer whose rank differs in bit
  // log2(P) - 1 - k keeps and combining the half it keeps, then an all-gather that retraces the
  // rounds, the ranges doubling. The ring's bytes (2 (P - 1) / P of the buffer each way) in
  // 2 log2(P) latencies where the ring takes 2 (P - 1): on 8 peers over 100 ms links, 0.6 s of
  // latency where the ring waits 1.4 s (but no pipeline of windows: where each peer's links
  // differ, a round waits for its slowest pair). Each part is combined on one peer only and copied from it,
  // so every peer ends with the same bits. The N - P peers above P = 2^floor(log2 N) fold in as
  // with recursive doubling (their whole buffer twice over one link: meant for worlds of 2^k).
  template <class T>
  void halving_doubling_all_reduce(std::span<T> data, reduce_op op, transport::tag_type tag);

  std::unique_ptr<Endpoint> owned_;  // a group's view; empty for a communicator over a given endpoint
  Endpoint* ep_;
  options opts_;
  std::uint32_t channel_ = 0;
  counters counters_;
  std::uint64_t sequence_ = 0;
  bool ring_sizes_agreed_ = false;
  bool background_ = false;  // start()'s op on a lane thread, beside the caller
  std::vector<int> ring_;  // the ring's order (set_ring_order); empty: rank order
  std::optional<std::uint64_t> counts_agreed_;  // the hash of the counts the peers last agreed on
  std::map<int, std::uint32_t> sent_to_, received_from_;
  std::map<std::vector<int>, std::uint32_t> groups_made_;
  std::vector<counters*> rollup_;  // the counters of the communicators this one is a group of
  // A named block rather than std::max_align_t itself: nvcc's front end fails on a vector of
  // that typedef'd anonymous struct.
  struct alignas(std::max_align_t) scratch_block {
    std::byte bytes[alignof(std::max_align_t)];
  };
  std::vector<scratch_block> scratch_;
};

// The members below are defined out of the class, so not inline: a program built with
// DECENTRAIN_COMPILED_LIB takes them for communicator<any_endpoint> (what every policy of the
// trainer uses) and the element types below from the compiled library (see config.hpp).

template <transport::endpoint Endpoint>
communicator<transport::any_endpoint> communicator<Endpoint>::group(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  decentrain::detail::check(std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end(),
                            "communicator: a group lists a rank twice");
  const std::uint32_t earlier = groups_made_[ranks]++;
  const auto channel = group_channel(channel_ ^ static_cast<std::uint32_t>(decentrain::detail::splitmix64(earlier)), ranks);
  std::shared_ptr<Endpoint> parent(std::shared_ptr<Endpoint>{}, ep_);  // not owned
  transport::any_endpoint view(group_view<Endpoint>(parent, std::move(ranks), channel));
  communicator<transport::any_endpoint> g(std::move(view), opts_);
  g.rollup_ = rollup_;
  g.rollup_.push_back(&counters_);
  return g;
}

template <transport::endpoint Endpoint>
template <class T>
void communicator<Endpoint>::ring_all_reduce(std::span<T> data, reduce_op op, transport::tag_type tag) {
  agree_on_ring_sizes();
  const int n = world(), r = ring_position();  // (segments are numbered by ring position)
  const std::size_t total = data.size(), base = total / static_cast<std::size_t>(n),
                    extra = total % static_cast<std::size_t>(n);
  auto seg_begin = [&](int s) { return part_begin(total, n, (s % n + n) % n); };
  auto seg_size = [&](int s) {
    const auto k = static_cast<std::size_t>((s % n + n) % n);
    return base + (k < extra ? 1 : 0);
  };
  const std::size_t chunk = std::max<std::size_t>(1, opts_.chunk_bytes / sizeof(T));
  const std::size_t chunks = (base + (extra ? 1 : 0) + chunk - 1) / chunk;
  const std::size_t window = std::max<std::size_t>(1, opts_.window_bytes / (chunk * sizeof(T)));  // chunks
  auto piece = [&](int s, std::size_t c) {
    const std::size_t size = seg_size(s), from = std::min(size, c * chunk), to = std::min(size, (c + 1) * chunk);
    return data.subspan(seg_begin(s) + from, to - from);
  };
  const auto in = scratch<T>(std::min(chunks, window) * chunk);
  std::vector<std::span<const std::byte>> outs;
  std::vector<std::span<std::byte>> ins;
  // Sends chunks [first, last) of segment `out_seg`, receives those of `in_seg`: added into
  // place when `reduce`, else written there.
  auto step = [&](std::size_t first, std::size_t last, int out_seg, int in_seg, bool reduce) {
    outs.clear();
    ins.clear();
    for (std::size_t c = first; c < last; ++c) {
      outs.push_back(std::as_bytes(piece(out_seg, c)));
      const auto dst = piece(in_seg, c);
      ins.push_back(reduce ? std::as_writable_bytes(in.subspan((c - first) * chunk, dst.size())) : std::as_writable_bytes(dst));
    }
    transport::exchange(*ep_, right(), outs, left(), ins, tag, [&](std::size_t i, std::size_t got) {
      check_size(got, ins[i].size(), left(), "all_reduce");
      count_received(got);
      if (reduce) combine(piece(in_seg, first + i), std::span<const T>(in.subspan(i * chunk, got / sizeof(T))), op);
    });
    for (const auto& o : outs) count_sent(o.size());
  };
  for (std::size_t first = 0; first < chunks; first += window) {
    const std::size_t last = std::min(chunks, first + window);
    for (int s = 0; s < n - 1; ++s) step(first, last, r - s, r - s - 1, true);  // reduce-scatter: segment r+1 ends reduced here
    for (int s = 0; s < n - 1; ++s) step(first, last, r + 1 - s, r - s, false);  // all-gather, straight into place
  }
}

template <transport::endpoint Endpoint>
template <class T>
void communicator<Endpoint>::partitioned_all_reduce(std::span<T> data, std::span<const std::size_t> counts, reduce_op op) {
  static_assert(std::is_arithmetic_v<T>, "partitioned_all_reduce: elements must be arithmetic");
  const int n = world(), r = rank();
  decentrain::detail::check(counts.size() == static_cast<std::size_t>(n), "partitioned_all_reduce: needs one count per peer (",
                            n, "), got ", counts.size());
  std::vector<std::uint64_t> begin(static_cast<std::size_t>(n) + 1, 0);
  for (int q = 0; q < n; ++q) begin[static_cast<std::size_t>(q) + 1] = begin[static_cast<std::size_t>(q)] + counts[static_cast<std::size_t>(q)];
  decentrain::detail::check(begin.back() == data.size(), "partitioned_all_reduce: the counts add up to ", begin.back(),
                            " values, the buffer has ", data.size());
  const auto tag = next_tag(), result_tag = fresh_tag();
  const std::size_t chunk = std::max<std::size_t>(1, opts_.chunk_bytes / sizeof(T));
  auto range = [&](int q) { return data.subspan(begin[static_cast<std::size_t>(q)], counts[static_cast<std::size_t>(q)]); };
  auto piece = [&](int q, std::size_t c) {  // chunk c < chunks(q) of q's range
    const auto all = range(q);
    return all.subspan(c * chunk, std::min(chunk, all.size() - c * chunk));
  };
  auto chunks = [&](int q) { return (counts[static_cast<std::size_t>(q)] + chunk - 1) / chunk; };
  std::size_t most = 0;
  for (int q = 0; q < n; ++q) most = std::max(most, chunks(q));
  const auto mine = range(r);
  naming_the_peer("partitioned_all_reduce", [&] {
    agree_on_counts(counts);
    for (int k = 1; k < n; ++k) {
      const int from = (r - k + n) % n;
      transport::expect(*ep_, from, tag, mine.size_bytes());
      transport::expect(*ep_, from, result_tag, range(from).size_bytes());
    }
    // This peer's values, chunk c of every range before chunk c + 1 of any, so that each peer
    // can reduce and send on its first chunks while the last are on their way (a peer with a
    // slow connection then receives results while it still sends).
    for (std::size_t c = 0; c < most; ++c)
      for (int k = 1; k < n; ++k) {
        const int to = (r + k) % n;
        if (c < chunks(to)) send(to, tag, std::span<const T>(piece(to, c)));
      }
    // This peer's range, chunk by chunk: the others' values added in rank distance order (so the
    // same bits whatever the arrival order), and each reduced chunk sent on at once.
    const auto in = scratch<T>(std::min(chunk, mine.size()));
    for (std::size_t c = 0; c < chunks(r); ++c) {
      const auto reduced = piece(r, c);
      for (int k = 1; k < n; ++k) {
        const auto got = in.first(reduced.size());
        receive((r - k + n) % n, got, tag, "partitioned_all_reduce");
        combine(reduced, std::span<const T>(got), op);
      }
      finish(reduced, op);
      for (int k = 1; k < n; ++k) send((r + k) % n, result_tag, std::span<const T>(reduced));
    }
    for (int k = 1; k < n; ++k) {
      const int from = (r - k + n) % n;
      for (std::size_t c = 0; c < chunks(from); ++c) receive(from, piece(from, c), result_tag, "partitioned_all_reduce");
    }
  });
}

template <transport::endpoint Endpoint>
void communicator<Endpoint>::agree_on_counts(std::span<const std::size_t> counts) {
  std::vector<std::uint64_t> wide(counts.begin(), counts.end());
  const auto hash = decentrain::detail::fnv1a(std::string_view(reinterpret_cast<const char*>(wide.data()), wide.size() * sizeof(std::uint64_t)));
  if (counts_agreed_ == hash) return;
  if (!all_same(hash)) {
    std::string mine;
    for (std::size_t i = 0; i < counts.size() && i < 8; ++i) {
      if (i > 0) mine += ' ';
      mine += std::to_string(counts[i]);
    }
    decentrain::detail::fail("partitioned_all_reduce: the peers were given different counts (peer ", rank(), "'s: ", mine,
                             counts.size() > 8 ? " ..." : "", "): every peer must give the same counts");
  }
  counts_agreed_ = hash;
}

template <transport::endpoint Endpoint>
void communicator<Endpoint>::agree_on_ring_sizes() {
  if (ring_sizes_agreed_) return;
  const auto chunk = static_cast<std::int64_t>(opts_.chunk_bytes), window = static_cast<std::int64_t>(opts_.window_bytes);
  std::vector<std::int64_t> order(ring_.begin(), ring_.end());
  // (62 bits of the order's hash: its negation fits)
  const auto ring = static_cast<std::int64_t>(decentrain::detail::fnv1a(std::string_view(
                                                  reinterpret_cast<const char*>(order.data()), order.size() * sizeof(std::int64_t))) >> 2);
  const std::int64_t halving = opts_.halving_doubling ? 1 : 0;
  std::int64_t sizes[8] = {chunk, window, ring, halving, -chunk, -window, -ring, -halving};  // max, and minus the min
  recursive_doubling_all_reduce(std::span<std::int64_t>(sizes), reduce_op::max, fresh_tag());
  decentrain::detail::check(sizes[0] == -sizes[4] && sizes[1] == -sizes[5],
                            "communicator: the peers use different ring sizes (chunk_bytes from ", -sizes[4], " to ",
                            sizes[0], ", window_bytes from ", -sizes[5], " to ", sizes[1],
                            "): every peer must be given the same collective::options");
  decentrain::detail::check(sizes[3] == -sizes[7], "communicator: the peers set halving_doubling differently (this peer: ",
                            opts_.halving_doubling ? "set" : "not set", "): every peer must be given the same collective::options");
  decentrain::detail::check(sizes[2] == -sizes[6], "communicator: the peers set different ring orders (this peer's: ",
                            ring_.empty() ? std::string("rank order") : describe_order(ring_),
                            "): every peer must set the same (set_ring_order) before the same collective");
  ring_sizes_agreed_ = true;
}

template <transport::endpoint Endpoint>
template <class T>
void communicator<Endpoint>::recursive_doubling_all_reduce(std::span<T> data, reduce_op op, transport::tag_type tag) {
  const int r = rank(), p = fold_in(data, op, tag);
  if (p == 0) return;
  const auto in = scratch<T>(data.size());
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner = r ^ mask;
    exchange(partner, std::span<const T>(data), partner, in, tag, "all_reduce");
    combine(data, std::span<const T>(in), op, partner < r);
  }
  fold_out(data, tag, p);
}

template <transport::endpoint Endpoint>
template <class T>
void communicator<Endpoint>::halving_doubling_all_reduce(std::span<T> data, reduce_op op, transport::tag_type tag) {
  agree_on_ring_sizes();  // (its chunks, and which of it and the ring automatic takes)
  const int r = rank(), p = fold_in(data, op, tag);
  if (p == 0) return;
  // P parts cut as the ring cuts its segments; this peer ends the reduce-scatter holding part r.
  auto at = [&](int k) { return part_begin(data.size(), p, k); };
  auto parts = [&](int lo, int hi) { return data.subspan(at(lo), at(hi) - at(lo)); };
  const std::size_t chunk = std::max<std::size_t>(1, opts_.chunk_bytes / sizeof(T));
  const auto in = scratch<T>(at(p / 2));  // (the largest half kept)
  std::vector<std::span<const std::byte>> outs;
  std::vector<std::span<std::byte>> ins;
  // Sends `out` to `partner` and receives `into`'s values from it, in chunks: combined into
  // place when `reduce`, else written there.
  auto swap = [&](int partner, std::span<const T> out, std::span<T> into, bool reduce) {
    outs.clear();
    ins.clear();
    for (std::size_t at_value = 0; at_value < out.size(); at_value += chunk)
      outs.push_back(std::as_bytes(out.subspan(at_value, std::min(chunk, out.size() - at_value))));
    for (std::size_t at_value = 0; at_value < into.size(); at_value += chunk) {
      const std::size_t size = std::min(chunk, into.size() - at_value);
      ins.push_back(reduce ? std::as_writable_bytes(in.subspan(at_value, size)) : std::as_writable_bytes(into.subspan(at_value, size)));
    }
    transport::exchange(*ep_, partner, outs, partner, ins, tag, [&](std::size_t i, std::size_t got) {
      check_size(got, ins[i].size(), partner, "all_reduce");
      count_received(got);
      if (reduce)
        combine(into.subspan(i * chunk, got / sizeof(T)), std::span<const T>(in.subspan(i * chunk, got / sizeof(T))), op, partner < r);
    });
    for (const auto& o : outs) count_sent(o.size());
  };
  int lo = 0, hi = p;  // the parts this peer holds
  for (int bit = p / 2; bit >= 1; bit /= 2) {  // reduce-scatter: the range halves
    const int partner = r ^ bit, mid = lo + (hi - lo) / 2;
    const bool lower = (r & bit) == 0;
    swap(partner, lower ? parts(mid, hi) : parts(lo, mid), lower ? parts(lo, mid) : parts(mid, hi), true);
    (lower ? hi : lo) = mid;
  }
  for (int bit = 1; bit < p; bit *= 2) {  // all-gather: the range doubles, the partner's part landing in place
    const int partner = r ^ bit, theirs = lo ^ bit, width = hi - lo;
    swap(partner, parts(lo, hi), parts(theirs, theirs + width), false);
    lo = std::min(lo, theirs);
    hi = lo + 2 * width;
  }
  fold_out(data, tag, p);
}

// The element types whose all-reduce the compiled library holds.
#define DECENTRAIN_REDUCIBLE_TYPES(X) X(float) X(double) X(std::int32_t) X(std::int64_t) X(std::uint64_t)

#if defined(DECENTRAIN_COMPILED_LIB)
extern template class communicator<transport::any_endpoint>;
#define DECENTRAIN_EXTERN_ALL_REDUCE(T)                                                                                   \
  extern template void communicator<transport::any_endpoint>::ring_all_reduce<T>(std::span<T>, reduce_op, transport::tag_type); \
  extern template void communicator<transport::any_endpoint>::recursive_doubling_all_reduce<T>(std::span<T>, reduce_op,      \
                                                                                               transport::tag_type);     \
  extern template void communicator<transport::any_endpoint>::halving_doubling_all_reduce<T>(std::span<T>, reduce_op,        \
                                                                                             transport::tag_type);
DECENTRAIN_REDUCIBLE_TYPES(DECENTRAIN_EXTERN_ALL_REDUCE)
#undef DECENTRAIN_EXTERN_ALL_REDUCE
#endif

}  // namespace decentrain::collective
