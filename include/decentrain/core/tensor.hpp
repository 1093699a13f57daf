// The dense, row-major tensor: a handle (shape, strides, offset, dtype) over shared storage on
// one device. Views (reshape, transpose, slice) share storage; copies are explicit.
#pragma once

#include "decentrain/fwd.hpp"
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "decentrain/core/device.hpp"
#include "decentrain/core/dtype.hpp"
#include "decentrain/core/memory.hpp"
#include "decentrain/core/shape.hpp"

namespace decentrain {

namespace detail {
template <class Device>
struct storage {
  void* data = nullptr;
  std::size_t bytes = 0;
  bool owned = true;  // false: memory borrowed from elsewhere (tensor::borrow), not freed here
  explicit storage(std::size_t n) : data(memory<Device>::allocate(n)), bytes(n) {}
  storage(void* p, std::size_t n) : data(p), bytes(n), owned(false) {}
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;
  ~storage() {
    if (owned) memory<Device>::deallocate(data, bytes);
  }
};
}  // namespace detail

template <class Device>
class tensor {
  static_assert(device_tag<Device>, "decentrain::tensor<Device>: Device must be dt::cpu or dt::cuda");

 public:
  using device_type = Device;

  // An undefined tensor (no storage); `defined()` is false. Used for "no gradient yet".
  tensor() = default;

  // Storage for `s` with unspecified contents; the other factories build on this.
  static tensor empty(const decentrain::shape& s, dtype t = dtype::f32) {
    tensor out;
    out.shape_ = s;
    out.strides_ = contiguous_strides(s);
    out.dtype_ = t;
    out.storage_ = std::make_shared<detail::storage<Device>>(
        static_cast<std::size_t>(s.numel()) * dtype_size(t));
    return out;
  }

  // A tensor over memory it does not own (a std::vector's, say): nothing is copied or freed, and
  // the memory must outlive every handle to it. For views of state held outside tensors, read
  // or overwritten at once (io::checkpoint::views).
  static tensor borrow(void* data, const decentrain::shape& s, dtype t = dtype::f32) {
    tensor out;
    out.shape_ = s;
    out.strides_ = contiguous_strides(s);
    out.dtype_ = t;
    out.storage_ = std::make_shared<detail::storage<Device>>(data, static_cast<std::size_t>(s.numel()) * dtype_size(t));
    return out;
  }

  bool defined() const { return storage_ != nullptr; }
  const decentrain::shape& shape() const { return shape_; }
  std::int64_t size(std::int64_t axis) const { return shape_.size(axis); }
  std::size_t rank() const { return shape_.rank(); }
  std::int64_t numel() const { return shape_.numel(); }
  decentrain::dtype dtype() const { return dtype_; }
  const std::vector<std::int64_t>& strides() const { return strides_; }
  std::int64_t offset() const { return offset_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }

  bool is_contiguous() const { return strides_ == contiguous_strides(shape_); }
  // True when both handles view the same storage (a view, not a copy).
  bool shares_storage_with(const tensor& other) const { return storage_ == other.storage_; }

  // Typed pointer to the first element; T must match the dtype.
  template <class T>
  T* data() const {
    require_defined("data");
    detail::check(dtype_of<T> == dtype_, "tensor::data<", dtype_name(dtype_of<T>),
                  ">() called on a tensor of dtype ", dtype_name(dtype_));
    return static_cast<T*>(storage_->data) + offset_;
  }
  void* raw_data() const {
    require_defined("raw_data");
    return static_cast<char*>(storage_->data) + offset_ * static_cast<std::int64_t>(dtype_size(dtype_));
  }

  // ---- views -------------------------------------------------------------------------------

  // Same elements, new shape; one dim may be -1. A view when the layout allows, else a copy.
  tensor reshape(std::vector<std::int64_t> sizes) const {
    require_defined("reshape");
    std::int64_t known = 1, infer = -1;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] == -1) {
        detail::check(infer < 0, "reshape to ", format_sizes(sizes), ": only one dim may be -1");
        infer = static_cast<std::int64_t>(i);
      } else {
        detail::check(sizes[i] >= 0, "reshape to ", format_sizes(sizes), ": negative size");
        known *= sizes[i];
      }
    }
    if (infer >= 0) {
      detail::check(known != 0 && numel() % known == 0, "cannot reshape tensor of shape ",
                    shape_, " (", numel(), " elements) to ", format_sizes(sizes));
      sizes[static_cast<std::size_t>(infer)] = numel() / known;
    }
    decentrain::shape target(std::move(sizes));
    detail::check(target.numel() == numel(), "cannot reshape tensor of shape ", shape_, " (",
                  numel(), " elements) to ", target, " (", target.numel(), " elements)");
    tensor out = is_contiguous() ? *this : contiguous();
    out.shape_ = target;
    out.strides_ = contiguous_strides(target);
    return out;
  }
  tensor reshape(const decentrain::shape& s) const { return reshape(s.sizes()); }
  tensor reshape(std::initializer_list<std::int64_t> sizes) const {
    return reshape(std::vector<std::int64_t>(sizes));
  }

  // Swaps two dims without copying.
  tensor transpose(std::int64_t dim0, std::int64_t dim1) const {
    const auto a = shape_.normalize_axis(dim0), b = shape_.normalize_axis(dim1);
    tensor out = *this;
    std::swap(out.shape_[a], out.shape_[b]);
    std::swap(out.strides_[a], out.strides_[b]);
    return out;
  }

  // Reorders dims without copying: dim i of the result is dim order[i] of this tensor.
  tensor permute(const std::vector<std::int64_t>& order) const {
    detail::check(order.size() == rank(), "permute: order ", format_sizes(order), " has ",
                  order.size(), " entries but the tensor has rank ", rank());
    tensor out = *this;
    std::vector<bool> used(rank(), false);
    for (std::size_t i = 0; i < order.size(); ++i) {
      const auto d = shape_.normalize_axis(order[i]);
      detail::check(!used[d], "permute: order ", format_sizes(order), " repeats dim ", d);
      used[d] = true;
      out.shape_[i] = shape_[d];
      out.strides_[i] = strides_[d];
    }
    return out;
  }

  // A read-only broadcast view with `target` shape: dims of size 1 (and missing leading dims)
  // repeat with stride 0. Materialise it with contiguous().
  tensor expand(const decentrain::shape& target) const {
    detail::check(target.rank() >= rank(), "expand: cannot expand shape ", shape_, " to ", target,
                  " of lower rank");
    tensor out = *this;
    const std::size_t lead = target.rank() - rank();
    std::vector<std::int64_t> strides(target.rank(), 0);
    for (std::size_t d = 0; d < rank(); ++d) {
      const std::int64_t want = target[lead + d];
      detail::check(shape_[d] == want || shape_[d] == 1, "expand: cannot expand shape ", shape_,
                    " to ", target, " (dim ", d, ": ", shape_[d], " vs ", want, ")");
      strides[lead + d] = shape_[d] == want ? strides_[d] : 0;
    }
    out.shape_ = target;
    out.strides_ = std::move(strides);
    return out;
  }

  // Elements [start, stop) of dim `axis`, without copying.
  tensor slice(std::int64_t axis, std::int64_t start, std::int64_t stop) const {
    const auto d = shape_.normalize_axis(axis);
    detail::check(0 <= start && start <= stop && stop <= shape_[d], "slice [", start, ", ", stop,
                  ") is out of range for dim ", axis, " of size ", shape_[d], " (shape ", shape_, ")");
    tensor out = *this;
    out.offset_ += start * strides_[d];
    out.shape_[d] = stop - start;
    return out;
  }

  // Consecutive views along `axis` with the given sizes, which must add up to the dim's size.
  std::vector<tensor> split(const std::vector<std::int64_t>& sizes, std::int64_t axis) const {
    const auto d = shape_.normalize_axis(axis);
    const std::int64_t total = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
    detail::check(total == shape_[d], "split sizes ", format_sizes(sizes), " add up to ", total,
                  " but dim ", axis, " of shape ", shape_, " has size ", shape_[d]);
    std::vector<tensor> parts;
    std::int64_t start = 0;
    for (auto s : sizes) {
      parts.push_back(slice(axis, start, start + s));
      start += s;
    }
    return parts;
  }

  // ---- copies ------------------------------------------------------------------------------

  tensor contiguous() const { return is_contiguous() ? *this : to(dtype_); }
  tensor clone() const { return to(dtype_); }

  // A contiguous copy converted to `t` (bf16 rounds to nearest even).
  tensor to(decentrain::dtype t) const {
    require_defined("to");
    tensor out = empty(shape_, t);
    out.copy_from(*this);
    return out;
  }

  // Writes src's values (any dtype, same shape) into this tensor or view, in place.
  void copy_from(const tensor& src) {
    require_defined("copy_from");
    src.require_defined("copy_from (source)");
    detail::check(src.shape() == shape_, "copy_from: source shape ", src.shape(),
                  " does not match destination shape ", shape_);
    // Onto itself (a state decoded into the tensors it is then loaded into): nothing to do.
    if (src.storage_ == storage_ && src.offset_ == offset_ && src.strides_ == strides_ && src.dtype_ == dtype_) return;
    memory<Device>::copy_strided(raw_data(), dtype_, strides_.data(), src.raw_data(), src.dtype_,
                                 src.strides_.data(), shape_.sizes().data(), rank());
  }

  // True when this handle is the only one on its storage and covers all of it, so the
  // storage can be adopted (for example as a gradient buffer) without a defensive copy.
  bool is_sole_owner() const {
    return storage_ && storage_->owned && storage_.use_count() == 1 && offset_ == 0 && is_contiguous() &&
           nbytes() == storage_->bytes;
  }

  tensor& fill(double value) {
    require_defined("fill");
    detail::check(is_contiguous(), "fill: tensor of shape ", shape_, " must be contiguous");
    memory<Device>::fill(raw_data(), dtype_, static_cast<std::size_t>(numel()), value);
    return *this;
  }

  // All values as T, in row-major order, on the host.
  template <class T>
  std::vector<T> to_vector() const {
    tensor c = to(dtype_of<T>);
    std::vector<T> out(static_cast<std::size_t>(c.numel()));
    memory<Device>::copy_to_host(out.data(), c.raw_data(), c.nbytes());
    return out;
  }

  // The value of a one-element tensor.
  template <class T = double>
  T item() const {
    detail::check(numel() == 1, "item() needs a tensor with one element, got shape ", shape_);
    return to_vector<T>()[0];
  }

  // Value at a multi-index, read on the host, as double.
  double at(std::initializer_list<std::int64_t> index) const {
    require_defined("at");
    detail::check(index.size() == rank(), "at: index has ", index.size(),
                  " coordinates but the tensor has rank ", rank());
    std::int64_t off = 0;
    std::size_t d = 0;
    for (auto i : index) {
      detail::check(i >= 0 && i < shape_[d], "at: index ", i, " is out of range for dim ", d,
                    " of size ", shape_[d]);
      off += i * strides_[d++];
    }
    return slice_element(off).template item<double>();
  }

 private:
  tensor slice_element(std::int64_t off) const {
    tensor out = *this;
    out.offset_ += off;
    out.shape_ = decentrain::shape{};
    out.strides_.clear();
    return out;
  }
  void require_defined(const char* what) const {
    detail::check(defined(), "tensor::", what, " called on an undefined tensor");
  }
  static std::string format_sizes(const std::vector<std::int64_t>& s) {
    std::string out = "(";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + ")";
  }

  std::shared_ptr<detail::storage<Device>> storage_;
  decentrain::shape shape_;
  std::vector<std::int64_t> strides_;
  std::int64_t offset_ = 0;
  decentrain::dtype dtype_ = decentrain::dtype::f32;
};

}  // namespace decentrain
