#!/usr/bin/python3
"""Plots bench/byzantine's results: per mode (sync, DiLoCo) a panel of bars, one group per attack
and number of attackers, one bar per aggregator, each the final validation loss's change against
the clean run under the mean. The dashed line is the issue's goal (+5%); bars past the top of the
axis are cut there and labelled with their value.

  plot_byzantine.py BYZANTINE.json [MORE.json...] OUT.png

Uses matplotlib from Debian's python3-matplotlib.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TOP = 8.0  # percent: the axis ends here, so a ruined run does not flatten the rest


def main():
    args = sys.argv[1:]
    if len(args) < 2 or not args[-1].endswith(".png"):
        sys.exit(__doc__)
    out = args.pop()
    runs = []
    for path in args:
        with open(path) as f:
            runs += json.load(f)
    modes = [m for m in ("sync", "diloco") if any(r["mode"] == m for r in runs)]
    if not modes:
        sys.exit("no sync or diloco rows in " + ", ".join(args))
    fig, axes = plt.subplots(len(modes), 1, figsize=(11, 4.2 * len(modes)), squeeze=False)
    for ax, mode in zip(axes[:, 0], modes):
        rows = [r for r in runs if r["mode"] == mode]
        aggregators = list(dict.fromkeys(r["aggregator"] for r in rows))
        cases = list(dict.fromkeys((r["attack"], r["attackers"]) for r in rows))
        width = 0.8 / len(aggregators)
        for i, agg in enumerate(aggregators):
            xs, ys, cut = [], [], []
            for k, case in enumerate(cases):
                hit = [r for r in rows if r["aggregator"] == agg and (r["attack"], r["attackers"]) == case]
                if not hit:
                    continue
                change = 100.0 * hit[0]["vs_clean_mean"]
                xs.append(k + (i - (len(aggregators) - 1) / 2) * width)
                ys.append(min(change, TOP))
                if change > TOP:
                    cut.append((xs[-1], change))
            ax.bar(xs, ys, width, label=agg)
            for x, change in cut:
                ax.annotate(f"+{change:.0f}%", (x, TOP), xytext=(0, 2), textcoords="offset points", ha="center",
                            fontsize=7, rotation=90, va="bottom")
        ax.axhline(5.0, color="black", linestyle="--", linewidth=0.8, label="goal: within 5%")
        ax.axhline(0.0, color="gray", linewidth=0.5)
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels(["clean" if n == 0 else f"{a} x{n}" for a, n in cases], rotation=30, ha="right")
        ax.set_ylim(min(-1.5, min(100.0 * r["vs_clean_mean"] for r in rows) - 0.5), TOP + 3)
        ax.set_ylabel("val loss vs clean mean (%)")
        peers = rows[0]["peers"]
        steps = rows[0]["steps"]
        ax.set_title(f"{'sync all-reduce' if mode == 'sync' else 'DiLoCo'}: {peers} peers, {steps} steps, "
                     "1 or 2 attackers")
        ax.legend(fontsize=8, ncol=3, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


if __name__ == "__main__":
    main()
