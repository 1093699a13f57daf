// An aggregator chosen at run time (a command line's --aggregator): any aggregator behind one
// type, and the parser for its specs:
//   mean | sender-mean | median | trimmed-mean[:trim=F] | centered-clip[:iterations=N,radius=R]
// each with ",bucket=S[,seed=N]" (bucketing in random groups of S) and ",partitioned" (aggregated
// per partition), for example "centered-clip:bucket=2", "median:partitioned", "trimmed-mean:trim=0.2".
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "decentrain/collective/aggregators.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/detail/spec.hpp"

namespace decentrain::collective {

class any_aggregator {
 public:
  any_aggregator() : any_aggregator(mean{}) {}
  template <class A>
    requires(!std::same_as<std::remove_cvref_t<A>, any_aggregator>)
  any_aggregator(A a)  // NOLINT: implicit, so any aggregator converts
      : self_(std::make_shared<model<A>>(std::move(a))) {
    static_assert(check_aggregator<A>());
  }
  any_aggregator(const any_aggregator& o) : self_(o.self_->clone()) {}
  any_aggregator& operator=(const any_aggregator& o) {
    if (this != &o) self_ = o.self_->clone();
    return *this;
  }
  any_aggregator(any_aggregator&&) noexcept = default;
  any_aggregator& operator=(any_aggregator&&) noexcept = default;

  std::string describe() const { return self_->describe(); }
  bool per_partition() const { return self_->per_partition(); }
  bool averages_in_flight() const { return self_->averages_in_flight(); }
  void combine(contributions in, std::span<float> out) { self_->combine(in, out); }

 private:
  struct base {
    virtual ~base() = default;
    virtual std::shared_ptr<base> clone() const = 0;
    virtual std::string describe() const = 0;
    virtual bool per_partition() const = 0;
    virtual bool averages_in_flight() const = 0;
    virtual void combine(contributions, std::span<float>) = 0;
  };
  template <class A>
  struct model final : base {
    explicit model(A inner) : a(std::move(inner)) {}
    std::shared_ptr<base> clone() const override { return std::make_shared<model>(*this); }
    std::string describe() const override { return describe_aggregator(a); }
    bool per_partition() const override { return is_partitioned(a); }
    bool averages_in_flight() const override { return collective::averages_in_flight(a); }
    void combine(contributions in, std::span<float> out) override { a.combine(in, out); }
    A a;
  };
  std::shared_ptr<base> self_;
};

namespace detail {
template <class A>
any_aggregator wrap_partition(A a, bool per_partition) {
  if (per_partition) return partitioned<A>{std::move(a)};
  return a;
}
}  // namespace detail

inline const char* aggregator_names = "mean, sender-mean, median, trimmed-mean, centered-clip";

// "centered-clip:iterations=3,bucket=2" -> the aggregator; an unknown name, setting or value is
// an error naming it.
inline any_aggregator parse_aggregator(std::string_view spec) {
  using decentrain::detail::check;
  using decentrain::detail::fail;
  const decentrain::detail::spec parsed("aggregator", spec);
  const std::string& name = parsed.name;
  std::vector<std::pair<std::string, std::string>> settings;
  bool partition = false;
  std::size_t bucket = 0;
  std::optional<std::uint64_t> seed;
  auto number = [&](const std::string& key, const std::string& text) { return parsed.number(key, text); };
  auto whole = [&](const std::string& key, const std::string& text, double lo, double hi) {
    return parsed.whole(key, text, lo, hi);
  };
  for (const auto& [key, value] : parsed.settings) {
    if (key == "partitioned" && value.empty())
      partition = true;
    else if (key == "bucket")
      bucket = static_cast<std::size_t>(whole(key, value, 1, 1 << 20));
    else if (key == "seed")
      seed = whole(key, value, 0, 9007199254740992.0);
    else
      settings.emplace_back(key, value);
  }
  auto unknown = [&](const std::string& key, const char* expected) {
    fail("aggregator '", spec, "': unknown setting '", key, "' for ", name, " (expected ", expected, ")");
  };
  auto wrap = [&](auto a) -> any_aggregator {
    check(!seed || bucket > 1, "aggregator '", spec, "': seed=S goes with bucket=S (the groups' draw)");
    if (bucket > 1) {
      bucketing<decltype(a)> b;
      b.size = bucket;
      b.inner = a;
      if (seed) b.seed = *seed;
      return detail::wrap_partition(b, partition);
    }
    return detail::wrap_partition(a, partition);
  };
  if (name == "mean") {
    for (const auto& [k, v] : settings) unknown(k, "bucket=S, partitioned");
    return wrap(mean{});
  }
  if (name == "sender-mean") {
    for (const auto& [k, v] : settings) unknown(k, "partitioned");
    // Buckets average their members with the plain mean first, which dilutes what one peer sent.
    check(bucket <= 1, "aggregator '", spec, "': sender-mean takes no bucket=S (a bucket's plain mean would dilute "
                       "a value one peer sent)");
    return wrap(sender_mean{});
  }
  if (name == "median") {
    for (const auto& [k, v] : settings) unknown(k, "bucket=S, partitioned");
    return wrap(median{});
  }
  if (name == "trimmed-mean") {
    trimmed_mean a;
    for (const auto& [k, v] : settings) {
      if (k == "trim") {
        a.trim = number(k, v);
        check(a.trim >= 0 && a.trim < 0.5, "aggregator '", spec, "': trim must be in [0, 0.5), got ", v);
      } else {
        unknown(k, "trim=F, bucket=S, partitioned");
      }
    }
    return wrap(a);
  }
  if (name == "centered-clip") {
    centered_clip a;
    for (const auto& [k, v] : settings) {
      if (k == "iterations")
        a.iterations = static_cast<int>(whole(k, v, 1, 100));
      else if (k == "radius") {
        a.radius = number(k, v);
        check(a.radius >= 0, "aggregator '", spec, "': radius must be >= 0 (0: the median distance), got ", v);
      } else {
        unknown(k, "iterations=N, radius=R, bucket=S, partitioned");
      }
    }
    return wrap(a);
  }
  fail("aggregator '", spec, "': unknown aggregator '", name, "' (expected one of: ", aggregator_names, ")");
}

}  // namespace decentrain::collective
