#!/usr/bin/python3
"""Plots bench/gossip's results: peer 0's validation loss against simulated time, one line per
row (left; a dashed line at sync's final loss where a sync row ran), and Moshpit on values, the
largest relative error against the round for each failure rate, with the grid's places fixed and
drawn anew every pass (right; where a run with --part moshpit-values or all is given).

  plot_gossip.py GOSSIP.json [MORE.json...] OUT.png [TITLE]

Uses matplotlib from Debian's python3-matplotlib.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import plot_args  # noqa: E402  (beside this script)


def main():
    args, out, title = plot_args.parse(sys.argv[1:], __doc__)
    rows, values, settings = [], [], None
    for path in args:
        with open(path) as f:
            run = json.load(f)
        rows += [r for r in run.get("rows", []) if r.get("curve")]
        values += run.get("moshpit_values", [])
        if run.get("rows") and settings is None:
            settings = run
    if not rows and not values:
        sys.exit(f"no rows with curves and no Moshpit values in {', '.join(args)}")
    panels = (1 if rows else 0) + (1 if values else 0)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5), dpi=120, squeeze=False)
    axes = list(axes[0])
    if rows:
        ax = axes.pop(0)
        for r in rows:
            clock = [p[1] for p in r["curve"]]
            loss = [p[2] for p in r["curve"]]
            ax.plot(clock, loss, marker="o", markersize=3, label=f"{r['run']} ({r['mb_per_peer']:.0f} MB/peer)")
        sync = [r for r in rows if r["run"] == "sync"]
        if sync:
            ax.axhline(sync[0]["val_loss"], color="gray", linestyle="--", linewidth=1, label="sync's final loss")
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("validation loss (peer 0)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        if settings:
            ax.set_title(f"{settings['peers']} peers on '{settings['link']}' links, "
                         f"{settings['step_seconds']} s of compute a step", fontsize=9)
    if values:
        ax = axes.pop(0)
        for v in values:
            style = "--" if v.get("reshuffle") else "-"
            label = f"p = {v['fail']}" + (", places redrawn" if v.get("reshuffle") else "")
            largest = [max(e, 1e-16) for e in v["largest"]]
            ax.semilogy(range(1, len(largest) + 1), largest, style, marker="o", markersize=2, label=label)
        ax.axhline(1e-4, color="gray", linestyle=":", linewidth=1, label="1e-4")
        ax.axvline(6, color="gray", linestyle=":", linewidth=1)
        ax.set_xlabel("round")
        ax.set_ylabel("largest relative error")
        ax.set_title(f"Moshpit on values: {values[0]['peers']} peers in groups of 10", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
