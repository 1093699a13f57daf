// The llm.c-style check: GPT-2 124M at B=4, T=64 with PyTorch's weights gives PyTorch's
// logits, loss and every parameter gradient (reference from tests/cuda/make_gpt2_reference.py,
// computed in f32 on the CPU). Shared by the GPU program (tests/cuda/gpt2_parity.cu) and the CPU
// one (tests/train/gpt2_parity_cpu.cpp): `run_gpt2_parity<Device>(DIR)` makes DIR's reference
// first when it is missing.
//
// Tolerances (f32 both sides, different summation orders): logits max|diff| <= 2e-5 x max|ref|,
// loss 1e-5 relative, each gradient max|diff| <= 1e-4 x max|ref|. Measured on the CPU
// (OpenBLAS vs PyTorch 1.13): at most 1.7e-6 on any tensor, loss equal to 7 digits. Returns 77 (CTest: skipped) without
// PyTorch to make the reference, 1 on any mismatch, with a table of every tensor.
#pragma once

#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace gpt2_parity {
namespace dt = decentrain;

inline double normwise_error(const dt::tensor<dt::cpu>& got, const dt::tensor<dt::cpu>& want) {
  const auto a = got.to_vector<double>(), b = want.to_vector<double>();
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return INFINITY;
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale == 0 ? diff : diff / scale;
}

template <class Device>
int run(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir / "reference.safetensors")) {
    const std::string python = DECENTRAIN_TORCH_PYTHON;
    if (python.empty()) {
      std::printf("skipped: no Python with PyTorch was found at configure time to make the reference\n");
      return 77;
    }
    const std::string cmd = python + " " DECENTRAIN_SOURCE_DIR "/tests/cuda/make_gpt2_reference.py " + dir.string();
    if (std::system(cmd.c_str()) != 0) {
      std::printf("skipped: could not make the PyTorch reference (%s)\n", cmd.c_str());
      return 77;
    }
  }
  try {
    const auto weights = dt::io::load_safetensors(dir / "weights.safetensors");
    const auto ref = dt::io::load_safetensors(dir / "reference.safetensors");
    const auto cfg = dt::train::gpt2_config(weights, 12);
    dt::rng unused(0, "init");
    dt::nn::gpt<Device> model(cfg, unused);
    dt::train::import_gpt2_weights(model, weights);
    const auto tokens = dt::io::read_token_shard(dir / "tokens.bin");
    const std::int64_t B = 4, T = 64;
    dt::detail::check(static_cast<std::int64_t>(tokens.size()) >= B * (T + 1), "tokens.bin holds too few tokens");
    std::vector<std::int32_t> x(B * T), y(B * T);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t) {
        x[b * T + t] = tokens[b * (T + 1) + t];
        y[b * T + t] = tokens[b * (T + 1) + t + 1];
      }
    const auto xs = dt::to_device<Device>(dt::from_vector(x, {B, T})), ys = dt::to_device<Device>(dt::from_vector(y, {B, T}));
    auto logits = model.logits(xs);
    auto loss = dt::cross_entropy(logits, ys, -1);
    loss.backward();

    bool ok = true;
    const auto report = [&](const std::string& name, double err, double tol) {
      const bool pass = err <= tol;
      ok = ok && pass;
      std::printf("| %-28s | %.3e | %.0e | %s |\n", name.c_str(), err, tol, pass ? "ok" : "MISMATCH");
    };
    std::printf("| tensor | error | tolerance | |\n|---|---:|---:|---|\n");
    report("logits", normwise_error(dt::to_device<dt::cpu>(logits.value()), ref.at("logits")), 2e-5);
    const double want = ref.at("loss").item();
    report("loss", std::abs(loss.item() - want) / std::abs(want), 1e-5);
    for (const auto& e : model.parameters())
      report("grad." + e.name, normwise_error(dt::to_device<dt::cpu>(e.param.grad()), ref.at("grad." + e.name)), 1e-4);
    std::printf("loss: ours %.6f, PyTorch %.6f\n", loss.item(), want);
    return ok ? 0 : 1;
  } catch (const dt::error& e) {
    std::fprintf(stderr, "gpt2 parity: %s\n", e.what());
    return 1;
  }
}

}  // namespace gpt2_parity
