#!/usr/bin/python3
"""Writes the PyTorch reference fixtures that tests/autograd/test_pytorch_parity.cpp reads.

Run with Debian's python3 and python3-torch:  /usr/bin/python3 tests/reference/make_fixtures.py
Every op case stores its inputs, its output, a random weight w, and the gradients of
sum(output * w) with respect to every input, all computed by PyTorch in float32. The GPT case
is a 2-layer GPT-2 block stack with a tied LM head and its loss gradients.

File format (little-endian): b"DTFX", u32 version, u32 count; per tensor: u32 name length,
name, u8 dtype (0 f32, 1 f64, 2 i32), u32 rank, i64 sizes[rank], raw data.
"""
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

VERSION = 1
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")


def write(path, tensors):
    with open(path, "wb") as f:
        f.write(b"DTFX")
        f.write(struct.pack("<II", VERSION, len(tensors)))
        for name, t in tensors.items():
            t = t.detach().contiguous()
            code = {torch.float32: 0, torch.float64: 1, torch.int32: 2}[t.dtype]
            raw = name.encode()
            f.write(struct.pack("<I", len(raw)) + raw)
            f.write(struct.pack("<BI", code, t.dim()))
            f.write(struct.pack("<%dq" % t.dim(), *t.shape))
            f.write(t.numpy().tobytes())


def write_safetensors(path, tensors):
    """The safetensors layout, written by hand (Debian's torch 1.13 has no safetensors module)."""
    import json
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        raw = t.detach().contiguous().numpy().tobytes()
        header[name] = {"dtype": {torch.float32: "F32", torch.float64: "F64", torch.int32: "I32"}[t.dtype],
                        "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_shard(path, tokens):
    """An llm.c token shard: 256 int32 header (magic 20240520, version 1, count), uint16 tokens."""
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *[int(t) for t in tokens]))


def causal_attention(q, k, v, n_head):
    B, T, C = q.shape
    D = C // n_head
    split = lambda x: x.view(B, T, n_head, D).transpose(1, 2)  # (B,H,T,D)
    att = split(q) @ split(k).transpose(-2, -1) / math.sqrt(D)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return (att @ split(v)).transpose(1, 2).reshape(B, T, C)


def op_cases(g):
    randn = lambda *s: torch.randn(*s, generator=g)
    positive = lambda *s: torch.rand(*s, generator=g) * 1.5 + 0.5
    ids = lambda hi, *s: torch.randint(0, hi, s, generator=g, dtype=torch.int64)
    return {
        "add": (lambda a, b: a + b, [randn(2, 3, 5), randn(5)]),
        "sub": (lambda a, b: a - b, [randn(4, 1), randn(1, 7)]),
        "mul": (lambda a, b: a * b, [randn(2, 3, 5), randn(3, 1)]),
        "div": (lambda a, b: a / b, [randn(3, 5), positive(3, 5)]),
        "affine": (lambda x: x * -1.5 + 2.0, [randn(3, 7)]),
        "rdiv": (lambda x: 2.0 / x, [positive(3, 7)]),
        "matmul": (lambda a, b: a @ b, [randn(3, 5), randn(5, 7)]),
        "matmul_tt": (lambda a, b: a.t() @ b.t(), [randn(5, 3), randn(7, 5)]),
        "bmm": (lambda a, b: a @ b, [randn(2, 3, 5), randn(2, 5, 4)]),
        "bmm_shared": (lambda a, b: a @ b, [randn(2, 3, 5), randn(5, 4)]),
        "linear": (lambda x, w, b: x @ w + b, [randn(2, 3, 5), randn(5, 7), randn(7)]),
        "sum": (lambda x: x.sum(dim=(0, 2)), [randn(2, 3, 5)]),
        "mean": (lambda x: x.mean(dim=1, keepdim=True), [randn(2, 3, 5)]),
        "reshape": (lambda x: x.reshape(5, 3), [randn(3, 5)]),
        "transpose": (lambda x: x.transpose(0, 2), [randn(2, 3, 5)]),
        "concat": (lambda a, b: torch.cat([a, b, a], dim=1), [randn(2, 3, 2), randn(2, 1, 2)]),
        "split": (lambda x: (lambda p: p[0] * p[2] + p[1])(torch.split(x, [2, 1, 2], dim=-1)), [randn(3, 5)]),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (8,), w, b, 1e-5), [randn(2, 3, 8), randn(8), randn(8)]),
        "gelu": (lambda x: F.gelu(x, approximate="tanh"), [randn(3, 7) * 3]),
        "softmax": (lambda x: x.softmax(dim=-1), [randn(2, 3, 5) * 3]),
        "log_softmax": (lambda x: x.log_softmax(dim=-1), [randn(2, 3, 5) * 3]),
        "attention": (lambda q, k, v: causal_attention(q, k, v, 2), [randn(2, 5, 8), randn(2, 5, 8), randn(2, 5, 8)]),
        "embedding": (None, [ids(7, 2, 3), randn(7, 5)]),
        "cross_entropy": (None, [randn(6, 7), torch.tensor([2, -1, 6, 0, 6, 3])]),
    }


def make_ops(g):
    tensors = {}
    for name, (fn, inputs) in op_cases(g).items():
        if name == "embedding":
            idx, table = inputs
            table.requires_grad_(True)
            out = F.embedding(idx, table)
            leaves, stored = [table], {"ids": idx.int(), "in0": table}
        elif name == "cross_entropy":
            logits, targets = inputs
            logits.requires_grad_(True)
            out = F.cross_entropy(logits, targets, ignore_index=-1)
            leaves, stored = [logits], {"in0": logits, "targets": targets.int()}
        else:
            leaves = [x.requires_grad_(True) for x in inputs]
            out = fn(*leaves)
            stored = {"in%d" % i: x for i, x in enumerate(leaves)}
        w = torch.randn(out.shape, generator=g)
        (out * w).sum().backward()
        for key, t in stored.items():
            tensors["%s.%s" % (name, key)] = t
        tensors[name + ".out"] = out
        tensors[name + ".w"] = w
        for i, x in enumerate(leaves):
            tensors["%s.grad%d" % (name, i)] = x.grad
    return tensors


def make_gpt(g):
    """Two pre-LN GPT-2 blocks with embeddings, final layer norm and a tied LM head."""
    V, T, C, H, L, B = 17, 8, 16, 2, 2, 2
    p = {}
    p["wte.weight"] = torch.randn(V, C, generator=g) * 0.2
    p["wpe.weight"] = torch.randn(T, C, generator=g) * 0.2
    for l in range(L):
        h = "h.%d." % l
        p[h + "ln_1.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
        p[h + "ln_1.bias"] = 0.1 * torch.randn(C, generator=g)
        p[h + "attn.c_attn.weight"] = 0.2 * torch.randn(C, 3 * C, generator=g)
        p[h + "attn.c_attn.bias"] = 0.1 * torch.randn(3 * C, generator=g)
        p[h + "attn.c_proj.weight"] = 0.2 * torch.randn(C, C, generator=g)
        p[h + "attn.c_proj.bias"] = 0.1 * torch.randn(C, generator=g)
        p[h + "ln_2.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
        p[h + "ln_2.bias"] = 0.1 * torch.randn(C, generator=g)
        p[h + "mlp.c_fc.weight"] = 0.2 * torch.randn(C, 4 * C, generator=g)
        p[h + "mlp.c_fc.bias"] = 0.1 * torch.randn(4 * C, generator=g)
        p[h + "mlp.c_proj.weight"] = 0.2 * torch.randn(4 * C, C, generator=g)
        p[h + "mlp.c_proj.bias"] = 0.1 * torch.randn(C, generator=g)
    p["ln_f.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
    p["ln_f.bias"] = 0.1 * torch.randn(C, generator=g)
    for t in p.values():
        t.requires_grad_(True)
    idx = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)

    def forward(idx):
        x = p["wte.weight"][idx] + p["wpe.weight"][torch.arange(idx.shape[1])]
        for l in range(L):
            h = "h.%d." % l
            a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
            q, k, v = (a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]).split(C, dim=-1)
            x = x + causal_attention(q, k, v, H) @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
            m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
            m = F.gelu(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"], approximate="tanh")
            x = x + m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
        x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
        return x @ p["wte.weight"].t()

    logits = forward(idx)
    loss = F.cross_entropy(logits.view(-1, V), targets.view(-1))
    loss.backward()
    grads = {name: t.grad.clone() for name, t in p.items()}

    # What `decentrain-gpt eval` must reproduce: B rows of T+1 tokens from an llm.c shard, each
    # row's first T tokens as inputs and its last T as targets.
    stream = torch.randint(0, V, (B * (T + 1),), generator=g)
    write_shard(os.path.join(OUT, "eval_tokens.bin"), stream)
    for t in p.values():
        t.grad = None
    rows = stream.view(B, T + 1)
    eval_loss = F.cross_entropy(forward(rows[:, :T]).reshape(-1, V), rows[:, 1:].reshape(-1))
    eval_loss.backward()
    eval_tensors = {"loss": eval_loss.detach().double().reshape(1)}
    for name, t in p.items():
        eval_tensors["grad." + name] = t.grad
    write(os.path.join(OUT, "eval.dtfx"), eval_tensors)

    # The same weights as Hugging Face's GPT2LMHeadModel stores them: "transformer." prefix, the
    # tied lm_head, and each layer's causal-mask buffer (the importer must skip both).
    hf = {"transformer." + name: t for name, t in p.items()}
    hf["lm_head.weight"] = p["wte.weight"]
    for l in range(L):
        hf["transformer.h.%d.attn.bias" % l] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
    write_safetensors(os.path.join(OUT, "gpt_block.safetensors"), hf)

    tensors = {"config": torch.tensor([V, T, C, H, L, B], dtype=torch.int32),
               "idx": idx.int(), "targets": targets.int(), "logits": logits,
               "loss": loss.reshape(1)}
    for name, t in p.items():
        tensors["param." + name] = t
        tensors["grad." + name] = grads[name]
    return tensors


def make_optim(g):
    """AdamW (decay on the matrix only, lr changed after step 3), SGD with Nesterov momentum
    and clip_grad_norm_, each on fixed random gradients; parameters after every step."""
    tensors = {}
    init = {"w": torch.randn(5, 3, generator=g), "b": torch.randn(3, generator=g), "gain": 1 + 0.1 * torch.randn(3, generator=g)}
    grads = [{k: torch.randn(v.shape, generator=g) for k, v in init.items()} for _ in range(6)]
    for k, v in init.items():
        tensors["init." + k] = v
    for s, gs in enumerate(grads):
        for k, v in gs.items():
            tensors["grad%d.%s" % (s, k)] = v

    p = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    opt = torch.optim.AdamW([{"params": [p["w"]], "weight_decay": 0.1},
                             {"params": [p["b"], p["gain"]], "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    for s, gs in enumerate(grads):
        if s == 3:
            for group in opt.param_groups:
                group["lr"] = 5e-3
        for k in p:
            p[k].grad = gs[k].clone()
        opt.step()
        for k in p:
            tensors["adamw%d.%s" % (s, k)] = p[k].detach().clone()

    p = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    opt = torch.optim.SGD(list(p.values()), lr=0.7, momentum=0.9, nesterov=True)
    for s, gs in enumerate(grads):
        for k in p:
            p[k].grad = gs[k].clone()
        opt.step()
        for k in p:
            tensors["sgd%d.%s" % (s, k)] = p[k].detach().clone()

    p = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    for k in p:
        p[k].grad = grads[0][k].clone()
    norm = torch.nn.utils.clip_grad_norm_(list(p.values()), 1.5)
    tensors["clip.norm"] = norm.reshape(1)
    for k in p:
        tensors["clip.%s" % k] = p[k].grad.clone()
    return tensors


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(20261121)
    os.makedirs(OUT, exist_ok=True)
    write(os.path.join(OUT, "ops.dtfx"), make_ops(g))
    write(os.path.join(OUT, "gpt_block.dtfx"), make_gpt(g))
    write(os.path.join(OUT, "optim.dtfx"), make_optim(g))
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print("wrote fixtures to %s (%d bytes, torch %s)" % (OUT, total, torch.__version__))


if __name__ == "__main__":
    sys.exit(main())
