#!/usr/bin/env python3
"""Sums GPU kernel times by kernel name from a profiler's CSV, largest first.

    kernel_summary.py FILE [--top N]

FILE is either `nsys stats --report cuda_gpu_kern_sum --format csv` output (already summed by
name) or `ncu --csv --metrics gpu__time_duration.sum` output (one row per launch). Names are
cut at the first '(' or '<' so template instances of one kernel add up; the table keeps launches.
A first table sums them by kind: GEMMs, attention and everything else.
"""
import argparse
import csv
import io
import re
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"^void ", "", name)
    return re.split(r"[(<]", name, 1)[0]


# The step's kinds of work, so that two implementations' profiles compare: matrix products
# (cuBLAS/cuBLASLt, CUTLASS and Inductor's GEMM templates, their split-K reductions), attention
# (ours, FlashAttention, cuDNN's fused attention) and the rest (mostly memory-bound kernels).
GEMM = re.compile(r"gemm|nvjet|cutlass|xmma|splitKreduce|triton_tem_fused_mm|cublas", re.I)
ATTENTION = re.compile(r"attention|flash|fmha|sdpa|::fa::", re.I)


def kind(name):
    return "attention" if ATTENTION.search(name) else "GEMM" if GEMM.search(name) else "everything else"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    text = open(a.file, errors="replace").read()
    # Profilers print log lines before the CSV header; start at the header.
    start = min((text.find(h) for h in ('"ID"', "Time (%)", '"Time (%)"') if text.find(h) >= 0), default=-1)
    if start < 0:
        sys.exit(f"{a.file}: no nsys or ncu CSV header found")
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    total_ns = defaultdict(float)
    launches = defaultdict(int)
    for r in rows:
        if "Metric Name" in r:  # ncu: one row per launch and metric
            if r["Metric Name"] != "gpu__time_duration.sum":
                continue
            scale = {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}.get(r["Metric Unit"], 1)
            k = short(r["Kernel Name"])
            total_ns[k] += float(r["Metric Value"].replace(",", "")) * scale
            launches[k] += 1
        else:  # nsys cuda_gpu_kern_sum
            k = short(r["Name"])
            total_ns[k] += float(r["Total Time (ns)"])
            launches[k] += int(r["Instances"])
    whole = sum(total_ns.values())
    print(f"{whole / 1e6:.1f} ms in {sum(launches.values())} kernel launches")
    kinds = defaultdict(lambda: [0.0, 0])
    for k, ns in total_ns.items():
        kinds[kind(k)][0] += ns
        kinds[kind(k)][1] += launches[k]
    print("| ms | launches | kind |\n|---:|---:|---|")
    for name in ("GEMM", "attention", "everything else"):
        print(f"| {kinds[name][0] / 1e6:.2f} | {kinds[name][1]} | {name} |")
    print()
    print("| ms | share | launches | kernel |\n|---:|---:|---:|---|")
    for k, ns in sorted(total_ns.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"| {ns / 1e6:.2f} | {100 * ns / whole:.1f}% | {launches[k]} | {k} |")


if __name__ == "__main__":
    main()
