// safetensors files (the Hugging Face format): an 8-byte little-endian header length, a JSON
// header mapping each name to {dtype, shape, data_offsets}, then the raw little-endian data.
// Reading checks every offset, size and dtype against the file before touching the data, so a
// truncated or hostile file fails with a message naming the tensor.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "decentrain/core/tensor.hpp"
#include "decentrain/io/atomic_file.hpp"
#include "decentrain/io/json.hpp"

namespace decentrain::io {

using named_tensors = std::map<std::string, tensor<cpu>>;

namespace safetensors_detail {
inline const char* dtype_code(dtype t) {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::f64: return "F64";
    case dtype::bf16: return "BF16";
    case dtype::i32: return "I32";
  }
  return "?";
}
inline dtype from_code(const std::string& code, const std::string& name) {
  if (code == "F32") return dtype::f32;
  if (code == "F64") return dtype::f64;
  if (code == "BF16") return dtype::bf16;
  if (code == "I32") return dtype::i32;
  decentrain::detail::fail("safetensors: tensor '", name, "' has dtype ", code,
                           ", which decentrain does not read (F32, F64, BF16, I32)");
}
inline constexpr std::uint64_t max_header = std::uint64_t{100} << 20;  // as the reference implementation
}  // namespace safetensors_detail

// The bytes of a safetensors file holding `tensors` (and `metadata` as __metadata__).
inline std::string encode_safetensors(const named_tensors& tensors, const std::map<std::string, std::string>& metadata = {}) {
  // Built by appending: `"," + std::string` trips a GCC 12 -Wrestrict false positive.
  std::string header = "{";
  auto separate = [&header] {
    if (header.size() > 1 && header.back() != '{') header += ',';
  };
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      separate();
      header += json_quote(k);
      header += ':';
      header += json_quote(v);
    }
    header += '}';
  }
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    decentrain::detail::check(name != "__metadata__", "safetensors: '__metadata__' is reserved");
    decentrain::detail::check(t.defined(), "safetensors: tensor '", name, "' is undefined");
    separate();
    header += json_quote(name);
    header += ":{\"dtype\":\"";
    header += safetensors_detail::dtype_code(t.dtype());
    header += "\",\"shape\":[";
    for (std::size_t d = 0; d < t.rank(); ++d) {
      if (d) header += ',';
      header += std::to_string(t.shape()[d]);
    }
    header += "],\"data_offsets\":[";
    header += std::to_string(offset);
    header += ',';
    header += std::to_string(offset + t.nbytes());
    header += "]}";
    offset += t.nbytes();
  }
  header += '}';
  while (header.size() % 8) header += ' ';  // the format pads the header so data is 8-aligned
  std::string file;
  file.reserve(8 + header.size() + offset);
  for (int i = 0; i < 8; ++i) file += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  file += header;
  for (const auto& [name, t] : tensors) {
    const auto c = t.contiguous();
    file.append(static_cast<const char*>(c.raw_data()), c.nbytes());
  }
  return file;
}

inline void save_safetensors(const std::filesystem::path& path, const named_tensors& tensors,
                             const std::map<std::string, std::string>& metadata = {}) {
  write_file_atomically(path, encode_safetensors(tensors, metadata));
}

// Every tensor in `file`, the bytes of a safetensors file; `where` names it in errors and
// `metadata` (optional) receives the __metadata__ strings.
inline named_tensors parse_safetensors(std::string_view file, const std::string& where,
                                       std::map<std::string, std::string>* metadata = nullptr) {
  decentrain::detail::check(file.size() >= 8, where, " is truncated (", file.size(), " bytes)");
  std::uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= static_cast<std::uint64_t>(static_cast<unsigned char>(file[static_cast<std::size_t>(i)])) << (8 * i);
  decentrain::detail::check(header_size <= safetensors_detail::max_header && header_size <= file.size() - 8, where,
                            " declares a ", header_size, "-byte header but the file has ", file.size() - 8,
                            " bytes after the length");
  json_value header;
  try {
    header = parse_json(file.substr(8, header_size));
  } catch (const error& e) {
    decentrain::detail::fail(where, ": bad header: ", e.what());
  }
  decentrain::detail::check(header.is(json_value::kind::object), where, ": the header is not a JSON object");
  const std::uint64_t data_size = file.size() - 8 - header_size;
  const char* data = file.data() + 8 + header_size;
  named_tensors out;
  for (const auto& [name, entry] : header.members) {
    if (name == "__metadata__") {
      if (metadata)
        for (const auto& [k, v] : entry.members) (*metadata)[k] = v.as_string();
      continue;
    }
    try {
      const dtype t = safetensors_detail::from_code(entry.at("dtype").as_string(), name);
      const auto& dims = entry.at("shape");
      decentrain::detail::check(dims.is(json_value::kind::array) && dims.items.size() <= 8, "shape must be an array of at most 8 sizes");
      std::vector<std::int64_t> sizes;
      std::uint64_t numel = 1;
      for (const auto& d : dims.items) {
        const auto s = d.as_int();
        decentrain::detail::check(s >= 0 && (s == 0 || numel <= data_size / static_cast<std::uint64_t>(s)), "size ", s,
                                  " does not fit the file");
        numel *= static_cast<std::uint64_t>(s);
        sizes.push_back(s);
      }
      const auto& offs = entry.at("data_offsets");
      decentrain::detail::check(offs.is(json_value::kind::array) && offs.items.size() == 2, "data_offsets must be [begin, end]");
      const auto begin = offs.items[0].as_int(), end = offs.items[1].as_int();
      decentrain::detail::check(begin >= 0 && begin <= end && static_cast<std::uint64_t>(end) <= data_size,
                                "data_offsets [", begin, ", ", end, "] fall outside the ", data_size, "-byte data section");
      const std::uint64_t bytes = numel * dtype_size(t);
      decentrain::detail::check(static_cast<std::uint64_t>(end - begin) == bytes, "data_offsets span ", end - begin,
                                " bytes but shape and dtype need ", bytes);
      auto tensor_out = tensor<cpu>::empty(shape(sizes), t);
      if (bytes) std::memcpy(tensor_out.raw_data(), data + begin, bytes);
      out.emplace(name, std::move(tensor_out));
    } catch (const error& e) {
      decentrain::detail::fail(where, ": tensor '", name, "': ", e.what());
    }
  }
  return out;
}

// Every tensor in the file at `path`; `metadata` (optional) receives the __metadata__ strings.
inline named_tensors load_safetensors(const std::filesystem::path& path,
                                      std::map<std::string, std::string>* metadata = nullptr) {
  return parse_safetensors(read_file(path), "safetensors " + path.string(), metadata);
}

}  // namespace decentrain::io
