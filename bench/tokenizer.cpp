// GPT-2 tokenizer speed: data::gpt2_tokenizer's encode on one thread against the reference
// encoders (bench/tokenizer_reference.js under Node) on the same text in the same run, with the
// ids checked equal. Table on stdout, rows in JSON.
//   bench_tokenizer [--data TEXT] [--repeats 5] [--node-modules DIR] [--json PATH]
#include <decentrain/data/gpt2_tokenizer.hpp>
#include <decentrain/detail/hash.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "args.hpp"
#include "output_file.hpp"

namespace dt = decentrain;

namespace {
struct row {
  std::string name;
  double mb_per_s = 0;
  std::int64_t count = 0;
  std::string ids_fnv1a;
};

std::string ids_hash(const std::vector<std::int32_t>& ids) {
  std::string bytes;
  for (auto id : ids)
    for (int k = 0; k < 4; ++k) bytes += static_cast<char>((static_cast<std::uint32_t>(id) >> (8 * k)) & 0xff);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(dt::detail::fnv1a(bytes)));
  return buf;
}
}  // namespace

int main(int argc, char** argv) try {
  bench::args cli(argc, argv, "usage: bench_tokenizer [--flag value]...");
  const std::string path = cli.value("data", DECENTRAIN_SOURCE_DIR "/../shared/data/tinyshakespeare.txt");
  const int repeats = std::stoi(cli.value("repeats", "5"));
  const std::string modules = cli.value("node-modules", "/tmp/gpt2ref/node_modules");
  const std::string json_path = cli.value("json", "bench/results/tokenizer.json");
  cli.finish();
  dt::detail::check(repeats >= 1, "--repeats must be >= 1");
  std::ifstream in(path, std::ios::binary);
  dt::detail::check(in.good(), "cannot open ", path);
  const std::string text(std::istreambuf_iterator<char>(in), {});

  std::vector<row> rows;
  const auto t0 = std::chrono::steady_clock::now();
  const auto tokenizer = dt::data::gpt2_tokenizer::load(DECENTRAIN_SOURCE_DIR "/data/gpt2");
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::int32_t> ids = tokenizer.encode_ordinary(text);  // warm-up
  std::vector<double> laps;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    ids = tokenizer.encode_ordinary(text);
    laps.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(laps.begin(), laps.end());
  rows.push_back({"decentrain gpt2_tokenizer", static_cast<double>(text.size()) / 1e6 / laps[laps.size() / 2],
                  static_cast<std::int64_t>(ids.size()), ids_hash(ids)});

  const std::string command = "NODE_PATH='" + modules + "' node '" DECENTRAIN_SOURCE_DIR "/bench/tokenizer_reference.js' '" +
                              path + "' " + std::to_string(repeats);
  if (FILE* node = popen(command.c_str(), "r")) {
    char line[1024];
    while (std::fgets(line, sizeof line, node)) {
      const auto v = dt::io::parse_json(line);
      rows.push_back({v.at("name").as_string(), std::stod(v.at("mb_per_s").text), v.at("count").as_int(),
                      v.at("ids_fnv1a").as_string()});
    }
    if (pclose(node) != 0)
      std::fprintf(stderr, "the reference script failed (is gpt-3-encoder installed under %s? see bench/tokenizer_reference.js)\n",
                   modules.c_str());
  }

  std::printf("GPT-2 encode, 1 thread, %s (%.2f MB), median of %d (vocabulary load %.0f ms)\n", path.c_str(),
              static_cast<double>(text.size()) / 1e6, repeats, load_s * 1e3);
  std::printf("%-40s %10s %10s %9s %s\n", "encoder", "MB/s", "ours/it", "ids", "same ids");
  for (const auto& r : rows)
    std::printf("%-40s %10.2f %9.2fx %9lld %s\n", r.name.c_str(), r.mb_per_s, rows[0].mb_per_s / r.mb_per_s,
                static_cast<long long>(r.count), r.ids_fnv1a == rows[0].ids_fnv1a ? "yes" : "NO");
  bench::output_file json(json_path);
  json << "[\n";
  for (std::size_t i = 0; i < rows.size(); ++i)
    json << "  {\"encoder\": " << dt::io::json_quote(rows[i].name) << ", \"mb_per_s\": " << rows[i].mb_per_s
         << ", \"ids\": " << rows[i].count << ", \"same_ids\": " << (rows[i].ids_fnv1a == rows[0].ids_fnv1a ? "true" : "false")
         << "}" << (i + 1 < rows.size() ? ",\n" : "\n");
  json << "]\n";
  json.close();
  std::printf("rows written to %s\n", json_path.c_str());
  const bool all_same = std::all_of(rows.begin(), rows.end(), [&](const row& r) { return r.ids_fnv1a == rows[0].ids_fnv1a; });
  return all_same ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
  return 1;
}
