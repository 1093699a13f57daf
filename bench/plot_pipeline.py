#!/usr/bin/python3
"""Plots bench/pipeline's results: (left) the bubble of each schedule against the micro-batches
a step at S = 4 stages, with one unit per action, beside the closed forms (ZB-V's the least any
schedule can leave); (right) each schedule's step on the simulator fed with GPT-2 124M's measured
costs at S = 4, against 1F1B's on the even cut, and the cost partitioner's cut.

  plot_pipeline.py PIPELINE.json OUT.png

Uses matplotlib from Debian's python3-matplotlib.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STAGES = 4


def main():
    if len(sys.argv) != 3 or not sys.argv[2].endswith(".png"):
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        rows = json.load(f)
    unit = [r for r in rows if "schedule" in r and r["stages"] == STAGES]
    measured = [r for r in rows if r.get("measured") and r["stages"] == STAGES]
    if not unit:
        sys.exit(f"no unit-cost rows at S = {STAGES} in {sys.argv[1]}")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in dict.fromkeys(r["schedule"] for r in unit):
        mine = sorted((r["micro_batches"], r["bubble"], r["closed_form"]) for r in unit if r["schedule"] == name)
        (line,) = left.plot([m for m, _, _ in mine], [b for _, b, _ in mine], "o-", label=name)
        left.plot([m for m, _, _ in mine], [c for _, _, c in mine], "x", color=line.get_color(), markersize=9)
    left.set_xscale("log", base=2)
    left.set_xlabel("micro-batches a step (M)")
    left.set_ylabel("bubble: idle share of the peers' time")
    left.set_title(f"Unit costs, S = {STAGES} (x: closed form)")
    left.grid(alpha=0.3)
    left.legend()
    if measured:
        ms = [r["micro_batches"] for r in measured]
        for key, label in (("zb_h1_speedup", "ZB-H1, even cut"), ("zb_v_speedup", "ZB-V, even cut"),
                           ("partitioned_zb_h1_speedup", "ZB-H1 vs 1F1B, partitioned cut")):
            if all(key in r for r in measured):
                right.plot(ms, [r[key] for r in measured], "o-", label=label)
        right.plot(ms, [1.0 / r["partitioned_vs_even"] for r in measured], "s--", label="1F1B: partitioned vs even cut")
        right.axhline(1.15, color="grey", linestyle=":", label="goal +15% (ZB-H1 vs 1F1B)")
        right.set_xscale("log", base=2)
        right.set_xlabel("micro-batches a step (M)")
        right.set_ylabel("speedup over 1F1B (even cut)")
        right.set_title(f"GPT-2 124M's measured costs, S = {STAGES}")
        right.grid(alpha=0.3)
        right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
