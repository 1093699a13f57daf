// bench/gpu_train_step: GPT-2 124M training steps on one GPU, ours against PyTorch on the same
// GPU in one run (bench/torch_gpu_train_step.py: eager and torch.compile, SDPA flash attention,
// fused AdamW, bf16 autocast, vocabulary padded to 50304). Prints tokens/s, MFU and peak memory
// per row, then the achieved bandwidth of the layer_norm, GELU, cross-entropy and AdamW kernels
// as a fraction of the GPU's memory bandwidth. Writes JSON rows.
//
//   gpu_train_step [--seq T] [--batch B] [--steps S] [--peak-tflops X] [--peak-gbps X]
//                  [--no-torch] [--torch-script PATH] [--json PATH] [--profile] [--attention]
//                  [--no-f32] [--codec] [--cross-entropy]
//
// --cross-entropy runs only the loss's kernels, on one chunk of the step's bf16 logits.
//
// --codec runs only the outer-step codec table: a GPT-2 124M pseudo-gradient (global minus local
// parameters) encoded as int8 blockwise and as top-k 1%, on the host after copying the parameters
// there (what the communication policies do) against on the GPU with the codecs' CUDA kernels,
// copying only the payload; time, bytes over PCIe, and whether the payloads agree.
//
// --attention runs only the attention table: our bf16 kernels against PyTorch's
// scaled_dot_product_attention (FlashAttention) at the same shape. --no-f32 leaves out the f32
// rows (ours and PyTorch's).
//
// --profile runs only ours in bf16 and brackets one step (after the warm-up) with
// cudaProfilerStart/Stop, for `nsys --capture-range=cudaProfilerApi` or `ncu --profile-from-start off`.
//
// Ours runs in bf16 mixed precision (compute_dtype bf16: bf16 products on tensor cores, f32
// master weights) and in f32; PyTorch in bf16 autocast (eager and compiled) and f32 (TF32 off).
// The model, its optimizer and kernels, not the whole library (~45 s more through nvcc).
#include <decentrain/autograd/autograd.hpp>
#include <decentrain/kernels/activation.hpp>
#include <decentrain/compress/blockwise.hpp>
#include <decentrain/compress/top_k.hpp>
#include <decentrain/kernels/attention.hpp>
#include <decentrain/kernels/cross_entropy.hpp>
#include <decentrain/kernels/gemm.hpp>
#include <decentrain/kernels/layer_norm.hpp>
#include <decentrain/kernels/linear.hpp>
#include <decentrain/kernels/quantize.hpp>
#include <decentrain/kernels/reduce.hpp>
#include <decentrain/nn/gpt.hpp>
#include <decentrain/optim/adamw.hpp>
#include <decentrain/optim/clip.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cuda_profiler_api.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "output_file.hpp"

namespace dt = decentrain;
using gpu = dt::cuda;

namespace {

struct options {
  std::int64_t seq = 1024, batch = 0;  // 0: the largest of 32, 16, 8, 4, 2, 1 that fits
  int steps = 10;
  double peak_tflops = 0, peak_gbps = 0;  // 0: from the device name
  bool torch = true;
  bool profile = false;
  bool attention_only = false;
  bool f32 = true;
  bool codec_only = false;
  bool cross_entropy_only = false;
  std::string torch_script = std::string(DECENTRAIN_SOURCE_DIR) + "/bench/torch_gpu_train_step.py";
  std::string json;
};

struct device_peaks {
  std::string name;
  double bf16_tflops, f32_tflops, gbps;
};

// Dense peaks from NVIDIA's data sheets (SXM parts); other GPUs need --peak-tflops/--peak-gbps.
device_peaks peaks_of_device() {
  cudaDeviceProp p{};
  dt::cuda_rt::check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  const std::string name = p.name;
  if (name.find("H200") != std::string::npos) return {name, 989.0, 67.0, 4800.0};
  if (name.find("H100") != std::string::npos) return {name, 989.0, 67.0, 3350.0};
  return {name, 0, 0, 0};
}

struct row {
  std::string impl, precision;
  std::int64_t batch = 0;
  // peak_mib: the most bytes in live tensors (ours: the allocator's count by size class;
  // PyTorch: max_memory_allocated); reserved_mib: the most the allocator held from the driver,
  // cache included (PyTorch: max_memory_reserved).
  double step_s = 0, tokens_per_s = 0, mfu = 0, peak_mib = 0, reserved_mib = 0;
};

// nanoGPT's count: 6 N per token (N without position embeddings) plus 12 L C T for attention.
double flops_per_token(const dt::nn::gpt_config& c, std::int64_t params, std::int64_t T) {
  const double n = static_cast<double>(params - c.block_size * c.n_embd);
  return 6.0 * n + 12.0 * static_cast<double>(c.n_layer * c.n_embd * T);
}

std::int64_t param_count(const dt::parameter_list<gpu>& ps) {
  std::int64_t n = 0;
  for (const auto& e : ps) n += e.param.value().numel();
  return n;
}

// One configuration of ours; throws dt::error on out-of-memory.
row run_ours(const dt::nn::gpt_config& cfg, dt::dtype compute, std::int64_t B, std::int64_t T, int steps,
             double peak_tflops, bool profile = false) {
  dt::memory<gpu>::reset_peak();
  dt::rng init(1, "init"), data(2, "data");
  dt::nn::gpt<gpu> model(cfg, init);
  model.set_compute_dtype(compute);
  dt::optim::adamw<gpu> opt(model.parameters(), {6e-4, 0.9, 0.95, 1e-8, 0.1});
  std::vector<std::int32_t> x(static_cast<std::size_t>(B * T)), y(x.size());
  for (auto& t : x) t = static_cast<std::int32_t>(data.below(50257));
  for (auto& t : y) t = static_cast<std::int32_t>(data.below(50257));
  const auto xs = dt::to_device<gpu>(dt::from_vector(x, {B, T}));
  const auto ys = dt::to_device<gpu>(dt::from_vector(y, {B, T}));
  std::vector<double> times;
  for (int s = 0; s < steps + 2; ++s) {  // two warm-up steps fill the allocator's cache
    dt::cuda_rt::synchronize();
    if (profile && s == steps + 1) dt::cuda_rt::check(cudaProfilerStart(), "cudaProfilerStart");
    const auto t0 = std::chrono::steady_clock::now();
    auto loss = model.loss(xs, ys);
    model.parameters().zero_grad();
    loss.backward();
    dt::optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    dt::cuda_rt::synchronize();
    if (profile && s == steps + 1) dt::cuda_rt::check(cudaProfilerStop(), "cudaProfilerStop");
    if (s >= 2) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  row r{"decentrain", std::string(dt::dtype_name(compute)), B};
  r.step_s = times[times.size() / 2];
  r.tokens_per_s = static_cast<double>(B * T) / r.step_s;
  r.mfu = peak_tflops > 0 ? flops_per_token(cfg, param_count(model.parameters()), T) * r.tokens_per_s / (peak_tflops * 1e12) : 0;
  r.peak_mib = static_cast<double>(dt::memory<gpu>::peak_allocated_bytes()) / (1 << 20);
  r.reserved_mib = static_cast<double>(dt::memory<gpu>::peak_reserved_bytes()) / (1 << 20);
  return r;  // the model and its tensors return to the cache here; the caller may release it
}

struct kernel_row {
  std::string kernel;
  double us = 0, gbps = 0, fraction = 0;
};

template <class F>
double time_us(F&& f, int reps = 20) {
  f();
  cudaEvent_t a, b;
  dt::cuda_rt::check(cudaEventCreate(&a), "cudaEventCreate");
  dt::cuda_rt::check(cudaEventCreate(&b), "cudaEventCreate");
  dt::cuda_rt::check(cudaEventRecord(a, dt::cuda_rt::current_stream()), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) f();
  dt::cuda_rt::check(cudaEventRecord(b, dt::cuda_rt::current_stream()), "cudaEventRecord");
  dt::cuda_rt::check(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  dt::cuda_rt::check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1000.0 * ms / reps;
}

// Causal attention's FLOPs over the visible half of the (T, T) products, forward: 2 B H T^2 D
// (the backward counts 2.5 times that).
double attention_flops(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D) {
  return 2.0 * static_cast<double>(B * H) * static_cast<double>(T * T) * static_cast<double>(D);
}

// Runs the PyTorch side (`args` after the script) and hands each line it prints to `parse`,
// which says whether it read the RESULT line; false, said on stderr naming `what`, when no
// such line came or the script failed.
template <class Parse>
bool run_script(const std::string& script, const std::string& args, const std::string& what, Parse&& parse) {
  FILE* pipe = popen(("python3 " + script + " " + args).c_str(), "r");
  bool got = false;
  char line[512];
  while (pipe && std::fgets(line, sizeof line, pipe)) got = parse(line) || got;
  const int status = pipe ? pclose(pipe) : -1;
  if (got && status == 0) return true;
  std::fprintf(stderr, "%s failed (exit %d); its row is left out\n", what.c_str(), status);
  return false;
}

// Bytes each kernel must move at least (every input read once, every output written once).
// `products` receives the rows of the FLOP-bound kernels (us and TFLOP/s in the gbps column).
// The loss's kernels as the bf16 step runs them: on one chunk of bf16 logits as
// linear_cross_entropy cuts the (B T, V) logits (256 MiB a chunk), the forward (each row's loss
// and logsumexp: one read) and then the backward written over the logits (one read, one write).
std::vector<kernel_row> cross_entropy_chunk(std::int64_t N, std::int64_t V, double peak_gbps) {
  const std::int64_t rows = std::min<std::int64_t>(N, ((std::int64_t{256} << 20) / (V * 2)) / 128 * 128);
  dt::rng gen(8, "ce-chunk");
  auto logits = dt::to_device<gpu>(dt::randn(dt::shape{rows, V}, gen).to(dt::dtype::bf16));
  std::vector<std::int32_t> t(static_cast<std::size_t>(rows));
  for (auto& v : t) v = static_cast<std::int32_t>(gen.below(50257));
  auto targets = dt::to_device<gpu>(dt::from_vector(t, dt::shape{rows}));
  auto row_lse = dt::tensor<gpu>::empty(dt::shape{rows});
  auto row_loss = dt::tensor<gpu>::empty(dt::shape{rows}, dt::dtype::f64);
  auto* l = logits.data<dt::bf16>();
  const auto* ids = targets.data<std::int32_t>();
  const float per_row = 1.0f / static_cast<float>(N);
  const double forward = time_us([&] {
    dt::kernels::cross_entropy_rows(gpu{}, l, ids, rows, V, -1, row_lse.data<float>(), row_loss.data<double>());
  });
  // (Each call writes the gradient over what the last one wrote: the same work on other values.)
  const double backward = time_us([&] {
    dt::kernels::cross_entropy_backward(gpu{}, l, l, row_lse.data<float>(), ids, rows, V, -1, per_row);
  });
  const double elements = static_cast<double>(rows) * static_cast<double>(V);
  const auto row = [&](const std::string& name, double bytes, double us) {
    const double gbps = bytes / (us * 1e-6) / 1e9;
    return kernel_row{name + ", bf16, " + std::to_string(rows) + " x " + std::to_string(V) + " (" +
                          std::to_string((N + rows - 1) / rows) + " a step)", us, gbps, peak_gbps > 0 ? gbps / peak_gbps : 0};
  };
  return {row("cross_entropy forward", 2.0 * elements, forward),
          row("cross_entropy backward, in place", 4.0 * elements, backward)};
}

std::vector<kernel_row> kernel_bandwidth(std::int64_t B, std::int64_t T, double peak_gbps, std::vector<kernel_row>& products) {
  const std::int64_t C = 768, V = 50304, N = B * T;
  dt::rng gen(5, "kernels");
  std::vector<kernel_row> rows;
  const auto add = [&](const std::string& name, double bytes, double us) {
    const double gbps = bytes / (us * 1e-6) / 1e9;
    rows.push_back({name, us, gbps, peak_gbps > 0 ? gbps / peak_gbps : 0});
  };
  {
    auto x = dt::to_device<gpu>(dt::randn(dt::shape{N, C}, gen)), w = dt::ones<gpu>(dt::shape{C}),
         b = dt::zeros<gpu>(dt::shape{C}), out = dt::tensor<gpu>::empty(dt::shape{N, C});
    auto mean = dt::tensor<gpu>::empty(dt::shape{N}), rstd = dt::tensor<gpu>::empty(dt::shape{N});
    const double us = time_us([&] {
      dt::kernels::layer_norm_forward(gpu{}, out.data<float>(), mean.data<float>(), rstd.data<float>(), x.data<float>(),
                                      w.data<float>(), b.data<float>(), N, C, 1e-5f);
    });
    add("layer_norm forward", 4.0 * (2.0 * N * C + 2.0 * N + 2.0 * C), us);
  }
  {
    // Residual add fused in: reads x and the branch, writes the sum and the normalised rows.
    auto x = dt::to_device<gpu>(dt::randn(dt::shape{N, C}, gen)), r = dt::to_device<gpu>(dt::randn(dt::shape{N, C}, gen)),
         w = dt::ones<gpu>(dt::shape{C}), b = dt::zeros<gpu>(dt::shape{C}), out = dt::tensor<gpu>::empty(dt::shape{N, C}),
         sum = dt::tensor<gpu>::empty(dt::shape{N, C});
    auto mean = dt::tensor<gpu>::empty(dt::shape{N}), rstd = dt::tensor<gpu>::empty(dt::shape{N});
    const double us = time_us([&] {
      dt::kernels::layer_norm_forward(gpu{}, out.data<float>(), mean.data<float>(), rstd.data<float>(), x.data<float>(),
                                      w.data<float>(), b.data<float>(), N, C, 1e-5f, r.data<float>(), sum.data<float>());
    });
    add("residual add + layer_norm forward", 4.0 * (4.0 * N * C + 2.0 * N + 2.0 * C), us);
  }
  {
    // The bf16 step's layer norm backward: a bf16 output gradient, the f32 rows, dx added into
    // the residual's gradient, gain and bias gradients summed over all rows.
    auto x = dt::to_device<gpu>(dt::randn(dt::shape{N, C}, gen)), w = dt::ones<gpu>(dt::shape{C}),
         dx = dt::zeros<gpu>(dt::shape{N, C}), dw = dt::zeros<gpu>(dt::shape{C}), db = dt::zeros<gpu>(dt::shape{C});
    auto g = dt::to_device<gpu>(dt::randn(dt::shape{N, C}, gen).to(dt::dtype::bf16));
    auto mean = dt::zeros<gpu>(dt::shape{N}), rstd = dt::ones<gpu>(dt::shape{N});
    const double us = time_us([&] {
      dt::kernels::layer_norm_backward(gpu{}, dx.data<float>(), dw.data<float>(), db.data<float>(), g.data<dt::bf16>(),
                                       x.data<float>(), w.data<float>(), mean.data<float>(), rstd.data<float>(), N, C);
    });
    // What it must move: dx read and written, x and the gradient read once, the row statistics
    // (the gain and bias pass reads x and the gradient a second time, which counts as time).
    add("layer_norm backward (bf16 gradient)", (8.0 + 4.0 + 2.0) * N * C + 4.0 * 2.0 * N, us);
    // The same work in two passes, as rows the one-pass kernel does not take run it (wider than
    // 1024 columns, f64, unaligned): dx, then the gain and bias gradients, which read x and the
    // gradient again.
    const double two = time_us([&] {
      dt::kernels::layer_norm_backward(gpu{}, dx.data<float>(), static_cast<float*>(nullptr), static_cast<float*>(nullptr),
                                       g.data<dt::bf16>(), x.data<float>(), w.data<float>(), mean.data<float>(),
                                       rstd.data<float>(), N, C);
      dt::kernels::layer_norm_backward(gpu{}, static_cast<float*>(nullptr), dw.data<float>(), db.data<float>(),
                                       g.data<dt::bf16>(), x.data<float>(), w.data<float>(), mean.data<float>(),
                                       rstd.data<float>(), N, C);
    });
    add("layer_norm backward as two passes (dx; gain and bias)", (8.0 + 4.0 + 2.0) * N * C + 4.0 * 2.0 * N, two);
  }
  {
    // A bias gradient of the bf16 step: the column sums of the MLP's (N, 4C) output gradient.
    auto g = dt::to_device<gpu>(dt::randn(dt::shape{N, 4 * C}, gen).to(dt::dtype::bf16));
    auto out = dt::tensor<gpu>::empty(dt::shape{4 * C}, dt::dtype::bf16);
    const double us = time_us([&] { dt::kernels::sum_columns(gpu{}, out.data<dt::bf16>(), g.data<dt::bf16>(), N, 4 * C); });
    add("bias gradient (bf16 column sums)", 2.0 * N * 4 * C, us);
  }
  {
    auto x = dt::to_device<gpu>(dt::randn(dt::shape{N, 4 * C}, gen)), out = dt::tensor<gpu>::empty(dt::shape{N, 4 * C});
    const double us = time_us([&] { dt::kernels::gelu_forward(gpu{}, out.data<float>(), x.data<float>(), N * 4 * C); });
    add("gelu forward", 4.0 * 2.0 * N * 4 * C, us);
  }
  for (const auto& r : cross_entropy_chunk(B * T, V, peak_gbps)) rows.push_back(r);
  {
    // Causal attention on bf16 activations (tensor cores), as the bf16 step runs it. FLOPs count
    // the visible half of the (T, T) products: forward 2 B H T^2 D; backward 2.5 times that.
    const std::int64_t H = 12;
    std::vector<dt::var<gpu>> qkv;
    for (int i = 0; i < 3; ++i)
      qkv.push_back(dt::parameter(dt::to_device<gpu>(dt::randn(dt::shape{B, T, C}, gen).to(dt::dtype::bf16))));
    const auto g = dt::to_device<gpu>(dt::randn(dt::shape{B, T, C}, gen).to(dt::dtype::bf16));
    const double fwd_flops = attention_flops(B, H, T, C / H);
    const double fwd = time_us([&] { (void)dt::causal_attention(qkv[0], qkv[1], qkv[2], H); }, 5);
    const double both = time_us([&] {
      auto y = dt::causal_attention(qkv[0], qkv[1], qkv[2], H);
      y.backward(g);
    }, 5);
    products.push_back({"attention forward (bf16)", fwd, fwd_flops / (fwd * 1e-6) / 1e12, 0});
    products.push_back({"attention backward (bf16)", both - fwd, 2.5 * fwd_flops / ((both - fwd) * 1e-6) / 1e12, 0});
  }
  {
    // The MLP's backward step from c_proj's output gradient to c_fc's pre-activation gradient:
    // one cuBLASLt matmul with the DGELU epilogue, against the GEMM and the GELU backward kernel
    // it replaces (what the two-op MLP ran).
    const std::int64_t H4 = 4 * C;
    auto g = dt::to_device<gpu>(dt::randn(dt::shape{N, C}, gen).to(dt::dtype::bf16)),
         w = dt::to_device<gpu>(dt::randn(dt::shape{H4, C}, gen, dt::dtype::f32, 0.0, 0.02).to(dt::dtype::bf16)),
         pre = dt::to_device<gpu>(dt::randn(dt::shape{N, H4}, gen).to(dt::dtype::bf16)),
         d_pre = dt::tensor<gpu>::empty(dt::shape{N, H4}, dt::dtype::bf16), product = dt::tensor<gpu>::empty(dt::shape{N, H4}, dt::dtype::bf16);
    const double flops = 2.0 * static_cast<double>(N) * static_cast<double>(H4) * static_cast<double>(C);
    const double fused = time_us([&] {
      dt::kernels::linear_backward_through_gelu(gpu{}, N, H4, C, g.data<dt::bf16>(), w.data<dt::bf16>(), pre.data<dt::bf16>(),
                                                d_pre.data<dt::bf16>());
    });
    const double split = time_us([&] {
      dt::kernels::gemm(gpu{}, false, true, N, H4, C, 1.0f, g.data<dt::bf16>(), C, w.data<dt::bf16>(), C, 0.0f,
                        product.data<dt::bf16>(), H4);
      dt::kernels::gelu_backward(gpu{}, d_pre.data<dt::bf16>(), pre.data<dt::bf16>(), product.data<dt::bf16>(), N * H4);
    });
    products.push_back({"MLP dX through GELU: DGELU epilogue (bf16)", fused, flops / (fused * 1e-6) / 1e12, 0});
    products.push_back({"MLP dX through GELU: GEMM + GELU backward (bf16)", split, flops / (split * 1e-6) / 1e12, 0});
  }
  {
    // The optimizer's own step over GPT-2 124M's whole parameter list, as training runs it.
    dt::rng init(6, "adamw");
    dt::nn::gpt<gpu> model(dt::nn::gpt_preset("gpt2-124m"), init);
    std::int64_t params = 0, tensors = 0;
    for (auto& e : model.parameters()) {
      e.param.grad() = dt::to_device<gpu>(dt::randn(e.param.shape(), gen));
      params += e.param.value().numel();
      ++tensors;
    }
    dt::optim::adamw<gpu> opt(model.parameters(), {.lr = 1e-4, .beta2 = 0.95, .weight_decay = 0.1});
    const double us = time_us([&] { opt.step(); });
    add("adamw (GPT-2 124M, " + std::to_string(tensors) + " tensors)", 4.0 * 7.0 * static_cast<double>(params), us);
  }
  return rows;
}

// The attention table: our bf16 kernels (kernels/cuda/attention_bf16.cuh) against SDPA's
// FlashAttention at the step's shape (B, T, 12 heads of 64), q, k, v read in place from one
// (B, T, 3C) projection as the model has them.
struct attention_row {
  std::string impl;
  double fwd_us = 0, bwd_us = 0, fwd_tflops = 0, bwd_tflops = 0;
};

// Whether every element of a bf16 device tensor is finite (outputs are poisoned with NaN first).
bool all_finite(const dt::tensor<gpu>& x) {
  for (const double v : dt::to_device<dt::cpu>(x).to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}

std::vector<attention_row> attention_table(std::int64_t B, std::int64_t T, const std::string& torch_script) {
  const std::int64_t H = 12, C = 768, ld = 3 * C;
  dt::rng gen(7, "attention");
  auto qkv = dt::to_device<gpu>(dt::randn(dt::shape{B, T, 3 * C}, gen).to(dt::dtype::bf16)),
       dout = dt::to_device<gpu>(dt::randn(dt::shape{B, T, C}, gen).to(dt::dtype::bf16)),
       out = dt::tensor<gpu>::empty(dt::shape{B, T, C}, dt::dtype::bf16), lse = dt::tensor<gpu>::empty(dt::shape{B, H, T}),
       dqkv = dt::tensor<gpu>::empty(dt::shape{B, T, 3 * C}, dt::dtype::bf16);
  dt::bf16 *x = qkv.data<dt::bf16>(), *dx = dqkv.data<dt::bf16>();
  const auto forward = [&] {
    dt::kernels::attention_forward_bf16(gpu{}, out.data<dt::bf16>(), lse.data<float>(), x, x + C, x + 2 * C, B, T, C, H, ld);
  };
  const auto backward = [&] {
    dt::kernels::attention_backward_bf16(gpu{}, dx, dx + C, dx + 2 * C, dout.data<dt::bf16>(), out.data<dt::bf16>(),
                                         lse.data<float>(), x, x + C, x + 2 * C, B, T, C, H, ld);
  };
  // Poisoned first (0xffff is a bf16 NaN): an element left unwritten would show.
  dt::cuda_rt::check(cudaMemset(out.data<dt::bf16>(), 0xff, static_cast<std::size_t>(out.numel()) * 2), "cudaMemset");
  dt::cuda_rt::check(cudaMemset(dx, 0xff, static_cast<std::size_t>(dqkv.numel()) * 2), "cudaMemset");
  forward();
  backward();
  if (!all_finite(out) || !all_finite(dqkv)) dt::detail::fail("attention table: an output or gradient is not finite");
  const double flops = attention_flops(B, H, T, C / H);
  const auto with_rates = [&](attention_row r) {
    r.fwd_tflops = flops / (r.fwd_us * 1e-6) / 1e12;
    r.bwd_tflops = 2.5 * flops / (r.bwd_us * 1e-6) / 1e12;
    return r;
  };
  std::vector<attention_row> rows{with_rates({"decentrain (mma.sync bf16)", time_us(forward), time_us(backward)})};
  attention_row r{"PyTorch scaled_dot_product_attention (FlashAttention)"};
  if (!torch_script.empty() &&
      run_script(torch_script, "--mode attention --batch " + std::to_string(B) + " --seq " + std::to_string(T),
                 "torch attention", [&](const char* line) {
                   return std::sscanf(line, "RESULT backend=flash fwd_us=%lf bwd_us=%lf", &r.fwd_us, &r.bwd_us) == 2;
                 }))
    rows.push_back(with_rates(r));
  return rows;
}

void print_attention(const std::vector<attention_row>& rows, std::int64_t B, std::int64_t T, double bf16_peak) {
  std::printf("\n| attention (B=%lld, T=%lld, 12 heads of 64, causal) | forward us | TFLOP/s | of peak | backward us | "
              "TFLOP/s | of peak | ours / this row (speed, fwd; bwd) |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
              static_cast<long long>(B), static_cast<long long>(T));
  const auto pct = [&](double tflops) { return bf16_peak > 0 ? 100 * tflops / bf16_peak : 0.0; };
  for (const auto& r : rows)
    std::printf("| %s | %.1f | %.1f | %.1f%% | %.1f | %.1f | %.1f%% | %.2fx; %.2fx |\n", r.impl.c_str(), r.fwd_us,
                r.fwd_tflops, pct(r.fwd_tflops), r.bwd_us, r.bwd_tflops, pct(r.bwd_tflops), r.fwd_us / rows[0].fwd_us,
                r.bwd_us / rows[0].bwd_us);
}

// Memory-bound kernels' rows: the table, and JSON objects each after ",\n".
void print_bandwidth(const std::vector<kernel_row>& rows) {
  std::printf("\n| kernel | us | GB/s | of peak bandwidth |\n|---|---:|---:|---:|\n");
  for (const auto& k : rows) std::printf("| %s | %.1f | %.0f | %.0f%% |\n", k.kernel.c_str(), k.us, k.gbps, 100 * k.fraction);
}
std::string bandwidth_json(const std::vector<kernel_row>& rows, const std::string& device) {
  std::ostringstream s;
  for (const auto& k : rows)
    s << ",\n{\"kernel\":\"" << k.kernel << "\",\"us\":" << k.us << ",\"gbps\":" << k.gbps << ",\"fraction\":" << k.fraction
      << ",\"device\":\"" << device << "\"}";
  return s.str();
}

// The rows as JSON objects, each after ",\n".
std::string attention_json(const std::vector<attention_row>& rows, std::int64_t B, std::int64_t T, const std::string& device) {
  const auto num = [](double x) {
    if (!std::isfinite(x)) return std::string("null");
    char b[32];
    std::snprintf(b, sizeof b, "%.6g", x);
    return std::string(b);
  };
  std::string s;
  for (const auto& r : rows)
    s += ",\n{\"attention\":\"" + r.impl + "\",\"batch\":" + std::to_string(B) + ",\"seq\":" + std::to_string(T) +
         ",\"fwd_us\":" + num(r.fwd_us) + ",\"bwd_us\":" + num(r.bwd_us) +
         ",\"fwd_tflops\":" + num(r.fwd_tflops) + ",\"bwd_tflops\":" + num(r.bwd_tflops) +
         ",\"device\":\"" + device + "\"}";
  return s;
}

// The outer step's codec, two routes for one pseudo-gradient of n values. Host: the parameters
// copied to (pageable) host memory, as comm::gather_values does, the difference to the global
// copy taken there, then the CPU codec. GPU: the difference taken on the GPU, the codec's CUDA
// kernel, then only its output copied. Host times include the copies; each is the median of 3.
struct codec_row {
  std::string codec, route;
  double ms = 0;
  std::size_t pcie_bytes = 0, payload_bytes = 0;
  std::string agrees;
};

template <class F>
double host_ms(F&& f) {
  std::vector<double> t;
  for (int i = 0; i < 4; ++i) {
    dt::cuda_rt::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    dt::cuda_rt::synchronize();
    if (i > 0) t.push_back(1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[1];
}

std::vector<codec_row> codec_table(std::int64_t n) {
  dt::rng gen(11, "codec-table");
  const auto global = dt::randn<gpu>(dt::shape{n}, gen, dt::dtype::f32, 0.0, 0.02);
  auto local = dt::randn<gpu>(dt::shape{n}, gen, dt::dtype::f32, 0.0, 1e-3);
  local = dt::math::add(local, global);  // a round's drift from the global parameters
  std::vector<float> global_host = global.to_vector<float>(), pulled(static_cast<std::size_t>(n)), delta(pulled.size());
  const auto un = static_cast<std::size_t>(n);
  auto pseudo_gradient_on_host = [&] {
    dt::memory<gpu>::copy_to_host(pulled.data(), local.data<float>(), 4 * un);
    for (std::size_t i = 0; i < un; ++i) delta[i] = global_host[i] - pulled[i];
  };
  std::vector<codec_row> rows;

  dt::compress::int8_blockwise int8;
  std::vector<std::byte> host_payload(int8.max_encoded_bytes(un)), gpu_payload(host_payload.size());
  std::size_t host_bytes = 0;
  const double int8_host = host_ms([&] {
    pseudo_gradient_on_host();
    host_bytes = int8.encode(std::span<const float>(delta), host_payload);
  });
  // Raw device bytes for the payload (no tensor dtype holds bytes).
  struct device_bytes {
    explicit device_bytes(std::size_t n) : size(n), p(static_cast<std::byte*>(dt::memory<gpu>::allocate(n))) {}
    ~device_bytes() { dt::memory<gpu>::deallocate(p, size); }
    device_bytes(const device_bytes&) = delete;
    device_bytes& operator=(const device_bytes&) = delete;
    std::size_t size;
    std::byte* p;
  } payload_dev(host_payload.size());
  const double int8_gpu = host_ms([&] {
    const auto d = dt::math::sub(global, local);
    dt::kernels::blockwise_encode<8>(gpu{}, d.data<float>(), n, {64, false, 0, 0}, payload_dev.p);
    dt::memory<gpu>::copy_to_host(gpu_payload.data(), payload_dev.p, gpu_payload.size());
  });
  const bool same = host_bytes == gpu_payload.size() && std::memcmp(host_payload.data(), gpu_payload.data(), host_bytes) == 0;
  rows.push_back({int8.describe(), "host: copy parameters, encode on the CPU", int8_host, 4 * un, host_bytes, ""});
  rows.push_back({int8.describe(), "GPU: encode with the CUDA kernel, copy the payload", int8_gpu, gpu_payload.size(), gpu_payload.size(),
                  same ? "same bytes" : "DIFFERENT bytes"});

  dt::compress::top_k topk;
  topk.fraction = 0.01;
  const std::size_t k = topk.k_for(un);
  std::vector<std::byte> topk_payload(topk.max_encoded_bytes(un));
  std::size_t topk_bytes = 0;
  const double topk_host = host_ms([&] {
    pseudo_gradient_on_host();
    topk_bytes = topk.encode(std::span<const float>(delta), topk_payload);
  });
  auto idx = dt::tensor<gpu>::empty(dt::shape{static_cast<std::int64_t>(k)}, dt::dtype::i32);
  auto val = dt::tensor<gpu>::empty(dt::shape{static_cast<std::int64_t>(k)}, dt::dtype::f32);
  std::vector<std::int32_t> idx_host(k);
  std::vector<float> val_host(k);
  const double topk_gpu = host_ms([&] {
    const auto d = dt::math::sub(global, local);
    dt::kernels::top_k_magnitude(gpu{}, d.data<float>(), n, static_cast<std::int64_t>(k), idx.data<std::int32_t>(), val.data<float>());
    dt::memory<gpu>::copy_to_host(idx_host.data(), idx.data<std::int32_t>(), 4 * k);
    dt::memory<gpu>::copy_to_host(val_host.data(), val.data<float>(), 4 * k);
  });
  // The GPU's picks against what the CPU codec's payload decodes to.
  std::vector<float> sent(un, 0.0f), picked(un, 0.0f);
  topk.decode_add(std::span<const std::byte>(topk_payload.data(), topk_bytes), std::span<float>(sent));
  for (std::size_t j = 0; j < k; ++j) picked[static_cast<std::size_t>(idx_host[j])] = val_host[j];
  rows.push_back({topk.describe(), "host: copy parameters, encode on the CPU", topk_host, 4 * un, topk_bytes, ""});
  rows.push_back({topk.describe(), "GPU: pick with CUB's radix sort, copy indices and values (not packed)", topk_gpu, 8 * k, 8 * k,
                  picked == sent ? "same picks" : "DIFFERENT picks"});
  return rows;
}

void print_codecs(const std::vector<codec_row>& rows, std::int64_t n) {
  std::printf("\n| outer-step codec (%lld values) | route | ms | MB over PCIe | payload MB | host route / this row | check |\n"
              "|---|---|---:|---:|---:|---:|---|\n", static_cast<long long>(n));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const double host = rows[i - i % 2].ms;
    std::printf("| %s | %s | %.1f | %.1f | %.1f | %.2fx | %s |\n", r.codec.c_str(), r.route.c_str(), r.ms, r.pcie_bytes / 1e6,
                r.payload_bytes / 1e6, host / r.ms, r.agrees.c_str());
  }
}

std::string codec_json(const std::vector<codec_row>& rows, std::int64_t n, const std::string& device) {
  std::string s;
  for (const auto& r : rows)
    s += ",\n{\"codec\":\"" + r.codec + "\",\"route\":\"" + r.route + "\",\"values\":" + std::to_string(n) +
         ",\"ms\":" + std::to_string(r.ms) + ",\"pcie_bytes\":" + std::to_string(r.pcie_bytes) +
         ",\"payload_bytes\":" + std::to_string(r.payload_bytes) + ",\"check\":\"" + r.agrees + "\",\"device\":\"" + device + "\"}";
  return s;
}

std::vector<row> run_torch(const std::string& script, std::int64_t B, std::int64_t T, int steps, double bf16_tflops,
                           double f32_tflops, bool f32) {
  std::vector<row> rows;
  for (const std::string mode : {"eager-bf16", "compile-bf16", "eager-f32"}) {
    if (!f32 && mode == "eager-f32") continue;
    row r{"pytorch " + mode.substr(0, mode.find('-')), mode.substr(mode.find('-') + 1), B};
    const bool ran = run_script(
        script, "--mode " + mode + " --batch " + std::to_string(B) + " --seq " + std::to_string(T) + " --steps " + std::to_string(steps),
        "torch " + mode, [&](const char* line) {
          return std::sscanf(line, "RESULT step_s=%lf peak_mib=%lf reserved_mib=%lf", &r.step_s, &r.peak_mib, &r.reserved_mib) == 3;
        });
    if (!ran) continue;
    r.tokens_per_s = static_cast<double>(B * T) / r.step_s;
    const double peak = r.precision == "bf16" ? bf16_tflops : f32_tflops;
    const auto cfg = dt::nn::gpt_preset("gpt2-124m");
    r.mfu = peak > 0 ? flops_per_token(cfg, 124'475'904, T) * r.tokens_per_s / (peak * 1e12) : 0;
    rows.push_back(r);
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--seq") o.seq = std::stoll(next());
    else if (a == "--batch") o.batch = std::stoll(next());
    else if (a == "--steps") o.steps = std::stoi(next());
    else if (a == "--peak-tflops") o.peak_tflops = std::stod(next());
    else if (a == "--peak-gbps") o.peak_gbps = std::stod(next());
    else if (a == "--no-torch") o.torch = false;
    else if (a == "--torch-script") o.torch_script = next();
    else if (a == "--json") o.json = next();
    else if (a == "--profile") o.profile = true;
    else if (a == "--attention") o.attention_only = true;
    else if (a == "--no-f32") o.f32 = false;
    else if (a == "--codec") o.codec_only = true;
    else if (a == "--cross-entropy") o.cross_entropy_only = true;
    else {
      std::fprintf(stderr, "unknown option %s\nusage: gpu_train_step [--seq T] [--batch B] [--steps S] "
                           "[--peak-tflops X] [--peak-gbps X] [--no-torch] [--torch-script PATH] [--json PATH] [--profile] "
                           "[--attention] [--no-f32] [--codec] [--cross-entropy]\n", a.c_str());
      return 2;
    }
  }
  if (dt::cuda_rt::device_count() == 0) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  // Opened before measuring, so a bad path fails now rather than after minutes of work.
  std::optional<bench::output_file> out;
  if (!o.json.empty()) out.emplace(o.json);
  const auto peaks = peaks_of_device();
  const double f32_peak = o.peak_tflops > 0 ? o.peak_tflops : peaks.f32_tflops;
  const double bf16_peak = o.peak_tflops > 0 ? o.peak_tflops : peaks.bf16_tflops;
  const double gbps = o.peak_gbps > 0 ? o.peak_gbps : peaks.gbps;
  std::printf("device: %s (peaks used: bf16 %.0f TFLOP/s, f32 %.0f TFLOP/s, %.0f GB/s)\n", peaks.name.c_str(), bf16_peak,
              f32_peak, gbps);

  if (o.attention_only) {
    const std::int64_t B = o.batch > 0 ? o.batch : 32;
    const auto rows = attention_table(B, o.seq, o.torch ? o.torch_script : std::string());
    print_attention(rows, B, o.seq, bf16_peak);
    if (out) {
      *out << "[" << attention_json(rows, B, o.seq, peaks.name).substr(1) << "\n]\n";
      out->close();
    }
    return 0;
  }
  auto cfg = dt::nn::gpt_preset("gpt2-124m");
  cfg.vocab_size = 50304;  // padded as the reference does
  if (o.cross_entropy_only) {
    const auto rows = cross_entropy_chunk((o.batch > 0 ? o.batch : 32) * o.seq, 50304, gbps);
    print_bandwidth(rows);
    if (out) {
      *out << "[" << bandwidth_json(rows, peaks.name).substr(1) << "\n]\n";
      out->close();
    }
    return 0;
  }
  if (o.codec_only) {
    std::int64_t n = 0;  // GPT-2 124M's parameter count (the vocabulary unpadded, as a peer sends it)
    {
      const dt::skip_init no_draws;
      dt::rng init(1, "init");
      n = param_count(dt::nn::gpt<gpu>(dt::nn::gpt_preset("gpt2-124m"), init).parameters());
    }
    dt::memory<gpu>::release_cached();
    const auto rows = codec_table(n);
    print_codecs(rows, n);
    if (out) {
      *out << "[" << codec_json(rows, n, peaks.name).substr(1) << "\n]\n";
      out->close();
    }
    return 0;
  }
  cfg.block_size = std::max<std::int64_t>(cfg.block_size, o.seq);
  if (o.profile) {
    const auto r = run_ours(cfg, dt::dtype::bf16, o.batch > 0 ? o.batch : 32, o.seq, 1, bf16_peak, true);
    std::printf("profiled one bf16 step: %.4f s, peak %.0f MiB allocated, %.0f MiB reserved\n", r.step_s, r.peak_mib,
                r.reserved_mib);
    return 0;
  }
  std::vector<row> rows;
  std::int64_t B = o.batch;
  for (std::int64_t b : {32, 16, 8, 4, 2, 1}) {
    if (o.batch > 0 && b != o.batch) continue;
    try {
      rows.push_back(run_ours(cfg, dt::dtype::bf16, b, o.seq, o.steps, bf16_peak));
      B = b;
      break;
    } catch (const dt::error& e) {
      std::fprintf(stderr, "batch %lld: %s\n", static_cast<long long>(b), e.what());
      dt::memory<gpu>::release_cached();
    }
  }
  if (rows.empty()) return 1;
  dt::memory<gpu>::release_cached();
  if (o.f32) try {
      rows.push_back(run_ours(cfg, dt::dtype::f32, B, o.seq, o.steps, f32_peak));
    } catch (const dt::error& e) {
      std::fprintf(stderr, "f32 at batch %lld: %s\n", static_cast<long long>(B), e.what());
    }
  dt::memory<gpu>::release_cached();  // PyTorch runs in another process and needs the memory
  if (o.torch) for (auto& r : run_torch(o.torch_script, B, o.seq, o.steps, bf16_peak, f32_peak, o.f32)) rows.push_back(r);

  std::printf("\nGPT-2 124M, B=%lld, T=%lld, median of %d steps\n", static_cast<long long>(B),
              static_cast<long long>(o.seq), o.steps);
  std::printf("| implementation | precision | s/step | tokens/s | MFU | peak MiB allocated | MiB reserved | tokens/s vs ours |\n"
              "|---|---|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& r : rows)
    std::printf("| %s | %s | %.4f | %.0f | %.1f%% | %.0f | %.0f | %.2fx |\n", r.impl.c_str(), r.precision.c_str(),
                r.step_s, r.tokens_per_s, 100 * r.mfu, r.peak_mib, r.reserved_mib, r.tokens_per_s / rows[0].tokens_per_s);

  dt::memory<gpu>::release_cached();
  std::vector<kernel_row> products;
  const auto kernels = kernel_bandwidth(B, o.seq, gbps, products);
  print_bandwidth(kernels);
  std::printf("\n| FLOP-bound kernel (B=%lld, T=%lld, 12 heads of 64) | us | TFLOP/s | of bf16 peak |\n|---|---:|---:|---:|\n",
              static_cast<long long>(B), static_cast<long long>(o.seq));
  for (const auto& k : products)
    std::printf("| %s | %.1f | %.1f | %.1f%% |\n", k.kernel.c_str(), k.us, k.gbps, bf16_peak > 0 ? 100 * k.gbps / bf16_peak : 0.0);
  dt::memory<gpu>::release_cached();
  const auto attention = attention_table(B, o.seq, o.torch ? o.torch_script : std::string());
  print_attention(attention, B, o.seq, bf16_peak);

  if (out) {
    *out << "[";
    for (std::size_t i = 0; i < rows.size(); ++i)
      *out << (i ? ",\n" : "\n") << "{\"impl\":\"" << rows[i].impl << "\",\"precision\":\"" << rows[i].precision
          << "\",\"batch\":" << rows[i].batch << ",\"seq\":" << o.seq << ",\"step_s\":" << rows[i].step_s
          << ",\"tokens_per_s\":" << rows[i].tokens_per_s << ",\"mfu\":" << rows[i].mfu << ",\"peak_mib\":" << rows[i].peak_mib << ",\"reserved_mib\":" << rows[i].reserved_mib
          << ",\"device\":\"" << peaks.name << "\"}";
    *out << bandwidth_json(kernels, peaks.name);
    for (const auto& k : products)
      *out << ",\n{\"kernel\":\"" << k.kernel << "\",\"us\":" << k.us << ",\"tflops\":" << k.gbps
           << ",\"device\":\"" << peaks.name << "\"}";
    *out << attention_json(attention, B, o.seq, peaks.name) << "\n]\n";
    out->close();
  }
  return 0;
}
