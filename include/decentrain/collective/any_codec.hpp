// A codec chosen at run time (a command line's --codec): any codec behind one type, with the
// encoded all-reduce that carries it bound when the codec is put in (type erasure needs the
// concrete codec for that). Policies that take any_codec are compiled once for every codec; its
// collective runs on the trainer's communicator type. parse_codec reads compress::parse_codec_as's
// specs ("int4:block=64,ef", "powersgd:rank=4,factors=int8").
#pragma once

#include <concepts>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "decentrain/collective/communicator.hpp"
#include "decentrain/collective/encoded_all_reduce.hpp"
#include "decentrain/compress/codec.hpp"
#include "decentrain/compress/identity.hpp"
#include "decentrain/compress/layout.hpp"
#include "decentrain/compress/parse_codec.hpp"
#include "decentrain/io/checkpoint.hpp"
#include "decentrain/transport/endpoint.hpp"

namespace decentrain::collective {

class any_codec {
 public:
  using communicator_type = collective::communicator<transport::any_endpoint>;
  static constexpr const char* name = "any";

  any_codec() : any_codec(compress::identity{}) {}
  template <class C>
    requires(!std::same_as<std::remove_cvref_t<C>, any_codec>)
  any_codec(C c)  // NOLINT: implicit, so any codec converts
      : self_(std::make_shared<model<C>>(std::move(c))) {
    static_assert(compress::check_codec<C>());
  }
  any_codec(const any_codec& o) : self_(o.self_->clone()) {}
  any_codec& operator=(const any_codec& o) {
    if (this != &o) self_ = o.self_->clone();
    return *this;
  }
  any_codec(any_codec&&) noexcept = default;
  any_codec& operator=(any_codec&&) noexcept = default;

  std::string describe() const { return self_->describe(); }
  std::size_t max_encoded_bytes(std::size_t n) const { return self_->max_encoded_bytes(n); }
  // Whether the codec inside goes around a ring (compress::is_dense of it).
  bool is_dense() const { return self_->is_dense(); }
  std::size_t encode(std::span<const float> in, std::span<std::byte> out) { return self_->encode(in, out); }
  void decode_add(std::span<const std::byte> in, std::span<float> into) const { self_->decode_add(in, into); }
  void all_reduce(communicator_type& comm, std::span<float> values, bool average) { self_->all_reduce(comm, values, average); }
  void flush_into(std::span<float> values) { self_->flush_into(values); }
  void set_layout(const compress::layout& l) { self_->set_layout(l); }
  void set_reference(std::span<const float> reference, double lr_scale) { self_->set_reference(reference, lr_scale); }
  void save(io::checkpoint& c, const std::string& prefix) const { self_->save(c, prefix); }
  void load(const io::checkpoint& c, const std::string& prefix) { self_->load(c, prefix); }

 private:
  struct base {
    virtual ~base() = default;
    virtual std::shared_ptr<base> clone() const = 0;
    virtual std::string describe() const = 0;
    virtual std::size_t max_encoded_bytes(std::size_t) const = 0;
    virtual bool is_dense() const = 0;
    virtual std::size_t encode(std::span<const float>, std::span<std::byte>) = 0;
    virtual void decode_add(std::span<const std::byte>, std::span<float>) const = 0;
    virtual void all_reduce(communicator_type&, std::span<float>, bool) = 0;
    virtual void flush_into(std::span<float>) = 0;
    virtual void set_layout(const compress::layout&) = 0;
    virtual void set_reference(std::span<const float>, double) = 0;
    virtual void save(io::checkpoint&, const std::string&) const = 0;
    virtual void load(const io::checkpoint&, const std::string&) = 0;
  };
  template <class C>
  struct model final : base {
    explicit model(C inner) : c(std::move(inner)) {}
    std::shared_ptr<base> clone() const override { return std::make_shared<model>(*this); }
    std::string describe() const override { return compress::describe(c); }
    std::size_t max_encoded_bytes(std::size_t n) const override { return c.max_encoded_bytes(n); }
    bool is_dense() const override { return compress::is_dense<C>(); }
    std::size_t encode(std::span<const float> in, std::span<std::byte> out) override { return c.encode(in, out); }
    void decode_add(std::span<const std::byte> in, std::span<float> into) const override { c.decode_add(in, into); }
    void all_reduce(communicator_type& comm, std::span<float> values, bool average) override {
      encoded_all_reduce(c, comm, values, average);
    }
    void flush_into(std::span<float> values) override {
      if constexpr (requires { c.flush_into(values); }) c.flush_into(values);
    }
    void set_layout(const compress::layout& l) override { compress::set_layout(c, l); }
    void set_reference(std::span<const float> reference, double lr_scale) override {
      compress::set_reference(c, reference, lr_scale);
    }
    void save(io::checkpoint& ck, const std::string& prefix) const override {
      if constexpr (requires { c.save(ck, prefix); }) c.save(ck, prefix);
    }
    void load(const io::checkpoint& ck, const std::string& prefix) override {
      if constexpr (requires { c.load(ck, prefix); }) c.load(ck, prefix);
    }
    C c;
  };
  std::shared_ptr<base> self_;
};

inline any_codec parse_codec(std::string_view spec) { return compress::parse_codec_as<any_codec>(spec); }

}  // namespace decentrain::collective
