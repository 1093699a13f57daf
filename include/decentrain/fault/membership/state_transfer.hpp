// A state transfer: members behind (and joiners) take the state of members at the target, in
// chunks from several donors at once, each chunk landing in the taker's own tensor of its name
// where it has one (the offer says where each lies), every chunk checked.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/detail/hash.hpp"
#include "decentrain/fault/membership/messages.hpp"
#include "decentrain/fault/membership/view.hpp"
#include "decentrain/io/checkpoint.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/peer_error.hpp"

namespace decentrain::fault {

// Which members serve the state to those behind: members at the target (not behind), at most
// `max_donors`, from the agreed donor on in the order of the view (wrapping around), so that
// the donors turn with the agreed one.
inline std::vector<int> donors_of(const decision& d, int max_donors) {
  std::vector<int> out;
  if (d.donor < 0) return out;
  std::vector<int> at_target;
  for (int j : d.next.members)
    if (std::find(d.behind.begin(), d.behind.end(), j) == d.behind.end()) at_target.push_back(j);
  const auto first = std::find(at_target.begin(), at_target.end(), d.donor);
  if (first == at_target.end()) return {d.donor};
  const auto at = static_cast<std::size_t>(first - at_target.begin());
  for (std::size_t k = 0; k < at_target.size() && static_cast<int>(out.size()) < max_donors; ++k)
    out.push_back(at_target[(at + k) % at_target.size()]);
  return out;
}

namespace detail {

// A donor's offer: its encoded state's size, its checksum, where each chunk ends (at the
// encoding's pieces, at most state_chunk_bytes), (when there are several donors) each chunk's
// XXH3, so that a peer behind can tell which chunks other donors hold alike, and where each
// tensor's bytes lie, so that a peer behind lands them in its own tensor of that name.
struct state_offer {
  std::uint64_t size = 0, checksum = 0;
  std::vector<std::uint64_t> ends, hashes;
  std::vector<io::encoded_checkpoint::placed_tensor> tensors;
  std::uint64_t chunks() const { return ends.size(); }
  std::uint64_t begin(std::uint64_t i) const { return i == 0 ? 0 : ends[static_cast<std::size_t>(i - 1)]; }
  std::uint64_t length(std::uint64_t i) const { return ends[static_cast<std::size_t>(i)] - begin(i); }
  bool same_layout(const state_offer& o) const { return size == o.size && ends == o.ends; }
};

// A tensor of a longer name is not placed (a taker receives it in its buffer).
inline constexpr std::size_t max_tensor_name_bytes = 4096;

// Words: size, checksum, chunks, hashes (0 or 1), tensors; each chunk's end; each chunk's hash;
// per tensor: where, bytes, the name's length, the name (padded to 8 bytes).
inline std::string encode_offer(const state_offer& o) {
  std::string b;
  auto word = [&](std::uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); };
  for (const std::uint64_t v : {o.size, o.checksum, std::uint64_t{o.ends.size()}, std::uint64_t{o.hashes.empty() ? 0u : 1u},
                                std::uint64_t{o.tensors.size()}})
    word(v);
  for (const auto v : o.ends) word(v);
  for (const auto v : o.hashes) word(v);
  for (const auto& t : o.tensors) {
    word(t.at);
    word(t.bytes);
    word(t.name.size());
    b += t.name;
    b.append((8 - t.name.size() % 8) % 8, '\0');
  }
  return b;
}

inline state_offer decode_offer(const transport::bytes& b, int from, const agreement_settings& s) {
  state_offer o;
  std::size_t at = 0;
  auto malformed = [&](const auto&... what) {
    transport::fail_peer(from, "state", "elastic: peer ", from, " sent a state offer of ", b.size(), " bytes", what...);
  };
  auto word = [&] {
    if (b.size() - at < 8) malformed(", cut short at byte ", at);
    std::uint64_t v = 0;
    std::memcpy(&v, b.data() + at, 8);
    at += 8;
    return v;
  };
  if (b.size() < 40 || b.size() % 8 != 0) malformed();
  o.size = word();
  o.checksum = word();
  const std::uint64_t n = word(), hashed = word(), placed = word();
  if (o.size > s.max_state_bytes)
    transport::fail_peer(from, "state", "elastic: peer ", from, " announced a state of ", o.size, " bytes (at most ",
                         s.max_state_bytes, " are accepted: agreement_settings::max_state_bytes)");
  const std::uint64_t words = (b.size() - at) / 8;
  // (Chunks are asked for by 32-bit index.)
  if (n == 0 || n >= (std::uint64_t{1} << 32) || hashed > 1 || n > words / (1 + hashed) || placed > n)
    malformed(" (", n, " chunks, ", placed, " tensors)");
  o.ends.resize(static_cast<std::size_t>(n));
  for (auto& e : o.ends) e = word();
  for (std::uint64_t i = 0; i < n; ++i)
    if (o.ends[static_cast<std::size_t>(i)] <= o.begin(i) || (i + 1 == n && o.ends.back() != o.size))
      transport::fail_peer(from, "state", "elastic: peer ", from, " sent a state offer whose chunk ", i, " ends at ",
                           o.ends[static_cast<std::size_t>(i)], " (chunks must follow one another to the state's ", o.size,
                           " bytes)");
  if (hashed) {
    o.hashes.resize(static_cast<std::size_t>(n));
    for (auto& h : o.hashes) h = word();
  }
  std::uint64_t after = 0;  // where the previous tensor ends: they follow one another
  for (std::uint64_t k = 0; k < placed; ++k) {
    io::encoded_checkpoint::placed_tensor t;
    t.at = word();
    t.bytes = word();
    const std::uint64_t name = word();
    if (t.at < after || t.bytes == 0 || t.at > o.size || t.bytes > o.size - t.at || name > max_tensor_name_bytes ||
        b.size() - at < (name + 7) / 8 * 8)
      malformed(", tensor ", k, " of ", t.bytes, " bytes at ", t.at, " with a name of ", name, " bytes");
    t.name.assign(reinterpret_cast<const char*>(b.data() + at), static_cast<std::size_t>(name));
    at += static_cast<std::size_t>((name + 7) / 8 * 8);
    after = t.at + t.bytes;
    o.tensors.push_back(std::move(t));
  }
  if (at != b.size()) malformed(", ", b.size() - at, " of them after its end");
  return o;
}

// Which donor serves each chunk to each peer behind, the same on every one of them (they all
// hold the same offers): each peer behind takes the state of its own donor (the donors in turn:
// DiLoCo's members at one step share their global parameters but not their inner optimizer's
// moments), and a chunk that other donors hold alike (the same hash) goes to whichever of them
// has been given the fewest bytes so far. Returns, for peer behind `place`, the chunks to ask
// of each donor (indices into offers).
inline std::vector<std::vector<std::uint32_t>> assign_chunks(const std::vector<state_offer>& offers, std::size_t behind,
                                                            std::size_t place, std::uint64_t epoch) {
  const std::size_t n = offers.size();
  std::vector<std::uint64_t> load(n, 0);
  std::vector<std::vector<std::uint32_t>> mine(n);
  for (std::size_t p = 0; p <= place && p < behind; ++p) {
    const std::size_t own = static_cast<std::size_t>((p + epoch) % n);
    const auto& ref = offers[own];
    for (std::uint64_t i = 0; i < ref.chunks(); ++i) {
      const std::uint64_t len = ref.length(i);
      std::size_t best = ref.hashes.empty() ? own : n;  // n: none yet (own holds every chunk)
      if (!ref.hashes.empty())
        for (std::size_t t = 0; t < n; ++t) {
          const std::size_t k = (own + t + static_cast<std::size_t>(i)) % n;  // ties: each chunk starts elsewhere
          const bool holds = k == own || (offers[k].same_layout(ref) && !offers[k].hashes.empty() &&
                                          offers[k].hashes[static_cast<std::size_t>(i)] == ref.hashes[static_cast<std::size_t>(i)]);
          if (holds && (best == n || load[k] < load[best])) best = k;
        }
      load[best] += len;
      if (p == place) mine[best].push_back(static_cast<std::uint32_t>(i));
    }
  }
  return mine;
}

}  // namespace detail

// An encoded state as received: each tensor's bytes landed in this peer's own tensor of that
// name and size (`own`: views of its memory, io::checkpoint::views), where there is one, so that
// nothing is allocated for them (fresh memory is what a large heal pays for most on a VM:
// bench/RESULTS.md, the heal of a GPT-2 124M state); the rest (names, counters, tensors it has
// not) in a buffer, not zeroed first (the chunks land in it straight from the sockets).
class received_state {
 public:
  // Where each chunk of `offer` lands: in `own`'s tensor of the name the offer places it in, when
  // that tensor has as many bytes and is contiguous, else in the buffer.
  received_state(const detail::state_offer& offer, io::checkpoint own) : own_(std::move(own)) {
    std::map<std::string_view, const tensor<cpu>*> mine;
    for (const auto& [name, t] : own_.tensors)
      if (t.defined() && t.is_contiguous() && t.nbytes() > 0) mine.emplace(name, &t);
    // Per chunk: the tensor it lies in (the offer's are in order), or none: the buffer.
    std::vector<std::pair<char*, std::size_t>> where(static_cast<std::size_t>(offer.chunks()), {nullptr, 0});
    std::size_t placed = 0;
    for (std::uint64_t i = 0; i < offer.chunks(); ++i) {
      const std::uint64_t from = offer.begin(i), len = offer.length(i);
      while (placed < offer.tensors.size() && offer.tensors[placed].at + offer.tensors[placed].bytes <= from) ++placed;
      auto& w = where[static_cast<std::size_t>(i)];
      if (placed < offer.tensors.size() && offer.tensors[placed].at <= from &&
          from + len <= offer.tensors[placed].at + offer.tensors[placed].bytes) {
        const auto& t = offer.tensors[placed];
        const auto it = mine.find(t.name);
        if (it != mine.end() && it->second->nbytes() == t.bytes) {
          w.first = static_cast<char*>(it->second->raw_data()) + (from - t.at);
          landed_ += len;
          continue;
        }
      }
      w.second = buffered_;
      buffered_ += static_cast<std::size_t>(len);
    }
    for (const auto& t : offer.tensors) {
      const auto it = mine.find(t.name);
      tensors_buffered_ += it == mine.end() || it->second->nbytes() != t.bytes ? 1 : 0;
    }
    buffer_ = std::make_unique_for_overwrite<char[]>(buffered_);
    for (std::uint64_t i = 0; i < offer.chunks(); ++i) {
      const auto& w = where[static_cast<std::size_t>(i)];
      chunks_.emplace_back(w.first ? w.first : buffer_.get() + w.second, static_cast<std::size_t>(offer.length(i)));
    }
  }

  // Where chunk i lands.
  std::span<char> chunk(std::size_t i) { return chunks_[i]; }
  // Bytes that landed in this peer's own tensors, and tensors of the state that did not (this
  // peer has none of that name and size).
  std::uint64_t landed_bytes() const { return landed_; }
  std::size_t tensors_buffered() const { return tensors_buffered_; }
  bool in_place() const { return landed_ > 0 && tensors_buffered_ == 0; }
  // The state received, in order (io::decode_checkpoint), and what to decode it into: this
  // peer's own tensors, the ones its bytes landed in among them.
  std::vector<std::string_view> pieces() const {
    std::vector<std::string_view> out;
    for (const auto c : chunks_) {
      if (!out.empty() && out.back().data() + out.back().size() == c.data())
        out.back() = std::string_view(out.back().data(), out.back().size() + c.size());  // contiguous: one piece
      else
        out.emplace_back(c.data(), c.size());
    }
    return out;
  }
  const io::checkpoint& into() const { return own_; }

 private:
  io::checkpoint own_;
  std::unique_ptr<char[]> buffer_;
  std::size_t buffered_ = 0;
  std::vector<std::span<char>> chunks_;
  std::uint64_t landed_ = 0;
  std::size_t tensors_buffered_ = 0;
};

// What a state transfer did on this peer.
struct transfer_report {
  std::optional<received_state> state;  // the encoded state it received (it was behind)
  std::uint64_t bytes_served = 0;     // what it sent as a donor
  std::vector<int> donors;            // receiving: the donors it took chunks from
  int reference = -1;                 // receiving: the donor whose state it took (the others served chunks alike)
  std::map<int, std::string> named;   // receiving: donors whose chunk failed its hash, and which (taken from another)
};

namespace detail {

// A request's chunk indices on the wire: 32-bit words.
template <class E>
std::vector<std::uint32_t> read_request(E& ep, int from, std::uint64_t chunks, std::chrono::milliseconds timeout) {
  const auto request = ep.recv_within(from, state_tag, timeout);
  const std::size_t n = request.size() / 4;
  if (request.size() % 4 != 0 || n > chunks)
    transport::fail_peer(from, "state", "elastic: peer ", from, " sent a malformed state request of ", request.size(), " bytes");
  std::vector<std::uint32_t> out(n);
  for (std::size_t k = 0; k < n; ++k) {
    std::memcpy(&out[k], request.data() + 4 * k, 4);
    if (out[k] >= chunks) transport::fail_peer(from, "state", "elastic: peer ", from, " asked for chunk ", out[k], " of ", chunks);
  }
  return out;
}

}  // namespace detail

// Members behind take the state of members at the target, in chunks from several donors at once
// (hivemind #169: every joiner hit one donor). Each donor offers its encoded state (`state()`,
// read in place chunk by chunk: it must not change until this returns) with its checksum, where
// each of its tensors lies and each chunk's hash; each member behind takes the state of one
// donor (the donors in turn), asking the other donors for the chunks they hold alike
// (detail::assign_chunks), and checks each chunk's hash as it lands: a donor whose chunk does
// not hash as its offer said is named, and the chunk is asked again of a donor whose offer holds
// it alike (a second request, empty when nothing failed); with none, the transfer fails naming
// the donor. The decode verifies the whole. The result is always one donor's state, bit for bit.
//
// With `own` (views of this peer's memory: io::checkpoint::views), a member behind lands each
// tensor's chunks in its own tensor of that name and size (received_state), and sets *torn
// before the first lands: until the caller has loaded a state taken whole, this peer's own state
// is not whole, and a view that has it at the target (no member left to take the state from)
// makes this throw rather than go on from it.
template <class E>
transfer_report transfer_state(E& ep, const decision& d, const std::function<io::encoded_checkpoint()>& state,
                               const agreement_settings& s, const std::function<io::checkpoint()>& own = {},
                               bool* torn = nullptr) {
  using decentrain::detail::check;
  transfer_report out;
  const int me = ep.rank();
  const auto place = std::find(d.behind.begin(), d.behind.end(), me);
  check(!torn || !*torn || place != d.behind.end(), "elastic: peer ", me,
        "'s state was overwritten in part by a state transfer that failed, and view ", d.next.epoch,
        " has no member ahead of it to take the state from again; it stops rather than train on a torn state (its "
        "checkpoints are intact)");
  if (d.behind.empty()) return out;
  const auto donors = donors_of(d, std::max(s.max_donors, 1));
  check(!donors.empty(), "elastic: members are behind but no member is at the target (no donor)");
  const bool donor = std::find(donors.begin(), donors.end(), me) != donors.end();

  if (donor) {
    const io::encoded_checkpoint blob = state();
    std::string scratch;  // (unused: every chunk lies in one piece)
    detail::state_offer offer;
    offer.size = blob.size();
    offer.checksum = blob.checksum();
    offer.tensors = blob.placed_tensors();
    std::erase_if(offer.tensors, [](const auto& t) { return t.name.size() > detail::max_tensor_name_bytes; });  // sent whole
    // Chunks end at the encoding's pieces and are small enough that several donors share a small
    // state, at most state_chunk_bytes.
    const std::uint64_t spread = (offer.size + 4 * donors.size() - 1) / (4 * donors.size());
    const std::uint64_t most = std::max<std::uint64_t>(std::min<std::uint64_t>(s.state_chunk_bytes, spread), 1024);
    for (const std::uint64_t end : blob.piece_ends()) {
      for (std::uint64_t at = offer.ends.empty() ? 0 : offer.ends.back(); end - at > most; at += most) offer.ends.push_back(at + most);
      offer.ends.push_back(end);
    }
    const std::uint64_t chunks = offer.chunks();
    auto chunk_bytes = [&](std::uint64_t i) { return blob.bytes(offer.begin(i), static_cast<std::size_t>(offer.length(i)), scratch); };
    // Every chunk's hash, so that each is checked as it lands (and, with several donors, chunks
    // held alike are told apart from those that differ).
    for (std::uint64_t i = 0; i < chunks; ++i) offer.hashes.push_back(decentrain::detail::xxh3(chunk_bytes(i)));
    const auto encoded = detail::encode_offer(offer);
    for (int j : d.behind) ep.send(j, detail::state_tag, std::as_bytes(std::span(encoded)));
    auto serve = [&](int j, const std::vector<std::uint32_t>& asked) {
      for (const auto i : asked) {
        const auto bytes = chunk_bytes(i);
        ep.send(j, detail::state_tag, std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
        out.bytes_served += bytes.size();
      }
    };
    const auto began = transport::now(ep);
    for (int j : d.behind) serve(j, detail::read_request(ep, j, chunks, s.timeout));
    // Then what failed its hash elsewhere (each taker asks once it holds every chunk: a while
    // after this donor served it, as long again as its other donors took).
    const auto served = std::chrono::duration_cast<std::chrono::milliseconds>(transport::now(ep) - began);
    for (int j : d.behind) serve(j, detail::read_request(ep, j, chunks, s.timeout + 2 * static_cast<int>(donors.size()) * served));
  }
  if (place == d.behind.end()) return out;

  // This peer's own tensors, to land the state in (taken while the donors encode theirs).
  io::checkpoint mine = own ? own() : io::checkpoint{};
  std::vector<detail::state_offer> offers;
  for (int j : donors) offers.push_back(detail::decode_offer(ep.recv_within(j, detail::state_tag, s.timeout), j, s));
  const auto p = static_cast<std::size_t>(place - d.behind.begin());
  const auto asks = detail::assign_chunks(offers, d.behind.size(), p, d.next.epoch);
  const std::size_t reference = static_cast<std::size_t>((p + d.next.epoch) % offers.size());
  const auto& ref = offers[reference];
  out.reference = donors[reference];
  if (ref.hashes.size() != ref.chunks())
    transport::fail_peer(donors[reference], "state", "elastic: the state offer of peer ", donors[reference], " has no hash for each chunk");
  for (std::size_t k = 0; k < donors.size(); ++k) {
    // The donors serve at once and land one after the other: what a later one sends waits in
    // the transport, which takes it beyond its budget as expected here (transport::expect).
    std::uint64_t due = 0;
    for (const auto i : asks[k]) due += offers[k].length(i);
    transport::expect(ep, donors[k], detail::state_tag, due);
    ep.send(donors[k], detail::state_tag, std::as_bytes(std::span(asks[k])));
    if (!asks[k].empty()) out.donors.push_back(donors[k]);
  }
  received_state got(ref, std::move(mine));
  if (got.landed_bytes() > 0) {
    check(torn != nullptr, "elastic: transfer_state lands a state in this peer's own tensors only given `torn`");
    *torn = true;
  }
  // Each donor's chunks land straight where they go (transport::exchange posts the memory), one
  // donor after the other; what the others send meanwhile the transport queues. Returns the
  // chunks that did not hash as the reference offer says.
  auto take = [&](std::size_t k, const std::vector<std::uint32_t>& asked) {
    std::vector<std::uint32_t> failed;
    if (asked.empty()) return failed;
    std::vector<std::span<std::byte>> ins;
    for (const auto i : asked) ins.push_back(std::as_writable_bytes(got.chunk(i)));
    std::vector<std::size_t> sizes(ins.size(), 0);
    transport::exchange(ep, -1, {}, donors[k], ins, detail::state_tag, [&](std::size_t n, std::size_t size) { sizes[n] = size; });
    for (std::size_t n = 0; n < ins.size(); ++n) {  // checked once every posting is settled
      const std::uint32_t i = asked[n];
      if (sizes[n] != ins[n].size())
        transport::fail_peer(donors[k], "state", "elastic: peer ", donors[k], " sent a state chunk of ", sizes[n], " bytes, ",
                             ins[n].size(), " were due");
      const auto chunk = std::string_view(reinterpret_cast<const char*>(ins[n].data()), ins[n].size());
      if (decentrain::detail::xxh3(chunk) != ref.hashes[i]) failed.push_back(i);
    }
    return failed;
  };
  std::vector<std::vector<std::uint32_t>> again(donors.size());
  for (std::size_t k = 0; k < donors.size(); ++k)
    for (const auto i : take(k, asks[k])) {
      // Named, and asked again of another donor whose offer holds this chunk alike.
      out.named.emplace(donors[k], decentrain::detail::concat("its chunk ", i, " of the state did not hash as its offer said"));
      std::size_t other = donors.size();
      for (std::size_t t = 1; t < donors.size() && other == donors.size(); ++t) {
        const std::size_t c = (k + t) % donors.size();
        if (offers[c].same_layout(ref) && offers[c].hashes.size() == ref.hashes.size() && offers[c].hashes[i] == ref.hashes[i] &&
            !out.named.count(donors[c]))
          other = c;
      }
      if (other == donors.size())
        transport::fail_peer_because(transport::failure_cause::convicted, donors[k], "state", "elastic: peer ", donors[k],
                                     " sent chunk ", i, " of the state unlike its offer (its hash differs), and no other donor holds it alike");
      again[other].push_back(i);
    }
  for (std::size_t k = 0; k < donors.size(); ++k) {
    std::uint64_t due = 0;
    for (const auto i : again[k]) due += offers[k].length(i);
    transport::expect(ep, donors[k], detail::state_tag, due);
    ep.send(donors[k], detail::state_tag, std::as_bytes(std::span(again[k])));  // (empty: nothing failed)
  }
  for (std::size_t k = 0; k < donors.size(); ++k)
    if (const auto failed = take(k, again[k]); !failed.empty())
      transport::fail_peer_because(transport::failure_cause::convicted, donors[k], "state", "elastic: peer ", donors[k], " sent chunk ",
                                   failed.front(), " of the state unlike its offer (its hash differs), asked again of it");
  out.state.emplace(std::move(got));
  return out;
}

}  // namespace decentrain::fault
