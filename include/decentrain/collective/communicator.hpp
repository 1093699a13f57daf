// Collectives over any transport endpoint: all-reduce (a chunked, pipelined ring for large
// buffers; recursive doubling for small ones), broadcast, all-gather and barrier. Every peer must
// call the same collectives in the same order with the same sizes; a size that disagrees is
// reported as an error naming the peer, never trusted.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/endpoint.hpp"

namespace decentrain::collective {

enum class reduce_op { sum, average, max, min };
enum class algorithm { automatic, ring, recursive_doubling };

struct options {
  std::size_t chunk_bytes = std::size_t{1} << 20;        // ring pipeline granularity
  // automatic: recursive doubling under this size, the ring from it on. Over loopback with 4
  // peers recursive doubling was 2x faster at 64 KiB and 1.4x at 256 KiB, the ring 1.3x faster
  // at 1 MiB (bench/RESULTS.md). On high-latency links the crossover is higher (with 100 ms and
  // 100 Mbit/s, about 10 MB for 4 peers): raise it there.
  std::size_t recursive_doubling_below_bytes = std::size_t{512} << 10;
};

// Bytes this communicator's collectives put on the wire (payload only).
struct counters {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::uint64_t calls = 0;
};

template <transport::endpoint Endpoint>
class communicator {
 public:
  explicit communicator(Endpoint& ep, options opts = {}) : ep_(&ep), opts_(opts) {
    decentrain::detail::check(opts.chunk_bytes > 0, "communicator: chunk_bytes must be > 0");
  }

  int rank() const { return ep_->rank(); }
  int world() const { return ep_->world(); }
  Endpoint& endpoint() { return *ep_; }
  const counters& traffic() const { return counters_; }

  template <class T>
  void all_reduce(std::span<T> data, reduce_op op = reduce_op::sum, algorithm algo = algorithm::automatic) {
    static_assert(std::is_arithmetic_v<T>, "all_reduce: elements must be arithmetic");
    const auto tag = next_tag();
    if (world() == 1) return finish(data, op);
    if (algo == algorithm::automatic)
      algo = data.size_bytes() < opts_.recursive_doubling_below_bytes || data.size() < static_cast<std::size_t>(world())
                 ? algorithm::recursive_doubling
                 : algorithm::ring;
    if (algo == algorithm::ring)
      ring_all_reduce(data, op, tag);
    else
      recursive_doubling_all_reduce(data, op, tag);
    finish(data, op);
  }

  // Every peer ends with root's values.
  template <class T>
  void broadcast(std::span<T> data, int root = 0) {
    static_assert(std::is_trivially_copyable_v<T>, "broadcast: elements must be trivially copyable");
    check_rank(root, "broadcast root");
    const auto tag = next_tag();
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

  // Concatenation of every peer's `mine` in rank order; all peers give the same size.
  template <class T>
  std::vector<T> all_gather(std::span<const T> mine) {
    static_assert(std::is_trivially_copyable_v<T>, "all_gather: elements must be trivially copyable");
    const auto tag = next_tag();
    const int n = world(), r = rank();
    const std::size_t m = mine.size();
    std::vector<T> out(m * static_cast<std::size_t>(n));
    std::copy(mine.begin(), mine.end(), out.begin() + static_cast<std::ptrdiff_t>(m * static_cast<std::size_t>(r)));
    auto block = [&](int b) { return std::span<T>(out).subspan(m * static_cast<std::size_t>((b % n + n) % n), m); };
    for (int s = 0; s < n - 1; ++s) {
      exchange(right(), std::span<const T>(block(r - s)), left(), block(r - s - 1), tag, "all_gather");
    }
    return out;
  }

  void barrier() {
    std::int32_t token = 0;
    all_reduce(std::span<std::int32_t>(&token, 1), reduce_op::sum, algorithm::recursive_doubling);
  }

 private:
  int left() const { return (rank() - 1 + world()) % world(); }
  int right() const { return (rank() + 1) % world(); }

  transport::tag_type next_tag() {
    ++counters_.calls;
    return ++sequence_;
  }

  void check_rank(int r, const char* what) const {
    decentrain::detail::check(r >= 0 && r < world(), "communicator: ", what, " ", r, " is outside a world of ", world());
  }

  template <class T>
  void send(int peer, transport::tag_type tag, std::span<const T> values) {
    const auto b = std::as_bytes(values);
    ep_->send(peer, tag, b);
    counters_.bytes_sent += b.size();
  }

  // Sends `out` to `to` (none when `to` < 0) and receives the next message from `from` into
  // `in`, which must be exactly its size. Going through transport::exchange lets a transport
  // that can post `in` before sending land the message there without a copy.
  template <class T>
  void exchange(int to, std::span<const T> out, int from, std::span<T> in, transport::tag_type tag, const char* what) {
    const std::size_t got = transport::exchange(*ep_, to, std::as_bytes(out), from, std::as_writable_bytes(in), tag);
    if (to >= 0) counters_.bytes_sent += out.size_bytes();
    counters_.bytes_received += got;
    decentrain::detail::check(got == in.size_bytes(), what, ": peer ", from, " sent ", got, " bytes where ", in.size_bytes(),
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
  // each segment into chunks; for each chunk index both phases run before the next, so a chunk
  // moves on as soon as it is reduced instead of waiting for its whole segment (pipelining).
  // Uneven sizes are fine: segments differ by at most one element, a missing chunk is empty.
  template <class T>
  void ring_all_reduce(std::span<T> data, reduce_op op, transport::tag_type tag) {
    const int n = world(), r = rank();
    const std::size_t total = data.size(), base = total / static_cast<std::size_t>(n),
                      extra = total % static_cast<std::size_t>(n);
    auto seg_begin = [&](int s) {
      const auto k = static_cast<std::size_t>((s % n + n) % n);
      return k * base + std::min(k, extra);
    };
    auto seg_size = [&](int s) {
      const auto k = static_cast<std::size_t>((s % n + n) % n);
      return base + (k < extra ? 1 : 0);
    };
    const std::size_t chunk = std::max<std::size_t>(1, opts_.chunk_bytes / sizeof(T));
    const std::size_t chunks = (base + (extra ? 1 : 0) + chunk - 1) / chunk;
    auto piece = [&](int s, std::size_t c) {
      const std::size_t size = seg_size(s), from = std::min(size, c * chunk), to = std::min(size, (c + 1) * chunk);
      return data.subspan(seg_begin(s) + from, to - from);
    };
    for (std::size_t c = 0; c < chunks; ++c) {
      for (int s = 0; s < n - 1; ++s) {  // reduce-scatter: segment r+1 ends fully reduced here
        auto into = piece(r - s - 1, c);
        auto in = scratch<T>(into.size());
        exchange(right(), std::span<const T>(piece(r - s, c)), left(), in, tag, "all_reduce");
        combine(into, std::span<const T>(in), op);
      }
      for (int s = 0; s < n - 1; ++s)  // all-gather of the reduced segments, straight into place
        exchange(right(), std::span<const T>(piece(r + 1 - s, c)), left(), piece(r - s, c), tag, "all_reduce");
    }
  }

  // Recursive doubling: in round k every peer swaps its partial result with the peer whose rank
  // differs in bit k, and both combine the two, so after log2(P) rounds the P = 2^floor(log2 N)
  // lowest peers all hold the total: log2(P) latencies, where reducing to one peer and
  // broadcasting back takes 2 log2(N) (on a WAN link of 100 ms, 200 ms instead of 400 for 4
  // peers). The N - P peers above P first hand their buffer to peer rank - P and get the total
  // back from it at the end. The lower ranks' part is always the left operand, so every peer
  // ends with the same bits. Each round sends the whole buffer, hence only for small buffers.
  template <class T>
  void recursive_doubling_all_reduce(std::span<T> data, reduce_op op, transport::tag_type tag) {
    const int n = world(), r = rank();
    const int p = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
    if (r >= p) {
      send(r - p, tag, std::span<const T>(data));
      receive(r - p, data, tag, "all_reduce");
      return;
    }
    auto in = scratch<T>(data.size());
    if (r + p < n) {
      receive(r + p, in, tag, "all_reduce");
      combine(data, std::span<const T>(in), op);
    }
    for (int mask = 1; mask < p; mask <<= 1) {
      const int partner = r ^ mask;
      exchange(partner, std::span<const T>(data), partner, in, tag, "all_reduce");
      combine(data, std::span<const T>(in), op, partner < r);
    }
    if (r + p < n) send(r + p, tag, std::span<const T>(data));
  }

  Endpoint* ep_;
  options opts_;
  counters counters_;
  transport::tag_type sequence_ = 0;
  // A named block rather than std::max_align_t itself: nvcc's front end fails on a vector of
  // that typedef'd anonymous struct.
  struct alignas(std::max_align_t) scratch_block {
    std::byte bytes[alignof(std::max_align_t)];
  };
  std::vector<scratch_block> scratch_;
};

}  // namespace decentrain::collective
