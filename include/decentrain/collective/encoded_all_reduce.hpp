// The encoded all-reduce: a payload through a codec (compress/), and the check that every peer
// uses the same one. Codecs encode and decode; the collective that carries them is here.
//   ring (dense codecs): reduce-scatter then all-gather around the ring (or, where the
//     communicator's options set halving_doubling, by recursive halving then doubling); each hop carries the
//     encoded partial sum of a segment, the receiver decodes it and adds its own values in f32,
//     and re-encodes for the next hop, so each hop costs one rounding and none compounds
//     silently. Segments are cut at multiples of the codec's block, so a payload that is already
//     on the codec's grid re-encodes to itself. In the all-gather each segment is encoded once
//     by the peer that holds its sum and forwarded as is: every peer decodes the same bytes
//     and ends with the same bits.
//   gathered (the others): every peer's payload goes to every peer, which decodes and adds them
//     in rank order.
// With an aggregator (the policies' slot): the mean sums on the way as above, and only when the
// result holds a non-finite value is the call redone with each contribution seen (so the peer
// that sent it is dropped and named); any other aggregator gets every contribution straight
// from its sender (robust_all_reduce; through a codec: each payload decoded alone).
// Codecs whose round is more than one payload have their collective here too: error feedback
// (the payload put on the codec's grid first), adaptive (probe rounds timed through the codec and
// as f32) and PowerSGD (two all-reduces of factors around its own arithmetic).
// Encoding and decoding are charged to the endpoint as compute (the thread's CPU time), so on
// simulated links a codec pays for its work as it would on a real machine.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "decentrain/collective/aggregators.hpp"
#include "decentrain/collective/communicator.hpp"
#include "decentrain/collective/robust_all_reduce.hpp"
#include "decentrain/compress/adaptive.hpp"
#include "decentrain/compress/codec.hpp"
#include "decentrain/compress/error_feedback.hpp"
#include "decentrain/compress/identity.hpp"
#include "decentrain/compress/powersgd.hpp"
#include "decentrain/detail/clock.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/detail/hash.hpp"
#include "decentrain/transport/peer_error.hpp"

namespace decentrain::collective {

// Fails on every peer, naming the peers' settings, when they do not all use the same codec
// settings (a policy calls it in start()).
template <class Codec, class Comm>
void agree_codec(const Codec& codec, Comm& comm) {
  if (comm.world() == 1) return;
  const std::string mine = compress::describe(codec);
  if (comm.all_same(decentrain::detail::fnv1a(mine))) return;
  // They differ: gather everyone's text (cut to 120 bytes) to say who uses what.
  char text[120] = {};
  std::memcpy(text, mine.data(), std::min(mine.size(), sizeof text - 1));
  const auto all = comm.all_gather(std::span<const char>(text, sizeof text));
  std::string who;
  for (int r = 0; r < comm.world(); ++r)
    who += (r ? ", peer " : "peer ") + std::to_string(r) + " " + std::string(all.data() + static_cast<std::size_t>(r) * sizeof text);
  decentrain::detail::fail("codec: the peers use different codec settings (", who, "); every peer must use the same");
}

// Runs f() and tells the endpoint how long it computed (real transports ignore it; one that
// models a step's compute, transport::step_seconds, counts the codec in it).
template <class Comm, class F>
decltype(auto) charged(Comm& comm, F&& f) {
  struct charge {
    Comm& comm;
    double t0 = decentrain::detail::thread_cpu_seconds();
    ~charge() {
      if (!transport::step_seconds(comm.endpoint()))
        comm.endpoint().computed(std::max(0.0, decentrain::detail::thread_cpu_seconds() - t0));
    }
  } c{comm};
  return f();
}

template <class Codec>
std::size_t codec_block(const Codec& codec) {
  if constexpr (requires { { codec.block } -> std::convertible_to<std::size_t>; })
    return std::max<std::size_t>(1, codec.block);
  else
    return 1;
}

// The all-reduce of every codec, declared before any is defined: a codec's collective calls the
// one of the codec inside it (adaptive<error_feedback<int8>>, powersgd<any_codec>).
template <class Codec, class Comm>
void encoded_all_reduce(Codec& codec, Comm& comm, std::span<float> values, bool average);
template <class Codec, class Comm>
void encoded_all_reduce(compress::error_feedback<Codec>& codec, Comm& comm, std::span<float> values, bool average);
template <class Codec, class Comm>
void encoded_all_reduce(compress::adaptive<Codec>& codec, Comm& comm, std::span<float> values, bool average);
template <class Factors, class Comm>
void encoded_all_reduce(compress::powersgd<Factors>& codec, Comm& comm, std::span<float> values, bool average);

template <class Codec, class Comm>
void gathered_all_reduce(Codec& codec, Comm& comm, std::span<float> values, bool average) {
  const int n = comm.world(), r = comm.rank();
  const std::size_t bound = codec.max_encoded_bytes(values.size());
  std::vector<std::vector<std::byte>> payloads(static_cast<std::size_t>(n));
  auto& mine = payloads[static_cast<std::size_t>(r)];
  mine.resize(bound);
  mine.resize(charged(comm, [&] { return codec.encode(std::span<const float>(values), std::span<std::byte>(mine)); }));
  decentrain::detail::check(mine.size() <= bound, "codec: encode wrote ", mine.size(), " bytes, over its own bound of ", bound);
  if (n > 1) {
    // Sizes first (8 bytes a peer), then each payload at its own size around the ring: a sparse
    // payload is sent as long as it is, not padded to the codec's bound.
    const std::uint64_t size = mine.size();
    const auto sizes = comm.all_gather(std::span<const std::uint64_t>(&size, 1));
    for (int p = 0; p < n; ++p)
      if (sizes[static_cast<std::size_t>(p)] > bound)
        transport::fail_peer(p, "all_reduce", "codec: peer ", p, " sent a payload of ", sizes[static_cast<std::size_t>(p)],
                             " bytes, over the bound of ", bound, " for ", values.size(), " values");
    // Around the ring in its order (communicator::set_ring_order): step s forwards the payload of
    // the peer s places before this one, and receives the one before that.
    const int at_ring = comm.ring_position(), right = comm.ring_at(at_ring + 1), left = comm.ring_at(at_ring - 1);
    auto at = [&](int p) -> std::vector<std::byte>& { return payloads[static_cast<std::size_t>(comm.ring_at(at_ring + p))]; };
    for (int s = 0; s < n - 1; ++s) {
      auto& in = at(-s - 1);
      in.resize(static_cast<std::size_t>(sizes[static_cast<std::size_t>(comm.ring_at(at_ring - s - 1))]));
      comm.expect_from(left, in.size());  // every peer sends first: see transport::expect
      comm.send_to(right, std::span<const std::byte>(at(-s)));
      comm.recv_from(left, std::span<std::byte>(in));
    }
  }
  std::fill(values.begin(), values.end(), 0.0f);
  for (int p = 0; p < n; ++p) {
    try {
      charged(comm, [&] { codec.decode_add(std::span<const std::byte>(payloads[static_cast<std::size_t>(p)]), values); });
    } catch (const decentrain::error& e) {
      transport::fail_peer(p, "all_reduce", "codec: the payload of peer ", p, " was rejected: ", e.what());
    }
  }
  if (average && n > 1) {
    const float scale = 1.0f / static_cast<float>(n);
    for (auto& v : values) v *= scale;
  }
}

namespace detail {
// What the ring and halving and doubling share when they carry a dense codec's payloads: the
// values cut into n parts in whole blocks of the codec (a payload already on the codec's grid
// re-encodes to itself), each sent in pieces of at most ~1M values (one message each), encoded
// and decoded with the time charged as compute, and a payload that breaks the codec's format
// rejected naming its sender.
template <class Codec, class Comm>
class encoded_parts {
 public:
  encoded_parts(Codec& codec, Comm& comm, std::span<float> values, int n)
      : codec_(codec), comm_(comm), values_(values), n_(static_cast<std::size_t>(n)), block_(codec_block(codec)),
        blocks_((values.size() + block_ - 1) / block_), piece_(std::max<std::size_t>(block_, ((std::size_t{1} << 20) / block_) * block_)) {}

  // Parts [lo, hi) (0 <= lo <= hi <= n).
  std::span<float> parts(int lo, int hi) const { return values_.subspan(begin(lo), begin(hi) - begin(lo)); }
  std::vector<std::span<float>> pieces(std::span<float> range) const {
    std::vector<std::span<float>> out;
    for (std::size_t at = 0; at < range.size(); at += piece_) out.push_back(range.subspan(at, std::min(piece_, range.size() - at)));
    return out;
  }
  void encode(std::span<float> p, std::vector<std::byte>& into) {
    into.resize(codec_.max_encoded_bytes(p.size()));
    into.resize(charged(comm_, [&] { return codec_.encode(std::span<const float>(p), into); }));
  }
  void send(int to, std::span<float> range, std::vector<std::byte>& scratch) {
    for (auto p : pieces(range)) {
      encode(p, scratch);
      comm_.send_to(to, std::span<const std::byte>(scratch));
    }
  }
  void receive(int from, std::span<float> p, std::vector<std::byte>& into) {
    into.resize(codec_.max_encoded_bytes(p.size()));
    comm_.recv_from(from, std::span<std::byte>(into));
  }
  void decode_add(int from, std::span<float> p, const std::vector<std::byte>& bytes) {
    try {
      charged(comm_, [&] { codec_.decode_add(std::span<const std::byte>(bytes), p); });
    } catch (const decentrain::error& e) {
      transport::fail_peer(from, "all_reduce", "codec: the payload of peer ", from, " was rejected: ", e.what());
    }
  }
  // `from`'s pieces of `range` added into it (a reduce-scatter's step).
  void receive_add(int from, std::span<float> range, std::vector<std::byte>& scratch) {
    for (auto p : pieces(range)) {
      receive(from, p, scratch);
      decode_add(from, p, scratch);
    }
  }
  // Piece `p` as `from` encoded it, kept in `bytes` to be forwarded as is (an all-gather's step).
  void take(int from, std::span<float> p, std::vector<std::byte>& bytes) {
    receive(from, p, bytes);
    std::fill(p.begin(), p.end(), 0.0f);
    decode_add(from, p, bytes);
  }
  // The sum this peer holds of `range`, encoded once into `carried` (a piece each), and left in
  // place as every peer decodes it.
  void encode_sum(std::span<float> range, std::vector<std::vector<std::byte>>& carried) {
    for (auto p : pieces(range)) {
      encode(p, carried.emplace_back());
      std::fill(p.begin(), p.end(), 0.0f);
      charged(comm_, [&] { codec_.decode_add(std::span<const std::byte>(carried.back()), p); });
    }
  }
  // Every peer sends a step's pieces before it receives the step's: each says first what it
  // will take, so a transport that bounds what it queues takes them whole (transport::expect).
  void expect(int from, std::span<float> range) {
    std::vector<std::size_t> sizes;
    for (auto p : pieces(range)) sizes.push_back(codec_.max_encoded_bytes(p.size()));
    comm_.expect_from(from, std::span<const std::size_t>(sizes));
  }
  void finish(bool average) {
    if (!average) return;
    const float scale = 1.0f / static_cast<float>(n_);
    for (auto& v : values_) v *= scale;
  }

 private:
  std::size_t begin(int k) const {
    const auto at = static_cast<std::size_t>(k), base = blocks_ / n_, extra = blocks_ % n_;
    return std::min(values_.size(), (at * base + std::min(at, extra)) * block_);
  }
  Codec& codec_;
  Comm& comm_;
  std::span<float> values_;
  std::size_t n_, block_, blocks_, piece_;
};
}  // namespace detail

template <class Codec, class Comm>
void ring_all_reduce(Codec& codec, Comm& comm, std::span<float> values, bool average) {
  const int n = comm.world(), r = comm.ring_position();  // (segments numbered by ring position)
  if (n == 1) return;
  detail::encoded_parts<Codec, Comm> e(codec, comm, values, n);
  auto segment = [&](int s) {
    const int k = (s % n + n) % n;
    return e.parts(k, k + 1);
  };
  const int right = comm.ring_at(r + 1), left = comm.ring_at(r - 1);
  std::vector<std::byte> scratch;
  // Reduce-scatter: after n - 1 steps segment r + 1 holds the sum here, in f32.
  for (int s = 0; s < n - 1; ++s) {
    e.expect(left, segment(r - s - 1));
    e.send(right, segment(r - s), scratch);
    e.receive_add(left, segment(r - s - 1), scratch);
  }
  // All-gather: the sum's owner encodes it once; everyone (the owner too) decodes those bytes.
  std::vector<std::vector<std::byte>> carried;
  e.encode_sum(segment(r + 1), carried);
  for (int s = 0; s < n - 1; ++s) {
    e.expect(left, segment(r - s));
    for (const auto& bytes : carried) comm.send_to(right, std::span<const std::byte>(bytes));
    const auto into = e.pieces(segment(r - s));
    carried.resize(into.size());
    for (std::size_t i = 0; i < into.size(); ++i) e.take(left, into[i], carried[i]);
  }
  e.finish(average);
}

// Recursive halving then doubling through a dense codec (the communicator's
// halving_doubling_all_reduce in f32 says why: the ring's bytes in 2 log2(N) latencies): in the
// reduce-scatter each round encodes the half of this peer's range that its partner keeps (one
// rounding a round, log2(N) in all where the ring has N - 1), and the partner decodes it and adds
// its own values in f32; in the all-gather each part is encoded once by the peer that holds its
// sum and forwarded as is, so every peer decodes the same bytes and ends with the same bits.
// Parts are cut as the ring's segments. A world of 2^k.
template <class Codec, class Comm>
void halving_doubling_all_reduce(Codec& codec, Comm& comm, std::span<float> values, bool average) {
  const int n = comm.world(), r = comm.rank();
  decentrain::detail::check(n >= 1 && std::has_single_bit(static_cast<unsigned>(n)), "collective: halving and doubling ",
                            "through a codec needs a world of 2^k peers, not ", n);
  if (n == 1) return;
  detail::encoded_parts<Codec, Comm> e(codec, comm, values, n);
  std::vector<std::byte> scratch;
  int lo = 0, hi = n;  // the parts this peer holds
  for (int bit = n / 2; bit >= 1; bit /= 2) {  // reduce-scatter: the range halves
    const int partner = r ^ bit, mid = lo + (hi - lo) / 2;
    const bool lower = (r & bit) == 0;
    const auto give = lower ? e.parts(mid, hi) : e.parts(lo, mid), keep = lower ? e.parts(lo, mid) : e.parts(mid, hi);
    e.expect(partner, keep);
    e.send(partner, give, scratch);
    e.receive_add(partner, keep, scratch);
    (lower ? hi : lo) = mid;
  }
  // All-gather: part r's sum encoded once here; everyone (this peer too) decodes those bytes.
  std::vector<std::vector<std::vector<std::byte>>> carried(static_cast<std::size_t>(n));  // each part's pieces, encoded
  e.encode_sum(e.parts(r, r + 1), carried[static_cast<std::size_t>(r)]);
  for (int bit = 1; bit < n; bit *= 2) {  // the range doubles
    const int partner = r ^ bit, theirs = lo ^ bit, width = hi - lo;
    e.expect(partner, e.parts(theirs, theirs + width));
    for (int s = lo; s < hi; ++s)
      for (const auto& bytes : carried[static_cast<std::size_t>(s)]) comm.send_to(partner, std::span<const std::byte>(bytes));
    for (int s = theirs; s < theirs + width; ++s)
      for (auto p : e.pieces(e.parts(s, s + 1))) e.take(partner, p, carried[static_cast<std::size_t>(s)].emplace_back());
    lo = std::min(lo, theirs);
    hi = lo + 2 * width;
  }
  e.finish(average);
}

// A dense codec's all-reduce: recursive halving and doubling where the communicator's options
// ask for it in place of the ring (collective::options::halving_doubling, a world of 2^k >= 4),
// else the ring. The peers compare those options first (once), so peers set differently are
// told so, not paired into messages of the wrong sizes.
template <class Codec, class Comm>
void dense_all_reduce(Codec& codec, Comm& comm, std::span<float> values, bool average) {
  if constexpr (requires { comm.agree_on_ring_sizes(); })
    if (comm.world() > 1) comm.agree_on_ring_sizes();
  bool halving = false;
  if constexpr (requires { comm.settings().halving_doubling; })
    halving = comm.settings().halving_doubling && comm.world() >= 4 && std::has_single_bit(static_cast<unsigned>(comm.world()));
  if (halving) halving_doubling_all_reduce(codec, comm, values, average);
  else ring_all_reduce(codec, comm, values, average);
}

// The sum (or mean) of every peer's `values` as sent through `codec`, left in `values` on every
// peer (the same bits on all). identity goes through the communicator's all-reduce, a codec with
// a collective of its own (a user's, any_codec) runs it, a dense one goes around the ring (or by
// halving and doubling: dense_all_reduce), any other is gathered. A payload that breaks the codec's format is rejected naming the peer (a
// transport::peer_error), never decoded out of bounds.
template <class Codec, class Comm>
void encoded_all_reduce(Codec& codec, Comm& comm, std::span<float> values, bool average) {
  static_assert(compress::check_codec<Codec>());
  // A codec chosen at run time (any_codec) dispatches on one communicator type; on another it
  // would fall through to the gathered path, silently slower for dense codecs.
  if constexpr (requires { typename Codec::communicator_type; })
    static_assert(std::is_same_v<Comm, typename Codec::communicator_type>,
                  "collective::encoded_all_reduce: this codec runs on its communicator_type (any_codec: a communicator "
                  "over transport::any_endpoint; wrap the endpoint in one)");
  if constexpr (std::is_same_v<Codec, compress::identity>)
    comm.all_reduce(values, average ? reduce_op::average : reduce_op::sum);
  else if constexpr (requires { codec.all_reduce(comm, values, average); })
    codec.all_reduce(comm, values, average);
  else if constexpr (compress::is_dense<Codec>())
    dense_all_reduce(codec, comm, values, average);
  else
    gathered_all_reduce(codec, comm, values, average);
}

// Error feedback: a dense codec's payload is put on its grid here, with the residual, and the
// ring's first hop re-encodes those values to the same payload; a sparse one is gathered, each
// payload through the feedback's encode.
template <class Codec, class Comm>
void encoded_all_reduce(compress::error_feedback<Codec>& codec, Comm& comm, std::span<float> values, bool average) {
  if constexpr (compress::is_dense<Codec>()) {
    if (comm.world() == 1) return;  // nothing is sent, nothing is lost
    std::vector<std::byte> payload(codec.max_encoded_bytes(values.size()));
    payload.resize(charged(comm, [&] { return codec.encode(std::span<const float>(values), payload); }));
    std::copy(codec.sent().begin(), codec.sent().end(), values.begin());
    dense_all_reduce(codec.codec, comm, values, average);
  } else {
    gathered_all_reduce(codec, comm, values, average);
  }
}

// Adaptive: the round through the codec or as f32 (with what error feedback kept), as the
// codec's plan says; a probe's time is the slowest peer's (an 8-byte all-reduce), so every peer
// makes the same choice.
template <class Codec, class Comm>
void encoded_all_reduce(compress::adaptive<Codec>& codec, Comm& comm, std::span<float> values, bool average) {
  const auto plan = codec.begin_round();
  if constexpr (requires { comm.agree_on_ring_sizes(); })  // (once, and timed in neither probe)
    if (comm.world() > 1) comm.agree_on_ring_sizes();
  const double t0 = comm.endpoint().stats().clock_seconds;
  if (plan.through_codec) {
    encoded_all_reduce(codec.codec, comm, values, average);
  } else {
    if constexpr (requires { codec.codec.flush_into(values); }) codec.codec.flush_into(values);
    compress::identity plain;
    encoded_all_reduce(plain, comm, values, average);
  }
  if (!plan.probe) return;
  double took = comm.endpoint().stats().clock_seconds - t0;
  comm.all_reduce(std::span<double>(&took, 1), reduce_op::max);
  codec.probed(took);
}

// PowerSGD: P through p_codec(), then Q through q_codec(), the codec's arithmetic around them
// charged as compute.
template <class Factors, class Comm>
void encoded_all_reduce(compress::powersgd<Factors>& codec, Comm& comm, std::span<float> values, bool average) {
  codec.ready(values.size());
  if (comm.world() == 1) return;  // nothing is sent, nothing is lost
  const auto first = charged(comm, [&] { return codec.round_first(std::span<const float>(values)); });
  encoded_all_reduce(codec.p_codec(), comm, first, average);
  const auto second = charged(comm, [&] { return codec.round_second(); });
  encoded_all_reduce(codec.q_codec(), comm, second, average);
  charged(comm, [&] { codec.round_finish(values); });
}

// Every peer's payload, straight from its sender, decoded alone and aggregated. A payload the
// codec rejects is left out (verdict malformed) rather than ending the call: one bad peer does
// not stop the others.
template <class Codec, class Aggregator, class Comm>
void gathered_robust_all_reduce(Codec& codec, Comm& comm, std::span<float> values, Aggregator& aggregator,
                                aggregation_record& record, std::optional<double> weight = std::nullopt) {
  const auto weights = exchange_weights(comm, weight);
  const auto n = static_cast<std::size_t>(comm.world()), me = static_cast<std::size_t>(comm.rank());
  const std::size_t bound = codec.max_encoded_bytes(values.size());
  auto& payloads = record.payloads;
  payloads.resize(n);
  auto& mine = payloads[me];
  mine.resize(bound);
  mine.resize(charged(comm, [&] { return codec.encode(std::span<const float>(values), std::span<std::byte>(mine)); }));
  decentrain::detail::check(mine.size() <= bound, "codec: encode wrote ", mine.size(), " bytes, over its own bound of ", bound);
  std::vector<std::uint64_t> sizes(n);
  const std::uint64_t size = mine.size();
  {
    std::vector<std::span<const std::uint64_t>> out(n, std::span<const std::uint64_t>(&size, 1));
    std::vector<std::span<std::uint64_t>> in(n);
    for (std::size_t p = 0; p < n; ++p) in[p] = std::span<std::uint64_t>(&sizes[p], 1);
    comm.all_to_all(std::span<const std::span<const std::uint64_t>>(out), std::span<const std::span<std::uint64_t>>(in));
  }
  for (std::size_t p = 0; p < n; ++p)
    if (sizes[p] > bound)
      transport::fail_peer(static_cast<int>(p), "all_reduce", "codec: peer ", p, " announced a payload of ", sizes[p],
                           " bytes, over the bound of ", bound, " for ", values.size(), " values");
  {
    const std::vector<std::byte> own = mine;
    std::vector<std::span<const std::byte>> out(n, std::span<const std::byte>(own));
    std::vector<std::span<std::byte>> in(n);
    for (std::size_t p = 0; p < n; ++p) {
      payloads[p].resize(static_cast<std::size_t>(sizes[p]));
      in[p] = std::span<std::byte>(payloads[p]);
    }
    comm.all_to_all(std::span<const std::span<const std::byte>>(out), std::span<const std::span<std::byte>>(in));
  }
  auto& ws = record.workspace;
  ws.assign(n * values.size(), 0.0f);
  std::vector<std::span<const float>> parts(n);
  std::vector<verdict> verdicts(n, verdict::kept);
  for (std::size_t p = 0; p < n; ++p) {
    const auto part = std::span<float>(ws).subspan(p * values.size(), values.size());
    parts[p] = part;
    try {
      charged(comm, [&] { codec.decode_add(std::span<const std::byte>(payloads[p]), part); });
    } catch (const decentrain::error&) {
      verdicts[p] = verdict::malformed;
    }
  }
  aggregate_gathered(aggregator, contributions(parts), values, record, verdicts, weights);
}

// all_reduce with an aggregator: `record` keeps what was seen of each peer (and the buffers).
// With `weight` (a policy's `weighted`: the rows this replica took, say), each peer's
// contribution weighs what it says: a mean scales it by weight x world / (the weights' sum) and
// sums on the way (one all-reduce of a number more), any other aggregator gets every weight
// with the contributions (capped: aggregation_record::weight_cap; one that cannot weigh is
// refused: can_weigh).
template <class Codec, class Aggregator, class Comm>
void encoded_all_reduce(Codec& codec, Comm& comm, std::span<float> values, bool average, Aggregator& aggregator,
                aggregation_record& record, std::optional<double> weight = std::nullopt) {
  static_assert(check_aggregator<Aggregator>());
  const float world = static_cast<float>(comm.world());
  if (weight && averages_in_flight(aggregator)) {
    for (const float f = weight_factor(comm, *weight); auto& v : values) v *= f;
    weight.reset();
  }
  if (weight && !can_weigh<Aggregator>())
    decentrain::detail::fail("aggregator '", describe_aggregator(aggregator), "' cannot weigh contributions, ",
                             "which a weighted policy asks for (mean, median, trimmed-mean, centered-clip, bucketing and ",
                             "partitioned of those can)");
  if (averages_in_flight(aggregator)) {
    record.own.assign(values.begin(), values.end());
    encoded_all_reduce(codec, comm, values, average);
    if (detail::all_finite(values)) {
      record.last.peers.assign(static_cast<std::size_t>(comm.world()), verdict::kept);
      record.last.distance.clear();  // summed on the way: nothing seen of each peer
      record.last.far.clear();
      record.tally.add(record.last);
      return;
    }
    // Every peer holds the same sum, so all of them come here together.
    std::copy(record.own.begin(), record.own.end(), values.begin());
    mean m;
    gathered_robust_all_reduce(codec, comm, values, m, record);
  } else if (compress::describe(codec) == "identity") {
    robust_all_reduce(aggregator, comm, values, record, weight);
  } else {
    decentrain::detail::check(!is_partitioned(aggregator), "aggregator '", describe_aggregator(aggregator),
                              "' aggregates per partition, which sends f32 values: use it with the identity codec, not '",
                              compress::describe(codec), "'");
    gathered_robust_all_reduce(codec, comm, values, aggregator, record, weight);
  }
  if (!average)
    for (auto& v : values) v *= world;
}

}  // namespace decentrain::collective
