#!/usr/bin/python3
"""Plots bench/diloco_vs_ddp's curves: validation loss against megabytes sent per peer, one line
per run, bytes on a log axis (the runs differ by up to two orders of magnitude).

  plot_diloco_vs_ddp.py CURVES.csv OUT.png [TITLE]

Uses matplotlib from Debian's python3-matplotlib.
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    runs = defaultdict(list)
    with open(sys.argv[1]) as f:
        for row in csv.DictReader(f):
            runs[row["run"]].append((int(row["bytes_sent"]) / 1e6, float(row["val_loss"]), int(row["step"])))
    if not runs:
        sys.exit(f"no rows in {sys.argv[1]}")
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for name, points in runs.items():
        points.sort(key=lambda p: p[2])
        mb = [max(p[0], 1e-3) for p in points]
        ax.plot(mb, [p[1] for p in points], marker="o", markersize=3, label=name)
        ax.annotate(f"{points[-1][1]:.3f}", (mb[-1], points[-1][1]), textcoords="offset points", xytext=(4, -3), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("MB sent per peer (log scale)")
    ax.set_ylabel("validation loss")
    ax.set_title(sys.argv[3] if len(sys.argv) == 4 else "4 peers, tinyshakespeare: validation loss against bytes sent")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(sys.argv[2])
    print(f"wrote {sys.argv[2]}")


if __name__ == "__main__":
    main()
