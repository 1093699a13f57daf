// The membership protocol as a member reads it from another (fault/membership/): its messages
// (reports, views, echoes, markers, joiners' hellos) and a donor's state offer. A member that
// holds the run key can send any bytes on these tags, so hostile bytes must end in a
// decentrain::error naming the sender, never in a crash or an allocation sized by a count.
// Properties, past decoding:
// - a message that decodes encodes back to bytes that decode to the same message (same digest);
// - a view that passes invalid_view against the current view keeps or removes each old member
//   (exactly one of the two), keeps the barred barred and out of its members, and names a donor
//   among its members that is not behind: what agreement.hpp relies on when it installs it;
// - a report that passes invalid_report names only members as departed or accused;
// - a view that passes invalid_admission names its sender and the joiner among its members;
// - an offer that decodes has chunks that follow one another to its size, and tensors inside it.
// An input's first byte picks the reader: even, a protocol message; odd, a state offer.
#include "fuzz.hpp"

#include <algorithm>

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
  const auto m = fd::decode(b, sender);
  const auto again = fd::decode(decentrain::transport::wire::encode_body(m), sender);
  require(fd::digest_of(again) == fd::digest_of(m), "a membership message did not decode back to itself after encoding");

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto* first = reinterpret_cast<const std::byte*>(data) + 1;
  const bytes body(first, first + (size - 1));
  rejects_cleanly([&] { data[0] % 2 ? check_offer(body) : check_message(body); });
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
  std::vector<std::string> out;
  for (const auto& m : {view, report, echo}) out.push_back(with('\0', decentrain::transport::wire::encode_body(m)));
  out.push_back(with('\1', fd::encode_offer(offer)));
  return out;
}
