// The segment allocator behind dt::cuda memory, driven on the CPU by a fake segment source
// with a capacity: splitting, merging, best fit, pools, out-of-memory recovery and the counts.
#include <decentrain/core/caching_allocator.hpp>
#include <decentrain/core/rng.hpp>
#include <decentrain/detail/error.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace {

// Hands out host memory up to a capacity and records every call.
struct fake_source {
  struct state {
    std::size_t capacity = std::size_t{1} << 34, in_use = 0;
    int allocations = 0, frees = 0, synchronizations = 0;
    std::map<void*, std::size_t> segments;
  };
  std::shared_ptr<state> s = std::make_shared<state>();

  void* allocate(std::size_t bytes) {
    if (s->in_use + bytes > s->capacity) return nullptr;
    void* p = ::operator new(bytes, std::align_val_t{256});
    s->in_use += bytes;
    ++s->allocations;
    s->segments.emplace(p, bytes);
    return p;
  }
  void free(void* p) noexcept {
    const auto it = s->segments.find(p);
    if (it == s->segments.end()) return;  // the tests check frees against allocations
    s->in_use -= it->second;
    s->segments.erase(it);
    ++s->frees;
    ::operator delete(p, std::align_val_t{256});
  }
  void synchronize() noexcept { ++s->synchronizations; }
  std::string describe() const { return "fake device has " + std::to_string(s->capacity - s->in_use) + " bytes free"; }
};

using allocator = decentrain::detail::caching_allocator<fake_source, int>;
constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

std::uintptr_t address(void* p) { return reinterpret_cast<std::uintptr_t>(p); }

}  // namespace

TEST_CASE("requests round to 512 bytes and take segments by size", "[memory][allocator]") {
  CHECK(allocator::round_size(0) == 512);
  CHECK(allocator::round_size(1) == 512);
  CHECK(allocator::round_size(512) == 512);
  CHECK(allocator::round_size(513) == 1024);
  CHECK(allocator::segment_size(512) == 2 * MiB);
  CHECK(allocator::segment_size(MiB) == 2 * MiB);
  CHECK(allocator::segment_size(MiB + 512) == 20 * MiB);
  CHECK(allocator::segment_size(10 * MiB - 512) == 20 * MiB);
  CHECK(allocator::segment_size(10 * MiB) == 10 * MiB);
  CHECK(allocator::segment_size(11 * MiB) == 12 * MiB);
  CHECK(allocator::segment_size(100 * MiB + 1) == 102 * MiB);
}

TEST_CASE("small requests share one segment, freed blocks merge back whole", "[memory][allocator]") {
  fake_source src;
  allocator a(src);
  std::vector<void*> ps;
  for (int i = 0; i < 8; ++i) ps.push_back(a.allocate(100 * KiB, 0));
  CHECK(src.s->allocations == 1);
  CHECK(a.reserved_bytes() == 2 * MiB);
  CHECK(a.allocated_bytes() == 8 * allocator::round_size(100 * KiB));
  // Consecutive blocks of one segment: each starts where the previous ended.
  for (std::size_t i = 1; i < ps.size(); ++i) CHECK(address(ps[i]) == address(ps[i - 1]) + allocator::round_size(100 * KiB));
  // Every byte of every block is usable and blocks do not overlap.
  for (std::size_t i = 0; i < ps.size(); ++i) std::memset(ps[i], static_cast<int>(i), 100 * KiB);
  for (std::size_t i = 0; i < ps.size(); ++i)
    CHECK(static_cast<unsigned char*>(ps[i])[100 * KiB - 1] == static_cast<unsigned char>(i));

  // Freed in an order that leaves holes first, then fills them: all merge into one block.
  for (std::size_t i : {1, 3, 5, 7, 0, 2, 4, 6}) CHECK(a.deallocate(ps[i]));
  CHECK(a.allocated_bytes() == 0);
  CHECK(a.cached_bytes() == 2 * MiB);
  // The whole segment serves a request as large as the segment without a new one.
  void* whole = a.allocate(MiB, 0);
  CHECK(whole == ps[0]);
  CHECK(src.s->allocations == 1);
  a.deallocate(whole);
  a.release();
  CHECK(src.s->frees == 1);
  CHECK(a.reserved_bytes() == 0);
  CHECK(src.s->in_use == 0);
}

TEST_CASE("a large free block serves smaller requests: best fit, the rest stays free", "[memory][allocator]") {
  fake_source src;
  allocator a(src);
  void* big = a.allocate(64 * MiB, 0);
  CHECK(a.reserved_bytes() == 64 * MiB);
  a.deallocate(big);
  // Sizes that an exact-size cache would each have reserved anew.
  void* x = a.allocate(30 * MiB, 0);
  void* y = a.allocate(20 * MiB, 0);
  void* z = a.allocate(14 * MiB - 4 * KiB, 0);
  CHECK(src.s->allocations == 1);
  CHECK(a.reserved_bytes() == 64 * MiB);
  CHECK(address(y) == address(x) + 30 * MiB);
  CHECK(address(z) == address(y) + 20 * MiB);
  // 4 KiB left over is not worth a block of its own in the large pool: z owns it.
  CHECK(a.allocated_bytes() == 64 * MiB);
  CHECK(a.cached_bytes() == 0);

  // Best fit: with holes of 30 and 14 MiB free, a 12 MiB request takes the 14 MiB one.
  a.deallocate(x);
  a.deallocate(z);
  CHECK(a.allocate(12 * MiB, 0) == z);
  CHECK(a.allocate(25 * MiB, 0) == x);  // the 30 MiB hole was left for it
  CHECK(src.s->allocations == 1);
}

TEST_CASE("large blocks are split only when more than 1 MiB would remain", "[memory][allocator]") {
  fake_source src;
  allocator a(src);
  void* p = a.allocate(12 * MiB, 0);  // a segment of its own: 12 MiB
  a.deallocate(p);
  void* q = a.allocate(11 * MiB + 512, 0);  // would leave just under 1 MiB: not split
  CHECK(q == p);
  CHECK(a.allocated_bytes() == 12 * MiB);
  a.deallocate(q);
  void* r = a.allocate(10 * MiB, 0);  // leaves 2 MiB: split
  CHECK(a.allocated_bytes() == 10 * MiB);
  void* s = a.allocate(2 * MiB, 0);
  CHECK(address(s) == address(r) + 10 * MiB);
  CHECK(src.s->allocations == 1);
}

TEST_CASE("small and large requests, and different pools, never share blocks", "[memory][allocator]") {
  fake_source src;
  allocator a(src);
  void* large = a.allocate(4 * MiB, 1);  // in a 20 MiB segment of pool 1
  a.deallocate(large);
  void* small = a.allocate(64 * KiB, 1);  // small pool: a 2 MiB segment of its own
  CHECK(src.s->allocations == 2);
  void* other = a.allocate(4 * MiB, 2);  // pool 2 cannot take pool 1's free block
  CHECK(src.s->allocations == 3);
  void* again = a.allocate(4 * MiB, 1);
  CHECK(again == large);
  CHECK(src.s->allocations == 3);
  CHECK(small != nullptr);
  CHECK(other != nullptr);
  CHECK(a.segment_count() == 3);
}

TEST_CASE("out of memory: free segments go back and the request is retried, else a clear error",
          "[memory][allocator]") {
  fake_source src;
  src.s->capacity = 64 * MiB;
  allocator a(src);
  void* p = a.allocate(40 * MiB, 0);
  a.deallocate(p);
  CHECK(a.reserved_bytes() == 40 * MiB);
  // A 50 MiB request does not fit next to the cached 40 MiB segment, which is given back.
  void* q = a.allocate(50 * MiB, 0);
  CHECK(q != nullptr);
  CHECK(src.s->frees == 1);
  CHECK(src.s->synchronizations >= 1);
  CHECK(a.reserved_bytes() == 50 * MiB);
  // Nothing free to give back: the error names the request, what is held and the device.
  try {
    (void)a.allocate(20 * MiB, 0);
    FAIL("no error");
  } catch (const decentrain::error& e) {
    const std::string what = e.what();
    CHECK(what.find("out of memory") != std::string::npos);
    CHECK(what.find(std::to_string(20 * MiB)) != std::string::npos);
    CHECK(what.find("50 MiB in live tensors") != std::string::npos);
    CHECK(what.find("fake device has") != std::string::npos);
  }
  // The failure changed nothing: the live block is still there and can be freed and reused.
  CHECK(a.allocated_bytes() == 50 * MiB);
  CHECK(a.deallocate(q));
  CHECK(a.allocate(20 * MiB, 0) == q);
}

TEST_CASE("unknown and double frees are ignored, never cached", "[memory][allocator]") {
  fake_source src;
  allocator a(src);
  void* p = a.allocate(MiB, 0);
  int local = 0;
  CHECK_FALSE(a.deallocate(&local));
  CHECK(a.deallocate(p));
  CHECK_FALSE(a.deallocate(p));
  CHECK(a.allocated_bytes() == 0);
  void* q = a.allocate(MiB, 0);
  void* r = a.allocate(MiB, 0);
  CHECK(q != r);  // the block was cached once, not twice
}

TEST_CASE("peaks follow allocated and reserved bytes and reset to the present", "[memory][allocator]") {
  fake_source src;
  allocator a(src);
  void* p = a.allocate(30 * MiB, 0);
  void* q = a.allocate(30 * MiB, 0);
  a.deallocate(p);
  CHECK(a.peak_allocated_bytes() == 60 * MiB);
  CHECK(a.peak_reserved_bytes() == 60 * MiB);
  a.reset_peak();
  CHECK(a.peak_allocated_bytes() == 30 * MiB);
  CHECK(a.peak_reserved_bytes() == 60 * MiB);
  a.release();
  CHECK(a.reserved_bytes() == 30 * MiB);
  CHECK(a.peak_reserved_bytes() == 60 * MiB);
  a.reset_peak();
  CHECK(a.peak_reserved_bytes() == 30 * MiB);
  a.deallocate(q);
}

TEST_CASE("a repeated step of mixed sizes reserves nothing after its first run", "[memory][allocator]") {
  // The shape of a training step: parameters-sized blocks that live throughout, activations
  // allocated in the forward and freed in reverse, temporaries of varying sizes in between.
  fake_source src;
  allocator a(src);
  std::vector<void*> params;
  for (int i = 0; i < 6; ++i) params.push_back(a.allocate((3 + i) * MiB + 1000, 0));
  auto step = [&](std::size_t quarters) {  // the step's size in quarters of the full one
    std::vector<void*> acts;
    for (std::size_t l = 0; l < 12; ++l) {
      acts.push_back(a.allocate(quarters * (24 * MiB + 4096 * l) / 4, 0));
      void* tmp = a.allocate(quarters * (7 * MiB + 512 * l) / 4, 0);
      acts.push_back(a.allocate(96 * KiB, 0));
      a.deallocate(tmp);
    }
    while (!acts.empty()) {
      void* g = a.allocate(quarters * 5 * MiB / 4, 0);
      a.deallocate(acts.back());
      acts.pop_back();
      a.deallocate(g);
    }
  };
  step(4);
  const std::size_t after_first = a.reserved_bytes();
  const int segments = src.s->allocations;
  for (int i = 0; i < 5; ++i) step(4);
  CHECK(a.reserved_bytes() == after_first);
  CHECK(src.s->allocations == segments);
  // A smaller step (another batch size) fits in what the larger one reserved.
  step(3);
  CHECK(src.s->allocations == segments);
  // Reserved stays within a small factor of the step's peak of live bytes.
  CHECK(static_cast<double>(a.peak_reserved_bytes()) <= 1.25 * static_cast<double>(a.peak_allocated_bytes()));
  for (void* p : params) a.deallocate(p);
}

TEST_CASE("random allocations and frees keep blocks disjoint and the counts exact", "[memory][allocator]") {
  fake_source src;
  allocator a(src);
  decentrain::rng gen(7, "allocator-fuzz");
  struct live {
    void* p;
    std::size_t bytes;
    unsigned char tag;
  };
  std::vector<live> blocks;
  std::size_t expected_allocated = 0;
  for (int i = 0; i < 3000; ++i) {
    if (blocks.empty() || gen.below(100) < 55) {
      const std::size_t bytes = gen.below(4) == 0 ? 1 + gen.below(3 * MiB) : 1 + gen.below(40 * KiB);
      const int pool = static_cast<int>(gen.below(2));
      void* p = a.allocate(bytes, pool);
      const auto tag = static_cast<unsigned char>(i);
      std::memset(p, tag, bytes);
      blocks.push_back({p, bytes, tag});
      expected_allocated += allocator::round_size(bytes) <= allocator::small_request
                                ? allocator::round_size(bytes)
                                : 0;  // large blocks may own an unsplit tail; checked below
    } else {
      const auto k = static_cast<std::size_t>(gen.below(blocks.size()));
      const live b = blocks[k];
      // Nobody wrote over this block while it lived.
      const auto* bytes = static_cast<const unsigned char*>(b.p);
      CHECK((bytes[0] == b.tag && bytes[b.bytes / 2] == b.tag && bytes[b.bytes - 1] == b.tag));
      if (allocator::round_size(b.bytes) <= allocator::small_request) expected_allocated -= allocator::round_size(b.bytes);
      CHECK(a.deallocate(b.p));
      blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  // Live blocks are pairwise disjoint.
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
  for (const auto& b : blocks) ranges.emplace_back(address(b.p), address(b.p) + b.bytes);
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) CHECK(ranges[i].first >= ranges[i - 1].second);
  std::size_t small_live = 0, at_least = 0;
  for (const auto& b : blocks) {
    const auto size = allocator::round_size(b.bytes);
    at_least += size;
    if (size <= allocator::small_request) small_live += size;
  }
  CHECK(small_live == expected_allocated);
  CHECK(a.allocated_bytes() >= at_least);
  CHECK(a.allocated_bytes() <= at_least + blocks.size() * allocator::small_request);
  for (const auto& b : blocks) a.deallocate(b.p);
  CHECK(a.allocated_bytes() == 0);
  // Everything merged back: every segment is whole again and goes back to the source.
  a.release();
  CHECK(a.reserved_bytes() == 0);
  CHECK(src.s->in_use == 0);
  CHECK(src.s->frees == src.s->allocations);
}

TEST_CASE("the destructor gives every segment back, live blocks included", "[memory][allocator]") {
  fake_source src;
  {
    allocator a(src);
    (void)a.allocate(3 * MiB, 0);
    a.deallocate(a.allocate(200 * KiB, 0));
    (void)a.allocate(30 * MiB, 1);
  }
  CHECK(src.s->in_use == 0);
  CHECK(src.s->frees == src.s->allocations);
}
