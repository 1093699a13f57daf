// The exchange that deals a pipeline's parts out again when its group re-forms (the trainer's
// redeal, train/trainer.hpp): each member says what it holds and needs, a plan says who serves
// whom, what a member was served is checked against what its sender announced, and a part no
// member holds any more is read from the checkpoint files the members see. Apart from the
// training loop so that the loop reads as a loop; the trainer keeps only the steps that touch
// its model and optimizer (building the new part, packing its own state, installing).
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/detail/hash.hpp"
#include "decentrain/io/checkpoint.hpp"
#include "decentrain/train/context.hpp"
#include "decentrain/transport/peer_error.hpp"

namespace decentrain::train {

// Each time a pipeline's parts were dealt out again after the group re-formed.
struct redeal_record {
  std::int64_t step = 0;                // the step the group went on from
  int stages_before = 0, copies_before = 0, stages_after = 0, copies_after = 0;
  std::uint64_t bytes_received = 0;     // parameters and AdamW state this peer took from others
  std::uint64_t bytes_sent = 0;         // ... and served
  double seconds = 0;                   // building the new part and moving the state, on this peer
  bool from_checkpoints = false;        // a stage's every replica was lost: the group went back to
                                        // `step`, its parts read from checkpoint files
  bool at_step = true;                  // this peer stood at `step` (else a step from it, or behind)
};

// What a re-deal's member holds and needs, as it said it: `current` (at the agreed step) or
// `near` (a step from it: in the same round of a policy whose replicas differ between rounds;
// any step of one whose every step leaves them equal),
// the parameters it holds each with its digest (redeal_exchange::digest), the names its new part
// needs.
struct member_parts {
  bool current = false;
  bool near = false;
  std::map<std::string, std::uint64_t> holds;
  std::vector<std::string> needs;
  std::set<int> distrusts;  // world ranks it takes nothing from
  // The communication policy's state that is not per parameter (its counters and texts: a
  // round's count, whether the outer momentum started), where this member has it.
  std::optional<io::checkpoint> policy_state;
};

// from[d][s]: the names member s sends member d, in d's order.
using redeal_plan = std::vector<std::vector<std::vector<std::string>>>;
// Per member: the (folder, step) pairs of the checkpoint files it sees.
using files_seen = std::vector<std::vector<std::pair<int, std::int64_t>>>;

// A parameter as the re-deal moves it: its values, AdamW's two moments, the communication
// policy's state over it (its per_parameter_state: DiLoCo's global parameters and outer
// momentum), all floats of the parameter's size, and AdamW's step count. One general exchange
// serves a lost replica, a new shape and a restarted group of another shape.
class redeal_exchange {
 public:
  // members: the view's world ranks, by rank in comm; distrusted: the world ranks this peer
  // caught serving other values than they announced (kept by the caller for the whole run);
  // policy_fields: the policy's per-parameter state, as keys of its flat tensors.
  redeal_exchange(communicator& comm, const std::vector<int>& members, std::set<int>& distrusted,
                  std::vector<std::string> policy_fields)
      : comm_(comm), members_(members), distrusted_(distrusted), fields_(std::move(policy_fields)) {}

  // The checkpoint keys of a parameter's state as it travels, in order (each the parameter's size).
  static std::vector<std::string> keys_of(const std::string& name, const std::vector<std::string>& policy_fields) {
    std::vector<std::string> keys = {"model." + name, "adamw." + name + ".exp_avg", "adamw." + name + ".exp_avg_sq"};
    for (const auto& f : policy_fields) keys.push_back(f + "/" + name);
    return keys;
  }
  std::vector<std::string> keys_of(const std::string& name) const { return keys_of(name, fields_); }
  // How many floats of the parameter's size travel for each parameter.
  std::size_t parts() const { return 3 + fields_.size(); }

  // One XXH3 digest of a parameter as it travels, announced by its holders for a receiver to
  // check what it was served (not a cryptographic hash: it catches a holder that serves other
  // values than it announced, not one that crafts a collision).
  static std::uint64_t digest(std::span<const std::span<const float>> parts, std::int64_t step) {
    decentrain::detail::xxh3_stream h;
    for (const auto part : parts) h.update(std::string_view(reinterpret_cast<const char*>(part.data()), part.size_bytes()));
    h.update(std::string_view(reinterpret_cast<const char*>(&step), sizeof step));
    return h.digest();
  }

  // The parameters a checkpoint holds whole (every key of keys_of and the step count).
  static std::set<std::string> names_in(const io::checkpoint& c, const std::vector<std::string>& policy_fields) {
    std::set<std::string> names;
    for (const auto& [key, t] : c.tensors)
      if (key.starts_with("model.")) {
        const auto name = key.substr(6);
        const auto keys = keys_of(name, policy_fields);
        if (std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return c.tensors.contains(k); }) &&
            c.counters.contains("adamw." + name + ".step"))
          names.insert(name);
      }
    return names;
  }
  // The digests of the parameters a checkpoint holds whole, added to `out` where not there yet.
  void add_digests(const io::checkpoint& c, std::map<std::string, std::uint64_t>& out) const {
    for (const auto& name : names_in(c, fields_)) {
      if (out.contains(name)) continue;
      std::vector<tensor<cpu>> held;
      std::vector<std::span<const float>> spans;
      for (const auto& key : keys_of(name)) held.push_back(c.tensor_at(key).contiguous());
      for (const auto& t : held) spans.push_back(floats(t));
      out[name] = digest(spans, c.counter("adamw." + name + ".step"));
    }
  }
  // Appends a saved parameter as it travels.
  void pack_saved(const io::checkpoint& c, const std::string& name, std::vector<float>& values, std::vector<std::int64_t>& steps) const {
    for (const auto& key : keys_of(name)) {
      const auto v = c.tensor_at(key).contiguous();
      values.insert(values.end(), v.template data<float>(), v.template data<float>() + v.numel());
    }
    steps.push_back(c.counter("adamw." + name + ".step"));
  }
  // Puts what arrived for `names` into `c` as a checkpoint holds it; shape_of(name) gives each
  // parameter's shape in the new part.
  template <class ShapeOf>
  void unpack(const std::vector<std::string>& names, std::span<const float> values, std::span<const std::int64_t> steps,
              ShapeOf&& shape_of, io::checkpoint& c) const {
    std::size_t off = 0;
    for (std::size_t k = 0; k < names.size(); ++k) {
      const shape s = shape_of(names[k]);
      const auto count = static_cast<std::size_t>(s.numel());
      for (const auto& key : keys_of(names[k])) {
        auto t = tensor<cpu>::empty(s, dtype::f32);
        std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(off), count, t.template data<float>());
        c.tensors[key] = std::move(t);
        off += count;
      }
      c.counters["adamw." + names[k] + ".step"] = steps[k];
    }
  }

  // A policy state's counters and texts as one text (equal states, equal texts).
  static std::string describe_state(const io::checkpoint& c) {
    std::string out;
    for (const auto& [key, v] : c.counters) out += decentrain::detail::concat("c ", key, " ", v, "\n");
    for (const auto& [key, v] : c.text) out += "t " + key + " " + v + "\n";
    return out;
  }

  // Every member says what it holds and needs: "1", "n" or "0" (at the step, near it, or
  // neither), the names it
  // holds each with its digest, the ranks it distrusts ("!rank"), the policy's counters and
  // texts where it has them ("#c key value", "#t key value"), an empty line, the names it needs;
  // broadcast member by member.
  std::vector<member_parts> announce_parts(bool current, bool near, const std::map<std::string, std::uint64_t>& holds,
                                           const std::vector<std::string>& needs, const io::checkpoint* policy_state) {
    using decentrain::detail::concat;
    std::string mine = current ? "1" : near ? "n" : "0";
    for (const auto& [name, d] : holds) mine += concat("\n", name, " ", d);
    for (const int j : distrusted_) mine += concat("\n!", j);
    if (policy_state) {
      const auto plain = [](const std::string& key) { return !key.empty() && key.find_first_of(" \n") == std::string::npos; };
      mine += "\n#p";  // (has it, though it be empty)
      for (const auto& [key, v] : policy_state->counters) {
        decentrain::detail::check(plain(key), "trainer: the communication policy's counter '", key,
                                  "' cannot be dealt out in a re-deal (a key with a space or a line break)");
        mine += concat("\n#c ", key, " ", v);
      }
      for (const auto& [key, v] : policy_state->text) {
        decentrain::detail::check(plain(key) && v.find('\n') == std::string::npos, "trainer: the communication policy's text '",
                                  key, "' cannot be dealt out in a re-deal (a key with a space or a line break, or a ",
                                  "value with a line break)");
        mine += concat("\n#t ", key, " ", v);
      }
    }
    mine += "\n";
    for (const auto& name : needs) mine += "\n" + name;
    std::vector<member_parts> said(static_cast<std::size_t>(comm_.world()));
    for (int r = 0; r < comm_.world(); ++r) {
      const auto text = broadcast_text(mine, r, "its parameters' names");
      auto& m = said[static_cast<std::size_t>(r)];
      m.current = text[0] == '1';
      m.near = text[0] == 'n';
      std::size_t at = 1;
      bool needed = false;
      while (at < text.size()) {
        const auto end = std::min(text.find('\n', at + 1), text.size());
        auto name = text.substr(at + 1, end - at - 1);
        at = end;
        if (name.empty() && !needed) {
          needed = true;
        } else if (needed) {
          m.needs.push_back(std::move(name));
        } else if (name[0] == '!') {
          int rank = -1;
          std::from_chars(name.data() + 1, name.data() + name.size(), rank);
          m.distrusts.insert(rank);
        } else if (name == "#p") {
          if (!m.policy_state) m.policy_state.emplace();
        } else if (name.starts_with("#c ") || name.starts_with("#t ")) {
          const auto space = name.find(' ', 3);
          if (!m.policy_state || space == std::string::npos) continue;  // (not after "#p": not one)
          const auto key = name.substr(3, space - 3);
          if (name[1] == 'c') {
            std::int64_t v = 0;
            std::from_chars(name.data() + space + 1, name.data() + name.size(), v);
            m.policy_state->counters[key] = v;
          } else {
            m.policy_state->text[key] = name.substr(space + 1);
          }
        } else if (const auto space = name.rfind(' '); space != std::string::npos) {
          m.holds[name.substr(0, space)] = std::strtoull(name.c_str() + space + 1, nullptr, 10);
        }
      }
    }
    return said;
  }

  // Who sends what to whom. With `spread` (every step leaves a stage's replicas equal), a member
  // takes what it holds itself, else from the holders at the step in turn, less those it
  // distrusts, so a morph's bytes spread over them. Without (local SGD, DiLoCo, gossip: the
  // replicas differ between rounds), where every member holds its whole new part each keeps
  // its own (a lost replica, the shape kept); else every member takes every parameter from its
  // lowest-ranked holder it trusts, so that the new parts make up one replica wherever one is whole (a part mixing two
  // replicas' values would keep them apart: the tied embedding's two copies on the first and
  // the last stage, say, are averaged only within their own stages); the other replicas' steps
  // since the round began are dropped, as a lost replica's are. In both, a member a step from
  // the agreed one (the copies of a pipeline run apart between rounds, and one that hears of a
  // failure can stop a step before or after its neighbour) serves what no member at the step
  // holds: with `spread`, a stage's part one optimizer step off, where the only copy at the step
  // died, rather than no run at all. None, naming `missing`, when some name has no holder.
  std::optional<redeal_plan> plan(const std::vector<member_parts>& said, bool spread, std::string& missing) const {
    const auto n = said.size();
    redeal_plan from(n, std::vector<std::vector<std::string>>(n));
    const bool all_whole = std::all_of(said.begin(), said.end(), [&](const member_parts& m) {
      return m.current &&
             std::all_of(m.needs.begin(), m.needs.end(), [&](const std::string& name) { return m.holds.contains(name); });
    });
    for (std::size_t d = 0; d < n; ++d) {
      const auto& want = said[d].needs;
      for (std::size_t k = 0; k < want.size(); ++k) {
        const auto holders_if = [&](auto&& standing) {
          std::vector<std::size_t> out;
          for (std::size_t r = 0; r < n; ++r)
            if (standing(said[r]) && !said[d].distrusts.count(members_[r]) && said[r].holds.contains(want[k])) out.push_back(r);
          return out;
        };
        auto holders = holders_if([](const member_parts& m) { return m.current; });
        if (holders.empty()) holders = holders_if([](const member_parts& m) { return m.near; });
        if (holders.empty()) {
          missing = want[k];
          return std::nullopt;
        }
        const bool own = std::find(holders.begin(), holders.end(), d) != holders.end();
        const auto source = spread ? (own ? d : holders[(d + k) % holders.size()]) : all_whole ? d : holders.front();
        from[d][source].push_back(want[k]);
      }
    }
    return from;
  }

  // What member `s` served for `names` (counts: each name's floats) must be what it announced:
  // else this peer distrusts it for good (announced with what it holds, so that every member
  // plans the next re-deal without it as this peer's source) and fails the re-deal naming it. A
  // lone accusation does not remove a member from the group (agreement.hpp: a liar could frame
  // an honest one), but it can only cost the accuser its sources.
  void check_served(const member_parts& announced, int s, const std::vector<std::string>& names,
                    const std::vector<std::size_t>& counts, std::span<const float> values, std::span<const std::int64_t> steps,
                    std::int64_t at) {
    std::size_t off = 0;
    for (std::size_t k = 0; k < names.size(); ++k) {
      const auto count = counts[k];
      std::vector<std::span<const float>> spans;
      for (std::size_t i = 0; i < parts(); ++i, off += count) spans.push_back(values.subspan(off, count));
      const auto got = digest(spans, steps[k]);
      const auto it = announced.holds.find(names[k]);
      if (it == announced.holds.end() || it->second != got) {
        const int peer = members_[static_cast<std::size_t>(s)];
        distrusted_.insert(peer);
        transport::fail_peer_because(transport::failure_cause::convicted, peer, "redeal", "trainer: peer ", peer,
                                     " served parameter '", names[k], "' for the re-deal at step ", at,
                                     " with other values than it announced (digest ", got, ", announced ",
                                     it == announced.holds.end() ? std::string("none") : std::to_string(it->second),
                                     "); this peer takes nothing from it again");
      }
    }
  }

  // Every member says which checkpoint files it sees ("folder step" lines after a leading "f": a
  // text is never empty).
  files_seen announce_files(const checkpoint_files& files) {
    std::string mine = "f";
    for (const auto& [folder, steps] : files)
      for (const auto& [s, path] : steps) mine += decentrain::detail::concat("\n", folder, " ", s);
    files_seen seen(static_cast<std::size_t>(comm_.world()));
    for (int r = 0; r < comm_.world(); ++r) {
      std::istringstream text(broadcast_text(mine, r, "its checkpoint files"));
      std::string f;
      text >> f;
      int folder = 0;
      std::int64_t s = 0;
      while (text >> folder >> s) seen[static_cast<std::size_t>(r)].emplace_back(folder, s);
    }
    return seen;
  }

  // This member's share of the files of step s, read and joined: each file is read by one member
  // that sees it (the peer whose folder it is, where that is a member; else the members that see
  // it take the lost peers' folders in turn). A file that does not read back whole, is of
  // another step, or that `fits` refuses (another model), adds nothing.
  template <class Fits>
  io::checkpoint read_files_at(std::int64_t s, const files_seen& seen, const checkpoint_files& files, Fits&& fits) {
    std::set<int> folders;
    for (const auto& m : seen)
      for (const auto& [folder, at] : m)
        if (at == s) folders.insert(folder);
    io::checkpoint joined;
    for (int folder : folders) {
      const auto sees = [&](int r) {
        const auto& m = seen[static_cast<std::size_t>(r)];
        return std::find(m.begin(), m.end(), std::pair{folder, s}) != m.end();
      };
      std::vector<int> readers;
      for (int r = 0; r < comm_.world(); ++r)
        if (sees(r)) readers.push_back(r);
      const auto owner = std::find(members_.begin(), members_.end(), folder);
      const int own = static_cast<int>(owner - members_.begin());
      const int reader = owner != members_.end() && sees(own) ? own : readers[static_cast<std::size_t>(folder) % readers.size()];
      if (reader != comm_.rank()) continue;
      try {
        auto c = io::load_checkpoint(files.at(folder).at(s));
        if (c.counter("step") != s || !fits(c)) continue;
        for (auto& [key, t] : c.tensors) joined.tensors.insert_or_assign(key, std::move(t));
        for (const auto& [key, v] : c.counters) joined.counters.insert_or_assign(key, v);
      } catch (const decentrain::error&) {
        // (a damaged file: its parts are looked for elsewhere, or at an older step)
      }
    }
    return joined;
  }

 private:
  static std::span<const float> floats(const tensor<cpu>& t) {
    return {t.template data<float>(), static_cast<std::size_t>(t.numel())};
  }
  // Member r's text, on every member (`mine` on r itself): its size first, bounded.
  std::string broadcast_text(const std::string& mine, int r, const char* what) {
    std::int64_t bytes = r == comm_.rank() ? static_cast<std::int64_t>(mine.size()) : 0;
    comm_.broadcast(std::span<std::int64_t>(&bytes, 1), r);
    decentrain::detail::check(bytes >= 1 && bytes <= (std::int64_t{1} << 24), "trainer: member ", r, " of the re-formed ",
                              "group says ", what, " take ", bytes, " bytes");
    std::string text = r == comm_.rank() ? mine : std::string(static_cast<std::size_t>(bytes), '\0');
    comm_.broadcast(std::span<char>(text.data(), text.size()), r);
    return text;
  }

  communicator& comm_;
  const std::vector<int>& members_;
  std::set<int>& distrusted_;
  std::vector<std::string> fields_;
};

}  // namespace decentrain::train
