// Reader for the PyTorch reference fixtures written by tests/reference/make_fixtures.py.
// Format (little-endian): magic "DTFX", u32 version, u32 tensor count; per tensor: u32 name
// length, name bytes, u8 dtype (0 f32, 1 f64, 2 i32), u32 rank, i64 sizes[rank], raw data.
#pragma once

#include <decentrain/decentrain.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace dt = decentrain;

inline constexpr std::uint32_t fixture_version = 1;

class fixture {
 public:
  explicit fixture(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    dt::detail::check(in.good(), "fixture: cannot open ", path,
                      " (regenerate with tests/reference/make_fixtures.py)");
    char magic[4];
    read(in, magic, 4, path);
    dt::detail::check(std::memcmp(magic, "DTFX", 4) == 0, "fixture: ", path, " has a bad magic number");
    const auto version = read_u32(in, path);
    dt::detail::check(version == fixture_version, "fixture: ", path, " has version ", version,
                      ", expected ", fixture_version);
    const auto count = read_u32(in, path);
    for (std::uint32_t i = 0; i < count; ++i) {
      std::string name(read_u32(in, path), '\0');
      read(in, name.data(), name.size(), path);
      std::uint8_t code;
      read(in, &code, 1, path);
      const auto rank = read_u32(in, path);
      std::vector<std::int64_t> sizes(rank);
      read(in, sizes.data(), rank * sizeof(std::int64_t), path);
      const dt::dtype type = code == 0 ? dt::dtype::f32 : code == 1 ? dt::dtype::f64 : dt::dtype::i32;
      dt::detail::check(code <= 2, "fixture: ", path, ": unknown dtype code ", int(code));
      auto t = dt::tensor<>::empty(dt::shape(sizes), type);
      read(in, t.raw_data(), t.nbytes(), path);
      tensors_[name] = t;
    }
  }

  const dt::tensor<>& operator[](const std::string& name) const {
    auto it = tensors_.find(name);
    dt::detail::check(it != tensors_.end(), "fixture has no tensor named '", name, "'");
    return it->second;
  }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }

 private:
  static void read(std::ifstream& in, void* dst, std::size_t n, const std::string& path) {
    in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    dt::detail::check(in.good(), "fixture: ", path, " is truncated");
  }
  static std::uint32_t read_u32(std::ifstream& in, const std::string& path) {
    std::uint32_t v;
    read(in, &v, 4, path);
    return v;
  }
  std::map<std::string, dt::tensor<>> tensors_;
};
