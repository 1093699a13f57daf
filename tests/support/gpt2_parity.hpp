// The llm.c-style check: GPT-2 124M at B=4, T=64 with PyTorch's weights gives PyTorch's
// logits, loss and every parameter gradient (reference from tests/cuda/make_gpt2_reference.py,
// computed in f32 on the CPU). Shared by the GPU program (tests/cuda/gpt2_parity.cu) and the CPU
// one (tests/train/gpt2_parity_cpu.cpp): `run<Device>(DIR)` makes DIR's reference first when it
// is missing.
//
// Tolerances (f32 both sides, different summation orders): logits max|diff| <= 2e-5 x max|ref|,
// loss 1e-5 relative, each gradient max|diff| <= 1e-4 x max|ref|. Measured on the CPU
// (OpenBLAS vs PyTorch 1.13): at most 1.7e-6 on any tensor, loss equal to 7 digits.
// Returns 77 (CTest: skipped) only when PyTorch is not there to make the reference (no Python
// found at configure time, or `import torch` fails now); 1 when the reference script fails with
// PyTorch present, on any error, and on any mismatch, with a table of every tensor.
#pragma once

// What the check uses, not the whole library: under nvcc the whole costs ~45 s a file.
#include <decentrain/autograd/autograd.hpp>
#include <decentrain/io/safetensors.hpp>
#include <decentrain/io/token_shard.hpp>
#include <decentrain/nn/gpt.hpp>
#include <decentrain/train/gpt2_weights.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>

namespace gpt2_parity {
namespace dt = decentrain;

// max|got - want| / max|want|; a shape mismatch is an error, not a number, since comparing the
// first n elements of two differently laid-out tensors would measure nothing.
inline double normwise_error(const std::string& name, const dt::tensor<dt::cpu>& got,
                             const dt::tensor<dt::cpu>& want) {
  dt::detail::check(got.shape() == want.shape(), "gpt2 parity: ", name, " has shape ", got.shape(), " (",
                    got.numel(), " elements), the reference has ", want.shape(), " (", want.numel(), " elements)");
  const auto a = got.to_vector<double>(), b = want.to_vector<double>();
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return INFINITY;
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale == 0 ? diff : diff / scale;
}

// Why PyTorch cannot be used to make the reference, or "" when it can. Only this is a skip:
// the configure-time probe may be stale (torch uninstalled since), so it is asked again here.
inline std::string torch_missing(const std::string& python) {
  if (python.empty()) return "no Python with PyTorch was found at configure time";
  if (!std::filesystem::exists(python)) return "the Python found at configure time, " + python + ", is gone";
  const std::string probe = python + " -c \"import torch\" >/dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) return "'import torch' fails with " + python;
  return "";
}

template <class Device>
int run(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir / "reference.safetensors")) {
    const std::string python = DECENTRAIN_TORCH_PYTHON;
    if (const auto why = torch_missing(python); !why.empty()) {
      std::printf("skipped: %s, so the PyTorch reference cannot be made\n", why.c_str());
      return 77;
    }
    // PyTorch is there, so a failing script is a broken test (a bug in it, a full disk, an
    // unwritable DIR) and must not hide as a skip.
    const std::string cmd = python + " " DECENTRAIN_SOURCE_DIR "/tests/cuda/make_gpt2_reference.py " + dir.string();
    if (const int status = std::system(cmd.c_str()); status != 0) {
      std::fprintf(stderr, "gpt2 parity: FAILED: the PyTorch reference script failed (std::system returned %d): %s\n",
                   status, cmd.c_str());
      return 1;
    }
    if (!std::filesystem::exists(dir / "reference.safetensors")) {
      std::fprintf(stderr, "gpt2 parity: FAILED: the reference script succeeded but wrote no %s\n",
                   (dir / "reference.safetensors").string().c_str());
      return 1;
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

    const auto reference = [&](const std::string& name) -> const dt::tensor<dt::cpu>& {
      const auto it = ref.find(name);
      dt::detail::check(it != ref.end(), "gpt2 parity: ", (dir / "reference.safetensors").string(),
                        " has no tensor '", name, "'");
      return it->second;
    };
    bool ok = true;
    const auto report = [&](const std::string& name, double err, double tol) {
      const bool pass = err <= tol;
      ok = ok && pass;
      std::printf("| %-28s | %.3e | %.0e | %s |\n", name.c_str(), err, tol, pass ? "ok" : "MISMATCH");
    };
    std::printf("| tensor | error | tolerance | |\n|---|---:|---:|---|\n");
    report("logits", normwise_error("logits", dt::to_device<dt::cpu>(logits.value()), reference("logits")), 2e-5);
    const double want = reference("loss").item();
    report("loss", std::abs(loss.item() - want) / std::abs(want), 1e-5);
    for (const auto& e : model.parameters())
      report("grad." + e.name,
             normwise_error("grad." + e.name, dt::to_device<dt::cpu>(e.param.grad()), reference("grad." + e.name)), 1e-4);
    std::printf("loss: ours %.6f, PyTorch %.6f\n", loss.item(), want);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {  // dt::error, and std::bad_alloc or filesystem errors
    std::fprintf(stderr, "gpt2 parity: FAILED: %s\n", e.what());
    return 1;
  }
}

}  // namespace gpt2_parity
