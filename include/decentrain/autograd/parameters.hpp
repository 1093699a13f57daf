// A named registry of trainable parameters. Modules register what they own here, so optimizers,
// checkpoints and communication policies can walk every parameter in one stable order.
#pragma once

#include "decentrain/fwd.hpp"
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "decentrain/autograd/variable.hpp"

namespace decentrain {

template <class Device>
class parameter_list {
 public:
  struct entry {
    std::string name;
    var<Device> param;
  };

  // Registers `p` under `name` (unique) and returns it; it must be a leaf needing gradients.
  var<Device> add(std::string name, var<Device> p) {
    detail::check(!name.empty(), "parameter_list: a parameter needs a name");
    detail::check(p.defined() && p.requires_grad() && p.is_leaf(), "parameter_list: '", name,
                  "' must be a leaf var with requires_grad (create it with parameter(tensor))");
    for (const auto& e : entries_)
      detail::check(e.name != name, "parameter_list: duplicate parameter name '", name, "'");
    entries_.push_back({std::move(name), p});
    return p;
  }

  // Adds every parameter of `other`, prefixing names with `prefix` + '.'.
  void add_all(const std::string& prefix, const parameter_list& other) {
    for (const auto& e : other.entries_) add(prefix + "." + e.name, e.param);
  }

  const var<Device>& get(const std::string& name) const { return find(name); }
  var<Device>& get(const std::string& name) { return const_cast<var<Device>&>(find(name)); }

  bool contains(const std::string& name) const {
    for (const auto& e : entries_)
      if (e.name == name) return true;
    return false;
  }

  void zero_grad() {
    for (auto& e : entries_) e.param.zero_grad();
  }

  std::int64_t numel() const {
    std::int64_t n = 0;
    for (const auto& e : entries_) n += e.param.value().numel();
    return n;
  }

  std::size_t size() const { return entries_.size(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }
  auto begin() { return entries_.begin(); }
  auto end() { return entries_.end(); }

 private:
  const var<Device>& find(const std::string& name) const {
    for (const auto& e : entries_)
      if (e.name == name) return e.param;
    detail::fail("parameter_list: no parameter named '", name, "'");
  }

  std::vector<entry> entries_;
};

}  // namespace decentrain
