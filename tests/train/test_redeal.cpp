// redeal_exchange::plan: who serves which parameter when the group deals a model's parts out
// again (train/redeal.hpp). A pure function of what the members announced.
#include <catch2/catch.hpp>

#include <decentrain/decentrain.hpp>

#include <optional>
#include <set>
#include <string>
#include <vector>

namespace dt = decentrain;

namespace {

dt::train::member_parts member(bool current, bool near, std::vector<std::string> holds, std::vector<std::string> needs) {
  dt::train::member_parts m;
  m.current = current;
  m.near = near;
  for (auto& h : holds) m.holds[h] = 1;
  m.needs = std::move(needs);
  return m;
}

}  // namespace

TEST_CASE("redeal plan: a part whose only copy at the step died comes from a member one step off") {
  dt::transport::in_process net(1);
  net.run([&](dt::transport::in_process::endpoint& ep) {
    dt::transport::any_endpoint any(ep);
    dt::train::communicator comm(any);
    const std::vector<int> members{0, 1, 2};
    std::set<int> distrusted;
    dt::train::redeal_exchange exchange(comm, members, distrusted, {});
    // Member 1 failed a step before the agreed one and alone holds "b" (the stage whose copy at
    // the step died); members 0 and 2 stand at the step and hold "a".
    const std::vector<dt::train::member_parts> said = {member(true, false, {"a"}, {"a", "b"}),
                                                       member(false, true, {"b"}, {"b"}),
                                                       member(true, false, {"a"}, {"a"})};
    for (const bool spread : {true, false}) {
      std::string missing;
      const auto plan = exchange.plan(said, spread, missing);
      REQUIRE(plan.has_value());
      CHECK((*plan)[0][1] == std::vector<std::string>{"b"});  // member 0 takes "b" from member 1
      CHECK((*plan)[1][1] == std::vector<std::string>{"b"});  // member 1 keeps its own
    }
    // Nobody near: no plan, naming the part.
    auto lone = said;
    lone[1].near = false;
    std::string missing;
    CHECK(!exchange.plan(lone, true, missing).has_value());
    CHECK(missing == "b");
  });
}
