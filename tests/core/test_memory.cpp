// The CPU block cache: freed large blocks are reused, small ones are not held, the limit holds.
#include <decentrain/decentrain.hpp>

#include <catch2/catch.hpp>

namespace dt = decentrain;
using mem = dt::memory<dt::cpu>;

TEST_CASE("large freed blocks are reused, small ones go back to the system", "[memory]") {
  mem::release_cached();
  const void* first = nullptr;
  {
    auto t = dt::zeros(dt::shape{1 << 20});  // 4 MiB
    first = t.raw_data();
  }
  CHECK(mem::cached_bytes() >= (std::size_t{4} << 20));
  {
    auto t = dt::zeros(dt::shape{(1 << 20) - 100});  // same size class
    CHECK(t.raw_data() == first);
    CHECK(reinterpret_cast<std::uintptr_t>(t.raw_data()) % 64 == 0);
  }
  mem::release_cached();
  CHECK(mem::cached_bytes() == 0);
  { auto small = dt::zeros(dt::shape{100}); }
  CHECK(mem::cached_bytes() == 0);
}

TEST_CASE("size classes waste at most an eighth", "[memory]") {
  using cache = dt::detail::block_cache;
  for (std::size_t bytes : {std::size_t{65536}, std::size_t{70000}, std::size_t{1} << 24, (std::size_t{1} << 24) + 1,
                            std::size_t{123456789}}) {
    const auto size = cache::size_class(bytes);
    CHECK(size >= bytes);
    CHECK(static_cast<double>(size) <= bytes * 1.125 + 1);
  }
  CHECK(cache::size_class(1000) == 1000);
}

TEST_CASE("the cache limit bounds what is held, and 0 disables caching", "[memory]") {
  mem::release_cached();
  mem::set_cache_limit(0);
  { auto t = dt::zeros(dt::shape{1 << 20}); }
  CHECK(mem::cached_bytes() == 0);
  mem::set_cache_limit(std::size_t{6} << 20);
  {
    auto a = dt::zeros(dt::shape{1 << 20});
    auto b = dt::zeros(dt::shape{1 << 20});
  }
  CHECK(mem::cached_bytes() == (std::size_t{4} << 20));  // the second 4 MiB block would pass 6 MiB
  mem::set_cache_limit(std::size_t{1} << 30);
  mem::release_cached();
}

TEST_CASE("allocated bytes follow live tensors and the peak keeps their high-water mark", "[memory]") {
  const auto before = mem::allocated_bytes();
  mem::reset_peak();
  CHECK(mem::peak_allocated_bytes() == before);
  {
    auto a = dt::zeros(dt::shape{1 << 20});  // 4 MiB, a size class of its own
    CHECK(mem::allocated_bytes() == before + (std::size_t{4} << 20));
    {
      auto b = dt::zeros(dt::shape{100});  // small blocks count too, at their size
      CHECK(mem::allocated_bytes() == before + (std::size_t{4} << 20) + 400);
    }
    CHECK(mem::allocated_bytes() == before + (std::size_t{4} << 20));
  }
  CHECK(mem::allocated_bytes() == before);  // cached, not live
  CHECK(mem::peak_allocated_bytes() == before + (std::size_t{4} << 20) + 400);
  mem::reset_peak();
  CHECK(mem::peak_allocated_bytes() == before);
}
