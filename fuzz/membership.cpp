// The membership protocol as a member reads it from another (fault/membership/): its messages
// (reports, views, echoes, readies, markers, joiners' hellos), a donor's state offer, and a
// leaver's handoff (fault/handoff.hpp). A member that
// holds the run key can send any bytes on these tags, so hostile bytes must end in a
// decentrain::error naming the sender, never in a crash or an allocation sized by a count.
// Properties, past decoding:
// - a message that decodes encodes back to bytes that decode to the same message (same digest);
// - an agreement takes any bytes from a member without throwing (what does not decode, or breaks
//   the rules, is noted against the sender, which is heard still);
// - a view that passes invalid_view against the current view keeps or removes each old member
//   (exactly one of the two), keeps the barred barred and out of its members, and names a donor
//   among its members that is not behind: what agreement.hpp relies on when it installs it;
// - a report that passes invalid_report names only members as departed or accused;
// - a view that passes invalid_admission names its sender and the joiner among its members;
// - an offer that decodes has chunks that follow one another to its size, and tensors inside it;
// - a handoff (the input cut into frames: a 2-byte length, then that many bytes) that is taken
//   holds no more bytes than the heir's limit allows and encodes back to a checkpoint of its own.
// An input's first byte picks the reader: 0 mod 3, a protocol message; 1, a state offer; 2, a
// handoff.
#include "fuzz.hpp"

#include <algorithm>

#include "decentrain/fault/handoff.hpp"
#include "decentrain/fault/membership/agreement.hpp"
#include "decentrain/fault/membership/messages.hpp"
#include "decentrain/fault/membership/state_transfer.hpp"

namespace fd = decentrain::fault::detail;
namespace fault = decentrain::fault;
using decentrain::transport::bytes;
using decentrain_fuzz::rejects_cleanly;
using decentrain_fuzz::require;

namespace {

constexpr int sender = 2, joiner = 6, capacity = 8;

// The view every message is held against: members 0..4, peer 5 barred, epoch 7.
const fault::view& current() {
  static const fault::view v{7, {0, 1, 2, 3, 4}, {5}};
  return v;
}

bool has(const std::vector<std::int32_t>& v, int r) { return std::find(v.begin(), v.end(), r) != v.end(); }

void check_message(const bytes& b) {
  fd::heard h;
  h.f = 1;
  int readies_said = 0;
  h.say_ready = [&](const fd::message&) { ++readies_said; };
  fd::take(h, sender, b, current(), capacity);
  require(readies_said == 0, "one member's ready made this peer ready (more than may lie must be)");
  const auto m = fd::decode(b, sender);
  const auto again = fd::decode(decentrain::transport::wire::encode_body(m), sender);
  require(again.what == m.what && fd::digest_of(again) == fd::digest_of(m),
          "a membership message did not decode back to itself after encoding");

  if (!fd::invalid_view(m, current(), capacity)) {
    for (int j : current().members)
      require(has(m.ranks, j) != has(m.departed, j), "a valid view neither keeps nor removes an old member");
    for (int j : current().barred) require(has(m.convicted, j) && !has(m.ranks, j), "a valid view lifted a bar");
    if (!m.ranks.empty()) require(has(m.ranks, m.donor) && !has(m.behind, m.donor), "a valid view's donor is not at the target");
    const auto d = fd::decision_of(m);
    require(std::is_sorted(d.next.members.begin(), d.next.members.end()), "a valid view's members are not ascending");
  }
  if (!fd::invalid_report(m, current(), capacity)) {
    for (auto j : m.departed) require(current().contains(j), "a valid report names a non-member as departed");
    for (auto j : m.convicted) require(current().contains(j), "a valid report accuses a non-member");
    require(current().contains(m.donor), "a valid report goes to a leader outside the view");
  }
  if (!fd::invalid_admission(m, sender, joiner, capacity))
    require(has(m.ranks, sender) && has(m.behind, joiner) && has(m.ranks, joiner),
            "a valid admission does not hold its sender and the joiner among its members");
}

void check_offer(const bytes& b) {
  fault::agreement_settings s;
  s.max_state_bytes = std::uint64_t{1} << 30;
  const auto o = fd::decode_offer(b, sender, s);
  require(o.size <= s.max_state_bytes && o.chunks() > 0 && o.ends.back() == o.size, "an offer's chunks do not end at its size");
  for (std::uint64_t i = 0; i < o.chunks(); ++i) require(o.length(i) > 0, "an offer has an empty or backward chunk");
  require(o.hashes.empty() || o.hashes.size() == o.ends.size(), "an offer's hashes do not match its chunks");
  std::uint64_t after = 0;
  for (const auto& t : o.tensors) {
    require(t.at >= after && t.bytes > 0 && t.at + t.bytes <= o.size, "an offer places a tensor outside its state");
    after = t.at + t.bytes;
  }
  require(fd::encode_offer(o).size() == b.size(), "an offer did not encode back to as many bytes");
}

// The leaver's frames as the heir's endpoint hands them over, then silence.
struct leaver_frames {
  std::vector<bytes> frames;
  std::size_t at = 0;
  bytes recv_within(int from, decentrain::transport::tag_type, std::chrono::milliseconds) {
    if (at == frames.size())
      decentrain::transport::fail_peer_because(decentrain::transport::failure_cause::silent, from, "receive", "no more frames");
    return frames[at++];
  }
};

constexpr std::uint64_t handoff_limit = 1 << 16;

void check_handoff(const bytes& b) {
  leaver_frames ep;
  for (std::size_t at = 0; at + 2 <= b.size();) {
    const std::size_t n = std::to_integer<std::size_t>(b[at]) | std::to_integer<std::size_t>(b[at + 1]) << 8;
    at += 2;
    ep.frames.emplace_back(b.begin() + static_cast<std::ptrdiff_t>(at), b.begin() + static_cast<std::ptrdiff_t>(std::min(b.size(), at + n)));
    at += n;
  }
  const auto taken = fault::take_handoff(ep, sender, handoff_limit, std::chrono::milliseconds(0), std::chrono::milliseconds(0));
  if (!taken) return;
  const auto encoded = decentrain::io::encode_checkpoint(*taken);
  require(decentrain::io::encode_checkpoint(decentrain::io::decode_checkpoint(encoded, "a handoff encoded again")) == encoded,
          "a handoff taken did not encode back to itself");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto* first = reinterpret_cast<const std::byte*>(data) + 1;
  const bytes body(first, first + (size - 1));
  rejects_cleanly([&] {
    switch (data[0] % 3) {
      case 0: return check_message(body);
      case 1: return check_offer(body);
      default: return check_handoff(body);
    }
  });
  return 0;
}

std::vector<std::string> decentrain_fuzz::seeds() {
  auto with = [](char reader, const auto& b) { return std::string(1, reader) + std::string(reinterpret_cast<const char*>(b.data()), b.size()); };
  fd::message view;
  view.what = fd::kind::view;
  view.epoch = 8;
  view.step = 40;
  view.donor = 0;
  view.ranks = {0, 1, 2, 3, 6};
  view.departed = {4};
  view.behind = {6};
  view.convicted = {5};
  fd::message report;
  report.epoch = 7;
  report.step = 41;
  report.phase = 3;
  report.donor = 0;
  report.departed = {4};
  report.convicted = {3};
  report.ranks = {6};
  fd::message echo;
  echo.what = fd::kind::echo;
  echo.epoch = 8;
  echo.donor = 0;
  echo.digest = fd::digest_of(view);
  fd::state_offer offer;
  offer.size = 96;
  offer.checksum = 0x1234;
  offer.ends = {32, 96};
  offer.hashes = {1, 2};
  offer.tensors = {{"wte", 8, 16}, {"wpe", 40, 48}};
  fd::message ready = view;
  ready.what = fd::kind::ready;
  // A handoff: the 8-byte size, then the encoded checkpoint in two frames, each after its length.
  decentrain::io::checkpoint own;
  own.tensors.emplace("own.residual.0", decentrain::zeros<decentrain::cpu>(decentrain::shape{2, 3}));
  const std::string blob = decentrain::io::encode_checkpoint(own);
  std::string handoff;
  const auto frame = [&](std::string_view part) {
    handoff += static_cast<char>(part.size() & 0xff);
    handoff += static_cast<char>(part.size() >> 8);
    handoff += part;
  };
  const std::uint64_t blob_size = blob.size();
  frame(std::string_view(reinterpret_cast<const char*>(&blob_size), 8));
  frame(std::string_view(blob).substr(0, blob.size() / 2));
  frame(std::string_view(blob).substr(blob.size() / 2));
  std::vector<std::string> out;
  for (const auto& m : {view, report, echo, ready}) out.push_back(with('\0', decentrain::transport::wire::encode_body(m)));
  out.push_back(with('\1', fd::encode_offer(offer)));
  out.push_back('\2' + handoff);
  return out;
}
