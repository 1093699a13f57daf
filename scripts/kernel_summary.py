#!/usr/bin/env python3
"""Sums GPU kernel times by kernel name from a profiler's CSV, largest first.

    kernel_summary.py FILE [--top N]

FILE is either `nsys stats --report cuda_gpu_kern_sum --format csv` output (already summed by
name) or `ncu --csv --metrics gpu__time_duration.sum` output (one row per launch). Names are
cut at the first '(' or '<' so template instances of one kernel add up; the table keeps launches.
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
    print("| ms | share | launches | kernel |\n|---:|---:|---:|---|")
    for k, ns in sorted(total_ns.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"| {ns / 1e6:.2f} | {100 * ns / whole:.1f}% | {launches[k]} | {k} |")


if __name__ == "__main__":
    main()
