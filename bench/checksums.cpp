// Checkpoint checksums: how fast each hash a checkpoint version uses reads a large buffer
// (FNV-1a: version 1, XXH64: 2, XXH3: 3), beside memcpy of the same buffer on the same core, and
// what a save and a load of a checkpoint that size cost with the current version.
//
//   bench_checksums [--mb 1024] [--repeats 5] [--out bench/results/checksums.json]
#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "args.hpp"
#include "output_file.hpp"

namespace dt = decentrain;

namespace {

template <class F>
double best_seconds(int repeats, F&& f) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  bench::args a(argc, argv, "usage: bench_checksums [--mb N] [--repeats R] [--out FILE]");
  const auto mb = std::stoll(a.value("mb", "1024"));
  const int repeats = std::stoi(a.value("repeats", "5"));
  const std::string out_path = a.value("out", "bench/results/checksums.json");
  a.finish();
  dt::detail::check(mb >= 1 && repeats >= 1, "--mb and --repeats must be positive");

  const auto bytes = static_cast<std::size_t>(mb) << 20;
  std::string buf(bytes, '\0'), copy(bytes, '\0');
  for (std::size_t i = 0; i < bytes; ++i) buf[i] = static_cast<char>((i * 2654435761u) >> 13);
  volatile std::uint64_t sink = 0;
  struct row {
    const char* name;
    double seconds;
  };
  std::vector<row> rows;
  rows.push_back({"memcpy", best_seconds(repeats, [&] { std::memcpy(copy.data(), buf.data(), bytes); sink = sink + static_cast<unsigned char>(copy[bytes / 2]); })});
  rows.push_back({"FNV-1a (version 1)", best_seconds(std::min(repeats, 2), [&] { sink = sink + dt::detail::fnv1a(buf); })});
  rows.push_back({"XXH64 (version 2)", best_seconds(repeats, [&] { sink = sink + dt::detail::xxh64(buf); })});
  rows.push_back({"XXH3 (version 3)", best_seconds(repeats, [&] { sink = sink + dt::detail::xxh3(buf); })});

  // A checkpoint of one f32 tensor of the same size, saved and loaded through the page cache.
  dt::io::checkpoint c;
  c.tensors["w"] = dt::zeros(dt::shape{static_cast<std::int64_t>(bytes / 4)});
  std::memcpy(c.tensors["w"].raw_data(), buf.data(), bytes);
  const auto file = std::filesystem::temp_directory_path() / "decentrain_bench_checksums.ckpt";
  const double save_s = best_seconds(2, [&] { dt::io::save_checkpoint(file, c); });
  const double load_s = best_seconds(2, [&] { sink = sink + static_cast<std::uint64_t>(dt::io::load_checkpoint(file).tensors.size()); });
  // Where the time goes: encoding (cereal and the checksum), the atomic write (fsync included),
  // reading the file, decoding.
  std::string encoded;
  const double encode_s = best_seconds(2, [&] { encoded = dt::io::encode_checkpoint(c); });
  const double write_s = best_seconds(2, [&] { dt::io::write_file_atomically(file, encoded); });
  const double read_s = best_seconds(2, [&] { encoded = dt::io::read_file(file); });
  const double decode_s = best_seconds(2, [&] { sink = sink + dt::io::decode_checkpoint(encoded, "bench").tensors.size(); });
  std::filesystem::remove(file);

  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("%.2f GB buffer, best of %d\n\n%-20s %10s %12s %14s\n", gb, repeats, "what", "GB/s", "x memcpy", "s per buffer");
  for (const auto& r : rows)
    std::printf("%-20s %10.2f %12.2f %14.3f\n", r.name, gb / r.seconds, rows[0].seconds / r.seconds, r.seconds);
  std::printf("\ncheckpoint of %.2f GB (version %u): save %.3f s (encode %.3f, write and fsync %.3f), load %.3f s (read %.3f, "
              "decode %.3f)\n",
              gb, dt::io::checkpoint_version, save_s, encode_s, write_s, load_s, read_s, decode_s);

  bench::output_file out(out_path);
  out << "{\"bytes\": " << bytes << ", \"repeats\": " << repeats << ", \"rows\": [";
  for (std::size_t i = 0; i < rows.size(); ++i)
    out << (i ? ", " : "") << "{\"name\": \"" << rows[i].name << "\", \"gb_per_s\": " << gb / rows[i].seconds
        << ", \"vs_memcpy\": " << rows[0].seconds / rows[i].seconds << "}";
  out << "], \"save_s\": " << save_s << ", \"encode_s\": " << encode_s << ", \"write_s\": " << write_s
      << ", \"load_s\": " << load_s << ", \"read_s\": " << read_s << ", \"decode_s\": " << decode_s << ", \"checkpoint_version\": " << dt::io::checkpoint_version
      << "}\n";
  out.close();
  std::printf("rows written to %s\n", out_path.c_str());
  return static_cast<int>(sink & 0);
}
