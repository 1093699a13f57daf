#!/usr/bin/python3
"""The PyTorch side of bench/cpu_train_step and the convergence comparison: the same GPT-2
(tied head, biases, tanh GELU) written in plain eager PyTorch as nanoGPT does, on the CPU.

  torch_gpt.py step --preset shakespeare-char --batch 8 --block 256 --threads 2 --steps 5
  torch_gpt.py converge --data tinyshakespeare.txt --threads 2     (nanoGPT's CPU recipe)
  torch_gpt.py converge ... --no-bias                               (nanoGPT's bias-free model)
  torch_gpt.py converge ... --seed 1 --eval-batches 200             (another seed, a finer estimate)

Prints one JSON object on the last line.
"""
import argparse
import json
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {"shakespeare-char": (6, 6, 384, 256, 65), "gpt2-124m": (12, 12, 768, 1024, 50257),
           "converge": (4, 4, 128, 64, 65)}


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias, as nanoGPT's (torch 1.13's has no bias=False)."""

    def __init__(self, C, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.bias = nn.Parameter(torch.zeros(C)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class Block(nn.Module):
    def __init__(self, C, H, bias=True):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = LayerNorm(C, bias), LayerNorm(C, bias)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C, bias=bias), nn.Linear(C, C, bias=bias)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C, bias=bias), nn.Linear(4 * C, C, bias=bias)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, H, C, T, V, bias=True):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, H, bias) for _ in range(L))
        self.ln_f = LayerNorm(C, bias)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def optimizer(model, lr):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.99))


def step_mode(args):
    L, H, C, T, V = PRESETS[args.preset]
    T = args.block
    model = GPT(L, H, C, max(T, PRESETS[args.preset][3]), V)
    opt = optimizer(model, 1e-4)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (args.batch, T), generator=g)
    y = torch.randint(0, V, (args.batch, T), generator=g)
    times = []
    for i in range(args.steps + 1):  # the first step warms up and is not timed
        t0 = time.perf_counter()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i:
            times.append(time.perf_counter() - t0)
    times.sort()
    return {"impl": "pytorch", "preset": args.preset, "batch": args.batch, "block": T,
            "seconds_per_step": times[len(times) // 2], "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "parameters": sum(p.numel() for p in model.parameters()), "torch": torch.__version__}


def converge_mode(args):
    L, H, C, T, _ = PRESETS["converge"]
    text = open(args.data, encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(data))
    train, val = data[:n], data[n:]
    torch.manual_seed(args.seed)
    model = GPT(L, H, C, T, len(chars), bias=not args.no_bias)
    opt = optimizer(model, 1e-3)
    iters, warmup, lr_max, lr_min, B = 2000, 100, 1e-3, 1e-4, 12

    def batch(split):
        d = train if split == "train" else val
        ix = torch.randint(len(d) - T, (B,))
        return torch.stack([d[i:i + T] for i in ix]), torch.stack([d[i + 1:i + 1 + T] for i in ix])

    def lr_at(it):
        if it < warmup:
            return lr_max * (it + 1) / (warmup + 1)
        return lr_min + 0.5 * (1 + math.cos(math.pi * (it - warmup) / (iters - warmup))) * (lr_max - lr_min)

    t0 = time.perf_counter()
    for it in range(iters):
        for group in opt.param_groups:
            group["lr"] = lr_at(it)
        x, y = batch("train")
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    seconds = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        val_loss = sum(model(*batch("val")).item() for _ in range(args.eval_batches)) / args.eval_batches
    return {"impl": "pytorch", "bias": not args.no_bias, "seed": args.seed, "eval_batches": args.eval_batches,
            "val_loss": val_loss, "train_seconds": seconds,
            "torch": torch.__version__}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["step", "converge"])
    p.add_argument("--preset", default="shakespeare-char")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data", default="")
    p.add_argument("--no-bias", action="store_true", help="converge: nanoGPT's bias-free variant")
    p.add_argument("--seed", type=int, default=1337, help="converge: initialisation and batches")
    p.add_argument("--eval-batches", type=int, default=20, help="converge: validation batches of 12 x 64 averaged")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = step_mode(args) if args.mode == "step" else converge_mode(args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
