#!/usr/bin/python3
"""Plots bench/streaming's curves (a run with --curve-every): peer 0's validation loss against
simulated time on the left, against step on the right, one line per row, codec and seed. The
left shows what compute utilisation buys: the same steps finish sooner.

  plot_streaming.py STREAMING.json [MORE.json...] OUT.png [TITLE]

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
    runs = []
    for path in args:
        with open(path) as f:
            runs += [r for r in json.load(f) if r.get("curve")]
    if not runs:
        sys.exit(f"no curves in {', '.join(args)} (run bench_streaming with --curve-every N)")
    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=120, sharey=True)
    seeds = {r["seed"] for r in runs}
    for r in runs:
        label = f"{r['row']} {r['codec']}" + (f" seed {r['seed']}" if len(seeds) > 1 else "")
        label += f" ({100 * r['utilisation']:.0f}% util)"
        steps = [p[0] for p in r["curve"]]
        clock = [p[1] for p in r["curve"]]
        loss = [p[2] for p in r["curve"]]
        (line,) = by_time.plot(clock, loss, marker="o", markersize=3, label=label)
        by_step.plot(steps, loss, marker="o", markersize=3, color=line.get_color())
    by_time.set_xlabel("simulated time (s)")
    by_step.set_xlabel("step")
    by_time.set_ylabel("validation loss (peer 0)")
    for ax in (by_time, by_step):
        ax.grid(True, alpha=0.3)
    by_time.legend(fontsize=8)
    r0 = runs[0]
    fig.suptitle(title or f"{r0['peers']} peers, H = {r0['inner_steps']}, link {r0['link_mb_per_s']:.2f} MB/s "
                 f"(one f32 all-reduce = 20 steps)")
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
