// A caching allocator that carves blocks out of large segments and merges them back on free,
// over any slow source of segments (cudaMalloc for dt::cuda). Device-independent, so its logic
// is tested on the CPU with a fake source.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "decentrain/detail/error.hpp"

namespace decentrain::detail {

// Where segments come from. allocate returns nullptr when the device is out of memory (the
// allocator then gives back its free segments and tries once more); synchronize waits until
// the device has finished with every block before segments are given back; describe says
// what the device has left, for the out-of-memory message.
template <class S>
concept segment_source = requires(S s, const S cs, void* p, std::size_t n) {
  { s.allocate(n) } -> std::same_as<void*>;
  { s.free(p) } noexcept;
  { s.synchronize() } noexcept;
  { cs.describe() } -> std::convertible_to<std::string>;
};

// Why segments and not one block per request: an exact-size cache holds a freed block until a
// request of the same size comes back, so when the sizes in a step change (a different batch,
// the loss's chunks, the optimizer's first step) reserved memory grows far past what is live.
// Here a free block serves any smaller request (best fit), the rest of it stays free, and
// neighbouring free blocks merge, as in PyTorch's allocator:
// - requests round up to 512 bytes;
// - requests up to 1 MiB come from 2 MiB segments of their own, so small long-lived tensors do
//   not pin large segments;
// - larger requests come from 20 MiB segments below 10 MiB, else from a segment of their own
//   size rounded to 2 MiB; a large block is split only when more than 1 MiB would be left;
// - blocks never move between pools (`Pool`: device and stream for CUDA), since reuse is safe
//   only where work is ordered after the block's last use;
// - on out-of-memory every wholly free segment goes back to the source and the request is
//   tried again.
template <class Source, class Pool>
class caching_allocator {
  static_assert(segment_source<Source>,
                "caching_allocator<Source, Pool>: Source must provide void* allocate(std::size_t) (nullptr when "
                "out of memory), void free(void*) noexcept, void synchronize() noexcept and std::string "
                "describe() const");
  static_assert(std::totally_ordered<Pool>, "caching_allocator<Source, Pool>: Pool must be totally ordered (<, ==)");

 public:
  static constexpr std::size_t granule = 512;
  static constexpr std::size_t small_request = std::size_t{1} << 20;
  static constexpr std::size_t small_segment = std::size_t{2} << 20;
  static constexpr std::size_t large_segment = std::size_t{20} << 20;
  static constexpr std::size_t shared_segment_limit = std::size_t{10} << 20;
  static constexpr std::size_t segment_granule = std::size_t{2} << 20;

  explicit caching_allocator(Source source = Source{}) : source_(std::move(source)) {}
  caching_allocator(const caching_allocator&) = delete;
  caching_allocator& operator=(const caching_allocator&) = delete;
  // Every segment goes back to the source, live blocks included (their owners outlived us).
  ~caching_allocator() {
    std::vector<block*> heads;
    for (auto& [p, b] : live_) heads.push_back(b);
    for (block* b : free_) heads.push_back(b);
    if (!heads.empty()) source_.synchronize();
    for (block* b : heads) {
      if (!b->prev) source_.free(b->ptr);
    }
    for (block* b : heads) delete b;
  }

  static std::size_t round_size(std::size_t bytes) {
    return std::max<std::size_t>((bytes + granule - 1) / granule * granule, granule);
  }
  static std::size_t segment_size(std::size_t size) {
    if (size <= small_request) return small_segment;
    if (size < shared_segment_limit) return large_segment;
    return (size + segment_granule - 1) / segment_granule * segment_granule;
  }

  void* allocate(std::size_t bytes, const Pool& pool) {
    const std::size_t size = round_size(bytes);
    const bool small = size <= small_request;
    std::lock_guard lock(mutex_);
    block* b = take_free(pool, small, size);
    if (!b) b = new_segment(pool, small, size);
    split(b, size);
    b->allocated = true;
    live_.emplace(b->ptr, b);
    allocated_ += b->size;
    peak_allocated_ = std::max(peak_allocated_, allocated_);
    return b->ptr;
  }

  // False when p was not handed out by this allocator (or was already freed): such a pointer
  // is ignored rather than cached, so no memory is ever handed out twice.
  bool deallocate(void* p) noexcept {
    std::lock_guard lock(mutex_);
    const auto it = live_.find(p);
    if (it == live_.end()) return false;
    block* b = it->second;
    live_.erase(it);
    b->allocated = false;
    allocated_ -= b->size;
    if (b->prev && !b->prev->allocated) b = merge(b->prev, b);
    if (b->next && !b->next->allocated) b = merge(b, b->next);
    free_.insert(b);
    return true;
  }

  // Gives every wholly free segment back to the source (after the device finished with them).
  void release() noexcept {
    std::lock_guard lock(mutex_);
    release_locked();
  }

  // Bytes in blocks handed out (rounded sizes), and the most there were since reset_peak().
  std::size_t allocated_bytes() const { return locked([&] { return allocated_; }); }
  std::size_t peak_allocated_bytes() const { return locked([&] { return peak_allocated_; }); }
  // Bytes in segments taken from the source, and the most there were since reset_peak().
  std::size_t reserved_bytes() const { return locked([&] { return reserved_; }); }
  std::size_t peak_reserved_bytes() const { return locked([&] { return peak_reserved_; }); }
  // Reserved but not handed out: free blocks, and the unused tails of blocks too small to split.
  std::size_t cached_bytes() const { return locked([&] { return reserved_ - allocated_; }); }
  std::size_t segment_count() const { return locked([&] { return segments_; }); }
  void reset_peak() {
    std::lock_guard lock(mutex_);
    peak_allocated_ = allocated_;
    peak_reserved_ = reserved_;
  }

  Source& source() { return source_; }

 private:
  struct block {
    Pool pool;
    bool small;
    std::size_t size;
    char* ptr;
    bool allocated = false;
    block* prev = nullptr;  // the neighbours in the same segment
    block* next = nullptr;
  };
  // Free blocks by pool, then size (best fit is the first one at or after the request), then
  // address (lower blocks first, which keeps the ends of segments free to merge).
  struct free_order {
    bool operator()(const block* a, const block* b) const {
      return std::tie(a->pool, a->small, a->size, a->ptr) < std::tie(b->pool, b->small, b->size, b->ptr);
    }
  };

  template <class F>
  auto locked(F&& f) const {
    std::lock_guard lock(mutex_);
    return f();
  }

  block* take_free(const Pool& pool, bool small, std::size_t size) {
    block key{pool, small, size, nullptr};
    const auto it = free_.lower_bound(&key);
    if (it == free_.end() || !((*it)->pool == pool) || (*it)->small != small) return nullptr;
    block* b = *it;
    free_.erase(it);
    return b;
  }

  block* new_segment(const Pool& pool, bool small, std::size_t size) {
    const std::size_t bytes = segment_size(size);
    void* p = source_.allocate(bytes);
    if (!p) {
      release_locked();
      p = source_.allocate(bytes);
    }
    if (!p)
      fail("out of memory: could not reserve a segment of ", bytes, " bytes for a request of ", size,
           " bytes (", allocated_ >> 20, " MiB in live tensors, ", reserved_ >> 20,
           " MiB reserved by decentrain; ", source_.describe(), ")");
    reserved_ += bytes;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    ++segments_;
    return new block{pool, small, bytes, static_cast<char*>(p)};
  }

  // Cuts b down to size when the rest is worth keeping as a free block of its own.
  void split(block* b, std::size_t size) {
    const std::size_t rest = b->size - size;
    if (rest < granule || (!b->small && rest <= small_request)) return;
    auto* tail = new block{b->pool, b->small, rest, b->ptr + size};
    tail->prev = b;
    tail->next = b->next;
    if (b->next) b->next->prev = tail;
    b->next = tail;
    b->size = size;
    free_.insert(tail);
  }

  // Joins two neighbours, the second of which is not in free_ (it is being freed) or is free;
  // returns the joined block, out of free_.
  block* merge(block* first, block* second) {
    free_.erase(first);
    free_.erase(second);
    first->size += second->size;
    first->next = second->next;
    if (second->next) second->next->prev = first;
    delete second;
    return first;
  }

  void release_locked() noexcept {
    std::vector<block*> whole;
    for (block* b : free_)
      if (!b->prev && !b->next) whole.push_back(b);
    if (whole.empty()) return;
    source_.synchronize();
    for (block* b : whole) {
      free_.erase(b);
      source_.free(b->ptr);
      reserved_ -= b->size;
      --segments_;
      delete b;
    }
  }

  Source source_;
  mutable std::mutex mutex_;
  std::set<block*, free_order> free_;
  std::unordered_map<void*, block*> live_;
  std::size_t allocated_ = 0, peak_allocated_ = 0, reserved_ = 0, peak_reserved_ = 0, segments_ = 0;
};

}  // namespace decentrain::detail
