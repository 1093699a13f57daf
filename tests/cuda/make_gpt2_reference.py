#!/usr/bin/env python3
"""The llm.c-style reference for tests/cuda/gpt2_parity.cu: GPT-2 124M (12 layers, 12 heads, 768
wide, vocab 50257, block 1024) with random GPT-2 initialisation, one batch of B=4 rows of T=64
tokens; PyTorch computes the logits, the loss and every parameter gradient in float32 on the CPU.

  python3 tests/cuda/make_gpt2_reference.py OUTDIR

Writes OUTDIR/weights.safetensors (Hugging Face GPT-2 names), OUTDIR/tokens.bin (an llm.c shard
of B*(T+1) tokens: row b is tokens [b*(T+1), (b+1)*(T+1)), inputs its first T, targets its last
T) and OUTDIR/reference.safetensors (logits (B,T,V), loss (1,), grad.<name> per parameter).
Runs where PyTorch is installed (the device machine); nothing of it is committed but this script.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from make_fixtures import causal_attention, write_safetensors, write_shard  # noqa: E402

L, H, C, V, BLOCK, B, T = 12, 12, 768, 50257, 1024, 4, 64


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else sys.exit("usage: make_gpt2_reference.py OUTDIR")
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(124)
    std, proj_std = 0.02, 0.02 / math.sqrt(2 * L)
    p = {"wte.weight": torch.randn(V, C, generator=g) * std, "wpe.weight": torch.randn(BLOCK, C, generator=g) * std}
    for l in range(L):
        h = "h.%d." % l
        # Non-trivial gains and biases, so their gradients are checked against non-zero values.
        p[h + "ln_1.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
        p[h + "ln_1.bias"] = 0.02 * torch.randn(C, generator=g)
        p[h + "attn.c_attn.weight"] = torch.randn(C, 3 * C, generator=g) * std
        p[h + "attn.c_attn.bias"] = 0.02 * torch.randn(3 * C, generator=g)
        p[h + "attn.c_proj.weight"] = torch.randn(C, C, generator=g) * proj_std
        p[h + "attn.c_proj.bias"] = 0.02 * torch.randn(C, generator=g)
        p[h + "ln_2.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
        p[h + "ln_2.bias"] = 0.02 * torch.randn(C, generator=g)
        p[h + "mlp.c_fc.weight"] = torch.randn(C, 4 * C, generator=g) * std
        p[h + "mlp.c_fc.bias"] = 0.02 * torch.randn(4 * C, generator=g)
        p[h + "mlp.c_proj.weight"] = torch.randn(4 * C, C, generator=g) * proj_std
        p[h + "mlp.c_proj.bias"] = 0.02 * torch.randn(C, generator=g)
    p["ln_f.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
    p["ln_f.bias"] = 0.02 * torch.randn(C, generator=g)
    for t in p.values():
        t.requires_grad_(True)
    stream = torch.randint(0, V, (B * (T + 1),), generator=g)
    rows = stream.view(B, T + 1)
    idx, targets = rows[:, :T], rows[:, 1:]

    x = p["wte.weight"][idx] + p["wpe.weight"][torch.arange(T)]
    for l in range(L):
        h = "h.%d." % l
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
        q, k, v = (a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]).split(C, dim=-1)
        x = x + causal_attention(q, k, v, H) @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
        m = F.gelu(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    logits = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5) @ p["wte.weight"].t()
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    loss.backward()

    write_safetensors(os.path.join(out, "weights.safetensors"), {n: t.detach() for n, t in p.items()})
    write_shard(os.path.join(out, "tokens.bin"), stream)
    ref = {"logits": logits.detach(), "loss": loss.detach().reshape(1)}
    for n, t in p.items():
        ref["grad." + n] = t.grad
    write_safetensors(os.path.join(out, "reference.safetensors"), ref)
    print("wrote %s: loss %.6f" % (out, loss.item()))


if __name__ == "__main__":
    main()
