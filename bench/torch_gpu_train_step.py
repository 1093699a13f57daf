#!/usr/bin/env python3
"""The PyTorch side of bench/gpu_train_step: GPT-2 124M as nanoGPT writes it (tied head, biases,
tanh GELU, vocabulary padded to 50304), SDPA flash attention, fused AdamW, on one GPU.

  torch_gpu_train_step.py --mode eager-bf16|compile-bf16|eager-f32|attention --batch B --seq T --steps S

Prints `RESULT step_s=<median seconds per step> peak_mib=<torch.cuda.max_memory_allocated>
reserved_mib=<torch.cuda.max_memory_reserved>` (MiB). --mode attention times
`scaled_dot_product_attention` alone (12 heads of 64, causal, bf16, q, k and v viewed in one
(B, T, 3C) projection as the model has them) and prints `RESULT backend=<name> fwd_us=<median>
bwd_us=<median of forward and backward, less the forward>`.
--kernels-csv PATH profiles one more step (torch.profiler) and writes its GPU kernels summed by
name as nsys's cuda_gpu_kern_sum CSV (scripts/kernel_summary.py reads it).
bf16 modes run the forward under torch.autocast(bfloat16) with f32 master weights, as nanoGPT;
f32 keeps TF32 off so it is the like-for-like reference for an f32 implementation.
"""
import argparse
import csv
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L=12, H=12, C=768, block=1024, vocab=50304):
        super().__init__()
        self.wte = nn.Embedding(vocab, C)
        self.wpe = nn.Embedding(block, C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def median_us(fn, reps=30):
    """Median of `reps` timed calls (CUDA events), after three untimed ones."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def attention(batch, seq, H=12, D=64):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(1)
    C = H * D
    qkv = torch.randn(batch, seq, 3 * C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(batch, H, seq, D, device="cuda", dtype=torch.bfloat16)

    def heads():
        q, k, v = qkv.split(C, dim=2)
        return (t.view(batch, seq, H, D).transpose(1, 2) for t in (q, k, v))

    def forward():
        with torch.no_grad():
            q, k, v = heads()
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both():
        q, k, v = heads()
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)

    # FlashAttention's kernel, which SDPA picks for this shape; named so a fallback cannot pass for it.
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        fwd = median_us(forward)
        total = median_us(both)
    print("RESULT backend=flash fwd_us=%.2f bwd_us=%.2f" % (fwd, total - fwd))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager-bf16", "compile-bf16", "eager-f32", "attention"], required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--kernels-csv", help="after the timed steps, profile one and write its kernels summed by name here")
    a = ap.parse_args()
    if a.mode == "attention":
        return attention(a.batch, a.seq)
    torch.manual_seed(1)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    model = GPT(block=max(1024, a.seq)).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_model = torch.compile(model) if a.mode.startswith("compile") else model
    bf16 = a.mode.endswith("bf16")
    x = torch.randint(0, 50257, (a.batch, a.seq), device=dev)
    y = torch.randint(0, 50257, (a.batch, a.seq), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = step_model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    times = []
    for s in range(a.steps + 3):  # warm-up steps include compilation
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if s >= 3:
            times.append(time.perf_counter() - t0)
    print("RESULT step_s=%.6f peak_mib=%.1f reserved_mib=%.1f" % (statistics.median(times), torch.cuda.max_memory_allocated() / 2**20,
                                                                  torch.cuda.max_memory_reserved() / 2**20))
    if a.kernels_csv:
        write_kernel_sums(a.kernels_csv, step)


def write_kernel_sums(path, step):
    """One more step under torch.profiler (CUPTI: warm caches, the clocks as they run), its GPU
    kernels summed by name into `path` as nsys's cuda_gpu_kern_sum CSV, which
    scripts/kernel_summary.py reads."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    sums = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA or "memcpy" in e.name.lower() or "memset" in e.name.lower():
            continue
        ns, n = sums.get(e.name, (0.0, 0))
        sums[e.name] = (ns + e.time_range.elapsed_us() * 1000.0, n + 1)
    whole = sum(ns for ns, _ in sums.values()) or 1.0
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Time (%)", "Total Time (ns)", "Instances", "Name"])
        for name, (ns, n) in sorted(sums.items(), key=lambda kv: -kv[1][0]):
            w.writerow(["%.1f" % (100.0 * ns / whole), "%.0f" % ns, n, name])


if __name__ == "__main__":
    main()
